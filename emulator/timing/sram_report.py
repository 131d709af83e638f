"""`npuemu mem --sram`: the guide's per-layer SRAM table (§5.7.3.4, hardware.md 6) of a ``.npu``
model, from the model file alone (no run).

One row per layer and output tensor: ID, User (op type), Tensor, DataType, OrigShape, NativeShape,
[Start, End) address, Size, SramHit (the bytes of the tensor in SRAM; ``\\`` for a tensor outside
the internal memory - graph inputs and outputs - as the guide prints). Then the totals:
Total Weight Memory Size, Total Internal Memory Size (DDR and SRAM internal areas) and three
predictions per frame: Internal Memory RW Amount (every NPU layer reads each feature input once
and writes its output once), Weight Memory RW Amount (each weight byte read once) and SRAM Hit RW
Amount (the part of the internal RW that goes to SRAM: the DDR bytes saved). These are static
predictions, as the vendor's are; `npuemu perf --json` measures what the DMA really moved (halo
rows re-read by row tiles included) per layer under ``sram_hit_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SramRow:
    layer: int
    user: str
    tensor: str
    dtype: str
    shape: tuple
    native_shape: tuple
    start: int
    size: int
    sram_hit: int | None  # None: not an internal tensor (graph input/output)


@dataclass
class SramReport:
    rows: list[SramRow] = field(default_factory=list)
    sram_area: tuple[int, int] = (0, 0)  # (base, size) of the SRAM internal area
    weight_bytes: int = 0
    internal_bytes: int = 0  # DDR internal area + SRAM area
    internal_rw: int = 0
    weight_rw: int = 0
    sram_hit_rw: int = 0

    def to_json(self) -> dict:
        return {"sram_area": {"base": self.sram_area[0], "size": self.sram_area[1]},
                "layers": [{"id": r.layer, "user": r.user, "tensor": r.tensor, "dtype": r.dtype,
                            "shape": list(r.shape), "native_shape": list(r.native_shape), "start": r.start,
                            "end": r.start + r.size, "size": r.size, "sram_hit": r.sram_hit} for r in self.rows],
                "total_weight_bytes": self.weight_bytes, "total_internal_bytes": self.internal_bytes,
                "predict_internal_rw_bytes": self.internal_rw, "predict_weight_rw_bytes": self.weight_rw,
                "predict_sram_hit_rw_bytes": self.sram_hit_rw}

    def format_text(self) -> str:
        rule = "-----+" * 8
        base, size = self.sram_area
        lines = [rule, f"Total allocated Internal SRAM Size: {size}, Addr: [{base:#x}, {base + size:#x})", rule,
                 "ID  User  Tensor  DataType  OrigShape  NativeShape  | [Start  End)  Size | SramHit", rule]
        for r in self.rows:
            hit = "\\" if r.sram_hit is None else f"{r.sram_hit:#010x}"
            lines.append(f"{r.layer}  {r.user}  {r.tensor}  {r.dtype.upper()}  {_shape(r.shape)}  "
                         f"{_shape(r.native_shape)}  | {r.start:#x}  {r.start + r.size:#x}  {r.size:#010x} | {hit}")
        lines += [rule, f"Total Weight Memory Size: {self.weight_bytes}",
                  f"Total Internal Memory Size: {self.internal_bytes}",
                  f"Predict Internal Memory RW Amount: {self.internal_rw}",
                  f"Predict Weight Memory RW Amount: {self.weight_rw}",
                  f"Predict SRAM Hit RW Amount: {self.sram_hit_rw}", rule]
        return "\n".join(lines)


def _shape(shape) -> str:
    return "(" + ",".join(str(int(d)) for d in shape) + ")"


def sram_npu(model) -> SramReport:
    """The SRAM table of an npuemu :class:`~npuemu.isa.container.ModelFile`."""
    tensors = {t.name: t for t in model.tensors()}
    graph = model.graph()
    io = set(graph.inputs) | set(graph.outputs)
    areas = model.memory_map().areas
    report = SramReport()
    for area in areas:
        if area.name == "weights":
            report.weight_bytes += area.size
        elif area.name == "internal" or area.region == "sram":
            report.internal_bytes += area.size
        if area.region == "sram":
            report.sram_area = (int(area.base or 0), area.size)
    report.weight_rw = report.weight_bytes

    def hit(name: str) -> int:
        tensor = tensors[name]
        return int(tensor.size or 0) if tensor.region == "sram" else 0

    for layer in model.layers():
        for name in layer.outputs:
            if name not in tensors:
                continue
            tensor = tensors[name]
            report.rows.append(SramRow(layer.id, layer.op_type, name, tensor.dtype or "", tuple(tensor.shape or ()),
                                       tuple(tensor.native_shape or ()), int(tensor.address or 0),
                                       int(tensor.size or 0), None if name in io else hit(name)))
        if not layer.tasks:  # host steps and views move no NPU bytes
            continue
        for name in (*layer.inputs, *layer.outputs):
            if name in tensors and name not in io:
                report.internal_rw += int(tensors[name].size or 0)
                report.sram_hit_rw += hit(name)
    return report
