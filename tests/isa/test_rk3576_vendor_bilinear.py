"""The vendor's rk3576 bilinear Resize tasks translate to their rk3588 twins register for register (emulator/
REGISTER_SEMANTICS.md 56.2; isa/rknn/rk3576_bilinear.py). The files are tests/emulator/test_rknn_rk3576_bilinear.py's
(how they were made is said there); both programs have the same tasks in the same order, read here with the group
overlay (task n on top of task n - 2, REGISTER_SEMANTICS.md 1.1: every task starts the DPU blocks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_bilinear import is_edge_copy, is_phase_conv, surface_add
from npuemu.isa.rknn.rk3576_program import translate_task
from tests.isa.test_rk3576_vendor_resize import _twin_values, _vendor_tasks  # (the same fixture folder)

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR, RK3588 = load_regmap("rk3576_vendor"), load_regmap("rk3588")
#: not compared: S_POINTER (the driver's; the twin's conv tasks leave it), CONV_CON2 (unread, 2.6)
UNREAD = {("CNA", "S_POINTER"), ("CORE", "S_POINTER"), ("CNA", "CONV_CON2")}
#: ... and in the fp16 phase conv, which reads nothing through the DPU_RDMA (no record, a flying conv): the words
#: the twin does not write there (the copy's two tasks before remain) and the translation writes as the vendor's
IDLE_RDMA = {("DPU_RDMA", name) for name in ("DATA_CUBE_WIDTH", "DATA_CUBE_HEIGHT", "SRC_BASE_ADDR", "SURF_NOTCH",
                                             "FEATURE_MODE_CFG")}


def _zero_shift(address: int, size: int) -> bytes:
    """The BS shift word of the int8 phase conv: 0 in its twin (DATA_FORMAT 0), which is what is compared."""
    return bytes(size)


@pytest.mark.parametrize("name", ["bilinear_int8", "bilinear_fp16"])
def test_the_vendors_edge_copies_and_phase_convs_translate_to_their_twins(name):
    tasks, twins = _vendor_tasks(name), _twin_values(name)
    assert len(tasks) == len(twins) == 9
    assert [is_edge_copy(task) for task in tasks] == [True] * 5 + [False] * 4
    assert [is_phase_conv(task) for task in tasks] == [False] * 5 + [True] * 4
    skipped = UNREAD | (IDLE_RDMA if name.endswith("fp16") else set())
    for position, (task, twin) in enumerate(zip(tasks, twins)):
        writes = translate_task(task, RK3588, _zero_shift)
        differ = [(block, register, hex(value), hex(twin.get((block, register), 0)))
                  for block, register, value in writes
                  if (block, register) not in skipped and value != twin.get((block, register), 0)]
        assert not differ, (name, position, differ)


def test_the_line_notch_and_the_surface_step():
    """0x5078 is the twin's LINE_NOTCH_ADDR (bits 31:19 of SRC_DMA_CFG); 0x40B8 the twin's SURF_ADD less the lines
    of the WDMA's cube, W + notch apart (a 1-row edge copy's DPU cube is taller than what it writes)."""
    tasks, twins = _vendor_tasks("bilinear_int8"), _twin_values("bilinear_int8")
    notches = [task.values[("DPU_RDMA", "LINE_NOTCH")] for task in tasks[:5]]
    assert notches == [0, 0, 0, 11, 11]
    assert [twin[("DPU_RDMA", "SRC_DMA_CFG")] >> 19 for twin in twins[:5]] == notches
    for task, twin in zip(tasks, twins):
        assert surface_add(task) == twin[("DPU", "SURFACE_ADD")] >> 4
