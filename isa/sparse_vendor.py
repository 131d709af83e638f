"""The vendor's RK3576 4:2 sparse weight streams (DCOMP_CTRL.DECOMP_CONTROL 5, 4:2 along input
channels): int8 conv weights [OC][IC][KH][KW] <-> the bytes at DCOMP_ADDR0 and DCOMP_AMOUNT0/1.

Established from rknn-toolkit2 2.5.0's builds (compiler/LOWERING.md 27, REGISTER_SEMANTICS.md
2.8.1): the fixture ``sparse_rk3576_int8`` decodes to its ONNX weights exactly and is re-encoded
byte for byte, as are chosen-weight builds of other shapes [V].

- **Groups and pairs.** Each group of 4 consecutive input channels keeps two positions p0 < p1:
  the non-zero ones, then the lowest zero ones. The pair's rank in ``PAIRS`` (lexicographic,
  0..5) is the group's mask code.
- **Two streams**, whatever the layer's size: stream 0 holds every group's first kept value and
  ``code & 3``; stream 1 the second kept value and ``code >> 2``. Stream 1 starts at stream 0's
  (AMOUNT0 + 1) x 16 bytes rounded up to 64.
- **Order.** Blocks of 8 groups (32 input channels) in the order [OC/32][IC/64][KH*KW][32 kernels]
  [the 64 channels' two 32-channel halves (one when IC mod 64 = 32)].
- **Stream** = a 16-byte header (int32 bias, uint32 width map, 8 zero bytes) then a bit stream,
  least significant bit of each byte first, zero-padded to 16 bytes (AMOUNT = bytes / 16 - 1).
  The bias is minus the stream's most frequent value (the lowest byte value on a tie); a value v
  is stored as d = int8(v + bias). Each block: the prefix code (``CODES``) of a symbol whose map
  nibble is the block's width W (the bit length of its largest magnitude), 8 sign bits (d < 0),
  8 magnitudes of W bits (d, or ~d when negative), 8 two-bit fields.
- **Width map**: nibble i is the width of symbol i; the encoder sorts the widths by how many blocks
  use them (selection sort from the identity, first maximum wins), so frequent widths get the
  2-bit codes.
- The tensor the vendor stores is ``span + kept values / 4`` bytes rounded up to 64 (zeros after
  the streams) [V: three builds]; the hardware reads the span only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CONTROL = 5  # DCOMP_CTRL.DECOMP_CONTROL of this format [V]
REGNUM = 5  # what the vendor writes to DCOMP_REGNUM with it (meaning unknown) [V]
STREAMS = 2
PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
CODES = ("00", "10", "111", "110", "011", "0101", "01001", "01000")  # symbol i's bits in stream order [V]
HEADER = 16
GROUPS = 8  # groups of 4 input channels per block
UNIT, ALIGN = 16, 64
MAX_WIDTH = 7


class VendorFormatError(ValueError):
    """Weights this format cannot hold, or bytes that are not such streams."""


@dataclass(frozen=True)
class VendorStreams:
    data: bytes  # the tensor the vendor stores: both streams, then its zero reserve
    amounts: tuple[int, int]  # DCOMP_AMOUNT0, DCOMP_AMOUNT1


def _pair_code() -> np.ndarray:
    table = np.full((4, 4), -1, np.int64)
    for code, (first, second) in enumerate(PAIRS):
        table[first, second] = code
    return table


def _code_table() -> tuple[np.ndarray, np.ndarray]:
    """Symbol and code length for every 5-bit look-ahead (bit i of the index = i-th stream bit)."""
    symbols, lengths = np.zeros(32, np.int64), np.zeros(32, np.int64)
    for symbol, code in enumerate(CODES):
        bits = sum(int(c) << i for i, c in enumerate(code))
        for rest in range(1 << (5 - len(code))):
            symbols[bits | rest << len(code)] = symbol
            lengths[bits | rest << len(code)] = len(code)
    return symbols, lengths


PAIR_CODE = _pair_code()
SYMBOL_OF_PEEK, LENGTH_OF_PEEK = _code_table()


def _check_shape(out_channels: int, in_channels: int) -> None:
    if out_channels <= 0 or in_channels <= 0 or out_channels % 32 or in_channels % 32:
        raise VendorFormatError(f"{out_channels} output / {in_channels} input channels: the sparse streams need "
                                "both to be positive multiples of 32")


def block_order(out_channels: int, in_channels: int, taps: int) -> np.ndarray:
    """[blocks][8][4]: the index into weights.reshape(-1) ([OC][IC][KH*KW]) of every value, in
    stream order."""
    _check_shape(out_channels, in_channels)
    index = np.arange(out_channels * in_channels * taps).reshape(out_channels, in_channels, taps)
    parts = []
    for oc in range(0, out_channels, 32):
        for ic in range(0, in_channels, 64):
            chunk = index[oc:oc + 32, ic:ic + 64]  # [32 kernels][32 or 64 channels][taps]
            halves = chunk.shape[1] // 32
            parts.append(chunk.transpose(2, 0, 1).reshape(taps, 32, halves, GROUPS, 4).reshape(-1, GROUPS, 4))
    return np.concatenate(parts)


def _kept(groups: np.ndarray) -> np.ndarray:
    """[..., 2] kept positions of each group of 4: the non-zero ones, then the lowest zeros."""
    nonzero = groups != 0
    crowded = int(np.count_nonzero(nonzero.sum(axis=-1) > 2))
    if crowded:
        raise VendorFormatError(f"{crowded} groups of 4 input channels hold more than 2 non-zero values")
    rank = np.where(nonzero, 0, 4) + np.arange(4)
    return np.sort(np.argsort(rank, axis=-1, kind="stable")[..., :2], axis=-1)


def _width_map(widths: np.ndarray) -> list[int]:
    """Symbol -> width: the widths by block count, most used first (selection sort from the
    identity; the first maximum wins a tie)."""
    counts = np.bincount(widths.reshape(-1), minlength=MAX_WIDTH + 1)
    order = list(range(MAX_WIDTH + 1))
    for slot in range(len(order)):
        best = max(range(slot, len(order)), key=lambda i: (counts[order[i]], -i))
        order[slot], order[best] = order[best], order[slot]
    return order


def _bit_length(magnitude: np.ndarray) -> np.ndarray:
    return np.where(magnitude > 0, np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int64) + 1, 0)


def _block_bits(symbols: np.ndarray, widths: np.ndarray, negative: np.ndarray, magnitude: np.ndarray,
                fields: np.ndarray) -> np.ndarray:
    """The stream's bits: per block the symbol's code, 8 signs, 8 x W magnitude bits, 8 x 2 field bits."""
    count = len(symbols)
    code_bits = np.array([[int(c) for c in code.ljust(5, "0")] for code in CODES], np.uint8)[symbols]
    code_valid = np.arange(5) < np.array([len(code) for code in CODES])[symbols][:, None]
    mag_bits = ((magnitude[:, :, None] >> np.arange(MAX_WIDTH)) & 1).astype(np.uint8).reshape(count, -1)
    mag_valid = np.broadcast_to(np.arange(MAX_WIDTH) < widths[:, None, None], (count, GROUPS, MAX_WIDTH))
    field_bits = ((fields[:, :, None] >> np.arange(2)) & 1).astype(np.uint8).reshape(count, -1)
    bits = np.concatenate([code_bits, negative.astype(np.uint8), mag_bits, field_bits], axis=1)
    valid = np.concatenate([code_valid, np.ones((count, GROUPS), bool), mag_valid.reshape(count, -1),
                            np.ones((count, 2 * GROUPS), bool)], axis=1)
    return bits[valid]


def encode_stream(values: np.ndarray, fields: np.ndarray) -> bytes:
    """[blocks][8] int8 kept values and their 2-bit fields -> one stream, padded to 16 bytes."""
    raw = np.ascontiguousarray(values, np.int8)
    mode = int(np.argmax(np.bincount(raw.view(np.uint8).reshape(-1), minlength=256)))
    bias = int(np.int8(np.uint8((256 - mode) % 256)))
    stored = ((raw.astype(np.int64) + bias + 128) % 256) - 128
    negative = stored < 0
    magnitude = np.where(negative, ~stored, stored)
    widths = _bit_length(magnitude).max(axis=1)
    width_map = _width_map(widths)
    symbol_of_width = np.argsort(width_map)
    bits = _block_bits(symbol_of_width[widths], widths, negative, magnitude, np.asarray(fields, np.int64))
    header = (np.int32(bias).tobytes() + int(sum(w << 4 * i for i, w in enumerate(width_map))).to_bytes(4, "little")
              + bytes(8))
    body = np.packbits(bits, bitorder="little").tobytes()
    stream = header + body
    return stream + bytes(-len(stream) % UNIT)


def encode(weights: np.ndarray) -> VendorStreams:
    """int8 weights [OC][IC][KH][KW], 4:2 along input channels -> the vendor's tensor and amounts."""
    weights = np.asarray(weights)
    if weights.ndim != 4:
        raise VendorFormatError(f"weights of shape {weights.shape}: expected [OC][IC][KH][KW]")
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    order = block_order(out_channels, in_channels, kernel_h * kernel_w)
    groups = np.ascontiguousarray(weights, np.int8).reshape(-1)[order]
    kept = _kept(groups)
    codes = PAIR_CODE[kept[..., 0], kept[..., 1]]
    values = np.take_along_axis(groups, kept, axis=-1)
    streams = [encode_stream(values[..., 0], codes & 3), encode_stream(values[..., 1], codes >> 2)]
    second = -(-len(streams[0]) // ALIGN) * ALIGN
    end = second + len(streams[1])
    total = -(-(end + weights.size // 8) // ALIGN) * ALIGN  # the vendor's reserve: kept values / 4 [V]
    data = streams[0] + bytes(second - len(streams[0])) + streams[1] + bytes(total - end)
    return VendorStreams(data, (len(streams[0]) // UNIT - 1, len(streams[1]) // UNIT - 1))


def stream_starts(amounts: tuple[int, ...]) -> tuple[int, int]:
    if len(amounts) < STREAMS:
        raise VendorFormatError(f"{len(amounts)} DCOMP_AMOUNT values: the format has {STREAMS} streams")
    return 0, -(-((amounts[0] + 1) * UNIT) // ALIGN) * ALIGN


def span_bytes(amounts: tuple[int, ...]) -> int:
    """Bytes from DCOMP_ADDR0 to the end of stream 1 (what the weight DMA reads)."""
    return stream_starts(amounts)[1] + (amounts[1] + 1) * UNIT


def _header(stream: np.ndarray, index: int) -> tuple[int, np.ndarray]:
    if stream.size < HEADER:
        raise VendorFormatError(f"stream {index}: {stream.size} bytes, shorter than its 16-byte header")
    bias = int(np.frombuffer(stream[:4].tobytes(), "<i4")[0])
    if not -128 <= bias <= 127:
        raise VendorFormatError(f"stream {index}: header bias {bias} is not an int8")
    packed = int(np.frombuffer(stream[4:8].tobytes(), "<u4")[0])
    width_map = np.array([(packed >> 4 * i) & 0xF for i in range(8)], np.int64)
    if (width_map > MAX_WIDTH).any():
        raise VendorFormatError(f"stream {index}: width map {packed:#010x} names a width above {MAX_WIDTH}")
    if stream[8:HEADER].any():
        raise VendorFormatError(f"stream {index}: header bytes 8..15 are {stream[8:HEADER].tobytes().hex()}, "
                                "not 0 (their meaning is not known)")
    return bias, width_map


def decode_stream(stream: np.ndarray, blocks: int, index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """One stream's bytes -> ([blocks][8] int8 values, [blocks][8] 2-bit fields)."""
    stream = np.ascontiguousarray(stream, np.uint8).reshape(-1)
    bias, width_map = _header(stream, index)
    bits = np.unpackbits(stream[HEADER:], bitorder="little").astype(np.int64)
    bits = np.concatenate([bits, np.zeros(5, np.int64)])  # look-ahead past the end reads 0
    limit, weight = bits.size - 5, 1 << np.arange(MAX_WIDTH + 1)
    stored = np.zeros((blocks, GROUPS), np.int64)
    fields = np.zeros((blocks, GROUPS), np.int64)
    position = 0
    for block in range(blocks):
        peek = int(bits[position:position + 5] @ weight[:5])
        width = int(width_map[SYMBOL_OF_PEEK[peek]])
        position += int(LENGTH_OF_PEEK[peek])
        end = position + GROUPS * (3 + width)
        if end > limit:
            raise VendorFormatError(f"stream {index}: block {block} of {blocks} runs past the stream's "
                                    f"{stream.size} bytes")
        signs = bits[position:position + GROUPS]
        magnitude = bits[position + GROUPS:end - 2 * GROUPS].reshape(GROUPS, width) @ weight[:width]
        stored[block] = np.where(signs == 1, ~magnitude, magnitude)
        fields[block] = bits[end - 2 * GROUPS:end].reshape(GROUPS, 2) @ weight[:2]
        position = end
    values = (((stored - bias) + 128) % 256 - 128).astype(np.int8)
    return values, fields


def decode(data: np.ndarray | bytes, amounts: tuple[int, ...], shape: tuple[int, int, int, int]) -> np.ndarray:
    """The bytes at DCOMP_ADDR0 (at least span_bytes(amounts)) -> int8 weights [OC][IC][KH][KW]."""
    raw = np.frombuffer(bytes(data), np.uint8) if isinstance(data, (bytes, bytearray)) \
        else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    out_channels, in_channels, kernel_h, kernel_w = shape
    order = block_order(out_channels, in_channels, kernel_h * kernel_w)
    if raw.size < span_bytes(amounts):
        raise VendorFormatError(f"the streams span {span_bytes(amounts)} bytes, {raw.size} given")
    parts = []
    for index, start in enumerate(stream_starts(amounts)):
        parts.append(decode_stream(raw[start:start + (amounts[index] + 1) * UNIT], len(order), index))
    (first, low), (second, high) = parts
    if (high > 1).any():
        raise VendorFormatError(f"{int(np.count_nonzero(high > 1))} stream-1 fields above 1: no mask code above 5")
    codes = low | high << 2
    positions = np.array(PAIRS)[np.minimum(codes, len(PAIRS) - 1)]
    bad = int(np.count_nonzero(codes >= len(PAIRS)))
    if bad:
        raise VendorFormatError(f"{bad} of {codes.size} groups have mask code above 5")
    groups = np.zeros(order.shape, np.int8)
    np.put_along_axis(groups, positions[..., :1], first[..., None], axis=-1)
    np.put_along_axis(groups, positions[..., 1:], second[..., None], axis=-1)
    weights = np.zeros(order.size, np.int8)
    weights[order.reshape(-1)] = groups.reshape(-1)
    return weights.reshape(shape)


__all__ = ["CODES", "CONTROL", "PAIRS", "REGNUM", "STREAMS", "VendorFormatError", "VendorStreams", "block_order",
           "decode", "decode_stream", "encode", "encode_stream", "span_bytes", "stream_starts"]
