"""The address plan of a compiled model: where weights, feature maps, I/O and regcmd live.

One contiguous NPU address range (the ``ddr`` region) starting at ``base`` holds four areas,
in this order, as the vendor's memory report separates them (hardware.md 6; vendor-corpus
README 4.2 "Total Weight / Internal Memory"):

1. ``weights`` - constant blobs (packed weights, BS operand blobs) in the order given, each
   64-byte aligned (RKNN's const tables are 64-byte aligned; 16 bytes is the register
   minimum: DCOMP/BS addresses are bits 31:4, rknpu-isa.md 4).
2. ``internal`` - intermediate feature maps, **reused by lifetime**: each tensor is live from
   the step that writes it to the last step that reads it (inclusive, so a step's inputs and
   output never share bytes); a greedy first-fit, largest tensors first, places each at the
   lowest 64-byte-aligned offset that no simultaneously live tensor occupies. The area is as
   large as the highest end, far below the sum for chains of layers. A *view* (``TensorView``:
   a no-copy Concat input or Split output) has no bytes of its own: ``fold_views`` removes it
   and stretches its root's lifetime and size over it before planning.
3. ``io`` - graph inputs and outputs, one slot each (the host writes and reads them while the
   NPU runs other work, so they are never reused), 64-byte aligned.
4. ``regcmd`` - the register-command buffer, 64-byte aligned (task segments are 64-byte
   aligned, isa/chain.py). Its size is known once the layers are lowered: every task has a
   fixed write count, so ``regcmd_bytes`` can be computed before addresses exist.

All addresses are 32-bit (every address register is 32-bit, rknpu-isa.md 4). The default
``base`` is 1 MiB so that address 0 is never a valid tensor (catches unrelocated fields).
``MemoryPlan.trailer()`` gives the model container's ``memory_map`` (isa/CONTAINER.md 3.4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from npuemu.isa.chain import segment_words
from npuemu.isa.errors import CompileError
from npuemu.isa.task import Task
from npuemu.isa.tensor_layout import ADDRESS_SPACE
from npuemu.isa.words import WORD_BYTES
from npuemu.platforms.model import Platform

from .lower.placement import ConstPlacement, TensorPlacement, feature_placement

DEFAULT_BASE = 0x0010_0000
ALIGN = 64
ADDRESS_LIMIT = ADDRESS_SPACE  # every DMA address register is 32-bit
AREAS = ("weights", "internal", "io", "regcmd")
KINDS = ("internal", "input", "output")


def _align(value: int, multiple: int = ALIGN) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class TensorLifetime:
    """A feature map of ``size`` bytes, written at step ``first`` and last read at ``last``.
    Graph inputs use ``kind="input"`` (their steps are ignored), outputs ``kind="output"``."""

    name: str
    size: int
    first: int = 0
    last: int = 0
    kind: str = "internal"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CompileError(f"tensor {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.size <= 0:
            raise CompileError(f"tensor {self.name}: size must be positive, got {self.size}")
        if self.kind == "internal" and self.last < self.first:
            raise CompileError(f"tensor {self.name}: lifetime [{self.first}, {self.last}] ends before it starts")

    def overlaps(self, other: TensorLifetime) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass(frozen=True)
class Allocation:
    name: str
    area: str
    address: int
    size: int

    @property
    def end(self) -> int:
        return self.address + self.size


@dataclass(frozen=True)
class Area:
    name: str
    base: int
    size: int


@dataclass(frozen=True)
class MemoryPlan:
    base: int
    areas: tuple[Area, ...]
    allocations: tuple[Allocation, ...]
    lifetimes: tuple[TensorLifetime, ...] = ()
    region: str = "ddr"
    _by_name: Mapping[str, Allocation] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {a.name: a for a in self.allocations})

    def __getitem__(self, name: str) -> Allocation:
        try:
            return self._by_name[name]
        except KeyError:
            raise CompileError(f"memory plan: no allocation named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def address(self, name: str) -> int:
        return self[name].address

    def area(self, name: str) -> Area:
        for area in self.areas:
            if area.name == name:
                return area
        raise CompileError(f"memory plan: no area {name!r}")

    @property
    def size(self) -> int:
        return sum(area.size for area in self.areas)

    @property
    def end(self) -> int:
        return self.base + self.size

    def constant(self, name: str) -> ConstPlacement:
        """The placement lowering needs for a constant blob."""
        allocation = self[name]
        return ConstPlacement(name, allocation.address, allocation.size)

    def feature(self, name: str, shape: tuple[int, int, int], dtype: str, platform: Platform, *,
                channel_align: int = 1, packed: bool = False) -> TensorPlacement:
        """The placement lowering needs for a feature map (same geometry as its planned size)."""
        placement = feature_placement(name, self.address(name), shape, dtype, platform,
                                      channel_align=channel_align, packed=packed)
        if placement.size > self[name].size:
            raise CompileError(f"memory plan: {name!r} needs {placement.size} bytes, {self[name].size} were planned")
        return placement

    def trailer(self) -> dict:
        """The container trailer's ``memory_map`` (isa/CONTAINER.md 3.4)."""
        return {
            "regions": [{"name": self.region, "base": self.base, "size": self.size}],
            "areas": [{"name": a.name, "size": a.size, "region": self.region, "base": a.base} for a in self.areas],
        }


