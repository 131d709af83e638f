"""RK3576 sparse (4:2) weight streams: the dense int8 conv blob <-> the compressed streams the
CNA's weight decompressor (DCOMP) reads. Shared by the compiler (compiler/sparse_weights.py)
and the emulator (emulator/kernels/weights_sparse.py); compiler/LOWERING.md 23 states the
format with its evidence marks, emulator/REGISTER_SEMANTICS.md 2.8 the registers.

What the vendor's builds show [V]: two streams whatever the kernel count (the first and the
second kept value of each group of 4), each starting on a 64-byte boundary, ``DCOMP_AMOUNTn =
ceil(stream bytes / 16) - 1`` (712/716 in ``sparse_rk3576_int8``, stream 1 at byte 11456),
halved WEIGHT_BYTES. Their contents (4:2 along input channels, DECOMP_CONTROL 5) are
isa/sparse_vendor.py's, which the compiler writes and the emulator reads for ``in_4_2``
(compiler/LOWERING.md 27).

The format below is npuemu's own [I], still used for ``out_4_2`` (the vendor's form of that mode
is known but needs RK3576 mode bits npuemu does not write yet, LOWERING.md 27; the ``in_4_2``
grouping serves the detection helpers and this format's tests): per output group, the dense
blob's bytes (isa/weight_layout.py order) are cut into groups of 4 along the sparse axis; each
group keeps
2 values (in position order) and a 4-bit index ``p0 | p1 << 2`` (p0 < p1, the kept positions).
A stream is the kept values of all its groups, then the index nibbles, two per byte, the
even group in the low nibble. Positions not kept decompress to 0.

- ``in_4_2`` (4:2 along input channels): groups are 4 consecutive bytes of the dense blob
  (input channels are innermost in each [kernels][channels] block).
- ``out_4_2`` (4:2 along output channels): each 32 x 32 [kernels][channels] block is read
  transposed ([channels][kernels]), so groups are 4 consecutive kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: The sparse modes of platforms/*.yaml ``sparse.modes`` whose streams this module writes.
MODES = ("in_4_2", "out_4_2")
#: DCOMP_CTRL.DECOMP_CONTROL per mode: 5 is the vendor's value for 4:2 along input channels [V];
#: 6 for output channels is our choice [I] - the vendor writes 5 there too and marks the mode in
#: RK3576 size-register bits npuemu does not write yet (compiler/LOWERING.md 27).
DECOMP_CONTROL = {"in_4_2": 5, "out_4_2": 6}
MODE_OF_CONTROL = {code: mode for mode, code in DECOMP_CONTROL.items()}
GROUP = 4  # values per sparse group
KEPT = 2  # values kept per group
BLOCK = 32  # kernels per output group = input channels per input group (int8, RK3588/RK3576)
STREAM_ALIGN = 64  # each stream starts on a 64-byte boundary [V]
AMOUNT_UNIT = 16  # DCOMP_AMOUNTn counts 16-byte units, minus one [V]
MAX_STREAMS = 16  # DCOMP_AMOUNT0..15


class SparseFormatError(ValueError):
    """Weights that cannot be stored as 4:2 streams, or streams that do not decode."""


@dataclass(frozen=True)
class SparseStreams:
    """A layer's compressed weights: the bytes at DCOMP_ADDR0 and the DCOMP register values."""

    mode: str
    data: bytes  # the streams, each 64-byte aligned, the last one padded to (amount + 1) * 16 bytes
    amounts: tuple[int, ...]  # DCOMP_AMOUNTn per stream
    dense_bytes: int  # the dense blob the streams decompress to

    @property
    def control(self) -> int:
        return DECOMP_CONTROL[self.mode]


def stream_bytes(dense_stream_bytes: int) -> int:
    """Bytes of one stream holding ``dense_stream_bytes`` dense bytes: values + nibbles."""
    groups = dense_stream_bytes // GROUP
    return groups * KEPT + (groups + 1) // 2


