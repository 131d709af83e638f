"""The emulator's weight decompressor hook (emulator/kernels/weights_sparse.py): which register
values it reads and refuses, and where the vendor's streams sit in the vendor's own build of a
sparse conv (../shared/rknn-fixtures-ops/sparse_rk3576_int8). The stream contents are tested
against references written in tests/isa/test_sparse_vendor.py (input channels) and
tests/isa/test_sparse_vendor_out.py (output channels); npuemu's earlier own stream format
(LOWERING.md 23.2) is gone since both axes store the vendor's (LOWERING.md 43)."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator.kernels import weights_sparse
from npuemu.isa import sparse_vendor
from npuemu.isa.errors import EmulationError
from tests.shared_data import MISSING_REASON, RKNN_FIXTURES_OPS


@pytest.mark.parametrize("control, bypass, regnum, message", [
    (4, 0, 5, "DECOMP_CONTROL=4 is not modelled \\(0 dense, 5 \\(in_4_2\\), 6 \\(out_4_2\\), 7 \\(in_out_16_4\\)\\)"),
    (5, 1, 5, "WT_DEC_BYPASS=1"),
    (5, 0, 0, "DCOMP_REGNUM=0"),
    (6, 0, 1, "DCOMP_REGNUM=1 with DECOMP_CONTROL=6: its 2 streams"),
    (6, 0, 17, "DCOMP_REGNUM=17"),
])
def test_decompressor_settings_the_emulator_refuses(control, bypass, regnum, message):
    with pytest.raises(EmulationError, match=message):
        weights_sparse.decompression(control, bypass, regnum, [0] * 16, "core 0 task 0")


def test_both_modes_read_amount0_and_1_only():
    assert weights_sparse.decompression(0, 0, 0, [], "t") is None  # DECOMP_CONTROL 0: dense weights
    for control, mode in ((5, "in_4_2"), (6, "out_4_2"), (7, "in_out_16_4")):
        setting = weights_sparse.decompression(control, 0, 5, [3, 4, 0, 0, 0] + [9] * 11, "t")
        assert (setting.mode, setting.amounts) == (mode, (3, 4))
        assert setting.span == 64 + 5 * 16  # stream 1 at (3 + 1) x 16 = 64 (a 64-byte boundary), 5 units long


def _vendor_weights(name: str) -> bytes:
    from npuemu.isa.rknn import load_rknn

    model = load_rknn(RKNN_FIXTURES_OPS / name / "model.rknn")
    tensor = next(t for t in model.tensors if t.name == "w1")
    return bytes(model.blobs[tensor.blob_index])


def test_stream_placement_matches_the_vendor_blob():
    """sparse_rk3576_int8 (DCOMP_AMOUNT0/1 = 712/716, regcmd_diff_vs_off.txt): its two streams sit
    where stream_starts puts them, each ends inside its last 16-byte unit, and the bytes between
    and after them are 0."""
    if not (RKNN_FIXTURES_OPS / "sparse_rk3576_int8" / "model.rknn").is_file():
        pytest.skip(MISSING_REASON)
    blob = np.frombuffer(_vendor_weights("sparse_rk3576_int8"), np.uint8)
    amounts = (712, 716)
    starts = sparse_vendor.stream_starts(amounts)
    assert starts == (0, 11456)
    for start, amount in zip(starts, amounts):
        end = start + (amount + 1) * 16
        used = np.flatnonzero(blob[start:end])
        assert used[0] < 16  # the 16-byte stream header starts the stream (its first word 0 or 12)
        assert start + amount * 16 <= start + used[-1] < end  # (amount + 1) units: the last one in use
        assert not blob[end:start + -(-(end - start) // 64) * 64].any()  # 64-byte alignment padding
    assert not blob[sparse_vendor.span_bytes(amounts):].any()
    # the two stream headers share bytes 4..15 (the width map 0x01243567, then zeros) [V]
    assert bytes(blob[4:16]) == bytes(blob[11460:11472]) == bytes.fromhex("67352401") + bytes(8)
    # the option-off build stores the dense 64 x 64 x 3 x 3 blob (36864 bytes); the streams take 62 %
    assert len(_vendor_weights("sparse_rk3576_off_int8")) == 36864
    assert sparse_vendor.span_bytes(amounts) == 22928
