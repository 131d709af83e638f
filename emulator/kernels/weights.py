"""The CNA's weight fetch: packed DRAM blob <-> plain [OC][IC][KH][KW] array.

The blob layouts (block geometry and byte order, int4 nibbles) are stated once in
``npuemu.isa.weight_layout``, which the compiler writes with; this module adds the
emulator's checks (EmulationError for a blob or geometry a task cannot have) and keeps the
RK3588-named layouts the units and tests use. The packers are for tests and tools.
"""

from __future__ import annotations

import numpy as np

from npuemu.isa import weight_layout as isa_layout
from npuemu.isa.errors import EmulationError
from npuemu.isa.weight_layout import ConvWeightLayout, DepthwiseWeightLayout

__all__ = [
    "FP16_CONV_RK3588", "FP16_DEPTHWISE_RK3588", "INT4_CONV_RK3588", "INT8_CONV_RK3566", "INT8_CONV_RK3588",
    "INT8_DEPTHWISE_RK3588", "ConvWeightLayout", "DepthwiseWeightLayout", "pack_conv_weights",
    "pack_depthwise_weights", "unpack_conv_weights", "unpack_depthwise_weights", "unpack_int4_bytes",
]

INT8_CONV_RK3588 = isa_layout.INT8_CONV
FP16_CONV_RK3588 = isa_layout.FP16_CONV
INT4_CONV_RK3588 = isa_layout.INT4_CONV
INT8_CONV_RK3566 = isa_layout.INT8_CONV_RK3566
INT8_DEPTHWISE_RK3588 = isa_layout.INT8_DEPTHWISE
FP16_DEPTHWISE_RK3588 = isa_layout.FP16_DEPTHWISE

#: Packed int4 bytes -> one sign-extended value per int8 (isa.weight_layout.unpack_int4)
unpack_int4_bytes = isa_layout.unpack_int4


def _check_blob(blob: np.ndarray, needed: int, what: str) -> np.ndarray:
    blob = np.ascontiguousarray(blob).reshape(-1)
    if blob.size < needed:
        raise EmulationError(
            f"{what} needs {needed} weight elements but the blob holds {blob.size}")
    return blob


def _check_geometry(**dims: int) -> None:
    bad = {name: value for name, value in dims.items() if value <= 0}
    if bad:
        raise EmulationError(f"weight dimensions must be positive, got {bad}")


def unpack_conv_weights(blob: np.ndarray, out_channels: int, in_channels: int, kernel_h: int,
                        kernel_w: int, layout: ConvWeightLayout = INT8_CONV_RK3588) -> np.ndarray:
    """The CNA's weight fetch: packed blob -> [OC][IC][KH][KW] (same dtype as ``blob``)."""
    _check_geometry(out_channels=out_channels, in_channels=in_channels, kernel_h=kernel_h,
                    kernel_w=kernel_w)
    needed = layout.elements(out_channels, in_channels, kernel_h, kernel_w)
    blob = _check_blob(blob, needed, f"a {out_channels}x{in_channels}x{kernel_h}x{kernel_w} conv")
    return isa_layout.unpack_conv_weights(blob[:needed], out_channels, in_channels, kernel_h, kernel_w, layout)


def pack_conv_weights(weights: np.ndarray, layout: ConvWeightLayout = INT8_CONV_RK3588,
                      input_fill: np.ndarray | int | float = 0) -> np.ndarray:
    """[OC][IC][KH][KW] -> packed blob (isa.weight_layout.pack_conv_weights, checked)."""
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    _check_geometry(out_channels=out_channels, in_channels=in_channels, kernel_h=kernel_h,
                    kernel_w=kernel_w)
    return isa_layout.pack_conv_weights(weights, layout, input_fill)


def unpack_depthwise_weights(blob: np.ndarray, channels: int, kernel_h: int, kernel_w: int,
                             layout: DepthwiseWeightLayout = INT8_DEPTHWISE_RK3588) -> np.ndarray:
    """Packed depthwise blob -> [C][1][KH][KW]."""
    _check_geometry(channels=channels, kernel_h=kernel_h, kernel_w=kernel_w)
    needed = layout.elements(channels, kernel_h, kernel_w)
    blob = _check_blob(blob, needed, f"a {channels}-channel {kernel_h}x{kernel_w} depthwise conv")
    return isa_layout.unpack_depthwise_weights(blob[:needed], channels, kernel_h, kernel_w, layout)


def pack_depthwise_weights(weights: np.ndarray,
                           layout: DepthwiseWeightLayout = INT8_DEPTHWISE_RK3588,
                           fill: int | float = 0) -> np.ndarray:
    """[C][1][KH][KW] -> packed depthwise blob; padded channels hold ``fill``."""
    channels, one, kernel_h, kernel_w = weights.shape
    if one != 1:
        raise EmulationError(f"depthwise weights must be [C][1][KH][KW], got shape {weights.shape}")
    _check_geometry(channels=channels, kernel_h=kernel_h, kernel_w=kernel_w)
    return isa_layout.pack_depthwise_weights(weights, layout, fill)
