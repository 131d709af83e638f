"""The LUT forms on maps of 1, 2 or 4 pixels (kernels/dpu_fp_fused.py ``lut_flat``, issue 20) bit for bit:
against the scalar numpy model of NUMERICS.md 4.6 and 5.1 written in test_dpu_fp_fused (BS, BN, the LUT of
reference/lut_fp16, EW) and against the chain's passes (``dpu_fp_chain._run_chain``, every bit, NaN payloads
included): both LUT forms, any table choice (one threshold or several), per-channel and per-tensor X
operands, EW operands of one value or one a channel, channel counts not a multiple of 8 and the LSTM's
128 / 136, NaN / inf / -0 / subnormal inputs; a NaN operand leaves the step to the passes."""

from __future__ import annotations

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, LutConfig, XStageConfig
from npuemu.emulator.kernels import dpu_fp_fused as fused
from npuemu.emulator.kernels.dpu_fp_chain import CHUNK, NO_LUT
from npuemu.emulator.kernels.lut_fp import prepared
from tests.emulator.test_dpu_fp_fused import _X_FLAGS, _chain, _model, _passes, _same, _values
from tests.emulator.test_kernels_lut import tables


@st.composite
def lut_cases(draw):
    """(form index 0 or 1, cube, X stages, EW (config, operand), LUT (config, LE, LO))."""
    index = draw(st.sampled_from([0, 1]))
    x1, x2, _, _ = fused.FORMS[index]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    channels = draw(st.sampled_from([1, 3, 8, 13, 128, 136]))
    shape = (channels, 1, draw(st.sampled_from([1, 2, 4])))
    stages = []
    for kind in (x1, x2):
        if kind == fused.XK_NONE:
            continue
        alu_on, mul_on, mul_first = _X_FLAGS[kind]
        config = XStageConfig(alu_enable=alu_on, alu_algo=nm.ALU_ADD, mul_enable=mul_on)
        per_channel = draw(st.booleans())
        alu = _values(rng, channels, 4) if per_channel else np.float32(rng.standard_normal() * 4)
        mul = _values(rng, channels, 2) if per_channel else np.float32(rng.choice([1.0, -0.0, 0.5, 3.0]))
        stages.append((config, alu, mul, mul_first))
    operand_shape = draw(st.sampled_from([(1, 1, 1), (channels, 1, 1)]))
    ew = (EwConfig(op_enable=True, op_type=1, alu_algo=nm.ALU_ADD), _values(rng, operand_shape, 4))
    config = LutConfig(le=draw(tables()), lo=draw(tables()), hybrid_priority=draw(st.integers(0, 1)),
                       uflow_priority=draw(st.integers(0, 1)), oflow_priority=draw(st.integers(0, 1)))
    lut = (config, rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16),
           rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16))
    scale = draw(st.sampled_from([3.0, 3000.0, 2.0**20]))
    return index, _values(rng, shape, scale), stages, ew, lut


def _lut_flat(chain, data, lut, form: int) -> np.ndarray:
    _, _, alu, mul, _, _, _, _ = chain.settings()
    packed, params = NO_LUT if lut is None else prepared(*lut)
    out = np.empty(data.size, np.float32)
    scratch = np.full(2 * CHUNK, np.float32(7.0))  # (stale values: nothing may read them)
    done = fused.lut_flat(data.reshape(-1), out, data.shape[0], data.shape[1] * data.shape[2], form,
                          alu.reshape(-1), mul.reshape(-1), packed, params, chain._operand.reshape(-1), scratch)
    return out.reshape(data.shape) if done else None


@settings(max_examples=150, deadline=None)
@given(lut_cases())
def test_lut_flat_matches_the_model_and_the_passes(case):
    index, data, stages, ew, lut = case
    chain = _chain(data, stages, ew)
    x_params, _, _, _, count, e_params, _, _ = chain.settings()
    operand = fused.operand_form(data.shape, ew[1].shape)
    assert fused.form_of(x_params, count, e_params, True, operand, data.shape[2], tiny=True) == index
    got = _lut_flat(chain, data, lut, index)
    if got is None:  # (a NaN operand: the passes run)
        assert any(np.isnan(operand).any() for _, alu, mul, _ in stages for operand in (alu, mul)) \
            or np.isnan(ew[1]).any()
        return
    event("run")
    assert np.array_equal(got.view(np.uint32), _passes(chain, data, lut).view(np.uint32))
    assert _same(got, _model(data, stages, ew, lut))


def test_lut_forms_on_other_small_maps_keep_the_passes():
    data = np.zeros((8, 1, 3), np.float32)
    stages = [(XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD), np.float32(1), np.float32(1), False),
              (XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True), np.float32(1), np.float32(2),
               True)]
    chain = _chain(data, stages, (EwConfig(op_enable=True, op_type=1), np.ones((1, 1, 1), np.float32)))
    x_params, _, _, _, count, e_params, _, _ = chain.settings()
    assert [fused.form_of(x_params, count, e_params, True, fused.TENSOR, plane, tiny=True)
            for plane in (1, 2, 3, 4, 14)] == [0, 0, -1, 0, -1]
    assert fused.form_of(x_params, count, e_params, True, fused.TENSOR, 4) == -1  # (not asked for tiny maps)
