"""Hand-built convolution tasks run on the machine against an independent numpy reference.

Each case writes a full CNA+CORE+DPU register set (the vendor's register order), places an
NC1HWC2 input, the weight blob and the BRDMA bias blob in DDR, runs the chain and compares the
int8 output with the reference arithmetic of NUMERICS.md (test_machine_support)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.machine import Machine
from npuemu.isa.errors import EmulationError
from tests.emulator.test_machine_support import (
    MASK_CONV, BsParams, ConvSpec, bias_blob, bn_reference, bs_reference, conv_reference, conv_task,
    depthwise_reference, load_cube, out_cvt_reference, pack_conv_weights, pack_depthwise_weights,
    read_cube, run_tasks, sat32, shift_half_away,
)

CASES = {
    "direct_3x3_pad1": ConvSpec(in_c=32, in_h=12, in_w=10, kernels=32, kernel=3, pad_top=1, pad_left=1,
                                out_h=12, out_w=10, pad_value=-3),
    "direct_odd_channels_strided": ConvSpec(in_c=20, in_h=13, in_w=11, kernels=40, kernel=3, stride=2,
                                            pad_top=1, pad_left=1, out_h=7, out_w=6, pad_value=5),
    "direct_dilated": ConvSpec(in_c=16, in_h=12, in_w=12, kernels=8, kernel=3, dilation=2,
                               pad_top=2, pad_left=2, out_h=12, out_w=12, pad_value=-128),
    "pointwise_70_kernels": ConvSpec(in_c=48, in_h=6, in_w=9, kernels=70, kernel=1),
    "direct_5x5_s2_no_bottom_pad": ConvSpec(in_c=7, in_h=15, in_w=9, kernels=33, kernel=5, stride=2,
                                            pad_top=2, pad_left=1, out_h=6, out_w=3, pad_value=11),
    "depthwise_3x3_24ch": ConvSpec(in_c=24, in_h=10, in_w=9, kernels=24, kernel=3, pad_top=1, pad_left=1,
                                   out_h=10, out_w=9, depthwise=True, pad_value=2),
    "depthwise_5x5_s2_80ch": ConvSpec(in_c=80, in_h=11, in_w=12, kernels=80, kernel=5, stride=2,
                                      pad_top=2, pad_left=2, out_h=6, out_w=6, depthwise=True, pad_value=-7),
    "relu_and_truncate": ConvSpec(in_c=32, in_h=8, in_w=8, kernels=32, kernel=3, pad_top=1, pad_left=1,
                                  out_h=8, out_w=8, relu=True, clip_truncate=3, pad_value=1),
}


def random_layer(spec: ConvSpec, seed: int):
    """Input, weights and BS operands; padded input channels get weight -CPEND (the vendor's
    zero-point fill, vendor-corpus 5) so they cancel in BS whatever the padding lanes hold."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
    channels = spec.core_channels
    cpend = rng.integers(-20, 21, channels)
    alu = rng.integers(-(2**16), 2**16, channels)
    mul = rng.integers(2**12, 2**14, channels)
    if spec.depthwise:
        w = rng.integers(-40, 41, (spec.in_c, spec.kernel, spec.kernel)).astype(np.int8)
        blob = pack_depthwise_weights(w)
    else:
        w = rng.integers(-16, 17, (spec.kernels, spec.in_c, spec.kernel, spec.kernel)).astype(np.int8)
        blob = pack_conv_weights(w, fill=-cpend[:spec.kernels])
    return x, w, blob, BsParams(alu=alu, mul=mul, cpend=cpend, shift=14, cpend_on=True)


def reference_accumulators(spec: ConvSpec, x, w, bs: BsParams) -> np.ndarray:
    """The int32 values reaching OUT_CVT."""
    geometry = spec.geometry()
    if spec.depthwise:
        acc, sums = depthwise_reference(x, w, geometry, spec.pad_value)
        count = spec.in_c
        bs = BsParams(alu=bs.alu[:count], mul=bs.mul[:count], cpend=bs.cpend[:count], shift=14, cpend_on=True)
    else:
        acc, sums = conv_reference(x, w, geometry, spec.pad_value)
        count = spec.kernels
        bs = BsParams(alu=bs.alu[:count], mul=bs.mul[:count], cpend=bs.cpend[:count], shift=14, cpend_on=True)
    if spec.clip_truncate:
        acc = sat32(shift_half_away(np.clip(acc, -(2**33), 2**33 - 1).astype(object), spec.clip_truncate))
    v = bs_reference(acc, bs, sums)
    if spec.relu:
        v = bn_reference(v, 0, 0, 0, relu=True, mul_on=False, alu_on=False)
    return v


