"""The fp16 LUT conv's output factor in the vendor's rk3576 OUT_CVT words (isa/rknn/rk3576_lut_fp16.py,
emulator/REGISTER_SEMANTICS.md 50): the vendor's own values, the rounding rule, the refusals."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_lut_fp16 import as_the_vendor_scales_it, check_own, scale_words, vendor_out_cvt

RK3588 = load_regmap("rk3588")


def _fp32(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


@pytest.mark.parametrize("t, words", [
    (2.0 ** -15, (16384, 14)),           # Sigmoid / Tanh / HardSigmoid: 0x14000 / 0xf00e [V ORC]
    (3.0 / 32767, (24577, 13)),          # HardSwish, X = 3: 0x16001 / 0xf00d [V ORC]
    (5.8 / (1 + math.exp(-5.8)) / 32767, (23686, 12)),   # SiLU, X = 5.8, t = f(X) / 32767: 0x15c86 / 0xf00c [V ORC]
])
def test_the_vendors_scale_words(t, words):
    assert scale_words(t) == words


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=2.0 ** -40, max_value=0.99, allow_nan=False, allow_infinity=False))
def test_scale_words_is_t_to_fifteen_bits_nearest(t):
    """SCALE x 2^-SHIFT x 2^-15 is t to 15 significant bits, rounded to nearest: the closest such value."""
    scale, shift = scale_words(t)
    assert 1 << 14 <= scale < 1 << 15 and 0 <= shift <= 0xFFF
    mantissa, exponent = math.frexp(t)
    assert scale * 2.0 ** (-shift - 15) == round(mantissa * 2 ** 15) * 2.0 ** (exponent - 15)
    assert abs(scale * 2.0 ** (-shift - 15) - t) <= 2.0 ** (exponent - 16)


@pytest.mark.parametrize("t", [0.0, -1e-4, float("inf"), 1.0])
def test_a_factor_outside_the_words_is_refused_by_name(t):
    with pytest.raises(UnsupportedProgramError, match="fp16 LUT output factor"):
        scale_words(t, "layer L")


def _own(t: float, ew: int = 0x304, minus_exp: int = 0) -> dict:
    return {("DPU", "EW_CFG"): ew, ("DPU", "EW_OP_VALUE_0"): _fp32(t), ("DPU", "OUT_CVT_SCALE"): 0x10001,
            ("DPU", "OUT_CVT_SHIFT"): minus_exp << 12}


def test_own_task_words_and_the_form_they_come_back_as():
    own = _own(3.0 / 32767)
    assert vendor_out_cvt(own, "t") == {"OUT_CVT_SCALE": 0x16001, "OUT_CVT_SHIFT": 0xF00D}
    back = as_the_vendor_scales_it(own, "t")
    assert back[("DPU", "EW_CFG")] == 0x304 and back[("DPU", "OUT_CVT_SHIFT")] == 15 << 12
    assert back[("DPU", "EW_OP_VALUE_0")] == _fp32(24577 / 8192)
    flat = as_the_vendor_scales_it(_own(2.0 ** -15), "t")   # the twin's own form: no EW operation
    assert (flat[("DPU", "EW_CFG")], flat[("DPU", "EW_OP_VALUE_0")]) == (0x302, 0)


def test_npuemu_fp16_lut_forms_without_a_vendor_form_are_named():
    assert check_own(_own(1e-4), RK3588) == []
    assert "EW_CFG 0x302" in check_own(_own(1e-4, ew=0x302), RK3588)[0]
    assert "OUT_CVT" in check_own(_own(1e-4, minus_exp=3), RK3588)[0]
