"""Lay out a vendor model's memory and relocate its register-command stream.

Rules from ``docs/rknn-relocation.md`` (§0.5, §4 R1/R2/R4, §8 steps 3-4):

- **Weight region:** tensors of kind 4 and 5 that have a blob, in tensor order, each at the
  next 64-byte boundary, taking its slot-12 size when librknnc padded a small kind-5 const
  past its blob (``_is_padded_const``). **Misc region:** kind 8, same packing (vendor order unverified; it
  does not matter because relocation is per tensor). **LUT region:** kind-6 LUT-program
  blobs, same packing. **Internal region:** kinds 1, 2 and 3 at their slot-13 offset; its
  overlaps are buffer reuse across disjoint lifetimes.
- **R1:** every relocation pair sets the 32-bit value field of its regcmd word to
  ``address(tensor) + offset``; the table's offset is used, not the stored value.
- **R2:** the regcmd buffer's address is added to every task record's ``regcmd_addr`` and,
  once per distinct tail, to the PC_BASE_ADDRESS word(s) of tails that continue a chain.

Nothing here allocates a region from a size the file merely claims: plans are offsets, and
the only images built (``region_image``) hold blob bytes that are really in the file (plus the
zero padding of padded consts, under a page each).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from npuemu.isa.errors import ConfigError, ModelFileError, UnsupportedProgramError
from npuemu.isa.rknn.model import REGCMD_WORD_BYTES, TASK_RECORD, Region, RknnModel, RknnTensor, TaskRecord, TensorKind

TENSOR_ALIGNMENT = 64
REGION_ALIGNMENT = 4096
ADDRESS_SPACE = 1 << 32
PADDING_LIMIT = 4096
"""Most a kind-5 const's slot 12 may exceed its blob (the fixtures pad by at most 240 bytes)."""
DEFAULT_START = 0x1000
"""First address used by :func:`default_bases`; page 0 stays unmapped so a null address faults."""

_PACKED_REGIONS = {
    TensorKind.CONST: Region.WEIGHT, TensorKind.CONST_OTHER: Region.WEIGHT,
    TensorKind.MISC: Region.MISC, TensorKind.LUT_PROGRAM: Region.LUT,
}
_INTERNAL_KINDS = (TensorKind.INPUT, TensorKind.OUTPUT, TensorKind.INTERNAL)
_VALUE_MASK = np.uint64(0xFFFF_0000_0000_FFFF)


@dataclass(frozen=True)
class Placement:
    """Where one tensor lives: ``offset`` bytes into ``region``, ``size`` bytes long."""

    tensor_index: int
    name: str
    region: Region
    offset: int
    size: int


@dataclass(frozen=True)
class MemoryPlan:
    """Region-relative placement of every tensor that relocation can name, plus region sizes."""

    placements: tuple[Placement, ...]
    sizes: Mapping[Region, int] = field(compare=False)   # bytes to reserve per region (weight, internal, misc, lut)

    def by_name(self) -> dict[str, Placement]:
        return {placement.name: placement for placement in self.placements}

    def in_region(self, region: Region) -> tuple[Placement, ...]:
        return tuple(placement for placement in self.placements if placement.region is region)

    def extent(self, region: Region) -> int:
        """End of the last tensor placed in ``region`` (may be below the reserved size)."""
        return max((p.offset + p.size for p in self.in_region(region)), default=0)


@dataclass(frozen=True)
class Bases:
    """Device addresses of the regions and of the regcmd and task buffers."""

    weight: int
    internal: int
    misc: int
    lut: int
    regcmd: int
    task: int

    def of(self, region: Region) -> int:
        return getattr(self, region.value)


@dataclass(frozen=True)
class RelocatedProgram:
    """The runnable program for one address assignment."""

    bases: Bases
    plan: MemoryPlan
    addresses: Mapping[str, int] = field(compare=False)  # tensor name -> device address
    regcmd: np.ndarray = field(compare=False, repr=False)  # uint64, relocated
    tasks: tuple[TaskRecord, ...]                        # regcmd_addr now a device address
    task_blob: bytes = field(repr=False)                 # the packed records, relocated
    relocated_words: tuple[int, ...]                     # word indices set by the table (R1)
    patched_tails: tuple[int, ...]                       # PC_BASE_ADDRESS word indices (R2)


