"""The task-program step of a flying integer DPU task with an fp16 output (issue 20:
units/dpu_plan_convert.py, kernels/dpu_int_to_fp16_step.py; ppocr_rec int8's conversions into its
float islands). The step must leave memory exactly as the full unit path (``units.dpu.run_dpu``)
does - random settings of every stage it takes, register and BRDMA operands, int8 and int16 inputs,
odd sizes, padded surfaces and line / surface notches - and its kernel must match a model of
NUMERICS.md 4.2 / 26 written here with Python integers (BN then the conversion). task_step must
route the form to it, and leave the forms it does not take (the LUT, ERDMA operands) to the full path."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator import task_plan
from npuemu.emulator.kernels.dpu import _x_params as x_params
from npuemu.emulator.kernels.dpu_int_to_fp16_step import int_atoms_to_planes
from npuemu.emulator.memory import Memory, TaskDma
from npuemu.emulator.numerics import ROUND_HALF_AWAY, out_cvt_round_mode
from npuemu.emulator.units import dpu
from npuemu.emulator.units.dpu_plan_convert import prepare_int_to_fp16
from npuemu.emulator.units.state import (
    FP16, INT8, INT16, DpuRdmaState, DpuState, EwState, LutState, LutTableState, OutCvtState, XStageState,
)
from tests.emulator.test_dpu_int_to_fp16_pass import reference as convert_reference

SRC, BIAS, DST, MEMORY = 0x1000, 0x40000, 0x60000, 1 << 20
WHERE = "test task"
_OFF = XStageState(bypass=True, alu_bypass=True, alu_algo=0, alu_from_dma=False, alu_operand=0, mul_bypass=True,
                   mul_from_dma=False, mul_operand=0, shift_positive=0, shift_negative=0, prelu=False,
                   relu_bypass=True, relux=False, relux_value=0)
_EW_OFF = EwState(bypass=True, op_bypass=True, op_from_dma=False, op_type=0, alu_algo=0, op_value=0, cvt_bypass=True,
                  cvt_offset=0, cvt_scale=1, cvt_shift=0, cvt_round=0, truncate_positive=0, truncate_negative=0,
                  prelu=False, relu_bypass=True, relux=False, relux_value=0, lut_bypass=True)
_TABLE = LutTableState(start=0, end=0, index_select=0, uflow_scale=0, uflow_shift=0, oflow_scale=0, oflow_shift=0)
_LUT = LutState(le=_TABLE, lo=_TABLE, hybrid_priority=0, uflow_priority=0, oflow_priority=0)
# the ALU algorithms of the integer stages (numerics.alu_int: max, min, add, div, minus, abs, neg, floor, ceil)
_ALGOS = st.integers(0, 8)


def _states(channels, height, width, precision, bs, bn, ew, cvt, notch=(0, 0), size_e=0, brdma_use=0,
            line_notch=0) -> tuple[DpuState, DpuRdmaState]:
    lanes = 16 // (2 if precision == INT16 else 1)
    line = (width + notch[0]) * 16
    surface = line * height + notch[1] * 16
    state = DpuState(flying=True, to_memory=True, to_ppu=False, conv_mode=0, in_precision=precision,
                     proc_precision=precision, out_precision=FP16, width=width, height=height, channels=channels,
                     orig_channels=channels, dst_address=DST, dst_surface_stride=(width + line_notch) * height * 16,
                     surface_add=(width + line_notch) * height * 16 * (size_e + 1), size_e=size_e, bs=bs, bn=bn,
                     ew=ew, lut=_LUT, out_cvt=cvt, line_notch=line_notch)
    rdma = DpuRdmaState(width=width, height=height, channels=channels, main_enabled=True, flying=True, comb_use=0,
                        in_precision=precision, src_address=SRC, line_stride=line, surface_stride=surface,
                        brdma_use=brdma_use, bs_address=BIAS, nrdma_use=0, bn_address=0, erdma_enabled=False,
                        erdma_mode=0, erdma_size=0, ew_address=0, ew_line_stride=line, ew_surface_stride=0,
                        ew_notch_stride=line)
    assert -(-channels // lanes) * surface < BIAS - SRC
    return state, rdma


def _memory(seed: int) -> Memory:
    memory = Memory(MEMORY)
    memory.load(0, np.random.default_rng(seed).integers(0, 256, MEMORY, dtype=np.uint8))
    return memory


def _full(state, rdma, memory) -> None:
    dpu.run_dpu(state, rdma, None, TaskDma(memory, WHERE), np.zeros((2, 513), np.int16), WHERE)


def _x_stage(draw, brdma: bool) -> tuple[XStageState, int]:
    """A random BS / BN stage (``brdma``: BS, which may take ALU / MUL from the BRDMA); its BRDMA bits."""
    if draw(st.booleans()):
        return _OFF, 0
    alu_bypass, mul_bypass = draw(st.booleans()), draw(st.booleans())
    # (an operand from the BRDMA only where its unit is on: run_dpu reads a bypassed one from the
    # blob too, which does not hold it - a KeyError)
    alu_dma, mul_dma = (draw(st.booleans()) and not alu_bypass, draw(st.booleans()) and not mul_bypass) if brdma \
        else (False, False)
    relux = draw(st.booleans())
    stage = XStageState(bypass=False, alu_bypass=alu_bypass, alu_algo=draw(_ALGOS), alu_from_dma=alu_dma,
                        alu_operand=draw(st.integers(-(2**31), 2**31 - 1)), mul_bypass=mul_bypass,
                        mul_from_dma=mul_dma, mul_operand=draw(st.integers(-(2**15), 2**15 - 1)),
                        shift_positive=draw(st.integers(0, 40)), shift_negative=draw(st.integers(0, 31)),
                        prelu=draw(st.booleans()), relu_bypass=draw(st.booleans()), relux=relux,
                        relux_value=draw(st.integers(-1000, 1000)))
    return stage, (1 if alu_dma else 0) | (4 if mul_dma else 0)


@st.composite
def tasks(draw):
    precision = draw(st.sampled_from([INT8, INT16]))
    channels, height, width = draw(st.integers(1, 40)), draw(st.integers(1, 5)), draw(st.integers(1, 23))
    bs, brdma_use = _x_stage(draw, True)
    bn, _ = _x_stage(draw, False)
    ew = _EW_OFF
    if draw(st.booleans()):
        ew = replace(_EW_OFF, bypass=False, op_bypass=draw(st.booleans()), op_type=draw(st.integers(0, 1)),
                     alu_algo=draw(_ALGOS), op_value=draw(st.integers(-(2**31), 2**31 - 1)),
                     cvt_bypass=draw(st.booleans()), cvt_offset=draw(st.integers(-(2**15), 2**15 - 1)),
                     cvt_scale=draw(st.integers(-(2**15), 2**15 - 1)), cvt_shift=draw(st.integers(0, 31)),
                     cvt_round=draw(st.integers(0, 1)), truncate_positive=draw(st.integers(0, 40)),
                     truncate_negative=draw(st.integers(0, 31)), prelu=draw(st.booleans()),
                     relu_bypass=draw(st.booleans()), relux=draw(st.booleans()),
                     relux_value=draw(st.integers(-1000, 1000)))
    cvt = OutCvtState(scale=draw(st.integers(-(2**15), 2**15 - 1)), shift=draw(st.integers(0, 40)), offset=0,
                      round_bit=draw(st.integers(0, 1)), fp32_to_fp16=True, minus_exp=draw(st.integers(0, 31)))
    notch = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    return _states(channels, height, width, precision, bs, bn, ew, cvt, notch, size_e=draw(st.integers(0, 2)),
                   brdma_use=brdma_use, line_notch=draw(st.integers(0, 2)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks(), st.integers(0, 2**31))
def test_the_step_leaves_memory_as_the_full_path(task, seed):
    state, rdma = task
    full, fast = _memory(seed), _memory(seed)
    step = prepare_int_to_fp16(state, rdma, fast, WHERE)
    assert step is not None
    for run in range(2):  # (the second run reads new inputs: the rows are read as each run finds them)
        if run:
            cube = np.random.default_rng(seed + 1).integers(0, 256, BIAS - SRC, dtype=np.uint8)
            full.load(SRC, cube)
            fast.load(SRC, cube)
        _full(state, rdma, full)
        step(None)
        assert np.array_equal(full.dump(0, MEMORY), fast.dump(0, MEMORY))


def _model(values: np.ndarray, alu: int, scale: int, shift: int, round_bit: int, minus_exp: int) -> np.ndarray:
    """BN ALU add alone (NUMERICS.md 4.2: the sum saturated to int32), then the conversion (NUMERICS.md 26)."""
    half_away = out_cvt_round_mode(round_bit) == ROUND_HALF_AWAY
    out = []
    for v in values.reshape(-1).tolist():
        total = min(max(v + alu, -(2**31)), 2**31 - 1)
        out.append(convert_reference(total, scale, shift, half_away, minus_exp))
    return np.array(out, np.float16).reshape(values.shape)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 35), st.integers(1, 3), st.integers(1, 2100), st.integers(-(2**31), 2**31 - 1),
       st.integers(-(2**15), 2**15 - 1), st.integers(0, 40), st.integers(0, 1), st.integers(0, 25),
       st.integers(0, 2**31))
def test_the_kernel_matches_an_integer_model(channels, height, width, alu, scale, shift, round_bit, minus_exp, seed):
    """BN add and the conversion from int8 atoms (rows of up to 2100 pixels: more than the kernel's
    2048-element block, so blocks start mid-row), against the model above."""
    width = min(width, 2100 // height)
    rng = np.random.default_rng(seed)
    lanes, surfaces = 16, -(-channels // 16)
    cube = rng.integers(-128, 128, (channels, height, width))
    cube[:, 0, 0] = rng.choice([-128, 127, 0])  # (the extremes)
    atoms = np.zeros((surfaces * lanes, height, width), np.int8)
    atoms[:channels] = cube
    region = np.concatenate([np.zeros(7, np.int8),  # (rows at an odd offset)
                             atoms.reshape(surfaces, lanes, height, width).transpose(0, 2, 3, 1).reshape(-1)])
    offsets = 7 + np.arange(surfaces * height, dtype=np.int64) * width * lanes
    bn = x_params(dpu._x_config(replace(_OFF, bypass=False, alu_bypass=False, alu_algo=2,
                                                     alu_operand=alu)))
    operands = np.zeros((2, channels), np.int64)
    operands[0] = alu
    zero = np.zeros((1, height * width), np.int32)
    out = np.empty((channels, height * width), np.float32)
    half_away = out_cvt_round_mode(round_bit) == ROUND_HALF_AWAY
    int_atoms_to_planes(region, offsets, height, lanes, None, np.zeros((3, channels), np.int64), bn, operands, zero,
                        None, np.int64(scale), shift, half_away, np.float32(2.0 ** -minus_exp), bool(minus_exp), out)
    with np.errstate(over="ignore"):
        got = out.astype(np.float16).reshape(cube.shape)  # (the planes before the store's fp16 rounding)
    want = _model(cube, alu, scale, shift, round_bit, minus_exp)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def _routed(state, rdma) -> object:
    states = {"conv": None, "dpu": state, "dpu_rdma": rdma, "ppu": None, "ppu_rdma": None, "ppu_kind": None}
    return task_plan.task_step(states, _memory(0), WHERE, np.zeros((2, 513), np.int16))


def test_task_step_routes_the_conversion_to_the_step(monkeypatch):
    """ppocr_rec int8's form (BN ALU add, OUT_CVT with MINUS_EXP) is a step, and it writes what the
    full path writes; with the LUT on, or an ERDMA operand, task_step hands back None."""
    bn = replace(_OFF, bypass=False, alu_bypass=False, alu_algo=2, alu_operand=-19)
    cvt = OutCvtState(scale=26171, shift=0, offset=0, round_bit=0, fp32_to_fp16=True, minus_exp=18)
    state, rdma = _states(384, 1, 40, INT8, _OFF, bn, _EW_OFF, cvt)
    built = []
    inner = prepare_int_to_fp16

    def counted(*args):
        built.append(inner(*args))
        return built[-1]

    import npuemu.emulator.units.dpu_plan_convert as module
    monkeypatch.setattr(module, "prepare_int_to_fp16", counted)
    step = _routed(state, rdma)
    assert step is not None and built and built[0] is not None
    full, fast = _memory(0), _memory(0)
    _full(state, rdma, full)
    prepare_int_to_fp16(state, rdma, fast, WHERE)(None)
    assert np.array_equal(full.dump(0, MEMORY), fast.dump(0, MEMORY))
    lut = replace(_EW_OFF, bypass=False, lut_bypass=False)
    assert _routed(replace(state, ew=lut), rdma) is None
    erdma = replace(_EW_OFF, bypass=False, op_bypass=False, op_from_dma=True)
    assert _routed(replace(state, ew=erdma), rdma) is None


@pytest.mark.parametrize("broken", ["shift", "rows"])
def test_the_comparison_catches_a_broken_step(monkeypatch, broken):
    """A step reading its main rows one surface off, or converting with SHIFT 0, differs from the full path."""
    import npuemu.emulator.units.dpu_plan_convert as module
    bn = replace(_OFF, bypass=False, alu_bypass=False, alu_algo=2, alu_operand=5)
    cvt = OutCvtState(scale=3000, shift=4, offset=0, round_bit=0, fp32_to_fp16=True, minus_exp=3)
    state, rdma = _states(40, 3, 7, INT8, _OFF, bn, _EW_OFF, cvt)
    inner = module.convert_store  # (int_atoms_to_planes, then the store; the same leading arguments)

    def wrong(region, offsets, height, lanes, *rest):
        if broken == "rows":
            offsets = offsets[::-1].copy()
        else:
            rest = rest[:7] + (0,) + rest[8:]
        inner(region, offsets, height, lanes, *rest)

    monkeypatch.setattr(module, "convert_store", wrong)
    full, fast = _memory(3), _memory(3)
    _full(state, rdma, full)
    prepare_int_to_fp16(state, rdma, fast, WHERE)(None)
    assert not np.array_equal(full.dump(0, MEMORY), fast.dump(0, MEMORY))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks(), st.integers(0, 2**31))
def test_the_steps_batch_op_leaves_memory_as_the_full_path(task, seed):
    """The step's ``step.batch`` (its drop, then its call as a kernels/step_batch_fp16.py CONVERT op in a
    ``run_fp16_ops`` call) leaves memory as the full path; an op is made for every int8 task without an
    EW stage (BS and BN each on or off), none for the others (they stay steps)."""
    from npuemu.emulator.kernels import step_batch_fp16

    state, rdma = task
    full, fast = _memory(seed), _memory(seed)
    step = prepare_int_to_fp16(state, rdma, fast, WHERE)
    rows = step_batch_fp16.encoded_calls(step.batch[1])
    assert (rows is not None) == (state.in_precision == INT8 and state.ew.bypass)
    if rows is None:
        return
    table, spare = np.array(rows), np.zeros(1, np.float32)
    for run in range(2):  # (the second run reads new inputs, as the step's test)
        if run:
            cube = np.random.default_rng(seed + 1).integers(0, 256, BIAS - SRC, dtype=np.uint8)
            full.load(SRC, cube)
            fast.load(SRC, cube)
        _full(state, rdma, full)
        step.batch[0](None)
        assert step_batch_fp16.entry()(table, 0, 1, spare, spare, spare, spare) == 1
        assert np.array_equal(full.dump(0, MEMORY), fast.dump(0, MEMORY))
