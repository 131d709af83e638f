"""Static memory report of a model file, in the layout of the vendor's ``eval_memory``
(hardware.md §6): Weight Memory, Internal Tensor Memory, Other Memory (register commands, I/O
tensors), Total Memory, and the model file size.

Only the model file is read (no run): for an npuemu ``.npu`` file the trailer's
``memory_map.areas`` (isa/CONTAINER.md §3.4: ``weights``, ``internal``, ``io``, ``regcmd``, any
other area counts as "other"); for a vendor ``.rknn`` file the region sizes of model slot 19
(weight, internal, misc), the regcmd and task blob sizes, and the input/output tensor sizes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class MemoryReport:
    model: str
    weight_bytes: int
    internal_bytes: int
    other: dict[str, int]  # part name -> bytes (register commands, I/O, ...)
    file_bytes: int
    notes: list[str] = field(default_factory=list)
    sram_bytes: int = 0  # internal tensors placed in SRAM (npuemu compile --sram); not in the DDR total
    sram_tensors: list[tuple[str, str, int, int]] = field(default_factory=list)  # name, dtype, address, size
    batch: tuple[int, int] = (1, 1)  # (slices, contexts) of a multi-batch build (compiler/batch.py)

    @property
    def other_bytes(self) -> int:
        return sum(self.other.values())

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.internal_bytes + self.other_bytes

    def to_json(self) -> dict:
        return {"model": self.model, "weight_bytes": self.weight_bytes, "internal_bytes": self.internal_bytes,
                "other_bytes": self.other_bytes, "other": dict(self.other), "total_bytes": self.total_bytes,
                "model_file_bytes": self.file_bytes, "sram_bytes": self.sram_bytes,
                "batch_size": self.batch[0], "batch_contexts": self.batch[1],
                "sram_tensors": [{"name": n, "dtype": d, "address": a, "size": z} for n, d, a, z in self.sram_tensors],
                "notes": list(self.notes)}

    def format_text(self) -> str:
        rule = "=" * 54
        parts = ", ".join(f"{name} {_human(size)}" for name, size in self.other.items()) or "none"
        lines = [rule, "               Memory Profile Info Dump", rule,
                 "NPU model memory detail(bytes):",
                 f"    Weight Memory: {_human(self.weight_bytes)}",
                 f"    Internal Tensor Memory: {_human(self.internal_bytes)}",
                 f"    Other Memory: {_human(self.other_bytes)} ({parts})",
                 f"    Total Memory: {_human(self.total_bytes)}",
                 *([f"    SRAM (internal tensors): {_human(self.sram_bytes)} in {len(self.sram_tensors)} tensor(s)"]
                   if self.sram_bytes else []),
                 *([f"    Batch: {self.batch[0]} slices in {self.batch[1]} context(s): internal memory x{self.batch[1]}, "
                    f"I/O x{self.batch[0]}, weights shared"] if self.batch[0] > 1 else []),
                 "",
                 "When evaluating memory usage, we need consider",
                 f"the size of model, current model size is: {_human(self.file_bytes)}",
                 rule]
        return "\n".join(lines)


def _human(size: int) -> str:
    if size >= 1024 * 1024:
        return f"{size / (1024 * 1024):.2f} MiB ({size} B)"
    if size >= 1024:
        return f"{size / 1024:.2f} KiB ({size} B)"
    return f"{size} B"


def memory_npu(model, path: str) -> MemoryReport:
    """Report of an npuemu ``.npu`` :class:`~npuemu.isa.container.ModelFile` read from ``path``."""
    from npuemu.isa.errors import ModelFileError

    areas = model.memory_map().areas
    if not areas:
        raise ModelFileError(f"{path}: the model file has no memory_map.areas (isa/CONTAINER.md §3.4); "
                             "cannot report its memory")
    weight = internal = 0
    other: dict[str, int] = {}
    for area in areas:
        if area.name == "weights":
            weight += area.size
        elif area.name == "internal":
            internal += area.size
        elif area.region == "sram":
            continue  # SRAM is not DDR memory: reported on its own line
        else:
            label = {"regcmd": "register commands", "io": "I/O tensors"}.get(area.name, area.name)
            other[label] = other.get(label, 0) + area.size
    sram = [(t.name, t.dtype or "", int(t.address or 0), int(t.size or 0)) for t in model.tensors()
            if getattr(t, "region", None) == "sram"]
    sram_bytes = sum(area.size for area in areas if area.region == "sram")
    batch = model.trailer.get("batch") or {"size": 1, "contexts": 1}
    return MemoryReport(path, weight, internal, other, os.path.getsize(path), sram_bytes=sram_bytes,
                        sram_tensors=sram, batch=(int(batch["size"]), int(batch["contexts"])))


def memory_rknn(model, path: str) -> MemoryReport:
    """Report of a vendor ``.rknn`` :class:`~npuemu.isa.rknn.RknnModel` read from ``path``."""
    program = model.program
    other: dict[str, int] = {}
    regcmd = 0
    for index in (program.regcmd_tensor, program.task_tensor):
        if index is not None:
            blob = model.blob(model.tensors[index])
            regcmd += len(blob) if blob is not None else 0
    other["register commands"] = regcmd
    io = 0
    for index in tuple(model.inputs) + tuple(model.outputs):
        io += int(model.tensors[index].size or 0)
    other["I/O tensors"] = io
    if model.regions.misc:
        other["misc region"] = model.regions.misc
    return MemoryReport(path, model.regions.weight, model.regions.internal, other, os.path.getsize(path))
