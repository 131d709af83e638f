"""Multi-batch builds (`npuemu compile --batch-size N`, guide §5.6, hardware.md §7).

The vendor runtime duplicates a context's internal memory (weights shared) and runs at most
``cores.parallel_batch_contexts`` contexts at once (RK3588 3, RK3576 2), one batch slice each, every
context with core mask auto; the batched input and output buffers are N times the single-batch
size, slice i at offset i * size / N. npuemu compiles that in, from the single-batch build:

- C = min(N, parallel_batch_contexts) contexts. Context k owns a copy of the internal area (and
  of the SRAM area with ``--sram``); slice i runs in context i % C on core i % C.
- The I/O area is laid out per tensor: N consecutive copies of its slot, so the batched buffer
  is contiguous and slice i of tensor t sits at ``address(t) + i * slot(t)``.
- Every NPU chain of the single-batch build is copied per slice with its feature addresses
  relocated (the register writes of the address registers below; weights and constants keep
  theirs, so they are shared), and laid out again in one regcmd area.
- Schedule: each single-batch step becomes one step per slice, in waves of C slices; the C NPU
  steps of a wave share a schedule group (isa/CONTAINER.md 3.5: they run in parallel on their
  cores), CPU steps run per slice (host work, in the wave's order).
- Trailer: ``batch`` = {size, contexts}; a graph input/output is one tensor of shape [N, ...] with
  ``batch.addresses`` (slice i's address); tensors of slice i >= 1 (and the I/O slices of every
  slice, for the host steps) are listed again as ``name#b<i>`` with their own addresses.

With ``--sram`` each context gets 1/C of the chip's SRAM (guide §5.7: a context does not share
its SRAM), so the single-batch build is planned with that capacity.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

from npuemu.isa.chain import decode_chain, encode_chain
from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind
from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain, RegisterWrite

ALIGN = 64  # areas and slots stay 64-byte aligned as in memory_plan.py
#: registers that hold a feature-map, weight or table address (rknpu-isa.md 4); the PC's own
#: link addresses are rewritten by encode_chain, DATA_CUBE_NOTCH_ADDR is not an address
ADDRESS_REGISTERS = frozenset({
    ("CNA", "FEATURE_DATA_ADDR"), ("CNA", "DCOMP_ADDR0"), ("DPU", "DST_BASE_ADDR"),
    ("DPU_RDMA", "SRC_BASE_ADDR"), ("DPU_RDMA", "BS_BASE_ADDR"), ("DPU_RDMA", "BN_BASE_ADDR"),
    ("DPU_RDMA", "EW_BASE_ADDR"), ("PPU", "DST_BASE_ADDR"), ("PPU_RDMA", "SRC_BASE_ADDR"),
})


def slice_name(tensor: str, index: int) -> str:
    """The trailer name of ``tensor``'s copy for batch slice ``index``."""
    return f"{tensor}#b{index}"


