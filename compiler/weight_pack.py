"""Constant blobs the CNA and the BRDMA read: packed weights and the per-channel BS operands.

**Convolution weights** (int8): blocks ``[OC/32][IC/32][KH][KW][32 oc][32 ic]`` (rknpu-isa.md 4,
Mesa COEFS; vendor native shapes, VC 5). IC is rounded up to 16 and split into groups of 32
(the last may hold 16); OC is split into groups of 32, the last holding ``OC mod 32`` kernels
rounded up to even. Each output group is contiguous, its full input groups first, each block
``[KH][KW][kernels][channels]`` - the layout ``emulator/kernels/weights.py`` reads
(NUMERICS.md 8.2); for the vendor's own shapes it is byte-identical to its "main block + tail
block" listing (FC 1000: ``[31,16,1,1,32,32] + [1,16,1,1,8,32]``, 512000 bytes). Padded input
channels hold the output channel's weight zero point (so the MAC and CPEND terms cancel there,
NUMERICS.md 3.1), padded kernels 0.

**Depthwise weights** (int8): ``[1][C/64][KH][KW][1][64]`` plus a tail group of ``C mod 64``
channels rounded up to 16 (VC 5: 16 channels -> ``1x0x3x3x1x64 + 1x1x3x3x1x16``); padded
channels 0.

**float16** [C] (NUMERICS.md 8.3, matching the emulator's FP16_CONV_RK3588 and
FP16_DEPTHWISE_RK3588): conv ``[OC/16][IC/32][KH][KW][16][32]`` with IC rounded to 8 and a
partial output group rounded to even; depthwise groups of 32, tail rounded to 8; padding 0.

**BS operand blob** ("bias", VC 5): for every 8 output channels one 64-byte group of
``int32 ALU[8]``, ``int16 CPEND[8]``, ``int16 MUL[8]`` (little-endian), covering the channels
the DPU writes (OC rounded up to 32, depthwise to 64: 256 bytes for 32 channels, 8192 for
1000). For float16 layers [C]: the same groups with the fp32 bias bits in the ALU slot and
zeros elsewhere (MUL and CPEND are bypassed on the fp16 path).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError

BS_GROUP_CHANNELS = 8
BS_GROUP_BYTES = 64


def _align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class ConvBlocking:
    """Block geometry of a direct-convolution weight blob (units: elements)."""

    oc_block: int
    ic_block: int
    ic_align: int
    oc_align: int

    def stored_kernels(self, out_channels: int) -> int:
        full, rest = divmod(out_channels, self.oc_block)
        return full * self.oc_block + (_align(rest, self.oc_align) if rest else 0)

    def stored_channels(self, in_channels: int) -> int:
        return _align(in_channels, self.ic_align)


@dataclass(frozen=True)
class DepthwiseBlocking:
    channel_block: int
    channel_align: int

    def stored_channels(self, channels: int) -> int:
        full, rest = divmod(channels, self.channel_block)
        return full * self.channel_block + (_align(rest, self.channel_align) if rest else 0)


INT8_CONV = ConvBlocking(oc_block=32, ic_block=32, ic_align=16, oc_align=2)
FP16_CONV = ConvBlocking(oc_block=16, ic_block=32, ic_align=8, oc_align=2)
#: int4 (RK3588 precision 6): 64 kernels x 32 channels per block, whole blocks (the Matmul API's
#: N and K are 64- and 32-aligned for int4, table 3-7; rknpu-isa.md 4 [N/64][K/32][64][32])
INT4_CONV = ConvBlocking(oc_block=64, ic_block=32, ic_align=32, oc_align=64)
INT8_DEPTHWISE = DepthwiseBlocking(channel_block=64, channel_align=16)
FP16_DEPTHWISE = DepthwiseBlocking(channel_block=32, channel_align=8)


def conv_blocking(dtype: str, kernels_per_pass: int | None = None) -> ConvBlocking:
    """The weight blocking of a direct conv. ``kernels_per_pass``: the chip's MAC-array kernel
    group (Platform.atom_k) when it differs from RK3588's (32 int8, 16 fp16). RK3588's groups
    are the vendor's (VC 5); on 16- and 8-kernel chips (RK3562, RK356x, RV1106) the blob keeps
    RK3588's order with output groups of that size [C] - RK356x's matmul B layout
    [N/16][K/32][16][32] (hardware.md 2) has the same shape; the emulator reads the same."""
    base = FP16_CONV if dtype == "float16" else INT8_CONV
    if kernels_per_pass is None or kernels_per_pass == base.oc_block:
        return base
    return ConvBlocking(oc_block=kernels_per_pass, ic_block=base.ic_block, ic_align=base.ic_align,
                        oc_align=min(base.oc_align, kernels_per_pass))


def depthwise_blocking(dtype: str) -> DepthwiseBlocking:
    return FP16_DEPTHWISE if dtype == "float16" else INT8_DEPTHWISE


def pack_conv_weights(weights: np.ndarray, input_fill: np.ndarray | int = 0,
                      blocking: ConvBlocking = INT8_CONV) -> np.ndarray:
    """[OC][IC][KH][KW] -> the flat blob (same dtype); padded input channels hold
    ``input_fill`` (per output channel: the weight zero points), padded kernels 0."""
    weights = np.asarray(weights)
    if weights.ndim != 4:
        raise CompileError(f"conv weights must be [OC][IC][KH][KW], got shape {weights.shape}")
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    oc_stored, ic_stored = blocking.stored_kernels(out_channels), blocking.stored_channels(in_channels)
    padded = np.zeros((oc_stored, ic_stored, kernel_h, kernel_w), dtype=weights.dtype)
    padded[:out_channels, :in_channels] = weights
    fill = np.broadcast_to(np.asarray(input_fill, dtype=weights.dtype), (out_channels,))
    padded[:out_channels, in_channels:] = fill[:, None, None, None]
    chunks = []
    for o in range(0, oc_stored, blocking.oc_block):
        group = padded[o:o + blocking.oc_block]
        for i in range(0, ic_stored, blocking.ic_block):
            chunks.append(group[:, i:i + blocking.ic_block].transpose(2, 3, 0, 1).reshape(-1))
    return np.concatenate(chunks)


def pack_depthwise_weights(weights: np.ndarray, blocking: DepthwiseBlocking = INT8_DEPTHWISE) -> np.ndarray:
    """[C][1][KH][KW] -> the flat depthwise blob; padded channels 0."""
    weights = np.asarray(weights)
    if weights.ndim != 4 or weights.shape[1] != 1:
        raise CompileError(f"depthwise weights must be [C][1][KH][KW], got shape {weights.shape}")
    channels, _, kernel_h, kernel_w = weights.shape
    padded = np.zeros((blocking.stored_channels(channels), kernel_h, kernel_w), dtype=weights.dtype)
    padded[:channels] = weights[:, 0]
    return np.concatenate([padded[c:c + blocking.channel_block].transpose(1, 2, 0).reshape(-1)
                           for c in range(0, padded.shape[0], blocking.channel_block)])


def conv_native_shapes(out_channels: int, in_channels: int, kernel_h: int, kernel_w: int,
                       blocking: ConvBlocking = INT8_CONV) -> tuple[tuple[int, ...], ...]:
    """The vendor's 6-D block shapes of a conv blob (VC 5, layers.csv ``w_native``): a partial
    input group or a partial output group is listed as its own block, e.g. (128, 48, 7, 7) ->
    ``4x1x7x7x32x32 + 4x1x7x7x32x16``, (1000, 512) -> ``31x16x1x1x32x32 + 1x16x1x1x8x32``.
    They describe sizes; the byte order is the per-output-group order of the module docstring."""
    full_oc, rest_oc = divmod(out_channels, blocking.oc_block)
    full_ic, rest_ic = divmod(blocking.stored_channels(in_channels), blocking.ic_block)
    oc_parts = ([(full_oc, blocking.oc_block)] if full_oc else []) + \
        ([(1, _align(rest_oc, blocking.oc_align))] if rest_oc else [])
    ic_parts = ([(full_ic, blocking.ic_block)] if full_ic else []) + ([(1, rest_ic)] if rest_ic else [])
    if len(ic_parts) == 2 and len(oc_parts) == 1:
        count, size = oc_parts[0]
        return tuple((count, groups, kernel_h, kernel_w, size, width) for groups, width in ic_parts)
    ic_groups, ic_width = sum(g for g, _ in ic_parts), ic_parts[0][1]
    if len(ic_parts) == 1:
        return tuple((count, ic_groups, kernel_h, kernel_w, size, ic_width) for count, size in oc_parts)
    return tuple((count, groups, kernel_h, kernel_w, size, width)
                 for count, size in oc_parts for groups, width in ic_parts)


def depthwise_native_shapes(channels: int, kernel_h: int, kernel_w: int,
                            blocking: DepthwiseBlocking = INT8_DEPTHWISE) -> tuple[tuple[int, ...], ...]:
    full, rest = divmod(channels, blocking.channel_block)
    shapes = [(1, full, kernel_h, kernel_w, 1, blocking.channel_block)]
    if rest:
        shapes.append((1, 1, kernel_h, kernel_w, 1, _align(rest, blocking.channel_align)))
    return tuple(shapes)


def bias_blob(alu: np.ndarray, cpend: np.ndarray, mul: np.ndarray, channels: int) -> bytes:
    """The BS operand blob for ``channels`` DPU channels (>= len(alu); padding channels 0)."""
    count = np.asarray(alu).size
    if channels < count:
        raise CompileError(f"bias blob for {channels} channels cannot hold {count} operands")
    groups = -(-channels // BS_GROUP_CHANNELS)
    padded = groups * BS_GROUP_CHANNELS
    operands = np.zeros(groups, dtype=[("alu", "<i4", 8), ("cpend", "<i2", 8), ("mul", "<i2", 8)])
    for name, values, dtype in (("alu", alu, np.int32), ("cpend", cpend, np.int16), ("mul", mul, np.int16)):
        flat = np.zeros(padded, dtype=dtype)
        flat[:count] = np.asarray(values).reshape(-1)
        operands[name] = flat.reshape(groups, BS_GROUP_CHANNELS)
    return operands.tobytes()


def float_bias_blob(bias: np.ndarray | None, out_channels: int, channels: int) -> bytes:
    """float16 layers: only the ALU operand is fetched (BRDMA_DATA_USE 1), so each 8-channel group
    holds 8 fp32 bias bit patterns, 32 bytes [C] (the emulator reads the groups BRDMA_DATA_USE
    selects, REGISTER_SEMANTICS; NUMERICS.md 4.6)."""
    values = np.zeros(out_channels, dtype=np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
    if channels < values.size:
        raise CompileError(f"bias blob for {channels} channels cannot hold {values.size} operands")
    padded = np.zeros(-(-channels // BS_GROUP_CHANNELS) * BS_GROUP_CHANNELS, "<f4")
    padded[:values.size] = values.reshape(-1)
    return padded.tobytes()


FLOAT_BS_CHANNEL_BYTES = 4  # one fp32 ALU operand per channel


def unpack_bias_blob(blob: bytes, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ALU, CPEND, MUL) of the first ``channels`` channels (tests, reports)."""
    groups = -(-channels // BS_GROUP_CHANNELS)
    operands = np.frombuffer(blob, dtype=[("alu", "<i4", 8), ("cpend", "<i2", 8), ("mul", "<i2", 8)], count=groups)
    return tuple(operands[name].reshape(-1)[:channels].copy() for name in ("alu", "cpend", "mul"))  # type: ignore[return-value]