# --- memory plan -----------------------------------------------------------------------------


def plan_memory(model: RknnModel) -> MemoryPlan:
    """The vendor memory plan (R4): packed weight/misc/LUT regions and the internal region."""
    placements: list[Placement] = []
    cursors = {Region.WEIGHT: 0, Region.MISC: 0, Region.LUT: 0}
    for tensor in model.tensors:
        if tensor.kind in _PACKED_REGIONS and tensor.blob_index is not None:
            region = _PACKED_REGIONS[TensorKind(tensor.kind)]
            size = _blob_size(model, tensor)
            offset = _align(cursors[region], TENSOR_ALIGNMENT)
            cursors[region] = offset + size
            placements.append(Placement(tensor.index, tensor.name, region, offset, size))
        elif tensor.kind in _INTERNAL_KINDS:
            size = tensor.size or 0
            _check_inside_internal(model, tensor, size)
            placements.append(Placement(tensor.index, tensor.name, Region.INTERNAL, tensor.memory_offset, size))
    sizes = {Region.WEIGHT: max(cursors[Region.WEIGHT], model.regions.weight),
             Region.MISC: max(cursors[Region.MISC], model.regions.misc),
             Region.LUT: cursors[Region.LUT], Region.INTERNAL: model.regions.internal}
    return MemoryPlan(tuple(placements), sizes)


def _blob_size(model: RknnModel, tensor: RknnTensor) -> int:
    """Bytes the tensor takes in its region: its blob, or slot 12 when the vendor padded a small const."""
    size = len(model.blobs[tensor.blob_index])
    if tensor.size is None or tensor.size == size or tensor.kind == TensorKind.LUT_PROGRAM:
        return size
    if model.target == "rk3576" and size > tensor.size:
        # the vendor's rk3576 image-input weights: a blob longer than slot 12 (24 kernels of 3x3: 864 -> 1152,
        # a 1x1's 128 -> 512), placed at its length [V: the weight region's size is the sum of the blobs';
        # emulator/REGISTER_SEMANTICS.md 47.1]. The blob is data the file holds: nothing is inflated.
        return size
    if _is_padded_const(tensor, size):
        return tensor.size
    raise ModelFileError(f"{model.source}: graphs[0].tensors[{tensor.index}] ({tensor.name!r}): slot 12 says "
                         f"{tensor.size} bytes, but its blob {tensor.blob_index} holds {size}")


def _is_padded_const(tensor: RknnTensor, blob_size: int) -> bool:
    """A kind-5 const whose blob is shorter than slot 12, rounded up to whole 64-byte granules.

    librknnc reserves slot-12 bytes and stores only the data: layernorm* gamma1 240 -> 256 and
    beta2 480 -> 512 (C 120 padded to 128), resize_* scales2 16 -> 128 (fp16) / 256 (int8); its
    Const Tensor table ends each of them at start + slot 12 (isa/RKNN_TAILS.md §3). The rest stays
    zero. A blob longer than its slot, an odd slot, or padding of a page or more is still refused,
    so a corrupted slot 12 cannot inflate the weight image.
    """
    return (tensor.kind == TensorKind.CONST_OTHER and blob_size < tensor.size
            and tensor.size % TENSOR_ALIGNMENT == 0 and tensor.size - blob_size < PADDING_LIMIT)


def _check_inside_internal(model: RknnModel, tensor: RknnTensor, size: int) -> None:
    if tensor.memory_offset + size > model.regions.internal:
        raise ModelFileError(
            f"{model.source}: graphs[0].tensors[{tensor.index}] ({tensor.name!r}): offset {tensor.memory_offset:#x} "
            f"(slot 13) + size {size} (slot 12) ends past the internal region's {model.regions.internal} bytes "
            f"(model slot 19.1)")


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def region_image(model: RknnModel, plan: MemoryPlan, region: Region) -> bytearray:
    """The initial bytes of the weight, misc or LUT region: blobs at their offsets, zeros between.

    Its length is the placed data's extent, never a size the file merely claims; the rest of the
    reserved region (``plan.sizes``) is zero.
    """
    if region not in (Region.WEIGHT, Region.MISC, Region.LUT):
        raise ValueError(f"region {region.value!r} has no initial image; only weight, misc and lut do")
    image = bytearray(plan.extent(region))
    for placement in plan.in_region(region):
        blob = model.blob(model.tensors[placement.tensor_index])
        image[placement.offset:placement.offset + len(blob)] = blob
    return image