def _first_fit(size: int, busy: Iterable[tuple[int, int]]) -> int:
    """Lowest 64-aligned offset where [offset, offset + size) avoids every busy interval."""
    offset = 0
    for start, end in sorted(busy):
        if offset + size <= start:
            break
        offset = max(offset, _align(end))
    return offset


def reuse_offsets(tensors: Sequence[TensorLifetime]) -> tuple[dict[str, int], int]:
    """Offsets of internal tensors inside the internal area (greedy first-fit over
    lifetimes, largest first) and the area's size."""
    order = sorted(tensors, key=lambda t: (-t.size, t.first, t.name))
    placed: list[tuple[TensorLifetime, int]] = []
    offsets: dict[str, int] = {}
    for item in order:
        busy = [(offset, offset + other.size) for other, offset in placed if other.overlaps(item)]
        offset = _first_fit(item.size, busy)
        placed.append((item, offset))
        offsets[item.name] = offset
    extent = max((offset + item.size for item, offset in placed), default=0)
    return offsets, _align(extent)


def _check_names(constants: Sequence[tuple[str, int]], tensors: Sequence[TensorLifetime]) -> None:
    seen: set[str] = set()
    for name in [name for name, _ in constants] + [t.name for t in tensors]:
        if name in seen:
            raise CompileError(f"memory plan: {name!r} is allocated twice")
        seen.add(name)


def plan_memory(constants: Mapping[str, int] | Sequence[tuple[str, int]], tensors: Sequence[TensorLifetime],
                regcmd_bytes: int = 0, *, base: int = DEFAULT_BASE, region: str = "ddr") -> MemoryPlan:
    """The plan of the module docstring. ``constants``: name -> size (or pairs, in order)."""
    pairs = list(constants.items()) if isinstance(constants, Mapping) else list(constants)
    _check_names(pairs, tensors)
    if base % ALIGN or not 0 <= base < ADDRESS_LIMIT:
        raise CompileError(f"memory plan: base {base:#x} must be a 64-byte aligned 32-bit address")
    allocations: list[Allocation] = []
    areas: list[Area] = []
    cursor = base

    def close(name: str, start: int, end: int) -> int:
        size = _align(end - start)
        areas.append(Area(name, start, size))
        return start + size

    offset = cursor
    for name, size in pairs:
        if size <= 0:
            raise CompileError(f"memory plan: constant {name!r} has size {size}")
        allocations.append(Allocation(name, "weights", offset, size))
        offset = _align(offset + size)
    cursor = close("weights", cursor, offset)
    internal = [t for t in tensors if t.kind == "internal"]
    offsets, extent = reuse_offsets(internal)
    allocations += [Allocation(t.name, "internal", cursor + offsets[t.name], t.size) for t in internal]
    cursor = close("internal", cursor, cursor + extent)
    offset = cursor
    for item in (t for t in tensors if t.kind != "internal"):
        allocations.append(Allocation(item.name, "io", offset, item.size))
        offset = _align(offset + item.size)
    cursor = close("io", cursor, offset)
    if regcmd_bytes < 0:
        raise CompileError(f"memory plan: regcmd size {regcmd_bytes} is negative")
    allocations.append(Allocation("regcmd", "regcmd", cursor, regcmd_bytes))
    cursor = close("regcmd", cursor, cursor + regcmd_bytes)
    if cursor > ADDRESS_LIMIT:
        raise CompileError(f"memory plan: {cursor - base} bytes from base {base:#x} exceed the 32-bit NPU address space")
    return MemoryPlan(base, tuple(areas), tuple(allocations), tuple(tensors), region)


@dataclass(frozen=True)
class TensorView:
    """A tensor stored inside ``parent`` from byte ``offset`` on, ``size`` bytes (a no-copy
    Concat input or Split output, LOWERING.md 10.1): it has no allocation of its own."""

    name: str
    parent: str
    offset: int
    size: int

    def __post_init__(self) -> None:
        if self.offset < 0 or self.offset % 16 or self.size <= 0:
            raise CompileError(f"view {self.name}: offset {self.offset} must be a non-negative multiple of 16 and "
                               f"size {self.size} positive")


