"""Pooling layers -> one PPU task (rep07 max k3s2p1, rep08 avg k2s2).

- Kernel and stride registers hold size - 1; average pooling's RECIP_KERNEL_WIDTH/HEIGHT
  = round(2^16 / k) (32768 for k = 2, VC 4.3), in fp16 the fp16 bits of 2^16 / k (0x7555 for
  k = 3; quant_regs.pool_reciprocal, NUMERICS.md 38); max pooling writes 0 there.
- Pads: all four, each the padding the output size actually needs (rep07, 112 -> 56 with
  k3s2p1: top/left 1, bottom/right 0; tasks.csv k3s1p1: all 1). The pad value is the zero
  point for average pooling (rep08) and 0 for max pooling (rep07; NUMERICS.md 6: max skips
  padding).
- **No W split** [C]. RKNN splits overlapping-window pools wider than 28 x stride output
  columns into W slices (tasks.csv maxpool_007/010/011/013), but the PPU has no output
  line-stride register we know of, so a slice's output lines could not be placed a full row
  apart (emulator/REGISTER_SEMANTICS.md 4 writes lines OW atoms apart). One task per layer is
  exact under that model; revisit if a width limit of the PPU turns up.
"""

from __future__ import annotations

from collections.abc import Mapping

from npuemu.platforms.model import Platform

from ..quant_regs import pool_reciprocal
from .descriptions import PPU_IN_PRECISION, PRECISION_CODES, PpuTask
from .layers import PoolLayer
from .lookup import unpacked_pair
from .placement import Placement

POOL_AVERAGE, POOL_MAX = 0, 1


def needed_pad(out_size: int, kernel: int, stride: int, size: int, pad_before: int) -> int:
    """Padding after the input that the output size actually reaches."""
    return max(0, (out_size - 1) * stride + kernel - size - pad_before)


def lower_pool(layer: PoolLayer, placements: Mapping[str, Placement], platform: Platform) -> tuple[PpuTask, ...]:
    inp, out = unpacked_pair(layer, placements, "pooling")
    channels, height, width = layer.input_shape
    _, out_height, out_width = layer.output_shape
    (kernel_h, kernel_w), (stride_y, stride_x) = layer.kernel, layer.stride
    top, left, _, _ = layer.pads
    average = layer.method == "avg"
    return (PpuTask(
        layer=layer.name, method=POOL_AVERAGE if average else POOL_MAX, in_width=width, in_height=height,
        channels=channels, out_width=out_width, out_height=out_height, kernel=(kernel_w, kernel_h),
        stride=(stride_x, stride_y),
        pads=(top, left, needed_pad(out_height, kernel_h, stride_y, height, top),
              needed_pad(out_width, kernel_w, stride_x, width, left)),
        pad_value=layer.quant.zero_point if (average and layer.quant is not None) else 0,
        recip=(pool_reciprocal(kernel_w, layer.dtype), pool_reciprocal(kernel_h, layer.dtype)) if average else (0, 0),
        source_address=inp.address, source_line_stride=inp.line_stride_atoms,
        source_surface_stride=inp.surface_stride_atoms, dst_address=out.address,
        dst_surface_stride=out.surface_stride_atoms, precision=PRECISION_CODES[layer.dtype],
        in_precision=PPU_IN_PRECISION[layer.dtype]),)