def _align(value: int) -> int:
    return -(-value // ALIGN) * ALIGN


def batch_contexts(batch: int, spec) -> int:
    return min(batch, spec.cores.parallel_batch_contexts)


def check_batch(batch: int, cores) -> None:
    """Refuse a batch size the build cannot honour, naming the limit."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise CompileError(f"--batch-size {batch!r}: expected an integer >= 1")
    if batch > 1 and tuple(cores) != (0,):
        raise CompileError(
            f"--batch-size {batch} with --core-mask other than auto (cores {list(cores)}): the runtime runs every "
            "batch context with core mask auto, one context per core (guide §5.6.1); drop --core-mask")


def build_batched(build: Callable[..., ModelFile], graph, spec, batch: int, *, sram: bool, **kwargs) -> ModelFile:
    """``build`` (build.build_model) once for one slice, then the batch of ``batch`` slices."""
    check_batch(batch, kwargs.get("cores", (0,)))
    contexts = batch_contexts(batch, spec)
    single_spec = spec
    if sram and contexts > 1 and spec.sram.size_bytes:
        share = spec.sram.size_bytes // contexts // spec.sram.granule_bytes * spec.sram.granule_bytes
        single_spec = dataclasses.replace(spec, sram=dataclasses.replace(spec.sram, size_bytes=share))
    single = build(graph, single_spec, sram=sram, **kwargs)
    return batch_model(single, spec, batch)


class _Relocation:
    """Where the internal, SRAM and I/O bytes of each slice go (the module note's layout)."""

    def __init__(self, trailer: dict, batch: int, contexts: int) -> None:
        areas = {a["name"]: a for a in trailer["memory_map"]["areas"]}
        for needed in ("weights", "internal", "io", "regcmd"):
            if needed not in areas:
                raise CompileError(f"--batch-size: the single-batch build has no {needed!r} memory area")
        self.batch, self.contexts = batch, contexts
        internal, io = areas["internal"], areas["io"]
        self.internal = (internal["base"], internal["base"] + internal["size"])
        self.internal_stride = _align(internal["size"])
        sram = areas.get("sram_internal")
        self.sram = (sram["base"], sram["base"] + sram["size"]) if sram else (0, 0)
        self.sram_stride = sram["size"] if sram else 0
        self.io_area = (io["base"], io["base"] + io["size"])
        # I/O slots: the DDR tensors stored in the io area, each moved to N consecutive copies
        slots = sorted({(t["address"], _align(t["size"])) for t in trailer["tensors"]
                        if t.get("region", "ddr") == "ddr" and self.io_area[0] <= t["address"] < self.io_area[1]})
        self.slots: list[tuple[int, int, int]] = []  # (old address, slot bytes, new address of slice 0)
        cursor = internal["base"] + contexts * self.internal_stride
        self.io_base = cursor
        for address, size in slots:
            if self.slots and address < self.slots[-1][0] + self.slots[-1][1]:
                raise CompileError(f"--batch-size: I/O tensors at {address:#x} overlap")
            self.slots.append((address, size, cursor))
            cursor += batch * size
        self.io_end = cursor

    def address(self, value: int, index: int) -> int:
        """``value`` (an address of the single-batch build) as slice ``index`` sees it."""
        context = index % self.contexts
        if self.internal[0] <= value < self.internal[1]:
            return value + context * self.internal_stride
        if self.sram[0] <= value < self.sram[1]:
            return value + context * self.sram_stride
        if self.io_area[0] <= value < self.io_area[1]:
            found = self.slot(value)
            if found is not None:
                size, new = found
                return new + index * size
            raise CompileError(f"--batch-size: address {value:#x} lies in the I/O area but in no I/O tensor")
        return value  # weights and constants: shared by every slice

    def slot(self, address: int) -> tuple[int, int] | None:
        """(slot bytes, new slice-0 address) of the I/O tensor at ``address``, None if not I/O."""
        for old, size, new in self.slots:
            if old <= address < old + size:
                return size, new + (address - old)
        return None


def _relocated_chain(chain: Chain, relocation: _Relocation, index: int) -> Chain:
    tasks = []
    for task in chain.tasks:
        writes = [RegisterWrite(w.block, w.register, relocation.address(w.value, index))
                  if (w.block, w.register) in ADDRESS_REGISTERS else w for w in task.writes]
        tasks.append(dataclasses.replace(task, writes=tuple(writes)))
    return Chain(tuple(tasks))


def _kind(record: dict, relocation: _Relocation) -> str:
    """How a tensor's storage is batched: "io" (a copy per slice), "context" (a copy per
    context) or "shared" (one for all: no address, or one the slices share)."""
    address = record.get("address")
    if address is None:
        return "shared"
    if record.get("region", "ddr") == "ddr" and relocation.slot(address) is not None:
        return "io"
    return "context" if relocation.address(address, 1) != address else "shared"


def _slice_tensors(trailer: dict, relocation: _Relocation, batch: int) -> list[dict]:
    """The trailer's tensors for the batch: slice 0 under the tensors' own names (graph inputs and
    outputs as [N, ...] records with their slices' addresses), the other copies as name#b<i>."""
    io_names = set(trailer["graph"].get("inputs", ())) | set(trailer["graph"].get("outputs", ()))
    tensors, copies = [], []
    for tensor in trailer["tensors"]:
        kind = _kind(tensor, relocation)
        if kind == "shared":
            tensors.append(tensor)
            continue
        addresses = [relocation.address(tensor["address"], i) for i in range(batch)]
        first = 0 if kind == "io" else 1  # the host steps of every slice name their own I/O copy
        copies += [tensor | {"name": slice_name(tensor["name"], i), "address": addresses[i]}
                   for i in range(first, batch)]
        if tensor["name"] in io_names:
            shape = list(tensor.get("shape", ()))
            if kind != "io":
                raise CompileError(f"--batch-size: graph tensor {tensor['name']!r} is not stored in the I/O area")
            if not shape or shape[0] != 1:
                raise CompileError(f"--batch-size: graph tensor {tensor['name']!r} has shape {shape}; a batch "
                                   "needs a leading dimension of 1 in the single-batch model")
            size, _ = relocation.slot(tensor["address"])
            tensor = tensor | {"shape": [batch, *shape[1:]], "size": batch * size,
                               "batch": {"size": batch, "addresses": addresses,
                                         "tensors": [slice_name(tensor["name"], i) for i in range(batch)]}}
        tensors.append(tensor | {"address": addresses[0]})
    return tensors + copies


def _cpu_names(kinds: dict[str, str], index: int) -> Callable[[str], str]:
    """Tensor name -> the name slice ``index``'s host step uses (its own copy, see _slice_tensors);
    ``kinds``: each tensor's _kind."""

    def name(tensor: str) -> str:
        kind = kinds.get(tensor, "shared")
        return slice_name(tensor, index) if kind == "io" or (kind == "context" and index) else tensor
    return name


def batch_model(model: ModelFile, spec, batch: int) -> ModelFile:
    """The ``batch``-slice model of the single-batch ``model`` (the module note)."""
    if batch == 1:
        return model
    trailer = copy.deepcopy(model.trailer)
    contexts = batch_contexts(batch, spec)
    relocation = _Relocation(trailer, batch, contexts)
    # a build in the vendor rk3576 layout keeps it per slice (LOWERING.md 39)
    regmap = load_regmap(trailer.get("platform", {}).get("register_layout", spec.register_map.family))
    scale = spec.pc.data_amount_scale
    sections = {s.name: s for s in model.sections}
    regcmd_base = _align(relocation.io_end)
    encoded_data = bytearray()
    schedule: list[dict] = []
    new_steps: dict[tuple[int, int], int] = {}  # (old step, slice) -> new step
    group = max([s.get("group", -1) for s in trailer["schedule"]] + [-1]) + 1
    regcmd_name = None
    kinds = {t["name"]: _kind(t, relocation) for t in trailer["tensors"]}
    for old, step in enumerate(trailer["schedule"]):
        if step["kind"] != "cpu":  # one decode per chain; _relocated_chain copies the tasks per slice
            section = sections[step["chain"]["section"]]
            regcmd_name = section.name
            decoded = decode_chain(section.data, regmap, section.load_address,
                                   section.load_address + step["chain"]["offset"],
                                   step["chain"]["first_amount"], scale)
        for wave in range(0, batch, contexts):
            members = range(wave, min(wave + contexts, batch))
            for index in members:
                new_steps[(old, index)] = len(schedule)
                if step["kind"] == "cpu":
                    rename = _cpu_names(kinds, index)
                    schedule.append(step | {"inputs": [rename(n) for n in step["inputs"]],
                                            "outputs": [rename(n) for n in step["outputs"]]})
                    continue
                offset = len(encoded_data)
                encoded = encode_chain(_relocated_chain(decoded.chain, relocation, index), regmap,
                                       base_addr=regcmd_base + offset, scale=scale)
                encoded_data += encoded.data
                new = step | {"core": index % contexts,
                              "chain": step["chain"] | {"offset": offset, "first_amount": encoded.first_amount}}
                if len(members) > 1:
                    new["group"] = group
                elif "group" in step:
                    del new["group"]
                schedule.append(new)
            group += step["kind"] == "npu" and len(members) > 1
    for layer in trailer["graph"]["layers"]:
        layer["tasks"] = [r | {"step": new_steps[(r["step"], index)]}
                          for index in range(batch) for r in layer.get("tasks", ())]
    trailer["tensors"] = _slice_tensors(trailer, relocation, batch)
    trailer["schedule"] = schedule
    trailer["batch"] = {"size": batch, "contexts": contexts}
    trailer["memory_map"] = _memory_map(trailer["memory_map"], relocation, regcmd_base, len(encoded_data))
    out = [s for s in model.sections if s.kind != SectionKind.REGCMD]
    if regcmd_name is not None:
        out.insert(0, Section(SectionKind.REGCMD, regcmd_name, bytes(encoded_data), MemoryRegion.DDR, regcmd_base))
    return ModelFile(tuple(out), trailer)


def _memory_map(memory_map: dict, relocation: _Relocation, regcmd_base: int, regcmd_size: int) -> dict:
    areas = []
    for area in memory_map["areas"]:
        if area["name"] == "internal":
            area = area | {"size": relocation.contexts * relocation.internal_stride}
        elif area["name"] == "io":
            area = area | {"base": relocation.io_base, "size": relocation.io_end - relocation.io_base}
        elif area["name"] == "regcmd":
            area = area | {"base": regcmd_base, "size": _align(regcmd_size)}
        elif area["name"] == "sram_internal":
            area = area | {"size": relocation.contexts * relocation.sram_stride}
        areas.append(area)
    regions = []
    for region in memory_map["regions"]:
        if region["name"] == "ddr":
            region = region | {"size": regcmd_base + _align(regcmd_size) - region["base"]}
        elif region["name"] == "sram":
            region = region | {"size": relocation.contexts * relocation.sram_stride}
        regions.append(region)
    return {**memory_map, "areas": areas, "regions": regions}


__all__ = ["ADDRESS_REGISTERS", "batch_contexts", "batch_model", "build_batched", "check_batch", "slice_name"]
