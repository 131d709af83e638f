"""The vendor's rk3576 fp16 DPU-only copy (emulator/REGISTER_SEMANTICS.md 58): each full-frame fp16 copy of a vendor
build translates to npuemu's RK3588-position fp16 copy and re-packs into the vendor's 89 words word for word; the
padded DPU_RDMA channel count tells it from a bilinear edge copy; other fp16 copies are refused by name.

Committed (``tests/data/rk3576_vendor/concat_flat_fp16.rknn.xz``; rknn-toolkit2 2.5.0, ``target_platform='rk3576'``,
``build(do_quantization=False)``): ONNX (opset 13) with inputs ``x0..x2`` [1, 8, h, h] for h = 8, 4, 2,
``r_i = Reshape(Conv1x1(x_i, w_i, b_i), [1, 6, h * h])`` (``w_i`` [6, 8, 1, 1] = ``RandomState(0)`` draws x 0.3,
``b_i`` [6] x 0.1, drawn w0, b0, w1, b1, w2, b2) and ``y = Concat(r0, r1, r2, axis=2)`` [1, 6, 84]. The vendor writes
each Reshape as fp16 DPU-only copies of 6 real channels (chain 0 tasks 3, 4 and 6; task 7 is an int16 copy with the
undecoded DPU 0x40C8, so the file as a whole stays refused).
"""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_bilinear import is_edge_copy
from npuemu.isa.rknn.rk3576_concat import copy_specs, copy_vendor_writes, is_padded_fp16_copy, is_vendor_copy
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_resize import COPY_KEPT, FRAME

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR, RK3588, OWN = load_regmap("rk3576_vendor"), load_regmap("rk3588"), load_regmap("rk3576")


def _fp16_copies():
    model = load_rknn(lzma.decompress((DATA / "concat_flat_fp16.rknn.xz").read_bytes()), "concat_flat_fp16")
    program = model.program
    chain = program.chains[0].tasks
    records = [program.tasks[chain[index]] for index in (3, 4, 6)]   # the fp16 copies' full frames (docstring)
    assert all(record.enable_mask == 0x18 for record in records)
    return [read_task(program.regcmd[record.first_word:record.tail_word], VENDOR, f"task {index}", record.enable_mask)
            for index, record in zip((3, 4, 6), records)]


def _twin(task) -> dict:
    """The RK3588 writes of the copy: the words the translation keeps as written, then the re-packed ones."""
    kept = {key: task.values.get(key, 0) for key in COPY_KEPT | {("DPU_RDMA", "PAD_CFG")}}
    return {**kept, **{(block, name): fields["raw"] if "raw" in fields else RK3588.register(block, name).pack(fields)
                       for block, name, fields in copy_specs(task, None)}}


def test_the_vendors_fp16_copies_are_concat_copies_not_edge_copies():
    copies = _fp16_copies()
    assert len(copies) == 3
    for task in copies:
        assert is_vendor_copy(task) and is_edge_copy(task) and is_padded_fp16_copy(task)
        assert task.field("DPU", "DATA_CUBE_CHANNEL", "CHANNEL") == 5            # 6 real channels
        assert task.field("DPU_RDMA", "DATA_CUBE_CHANNEL", "CHANNEL") == 7       # read as one whole fp16 atom


def test_the_vendors_fp16_copies_translate_to_npuemus_fp16_copy():
    for task in _fp16_copies():
        twin = _twin(task)
        # npuemu's own fp16 copy (YOLOX Concat_332_flat at RK3588 positions): fp16 in, out and processed,
        # DPU_RDMA IN / PROC fp16 with burst 15, FP32TOFP16_EN kept, 6 real of 8 channels, BS / BN / EW bypassed
        assert twin[("DPU", "DATA_FORMAT")] == 0x48000002
        assert twin[("DPU_RDMA", "FEATURE_MODE_CFG")] == 0x17841
        assert twin[("DPU", "OUT_CVT_SCALE")] == 0x10001
        assert twin[("DPU", "DATA_CUBE_CHANNEL")] == 0x50007
        assert twin[("DPU_RDMA", "DATA_CUBE_CHANNEL")] == 7 and twin[("DPU", "WDMA_SIZE_0")] & 0x1FFF == 7
        assert (twin[("DPU", "BS_CFG")], twin[("DPU", "BN_CFG")], twin[("DPU", "EW_CFG")]) == (0x53, 0x53, 0x383)
        width, height = task.field("DPU", "DATA_CUBE_WIDTH", "WIDTH"), task.field("DPU", "DATA_CUBE_HEIGHT", "HEIGHT")
        assert twin[("DPU", "SURFACE_ADD")] >> 4 == task.signed("DPU", "SURFACE_JUMP") + (width + 1) * (height + 1)


def test_the_twins_re_pack_into_the_vendors_words_word_for_word():
    for task in _fp16_copies():
        writes = copy_vendor_writes(_twin(task), OWN, "twin", None)
        assert [(block, name) for block, name, _ in writes] == FRAME
        for block, name, value in writes:
            expected = 0 if name.startswith("RSV_") else task.values[(block, name)]
            assert value == expected, (task.where, block, name, hex(value), hex(expected))


def _with(task, **changes):
    values = dict(task.values)
    for key, value in changes.items():
        block, name = key.split("__")
        values[(block, name)] = value
    return type(task)(task.regmap, task.where, values, task.kept, task.enable)


@pytest.mark.parametrize(("changes", "match"), [
    ({"DPU__ACT_CFG": 0x902}, "DPU-only copy with DPU.ACT_CFG"),
    ({"DPU_RDMA__FEATURE_MODE_CFG": 0x00049}, "DPU_RDMA FEATURE_MODE_CFG 0x49"),      # int8 read into an fp16 copy
    ({"DPU_RDMA__BRDMA_CFG": 0x2}, "precision 2, DPU_RDMA FEATURE_MODE_CFG 0x10049"),  # fp16 copies take no record
])
def test_an_fp16_copy_with_another_word_is_refused_by_name(changes, match):
    with pytest.raises(UnsupportedProgramError, match=match):
        copy_specs(_with(_fp16_copies()[0], **changes), lambda address, size: bytes(size))


def test_npuemus_fp16_copy_other_than_plain_is_refused():
    twin = {**_twin(_fp16_copies()[0]), ("DPU", "BS_CFG"): 0x52, ("DPU", "BS_ALU_CFG"): 0x3C00}
    with pytest.raises(UnsupportedProgramError, match="or an fp16 plain one"):
        copy_vendor_writes(twin, OWN, "twin", bytes(64))
