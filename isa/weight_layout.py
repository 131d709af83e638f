"""The CNA's and BRDMA's constant blobs, stated once: the compiler writes them with these
functions (``compiler/weight_pack.py``) and the emulator reads them back with the same ones
(``emulator/kernels/weights.py``, ``emulator/units``). Pure encoding: blob <-> arrays.

**Convolution weights** are blocks ``[OC/ob][IC/ib][KH][KW][ob oc][ib ic]`` (int8: ob = ib =
32; rknpu-isa.md 4, Mesa COEFS; confirmed by the vendor's native shapes, vendor-corpus 5).
IC is rounded up to ``ic_align`` (float16: its partial group to 1, 2 or 4 atoms, the vendor's
rule, compiler/LOWERING.md 34) and split into groups of ``ib`` (the last may be smaller);
OC is split into groups of ``ob``, the last holding ``OC mod ob`` kernels rounded up to
``oc_align``. Each output group's bytes are contiguous, its input groups in order, each block
``[KH][KW][kernels][channels]`` (NUMERICS.md 8.2): for the vendor's own shapes this is
byte-identical to its "main block + tail block" listing (vendor-corpus layers.csv: FC 1000 x
512 -> ``[31,16,1,1,32,32] + [1,16,1,1,8,32]``, 512000 bytes; (48,48,1,1) -> 32x32, 32x16,
16x32, 16x16 blocks, 2304 bytes).

**Depthwise weights** are ``[1][C/64][KH][KW][1][64]`` plus a tail group of ``C mod 64``
channels rounded up to 16 (int8, vendor-corpus 4.3 and 5: 16 channels ->
``1x0x3x3x1x64 + 1x1x3x3x1x16``).

**float16** convolution follows the vendor's rk3588/rk3576 builds (LOWERING.md 34), fp16
depthwise is a documented choice (NUMERICS.md 8.3), **int4** and the 16- and 8-kernel chips'
groups likewise (REGISTER_SEMANTICS.md 2.5, 2.7): see each layout below.

**int4** elements travel two per byte; which nibble holds the even element differs between
weights (high) and features (low) (REGISTER_SEMANTICS.md 2.7; the Matmul API's reference
code, tools/matmul_layout.py).

**BS operand blob** (BRDMA, vendor-corpus 5): for every 8 output channels one group holding
the operands BRDMA_DATA_USE selects, in the order ``int32 ALU[8]``, ``int16 CPEND[8]``,
``int16 MUL[8]`` (little-endian): 64 bytes with all three (DATA_USE 7, the vendor's), 32
with the ALU alone (DATA_USE 1, Mesa's bias-only blob, rknpu-isa.md 3.1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _atoms_pow2(rest: int, atom: int, block: int) -> int:
    """``rest`` elements rounded up to 1, 2, 4 ... atoms, at most ``block`` (the vendor's partial
    groups, LOWERING.md 34: fp16 17..24 channels store 32)."""
    size = atom
    while size < rest and size < block:
        size *= 2
    return size


# ---------------------------------------------------------------------------------------------
# Convolution and depthwise weight blobs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvWeightLayout:
    """Block geometry of a direct-convolution weight blob (units: elements)."""

    oc_block: int  # kernels per output group
    ic_block: int  # input channels per input group
    ic_align: int  # IC is rounded up to this before grouping (one atom's channels)
    oc_align: int  # the partial last output group is rounded up to this
    #: the partial input group is rounded up to 1, 2, 4 ... atoms (``ic_align``) instead of to
    #: the next atom: the vendor's rk3588/rk3576 fp16 rule (LOWERING.md 34)
    pow2_atoms: bool = False

    def stored_kernels(self, out_channels: int) -> int:
        full, rest = divmod(out_channels, self.oc_block)
        return full * self.oc_block + (_align(rest, self.oc_align) if rest else 0)

    def stored_channels(self, in_channels: int) -> int:
        """Input channels stored per kernel (the name DepthwiseWeightLayout shares, so callers
        size either blob alike)."""
        if not self.pow2_atoms:
            return _align(in_channels, self.ic_align)
        full, rest = divmod(in_channels, self.ic_block)
        return full * self.ic_block + (_atoms_pow2(rest, self.ic_align, self.ic_block) if rest else 0)

    def stored_input_channels(self, in_channels: int) -> int:
        return self.stored_channels(in_channels)

    def elements(self, out_channels: int, in_channels: int, kernel_h: int, kernel_w: int) -> int:
        return (self.stored_kernels(out_channels) * self.stored_channels(in_channels)
                * kernel_h * kernel_w)

    def with_kernel_group(self, kernels: int | None) -> ConvWeightLayout:
        """This layout with output groups of ``kernels`` (the chip's kernels per MAC pass,
        Platform.atom_k) where that differs: RK3588's order with smaller groups on 16- and
        8-kernel chips (RK3562, RK356x, RV1106), a choice [C] (REGISTER_SEMANTICS.md 2.5)
        whose 16-kernel case is RK356x's matmul B layout [N/16][K/32][16][32] (hardware.md 2)."""
        if kernels is None or kernels == self.oc_block:
            return self
        # these chips keep npuemu's own rule (IC to whole atoms, the kernel tail even): no
        # stream of theirs shows the power-of-two one (LOWERING.md 34)
        return ConvWeightLayout(oc_block=kernels, ic_block=self.ic_block, ic_align=self.ic_align,
                                oc_align=min(max(self.oc_align, 2), kernels))


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
INT8_CONV = ConvWeightLayout(oc_block=32, ic_block=32, ic_align=16, oc_align=2)
#: RK3588 fp16 convolution: 16 kernels per group (CONV_CON2 "16 kernels per group for 16-bit
#: types", MTX weight_fp16 [N/16][K/32][16][32], rknpu-isa.md 4); the partial input group
#: rounded up to 1, 2 or 4 atoms of 8 channels and the last output group's kernels unpadded
#: [V: rknn-toolkit2 2.5.0 rk3588 and rk3576 builds, IC 24 -> 960 B per 3x5 kernel, 17 kernels
#: store 17; LOWERING.md 34]. Before LOWERING.md 34: IC to 8 and the tail to even
#: (FP16_CONV_V1, still read by the emulator).
FP16_CONV = ConvWeightLayout(oc_block=16, ic_block=32, ic_align=8, oc_align=1, pow2_atoms=True)
#: npuemu's fp16 conv blocking before LOWERING.md 34 (IC to 8, kernel tail to even) [C]
FP16_CONV_V1 = ConvWeightLayout(oc_block=16, ic_block=32, ic_align=8, oc_align=2)
#: RK3588 int4 (precision 6): 64 kernels x 32 channels per block (rknpu-isa.md 4, matmul B int4
#: [N/64][K/32][64][32], hardware.md 2); whole blocks only (Matmul N and K are 64- and 32-aligned
#: for int4, table 3-7), a choice where no conv stream shows a partial int4 group.
INT4_CONV = ConvWeightLayout(oc_block=64, ic_block=32, ic_align=32, oc_align=64)
#: RK3566/RK3568 int8: 16 kernels per group (hardware.md 2, matmul B int8 [N/16,K/32,16,32]).
INT8_CONV_RK3566 = INT8_CONV.with_kernel_group(16)
#: RK3588 int8 depthwise: 64-channel groups, tail rounded to 16 (vendor-corpus 4.3 and 5).
INT8_DEPTHWISE = DepthwiseWeightLayout(channel_block=64, channel_align=16)
#: RK3588 fp16 depthwise: 32-channel groups (hardware.md 3: depthwise alignment 32 for 16-bit),
#: tail rounded to 8 [C] (NUMERICS.md 8.3).
FP16_DEPTHWISE = DepthwiseWeightLayout(channel_block=32, channel_align=8)


