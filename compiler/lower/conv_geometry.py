"""Convolution facts shared by lowering, the memory plan and the tests.

- **Kernels per pass** (the output channels the DPU writes at once): int8 32 = the array's
  ATOM_K (platform ``atom_k``; rknpu-isa.md 6), 16 for 16-bit types ("16 kernels per group",
  rknpu-isa.md 3 CONV_CON2); depthwise: the platform's depthwise channel alignment, 64 int8 /
  32 fp16 (hardware.md 3). The DPU processes and writes the output channels rounded up to
  this (tasks.csv DATA_CUBE_CHANNEL: 1000 -> 1024, depthwise 32 -> 64), so an output tensor
  must be allocated with that many channels. Fewer than 32 int8 channels too: the vendor
  writes 16 as 32 (all 265 corpus tasks with Cout % 32 != 0, and mobilenet_v2 conv_18, the
  layer of calibration row A5; LOWERING.md 15).
- **Surfaces per pass** = kernels per pass x output element bytes / 16: 2 for int8 conv, 4 for
  int8 depthwise. BS_OW_CFG SIZE_E = this - 1 and SURFACE_ADD = this x the surface stride
  (rknpu-isa.md 4: SIZE_E 1 / x2 for int8, 3 / x4 depthwise; MTX int8 -> int32: 7 / x8,
  fp16 -> fp32: 3 / x4 - all fit this rule [I]).
- **FEATURE_GRAINS** (rows the CNA buffers before the CSC starts, CONV_CON2) is a fitted
  approximation [I]: ``min(rows + pad_top + kernel, max(ceil(1024 / entries) + 1,
  6 + 2 * kernel + 3 * (stride - 1)))`` for unpacked input and the task's rows for a packed
  image. It reproduces 14 of the 15 distinct rep-listing tasks (rep02 gets 29, RKNN 28) but
  only 143 of the corpus's 296 full conv tasks; it only sets when computing starts, not what
  is computed.
"""

from __future__ import annotations

from npuemu.isa.tensor_layout import ATOM_BYTES
from npuemu.platforms.model import Platform

from .layers import ConvLayer
from .placement import PLATFORM_DTYPE, ELEMENT_BYTES
from .tiling import entries_per_row


def kernels_per_pass(layer: ConvLayer, platform: Platform) -> int:
    dtype = PLATFORM_DTYPE[layer.dtype]
    if layer.depthwise:
        return platform.alignment(dtype).depthwise
    return platform.atom_k(dtype)


def output_channel_align(layer: ConvLayer, platform: Platform) -> int:
    """Round the output channels up to this when allocating the output tensor."""
    return kernels_per_pass(layer, platform)


def surfaces_per_pass(layer: ConvLayer, platform: Platform) -> int:
    """Output surfaces one MAC pass writes, in the written element: an int32 output makes
    SIZE_E 7, an fp32 one 3 (MTX, rknpu-isa.md 4)."""
    return max(1, kernels_per_pass(layer, platform) * ELEMENT_BYTES[layer.output_dtype] // ATOM_BYTES)


FEATURE_GRAINS_MAX = (1 << 10) - 1  # CONV_CON2.FEATURE_GRAINS[13:4]


def feature_grains(rows: int, pad_top: int, kernel_h: int, stride_y: int, entries: int, packed: bool) -> int:
    """CONV_CON2.FEATURE_GRAINS (fitted, see the module docstring); clamped to the 10-bit
    field, since it is a start threshold and never needs more rows than a task has [I]."""
    if packed:
        return min(rows, FEATURE_GRAINS_MAX)
    threshold = max(-(-1024 // entries) + 1, 6 + 2 * kernel_h + 3 * (stride_y - 1))
    return min(rows + pad_top + kernel_h, threshold, FEATURE_GRAINS_MAX)


def data_entries(width: int, channel_bytes: int) -> int:
    """CBUF_CON1.DATA_ENTRIES of unpacked input: 64-byte entries per row (tiling.py)."""
    return entries_per_row(width, channel_bytes)


def pad_value(zero_point: int, depthwise: bool) -> int:
    """CNA PAD_CON1: the input zero point; depthwise layers repeat it in two bytes (VC 4.3:
    0x0303 for zp 3, rep05: -1 for zp -1)."""
    return (zero_point << 8) | (zero_point & 0xFF) if depthwise else zero_point
