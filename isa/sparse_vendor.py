"""The vendor's RK3576 sparse weight streams (DCOMP_CTRL.DECOMP_CONTROL 5; 4:2 along input or output
channels, or 16:4): int8 conv weights [OC][IC][KH][KW] <-> the bytes at DCOMP_ADDR0 and
DCOMP_AMOUNT0/1. Along input channels first:

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

**Along output channels** (``along="out"``, LOWERING.md 43) [V: 12 chosen-weight builds, 32 to
128 kernels, 1x1 / 3x3 / 5x5, decoded and re-encoded byte for byte]: the same streams, header,
bias, width map and block coding; the groups are 4 consecutive kernels (per input channel and
tap), and the kept values form rows [OC/64][16 kernel groups][2 kept] (kept row 2g + k, the
k-th kept value of group g; OC mod 64 = 32 gives a last part of 16 rows) x the input channels.
Order: [kept rows / 32][IC/32][KH*KW][32 kept rows][32 channels], and **stream s holds the
channels of parity s** (s, s+2, .., s+14, then s+16, .., s+30: two blocks per row); a block's
fields are ``code & 3`` in first-kept rows and ``code >> 2`` in second-kept rows.

**16:4** (``along="both"``, the vendor's "method 3", LOWERING.md 43) [V: 9 builds, 6 weight sets,
byte for byte]: each 4 x 4 tile [kernels][channels] keeps kernels r0 < r1 x channels c0 < c1 (the
non-zero ones, then the lowest zero ones); stream s holds column c_s; kept row 2G + k (kernel group
G, row r_k) has one value per group of 4 channels, in the input-channel order above with kept rows
for kernels: [kept rows / 32][IC/64][KH*KW][32 kept rows][2 blocks of 8 channel groups]. Fields:
the channel pair's code in k = 0 rows, the kernel pair's in k = 1 rows (code & 3 in stream 0,
code >> 2 in stream 1). The stored tensor's reserve is kept values / 4 in every mode.
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


ALONG = ("in", "out", "both")  # the sparse axis: input channels, output channels, or 16:4 (both)
KERNEL_ROWS = 32  # kept rows per output-channel block: 16 groups of 4 kernels x 2 kept values


def _check_along(along: str) -> None:
    if along not in ALONG:
        raise VendorFormatError(f"sparse axis {along!r}: expected 'in', 'out' or 'both'")


def kept_row_order(out_channels: int, in_channels: int, taps: int, stream: int) -> np.ndarray:
    """Along output channels: [blocks][8] indices into the kept values [OC/2][IC][KH*KW] (kept row
    2g + k = the k-th kept value of kernel group g) of stream ``stream``'s values, in order."""
    _check_shape(out_channels, in_channels)
    index = np.arange(out_channels // 2 * in_channels * taps).reshape(out_channels // 2, in_channels, taps)
    parts = []
    for row in range(0, out_channels // 2, KERNEL_ROWS):
        for ic in range(0, in_channels, 32):
            chunk = index[row:row + KERNEL_ROWS, ic:ic + 32].transpose(2, 0, 1)  # [taps][rows][32 channels]
            parts.append(chunk[:, :, stream::2].reshape(-1, GROUPS))
    return np.concatenate(parts)


def tile_row_order(out_channels: int, in_channels: int, taps: int) -> np.ndarray:
    """16:4: [blocks][8] indices into one stream's kept values [OC/2][IC/4][KH*KW] (kept row 2G + k
    of kernel group G, one value per group of 4 input channels), in order."""
    _check_shape(out_channels, in_channels)
    index = np.arange(out_channels // 2 * in_channels // 4 * taps).reshape(out_channels // 2, in_channels // 4, taps)
    parts = []
    for row in range(0, out_channels // 2, KERNEL_ROWS):
        for group in range(0, in_channels // 4, 2 * GROUPS):
            chunk = index[row:row + KERNEL_ROWS, group:group + 2 * GROUPS].transpose(2, 0, 1)  # [taps][rows][groups]
            parts.append(chunk.reshape(-1, GROUPS))
    return np.concatenate(parts)


def _tiles(weights: np.ndarray) -> np.ndarray:
    """[OC/4][IC/4][taps][4 kernels][4 channels]: the 4 x 4 tiles of 16:4."""
    out_channels, in_channels = weights.shape[:2]
    return weights.reshape(out_channels // 4, 4, in_channels // 4, 4, -1).transpose(0, 2, 4, 1, 3)


def _encode_both(weights: np.ndarray) -> VendorStreams:
    out_channels, in_channels = weights.shape[:2]
    taps = weights.size // (out_channels * in_channels)
    tiles = _tiles(weights)
    rows = _kept((tiles != 0).any(axis=-1), "output channels (16:4 tiles: non-zero kernels)")
    cols = _kept((tiles != 0).any(axis=-2), "input channels (16:4 tiles: non-zero channels)")
    picked = np.take_along_axis(tiles, rows[..., :, None], axis=-2)  # [..][2 rows][4 channels]
    values = np.take_along_axis(picked, cols[..., None, :], axis=-1)  # [..][2 rows][2 channels]
    codes = [PAIR_CODE[cols[..., 0], cols[..., 1]], PAIR_CODE[rows[..., 0], rows[..., 1]]]  # row k: k-th code
    order = tile_row_order(out_channels, in_channels, taps)
    streams = []
    for stream in range(STREAMS):
        kept = values[..., stream].transpose(0, 3, 1, 2).reshape(-1)  # [OC/4][2 rows][IC/4][taps]
        fields = np.stack([c & 3 if stream == 0 else c >> 2 for c in codes], axis=1).reshape(-1)
        streams.append(encode_stream(kept[order], fields[order]))
    return _pack(streams, weights.size // 4)


def _decode_both(raw: np.ndarray, amounts: tuple[int, ...], shape: tuple[int, int, int, int]) -> np.ndarray:
    out_channels, in_channels, kernel_h, kernel_w = shape
    taps = kernel_h * kernel_w
    order = tile_row_order(out_channels, in_channels, taps)
    size = out_channels // 2 * in_channels // 4 * taps
    kept, fields = np.zeros((STREAMS, size), np.int8), np.zeros((STREAMS, size), np.int64)
    for stream, (values, field) in enumerate(_streams(raw, amounts, [len(order)] * STREAMS)):
        kept[stream, order.reshape(-1)] = values.reshape(-1)
        fields[stream, order.reshape(-1)] = field.reshape(-1)
    kept = kept.reshape(STREAMS, out_channels // 4, 2, in_channels // 4, taps)
    fields = fields.reshape(STREAMS, out_channels // 4, 2, in_channels // 4, taps)
    if (fields[1] > 1).any():
        raise VendorFormatError(f"{int(np.count_nonzero(fields[1] > 1))} stream-1 fields above 1: no mask code above 5")
    codes = fields[0] | fields[1] << 2  # [OC/4][row k][IC/4][taps]: k = 0 the channel pair, 1 the kernel pair
    cols, rows = _positions(codes[:, 0]), _positions(codes[:, 1])  # [OC/4][IC/4][taps][2]
    tiles = np.zeros((out_channels // 4, in_channels // 4, taps, 4, 4), np.int8)
    g, c, t = np.indices(codes[:, 0].shape)
    for k in range(2):
        for stream in range(STREAMS):
            tiles[g, c, t, rows[..., k], cols[..., stream]] = kept[stream][:, k]
    return tiles.transpose(0, 3, 1, 4, 2).reshape(shape)


def _kernel_groups(weights: np.ndarray) -> np.ndarray:
    """[OC/4][IC][taps][4]: groups of 4 consecutive kernels."""
    out_channels, in_channels = weights.shape[:2]
    return weights.reshape(out_channels // 4, 4, in_channels, -1).transpose(0, 2, 3, 1)


def _kept(groups: np.ndarray, what: str = "input channels") -> np.ndarray:
    """[..., 2] kept positions of each group of 4: the non-zero ones, then the lowest zeros."""
    nonzero = groups != 0
    crowded = int(np.count_nonzero(nonzero.sum(axis=-1) > 2))
    if crowded:
        raise VendorFormatError(f"{crowded} groups of 4 {what} hold more than 2 non-zero values")
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


def _pack(streams: list[bytes], kept_values: int) -> VendorStreams:
    second = -(-len(streams[0]) // ALIGN) * ALIGN
    end = second + len(streams[1])
    total = -(-(end + kept_values // 4) // ALIGN) * ALIGN  # the vendor's reserve: kept values / 4 [V]
    data = streams[0] + bytes(second - len(streams[0])) + streams[1] + bytes(total - end)
    return VendorStreams(data, (len(streams[0]) // UNIT - 1, len(streams[1]) // UNIT - 1))


def _encode_out(weights: np.ndarray) -> VendorStreams:
    out_channels, in_channels = weights.shape[:2]
    taps = weights.size // (out_channels * in_channels)
    groups = _kernel_groups(weights)  # [OC/4][IC][taps][4]
    kept = _kept(groups, "output channels")
    codes = PAIR_CODE[kept[..., 0], kept[..., 1]]
    values = np.take_along_axis(groups, kept, axis=-1)  # [OC/4][IC][taps][2]
    rows = values.transpose(0, 3, 1, 2).reshape(-1)  # kept row 2g + k: [OC/2][IC][taps]
    fields = np.stack([codes & 3, codes >> 2], axis=1).reshape(-1)
    streams = []
    for stream in range(STREAMS):
        order = kept_row_order(out_channels, in_channels, taps, stream)
        streams.append(encode_stream(rows[order], fields[order]))
    return _pack(streams, weights.size // 2)


def encode(weights: np.ndarray, along: str = "in") -> VendorStreams:
    """int8 weights [OC][IC][KH][KW], 4:2 along input (``along="in"``) or output channels -> the
    vendor's tensor and amounts."""
    _check_along(along)
    weights = np.asarray(weights)
    if weights.ndim != 4:
        raise VendorFormatError(f"weights of shape {weights.shape}: expected [OC][IC][KH][KW]")
    out_channels, in_channels, kernel_h, kernel_w = weights.shape
    if along != "in":
        _check_shape(out_channels, in_channels)
        encoder = _encode_out if along == "out" else _encode_both
        return encoder(np.ascontiguousarray(weights, np.int8))
    order = block_order(out_channels, in_channels, kernel_h * kernel_w)
    groups = np.ascontiguousarray(weights, np.int8).reshape(-1)[order]
    kept = _kept(groups)
    codes = PAIR_CODE[kept[..., 0], kept[..., 1]]
    values = np.take_along_axis(groups, kept, axis=-1)
    return _pack([encode_stream(values[..., 0], codes & 3), encode_stream(values[..., 1], codes >> 2)],
                 weights.size // 2)


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


def _positions(codes: np.ndarray) -> np.ndarray:
    bad = int(np.count_nonzero(codes >= len(PAIRS)))
    if bad:
        raise VendorFormatError(f"{bad} of {codes.size} groups have mask code above 5")
    return np.array(PAIRS)[codes]


def _streams(raw: np.ndarray, amounts: tuple[int, ...], blocks: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
    if raw.size < span_bytes(amounts):
        raise VendorFormatError(f"the streams span {span_bytes(amounts)} bytes, {raw.size} given")
    return [decode_stream(raw[start:start + (amounts[index] + 1) * UNIT], blocks[index], index)
            for index, start in enumerate(stream_starts(amounts))]


def _decode_out(raw: np.ndarray, amounts: tuple[int, ...], shape: tuple[int, int, int, int]) -> np.ndarray:
    out_channels, in_channels, kernel_h, kernel_w = shape
    taps = kernel_h * kernel_w
    orders = [kept_row_order(out_channels, in_channels, taps, stream) for stream in range(STREAMS)]
    rows = np.zeros(out_channels // 2 * in_channels * taps, np.int8)
    fields = np.zeros(rows.size, np.int64)
    for order, (values, field) in zip(orders, _streams(raw, amounts, [len(order) for order in orders])):
        rows[order.reshape(-1)] = values.reshape(-1)
        fields[order.reshape(-1)] = field.reshape(-1)
    rows = rows.reshape(out_channels // 4, 2, in_channels, taps)
    fields = fields.reshape(out_channels // 4, 2, in_channels, taps)
    if (fields[:, 1] > 1).any():
        raise VendorFormatError(f"{int(np.count_nonzero(fields[:, 1] > 1))} second-kept fields above 1: no mask "
                                "code above 5")
    positions = _positions(fields[:, 0] | fields[:, 1] << 2)  # [OC/4][IC][taps][2]
    groups = np.zeros((out_channels // 4, in_channels, taps, 4), np.int8)
    for k in range(2):
        np.put_along_axis(groups, positions[..., k:k + 1], rows[:, k, :, :, None], axis=-1)
    return groups.transpose(0, 3, 1, 2).reshape(shape)


def decode(data: np.ndarray | bytes, amounts: tuple[int, ...], shape: tuple[int, int, int, int],
           along: str = "in") -> np.ndarray:
    """The bytes at DCOMP_ADDR0 (at least span_bytes(amounts)) -> int8 weights [OC][IC][KH][KW]."""
    _check_along(along)
    raw = np.frombuffer(bytes(data), np.uint8) if isinstance(data, (bytes, bytearray)) \
        else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    out_channels, in_channels, kernel_h, kernel_w = shape
    if along != "in":
        return (_decode_out if along == "out" else _decode_both)(raw, amounts, tuple(shape))
    order = block_order(out_channels, in_channels, kernel_h * kernel_w)
    (first, low), (second, high) = _streams(raw, amounts, [len(order)] * STREAMS)
    if (high > 1).any():
        raise VendorFormatError(f"{int(np.count_nonzero(high > 1))} stream-1 fields above 1: no mask code above 5")
    positions = _positions(low | high << 2)
    groups = np.zeros(order.shape, np.int8)
    np.put_along_axis(groups, positions[..., :1], first[..., None], axis=-1)
    np.put_along_axis(groups, positions[..., 1:], second[..., None], axis=-1)
    weights = np.zeros(order.size, np.int8)
    weights[order.reshape(-1)] = groups.reshape(-1)
    return weights.reshape(shape)


__all__ = ["ALONG", "CODES", "CONTROL", "PAIRS", "REGNUM", "STREAMS", "VendorFormatError", "VendorStreams", "block_order",
           "decode", "decode_stream", "encode", "encode_stream", "kept_row_order", "span_bytes", "stream_starts", "tile_row_order"]
