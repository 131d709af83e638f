"""Hand-built DPU-only (flying mode) and PPU tasks against the independent references."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from tests.emulator.test_machine_support import (
    MASK_CONV, MASK_FLYING, MASK_POOL, BsParams, ConvSpec, bias_blob, bs_reference, conv_task,
    ew_convert_reference, flying_task, load_cube, out_cvt_reference, pack_conv_weights, pool_reference,
    pool_task, read_cube, run_tasks, sat32, shift_half_away, to_nc1hwc2,
)

IN0, IN1, OUT = 0x10000, 0x80000, 0x100000


def machine() -> Machine:
    return Machine.for_platform("rk3588", ddr_size=16 << 20)


def flying_add(width: int, height: int, channels: int, src: int, operand: int, dst: int):
    """A flying Add of the cube at ``src`` and the ERDMA operand at ``operand``: BS ALU -7 and MUL
    9000 (shift 2, 3 below zero) on the main cube, the operand converted (offset 11, scale 20000,
    shift 3), OUT_CVT 20000 >> 18 plus 3, rounding away from zero."""
    t = flying_task(width, height, channels, src=src, dst=dst)
    t.set("DPU", "BS_CFG", BS_ALU_ALGO=2, BS_RELU_BYPASS=1)
    t.set("DPU", "BS_ALU_CFG", -7 & 0xFFFFFFFF)
    t.set("DPU", "BS_MUL_CFG", BS_MUL_OPERAND=9000, BS_MUL_SHIFT_VALUE=2)
    t.set("DPU", "DATA_FORMAT", BS_MUL_SHIFT_VALUE_NEG=3)
    t.set("DPU", "EW_CFG", EW_CVT_ROUND=1, EW_DATA_MODE=1, EDATA_SIZE=1, EW_ALU_ALGO=2, EW_LUT_BYPASS=1,
          EW_OP_SRC=1)
    t.set("DPU", "EW_CVT_OFFSET_VALUE", 11)
    t.set("DPU", "EW_CVT_SCALE_VALUE", EW_OP_CVT_SHIFT=3, EW_OP_CVT_SCALE=20000)
    t.set("DPU", "OUT_CVT_OFFSET", 3)
    t.set("DPU", "OUT_CVT_SCALE", OUT_CVT_SCALE=20000)
    t.set("DPU", "OUT_CVT_SHIFT", CVT_ROUND=1, OUT_CVT_SHIFT=18)
    t.set("DPU_RDMA", "ERDMA_CFG", ERDMA_DATA_MODE=1, ERDMA_DATA_SIZE=1)
    t.set("DPU_RDMA", "EW_BASE_ADDR", operand)
    t.set("DPU_RDMA", "EW_SURF_STRIDE", EW_SURF_STRIDE=width * height)
    return t


def test_flying_add_with_operand_converter_relu_and_round_away():
    rng = np.random.default_rng(1)
    channels, height, width = 40, 9, 11  # 40 channels: the last surface is half padding
    a, b = (rng.integers(-128, 128, (channels, height, width)).astype(np.int8) for _ in range(2))
    m = machine()
    load_cube(m, IN0, a)
    load_cube(m, IN1, b)
    t = flying_add(width, height, channels, IN0, IN1, OUT)
    run = run_tasks(m, [t.task(MASK_FLYING)])
    v = bs_reference(a.astype(np.int64), BsParams(alu=-7, mul=9000, shift=2, shift_neg=3))
    v = np.maximum(sat32(v + ew_convert_reference(b, 11, 20000, 3, round_away=True)), 0)
    expected = out_cvt_reference(v, 20000, 18, 3, round_away=True)
    assert np.mean(np.abs(expected) < 127) > 0.3
    np.testing.assert_array_equal(read_cube(m, OUT, channels, height, width), expected)
    # the writer fills the padding lanes of the last surface with 0
    lanes = read_cube(m, OUT, 48, height, width)[40:]
    assert not lanes.any()
    traffic = run.tasks[0].traffic
    assert traffic.main_read == traffic.ew_read == traffic.dpu_write == 3 * height * width * 16


def test_flying_main_cube_honours_surface_notch():
    # A 4-row window of a 10-row tensor: SURF_NOTCH = full surface - window (vendor rep09 chains 1-5)
    rng = np.random.default_rng(2)
    full = rng.integers(-128, 128, (32, 10, 6)).astype(np.int8)
    m = machine()
    load_cube(m, IN0, full)
    rows, first = 4, 3
    t = flying_task(6, rows, 32, src=IN0 + first * 6 * 16, dst=OUT)
    t.set("DPU_RDMA", "SURF_NOTCH", SURF_NOTCH_ADDR=6 * 10 - 6 * rows)
    t.set("DPU", "DST_SURF_STRIDE", DST_SURF_STRIDE=6 * 10).set("DPU", "SURFACE_ADD", SURF_ADD=6 * 10)
    run_tasks(m, [t.task(MASK_FLYING)])
    got = read_cube(m, OUT, 32, 10, 6)[:, :rows]
    np.testing.assert_array_equal(got, full[:, first:first + rows])  # identity: every stage bypassed


@pytest.mark.parametrize("method, kernel, stride, pads, pad_value", [
    ("max", 3, 2, (1, 1, 1, 1), 0),
    ("min", 2, 1, (0, 1, 0, 1), 0),
    ("avg", 2, 2, (0, 0, 0, 0), 0),
    ("avg", 3, 1, (1, 1, 1, 1), -5),  # padding counts at the pad value; RECIP = 21845
])
def test_pooling(method, kernel, stride, pads, pad_value):
    rng = np.random.default_rng(kernel * 10 + stride)
    channels, height, width = 20, 13, 15
    x = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    top, bottom, left, right = pads
    out_h = (height + top + bottom - kernel) // stride + 1
    out_w = (width + left + right - kernel) // stride + 1
    m = machine()
    load_cube(m, IN0, x)
    code = {"avg": 0, "max": 1, "min": 2}[method]
    t = pool_task(width, height, channels, method=code, kernel=kernel, stride=stride, out_w=out_w,
                  out_h=out_h, src=IN0, dst=OUT, pads=pads, pad_value=pad_value)
    run_tasks(m, [t.task(MASK_POOL)])
    got = read_cube(m, OUT, channels, out_h, out_w)
    if method == "min":
        expected = -pool_reference(-x.astype(np.int64), "max", kernel, stride, out_h, out_w, top, left)
    else:
        expected = pool_reference(x, method, kernel, stride, out_h, out_w, top, left, pad_value)
    np.testing.assert_array_equal(got, expected)


def test_pool_reads_a_crop_through_line_and_surface_strides():
    # PPU_RDMA strides are 16-byte atoms: a 5x4 window out of a 9x7 tensor whose surfaces are padded
    rng = np.random.default_rng(3)
    full = rng.integers(-128, 128, (16, 7, 9)).astype(np.int8)
    surface = 9 * 7 + 5  # atoms, five spare atoms between surfaces
    m = machine()
    atoms = to_nc1hwc2(full)
    for group in range(atoms.shape[0]):
        m.memory.load(IN0 + group * surface * 16, atoms[group].tobytes())
    window = IN0 + (2 * 9 + 3) * 16  # row 2, column 3
    t = pool_task(5, 4, 16, method=1, kernel=2, stride=1, out_w=4, out_h=3, src=window, dst=OUT)
    t.set("PPU_RDMA", "SRC_LINE_STRIDE", SRC_LINE_STRIDE=9)
    t.set("PPU_RDMA", "SRC_SURF_STRIDE", SRC_SURF_STRIDE=surface)
    run_tasks(m, [t.task(MASK_POOL)])
    expected = pool_reference(full[:, 2:6, 3:8], "max", 2, 1, 3, 4)
    np.testing.assert_array_equal(read_cube(m, OUT, 16, 3, 4), expected)


def test_conv_then_pool_in_one_chain():
    """Different blocks keep their own ping-pong groups: a PPU task between convs does not
    disturb the CNA/DPU state (REGISTER_SEMANTICS 1)."""
    rng = np.random.default_rng(4)
    spec = ConvSpec(in_c=16, in_h=8, in_w=8, kernels=32, kernel=1, out_scale=1, out_shift=10)
    x = rng.integers(-128, 128, (16, 8, 8)).astype(np.int8)
    w = rng.integers(-10, 11, (32, 16, 1, 1)).astype(np.int8)
    alu, cpend, mul = np.zeros(32, int), np.zeros(32, int), np.full(32, 16384)
    m = machine()
    load_cube(m, spec.feature, x)
    m.memory.load(spec.weights, pack_conv_weights(w).tobytes())
    m.memory.load(spec.bias, bias_blob(alu, cpend, mul))
    spec.bs_shift = 14
    conv = conv_task(spec).task(MASK_CONV)
    pool = pool_task(8, 8, 32, method=1, kernel=2, stride=2, out_w=4, out_h=4, src=spec.output,
                     dst=OUT).task(MASK_POOL)
    run = run_tasks(m, [conv, pool])
    assert [t.groups for t in run.tasks] == [
        {"CNA": 0, "CORE": 0, "DPU": 0, "DPU_RDMA": 0}, {"PPU": 0, "PPU_RDMA": 0}]
    acc = np.einsum("kc,chw->khw", w[:, :, 0, 0].astype(np.int64), x.astype(np.int64))
    conv_out = out_cvt_reference(shift_half_away(acc * 16384, 14), 1, 10, 0)
    np.testing.assert_array_equal(read_cube(m, spec.output, 32, 8, 8), conv_out)
    np.testing.assert_array_equal(read_cube(m, OUT, 32, 4, 4), pool_reference(conv_out, "max", 2, 2, 4, 4))
