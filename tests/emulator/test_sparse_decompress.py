"""RK3576 sparse weight streams (isa/sparse_layout.py, compiler/LOWERING.md 23) against a
reference written here from the documented format, and the emulator's decompressor hook
(emulator/kernels/weights_sparse.py) against the vendor's build of the same conv.

The reference works group by group in plain Python: for each group of 4 along the sparse axis,
the non-zero positions (then the lowest zero positions) are kept in position order; a stream is
the kept values, then one nibble p0 | p1 << 2 per group, two per byte, the even group low.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.emulator.kernels import weights_sparse
from npuemu.isa import sparse_layout
from npuemu.isa.errors import EmulationError

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "rknn-fixtures-ops"


def reference_groups(dense: np.ndarray, mode: str) -> list[list[int]]:
    """Groups of 4 in stream order: consecutive bytes (input channels), or consecutive kernels of
    each 32 x 32 [kernels][channels] block (output channels)."""
    values = [int(v) for v in dense.astype(np.int8)]
    if mode == "in_4_2":
        return [values[i:i + 4] for i in range(0, len(values), 4)]
    groups = []
    for block in range(0, len(values), 1024):
        for channel in range(32):
            column = [values[block + kernel * 32 + channel] for kernel in range(32)]
            groups += [column[i:i + 4] for i in range(0, 32, 4)]
    return groups


def reference_compress(dense: np.ndarray, mode: str) -> bytes:
    kept_values, nibbles = [], []
    for group in reference_groups(dense, mode):
        positions = [p for p in range(4) if group[p] != 0]
        positions += [p for p in range(4) if group[p] == 0][:2 - len(positions)]
        positions.sort()
        kept_values += [group[p] for p in positions]
        nibbles.append(positions[0] | positions[1] << 2)
    if len(nibbles) % 2:
        nibbles.append(0)
    packed = [nibbles[i] | nibbles[i + 1] << 4 for i in range(0, len(nibbles), 2)]
    return np.array(kept_values, np.int8).tobytes() + bytes(packed)


def reference_decompress(stream: bytes, dense_size: int, mode: str) -> np.ndarray:
    count = dense_size // 4
    values = np.frombuffer(stream[:2 * count], np.int8)
    groups = []
    for index in range(count):
        nibble = (stream[2 * count + index // 2] >> (4 * (index % 2))) & 0xF
        group = [0, 0, 0, 0]
        group[nibble & 3], group[nibble >> 2] = int(values[2 * index]), int(values[2 * index + 1])
        groups.append(group)
    if mode == "in_4_2":
        return np.array([v for group in groups for v in group], np.int8)
    dense = np.zeros(dense_size, np.int8)
    for index, group in enumerate(groups):
        block, rest = divmod(index, 256)  # 32 channels x 8 groups per 32 x 32 block
        channel, part = divmod(rest, 8)
        for lane, value in enumerate(group):
            dense[block * 1024 + (part * 4 + lane) * 32 + channel] = value
    return dense


def pruned_blob(seed: int, blocks: int, mode: str, fewer: bool) -> np.ndarray:
    """A dense blob of ``blocks`` 32 x 32 blocks with a random 4:2 mask along the mode's axis
    (``fewer``: some groups keep 0 or 1 non-zero value, and some kept values are 0)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(-128, 128, size=(blocks, 32, 32)).astype(np.int8)
    axis = 2 if mode == "in_4_2" else 1
    moved = np.moveaxis(values, axis, -1).reshape(blocks, 32, 8, 4)
    order = np.argsort(rng.random(moved.shape), axis=-1)
    keep = np.zeros(moved.shape, bool)
    np.put_along_axis(keep, order[..., :2], True, axis=-1)
    if fewer:
        keep &= rng.random(moved.shape) < 0.7
    moved = np.where(keep, moved, 0).reshape(blocks, 32, 32)
    return np.ascontiguousarray(np.moveaxis(moved, -1, axis)).reshape(-1)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), blocks=st.integers(1, 4), mode=st.sampled_from(sparse_layout.MODES),
       fewer=st.booleans())
def test_stream_matches_the_reference_both_ways(seed, blocks, mode, fewer):
    dense = pruned_blob(seed, blocks, mode, fewer)
    ours = sparse_layout.compress_stream(dense, mode)
    assert ours == reference_compress(dense, mode)
    assert len(ours) == sparse_layout.stream_bytes(dense.size) == dense.size * 5 // 8
    np.testing.assert_array_equal(sparse_layout.decompress_stream(np.frombuffer(ours, np.uint8), dense.size, mode),
                                  dense)
    np.testing.assert_array_equal(reference_decompress(ours, dense.size, mode), dense)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), streams=st.integers(1, 5), taps=st.sampled_from([1, 9]),
       mode=st.just("out_4_2"))