def _group_starts(index: np.ndarray, block: int, stored: int) -> tuple[np.ndarray, np.ndarray]:
    """(first element of each index's group, that group's size): the last group may be short."""
    start = (index // block) * block
    return start, np.minimum(block, stored - start)


def conv_blob_offsets(layout: ConvWeightLayout, out_channels: int, in_channels: int, kernel_h: int,
                      kernel_w: int) -> np.ndarray:
    """Blob position (elements) of every stored weight: int64 [OCs][ICs][KH][KW] over the
    stored (padded) kernels and channels - the byte order of the module docstring."""
    oc_stored, ic_stored = layout.stored_kernels(out_channels), layout.stored_channels(in_channels)
    taps = kernel_h * kernel_w
    o = np.arange(oc_stored, dtype=np.int64).reshape(-1, 1, 1, 1)
    i = np.arange(ic_stored, dtype=np.int64).reshape(1, -1, 1, 1)
    tap = np.arange(taps, dtype=np.int64).reshape(1, 1, kernel_h, kernel_w)
    group, group_size = _group_starts(o, layout.oc_block, oc_stored)
    lane, lane_size = _group_starts(i, layout.ic_block, ic_stored)
    # output group, then input group inside it, then the [KH][KW][kernels][channels] block
    return (group * ic_stored * taps + group_size * lane * taps
            + (tap * group_size + (o - group)) * lane_size + (i - lane))


def depthwise_blob_offsets(layout: DepthwiseWeightLayout, channels: int, kernel_h: int,
                           kernel_w: int) -> np.ndarray:
    """Blob position of every stored depthwise weight: int64 [Cs][KH][KW]."""
    stored = layout.stored_channels(channels)
    c = np.arange(stored, dtype=np.int64).reshape(-1, 1, 1)
    tap = np.arange(kernel_h * kernel_w, dtype=np.int64).reshape(1, kernel_h, kernel_w)
    group, group_size = _group_starts(c, layout.channel_block, stored)
    return group * kernel_h * kernel_w + tap * group_size + (c - group)


def _bits(array: np.ndarray) -> np.ndarray:
    # floats move as same-size unsigned integers, so every bit pattern (NaN payloads) survives
    return array.view(f"u{array.itemsize}") if array.dtype.kind == "f" else array


def pack_conv_weights(weights: np.ndarray, layout: ConvWeightLayout = INT8_CONV,
                      input_fill: np.ndarray | int | float = 0) -> np.ndarray:
    """[OC][IC][KH][KW] -> the flat blob (same dtype). Padded input channels hold
    ``input_fill`` (a scalar or one value per output channel: the vendor uses the weight zero
    point, NUMERICS.md 3.1); padded kernels 0."""
    weights = np.ascontiguousarray(weights)
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    offsets = conv_blob_offsets(layout, out_channels, in_channels, kernel_h, kernel_w)
    stored = np.zeros(offsets.shape, weights.dtype)
    stored[:out_channels, :in_channels] = weights
    fill = np.broadcast_to(np.asarray(input_fill, dtype=weights.dtype), (out_channels,))
    stored[:out_channels, in_channels:] = fill[:, None, None, None]
    blob = np.empty(offsets.size, weights.dtype)
    _bits(blob)[offsets.reshape(-1)] = _bits(stored).reshape(-1)
    return blob


def unpack_conv_weights(blob: np.ndarray, out_channels: int, in_channels: int, kernel_h: int,
                        kernel_w: int, layout: ConvWeightLayout = INT8_CONV) -> np.ndarray:
    """The blob (at least ``layout.elements`` long) -> [OC][IC][KH][KW] (same dtype)."""
    offsets = conv_blob_offsets(layout, out_channels, in_channels, kernel_h, kernel_w)
    flat = np.ascontiguousarray(blob).reshape(-1)
    return _bits(flat)[offsets[:out_channels, :in_channels]].view(flat.dtype)


def pack_depthwise_weights(weights: np.ndarray, layout: DepthwiseWeightLayout = INT8_DEPTHWISE,
                           fill: int | float = 0) -> np.ndarray:
    """[C][1][KH][KW] -> the flat depthwise blob; padded channels hold ``fill``."""
    weights = np.ascontiguousarray(weights)
    channels, _, kernel_h, kernel_w = weights.shape
    offsets = depthwise_blob_offsets(layout, channels, kernel_h, kernel_w)
    stored = np.full(offsets.shape, fill, weights.dtype)
    stored[:channels] = weights[:, 0]
    blob = np.empty(offsets.size, weights.dtype)
    _bits(blob)[offsets.reshape(-1)] = _bits(stored).reshape(-1)
    return blob


def unpack_depthwise_weights(blob: np.ndarray, channels: int, kernel_h: int, kernel_w: int,
                             layout: DepthwiseWeightLayout = INT8_DEPTHWISE) -> np.ndarray:
    """The depthwise blob -> [C][1][KH][KW]."""
    offsets = depthwise_blob_offsets(layout, channels, kernel_h, kernel_w)
    flat = np.ascontiguousarray(blob).reshape(-1)
    return _bits(flat)[offsets[:channels, None]].view(flat.dtype)


def conv_native_shapes(out_channels: int, in_channels: int, kernel_h: int, kernel_w: int,
                       layout: ConvWeightLayout = INT8_CONV) -> tuple[tuple[int, ...], ...]:
    """The vendor's 6-D block shapes of a conv blob (vendor-corpus 5, layers.csv ``w_native``):
    a partial input group or a partial output group is listed as its own block, e.g. (128, 48,
    7, 7) -> ``4x1x7x7x32x32 + 4x1x7x7x32x16``, (1000, 512) -> ``31x16x1x1x32x32 +
    1x16x1x1x8x32``. They describe sizes; the byte order is the module docstring's."""
    full_oc, rest_oc = divmod(out_channels, layout.oc_block)
    full_ic, rest_ic = divmod(layout.stored_channels(in_channels), layout.ic_block)
    oc_parts = ([(full_oc, layout.oc_block)] if full_oc else []) + \
        ([(1, _align(rest_oc, layout.oc_align))] if rest_oc else [])
    ic_parts = ([(full_ic, layout.ic_block)] if full_ic else []) + ([(1, rest_ic)] if rest_ic else [])
    if len(ic_parts) == 2 and len(oc_parts) == 1:
        count, size = oc_parts[0]
        return tuple((count, groups, kernel_h, kernel_w, size, width) for groups, width in ic_parts)
    ic_groups, ic_width = sum(g for g, _ in ic_parts), ic_parts[0][1]
    if len(ic_parts) == 1:
        return tuple((count, ic_groups, kernel_h, kernel_w, size, ic_width) for count, size in oc_parts)
    return tuple((count, groups, kernel_h, kernel_w, size, width)
                 for count, size in oc_parts for groups, width in ic_parts)


def depthwise_native_shapes(channels: int, kernel_h: int, kernel_w: int,
                            layout: DepthwiseWeightLayout = INT8_DEPTHWISE) -> tuple[tuple[int, ...], ...]:
    """The vendor's block shapes of a depthwise blob (vendor-corpus 5): the full groups, then
    the tail group rounded up."""
    full, rest = divmod(channels, layout.channel_block)
    shapes = [(1, full, kernel_h, kernel_w, 1, layout.channel_block)]
    if rest:
        shapes.append((1, 1, kernel_h, kernel_w, 1, _align(rest, layout.channel_align)))
    return tuple(shapes)


# ---------------------------------------------------------------------------------------------
# int4: two elements per byte
# ---------------------------------------------------------------------------------------------
#: Weights put the even element in the high nibble, features in the low one
#: (REGISTER_SEMANTICS.md 2.7, from the Matmul API's reference code for B and A).
WEIGHT_INT4_HIGH_FIRST = True
FEATURE_INT4_HIGH_FIRST = False


def pack_int4(values: np.ndarray, high_first: bool) -> np.ndarray:
    """int4 values (any integer array in [-8, 7], last axis even) -> uint8, two per byte along
    the last axis; ``high_first``: the even element is the high nibble."""
    nibbles = (np.asarray(values).astype(np.int16) & 0xF).astype(np.uint8)
    even, odd = nibbles[..., 0::2], nibbles[..., 1::2]
    return ((even << 4) | odd if high_first else even | (odd << 4)).astype(np.uint8)


def unpack_int4(raw: np.ndarray, high_first: bool) -> np.ndarray:
    """Packed int4 bytes -> one sign-extended value per int8, two per byte in memory order."""
    raw = np.asarray(raw).view(np.uint8)
    low = (raw & 0xF).astype(np.int8)
    high = (raw >> 4).astype(np.int8)
    pairs = np.stack((high, low) if high_first else (low, high), axis=-1).reshape(raw.shape[:-1] + (-1,))
    return np.where(pairs > 7, pairs - 16, pairs).astype(np.int8)


# ---------------------------------------------------------------------------------------------
# BS operand blob (BRDMA)
# ---------------------------------------------------------------------------------------------
BS_GROUP_CHANNELS = 8  # channels per operand group (vendor-corpus 5)
#: BRDMA_DATA_USE bit, name and element type of each operand, in their order inside a group
BS_OPERANDS = ((1, "ALU", np.dtype("<i4")), (2, "CPEND", np.dtype("<i2")), (4, "MUL", np.dtype("<i2")))
BS_USE_ALL = 1 | 2 | 4  # the vendor's integer blob (every conv layer of vendor-corpus 5)
BS_USE_ALU = 1  # fp16 layers: the bias alone, as fp32 bits in the ALU slot [C] (NUMERICS.md 4.6)
BS_USE_TRT = 8  # per-channel truncation: not modelled


def bs_group_dtype(data_use: int) -> np.dtype:
    """One operand group of a blob fetched with BRDMA_DATA_USE = ``data_use``."""
    return np.dtype([(name, dtype, (BS_GROUP_CHANNELS,)) for bit, name, dtype in BS_OPERANDS
                     if data_use & bit])


def bs_groups(channels: int) -> int:
    return -(-channels // BS_GROUP_CHANNELS)


#: bytes of one group of the vendor's integer blob: 64
BS_GROUP_BYTES = bs_group_dtype(BS_USE_ALL).itemsize