def view_roots(views: Iterable[TensorView]) -> dict[str, tuple[str, int]]:
    """name -> (the tensor that owns the bytes, offset in it) for every view, through views of views."""
    by_name = {view.name: view for view in views}
    roots = {}
    for name in by_name:
        current, offset, seen = name, 0, set()
        while current in by_name:
            if current in seen:
                raise CompileError(f"memory plan: views of {name!r} form a cycle")
            seen.add(current)
            offset += by_name[current].offset
            current = by_name[current].parent
        roots[name] = (current, offset)
    return roots


def fold_views(tensors: Sequence[TensorLifetime], views: Iterable[TensorView]) -> list[TensorLifetime]:
    """``tensors`` without the views, each root living from the earliest write to the last read
    of itself and its views and large enough for every view's end - so no other tensor reuses a
    view's bytes while any of them is live. Views and roots must be internal tensors."""
    views = list(views)
    roots = view_roots(views)
    by_name = {t.name: t for t in tensors}
    spans: dict[str, list[int]] = {}
    for view in views:
        root, offset = roots[view.name]
        for name in (view.name, root):
            if name in by_name and by_name[name].kind != "internal":
                raise CompileError(f"memory plan: view {view.name!r} involves {name!r}, a graph "
                                   f"{by_name[name].kind}; only internal tensors share bytes")
        if root not in by_name:
            raise CompileError(f"memory plan: view {view.name!r} lies in {root!r}, which has no lifetime")
        span = spans.setdefault(root, [by_name[root].first, by_name[root].last, by_name[root].size])
        if view.name in by_name:
            span[0], span[1] = min(span[0], by_name[view.name].first), max(span[1], by_name[view.name].last)
        span[2] = max(span[2], offset + view.size)
    folded = []
    for item in tensors:
        if item.name in roots:
            continue
        if item.name in spans:
            first, last, size = spans[item.name]
            item = TensorLifetime(item.name, size, first, last, item.kind)
        folded.append(item)
    return folded


def regcmd_bytes(tasks: Iterable[Task]) -> int:
    """Bytes a chain of ``tasks`` occupies (64-byte segments with the 4-word tail, isa/chain.py);
    independent of addresses because every task writes a fixed register set."""
    return sum(segment_words(len(task.writes)) for task in tasks) * WORD_BYTES


def lifetimes_from_steps(steps: Sequence[tuple[Sequence[str], Sequence[str]]], sizes: Mapping[str, int],
                         inputs: Iterable[str] = (), outputs: Iterable[str] = ()) -> list[TensorLifetime]:
    """Lifetimes from an ordered list of (input names, output names) per step; names not in
    ``sizes`` (constants) are ignored."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for index, (reads, writes) in enumerate(steps):
        for name in writes:
            first.setdefault(name, index)
            last[name] = max(last.get(name, index), index)
        for name in reads:
            first.setdefault(name, index)
            last[name] = index
    graph_inputs, graph_outputs = set(inputs), set(outputs)
    result = []
    for name in first:
        if name not in sizes:
            continue
        kind = "input" if name in graph_inputs else "output" if name in graph_outputs else "internal"
        result.append(TensorLifetime(name, sizes[name], first[name], last[name], kind))
    return result


#: where the SRAM window sits in the NPU address space when a build uses it (the emulator's
#: default window, emulator/memory.py DEFAULT_SRAM_BASE; the memory map records it either way)
SRAM_BASE = 0xFF000000


@dataclass(frozen=True)
class SramPlan:
    """Internal tensors placed in SRAM: their addresses and the region's size (granule multiple)."""

    addresses: dict[str, int]
    size: int
    base: int = SRAM_BASE

    def trailer_region(self) -> dict:
        return {"name": "sram", "base": self.base, "size": self.size}


def plan_sram(tensors: Sequence[TensorLifetime], capacity: int, granule: int, *, base: int = SRAM_BASE) -> SramPlan:
    """Internal tensors in SRAM as far as it goes (guide 5.7: internal tensors, not weights):
    smallest first, each kept if the lifetime-reused SRAM area still fits ``capacity`` - the
    most tensors, so the most layers hit SRAM. The others stay in DDR."""
    chosen: list[TensorLifetime] = []
    for item in sorted((t for t in tensors if t.kind == "internal"), key=lambda t: (t.size, t.first, t.name)):
        _, extent = reuse_offsets([*chosen, item])
        if -(-extent // granule) * granule <= capacity:
            chosen.append(item)
    offsets, extent = reuse_offsets(chosen)
    size = -(-extent // granule) * granule if chosen else 0
    return SramPlan({name: base + offset for name, offset in offsets.items()}, size, base)
