"""The fp chain's fused loop (kernels/dpu_fp_fused.py, issue 20) bit for bit: against a scalar numpy
model of NUMERICS.md 4.6 (BS, BN, EW) and 5.1 (the LUT) written in the tests (test_dpu_fp_chain's
stage model, reference/lut_fp16's LUT), and against the chain's passes it replaces
(``dpu_fp_chain._run_chain``, every bit, NaN payloads included): every form of ``FORMS``, channel
counts not a multiple of 8, 1x1 and wider maps, per-channel and per-tensor operands, ReLU / ReLUX,
EW operands of one value, one a channel or one a pixel, NaN / inf / -0 / subnormal inputs."""

from __future__ import annotations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, LutConfig, XStageConfig
from npuemu.emulator.kernels import dpu_fp_fused as fused
from npuemu.emulator.kernels.dpu_fp_chain import NO_LUT, FloatChain, _run_chain
from npuemu.emulator.kernels.lut_fp import prepared
from tests.emulator.reference.lut_fp16 import lut_float
from tests.emulator.test_dpu_fp_chain import ew_stage, x_stage
from tests.emulator.test_kernels_lut import reference_config, tables

F = np.float32
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 65504.0, -65520.0, 0.5], np.float32)
# an X stage kind's (ALU on, MUL on, MUL first)
_X_FLAGS = {fused.XK_NONE: (False, False, False), fused.XK_ADD: (True, False, False),
            fused.XK_MUL: (False, True, False), fused.XK_MUL_ADD: (True, True, True),
            fused.XK_ADD_MUL: (True, True, False)}
_EW_ALGO = {fused.EK_MAX: nm.ALU_MAX, fused.EK_MIN: nm.ALU_MIN, fused.EK_ADD: nm.ALU_ADD,
            fused.EK_MINUS: nm.ALU_MINUS, fused.EK_NONE: nm.ALU_ADD, fused.EK_MUL: nm.ALU_ADD}


def _values(rng, shape, scale) -> np.ndarray:
    out = (rng.standard_normal(shape) * scale).astype(np.float32)
    where = rng.random(shape) < 0.15
    out[where] = rng.choice(SPECIALS, int(where.sum()))
    return out


def _relu(draw, allowed: bool) -> dict:
    if not allowed:
        return {"relu": False, "relux": False, "relux_value": 0.0}
    return {"relu": draw(st.booleans()), "relux": draw(st.booleans()),
            "relux_value": draw(st.sampled_from([6.0, 0.0, -0.0, 1e-40, -2.5]))}


@st.composite
def cases(draw):
    """(form index, cube, X stages as FloatChain.x_stage arguments, EW (config, operand) or None, LUT
    (config, LE, LO) or None)."""
    index = draw(st.integers(0, len(fused.FORMS) - 1))
    x1, x2, lut_on, ew_kind = fused.FORMS[index]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    channels = draw(st.sampled_from([1, 3, 8, 13, 21]))
    height, width = draw(st.sampled_from([(1, 1), (1, 2), (2, 2), (1, 3), (2, 17), (4, 9), (1, 40)]))
    scale = draw(st.sampled_from([3.0, 3000.0, 2.0**20]))
    shape = (channels, height, width)
    relus = not lut_on
    stages = []  # (a form whose BS does nothing has a BN that does nothing either)
    for kind in (x1, x2):
        if kind == fused.XK_NONE and not draw(st.booleans()):
            continue  # (an unused stage: none at all, or one with nothing but ReLU on)
        alu_on, mul_on, mul_first = _X_FLAGS[kind]
        config = XStageConfig(alu_enable=alu_on, alu_algo=nm.ALU_ADD, mul_enable=mul_on, **_relu(draw, relus))
        per_channel = draw(st.booleans())
        alu = _values(rng, channels, 4) if per_channel else F(rng.standard_normal() * 4)
        mul = _values(rng, channels, 2) if per_channel else F(rng.choice([1.0, -0.0, 0.5, 3.0]))
        stages.append((config, alu, mul, mul_first))
    ew = None
    if ew_kind != fused.EK_NONE or draw(st.booleans()):
        operand_shape = draw(st.sampled_from([(1, 1, 1), (channels, 1, 1)] + ([] if lut_on else [shape])))
        config = EwConfig(op_enable=ew_kind != fused.EK_NONE, op_type=int(ew_kind == fused.EK_MUL),
                          alu_algo=_EW_ALGO[ew_kind], **_relu(draw, relus))
        ew = (config, _values(rng, operand_shape, 4))
    lut = None
    if lut_on:
        config = LutConfig(le=draw(tables()), lo=draw(tables()), hybrid_priority=draw(st.integers(0, 1)),
                           uflow_priority=draw(st.integers(0, 1)), oflow_priority=draw(st.integers(0, 1)))
        lut = (config, rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16),
               rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16))
    return index, _values(rng, shape, scale), stages, ew, lut


def _chain(data, stages, ew) -> FloatChain:
    chain = FloatChain(data)
    for config, alu, mul, mul_first in stages:
        chain.x_stage(config, alu, mul, mul_first)
    if ew is not None:
        chain.ew(*ew)
    return chain