# --- addresses -------------------------------------------------------------------------------


def program_sizes(model: RknnModel) -> dict[str, int]:
    return {"regcmd": model.program.regcmd_words * REGCMD_WORD_BYTES,
            "task": len(model.program.tasks) * TASK_RECORD.size}


def default_bases(model: RknnModel, plan: MemoryPlan, start: int = DEFAULT_START) -> Bases:
    """Regions one after another from ``start``, each 4 KiB-aligned: regcmd, task, weight, misc, LUT, internal."""
    sizes = program_sizes(model)
    order = [("regcmd", sizes["regcmd"]), ("task", sizes["task"]), ("weight", plan.sizes[Region.WEIGHT]),
             ("misc", plan.sizes[Region.MISC]), ("lut", plan.sizes[Region.LUT]),
             ("internal", plan.sizes[Region.INTERNAL])]
    cursor, bases = start, {}
    for name, size in order:
        bases[name] = _align(cursor, REGION_ALIGNMENT)
        cursor = bases[name] + size
    if cursor > ADDRESS_SPACE:
        raise ModelFileError(f"{model.source}: the regions the file asks for ({', '.join(f'{n} {s}' for n, s in order)}"
                             f" bytes) do not fit a 32-bit device address space from {start:#x}")
    result = Bases(**bases)
    check_bases(model, plan, result)
    return result


def check_bases(model: RknnModel, plan: MemoryPlan, bases: Bases) -> None:
    """Each region must be 64-byte aligned, below 4 GiB and disjoint from the others."""
    sizes = program_sizes(model)
    spans = [(name, getattr(bases, name), size) for name, size in (
        ("regcmd", sizes["regcmd"]), ("task", sizes["task"]), ("weight", plan.sizes[Region.WEIGHT]),
        ("misc", plan.sizes[Region.MISC]), ("lut", plan.sizes[Region.LUT]),
        ("internal", plan.sizes[Region.INTERNAL]))]
    for name, base, size in spans:
        if base < 0 or base % TENSOR_ALIGNMENT or base + size > ADDRESS_SPACE:
            raise ConfigError(f"{model.source}: {name} base {base:#x} (+{size} bytes) must be a multiple of "
                              f"{TENSOR_ALIGNMENT} and end below 4 GiB")
    used = sorted((base, base + size, name) for name, base, size in spans if size)
    for (_, end, name), (start, _, other) in zip(used, used[1:]):
        if start < end:
            raise ConfigError(f"{model.source}: the {name} region (ends at {end:#x}) overlaps the {other} region "
                              f"(starts at {start:#x})")