def choose_out_cvt(v: np.ndarray, scale: int = 23000) -> int:
    """An OUT_CVT shift that maps most values into int8 without saturating them."""
    typical = max(float(np.percentile(np.abs(v.astype(np.float64)), 90)), 1.0)
    return max(0, int(np.ceil(np.log2(typical * scale / 100))))


def run_spec(spec: ConvSpec, seed: int = 0):
    x, w, blob, bs = random_layer(spec, seed)
    v = reference_accumulators(spec, x, w, bs)
    spec.bs_shift, spec.out_scale, spec.out_offset = 14, 23000, -5
    spec.out_shift = choose_out_cvt(v)
    expected = out_cvt_reference(v, spec.out_scale, spec.out_shift, spec.out_offset)
    machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
    load_cube(machine, spec.feature, x)
    machine.memory.load(spec.weights, blob.tobytes())
    machine.memory.load(spec.bias, bias_blob(bs.alu, bs.cpend, bs.mul))
    run = run_tasks(machine, [conv_task(spec).task(MASK_CONV)])
    channels = spec.in_c if spec.depthwise else spec.kernels
    got = read_cube(machine, spec.output, channels, spec.out_h, spec.out_w)
    return got, expected, run


@pytest.mark.parametrize("name", sorted(CASES))
def test_conv_task_matches_reference(name):
    got, expected, run = run_spec(CASES[name], seed=sorted(CASES).index(name))
    unsaturated = np.mean(np.abs(expected) < 127)
    assert unsaturated > 0.3, f"test data saturates too much to be informative ({unsaturated:.2f})"
    np.testing.assert_array_equal(got, expected)
    (task,) = run.tasks
    assert task.conv is not None and task.dpu is not None


