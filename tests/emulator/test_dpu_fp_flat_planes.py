"""The fused forms on maps of 1, 2 or 4 pixels at the LSTM's channel counts (kernels/dpu_fp_fused.py ``_flat``:
forms with X stages on maps of 2 or 4 pixels run a loop over channels, the pixels an inner loop; issue 20) bit
for bit against the scalar numpy model of NUMERICS.md 4.6 / 5.1 written in test_dpu_fp_fused and against the
chain's passes: every form, per-channel and per-tensor X operands, EW operands of one value, one a channel or
one a pixel, channel counts not a multiple of 8 and silero-vad's 128 / 136 / 144, NaN / inf / -0 / subnormal
inputs. NaNs are compared as NaNs, not by payload: where two NaNs meet in a product or a sum, x86 returns the
first and LLVM may swap the operands, so the vectorised loops and the passes can differ in a NaN's sign (the
one-loop ``_flat`` before this change too, e.g. 136 x 1 x 1 BS multiply then BN); the fp16 stores make every
NaN canonical."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, XStageConfig
from npuemu.emulator.kernels import dpu_fp_fused as fused
from tests.emulator.test_dpu_fp_fused import _EW_ALGO, _X_FLAGS, _chain, _fused, _model, _passes, _same, _values


@st.composite
def flat_cases(draw):
    """(form index, cube of 1, 2 or 4 pixels, X stages, EW (config, operand) or None); the LUT forms apart
    (test_dpu_fp_lut_flat.py)."""
    index = draw(st.integers(2, len(fused.FORMS) - 1))
    x1, x2, _, ew_kind = fused.FORMS[index]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    channels = draw(st.sampled_from([1, 5, 8, 13, 128, 136, 144]))
    shape = (channels,) + draw(st.sampled_from([(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1)]))
    stages = []
    for kind in (x1, x2):
        if kind == fused.XK_NONE:
            continue
        alu_on, mul_on, mul_first = _X_FLAGS[kind]
        relu = {"relu": draw(st.booleans()), "relux": draw(st.booleans()),
                "relux_value": draw(st.sampled_from([6.0, 0.0, -0.0, -2.5]))}
        config = XStageConfig(alu_enable=alu_on, alu_algo=nm.ALU_ADD, mul_enable=mul_on, **relu)
        per_channel = draw(st.booleans())
        alu = _values(rng, channels, 4) if per_channel else np.float32(rng.standard_normal() * 4)
        mul = _values(rng, channels, 2) if per_channel else np.float32(rng.choice([1.0, -0.0, 0.5, 3.0]))
        stages.append((config, alu, mul, mul_first))
    ew = None
    if ew_kind != fused.EK_NONE:
        operand_shape = draw(st.sampled_from([(1, 1, 1), (channels, 1, 1), shape]))
        config = EwConfig(op_enable=True, op_type=int(ew_kind == fused.EK_MUL), alu_algo=_EW_ALGO[ew_kind])
        ew = (config, _values(rng, operand_shape, 4))
    scale = draw(st.sampled_from([3.0, 3000.0, 2.0**20]))
    return index, _values(rng, shape, scale), stages, ew


@settings(max_examples=150, deadline=None)
@given(flat_cases())
def test_flat_maps_match_the_model_and_the_passes(case):
    index, data, stages, ew = case
    chain = _chain(data, stages, ew)
    got = _fused(chain, data, stages, ew, None, index)
    assert got is not None
    assert _same(got, _passes(chain, data, None))
    assert _same(got, _model(data, stages, ew, None))