def test_layer_streams_round_trip_through_the_emulator_hook(seed, streams, taps, mode):
    """Streams start 64-byte aligned after (amount + 1) * 16 bytes; the emulator's decompressor
    gives the dense blob back from the register values alone. (DECOMP_CONTROL 5 reads the vendor's
    format instead: tests/isa/test_sparse_vendor.py.)"""
    dense = pruned_blob(seed, streams * taps, mode, fewer=True)
    packed = sparse_layout.compress(dense, streams, mode)
    per_stream = dense.size // streams
    starts = sparse_layout.stream_offsets(packed.amounts)
    for index, start in enumerate(starts):
        part = dense[index * per_stream:(index + 1) * per_stream]
        expected = reference_compress(part, mode)
        assert start % 64 == 0
        assert packed.data[start:start + len(expected)] == expected
        assert packed.amounts[index] == -(-len(expected) // 16) - 1
    control = sparse_layout.DECOMP_CONTROL[mode]
    setting = weights_sparse.decompression(control, 0, streams, list(packed.amounts) + [0] * 3, "test")
    assert setting.span == len(packed.data)
    raw = np.frombuffer(packed.data, np.uint8)
    shape = (32 * streams, 32, taps, 1)  # not read by npuemu's own format
    np.testing.assert_array_equal(weights_sparse.decompress_weights(raw, setting, dense.size, "test", shape, None),
                                  dense)


def test_crowded_groups_are_refused_with_the_count():
    dense = np.ones(1024, np.int8)
    with pytest.raises(sparse_layout.SparseFormatError, match="256 of 256 groups of 4 hold more than 2"):
        sparse_layout.compress_stream(dense, "in_4_2")


@pytest.mark.parametrize("control, bypass, regnum, message", [
    (7, 0, 1, "DECOMP_CONTROL=7 is not modelled"),
    (5, 1, 1, "WT_DEC_BYPASS=1"),
    (5, 0, 0, "DCOMP_REGNUM=0"),
    (6, 0, 17, "DCOMP_REGNUM=17"),
])
def test_decompressor_settings_the_emulator_refuses(control, bypass, regnum, message):
    with pytest.raises(EmulationError, match=message):
        weights_sparse.decompression(control, bypass, regnum, [0] * 16, "core 0 task 0")


def test_malformed_index_nibbles_are_an_emulation_error():
    stream = bytearray(reference_compress(pruned_blob(3, 1, "out_4_2", False), "out_4_2"))
    stream[512] = 0x00  # groups 0 and 1 name positions (0, 0): not two increasing positions
    setting = weights_sparse.decompression(6, 0, 1, [sparse_layout.amount_of(len(stream))], "t")
    with pytest.raises(EmulationError, match="2 of 256 index nibbles"):
        weights_sparse.decompress_weights(np.frombuffer(bytes(stream), np.uint8), setting, 1024, "t",
                                          (32, 32, 1, 1), None)
    assert weights_sparse.decompression(0, 0, 0, [], "t") is None  # DECOMP_CONTROL 0: dense weights


def _vendor_weights(name: str) -> bytes:
    from npuemu.isa.rknn import load_rknn

    model = load_rknn(FIXTURES / name / "model.rknn")
    tensor = next(t for t in model.tensors if t.name == "w1")
    return bytes(model.blobs[tensor.blob_index])


@pytest.mark.skipif(not (FIXTURES / "sparse_rk3576_int8").exists(), reason="rknn op fixtures not present")
def test_stream_placement_matches_the_vendor_blob():
    """sparse_rk3576_int8 (DCOMP_AMOUNT0/1 = 712/716, regcmd_diff_vs_off.txt): its two 32-kernel
    streams sit where stream_offsets puts them, each ends inside its last 16-byte unit, and the
    bytes between and after them are 0. The contents (a 16-byte header, then a bit stream) are
    decoded and re-encoded in tests/isa/test_sparse_vendor.py (LOWERING.md 27)."""
    blob = np.frombuffer(_vendor_weights("sparse_rk3576_int8"), np.uint8)
    amounts = (712, 716)
    starts = sparse_layout.stream_offsets(amounts)
    assert starts == [0, 11456]
    for start, amount in zip(starts, amounts):
        end = start + (amount + 1) * 16
        used = np.flatnonzero(blob[start:end])
        assert used[0] < 16  # the 16-byte stream header starts the stream (its first word 0 or 12)
        assert start + amount * 16 <= start + used[-1] < end  # (amount + 1) units: the last one in use
        assert not blob[end:start + -(-(end - start) // 64) * 64].any()  # 64-byte alignment padding
    assert not blob[sparse_layout.span_bytes(amounts):].any()
    # the two stream headers share bytes 4..15 (an 8-entry code table 0x01243567, then zeros) [V]
    assert bytes(blob[4:16]) == bytes(blob[11460:11472]) == bytes.fromhex("67352401") + bytes(8)
    # the option-off build stores the dense 64 x 64 x 3 x 3 blob (36864 bytes): 5/8 of it is our
    # stream size, within 1 % of the vendor's (11397 + 11465 bytes used)
    dense = _vendor_weights("sparse_rk3576_off_int8")
    assert len(dense) == 36864
    ours = 2 * sparse_layout.stream_bytes(len(dense) // 2)
    assert abs(ours - (11397 + 11465)) / ours < 0.01
