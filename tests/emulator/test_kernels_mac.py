"""The MAC array: the fp16 convolution, the CORE stage, and the exact float32-chunk method on
the emulator's int8 kernel (``conv_pixels``); the case strategy the other convolution tests use."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ConvGeometry, conv2d_fp16, fetch_padded_input, nchw_to_nc1hwc2
from npuemu.emulator.kernels.conv_pixels import conv_int8_pixels
from npuemu.isa.errors import EmulationError
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref


@st.composite
def conv_cases(draw, values="int8", kinds=("direct", "direct", "grouped", "depthwise"),
               depthwise_multipliers=(1, 2)):
    kind = draw(st.sampled_from(kinds))
    if kind == "direct":
        groups, channels, kernels = 1, draw(st.integers(1, 40)), draw(st.integers(1, 40))
    elif kind == "grouped":
        groups = draw(st.integers(2, 4))
        channels = groups * draw(st.integers(1, 8))
        kernels = groups * draw(st.integers(1, 6))
    else:
        channels = groups = draw(st.integers(1, 24))
        kernels = channels * draw(st.sampled_from(depthwise_multipliers))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sy, sx = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dy, dx = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    height, width = draw(st.integers(1, 11)), draw(st.integers(1, 11))
    pad_top, pad_left = draw(st.integers(0, 3)), draw(st.integers(0, 3))
    out_h = (height + pad_top + draw(st.integers(0, 3)) - (kh - 1) * dy - 1) // sy + 1
    out_w = (width + pad_left + draw(st.integers(0, 3)) - (kw - 1) * dx - 1) // sx + 1
    assume(out_h >= 1 and out_w >= 1)
    geometry = ConvGeometry(kh, kw, out_h, out_w, sy, sx, dy, dx, pad_top, pad_left, groups)
    c2 = draw(st.sampled_from([8, 16] + ([channels] if channels <= 4 else [])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if values == "int8":
        pool = np.array([-128, 127, -1, 0]) if draw(st.booleans()) else np.arange(-128, 128)
        x = rng.choice(pool, (channels, height, width)).astype(np.int8)
        w = rng.choice(pool, (kernels, channels // groups, kh, kw)).astype(np.int8)
        pad_value = int(rng.integers(-128, 128))
    else:
        x = (rng.standard_normal((channels, height, width)) * 4).astype(np.float16)
        w = (rng.standard_normal((kernels, channels // groups, kh, kw))).astype(np.float16)
        pad_value = float(np.float16(rng.standard_normal()))
    return x, w, geometry, c2, pad_value


def as_dict(geometry: ConvGeometry) -> dict:
    return {name: getattr(geometry, name) for name in (
        "kernel_h", "kernel_w", "out_h", "out_w", "stride_y", "stride_x", "dilation_y",
        "dilation_x", "groups")}


def reference_padded(x, geometry, pad_value, dtype=np.int64):
    return ref.padded_input(x, geometry.pad_top, geometry.pad_left, geometry.padded_h,
                            geometry.padded_w, pad_value, dtype)


def core_stage(exact: np.ndarray, clip_truncate: int, mode: int) -> list[int]:
    """The CORE stage (numerics.core_output, which the int8 kernels apply) on each exact sum."""
    return [int(nm.core_output(int(v), clip_truncate, mode)) for v in exact.ravel()]


def pixels_conv(x: np.ndarray, w: np.ndarray, geometry: ConvGeometry, pad_value: int) -> np.ndarray:
    """The emulator's int8 convolution (one group, no truncation) as [OC][OH][OW] int32."""
    data, _ = conv_int8_pixels(nchw_to_nc1hwc2(x, 16), x.shape[0], x.shape[0], w, geometry, pad_value,
                               0, nm.ROUND_HALF_AWAY, w.shape[0])
    return data.T.reshape(w.shape[0], geometry.out_h, geometry.out_w)


@settings(max_examples=25)
@given(st.integers(-(2**40), 2**40), st.integers(0, 20), st.booleans())
def test_core_truncation_and_saturation(value, truncate, half_even):
    mode = nm.core_round_mode(int(half_even))
    name = "half_even" if half_even else "half_away"
    assert core_stage(np.array([value]), truncate, mode) == [ref_arith.core(value, truncate, name)]


def test_core_saturates_the_34_bit_accumulator():
    exact = np.array([2**33, -(2**33) - 5, 2**40, 3 * 2**31], np.int64)
    mode = nm.ROUND_HALF_AWAY
    assert core_stage(exact, 0, mode) == [2**31 - 1, -(2**31), 2**31 - 1, 2**31 - 1]
    # 2**40 saturates to 2**33 - 1 first, which rounds back up to 2**30
    assert core_stage(exact, 3, mode) == [2**30, -(2**30), 2**30, 3 * 2**28]


