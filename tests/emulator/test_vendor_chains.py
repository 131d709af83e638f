"""Real vendor layers (rknn-toolkit2, rk3588) through the emulator's DPU chains.

The register values and quantisation parameters come from the vendor corpus
(``reference/vendor_layers.json``); the expected results are the float formulas the vendor
compiler quantised, so these tests check the stage order and scaling of NUMERICS.md 4 and 5
against what the vendor actually programs.
"""

import numpy as np
import pytest

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import (
    EwConfig, LutConfig, LutTableConfig, OutCvtConfig, XStageConfig, bn_stage, bs_stage,
    ew_stage, lut_stage, out_cvt,
)
from tests.emulator.reference import vendor_fixture

VENDOR = vendor_fixture.load()


def out_cvt_config(registers: dict) -> OutCvtConfig:
    return OutCvtConfig(registers["OUT_CVT_SCALE"], registers["OUT_CVT_SHIFT"],
                        registers["OUT_CVT_OFFSET"], nm.out_cvt_round_mode(registers["CVT_ROUND"]))


def test_rep01_registers_encode_the_requantisation_factor():
    layer = VENDOR["rep01"]
    regs = layer["registers"]
    shift = regs["BS_MUL_SHIFT_VALUE"]
    assert shift == regs["BS_MUL_SHIFT_VALUE_NEG"] == 14
    for channel in layer["channels"]:
        m_regs = channel["mul"] * 2.0**-shift * regs["OUT_CVT_SCALE"] * 2.0**-regs["OUT_CVT_SHIFT"]
        assert m_regs == pytest.approx(channel["M_regs"], rel=1e-12)
        m = layer["s_in"] * channel["s_w"] / layer["s_out"]
        assert m == pytest.approx(channel["M"], rel=1e-9)
        assert abs(m_regs / m - 1) < 0.0025  # 15/16-bit multipliers (vendor-corpus 5)


def test_rep01_bs_and_out_cvt_scale_a_synthetic_accumulator_by_m():
    layer = VENDOR["rep01"]
    regs = layer["registers"]
    channels = layer["channels"]
    count = len(channels)
    rng = np.random.default_rng(1)
    # accumulators spanning the output range: |M * t| up to ~300 LSB
    acc = rng.integers(-(2**18), 2**18, (count, 8, 8)).astype(np.int32)
    window = rng.integers(-36864, 36864, (1, 8, 8))  # 3x3x32 int8 inputs
    config = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True,
                          shift_positive=regs["BS_MUL_SHIFT_VALUE"],
                          shift_negative=regs["BS_MUL_SHIFT_VALUE_NEG"], cpend_enable=True)
    alu = [ch["alu"] for ch in channels]
    cpend = [ch["cpend"] for ch in channels]
    mul = [ch["mul"] for ch in channels]
    scaled = bs_stage(acc, config, alu=alu, mul=mul, cpend=cpend, window_sum=window)
    got = out_cvt(scaled, out_cvt_config(regs), np.int8).astype(np.int64)
    corrected = acc + np.array(alu)[:, None, None] + np.array(cpend)[:, None, None] * window
    m = np.array([ch["M"] for ch in channels])[:, None, None]
    ideal = m * corrected + layer["zp_out"]
    # two roundings (BS: 0.5 unit = 0.002 LSB; OUT_CVT: 0.5 LSB) plus the 0.25 % factor error
    tolerance = 0.5 + 0.002 + 0.0025 * np.abs(m * corrected)
    assert np.all(np.abs(got - np.clip(ideal, -128, 127)) <= tolerance)
    assert np.any(got == -128) and np.any(got == 127) and np.any(np.abs(got) < 100)


def test_rep09_add_reproduces_the_float_sum():
    layer = VENDOR["rep09"]
    regs, tensors = layer["registers"], layer["tensors"]
    (s0, z0), (s1, z1), (so, zo) = tensors["in0"], tensors["in1"], tensors["add_out1"]
    grid = np.arange(-128, 128)
    a = np.repeat(grid, 256).astype(np.int32).reshape(256, 16, 16)
    b = np.tile(grid, 256).astype(np.int32).reshape(256, 16, 16)
    bs = bs_stage(a, XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True,
                                  shift_positive=regs["BS_MUL_SHIFT_VALUE"]),
                  alu=regs["BS_ALU_OPERAND"], mul=regs["BS_MUL_OPERAND"])
    ew = ew_stage(bs, EwConfig(cvt_enable=True, cvt_offset=regs["EW_OP_CVT_OFFSET"],
                               cvt_scale=regs["EW_OP_CVT_SCALE"], cvt_shift=regs["EW_OP_CVT_SHIFT"],
                               cvt_round=nm.out_cvt_round_mode(regs["EW_CVT_ROUND"]),
                               op_enable=True, op_type=nm.EW_OP_ALU, alu_algo=nm.ALU_ADD), b)
    got = out_cvt(ew, out_cvt_config(regs), np.int8).astype(np.int64)
    ideal = np.clip(((a - z0) * s0 + (b - z1) * s1) / so + zo, -128, 127)
    assert np.all(np.abs(got - ideal) <= 0.51)  # every one of the 65536 input pairs