def _fused(chain: FloatChain, data, stages, ew, lut, form: int) -> np.ndarray:
    x_params, x_relux, alu, mul, _, e_params, e_relux, _ = chain.settings()
    packed, params = NO_LUT if lut is None else prepared(*lut)
    operand = (np.ones((1, 1, 1), np.float32) if ew is None else ew[1]).reshape(-1)
    out = np.empty(data.size, np.float32)
    done = fused.fused_chain(data.reshape(-1), out, data.shape[0], data.shape[1] * data.shape[2],
                             x_params.reshape(-1), x_relux, alu.reshape(-1), mul.reshape(-1), e_params, e_relux, form,
                             operand.size == data.size, packed, params, operand)
    return out.reshape(data.shape) if done else None


def _passes(chain: FloatChain, data, lut) -> np.ndarray:
    x_params, x_relux, alu, mul, stages, e_params, e_relux, layout = chain.settings()
    packed, params = NO_LUT if lut is None else prepared(*lut)
    out = np.empty(data.size, np.float32)
    _run_chain(data.reshape(-1), x_params.reshape(-1), x_relux, alu.reshape(-1), mul.reshape(-1), stages, e_params,
               e_relux, layout, chain._operand.reshape(-1), packed, params, out, np.empty(8192, np.float32))
    return out.reshape(data.shape)


def _model(data, stages, ew, lut) -> np.ndarray:
    out = np.empty_like(data)
    cfg = None if lut is None else (reference_config(lut[0]), lut[1].tolist(), lut[2].tolist())
    for (c, y, x), value in np.ndenumerate(data):
        v = F(value)
        for config, alu, mul, mul_first in stages:
            v = x_stage(v, config, alu[c] if np.ndim(alu) else alu, mul[c] if np.ndim(mul) else mul, mul_first)
        if cfg is not None:
            with np.errstate(all="ignore"):
                v = lut_float(v, cfg[1], cfg[2], cfg[0])
        if ew is not None:
            config, operand = ew
            v = ew_stage(v, config, operand[tuple(i if n > 1 else 0 for i, n in zip((c, y, x), operand.shape))])
        out[c, y, x] = v
    return out


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    nan = np.isnan(want)
    return bool(np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)) and np.isnan(got[nan]).all())


@settings(max_examples=120, deadline=None)
@given(cases())
def test_fused_chain_matches_the_model_and_the_passes(case):
    index, data, stages, ew, lut = case
    chain = _chain(data, stages, ew)
    x_params, _, _, _, count, e_params, _, _ = chain.settings()
    operand = fused.operand_form(data.shape, (1, 1, 1) if ew is None else ew[1].shape)
    plane = data.shape[1] * data.shape[2]
    assert fused.form_of(x_params, count, e_params, lut is not None, operand, plane) == (index if plane >= 32 else -1)
    got = _fused(chain, data, stages, ew, lut, index)  # (any map: the fused loop itself takes small ones too)
    if got is None:  # (a LUT whose table choice has several thresholds: the passes run it)
        assert lut is not None and index in (0, 1)
        return
    event(f"form {index} run")
    assert np.array_equal(got.view(np.uint32), _passes(chain, data, lut).view(np.uint32))
    assert _same(got, _model(data, stages, ew, lut))


def test_forms_not_taken():
    data = np.zeros((3, 4, 8), np.float32)
    add = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD)
    for config in (XStageConfig(alu_enable=True, alu_algo=nm.ALU_DIV),  # an ALU other than add
                   XStageConfig(mul_enable=True, prelu=True)):  # PReLU
        chain = _chain(data, [(config, 1.0, 2.0, False)], None)
        x_params, _, _, _, count, e_params, _, _ = chain.settings()
        assert fused.form_of(x_params, count, e_params, False, fused.TENSOR, 32) == -1
    chain = _chain(data, [(add, 1.0, 1.0, False)], (EwConfig(op_enable=True, alu_algo=nm.ALU_DIV), np.ones((1, 1, 1))))
    x_params, _, _, _, count, e_params, _, _ = chain.settings()
    assert fused.form_of(x_params, count, e_params, False, fused.TENSOR, 32) == -1
    chain = _chain(data, [(add, 1.0, 1.0, False)], None)
    x_params, _, _, _, count, e_params, _, _ = chain.settings()
    assert fused.form_of(x_params, count, e_params, False, fused.TENSOR, 32) == 2
    assert fused.form_of(x_params, count, e_params, False, fused.TENSOR, 14) == -1  # (a small map)
    # (maps of 1, 2 or 4 pixels run fused where the caller asks, the LUT forms apart)
    assert [fused.form_of(x_params, count, e_params, False, fused.TENSOR, plane, tiny=True)
            for plane in (1, 2, 3, 4, 14)] == [2, 2, -1, 2, -1]
    assert fused.form_of(x_params, count, e_params, True, fused.TENSOR, 4, tiny=True) == -1
    assert fused.form_of(x_params, count, e_params, False, -1, 32) == -1  # (an operand broadcast otherwise)
    relu = _chain(data, [(add, 1.0, 1.0, False), (XStageConfig(mul_enable=True, relu=True), 1.0, 2.0, True)],
                  (EwConfig(op_enable=True, op_type=1), np.ones((1, 1, 1))))
    x_params, _, _, _, count, e_params, _, _ = relu.settings()
    assert fused.form_of(x_params, count, e_params, True, fused.TENSOR, 32) == -1  # (a LUT form with ReLU)
    assert fused.operand_form((3, 4, 8), (1, 4, 8)) == -1 and fused.operand_form((3, 4, 8), (3, 4, 8)) == fused.PIXEL
