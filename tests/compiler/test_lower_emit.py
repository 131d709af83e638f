"""Lowered tasks beyond the vendor cases: absolute addresses, chains, fp16, element-wise ops,
pooling and fused activations (values checked by decoding the written registers)."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.lower import (
    Activation, ConstPlacement, ConvLayer, EltwiseLayer, FcLayer, PoolLayer, Quant, Residual, feature_placement,
    layer_constants, lower_layer, output_align,
)
from npuemu.compiler.lower.placement import surface_atoms
from npuemu.isa.chain import decode_chain, encode_chain
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain, check_task
from npuemu.platforms import load_platform

PLATFORM = load_platform("rk3588")
REGMAP = load_regmap("rk3588")
Q_IN, Q_OUT = Quant(0.05, 3), Quant(0.1, -10)
IN_ADDR, OUT_ADDR, RES_ADDR, CONST_ADDR = 0x0020_0000, 0x0100_0000, 0x0200_0000, 0x0300_0000


def regs(task) -> dict[str, dict[str, int]]:
    """BLOCK.REGISTER -> decoded fields (last write wins)."""
    out = {}
    for w in task.writes:
        out[f"{w.block}.{w.register}"] = REGMAP.register(w.block, w.register).unpack(w.value)
    return out


def conv(shape, out_channels, kernel, *, depthwise=False, dtype="int8", seed=0, **kwargs) -> ConvLayer:
    rng = np.random.default_rng(seed)
    per_group = 1 if depthwise else shape[0]
    if dtype == "int8":
        weights = rng.integers(-128, 128, (out_channels, per_group, kernel, kernel), dtype=np.int8)
        quant = dict(weight_scale=rng.uniform(0.002, 0.01, out_channels),
                     weight_zero_point=rng.integers(-8, 8, out_channels), input_quant=Q_IN, output_quant=Q_OUT)
    else:
        weights = rng.normal(size=(out_channels, per_group, kernel, kernel)).astype(np.float16)
        quant = {}
    return ConvLayer("c", "in", "out", shape, weights, bias=rng.normal(size=out_channels),
                     groups=shape[0] if depthwise else 1, dtype=dtype, **quant, **kwargs)


def place(layer: ConvLayer, *, residual: bool = False) -> dict:
    dtype = layer.dtype
    result = {"in": feature_placement("in", IN_ADDR, layer.input_shape, dtype, PLATFORM),
              "out": feature_placement("out", OUT_ADDR, layer.output_shape, dtype, PLATFORM,
                                       channel_align=output_align(layer, PLATFORM))}
    if residual:
        result["res"] = feature_placement("res", RES_ADDR, layer.output_shape, dtype, PLATFORM,
                                          channel_align=output_align(layer, PLATFORM))
    address = CONST_ADDR
    for name, blob in layer_constants(layer, PLATFORM).items():
        result[name] = ConstPlacement(name, address, len(blob))
        address += -(-len(blob) // 64) * 64
    return result


def test_split_conv_absolute_addresses_and_chain() -> None:
    layer = conv((64, 150, 150), 64, 3, pads=(1, 1, 1, 1), activation=Activation("relu"))
    places = place(layer)
    lowered = lower_layer(layer, places, PLATFORM, REGMAP, op_idx=7)
    assert len(lowered.tasks) == 5
    line = 150 * 16
    for task, desc in zip(lowered.tasks, lowered.descriptions):
        check_task(task, REGMAP, "test")
        r = regs(task)
        first_in = desc.feature_address - IN_ADDR
        assert first_in % line == 0
        assert r["CNA.FEATURE_DATA_ADDR"]["FEATURE_BASE_ADDR"] == desc.feature_address
        assert r["CNA.DCOMP_ADDR0"]["DECOMPRESS_ADDR0"] == places["c:weights"].address
        assert r["DPU_RDMA.BS_BASE_ADDR"]["BS_BASE_ADDR"] == places["c:bias"].address
        assert r["DPU.DST_SURF_STRIDE"]["DST_SURF_STRIDE"] == surface_atoms(150, 150)
        assert task.op_idx == 7 and len(task.writes) == 126
    dst = [regs(t)["DPU.DST_BASE_ADDR"]["DST_BASE_ADDR"] - OUT_ADDR for t in lowered.tasks]
    assert dst == [0, 33 * line, 65 * line, 97 * line, 129 * line]
    encoded = encode_chain(Chain(lowered.tasks), REGMAP, base_addr=0x0400_0000, scale=2)
    assert encoded.first_amount == 0x40  # 126 writes -> (126 + 4) / 2 - 1 (vendor tail)
    decoded = decode_chain(encoded.data, REGMAP, 0x0400_0000, 0x0400_0000, encoded.first_amount, 2)
    assert [t.writes for t in decoded.chain.tasks] == [t.writes for t in lowered.tasks]


def test_depthwise_channel_groups_offset_every_address() -> None:
    layer = conv((96, 112, 112), 96, 3, depthwise=True, stride=2, pads=(1, 1, 1, 1))
    places = place(layer)
    lowered = lower_layer(layer, places, PLATFORM, REGMAP)
    surface_in, surface_out = 112 * 112 * 16, 56 * 56 * 16
    second = regs(lowered.tasks[1])
    assert second["CNA.FEATURE_DATA_ADDR"]["FEATURE_BASE_ADDR"] == IN_ADDR + 4 * surface_in
    assert second["DPU.DST_BASE_ADDR"]["DST_BASE_ADDR"] == OUT_ADDR + 4 * surface_out
    assert second["CNA.DCOMP_ADDR0"]["DECOMPRESS_ADDR0"] == places["c:weights"].address + 64 * 9
    assert second["DPU_RDMA.BS_BASE_ADDR"]["BS_BASE_ADDR"] == places["c:bias"].address + 64 * 8
    assert second["DPU.DATA_CUBE_CHANNEL"] == {"ORIG_CHANNEL": 31, "CHANNEL": 63}
    assert second["CNA.PAD_CON1"]["PAD_VALUE"] == (3 << 8) | 3  # depthwise: zp in two bytes


def test_fp16_conv_registers() -> None:
    layer = conv((24, 10, 10), 20, 3, dtype="float16", pads=(1, 1, 1, 1), activation=Activation("relu"))
    lowered = lower_layer(layer, place(layer), PLATFORM, REGMAP)
    r = regs(lowered.tasks[0])
    assert r["CNA.CONV_CON1"]["IN_PRECISION"] == r["CNA.CONV_CON1"]["PROC_PRECISION"] == 2
    assert r["CORE.MISC_CFG"]["PROC_PRECISION"] == 2
    assert r["DPU.DATA_FORMAT"]["OUT_PRECISION"] == 2
    assert r["DPU.DATA_CUBE_CHANNEL"] == {"ORIG_CHANNEL": 19, "CHANNEL": 31}  # 16 kernels per pass
    assert r["CNA.DATA_SIZE1"]["DATAIN_CHANNEL"] == 24  # C2 = 8 for fp16
    assert r["CNA.WEIGHT_SIZE2"]["WEIGHT_KERNELS"] == 20
    # 24 channels are stored as 32 (the partial group rounded to 4 atoms, LOWERING.md 34; [V]
    # rknn-toolkit2 rk3588 IC 24 x 3 x 5: 960 bytes per kernel), 20 kernels as 20
    assert r["CNA.WEIGHT_SIZE1"]["WEIGHT_BYTES_PER_KERNEL"] == 9 * 32 * 2
    assert r["CNA.WEIGHT_SIZE0"]["WEIGHT_BYTES"] == 20 * 9 * 32 * 2
    assert r["DPU.OUT_CVT_SCALE"]["FP32TOFP16_EN"] == 1
    assert r["DPU_RDMA.BRDMA_CFG"]["BRDMA_DATA_USE"] == 1
    assert r["DPU.BS_CFG"]["BS_MUL_BYPASS"] == 1 and r["DPU.BN_CFG"]["BN_RELU_BYPASS"] == 0
    assert r["DPU.BS_OW_CFG"]["SIZE_E_0"] == 1 and r["DPU.SURFACE_ADD"]["SURF_ADD"] == 2 * surface_atoms(10, 10)


@pytest.mark.parametrize("activation,bn_cfg", [("relu6", 0x92), ("relu", 0x12), ("none", 0x53)])
def test_activations_in_bn(activation: str, bn_cfg: int) -> None:
    layer = conv((16, 8, 8), 16, 1, activation=Activation(activation))
    lowered = lower_layer(layer, place(layer), PLATFORM, REGMAP)
    writes = {f"{w.block}.{w.register}": w.value for w in lowered.tasks[0].writes}
    assert writes["DPU.BN_CFG"] == bn_cfg  # tasks.csv: ConvClip 146, ConvRelu 18, Conv 83
    if activation == "relu6":
        unit = 0.05 * layer.weight_scale.max()
        assert writes["DPU.BN_RELUX_CMP_VALUE"] == round(6 / unit)


def test_clip_with_negative_low_uses_bn_max_and_leaky_uses_prelu() -> None:
    layer = conv((16, 8, 8), 16, 1, activation=Activation("clip", low=-1.0, high=1.0))
    r = regs(lower_layer(layer, place(layer), PLATFORM, REGMAP).tasks[0])
    unit = 0.05 * layer.weight_scale.max()
    assert r["DPU.BN_CFG"]["BN_ALU_BYPASS"] == 0 and r["DPU.BN_CFG"]["BN_ALU_ALGO"] == 0  # max
    assert r["DPU.BN_ALU_CFG"]["BN_ALU_OPERAND"] == round(-1 / unit)
    assert r["DPU.BN_CFG"]["BN_RELU_BYPASS"] == 1 and r["DPU.BN_CFG"]["BN_RELUX_EN"] == 1
    leaky = conv((16, 8, 8), 16, 1, activation=Activation("leaky_relu", alpha=0.1))
    r = regs(lower_layer(leaky, place(leaky), PLATFORM, REGMAP).tasks[0])
    scale, shift = r["DPU.BN_MUL_CFG"]["BN_MUL_OPERAND"], r["DPU.BN_MUL_CFG"]["BN_MUL_SHIFT_VALUE"]
    assert r["DPU.BN_CFG"]["BN_MUL_PRELU"] == 1 and abs(scale * 2.0 ** -shift - 0.1) < 1e-5
    assert r["DPU.DATA_FORMAT"]["BN_MUL_SHIFT_VALUE_NEG"] == shift


@pytest.mark.parametrize("after,bn_cfg,ew_cfg", [(False, 0x53, 2420244672), (True, 0x12, 2420245184)])
def test_conv_add_relu_orders(after: bool, bn_cfg: int, ew_cfg: int) -> None:
    """tasks.csv: ConvAddRelu has EW_CFG 2420244672 (EW ReLU), ConvReluAdd BN 0x12 + 2420245184."""
    layer = conv((16, 8, 8), 16, 3, pads=(1, 1, 1, 1), activation=Activation("relu"),
                 residual=Residual("res", Quant(0.07, -5), after_activation=after))
    lowered = lower_layer(layer, place(layer, residual=True), PLATFORM, REGMAP)
    writes = {f"{w.block}.{w.register}": w.value for w in lowered.tasks[0].writes}
    assert (writes["DPU.BN_CFG"], writes["DPU.EW_CFG"]) == (bn_cfg, ew_cfg)
    # COMB_USE 5: MRDMA reads surface 0 of each pair at the residual, ERDMA surface 1 (rep12)
    surface = surface_atoms(8, 8)
    assert writes["DPU_RDMA.SRC_BASE_ADDR"] == RES_ADDR
    assert writes["DPU_RDMA.EW_BASE_ADDR"] == RES_ADDR + surface * 16
    assert writes["DPU_RDMA.SURF_NOTCH"] >> 4 == writes["DPU_RDMA.EW_SURF_NOTCH"] >> 4 == 2 * surface - 64
    assert writes["DPU.EW_CVT_OFFSET_VALUE"] == 5


@pytest.mark.parametrize("op,algo,op_type", [("add", 2, 0), ("sub", 4, 0), ("max", 0, 0), ("min", 1, 0), ("mul", 2, 1)])
def test_eltwise_ops(op: str, algo: int, op_type: int) -> None:
    shape = (24, 7, 7)
    layer = EltwiseLayer("e", op, ("a", "b"), "o", shape, (Quant(0.04, 1), Quant(0.03, -2)), Quant(0.05, 0),
                         activation=Activation("relu"))
    places = {n: feature_placement(n, a, shape, "int8", PLATFORM) for n, a in (("a", IN_ADDR), ("b", RES_ADDR), ("o", OUT_ADDR))}
    lowered = lower_layer(layer, places, PLATFORM, REGMAP)
    (task,) = lowered.tasks
    r = regs(task)
    assert task.enable_mask == 0x18 and len(task.writes) == 69
    assert (r["DPU.EW_CFG"]["EW_ALU_ALGO"], r["DPU.EW_CFG"]["EW_OP_TYPE"]) == (algo, op_type)
    assert r["DPU.EW_CFG"]["EW_RELU_BYPASS"] == 0
    assert r["DPU_RDMA.SRC_BASE_ADDR"]["SRC_BASE_ADDR"] == IN_ADDR
    assert r["DPU_RDMA.EW_BASE_ADDR"]["EW_BASE_ADDR"] == RES_ADDR
    assert r["DPU.DST_SURF_STRIDE"]["DST_SURF_STRIDE"] == 52  # align(49, 4)
    assert r["DPU_RDMA.SURF_NOTCH"]["SURF_NOTCH_ADDR"] == 3  # MRDMA surface = 7 x 7 + notch
    assert r["DPU.DATA_CUBE_CHANNEL"] == {"ORIG_CHANNEL": 23, "CHANNEL": 31}


def test_wide_maxpool_is_one_task() -> None:
    """RKNN splits this pool (tasks.csv maxpool_013) along W; without a known output line-stride
    register we keep one task (LOWERING.md)."""
    layer = PoolLayer("p", "max", "a", "o", (16, 112, 112), 3, 1, (1, 1, 1, 1), Quant(0.02, -91))
    places = {"a": feature_placement("a", IN_ADDR, (16, 112, 112), "int8", PLATFORM),
              "o": feature_placement("o", OUT_ADDR, (16, 112, 112), "int8", PLATFORM)}
    (task,) = lower_layer(layer, places, PLATFORM, REGMAP).tasks
    r = regs(task)
    assert (task.enable_mask, len(task.writes)) == (0x60, 26)
    assert r["PPU.POOLING_PADDING_CFG"] == {"PAD_BOTTOM": 1, "PAD_RIGHT": 1, "PAD_TOP": 1, "PAD_LEFT": 1}
    assert r["PPU_RDMA.SRC_BASE_ADDR"]["SRC_BASE_ADDR"] == IN_ADDR
    assert r["PPU.DST_BASE_ADDR"]["DST_BASE_ADDR"] * 16 == OUT_ADDR
    assert r["PPU_RDMA.SRC_LINE_STRIDE"]["SRC_LINE_STRIDE"] == 112
    assert r["PPU.PADDING_VALUE_1_CFG"]["PAD_VALUE_0"] == 0


def test_dilation_and_fc() -> None:
    layer = conv((16, 20, 20), 16, 3, dilation=2, pads=(2, 2, 2, 2))
    r = regs(lower_layer(layer, place(layer), PLATFORM, REGMAP).tasks[0])
    assert r["CNA.CONV_CON3"]["ATROUS_Y_DILATION"] == r["CNA.CONV_CON3"]["ATROUS_X_DILATION"] == 1
    assert r["CORE.DATAOUT_SIZE_0"] == {"DATAOUT_HEIGHT": 19, "DATAOUT_WIDTH": 19}
    rng = np.random.default_rng(1)
    fc = FcLayer("fc", "in", "out", rng.integers(-128, 128, (40, 64), dtype=np.int8),
                 bias=rng.integers(-1000, 1000, 40), weight_scale=np.full(40, 0.01),
                 weight_zero_point=np.zeros(40, int), input_quant=Q_IN, output_quant=Q_OUT,
                 bias_in_accumulator_units=True)
    conv_view = fc.as_conv()
    lowered = lower_layer(fc, place(conv_view) | {n: ConstPlacement(n, CONST_ADDR + i * 0x10000, len(b))
                                                   for i, (n, b) in enumerate(layer_constants(fc, PLATFORM).items())},
                          PLATFORM, REGMAP)
    r = regs(lowered.tasks[0])
    assert r["CNA.DATA_SIZE0"] == {"DATAIN_WIDTH": 1, "DATAIN_HEIGHT": 1}
    assert r["DPU.DATA_CUBE_CHANNEL"] == {"ORIG_CHANNEL": 39, "CHANNEL": 63}
    assert r["CNA.DMA_CON2"]["SURF_STRIDE"] == (1 - 4) & ((1 << 28) - 1)  # rep11 writes -3 in 28 bits