# ---------------------------------------------------------------------------------------------
# The float32-chunk method at its worst case (NUMERICS.md 3.2), on the int8 kernel
# ---------------------------------------------------------------------------------------------
def test_one_product_past_the_limit_would_break_float32_but_not_the_kernel():
    # 1024 products of 16384 and one of 1: the exact sum is 2**24 + 1
    channels = nm.EXACT_FLOAT32_REDUCTION + 1
    x = np.full((channels, 1, 1), -128, np.int8)
    w = np.full((1, channels, 1, 1), -128, np.int8)
    x[-1], w[0, -1] = 1, 1
    naive = w.reshape(1, -1).astype(np.float32) @ x.reshape(-1, 1).astype(np.float32)
    assert int(naive[0, 0]) != 2**24 + 1  # a single float32 sum is not exact here
    assert pixels_conv(x, w, ConvGeometry(1, 1, 1, 1), 0)[0, 0, 0] == 2**24 + 1


@settings(max_examples=10)
@given(st.integers(0, 2**32 - 1))
def test_long_reductions_with_extreme_values_are_exact(seed):
    rng = np.random.default_rng(seed)
    channels, kernels = int(rng.integers(200, 400)), int(rng.integers(1, 40))
    x = rng.choice([-128, 127, -127, 1], (channels, 6, 5)).astype(np.int8)
    w = rng.choice([-128, 127, -127, 1], (kernels, channels, 3, 3)).astype(np.int8)
    geometry = ConvGeometry(3, 3, 5, 4, pad_top=1, pad_left=1)
    expected = ref.conv(reference_padded(x, geometry, -128), w, as_dict(geometry))
    got = pixels_conv(x, w, geometry, -128)
    assert got.ravel().tolist() == core_stage(expected, 0, nm.ROUND_HALF_AWAY)


# ---------------------------------------------------------------------------------------------
# fp16
# ---------------------------------------------------------------------------------------------
def gamma(n: int) -> float:
    unit = 2.0**-24
    return n * unit / (1 - n * unit)


@settings(max_examples=40)
@given(conv_cases(values="fp16"), st.sampled_from(["gemm", "direct"]))
def test_fp16_convolution_within_the_fp32_summation_bound(case, method):
    x, w, geometry, c2, pad_value = case
    c2 = 8 if c2 == 16 else c2
    padded = fetch_padded_input(nchw_to_nc1hwc2(x, c2), x.shape[0], geometry, pad_value)
    got = conv2d_fp16(padded, w, geometry, method)
    assert got.dtype == np.float32
    exact_padded = reference_padded(x.astype(np.float64), geometry, pad_value, np.float64)
    exact = ref.conv(exact_padded, w.astype(np.float64), as_dict(geometry), np.float64)
    magnitude = ref.conv(np.abs(exact_padded), np.abs(w.astype(np.float64)), as_dict(geometry),
                         np.float64)
    reduction = w.shape[1] * w.shape[2] * w.shape[3]
    assert np.all(np.abs(got - exact) <= gamma(reduction) * magnitude)
    # rounded to fp16 at the output: at most half an fp16 ULP more
    halves = got.astype(np.float16).astype(np.float64)
    spacing = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(halves - exact) <= spacing / 2 + 2 * gamma(reduction) * magnitude + 2**-24)


def test_operand_mismatches_are_emulation_errors():
    geometry = ConvGeometry(3, 3, 2, 2)
    padded = np.zeros((4, 4, 4), np.float32)
    with pytest.raises(EmulationError, match="groups"):
        conv2d_fp16(padded, np.zeros((2, 3, 3, 3), np.float16), geometry)
    with pytest.raises(EmulationError, match="float16 weights"):
        conv2d_fp16(padded, np.zeros((2, 4, 3, 3), np.int8), geometry)
    with pytest.raises(EmulationError, match="smaller"):
        conv2d_fp16(padded[:, :3], np.zeros((2, 4, 3, 3), np.float16), geometry)
    with pytest.raises(EmulationError, match="method"):
        conv2d_fp16(padded, np.zeros((2, 4, 3, 3), np.float16), geometry, method="fast")
    with pytest.raises(EmulationError, match="cannot hold"):
        fetch_padded_input(np.zeros((1, 4, 4, 16), np.int8), 17, geometry, 0)