def amount_of(length: int) -> int:
    return -(-length // AMOUNT_UNIT) - 1


def stream_offsets(amounts: tuple[int, ...]) -> list[int]:
    """Start of every stream: the previous start + its (amount + 1) * 16 bytes, 64-aligned."""
    starts, at = [], 0
    for amount in amounts:
        starts.append(at)
        at += -(-((amount + 1) * AMOUNT_UNIT) // STREAM_ALIGN) * STREAM_ALIGN
    return starts


def span_bytes(amounts: tuple[int, ...]) -> int:
    """Bytes from DCOMP_ADDR0 to the end of the last stream (what the weight DMA reads)."""
    if not amounts:
        return 0
    return stream_offsets(amounts)[-1] + (amounts[-1] + 1) * AMOUNT_UNIT


def _groups(dense: np.ndarray, mode: str) -> np.ndarray:
    """[N][4] sparse groups of one output group's dense bytes (a view-free copy)."""
    if mode == "in_4_2":
        return dense.reshape(-1, GROUP)
    blocks = dense.reshape(-1, BLOCK, BLOCK)  # [lane][tap] blocks of [kernels][channels]
    return np.ascontiguousarray(blocks.transpose(0, 2, 1)).reshape(-1, GROUP)


def _ungroup(groups: np.ndarray, mode: str) -> np.ndarray:
    if mode == "in_4_2":
        return groups.reshape(-1)
    blocks = groups.reshape(-1, BLOCK, BLOCK)
    return np.ascontiguousarray(blocks.transpose(0, 2, 1)).reshape(-1)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise SparseFormatError(f"sparse mode {mode!r}: expected one of {', '.join(MODES)}")


def _check_dense_stream(size: int, mode: str) -> None:
    unit = BLOCK * BLOCK if mode == "out_4_2" else BLOCK
    if size <= 0 or size % unit:
        raise SparseFormatError(f"{size} dense bytes per output group: expected a positive multiple of {unit} "
                                "(32-aligned input and output channels, guide table 5-12)")


def dense_groups(dense: np.ndarray, mode: str) -> np.ndarray:
    """The dense blob's [N][4] groups of one output group (for detection and the report)."""
    _check_mode(mode)
    return _groups(np.ascontiguousarray(dense).reshape(-1).view(np.int8), mode)


def compress_stream(dense: np.ndarray, mode: str) -> bytes:
    """One output group's dense int8 bytes -> its stream (SparseFormatError if a group of 4
    holds more than 2 non-zero values)."""
    _check_mode(mode)
    dense = np.ascontiguousarray(dense).reshape(-1).view(np.int8)
    _check_dense_stream(dense.size, mode)
    groups = _groups(dense, mode)
    nonzero = groups != 0
    crowded = int(np.count_nonzero(nonzero.sum(axis=1) > KEPT))
    if crowded:
        raise SparseFormatError(f"{crowded} of {len(groups)} groups of 4 hold more than 2 non-zero values")
    # kept: the non-zero positions, then the lowest zero positions, in position order
    rank = np.where(nonzero, 0, GROUP) + np.arange(GROUP)
    kept = np.sort(np.argsort(rank, axis=1, kind="stable")[:, :KEPT], axis=1)
    values = np.take_along_axis(groups, kept, axis=1).reshape(-1)
    nibbles = (kept[:, 0] | (kept[:, 1] << 2)).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    packed = nibbles[0::2] | (nibbles[1::2] << 4)
    return values.tobytes() + packed.tobytes()


def decompress_stream(stream: np.ndarray, dense_size: int, mode: str) -> np.ndarray:
    """One stream (at least stream_bytes(dense_size) bytes) -> the output group's dense int8 bytes."""
    _check_mode(mode)
    _check_dense_stream(dense_size, mode)
    stream = np.ascontiguousarray(stream).reshape(-1).view(np.uint8)
    count = dense_size // GROUP
    if stream.size < stream_bytes(dense_size):
        raise SparseFormatError(f"a stream of {stream.size} bytes cannot hold {dense_size} dense bytes "
                                f"(needs {stream_bytes(dense_size)})")
    values = stream[:count * KEPT].view(np.int8).reshape(count, KEPT)
    packed = stream[count * KEPT:count * KEPT + (count + 1) // 2]
    nibbles = np.stack([packed & 0xF, packed >> 4], axis=1).reshape(-1)[:count]
    first, second = nibbles & 3, nibbles >> 2
    bad = int(np.count_nonzero(first >= second))
    if bad:
        raise SparseFormatError(f"{bad} of {count} index nibbles do not name two increasing positions")
    groups = np.zeros((count, GROUP), np.int8)
    rows = np.arange(count)
    groups[rows, first] = values[:, 0]
    groups[rows, second] = values[:, 1]
    return _ungroup(groups, mode)


def compress(dense_blob: np.ndarray | bytes, streams: int, mode: str) -> SparseStreams:
    """A layer's dense int8 blob (``streams`` output groups of equal size) -> its streams."""
    dense = np.frombuffer(bytes(dense_blob), np.int8) if isinstance(dense_blob, bytes) \
        else np.ascontiguousarray(dense_blob).reshape(-1).view(np.int8)
    if not 1 <= streams <= MAX_STREAMS or dense.size % streams:
        raise SparseFormatError(f"{dense.size} dense bytes in {streams} streams: expected 1 to {MAX_STREAMS} "
                                "equal output groups")
    size = dense.size // streams
    parts = [compress_stream(dense[i * size:(i + 1) * size], mode) for i in range(streams)]
    amounts = tuple(amount_of(len(part)) for part in parts)
    out = bytearray()
    for start, part in zip(stream_offsets(amounts), parts):
        out += bytes(start - len(out)) + part
    out += bytes(span_bytes(amounts) - len(out))  # the last stream to its (amount + 1) * 16 bytes
    return SparseStreams(mode, bytes(out), amounts, dense.size)


def decompress(data: np.ndarray | bytes, amounts: tuple[int, ...], dense_bytes: int, mode: str) -> np.ndarray:
    """The streams at DCOMP_ADDR0 -> the dense int8 blob of ``dense_bytes`` (isa/weight_layout order)."""
    raw = np.frombuffer(bytes(data), np.uint8) if isinstance(data, bytes) \
        else np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if not amounts or dense_bytes % len(amounts):
        raise SparseFormatError(f"{dense_bytes} dense bytes do not split into {len(amounts)} equal streams")
    if raw.size < span_bytes(amounts):
        raise SparseFormatError(f"the streams span {span_bytes(amounts)} bytes, {raw.size} given")
    size = dense_bytes // len(amounts)
    parts = [decompress_stream(raw[start:start + (amount + 1) * AMOUNT_UNIT], size, mode)
             for start, amount in zip(stream_offsets(amounts), amounts)]
    return np.concatenate(parts)


__all__ = ["AMOUNT_UNIT", "BLOCK", "DECOMP_CONTROL", "MAX_STREAMS", "MODES", "MODE_OF_CONTROL", "STREAM_ALIGN",
           "SparseFormatError", "SparseStreams", "amount_of", "compress", "compress_stream", "decompress",
           "decompress_stream", "dense_groups", "span_bytes", "stream_bytes", "stream_offsets"]
