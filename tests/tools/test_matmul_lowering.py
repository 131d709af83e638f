"""The compiler pieces the Matmul API needs: wide (int32 / fp32) conv outputs, the RK3576 map
without FC_DATA_SIZE1, RK3566/68 inputs that are not packed images."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.compiler.lower import ConstPlacement, ConvLayer, Quant, feature_placement, layer_constants, lower_layer, output_align
from npuemu.emulator.machine import Machine
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain
from npuemu.platforms import load_platform

IN_ADDR, OUT_ADDR, CONST_ADDR, REGCMD_ADDR = 0x10_0000, 0x20_0000, 0x30_0000, 0x40_0000


def _layer(rng, shape, out_channels, kernel, dtype="int8", **kwargs) -> ConvLayer:
    if dtype == "int8":
        weights = rng.integers(-128, 128, (out_channels, shape[0], kernel, kernel)).astype(np.int8)
        quant = dict(weight_scale=np.full(out_channels, 0.01), input_quant=Quant(0.05, int(rng.integers(-5, 5))),
                     weight_zero_point=rng.integers(-4, 4, out_channels))
        bias = rng.integers(-1000, 1000, out_channels)
    else:
        weights = rng.normal(size=(out_channels, shape[0], kernel, kernel)).astype(np.float16)
        quant, bias = {}, rng.normal(size=out_channels)
    pad = kernel // 2
    return ConvLayer("c", "in", "out", shape, weights, bias=bias, pads=(pad, pad, pad, pad), dtype=dtype,
                     bias_in_accumulator_units=dtype == "int8", **quant, **kwargs)


def _placements(layer, platform):
    out_dtype = layer.output_dtype
    places = {"in": feature_placement("in", IN_ADDR, layer.input_shape, layer.dtype, platform),
              "out": feature_placement("out", OUT_ADDR, layer.output_shape, out_dtype, platform,
                                       channel_align=output_align(layer, platform))}
    address = CONST_ADDR
    constants = layer_constants(layer, platform)
    for name, blob in constants.items():
        places[name] = ConstPlacement(name, address, len(blob))
        address += -(-len(blob) // 64) * 64
    return places, constants


def _nc1hwc2(x, placement):
    buf = np.zeros(placement.c1 * placement.surface_stride * placement.c2, x.dtype)
    channels, height, width = x.shape
    for c in range(channels):
        group, lane = divmod(c, placement.c2)
        start = group * placement.surface_stride * placement.c2 + lane
        buf[start:start + height * width * placement.c2:placement.c2] = x[c].reshape(-1)
    return buf


def _run(layer, x, chip="rk3588"):
    platform, regmap = load_platform(chip), load_regmap(load_platform(chip).register_map.family)
    places, constants = _placements(layer, platform)
    lowered = lower_layer(layer, places, platform, regmap)
    chain = encode_chain(Chain(lowered.tasks), regmap, base_addr=REGCMD_ADDR, scale=platform.pc.data_amount_scale)
    machine = Machine.for_platform(chip, ddr_size=REGCMD_ADDR + len(chain.data) + (1 << 16))
    for name, blob in constants.items():
        machine.memory.load(places[name].address, blob)
    machine.memory.load(IN_ADDR, _nc1hwc2(x, places["in"]).view(np.uint8))
    machine.memory.load(REGCMD_ADDR, chain.data)
    machine.run_chain(REGCMD_ADDR, chain.first_amount)
    out = places["out"]
    dtype = np.dtype({"int32": np.int32, "float32": np.float32}[out.dtype])
    raw = machine.memory.dump(out.address, out.size).view(dtype).reshape(out.c1, out.surface_stride, out.c2)
    channels, height, width = out.shape
    cube = raw[:, :height * width].transpose(0, 2, 1).reshape(-1, height, width)[:channels]
    return cube, lowered


def _conv_reference(x, w, bias, pad):
    """Direct convolution in float64 / int64 over a zero-padded x (the caller subtracts zero points)."""
    channels, height, width = x.shape
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad)))
    out = np.zeros((w.shape[0], height, width), x.dtype)
    for dy in range(k):
        for dx in range(k):
            out += np.einsum("oc,chw->ohw", w[:, :, dy, dx], xp[:, dy:dy + height, dx:dx + width])
    return out + bias[:, None, None]


def _dpu_fields(lowered) -> dict:
    """DPU register -> decoded fields of the first task (rk3588 map)."""
    regmap = load_regmap("rk3588")
    return {w.register: regmap.register(w.block, w.register).unpack(w.value)
            for w in lowered.tasks[0].writes if w.block == "DPU"}


@settings(max_examples=4, deadline=None)
@given(st.integers(1, 40), st.integers(1, 2), st.sampled_from([1, 3]), st.integers(0, 2**31))
def test_int32_output_is_the_exact_zero_point_corrected_sum(channels, groups, kernel, seed):
    """int8 conv with OUT_PRECISION int32: Σ (x - zp_in)(w - zp_w) + bias, no requantization,
    written with SIZE_E 7 (8 surfaces of 4 channels per 32-kernel pass)."""
    rng = np.random.default_rng(seed)
    layer = _layer(rng, (channels, 3, 5), 32 * groups, kernel, output_dtype="int32")
    x = rng.integers(-128, 128, layer.input_shape).astype(np.int8)
    out, lowered = _run(layer, x)
    w = layer.weights.astype(np.int64) - np.asarray(layer.weight_zero_point)[:, None, None, None]
    want = _conv_reference(x.astype(np.int64) - layer.input_quant.zero_point, w, np.asarray(layer.bias), kernel // 2)
    np.testing.assert_array_equal(out, want)
    fields = _dpu_fields(lowered)
    assert fields["DATA_FORMAT"]["OUT_PRECISION"] == 4 and fields["DATA_FORMAT"]["PROC_PRECISION"] == 0
    assert fields["BS_OW_CFG"]["SIZE_E_0"] == 7


def test_fp32_output_is_not_rounded_to_fp16():
    rng = np.random.default_rng(7)
    layer = _layer(rng, (24, 2, 3), 16, 3, dtype="float16", output_dtype="float32")
    x = rng.normal(size=layer.input_shape).astype(np.float16)
    out, lowered = _run(layer, x)
    want = _conv_reference(x.astype(np.float64), layer.weights.astype(np.float64), layer.bias, 1)
    bound = 24 * 9 * 2.0**-23 * _conv_reference(np.abs(x.astype(np.float64)), np.abs(layer.weights.astype(np.float64)),
                                                np.abs(layer.bias), 1)
    assert out.dtype == np.float32 and np.all(np.abs(out - want) <= bound)
    assert np.any(out != out.astype(np.float16))  # values fp16 cannot hold: no output rounding
    dpu = _dpu_fields(lowered)
    assert dpu["DATA_FORMAT"]["OUT_PRECISION"] == 5 and dpu["BS_OW_CFG"]["SIZE_E_0"] == 3
    assert dpu["OUT_CVT_SCALE"]["FP32TOFP16_EN"] == 0


def test_wide_output_errors_name_the_layer_and_dtype():
    rng = np.random.default_rng(1)
    with pytest.raises(CompileError, match="layer c: output_dtype 'float32' is not available to int8 layers"):
        _layer(rng, (8, 2, 2), 32, 1, output_dtype="float32")
    from npuemu.compiler.lower import Activation
    with pytest.raises(CompileError, match="layer c: an int32 output takes no fused activation"):
        _layer(rng, (8, 2, 2), 32, 1, output_dtype="int32", activation=Activation("relu"))


def _writes(chip, layer):
    platform = load_platform(chip)
    places, _ = _placements(layer, platform)
    return lower_layer(layer, places, platform, load_regmap(platform.register_map.family)).tasks[0].writes


def test_rk3576_skips_the_register_its_map_lacks():
    """RK3576's map puts the feature address at 0x1088 (FC_DATA_SIZE1 on RK3588) and OUT_CVT_OFFSET
    at EW_OP_VALUE_7's offset: neither RK3588 register is written there (REGISTERS.md)."""
    layer = _layer(np.random.default_rng(2), (32, 1, 4), 32, 1, output_dtype="int32")
    rk3576 = {(w.block, w.register) for w in _writes("rk3576", layer)}
    rk3588 = {(w.block, w.register) for w in _writes("rk3588", layer)}
    assert ("CNA", "FC_DATA_SIZE1") in rk3588 and ("CNA", "FC_DATA_SIZE1") not in rk3576
    assert ("DPU", "EW_OP_VALUE_7") in rk3588 and ("DPU", "EW_OP_VALUE_7") not in rk3576
    assert ("CNA", "FEATURE_DATA_ADDR") in rk3576


def test_rk3568_matmul_input_is_not_a_packed_image():
    """RK3566/68 int8 features have C2 = 8 (8-byte pixels): an ordinary tensor, not an ARGB image."""
    layer = _layer(np.random.default_rng(3), (64, 1, 4), 32, 1, output_dtype="int32")
    regmap = load_regmap("rk356x")
    con1 = [regmap.register(w.block, w.register).unpack(w.value) for w in _writes("rk3568", layer)
            if w.register == "CONV_CON1"]
    assert con1 and all(c["ARGB_IN"] == 0 and c["NONALIGN_DMA"] == 0 for c in con1)
