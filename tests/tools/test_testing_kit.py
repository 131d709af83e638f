"""The public testing kit (npuemu.tools.testing): its strategies stay within the chip's limits,
its references agree with float arithmetic to the documented rounding, and check_layer finds
the emulator bit-exact on generated layers and reports a changed register field.

The float cross-checks below are written here from the float layer definition (dequantize,
compute in float64, requantize), not from the kit's integer code.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.isa.errors import EncodingError
from npuemu.tools import testing

FAST = settings(max_examples=20, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- check_layer on generated layers (the kit's own property tests) ------------------------------

#: Gaps this kit found, both fixed (issue 7 note): Add / Sub whose second operand has a scale
#: >= 2x the first's did not compile (now counted in the coarser operand's unit,
#: quant_regs.eltwise_requant); a depthwise conv with more than one channel and a fused residual
#: Add was refused by the emulator (the lowering now reads that residual through the ERDMA
#: alone, LOWERING.md 6). The pinned examples below keep both fixed.


@FAST
@given(testing.conv_configs("rk3588"))
def test_generated_convs_are_bit_exact(config):
    report = testing.check_layer(config, chip="rk3588")
    assert report.ok, report.text()


@settings(FAST, max_examples=12)
@given(testing.depthwise_configs("rk3588"))
def test_generated_depthwise_convs_are_bit_exact(config):
    report = testing.check_layer(config, chip="rk3588")
    assert report.ok, report.text()


@FAST
@given(testing.pool_configs("rk3588"))
def test_generated_pools_are_bit_exact(config):
    report = testing.check_layer(config, chip="rk3588")
    assert report.ok, report.text()


@settings(FAST, max_examples=20)
@given(testing.eltwise_configs("rk3588"))
def test_generated_eltwise_layers_are_bit_exact(config):
    report = testing.check_layer(config, chip="rk3588")
    assert report.ok, report.text()


@pytest.mark.parametrize("config, outcome", [
    (testing.EltwiseConfig(4, 2, 2, seed=0), "ok"),
    (testing.EltwiseConfig(3, 2, 2, seed=28), "ok"),  # s_y / s_x = 2.38: counted in s_y / 2^14
    (testing.EltwiseConfig(2, 1, 2, seed=0), "ok"),  # H*W = 2: identity depthwise convs, then dw Conv+Add
    (testing.EltwiseConfig(1, 1, 2, seed=1), "ok"),  # the same rewrite with one channel runs bit-exact
    (testing.EltwiseConfig(3, 3, 3, seed=0, op="sub"), "ok"),  # identity convs, then a plain Sub
    (testing.EltwiseConfig(3, 2, 2, seed=28, op="sub"), "ok"),
    (testing.EltwiseConfig(3, 2, 2, seed=28, op="mul"), "ok"),  # products need no operand scaling
    (testing.ConvConfig(8, 8, 5, 6, depthwise=True, residual=True), "ok"),
    (testing.ConvConfig(70, 70, 5, 6, depthwise=True, residual=True, activation="relu"), "ok"),  # 2 channel groups
    (testing.ConvConfig(1, 1, 5, 6, depthwise=True, residual=True), "ok"),
    (testing.ConvConfig(8, 8, 5, 6, residual=True, activation="relu"), "ok"),  # plain Conv+Add+Relu
])
def test_the_fixed_gaps_stay_fixed(config, outcome):
    """Pinned examples of the gaps above and their neighbours."""
    report = testing.check_layer(config)
    assert report.ok if outcome == "ok" else outcome in report.error, report.text()


@settings(FAST, max_examples=12)
@given(testing.fc_configs("rk3588"))
def test_generated_fully_connected_layers_are_bit_exact(config):
    report = testing.check_layer(config, chip="rk3588")
    assert report.ok, report.text()


# --- strategies respect the chip ----------------------------------------------------------------

@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_strategies_stay_within_the_chip_limits(data):
    chip = data.draw(st.sampled_from(["rk3588", "rv1106"]))
    limits = testing.chip_limits(chip)
    config = data.draw(testing.layer_configs(chip))
    if isinstance(config, testing.ConvConfig):
        assert max(config.kernel) <= limits.max_kernel and max(config.stride) <= limits.max_stride
        assert max(config.dilation) <= limits.max_dilation and max(config.pads) <= limits.max_pad
        assert config.out_channels <= limits.max_kernels
        # every output has at least one row and column
        padded_h = config.height + config.pads[0] + config.pads[2]
        assert padded_h >= (config.kernel[0] - 1) * config.dilation[0] + 1
        assert all(pad < kernel for pad, kernel in zip(config.pads, config.kernel * 2))
        if config.depthwise:
            assert config.in_channels == config.out_channels
    elif isinstance(config, testing.PoolConfig):
        assert max(config.kernel) <= limits.max_pool_kernel and max(config.stride) <= limits.max_pool_stride
        assert config.method == "max" or config.pads == (0, 0, 0, 0)
        assert config.height + config.pads[0] + config.pads[2] >= config.kernel[0]
    elif isinstance(config, testing.FcConfig):
        assert config.out_features <= limits.max_kernels


@settings(max_examples=20, deadline=None, derandomize=True)
@given(testing.conv_configs("rk3588", max_channels=3, max_size=4, max_kernel=2))
def test_user_caps_are_applied_under_the_chip_limit(config):
    assert config.in_channels <= 3 and config.height <= 4 and max(config.kernel) <= 2


# --- references against float arithmetic --------------------------------------------------------

@pytest.mark.parametrize("value, shift, mode, expected", [
    (5, 1, "half_away", 3), (-5, 1, "half_away", -3), (5, 1, "half_even", 2), (7, 1, "half_even", 4),
    (-5, 1, "half_even", -2), (-5, 1, "half_up", -2), (-5, 1, "floor", -3), (6, 2, "half_away", 2),
    (5, 0, "half_even", 5), (9, -1, "floor", 9),
])
def test_round_shift_follows_the_numerics_table(value, shift, mode, expected):
    # NUMERICS.md 1: 2.5 -> 3 / -3 (away), 2 / 4 / -2 (even), -2 (up), floor -3
    assert testing.round_shift(value, shift, mode) == expected


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.floats(min_value=1e-6, max_value=30000.0, allow_nan=False))
def test_scale_shift_keeps_fifteen_bits(factor):
    scale, shift = testing.scale_shift(factor, testing.OUT_CVT_SHIFT_MAX)
    assert 2**14 <= scale < 2**15 and shift >= 0
    assert abs(scale * 2.0**-shift / factor - 1) <= 2.0**-15


def _float_conv(x, w, bias, s_in, zp_in, s_w, zp_w, stride, pads, dilation, groups):
    """Real-valued conv of dequantized operands, in float64 (padding is real 0)."""
    xr = s_in * (x.astype(np.float64) - zp_in)
    wr = s_w[:, None, None, None] * (w.astype(np.float64) - zp_w[:, None, None, None])
    xr = np.pad(xr, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out_c, group_in, kh, kw = w.shape
    out_h = (xr.shape[1] - (kh - 1) * dilation[0] - 1) // stride[0] + 1
    out_w = (xr.shape[2] - (kw - 1) * dilation[1] - 1) // stride[1] + 1
    out = np.zeros((out_c, out_h, out_w))
    for o in range(out_c):
        g = o // (out_c // groups)
        for oy in range(out_h):
            for ox in range(out_w):
                patch = xr[g * group_in:(g + 1) * group_in,
                           oy * stride[0]:oy * stride[0] + (kh - 1) * dilation[0] + 1:dilation[0],
                           ox * stride[1]:ox * stride[1] + (kw - 1) * dilation[1] + 1:dilation[1]]
                out[o, oy, ox] = (patch * wr[o]).sum() + bias[o]
    return out


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.data())
def test_reference_conv_is_the_requantized_float_conv_within_one_lsb(data):
    config = data.draw(testing.conv_configs("rk3588", max_channels=6, max_size=6, max_kernel=3, depthwise=None))
    rng = np.random.default_rng(config.seed)
    groups = config.groups
    w = rng.integers(-127, 128, (config.out_channels, config.in_channels // groups, *config.kernel))
    x = rng.integers(-128, 128, (config.in_channels, config.height, config.width))
    s_in, zp_in = rng.uniform(0.005, 0.05), int(rng.integers(-60, 60))
    s_w = rng.uniform(0.2, 1.0, config.out_channels) * 0.01  # within a factor 5: MUL keeps >= 12 bits
    zp_w = rng.integers(-3, 4, config.out_channels)
    bias = rng.normal(0, 0.5, config.out_channels)
    real = _float_conv(x, w, bias, s_in, zp_in, s_w, zp_w, config.stride, config.pads, config.dilation, groups)
    residual = residual_quant = None
    if config.residual:
        residual = rng.integers(-128, 128, real.shape)
        residual_quant = testing.Quant(rng.uniform(0.005, 0.05), int(rng.integers(-60, 60)))
        real = real + residual_quant.scale * (residual - residual_quant.zero_point)
    if config.activation != "none":
        real = np.clip(real, 0, 6 if config.activation == "relu6" else None)
    s_out, zp_out = max(float(np.abs(real).max()), 1e-3) / 100, int(rng.integers(-20, 20))
    got = testing.reference_conv(x, w, bias, input_quant=testing.Quant(s_in, zp_in),
                                 weight_quant=testing.Quant(s_w, zp_w), output_quant=testing.Quant(s_out, zp_out),
                                 stride=config.stride, pads=config.pads, dilation=config.dilation, groups=groups,
                                 activation=config.activation, residual=residual, residual_quant=residual_quant)
    want = np.clip(np.rint(real / s_out) + zp_out, -128, 127)
    assert got.shape == want.shape
    # the bias rounding, MUL's 14 bits, SCALE's 15 bits and the residual converter's rounding in
    # accumulator units move a result by at most one LSB
    assert np.abs(got.astype(np.int64) - want).max() <= 1


def test_reference_conv_relu6_clips_at_six():
    x = np.full((1, 1, 1), 100)
    w = np.ones((1, 1, 1, 1), np.int64) * 100
    kwargs = dict(input_quant=testing.Quant(0.1, 0), weight_quant=testing.Quant(np.array([0.01]), np.array([0])),
                  output_quant=testing.Quant(0.05, -128))
    # real value 10 * 1 = 10: relu6 gives 6 -> 6 / 0.05 - 128 = -8; no activation gives 10 -> 72
    assert testing.reference_conv(x, w, None, activation="relu6", **kwargs)[0, 0, 0] == -8
    assert testing.reference_conv(x, w, None, **kwargs)[0, 0, 0] == 72
    assert testing.reference_conv(-x, w, None, activation="relu", **kwargs)[0, 0, 0] == -128


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 2**16), st.sampled_from([(2, 2), (3, 3), (1, 4)]))
def test_reference_average_pool_is_the_rounded_mean(seed, kernel):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (2, 6, 8))
    got = testing.reference_pool(x, method="average", kernel=kernel, stride=kernel)
    out_h, out_w = 6 // kernel[0], 8 // kernel[1]
    windows = x[:, :out_h * kernel[0], :out_w * kernel[1]].reshape(2, out_h, kernel[0], out_w, kernel[1])
    mean = windows.mean(axis=(2, 4))
    # RECIP = round(2^16 / k) is exact for powers of two; k = 3 is off by 1/3 in 2^16
    tolerance = 0 if all(k & (k - 1) == 0 for k in kernel) else 1
    assert np.abs(got - np.sign(mean) * np.floor(np.abs(mean) + 0.5)).max() <= tolerance


def test_scale_shift_refuses_a_negative_shift():
    with pytest.raises(ValueError, match="negative shift"):
        testing.scale_shift(2.0**15, testing.EW_CVT_SHIFT_MAX)


def test_reference_max_pool_skips_padding():
    x = np.full((1, 2, 2), -100)
    got = testing.reference_pool(x, method="max", kernel=(2, 2), stride=(1, 1), pads=(1, 1, 0, 0), zero_point=50)
    assert (got == -100).all()  # a padded zero point (50) never wins


@settings(max_examples=50, deadline=None, derandomize=True)
@given(st.integers(0, 2**16), st.sampled_from(["add", "sub", "mul", "max", "min"]))
def test_reference_eltwise_is_the_requantized_float_result_within_one_lsb(seed, op):
    rng = np.random.default_rng(seed)
    a, b = rng.integers(-128, 128, (2, 3, 4)), rng.integers(-128, 128, (2, 3, 4))
    s_a = rng.uniform(0.005, 0.05)
    s_b = s_a * rng.uniform(0.05, 1.99)  # 2^14 s_b / s_a must fit SCALE < 2^15 with a shift >= 0
    zp_a, zp_b, zp_out = (int(v) for v in rng.integers(-50, 50, 3))
    real_a, real_b = s_a * (a - zp_a), s_b * (b - zp_b)
    real = {"add": real_a + real_b, "sub": real_a - real_b, "mul": real_a * real_b,
            "max": np.maximum(real_a, real_b), "min": np.minimum(real_a, real_b)}[op]
    s_out = float(np.abs(real).max()) / rng.uniform(60, 200)
    got = testing.reference_eltwise(op, a, b, a_quant=testing.Quant(s_a, zp_a), b_quant=testing.Quant(s_b, zp_b),
                                    output_quant=testing.Quant(s_out, zp_out))
    want = np.clip(np.rint(real / s_out) + zp_out, -128, 127)
    assert np.abs(got.astype(np.int64) - want).max() <= 1


# --- reports -------------------------------------------------------------------------------------

CONV = testing.ConvConfig(in_channels=3, out_channels=8, height=6, width=7)


def test_a_changed_register_field_is_reported_with_positions():
    patched = lambda model: testing.set_register_field(model, "DPU", "OUT_CVT_SCALE", "OUT_CVT_SCALE", 20000)
    report = testing.check_layer(CONV, patch=patched)
    assert not report.ok and not report.error
    assert 0 < report.mismatches <= 8 * 6 * 7 and report.max_difference > 0
    text = report.text()
    assert "int8 values differ" in text and "emulator vs reference" in text
    index, got, want = report.first[0]
    assert got != want and len(index) == 4


def test_set_register_field_refuses_unknown_or_unwritten_registers():
    _, model = testing.compile_layer(CONV)
    with pytest.raises(EncodingError):
        testing.set_register_field(model, "DPU", "NO_SUCH_REGISTER", "X", 1)
    with pytest.raises(EncodingError):  # a 16-bit field
        testing.set_register_field(model, "DPU", "OUT_CVT_SCALE", "OUT_CVT_SCALE", 1 << 20)
    unwritten = next(reg for reg in _dpu_registers() if not _writes(model, reg))
    with pytest.raises(ValueError, match="never write"):
        testing.set_register_field(model, "DPU", unwritten.name, unwritten.fields[0].name, 0)


def _dpu_registers():
    from npuemu.isa.regmap_loader import load_regmap

    return [reg for reg in load_regmap("rk3588").block("DPU").registers if reg.fields]


def _writes(model, register) -> bool:
    from npuemu.isa.container import SectionKind
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.isa.words import split_word, words_from_bytes

    target = load_regmap("rk3588").block("DPU").target
    return any(split_word(word)[0] == target and split_word(word)[2] == register.offset
               for section in model.sections if section.kind is SectionKind.REGCMD
               for word in words_from_bytes(section.data))


def test_errors_come_back_in_the_report():
    # a convolution mode the emulator refuses (CONV_MODE 1) makes the run fail, not the test
    report = testing.check_layer(
        CONV, patch=lambda model: testing.set_register_field(model, "CNA", "CONV_CON1", "CONV_MODE", 1))
    assert not report.ok and "EmulationError" in report.error and "CONV_MODE=1" in report.error
    assert "error:" in report.text()


def test_given_inputs_are_used():
    graph, _ = testing.compile_layer(CONV)
    zero_point = int(graph.tensors["x"].quant.zero_point)
    real_zeros = {"x": np.full((1, 3, 6, 7), zero_point, np.int8)}  # every input the real value 0
    report = testing.check_layer(CONV, inputs=real_zeros)
    assert report.ok, report.text()
    reference = testing.reference_for(CONV, graph, real_zeros)
    # only the bias is left: one value per output channel, padding included
    assert all(len(np.unique(channel)) == 1 for channel in reference[0])


# --- the vectorized pieces of the reference (issue 4: whole real models layer by layer) -----------

@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(-(2**46), 2**46), min_size=1, max_size=20), st.integers(0, 70),
       st.sampled_from(["half_away", "half_even", "half_up", "floor"]))
def test_round_shift_array_is_round_shift_element_by_element(values, shift, mode):
    got = testing.round_shift_array(np.array(values, np.int64), shift, mode)
    assert got.tolist() == [testing.round_shift(v, shift, mode) for v in values]


def _ramp_tables(le_end_offset=0):
    """LE entries i, LO entries 1000 + 2 i: every result says which table and entry it came from."""
    index = np.arange(513)
    return testing.LutTables(index + le_end_offset, 1000 + 2 * index, 1.0, 1.0)


def test_lut_lookup_interpolates_and_follows_the_priorities():
    tables = _ramp_tables()
    x = np.array([-20000, -16384, -16384 + 16, -16384 + 48, -1, 0, 16, 16384, 20000])
    # below both tables: LE's first entry (underflow priority LE); [-16384, 0): LE, one entry
    # per 32 inputs, interpolated and rounded half away; 0 hits both: LO (hybrid priority);
    # above both: LO's last entry (overflow priority LO); slopes 0 at both ends
    assert testing.lut_lookup(x, tables).tolist() == [0, 0, 1, 2, 512, 1000, 1001, 2024, 2024]


def test_reference_host_resize_and_concat_follow_onnx():
    q = testing.Quant(0.5, 3)
    x = np.arange(12, dtype=np.int64).reshape(1, 1, 3, 4) - 6
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
             "scales": [1.0, 1.0, 2.0, 2.0]}
    got = testing.reference_host("Resize", attrs, [x], [q], q, (1, 1, 6, 8))
    assert np.array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))
    out = testing.Quant(1.0, 0)  # requantized half even: real (q - 3) / 2 -> 1 step per 2 input steps
    got = testing.reference_host("Concat", {"axis": 1}, [x, x], [q, q], out, (1, 2, 3, 4))
    assert np.array_equal(got[0, 1], np.rint((x[0, 0] - 3) / 2))
