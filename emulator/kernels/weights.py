"""The CNA's weight layouts: packed DRAM blob <-> plain [OC][IC][KH][KW] array.

int8 convolution weights are blocks ``[OC/32][IC/32][KH][KW][32 oc][32 ic]`` (rknpu-isa.md 4,
Mesa COEFS; confirmed by the vendor's native shapes, vendor-corpus 5). Partial groups are
stored as smaller blocks in place: the last output group holds OC mod 32 kernels rounded up to
even, the last input group IC mod 32 channels after IC is rounded up to 16 (vendor-corpus
layers.csv: e.g. (48,48,1,1) -> 32x32, 32x16, 16x32, 16x16 blocks, 2304 bytes; (1,24,5,5) ->
2x32). Each output group's bytes are contiguous, full input groups first (NUMERICS.md 8.2).
Depthwise weights are ``[1][C/64][KH][KW][1][64]`` plus a tail group of C mod 64 channels
rounded up to 16 (vendor-corpus 5). fp16 layouts are documented choices (NUMERICS.md 8.3).

fp16 weights travel as their uint16 bits (Numba has no float16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from npuemu.isa.errors import EmulationError


def _align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class ConvWeightLayout:
    """Block geometry of a direct-convolution weight blob (units: elements)."""

    oc_block: int  # kernels per output group
    ic_block: int  # input channels per input group
    ic_align: int  # IC is rounded up to this before grouping
    oc_align: int  # the partial last output group is rounded up to this

    def stored_input_channels(self, in_channels: int) -> int:
        return _align(in_channels, self.ic_align)

    def stored_kernels(self, out_channels: int) -> int:
        full, rest = divmod(out_channels, self.oc_block)
        return full * self.oc_block + (_align(rest, self.oc_align) if rest else 0)

    def elements(self, out_channels: int, in_channels: int, kernel_h: int, kernel_w: int) -> int:
        return (self.stored_kernels(out_channels) * self.stored_input_channels(in_channels)
                * kernel_h * kernel_w)


@dataclass(frozen=True)
class DepthwiseWeightLayout:
    """Block geometry of a depthwise weight blob (units: elements)."""

    channel_block: int
    channel_align: int  # the partial last group is rounded up to this

    def stored_channels(self, channels: int) -> int:
        full, rest = divmod(channels, self.channel_block)
        return full * self.channel_block + (_align(rest, self.channel_align) if rest else 0)

    def elements(self, channels: int, kernel_h: int, kernel_w: int) -> int:
        return self.stored_channels(channels) * kernel_h * kernel_w


#: RK3588 int8 convolution (rknpu-isa.md 4; vendor-corpus 5 and layers.csv).
INT8_CONV_RK3588 = ConvWeightLayout(oc_block=32, ic_block=32, ic_align=16, oc_align=2)
#: RK3588 fp16 convolution: 16 kernels per group (CONV_CON2 "16 kernels per group for 16-bit
#: types", MTX weight_fp16 [N/16][K/32][16][32]); IC rounded to one 16-byte atom (a choice).
FP16_CONV_RK3588 = ConvWeightLayout(oc_block=16, ic_block=32, ic_align=8, oc_align=2)
#: RK3588 int4 (precision 6): 64 kernels x 32 channels per block (rknpu-isa.md 4, matmul B int4
#: [N/64][K/32][64][32], hardware.md 2); whole blocks only (Matmul N and K are 64- and 32-aligned
#: for int4, table 3-7), a choice where no conv stream shows a partial int4 group.
INT4_CONV_RK3588 = ConvWeightLayout(oc_block=64, ic_block=32, ic_align=32, oc_align=64)
#: RK3566/RK3568 int8: 16 kernels per group (hardware.md 2, matmul B int8 [N/16,K/32,16,32]).
INT8_CONV_RK3566 = ConvWeightLayout(oc_block=16, ic_block=32, ic_align=16, oc_align=2)
#: RK3588 int8 depthwise: 64-channel groups, tail rounded to 16 (vendor-corpus 4.3 and 5).
INT8_DEPTHWISE_RK3588 = DepthwiseWeightLayout(channel_block=64, channel_align=16)
#: RK3588 fp16 depthwise: 32-channel groups (hardware.md 3: depthwise alignment 32 for 16-bit).
FP16_DEPTHWISE_RK3588 = DepthwiseWeightLayout(channel_block=32, channel_align=8)


@njit(cache=True)
def _conv_offset(o, i, ky, kx, kernel_h, kernel_w, oc_stored, ic_stored, oc_block, ic_block):
    group_start = (o // oc_block) * oc_block
    group_size = min(oc_block, oc_stored - group_start)
    input_start = (i // ic_block) * ic_block
    input_size = min(ic_block, ic_stored - input_start)
    taps = kernel_h * kernel_w
    return (group_start * ic_stored * taps + group_size * input_start * taps
            + ((ky * kernel_w + kx) * group_size + (o - group_start)) * input_size
            + (i - input_start))


@njit(cache=True)
def _unpack_conv(blob, weights, oc_stored, ic_stored, oc_block, ic_block):
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    for o in range(out_channels):
        for i in range(in_channels):
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    weights[o, i, ky, kx] = blob[_conv_offset(
                        o, i, ky, kx, kernel_h, kernel_w, oc_stored, ic_stored, oc_block, ic_block)]


@njit(cache=True)
def _pack_conv(weights, input_fill, blob, oc_stored, ic_stored, oc_block, ic_block):
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    for o in range(oc_stored):
        for i in range(ic_stored):
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    offset = _conv_offset(o, i, ky, kx, kernel_h, kernel_w, oc_stored, ic_stored,
                                          oc_block, ic_block)
                    if o >= out_channels:
                        blob[offset] = 0
                    elif i >= in_channels:
                        blob[offset] = input_fill[o]
                    else:
                        blob[offset] = weights[o, i, ky, kx]


@njit(cache=True)
def _depthwise_offset(c, ky, kx, kernel_w, taps, c_stored, c_block):
    group_start = (c // c_block) * c_block
    group_size = min(c_block, c_stored - group_start)
    return group_start * taps + (ky * kernel_w + kx) * group_size + (c - group_start)


@njit(cache=True)
def _unpack_depthwise(blob, weights, c_stored, c_block):
    channels, _, kernel_h, kernel_w = weights.shape
    for c in range(channels):
        for ky in range(kernel_h):
            for kx in range(kernel_w):
                weights[c, 0, ky, kx] = blob[_depthwise_offset(
                    c, ky, kx, kernel_w, kernel_h * kernel_w, c_stored, c_block)]


@njit(cache=True)
def _pack_depthwise(weights, fill, blob, c_stored, c_block):
    channels, _, kernel_h, kernel_w = weights.shape
    for c in range(c_stored):
        for ky in range(kernel_h):
            for kx in range(kernel_w):
                offset = _depthwise_offset(c, ky, kx, kernel_w, kernel_h * kernel_w, c_stored,
                                           c_block)
                blob[offset] = weights[c, 0, ky, kx] if c < channels else fill


def _bits(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    return array.view(np.uint16) if array.dtype == np.float16 else array


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
    weights = np.empty((out_channels, in_channels, kernel_h, kernel_w), dtype=blob.dtype)
    _unpack_conv(_bits(blob), _bits(weights), layout.stored_kernels(out_channels),
                 layout.stored_input_channels(in_channels), layout.oc_block, layout.ic_block)
    return weights


def pack_conv_weights(weights: np.ndarray, layout: ConvWeightLayout = INT8_CONV_RK3588,
                      input_fill: np.ndarray | int | float = 0) -> np.ndarray:
    """[OC][IC][KH][KW] -> packed blob. Padded input channels hold ``input_fill`` (a scalar or
    one value per output channel: the vendor uses the weight zero point); padded kernels 0."""
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    _check_geometry(out_channels=out_channels, in_channels=in_channels, kernel_h=kernel_h,
                    kernel_w=kernel_w)
    fill = np.ascontiguousarray(np.broadcast_to(np.asarray(input_fill, dtype=weights.dtype),
                                                (out_channels,)))
    blob = np.empty(layout.elements(out_channels, in_channels, kernel_h, kernel_w), weights.dtype)
    _pack_conv(_bits(weights), _bits(fill), _bits(blob), layout.stored_kernels(out_channels),
               layout.stored_input_channels(in_channels), layout.oc_block, layout.ic_block)
    return blob


def unpack_depthwise_weights(blob: np.ndarray, channels: int, kernel_h: int, kernel_w: int,
                             layout: DepthwiseWeightLayout = INT8_DEPTHWISE_RK3588) -> np.ndarray:
    """Packed depthwise blob -> [C][1][KH][KW]."""
    _check_geometry(channels=channels, kernel_h=kernel_h, kernel_w=kernel_w)
    blob = _check_blob(blob, layout.elements(channels, kernel_h, kernel_w),
                       f"a {channels}-channel {kernel_h}x{kernel_w} depthwise conv")
    weights = np.empty((channels, 1, kernel_h, kernel_w), dtype=blob.dtype)
    _unpack_depthwise(_bits(blob), _bits(weights), layout.stored_channels(channels),
                      layout.channel_block)
    return weights


def pack_depthwise_weights(weights: np.ndarray,
                           layout: DepthwiseWeightLayout = INT8_DEPTHWISE_RK3588,
                           fill: int | float = 0) -> np.ndarray:
    """[C][1][KH][KW] -> packed depthwise blob; padded channels hold ``fill``."""
    channels, one, kernel_h, kernel_w = weights.shape
    if one != 1:
        raise EmulationError(f"depthwise weights must be [C][1][KH][KW], got shape {weights.shape}")
    _check_geometry(channels=channels, kernel_h=kernel_h, kernel_w=kernel_w)
    blob = np.empty(layout.elements(channels, kernel_h, kernel_w), weights.dtype)
    fill_bits = _bits(np.asarray([fill], dtype=weights.dtype))[0]
    _pack_depthwise(_bits(weights), fill_bits, _bits(blob), layout.stored_channels(channels),
                    layout.channel_block)
    return blob


def unpack_int4_bytes(raw: np.ndarray, high_first: bool) -> np.ndarray:
    """Packed int4 bytes -> one sign-extended value per int8, two per byte in memory order;
    ``high_first``: the even element is the high nibble (weights, REGISTER_SEMANTICS.md 2.7)."""
    raw = np.asarray(raw).view(np.uint8)
    low = (raw & 0xF).astype(np.int8)
    high = (raw >> 4).astype(np.int8)
    pairs = np.stack((high, low) if high_first else (low, high), axis=-1).reshape(raw.shape[:-1] + (-1,))
    return np.where(pairs > 7, pairs - 16, pairs).astype(np.int8)