def test_traffic_counts_what_the_dma_moved():
    spec = CASES["direct_odd_channels_strided"]
    _, _, run = run_spec(spec)
    traffic = run.tasks[0].traffic
    surfaces_in = -(-spec.in_c // 16)
    assert traffic.feature_read == surfaces_in * spec.in_h * spec.in_w * 16
    assert traffic.weight_read == spec.weight_bytes()[0]
    assert traffic.bias_read == spec.core_channels // 8 * 64  # 8-channel groups of 64 bytes
    # the WDMA writes the surfaces holding real channels (ORIG_CHANNEL), not the padding-only one
    assert traffic.dpu_write == -(-spec.kernels // 16) * spec.out_h * spec.out_w * 16 < \
        spec.core_channels // 16 * spec.out_h * spec.out_w * 16
    assert traffic.regcmd_read > 0 and traffic.ew_read == traffic.main_read == 0




def fp16_pointwise_task(channels: int, kernels: int, height: int, width: int):
    """A 1x1 fp16 conv task (C2 = 8, 16 kernels = 2 fp16 surfaces) with BN ReLU."""
    spec = ConvSpec(in_c=channels, in_h=height, in_w=width, kernels=kernels, kernel=1, relu=True)
    t = conv_task(spec)
    t.set("CNA", "CONV_CON1", PROC_PRECISION=2, IN_PRECISION=2)
    t.set("CNA", "DATA_SIZE1", DATAIN_CHANNEL_REAL=channels - 1, DATAIN_CHANNEL=channels)
    t.set("CNA", "FC_DATA_SIZE1", DMA_CHANNEL=channels)
    t.set("CNA", "WEIGHT_SIZE0", WEIGHT_BYTES=kernels * channels * 2)
    t.set("CNA", "WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=channels * 2)
    t.set("CORE", "MISC_CFG", PROC_PRECISION=2, QD_EN=1)
    t.set("CORE", "DATAOUT_SIZE_1", DATAOUT_CHANNEL=kernels - 1)
    t.set("DPU", "DATA_CUBE_CHANNEL", CHANNEL=kernels - 1, ORIG_CHANNEL=kernels - 1)
    t.set("DPU_RDMA", "DATA_CUBE_CHANNEL", CHANNEL=kernels - 1)
    t.set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=kernels - 1)
    t.set("DPU", "DATA_FORMAT", OUT_PRECISION=2, IN_PRECISION=2, PROC_PRECISION=2)
    t.set("DPU", "SURFACE_ADD", SURF_ADD=2 * height * width)
    return spec, t


def test_fp16_pointwise_conv_with_relu():
    """fp16 features (C2 = 8) and weights ([OC/16][IC/32][KH][KW][16][ic], NUMERICS 8.3), fp32
    accumulation, BN ReLU, fp16 output; small integers keep every sum exact."""
    rng = np.random.default_rng(16)
    channels, kernels, height, width = 8, 16, 5, 6
    x = rng.integers(-4, 5, (channels, height, width)).astype(np.float16)
    w = rng.integers(-4, 5, (kernels, channels, 1, 1)).astype(np.float16)
    spec, t = fp16_pointwise_task(channels, kernels, height, width)
    t.set("DPU", "BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=1, BS_BYPASS=1)
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    load_cube(m, spec.feature, x, c2=8)
    m.memory.load(spec.weights, w[:, :, 0, 0].tobytes())  # one [16 oc][8 ic] block
    run = run_tasks(m, [t.task(MASK_CONV)])
    expected = np.maximum(np.einsum("kc,chw->khw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64)), 0)
    got = read_cube(m, spec.output, kernels, height, width, dtype=np.float16)
    np.testing.assert_array_equal(got.astype(np.float64), expected)
    assert run.tasks[0].traffic.feature_read == height * width * 16


def test_fp16_bs_operand_the_brdma_does_not_fetch_is_refused():
    """An fp16 BS ALU operand from the BRDMA (BS_ALU_SRC=1) with BRDMA_DATA_USE fetching nothing:
    the same refusal as on the integer path, not a lookup error."""
    _, t = fp16_pointwise_task(8, 16, 2, 3)
    t.set("DPU", "BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=0, BS_ALU_SRC=1, BS_BYPASS=0)
    t.set("DPU_RDMA", "BRDMA_CFG", BRDMA_DATA_USE=0)
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    with pytest.raises(EmulationError, match="BS_ALU_SRC=1 but DPU_RDMA.BRDMA_CFG.BRDMA_DATA_USE=0 does not fetch"):
        run_tasks(m, [t.task(MASK_CONV)])


@st.composite
def conv_specs(draw):
    depthwise = draw(st.booleans())
    in_c = draw(st.integers(1, 40))
    kernel = draw(st.integers(1, 3))
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    span = (kernel - 1) * dilation + 1
    in_h, in_w = draw(st.integers(span, 9)), draw(st.integers(span, 9))
    pad_top, pad_left = draw(st.integers(0, span - 1)), draw(st.integers(0, span - 1))
    # bottom/right padding is implied by the output size: take anything up to one more window
    out_h = draw(st.integers(1, (pad_top + in_h - 1) // stride + 1))
    out_w = draw(st.integers(1, (pad_left + in_w - 1) // stride + 1))
    kernels = in_c if depthwise else draw(st.integers(1, 40))
    return ConvSpec(in_c=in_c, in_h=in_h, in_w=in_w, kernels=kernels, kernel=kernel, stride=stride,
                    dilation=dilation, pad_top=pad_top, pad_left=pad_left, out_h=out_h, out_w=out_w,
                    depthwise=depthwise, pad_value=draw(st.integers(-128, 127)))


@settings(max_examples=25)
@given(spec=conv_specs(), seed=st.integers(0, 2**16))
def test_random_conv_geometry_matches_reference(spec, seed):
    got, expected, _ = run_spec(spec, seed)
    np.testing.assert_array_equal(got, expected)


def test_single_line_dma_reads_a_cropped_window():
    """GROUP_LINE_OFF = 1: LINE_STRIDE is the row stride in atoms and SURF_STRIDE counts from the
    end of the first row read (DATAIN_WIDTH atoms), as the vendor programs resnet18's 1x1
    stride-2 shortcut convs on a 55x55 window of a 56x56 tensor (REGISTER_SEMANTICS 2.3)."""
    rng = np.random.default_rng(21)
    full = rng.integers(-128, 128, (32, 10, 10)).astype(np.int8)
    spec = ConvSpec(in_c=32, in_h=9, in_w=9, kernels=32, kernel=1, stride=2, out_h=5, out_w=5,
                    out_scale=1, out_shift=6, bs_shift=14)
    w = rng.integers(-10, 11, (32, 32, 1, 1)).astype(np.int8)
    t = conv_task(spec)
    t.set("CNA", "CONV_CON1", GROUP_LINE_OFF=1)
    t.set("CNA", "DMA_CON1", LINE_STRIDE=10)
    t.set("CNA", "DMA_CON2", SURF_STRIDE=10 * 10 - 9)
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    load_cube(m, spec.feature, full)
    m.memory.load(spec.weights, pack_conv_weights(w).tobytes())
    m.memory.load(spec.bias, bias_blob(np.zeros(32, int), np.zeros(32, int), np.full(32, 16384)))
    run = run_tasks(m, [t.task(MASK_CONV)])
    assert (run.tasks[0].conv.line_stride, run.tasks[0].conv.surface_stride) == (160, 1600)
    acc = np.einsum("kc,chw->khw", w[:, :, 0, 0].astype(np.int64), full[:, 0:9:2, 0:9:2].astype(np.int64))
    expected = out_cvt_reference(acc, 1, 6, 0)
    np.testing.assert_array_equal(read_cube(m, spec.output, 32, 5, 5), expected)
