"""Packing register writes with limit checks that speak about the layer.

Emission builds each register from named field values; :class:`RegisterBuilder` checks every
value against the field's width in the register map *before* packing, so a value that does
not fit raises :class:`CompileError` naming the layer, the quantity, the register field and
its limit, e.g. ``layer conv3: input width 4096 exceeds CNA DATA_SIZE0.DATAIN_WIDTH (11 bits,
max 2047)``. Fields that hold "value - 1" report the real quantity and limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npuemu.isa.errors import CompileError, EncodingError
from npuemu.isa.regmap import REGISTER_MASK, RegisterMap
from npuemu.isa.task import RegisterWrite

#: Human names of the fields whose overflow a user can cause, and whether they hold value - 1.
FIELD_MEANING: dict[tuple[str, str], tuple[str, int]] = {
    ("CNA", "DATAIN_WIDTH"): ("input width", 0),
    ("CNA", "DATAIN_HEIGHT"): ("input rows of a task", 0),
    ("CNA", "DATAIN_CHANNEL"): ("input channels", 0),
    ("CNA", "DATAOUT_WIDTH"): ("output width", 0),
    ("CNA", "DATAOUT_ATOMICS"): ("output pixels of a task", 0),
    ("CNA", "DMA_WIDTH"): ("input width", 0),
    ("CNA", "DMA_HEIGHT"): ("input rows of a task", 0),
    ("CNA", "DMA_CHANNEL"): ("input channels", 0),
    ("CNA", "WEIGHT_WIDTH"): ("kernel width", 0),
    ("CNA", "WEIGHT_HEIGHT"): ("kernel height", 0),
    ("CNA", "WEIGHT_KERNELS"): ("output channels (kernels)", 0),
    ("CNA", "WEIGHT_BYTES_PER_KERNEL"): ("weight bytes per kernel", 0),
    ("CNA", "CONV_X_STRIDE"): ("horizontal stride", 0),
    ("CNA", "CONV_Y_STRIDE"): ("vertical stride", 0),
    ("CNA", "ATROUS_X_DILATION"): ("horizontal dilation", 1),
    ("CNA", "ATROUS_Y_DILATION"): ("vertical dilation", 1),
    ("CNA", "PAD_TOP"): ("top padding", 0),
    ("CNA", "PAD_LEFT"): ("left padding", 0),
    ("CNA", "FEATURE_GRAINS"): ("feature grains", 0),
    ("CORE", "DATAOUT_WIDTH"): ("output width", 1),
    ("CORE", "DATAOUT_HEIGHT"): ("output rows of a task", 1),
    ("CORE", "DATAOUT_CHANNEL"): ("output channels", 1),
    ("DPU", "WIDTH"): ("output width", 1),
    ("DPU", "HEIGHT"): ("output rows of a task", 1),
    ("DPU", "CHANNEL"): ("output channels", 1),
    ("DPU", "ORIG_CHANNEL"): ("output channels", 1),
    ("DPU", "CHANNEL_WDMA"): ("output channels", 1),
    ("DPU", "WIDTH_WDMA"): ("output width", 1),
    ("DPU", "HEIGHT_WDMA"): ("output rows of a task", 1),
    ("DPU", "OUT_CVT_SHIFT"): ("output requantization shift", 0),
    ("DPU", "EW_OP_CVT_SHIFT"): ("operand converter shift", 0),
    ("DPU_RDMA", "WIDTH"): ("output width", 1),
    ("DPU_RDMA", "HEIGHT"): ("output rows of a task", 1),
    ("DPU_RDMA", "CHANNEL"): ("output channels", 1),
    ("PPU", "CUBE_IN_WIDTH"): ("input width", 1),
    ("PPU", "CUBE_IN_HEIGHT"): ("input height", 1),
    ("PPU", "CUBE_IN_CHANNEL"): ("channels", 1),
    ("PPU", "CUBE_OUT_WIDTH"): ("output width", 1),
    ("PPU", "CUBE_OUT_HEIGHT"): ("output height", 1),
    ("PPU", "CUBE_OUT_CHANNEL"): ("channels", 1),
    ("PPU", "KERNEL_WIDTH"): ("pool kernel width", 1),
    ("PPU", "KERNEL_HEIGHT"): ("pool kernel height", 1),
    ("PPU", "KERNEL_STRIDE_WIDTH"): ("pool stride", 1),
    ("PPU", "KERNEL_STRIDE_HEIGHT"): ("pool stride", 1),
    ("PPU", "PAD_TOP"): ("pool top padding", 0),
    ("PPU", "PAD_LEFT"): ("pool left padding", 0),
    ("PPU", "PAD_BOTTOM"): ("pool bottom padding", 0),
    ("PPU", "PAD_RIGHT"): ("pool right padding", 0),
}


@dataclass
class RegisterBuilder:
    """Collects one task's register writes in order, checking every field against the map."""

    regmap: RegisterMap
    layer: str
    writes: list[RegisterWrite] = field(default_factory=list)

    def write(self, block: str, register: str, raw: int = 0, /, **fields: int) -> None:
        """Append ``block.register`` = ``raw`` with ``fields`` packed over it."""
        reg = self.regmap.register(block, register)
        try:  # Register.pack range-checks ``raw`` and every field: what it accepts, _refuse accepts
            value = reg.pack(fields, base=raw)
        except EncodingError as error:
            refusal = error
        else:
            self.writes.append(RegisterWrite(block, register, value))
            return
        self._refuse(reg, block, register, raw, fields, refusal)  # (outside the handler: no chained error)

    def _refuse(self, reg, block: str, register: str, raw, fields: dict, error: EncodingError) -> None:
        """The error of a write ``Register.pack`` refused: the first field out of its range, named
        for the layer (_check), else the raw value, else pack's own message with the layer's name.
        (Checked only after a refusal: ~80,000 writes a PP-OCRv4 rec build, issue 20.)"""
        for name, value in fields.items():
            self._check(block, register, reg.field(name), value)
        if not 0 <= raw <= REGISTER_MASK:
            raise CompileError(f"layer {self.layer}: {reg.qualified_name} raw value {raw:#x} is not 32-bit")
        raise CompileError(f"layer {self.layer}: {error}") from None

    def has(self, block: str, register: str) -> bool:
        """Whether the map has the register (a partial map, e.g. rk3576, lacks some)."""
        return self.regmap.block(block).has(register)

    def _check(self, block: str, register: str, fld, value: int) -> None:
        if fld.minimum <= value <= fld.maximum:
            return
        meaning, minus_one = FIELD_MEANING.get((block, fld.name), (f"value for {fld.name}", 0))
        kind = "signed " if fld.signed else ""
        limit = fld.maximum + minus_one
        shown = value + minus_one
        relation = "exceeds" if value > fld.maximum else "is below"
        bound = f"max {limit}" if value > fld.maximum else f"min {fld.minimum + minus_one}"
        raise CompileError(
            f"layer {self.layer}: {meaning} {shown} {relation} {block} {register}.{fld.name} "
            f"({fld.width} {kind}bits, {bound})"
        )

    def done(self) -> tuple[RegisterWrite, ...]:
        return tuple(self.writes)


def signed32(value: int) -> int:
    """A signed 32-bit value as the raw register bits."""
    if not -(1 << 31) <= value < (1 << 31):
        raise CompileError(f"value {value} does not fit 32 signed bits")
    return value & REGISTER_MASK
