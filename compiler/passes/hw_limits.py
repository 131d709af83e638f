"""The hardware limits the passes and the partition respect, for one target platform.

Field limits come from the chip's register map (the widths of the CNA/DPU/PPU fields that
will hold the value; rknpu-isa.md §7 item 5), buffer sizes from the platform YAML. Nothing
here is a hard-coded chip figure: a user platform YAML with another register map gets its
own limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import Platform

#: (attribute, block, register, field, offset): the largest value a layer may use is the
#: field's maximum plus ``offset`` (PPU kernel and stride fields hold value - 1).
_FIELDS = (
    ("max_kernel", "CNA", "WEIGHT_SIZE2", "WEIGHT_WIDTH", 0),
    ("max_stride", "CNA", "CONV_CON3", "CONV_X_STRIDE", 0),
    ("max_deconv_stride", "CNA", "CONV_CON3", "DECONV_X_STRIDE", 0),
    ("max_dilation", "CNA", "CONV_CON3", "ATROUS_X_DILATION", 0),
    ("max_pad", "CNA", "PAD_CON0", "PAD_TOP", 0),
    ("max_input_width", "CNA", "DATA_SIZE0", "DATAIN_WIDTH", 0),
    ("max_output_width", "CNA", "DATA_SIZE2", "DATAOUT_WIDTH", 0),
    ("max_kernels", "CNA", "WEIGHT_SIZE2", "WEIGHT_KERNELS", 0),
    ("max_input_channels", "CNA", "DATA_SIZE1", "DATAIN_CHANNEL", 0),
    ("max_cube_channels", "DPU", "DATA_CUBE_CHANNEL", "CHANNEL", 1),
    ("max_cube_width", "DPU", "DATA_CUBE_WIDTH", "WIDTH", 1),
    ("max_pool_kernel", "PPU", "POOLING_KERNEL_CFG", "KERNEL_WIDTH", 1),
    ("max_pool_stride", "PPU", "POOLING_KERNEL_CFG", "KERNEL_STRIDE_WIDTH", 1),
    ("max_pool_pad", "PPU", "POOLING_PADDING_CFG", "PAD_LEFT", 0),
)


@dataclass(frozen=True)
class NpuLimits:
    """Largest values one NPU layer may use on a chip, and its CBUF and native layout."""

    chip: str
    max_kernel: int
    max_stride: int
    max_deconv_stride: int
    max_dilation: int
    max_pad: int
    max_input_width: int
    max_output_width: int
    max_kernels: int
    max_input_channels: int
    max_cube_channels: int
    max_cube_width: int
    max_pool_kernel: int
    max_pool_stride: int
    max_pool_pad: int
    cbuf_banks: int
    cbuf_bank_bytes: int
    c2_int8: int
    source: str

    def as_dict(self) -> dict[str, int | str]:
        return dict(self.__dict__)


def npu_limits(platform: Platform) -> NpuLimits:
    """The limits of ``platform`` (register map named by its ``register_map.family``)."""
    regmap = load_regmap(platform.register_map.family)
    values = {name: regmap.register(block, register).field(field).maximum + offset
              for name, block, register, field, offset in _FIELDS}
    return NpuLimits(chip=platform.name, cbuf_banks=platform.cbuf.banks, cbuf_bank_bytes=platform.cbuf.bank_bytes,
                     c2_int8=platform.c2("int8"), source=f"register map {platform.register_map.family}", **values)