def test_rep10_sigmoid_bn_lut_chain_within_one_lsb():
    layer = VENDOR["rep10"]
    regs, tensors = layer["registers"], layer["tensors"]
    (s_in, zp_in), (s_out, zp_out) = tensors["in0"], tensors["sigmoid_out1"]
    q = np.arange(-128, 128, dtype=np.int32).reshape(1, 16, 16)
    bn = bn_stage(q, XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True,
                                  shift_positive=regs["BN_MUL_SHIFT_VALUE"],
                                  shift_negative=regs["BN_MUL_SHIFT_VALUE_NEG"]),
                  alu=regs["BN_ALU_OPERAND"], mul=regs["BN_MUL_OPERAND"])

    def table(prefix):
        return LutTableConfig(
            start=regs[f"{prefix}_START"], end=regs[f"{prefix}_END"],
            index_select=regs[f"LUT_{prefix}_INDEX_SELECT"],
            uflow_scale=regs[f"{prefix}_UFLOW_SCALE"], uflow_shift=regs[f"{prefix}_UFLOW_SHIFT"],
            oflow_scale=regs[f"{prefix}_OFLOW_SCALE"], oflow_shift=regs[f"{prefix}_OFLOW_SHIFT"])

    config = LutConfig(le=table("LE"), lo=table("LO"),
                       hybrid_priority=regs["LUT_HYBRID_PRIORITY"],
                       uflow_priority=regs["LUT_UFLOW_PRIORITY"],
                       oflow_priority=regs["LUT_OFLOW_PRIORITY"])
    looked_up = lut_stage(bn, config, np.array(layer["le_table"]), np.array(layer["lo_table"]))
    got = out_cvt(looked_up, out_cvt_config(regs), np.int8).astype(np.int64).ravel()
    ideal = np.clip(np.round(1 / (1 + np.exp(-(q.ravel() - zp_in) * s_in)) / s_out) + zp_out,
                    -128, 127)
    assert np.max(np.abs(got - ideal)) <= 1
    assert np.count_nonzero(got != ideal) <= 4


def test_rep12_residual_add_rescales_the_residual_to_the_bs_output():
    layer = VENDOR["rep12"]
    regs, tensors = layer["registers"], layer["tensors"]
    (s_in, _), (s_res, zp_res), (s_out, zp_out) = (tensors["relu_out11"], tensors["relu_out5"],
                                                   tensors["add_out17"])
    s_w = np.array(layer["conv_add_s_w"])[:, None, None]
    mul = layer["conv_add_mul"]
    rng = np.random.default_rng(12)
    corrected = rng.integers(-(2**17), 2**17, (len(mul), 6, 6)).astype(np.int32)
    residual = rng.integers(-128, 128, corrected.shape).astype(np.int32)
    bs = bs_stage(corrected, XStageConfig(mul_enable=True, shift_positive=14, shift_negative=14),
                  mul=mul)
    ew = ew_stage(bs, EwConfig(cvt_enable=True, cvt_offset=regs["EW_OP_CVT_OFFSET"],
                               cvt_scale=regs["EW_OP_CVT_SCALE"], cvt_shift=regs["EW_OP_CVT_SHIFT"],
                               cvt_round=nm.out_cvt_round_mode(regs["EW_CVT_ROUND"]),
                               op_enable=True, alu_algo=nm.ALU_ADD), residual)
    got = out_cvt(ew, out_cvt_config(regs), np.int8).astype(np.int64)
    real = corrected * s_in * s_w + (residual - zp_res) * s_res
    ideal = real / s_out + zp_out
    assert np.all(np.abs(got - np.clip(ideal, -128, 127)) <= 0.51 + 0.003 * np.abs(ideal - zp_out))
