"""The NPU's view of memory: byte-addressed regions in one 32-bit address space, and the
per-task DMA port the units read and write through.

Every register that holds an address is 32 bits wide (rknpu-isa.md 4, "Addresses"), so the
NPU sees one flat 32-bit space. It holds a DDR region and, on chips that have one, an SRAM
region (RK3588: 956 KB of system SRAM, platforms/rk3588.yaml ``sram``; its window is wherever
the model's memory map puts region ``sram``, by default :data:`DEFAULT_SRAM_BASE`). Address
arithmetic wraps modulo 2**32 like the hardware's 32-bit adders: the vendor's FC stream
relies on it (rep11 writes CNA SURF_STRIDE = 2**28 - 3, see REGISTER_SEMANTICS.md).

An access that leaves its region is a :class:`~npuemu.isa.errors.DmaError`; the hardware
would raise the DMA read/write error interrupt (PC INTERRUPT bits 12/13, rknpu-isa.md 2.4 and
7.2). :class:`TaskDma` bounds-checks, copies and counts the bytes each unit moves, so the
timing model can use exactly what the DMA moved. A unit plan's fixed row addresses (a
read-only array) are located and checked once per memory (:meth:`Memory.locate_fixed`); the
copy, the byte counts and the derived-value invalidation still happen on every access.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numba import njit

from npuemu.emulator.memo import Memo
from npuemu.isa import tensor_layout
from npuemu.isa.errors import DmaError, EmulationError

ADDRESS_SPACE = tensor_layout.ADDRESS_SPACE  # every DMA address register is 32-bit
#: SRAM window used when no memory map places it: below 4 GiB, clear of a DDR image that
#: starts at 0. A documented choice, not a hardware fact.
DEFAULT_SRAM_BASE = 0xFF000000
SRAM_REGION = "sram"  # the region name of the SRAM window (memory maps, isa/CONTAINER.md 3.4)
#: Refuse absurd region sizes before allocating (a model file could ask for anything).
MAX_REGION_BYTES = 1 << 31
#: Entries the derived-value cache keeps before it starts over (bounds its memory).
DERIVED_CACHE_ENTRIES = 4096
#: Entries put (or dropped, past half the index) since the derived cache's index was built before
#: it is built again (each query scans the puts directly).
_PENDING_MAX = 64
#: rows x overlapping entries a write checks in one array operation (above: entry by entry)
_ROWS_BY_KEYS_MAX = 1 << 16
#: overlap searches that meet dropped entries before the index is rebuilt without them (a rebuild
#: of ~1000 entries costs about as much as 20-40 searches)
_WASTED_SEARCHES_MAX = 32
#: writes checked against the same pending entries (no put between) before they join the index:
#: a steady run puts nothing, so its writes then take the index's one search (issue 20: ppocr_cls
#: kept 32 pending entries, scanned on every DPU store and host-step write of every run)
_PENDING_SCANS_MAX = 256


@dataclass
class MemoryRegion:
    """A contiguous byte range of the NPU address space backed by a numpy ``uint8`` image."""

    name: str
    base: int
    data: np.ndarray

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def end(self) -> int:
        return self.base + self.size

    def contains(self, start: int, length: int) -> bool:
        return self.base <= start and start + length <= self.end

    def describe(self) -> str:
        return f"{self.name} [{self.base:#x}, {self.end:#x})"


class Memory:
    """DDR (and optionally SRAM) in one 32-bit address space.

    ``load``/``dump`` are host accesses (the runtime writing inputs, reading outputs) and are
    not counted; units go through :class:`TaskDma`.
    """

    def __init__(self, ddr_size: int, ddr_base: int = 0, sram_size: int = 0,
                 sram_base: int | None = None) -> None:
        self.regions: list[MemoryRegion] = []
        self.derived = DerivedCache()
        self._located: Memo[LocatedRows] = Memo(identity=1, limit=DERIVED_CACHE_ENTRIES)
        self._add_region("ddr", ddr_base, ddr_size)
        if sram_size:
            self._add_region("sram", DEFAULT_SRAM_BASE if sram_base is None else sram_base, sram_size)

    @classmethod
    def from_regions(cls, regions: list[tuple[str, int, int]]) -> Memory:
        """Regions given as ``(name, base, size)``, e.g. a model's ``memory_map().regions``."""
        memory = cls.__new__(cls)
        memory.regions = []
        memory.derived = DerivedCache()
        memory._located = Memo(identity=1, limit=DERIVED_CACHE_ENTRIES)
        for name, base, size in regions:
            memory._add_region(name, base, size)
        if not memory.regions:
            raise EmulationError("a memory needs at least one region")
        return memory

    def _add_region(self, name: str, base: int, size: int) -> None:
        for what, value in (("base", base), ("size", size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise EmulationError(
                    f"memory region {name!r}: {what} {value!r} is not a non-negative integer")
        if size == 0 or size > MAX_REGION_BYTES:
            raise EmulationError(f"memory region {name!r}: size {size} must be 1..{MAX_REGION_BYTES} bytes")
        if base + size > ADDRESS_SPACE:
            raise EmulationError(
                f"memory region {name!r} [{base:#x}, {base + size:#x}) does not fit the NPU's "
                f"32-bit address space (every address register is 32-bit, rknpu-isa.md 4)")
        for other in self.regions:
            if base < other.end and other.base < base + size:
                raise EmulationError(f"memory region {name!r} [{base:#x}, {base + size:#x}) overlaps "
                                     f"{other.describe()}")
        self.regions.append(MemoryRegion(name, base, np.zeros(size, np.uint8)))
        self._spans = tuple((r.base, r.end, r) for r in self.regions)

    def region(self, name: str) -> MemoryRegion:
        for region in self.regions:
            if region.name == name:
                return region
        raise EmulationError(f"no memory region {name!r}; regions: "
                             f"{', '.join(r.describe() for r in self.regions)}")

    def region_at(self, start: int, length: int) -> MemoryRegion | None:
        """The region holding all of ``[start, start + length)``, or None."""
        end = start + length
        for base, limit, region in self._spans:  # (regions never move or resize)
            if base <= start and end <= limit:
                return region
        return None

    def describe(self) -> str:
        return ", ".join(r.describe() for r in self.regions)

    # -- host access ------------------------------------------------------------------------
    def load(self, address: int, data: bytes | np.ndarray) -> None:
        """Host write (loader or runtime): not a DMA, not counted."""
        raw = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) \
            else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        region = self._host_region(address, raw.size, "write")
        offset = address - region.base
        region.data[offset:offset + raw.size] = raw
        self.derived.invalidate(address, address + raw.size)

    def dump(self, address: int, length: int) -> np.ndarray:
        """Host read: a copy of ``length`` bytes."""
        region = self._host_region(address, length, "read")
        offset = address - region.base
        return region.data[offset:offset + length].copy()

    def _host_region(self, address: int, length: int, what: str) -> MemoryRegion:
        region = self.region_at(address, length)
        if region is None:
            raise DmaError(f"host {what} of {length} bytes at {address:#x} is outside every memory "
                           f"region ({self.describe()})")
        return region

    # -- DMA access (through TaskDma) -------------------------------------------------------
    def _locate_rows(self, starts: np.ndarray, row_bytes: int,
                     where: str | Callable[[], str]) -> tuple[MemoryRegion, np.ndarray]:
        """The one region holding every row ``[start, start + row_bytes)``; offsets into it.
        ``where`` names the access (or builds the name: called only for an error)."""
        if starts.size == 0:
            raise EmulationError(f"{_text(where)}: empty DMA transfer")
        low, high = int(starts.min()), int(starts.max()) + row_bytes
        region = self.region_at(low, high - low)
        if region is None:
            bad = _first_outside(self, starts, row_bytes)
            raise DmaError(
                f"{_text(where)}: touches [{low:#x}, {high:#x}), first bad row [{bad:#x}, {bad + row_bytes:#x}), "
                f"outside the memory ({self.describe()}); the NPU raises its DMA error interrupt "
                f"(PC INTERRUPT bits 12/13, rknpu-isa.md 2.4)")
        return region, starts - region.base

    def locate_fixed(self, starts: np.ndarray, row_bytes: int, where: Callable[[], str]) -> LocatedRows:
        """``_locate_rows`` of a read-only row-address array that a caller's plan reuses every
        task: worked out once per array (emulator/memo.py: the very same array; regions never
        move). ``where`` builds the error message, only when one is raised."""
        entry = self._located.get(starts, row_bytes)
        if entry is None:
            if starts.flags.writeable:
                raise EmulationError("locate_fixed needs a read-only address array (its rows must not change)")
            wrapped = _addresses(starts)
            region, offsets = self._locate_rows(wrapped, row_bytes, where)
            entry = self._located.put(LocatedRows(starts, wrapped, row_bytes, region, offsets), starts, row_bytes)
        return entry


class LocatedRows:
    """Rows ``[start, start + row_bytes)`` found in one region, with what the DMA derives from
    them alone (bounds, offsets per element size, overlap): see ``Memory.locate_fixed``."""

    __slots__ = ("key_array", "starts", "row_bytes", "region", "offsets", "bounds", "_elements", "_disjoint")

    def __init__(self, key_array: np.ndarray, starts: np.ndarray, row_bytes: int, region: MemoryRegion,
                 offsets: np.ndarray) -> None:
        self.key_array = key_array
        self.starts = starts  # wrapped to 32 bits
        self.row_bytes = row_bytes
        self.region = region
        self.offsets = offsets
        self.bounds = (int(starts.min()), int(starts.max()) + row_bytes)
        self._elements: dict[np.dtype, tuple[np.ndarray, np.ndarray] | None] = {}
        self._disjoint: bool | None = None

    @property
    def nbytes(self) -> int:
        return self.starts.size * self.row_bytes

    def disjoint(self) -> bool:
        if self._disjoint is None:
            self._disjoint = rows_disjoint(self.starts, self.row_bytes)
        return self._disjoint

    def elements(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray] | None:
        """The region's bytes viewed as ``dtype`` and each row's offset in elements; None if a
        row does not start on a multiple of the element size."""
        if dtype not in self._elements:
            itemsize = dtype.itemsize
            if itemsize > 1 and np.any(self.offsets % itemsize):
                self._elements[dtype] = None
            else:
                data = self.region.data
                self._elements[dtype] = (data[:data.size - data.size % itemsize].view(dtype),
                                         self.offsets // itemsize)
        return self._elements[dtype]


def _text(where: str | Callable[[], str]) -> str:
    return where() if callable(where) else where


def _first_outside(memory: Memory, starts: np.ndarray, row_bytes: int) -> int:
    for start in np.unique(starts):
        if memory.region_at(int(start), row_bytes) is None:
            return int(start)
    return int(starts.min())  # rows fit regions individually but straddle two of them


class Traffic:
    """DMA streams counted per task (the units' read and write engines): each is the name of
    its :class:`DmaTraffic` field, a plain string, so the per-task counters key a dict by the
    field name itself (issue 20: no Enum members to hash or translate through ``.value``, a
    Python property; a DmaTraffic is built straight from the counts)."""

    REGCMD_READ = "regcmd_read"  # PC fetch of the task's command words
    FEATURE_READ = "feature_read"  # CNA feature DMA
    WEIGHT_READ = "weight_read"  # CNA weight DMA
    BIAS_READ = "bias_read"  # DPU_RDMA BRDMA (BS operands)
    BN_READ = "bn_read"  # DPU_RDMA NRDMA (BN operands)
    EW_READ = "ew_read"  # DPU_RDMA ERDMA (EW operand cube)
    MAIN_READ = "main_read"  # DPU_RDMA MRDMA (flying-mode main cube)
    PPU_READ = "ppu_read"  # PPU_RDMA
    DPU_WRITE = "dpu_write"  # DPU WDMA
    PPU_WRITE = "ppu_write"  # PPU write DMA


@dataclass(frozen=True)
class DmaTraffic:
    """Bytes each DMA stream moved during one task."""

    regcmd_read: int = 0
    feature_read: int = 0
    weight_read: int = 0
    bias_read: int = 0
    bn_read: int = 0
    ew_read: int = 0
    main_read: int = 0
    ppu_read: int = 0
    dpu_write: int = 0
    ppu_write: int = 0
    # of the bytes above, those that went to the SRAM region instead of DDR (SRAM hits)
    sram_hit_reads: int = 0
    sram_hit_writes: int = 0

    @property
    def read_bytes(self) -> int:
        # every field ending in "_read" (_READ_STREAMS; a test checks the two agree), spelled
        # out: the timing report asks each task several times
        return (self.regcmd_read + self.feature_read + self.weight_read + self.bias_read + self.bn_read
                + self.ew_read + self.main_read + self.ppu_read)

    @property
    def ddr_read_bytes(self) -> int:
        """Read bytes that went to DDR (all reads but the SRAM hits)."""
        return self.read_bytes - self.sram_hit_reads

    @property
    def ddr_write_bytes(self) -> int:
        return self.write_bytes - self.sram_hit_writes

    @property
    def write_bytes(self) -> int:
        return self.dpu_write + self.ppu_write

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_READ_STREAMS = tuple(f.name for f in fields(DmaTraffic) if f.name.endswith("_read"))
#: every stream of :class:`Traffic`, and whether it reads (for the SRAM hit counts)
STREAMS = tuple(value for key, value in vars(Traffic).items() if key.isupper())
_IS_READ = {stream: stream in _READ_STREAMS for stream in STREAMS}


@dataclass
class TaskDma:
    """The DMA port of one task on one core: bounds-checked copies plus byte counters.

    ``what`` arguments name the unit and the registers the addresses came from, so an
    out-of-range access reports e.g. ``core 0 task 3: CNA feature read (CNA.FEATURE_DATA_ADDR
    = 0x..., DMA_CON1/2 strides)``.
    """

    memory: Memory
    where: str  # "core 0 task 3"
    counts: dict[str, int] = field(default_factory=dict)  # bytes by stream (a Traffic name)
    sram_reads: int = 0
    sram_writes: int = 0

    def count(self, stream: str, nbytes: int, region: MemoryRegion | None = None) -> None:
        counts = self.counts
        counts[stream] = counts.get(stream, 0) + int(nbytes)
        if region is not None and region.name == SRAM_REGION:
            if _IS_READ[stream]:
                self.sram_reads += int(nbytes)
            else:
                self.sram_writes += int(nbytes)

    def read_rows(self, stream: str, starts: np.ndarray, row_bytes: int, what: str) -> np.ndarray:
        """``uint8 [len(starts), row_bytes]``: one contiguous run per start address."""
        if isinstance(starts, np.ndarray) and not starts.flags.writeable:  # a plan's fixed rows: located once
            located = self.memory.locate_fixed(starts, row_bytes, lambda: f"{self.where}: {what} read")
            return self.read_located(stream, located.region, located.offsets, row_bytes)
        starts = _addresses(starts)
        region, offsets = self.memory._locate_rows(starts, row_bytes, f"{self.where}: {what} read")
        rows = np.empty((starts.size, row_bytes), np.uint8)
        _gather_rows(region.data, offsets, rows)
        self.count(stream, starts.size * row_bytes, region)
        return rows

    def read_located(self, stream: str, region: MemoryRegion, offsets: np.ndarray,
                     row_bytes: int) -> np.ndarray:
        """``read_rows`` of rows found by ``Memory.locate_fixed``: the same copy and byte counts."""
        rows = np.empty((offsets.size, row_bytes), np.uint8)
        _gather_rows(region.data, offsets, rows)
        self.count(stream, offsets.size * row_bytes, region)
        return rows

    def write_rows(self, stream: str, starts: np.ndarray, rows: np.ndarray, what: str) -> None:
        """Write ``uint8 [len(starts), row_bytes]`` rows at the start addresses."""
        starts = _addresses(starts)
        rows = np.ascontiguousarray(rows).view(np.uint8).reshape(starts.size, -1)
        row_bytes = rows.shape[1]
        region, offsets = self.memory._locate_rows(starts, row_bytes, f"{self.where}: {what} write")
        _scatter_rows(rows, offsets, region.data)
        self.memory.derived.invalidate_rows(starts, row_bytes)
        self.count(stream, starts.size * row_bytes, region)

    def write_planes(self, stream: str, starts: np.ndarray, planes: np.ndarray, c2: int,
                     what: str) -> None:
        """Write a cube ``[C][H][W]`` as NC1HWC2 rows of C2-lane atoms: ``starts`` holds the
        address of each surface's rows, surface-major ([S][H], S = ceil(C / C2)); lanes past C
        are written 0. The same bytes and order as ``write_rows`` of the converted atoms,
        without building them (one pass from the planes into memory)."""
        channels, height, width = planes.shape
        starts = _addresses(starts)
        itemsize = planes.dtype.itemsize
        if starts.size != -(-channels // c2) * height:
            raise EmulationError(f"{self.where}: {what} write: {starts.size} row addresses for "
                                 f"{channels} channels of {height} rows in {c2}-lane atoms")
        row_bytes = width * c2 * itemsize
        region, offsets = self.memory._locate_rows(starts, row_bytes, f"{self.where}: {what} write")
        # elements move as unsigned integers of their size (one compiled kernel per size);
        # memory is viewed in that unit when every row starts on a multiple of it
        unsigned = np.dtype(f"u{itemsize}")
        data = region.data
        if itemsize > 1 and np.any(offsets % itemsize):  # rare: build the atoms, copy bytes
            surfaces = starts.size // height
            lanes = np.zeros((surfaces * c2, height, width), planes.dtype)
            lanes[:channels] = planes
            atoms = lanes.reshape(surfaces, c2, height, width).transpose(0, 2, 3, 1)
            _scatter_rows(np.ascontiguousarray(atoms).view(np.uint8).reshape(starts.size, -1),
                          offsets, data)
        else:
            if itemsize > 1:
                data = data[:data.size - data.size % itemsize].view(unsigned)
                offsets = offsets // itemsize
            _scatter_planes(np.ascontiguousarray(planes).view(unsigned), c2, offsets, data)
        self.memory.derived.invalidate_rows(starts, row_bytes)
        self.count(stream, starts.size * row_bytes, region)

    def claim_rows(self, stream: str, starts: np.ndarray, row_bytes: int, dtype: np.dtype,
                   what: str, disjoint: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
        """For a kernel that stores rows itself: bounds-check the rows ``[start, start +
        row_bytes)``, count them and drop the derived values they overwrite, as ``write_rows``
        does; returns the region's bytes viewed as ``dtype`` and each row's offset in those
        elements. The caller must then write every row. None (nothing counted) when a row is
        not aligned to ``dtype`` or two rows overlap (their write order would matter): the
        caller writes through ``write_planes`` instead. ``disjoint``: the caller has checked
        that no two rows overlap (``rows_disjoint``), once for a layout it reuses."""
        if isinstance(starts, np.ndarray) and not starts.flags.writeable:  # a plan's fixed rows: located once
            located = self.memory.locate_fixed(starts, row_bytes, lambda: f"{self.where}: {what} write")
            claimed = located.elements(np.dtype(dtype)) if disjoint or located.disjoint() else None
            if claimed is not None:
                self.memory.derived.invalidate_rows(located.starts, row_bytes, located.bounds)
                self.count(stream, located.nbytes, located.region)
            return claimed
        starts = _addresses(starts)
        region, offsets = self.memory._locate_rows(starts, row_bytes, f"{self.where}: {what} write")
        itemsize = np.dtype(dtype).itemsize
        if not (disjoint or rows_disjoint(starts, row_bytes)) or (itemsize > 1 and np.any(offsets % itemsize)):
            return None
        data = region.data
        view = data[:data.size - data.size % itemsize].view(dtype)
        self.memory.derived.invalidate_rows(starts, row_bytes)
        self.count(stream, starts.size * row_bytes, region)
        return view, offsets // itemsize

    def read_block(self, stream: str, address: int, nbytes: int, what: str) -> np.ndarray:
        return self.read_rows(stream, np.array([address]), nbytes, what)[0]

    def derived_from_block(self, stream: str, address: int, nbytes: int, what: str,
                           key: Hashable, build: Callable[[np.ndarray], Any]) -> Any:
        """``build(read_block(...))``, counted as the same read, but built once per contents:
        the value is kept until a DMA or host write touches ``[address, address + nbytes)``.
        ``build`` must depend on nothing but the bytes and ``key`` (e.g. the weight layout)."""
        starts = _addresses([address])
        region, _ = self.memory._locate_rows(starts, nbytes, f"{self.where}: {what} read")
        return self.derived_from_located(stream, region, int(starts[0]), nbytes, key, build)

    def derived_from_located(self, stream: str, region: MemoryRegion, address: int, nbytes: int,
                             key: Hashable, build: Callable[[np.ndarray], Any]) -> Any:
        """``derived_from_block`` of a block ``Memory.locate_fixed`` found in ``region`` (``address``
        wrapped to 32 bits): the same count and cache, without locating it again."""
        self.count(stream, nbytes, region)
        full_key = (address, nbytes, key)
        value = self.memory.derived.get(full_key)
        if value is None:
            offset = address - region.base
            value = build(region.data[offset:offset + nbytes].copy())
            self.memory.derived.put(full_key, address, address + nbytes, value)
        return value

    def traffic(self) -> DmaTraffic:
        """The counters as a :class:`DmaTraffic`; equal counts give the very same (frozen)
        object, so a task that moves what it moved last run hands the timing model the object
        it has already timed (emulator/timing/task_time.py memoises by identity)."""
        return _TRAFFIC(tuple(self.counts.items()), self.sram_reads, self.sram_writes)


def _build_traffic(counts: tuple, sram_reads: int, sram_writes: int) -> DmaTraffic:
    return DmaTraffic(**dict(counts), sram_hit_reads=sram_reads, sram_hit_writes=sram_writes)


#: DmaTraffic by counter values (stream order included: equal dicts built in another order
#: only cost a second entry)
_TRAFFIC: Memo[DmaTraffic] = Memo(_build_traffic, limit=1 << 16)


class DerivedCache:
    """Values computed from memory bytes (unpacked weights, decoded regcmd chains), each valid
    while no write touches the byte range it came from. Every write path (``Memory.load``,
    ``TaskDma.write_rows``) calls :meth:`invalidate` or :meth:`invalidate_rows`, so a cached
    value always equals what recomputing it from the current bytes would give."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, tuple[int, int, Any]] = {}
        #: bumped whenever a kept value is dropped (a write over its bytes, or the cache starting
        #: over): a holder of values taken from here (a core's task programs, emulator/task_plan.py)
        #: knows they are all still current while it reads the same number
        self.epoch = 0
        # keys sorted by start, their starts (a list, for bisect) and ends, and the running
        # maximum of the ends: most writes (feature maps) overlap no entry, found in O(log n).
        # Built from the entries of one moment and kept while entries come and go: a dropped or
        # replaced entry stays in it (filtered out on use, counted in _stale), an entry put since
        # waits in _pending (scanned directly). A chain that recomputes values every run (weights
        # read from an activation) so does not rebuild the index on each put.
        self._index: tuple[list, list, np.ndarray, list] | None = None
        self._pending: list[tuple[Hashable, int, int]] = []
        self._pending_span = (0, 0)  # [lowest start, highest end) of _pending: most writes miss it
        self._stale = 0
        self._wasted = 0  # searches since the index was built that met dropped entries
        self._scans = 0  # writes checked against _pending since the last put
        #: values put so far (``rows_drop``: rows found clear stay clear until the next put)
        self.puts = 0

    def get(self, key: Hashable) -> Any:
        entry = self._entries.get(key)
        return None if entry is None else entry[2]

    def put(self, key: Hashable, low: int, high: int, value: Any) -> None:
        if len(self._entries) >= DERIVED_CACHE_ENTRIES:
            self.clear()
        if key in self._entries:
            self._stale += 1  # (its index entry, if any, no longer counts)
        self._entries[key] = (low, high, value)
        self._scans = 0
        self.puts += 1
        if self._index is not None:
            span = self._pending_span
            self._pending_span = (min(span[0], low), max(span[1], high)) if self._pending else (low, high)
            self._pending.append((key, low, high))
            if len(self._pending) > _PENDING_MAX:
                self._index = None

    def _build_index(self) -> tuple[list, list, np.ndarray, list]:
        entries = self._entries
        keys = sorted(entries, key=lambda k: entries[k][0])
        bounds = np.array([entries[k][:2] for k in keys], np.int64).reshape(-1, 2)
        ends = bounds[:, 1].copy()
        self._index = (keys, bounds[:, 0].tolist(), ends, np.maximum.accumulate(ends).tolist())
        self._pending, self._stale, self._wasted = [], 0, 0
        return self._index

    def _overlapping(self, low: int, high: int) -> tuple[list, np.ndarray, np.ndarray]:
        """Keys and byte ranges of the entries that overlap ``[low, high)``."""
        keys, starts, ends, reach = self._index or self._build_index()
        count = bisect.bisect_left(starts, high)  # index entries that start before ``high``
        found = {}
        if count and reach[count - 1] > low:
            for i in np.flatnonzero(ends[:count] > low).tolist():
                found[keys[i]] = (starts[i], int(ends[i]))
        span = self._pending_span
        if self._pending and span[0] < high and span[1] > low:
            for key, start, end in self._pending:
                if start < high and end > low:
                    found[key] = (start, end)
        entries = self._entries  # only live entries, with the bounds they have now
        hits = [(key, bounds) for key, bounds in found.items()
                if (entry := entries.get(key)) is not None and entry[:2] == bounds]
        if len(hits) < len(found):  # dropped entries still in the index: a search wasted on them
            self._wasted += 1
            if self._wasted > _WASTED_SEARCHES_MAX:
                self._index = None  # (rebuilt without them; else a run that drops nothing more
                # keeps searching for them on every write near them)
        if not hits:
            return [], np.empty(0, np.int64), np.empty(0, np.int64)
        return [key for key, _ in hits], np.array([b[0] for _, b in hits], np.int64), \
            np.array([b[1] for _, b in hits], np.int64)

    def invalidate(self, low: int, high: int) -> None:
        """Drop every value whose bytes overlap ``[low, high)``."""
        if self._entries and not self._clear_of(low, high):
            self._drop(self._overlapping(low, high)[0])

    def _clear_of(self, low: int, high: int) -> bool:
        """True when the built index shows no entry overlapping ``[low, high)`` (the common
        case of a feature-map write, answered without building result arrays)."""
        index = self._index
        if index is None:
            return False
        count = bisect.bisect_left(index[1], high)
        if count and index[3][count - 1] > low:
            return False
        span = self._pending_span
        if not self._pending or span[0] >= high or span[1] <= low:
            return True
        self._scans += 1
        if self._scans > _PENDING_SCANS_MAX:  # (the pending entries into the index: built again)
            self._build_index()
            return self._clear_of(low, high)
        return not any(start < high and end > low for _, start, end in self._pending)

    def invalidate_rows(self, starts: np.ndarray, row_bytes: int,
                        bounds: tuple[int, int] | None = None) -> None:
        """Drop every value whose bytes overlap one of the rows ``[start, start + row_bytes)``
        (``bounds``: their span, when the caller knows it)."""
        if not self._entries:
            return
        low, high = bounds or (int(starts.min()), int(starts.max()) + row_bytes)
        index = self._index  # (``_clear_of``'s common answer inline: a step's store calls this every run)
        if index is not None and not self._pending:
            count = bisect.bisect_left(index[1], high)
            if not count or index[3][count - 1] <= low:
                return
        elif self._clear_of(low, high):
            return
        keys, lows, highs = self._overlapping(low, high)
        if len(keys) * starts.size > _ROWS_BY_KEYS_MAX:  # (one key at a time, bounded temporaries)
            self._drop([key for key, low, high in zip(keys, lows, highs)
                        if np.any((starts < high) & (starts + row_bytes > low))])
            return
        hit = ((starts < highs[:, None]) & (starts + row_bytes > lows[:, None])).any(axis=1)
        self._drop([key for key, touched in zip(keys, hit.tolist()) if touched])

    def rows_drop(self, starts: np.ndarray, row_bytes: int,
                  bounds: tuple[int, int] | None = None) -> Callable[[], None]:
        """``drop()``: ``invalidate_rows(starts, row_bytes, bounds)`` for a caller that drops the same rows
        on every run (a task program's step). After a call no kept value overlaps them, and only a put
        makes one that does, so a call with no put since the last one returns at once (issue 20: a
        steady run puts nothing; silero-vad's 70 steps a run spent ~0.4 us each on the index search)."""
        clear = [-1]  # (``puts`` when the rows were last found clear)

        def drop() -> None:
            if clear[0] != self.puts:
                self.invalidate_rows(starts, row_bytes, bounds)
                clear[0] = self.puts

        return drop

    def _drop(self, keys: list) -> None:
        for key in keys:
            del self._entries[key]
        if keys:
            self._stale += len(keys)
            if self._index is not None and self._stale > len(self._index[0]) // 2 + _PENDING_MAX:
                self._index = None
            self.epoch += 1

    def clear(self) -> None:
        self._entries.clear()
        self._index, self._pending, self._stale = None, [], 0
        self.epoch += 1

    def __len__(self) -> int:
        return len(self._entries)


@njit(cache=True)
def _gather_rows(data, offsets, rows):
    # an explicit loop per row: Numba's slice assignment cost ~10x more on rows of 100-2000 bytes
    row_bytes = rows.shape[1]
    for r in range(offsets.size):
        source = data[offsets[r]:offsets[r] + row_bytes]
        target = rows[r]
        for i in range(row_bytes):
            target[i] = source[i]


#: the row copy of ``TaskDma.read_located``, for callers that locate rows once and copy them
#: on every run themselves (a core's task programs, emulator/task_plan.py)
gather_rows = _gather_rows


@njit(cache=True)
def _scatter_rows(rows, offsets, data):
    # Rows are written in order: where two rows overlap, the later one wins (as the fancy
    # index assignment did).
    row_bytes = rows.shape[1]
    for r in range(offsets.size):
        start = offsets[r]
        data[start:start + row_bytes] = rows[r, :]


#: the row write of ``TaskDma.write_rows``, for callers that locate rows once (task programs)
scatter_rows = _scatter_rows


@njit(cache=True)
def _scatter_planes(planes, c2, offsets, data):
    # row r of the atoms is surface r // H, line r % H; lane l of surface s is channel s*C2 + l; lanes past the
    # channels 0; rows in order, each written whole. Element by element without a row view and a plane view a
    # lane, and 1x1 planes whose atoms follow each other as one run (issue 20: silero-vad's 128-256 x 1 x 1 and
    # 136 x 1 x 4 int8 stores, 0.3-0.6 us each the old way)
    channels, height, width = planes.shape
    size = offsets.size * c2
    if height == 1 and width == 1 and rows_back_to_back(offsets, c2) and offsets[0] + size <= data.size:
        base = offsets[0]
        for c in range(min(channels, size)):
            data[base + c] = planes[c, 0, 0]
        for i in range(min(channels, size), size):
            data[base + i] = 0
        return
    line = width * c2
    for r in range(offsets.size):
        first, y = (r // height) * c2, r % height
        used = max(min(c2, channels - first), 0)
        row = data[offsets[r]:offsets[r] + line]
        for x in range(width):
            for lane in range(used):
                row[x * c2 + lane] = planes[first + lane, y, x]
            for lane in range(used, c2):
                row[x * c2 + lane] = 0


@njit(cache=True, inline="always")
def rows_back_to_back(offsets, step):
    """Whether the rows at ``offsets`` follow each other ``step`` elements apart."""
    for r in range(1, offsets.shape[0]):
        if offsets[r] != offsets[0] + r * step:
            return False
    return True


def rows_disjoint(starts: np.ndarray, row_bytes: int) -> bool:
    """No two rows ``[start, start + row_bytes)`` overlap (addresses as the DMA wraps them)."""
    return not np.any(np.diff(np.sort(_addresses(starts))) < row_bytes)


def _addresses(starts: np.ndarray | list[int]) -> np.ndarray:
    # Register arithmetic is 32-bit: wrap like the hardware's address adders.
    return np.asarray(starts, dtype=np.int64).reshape(-1) % ADDRESS_SPACE
