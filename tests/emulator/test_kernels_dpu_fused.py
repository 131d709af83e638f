"""The fused integer DPU pass (``int_stages``: BS -> BN -> EW -> OUT_CVT in one loop) against
the per-element reference chain (NUMERICS.md 4), including cubes wider than one block."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import EwConfig, OutCvtConfig
from npuemu.emulator.kernels.dpu import BLOCK, int_stages
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import arithmetic as ref
from tests.emulator.test_kernels_dpu import MODE_NAMES, as_dict, ew_configs, x_stage_configs


@st.composite
def wide_cubes(draw):
    """Small cubes, and rows crossing the kernel's block boundary (BLOCK pixels)."""
    channels = draw(st.integers(1, 4))
    if draw(st.booleans()):
        shape = (channels, draw(st.integers(1, 3)), draw(st.integers(1, 5)))
    else:
        shape = (draw(st.integers(1, 2)), 1, BLOCK + draw(st.integers(-1, 40)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = draw(st.sampled_from([2**7, 2**15, 2**24, 2**31]))
    return rng.integers(-magnitude, magnitude, shape).astype(np.int32), rng


@settings(max_examples=30, deadline=None)
@given(wide_cubes(), st.none() | x_stage_configs(), st.none() | x_stage_configs(),
       st.none() | ew_configs(), st.none() | st.tuples(st.integers(-(2**15), 2**15 - 1),
                                                     st.integers(0, 40),
                                                     st.integers(-(2**31), 2**31 - 1)),
       st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY]),
       st.sampled_from([np.int8, np.int16, np.int32]), st.sampled_from(["pixel", "tensor"]),
       st.sampled_from([np.int64, np.int32]))  # int32 window sums come from the depthwise path
def test_fused_stages_match_the_reference_chain(cube, bs, bn, ew, cvt, mode, dtype, source,
                                                sums_dtype):
    data, rng = cube
    channels = data.shape[0]
    alu, mul, cpend = (rng.integers(-(2**15), 2**15, channels) for _ in range(3))
    bn_alu, bn_mul = int(rng.integers(-(2**20), 2**20)), int(rng.integers(-(2**15), 2**15))
    sums = rng.integers(-(2**20), 2**20, (1,) + data.shape[1:]).astype(sums_dtype)
    operand = rng.integers(-(2**31), 2**31, data.shape if source == "pixel" else (1, 1, 1))
    config = None if cvt is None else OutCvtConfig(*cvt, mode)
    got = int_stages(data, bs=bs, bs_alu=alu, bs_mul=mul, bs_cpend=cpend, window_sum=sums,
                     bn=bn, bn_alu=bn_alu, bn_mul=bn_mul, ew=ew, ew_operand=operand.astype(np.int32),
                     cvt=config, out_dtype=dtype)
    assert got.dtype == (np.int32 if cvt is None else dtype)
    ew_cfg = None
    if ew is not None:
        ew_cfg = as_dict(ew) | {"cvt_round": MODE_NAMES[ew.cvt_round]}
    wide = np.broadcast_to(operand.astype(np.int32), data.shape)
    bounds = (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    expected = np.empty(data.shape, np.int64)
    for (c, y, x), value in np.ndenumerate(data):
        value = int(value)
        if bs is not None:
            value = ref.bs(value, int(sums[0, y, x]), int(alu[c]), int(cpend[c]), int(mul[c]),
                           as_dict(bs))
        if bn is not None:
            value = ref.bn(value, bn_alu, bn_mul, as_dict(bn))
        if ew is not None:
            value = ref.ew(value, int(wide[c, y, x]), ew_cfg)
        if cvt is not None:
            value = ref.out_cvt(value, *cvt, MODE_NAMES[mode], bounds)
        expected[c, y, x] = value
    assert np.array_equal(got, expected)


def test_ew_without_an_operand_is_refused():
    with pytest.raises(EmulationError, match="operand"):
        int_stages(np.zeros((1, 1, 1), np.int32), ew=EwConfig(op_enable=True))