def tensor_addresses(plan: MemoryPlan, bases: Bases, overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """Device address of every placed tensor; ``overrides`` binds single tensors elsewhere."""
    addresses = {placement.name: bases.of(placement.region) + placement.offset for placement in plan.placements}
    for name, address in (overrides or {}).items():
        if name not in addresses:
            raise ConfigError(f"address override names tensor {name!r}, which the memory plan does not place")
        if not 0 <= address < ADDRESS_SPACE:
            raise ConfigError(f"address override for {name!r} ({address:#x}) is not a 32-bit device address")
        addresses[name] = address
    return addresses


# --- relocation ------------------------------------------------------------------------------


def relocate(model: RknnModel, plan: MemoryPlan | None = None, bases: Bases | None = None,
             overrides: Mapping[str, int] | None = None, self_modifying: bool = False) -> RelocatedProgram:
    """Apply R1 (the relocation table) and R2 (regcmd-buffer addresses) to a copy of the program.

    ``self_modifying``: entries naming the placeholder tensor 0 are offsets into the regcmd buffer
    itself (the vendor's exLSTM, isa/RKNN_TAILS.md 2) and relocate to ``bases.regcmd``; without
    it they are refused (:func:`has_self_modifying_entries`)."""
    plan = plan or plan_memory(model)
    bases = bases or default_bases(model, plan)
    check_bases(model, plan, bases)
    addresses = tensor_addresses(plan, bases, overrides)
    regcmd = model.program.regcmd.copy()
    relocated = _apply_table(model, regcmd, addresses, bases.regcmd if self_modifying else None)
    tails = _patch_tails(model, regcmd, bases.regcmd)
    tasks = tuple(_moved(task, bases.regcmd) for task in model.program.tasks)
    regcmd.setflags(write=False)
    return RelocatedProgram(bases, plan, addresses, regcmd, tasks, b"".join(task.pack() for task in tasks),
                            relocated, tails)


def _apply_table(model: RknnModel, regcmd: np.ndarray, addresses: Mapping[str, int],
                 regcmd_base: int | None) -> tuple[int, ...]:
    words: list[int] = []
    values: list[int] = []
    for entry in model.relocations:
        placeholder = model.tensors[entry.tensor_index].kind == TensorKind.NONE
        if entry.tensor_name not in addresses and not (placeholder and regcmd_base is not None):
            tensor = model.tensors[entry.tensor_index]
            if placeholder:
                raise _self_modifying(model, entry)
            raise ModelFileError(f"{model.source}: the relocation table names {entry.tensor_name!r} "
                                 f"({tensor.kind_name}), which has no data and so no place in the memory plan")
        base = regcmd_base if placeholder else addresses[entry.tensor_name]
        for offset, word in entry.pairs:
            if placeholder:   # the stored value is the regcmd-blob offset (its pair's is 0; RKNN_TAILS.md 2)
                offset = (int(model.program.regcmd[word]) >> 16) & 0xFFFFFFFF
            if base + offset >= ADDRESS_SPACE:
                raise ModelFileError(f"{model.source}: relocation of {entry.tensor_name!r} to regcmd word {word}: "
                                     f"address {base:#x} + offset {offset:#x} does not fit the 32-bit value field")
            words.append(word)
            values.append(base + offset)
    index = np.asarray(words, dtype=np.int64)
    regcmd[index] = (regcmd[index] & _VALUE_MASK) | (np.asarray(values, dtype=np.uint64) << np.uint64(16))
    return tuple(words)


def has_self_modifying_entries(model: RknnModel) -> bool:
    """True when the relocation table points words at the placeholder tensor 0 (the regcmd buffer)."""
    return any(model.tensors[entry.tensor_index].kind == TensorKind.NONE for entry in model.relocations)


def _self_modifying(model: RknnModel, entry) -> UnsupportedProgramError:
    """Entries naming the unnamed placeholder tensor 0 point DPU output addresses into the regcmd
    blob itself: in lstm_int8, DPU DST_BASE_ADDR of task 71 (word 10650) holds 0x15a30, the PC
    tail of the block replayed per timestep (isa/RKNN_TAILS.md §2). Such a program rewrites its
    own commands while it runs: a caller that can run it (the runner, emulator/rknn_self_modifying.py)
    asks for ``relocate(..., self_modifying=True)``; anything else gets this refusal by name."""
    words = ", ".join(str(word) for _, word in entry.pairs[:4])
    more = f" and {len(entry.pairs) - 4} more" if len(entry.pairs) > 4 else ""
    return UnsupportedProgramError(f"{model.source}: the relocation table points regcmd words {words}{more} at the "
                          f"placeholder tensor 0, i.e. into the regcmd buffer itself (the program rewrites its "
                          f"own commands, as the vendor's exLSTM does); relocate it with self_modifying=True")


def _patch_tails(model: RknnModel, regcmd: np.ndarray, regcmd_base: int) -> tuple[int, ...]:
    patched = []
    for tail in model.program.tails:   # distinct tail words, so a shared tail is patched once
        if tail.ends_chain:
            continue
        value = regcmd_base + tail.next_offset
        if value >= ADDRESS_SPACE:
            raise ConfigError(f"{model.source}: regcmd base {regcmd_base:#x} + tail offset {tail.next_offset:#x} "
                              f"(word {tail.word_index}) does not fit the 32-bit address field")
        for index in tail.base_words:   # one word, or the exLSTM blocks' repeated BASE writes
            word = int(regcmd[index])
            regcmd[index] = (word & 0xFFFF_0000_0000_FFFF) | (value << 16)
            patched.append(index)
    return tuple(patched)


def _moved(task: TaskRecord, regcmd_base: int) -> TaskRecord:
    return replace(task, regcmd_addr=task.regcmd_addr + regcmd_base)
