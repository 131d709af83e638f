"""The vendor's own RK3588 register streams (rknn-toolkit2 2.5.0, chain 0 of the 13 listings in
vendor-corpus/regcmd) run on the machine with synthetic data.

For each case: parse chain 0's words from the listing, place random tensors at addresses we
choose, relocate the address registers (stored as offsets relative to their tensor,
vendor-corpus 4.4 / rknn-relocation.md R1), build the weights and the BRDMA bias blob in the
vendor layout from random integers, run the chain, and compare with an independent reference
of the arithmetic the registers ask for (test_machine_support). The reference computes each
layer whole from the case parameters, whatever the task split, so it also checks the H split,
the channel split, weight reuse and the ping-pong register model.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from npuemu.emulator.machine import Machine
from tests.emulator.test_machine_support import (
    BsParams, Geometry, Listing, bias_blob, bn_reference, bs_reference, conv_reference,
    depthwise_reference, ew_convert_reference, load_listing, lut_reference, out_cvt_reference,
    pack_conv_weights, pack_depthwise_weights, pool_reference, read_cube, relocate, run_tasks,
    sat32, to_nc1hwc2,
)

DDR = 32 << 20
CHUNK = 0x10000  # tensors start 64 KB apart


class Layout:
    """Addresses for named tensors, packed in DDR."""

    def __init__(self) -> None:
        self.addresses: dict[str, int] = {}
        self.next = CHUNK

    def __getitem__(self, name: str) -> int:
        return self.addresses[name]

    def add(self, name: str, nbytes: int) -> int:
        self.addresses[name] = self.next
        self.next += -(-(nbytes + 256) // CHUNK) * CHUNK
        return self.addresses[name]


CONV_REGS = {"feature": ("CNA", "FEATURE_DATA_ADDR"), "weights": ("CNA", "DCOMP_ADDR0"),
             "output": ("DPU", "DST_BASE_ADDR"), "bias": ("DPU_RDMA", "BS_BASE_ADDR"),
             "source": ("DPU_RDMA", "SRC_BASE_ADDR"), "operand": ("DPU_RDMA", "EW_BASE_ADDR"),
             "pool_source": ("PPU_RDMA", "SRC_BASE_ADDR"), "pool_output": ("PPU", "DST_BASE_ADDR")}


def bases(layout: Layout, **roles: str) -> dict:
    return {CONV_REGS[role]: layout[name] for role, name in roles.items()}


def run_listing(listing: Listing, layout: Layout, tables: list[dict], machine: Machine):
    tasks = relocate(listing.tasks, tables)
    return run_tasks(machine, tasks, address=layout.next)


# ---------------------------------------------------------------------------------------------
# Convolution layers
# ---------------------------------------------------------------------------------------------
@dataclass
class ConvLayer:
    """A conv layer of a listing: its first task's registers and the case geometry."""

    listing: Listing
    task: int  # the layer's first task in chain 0
    in_c: int
    in_h: int
    in_w: int
    kernels: int
    kernel: int
    stride: int
    pad: int
    depthwise: bool = False

    def reg(self, block: str, register: str, name: str) -> int:
        return self.listing.field(self.task, block, register, name)

    @property
    def core_channels(self) -> int:
        return self.reg("CORE", "DATAOUT_SIZE_1", "DATAOUT_CHANNEL") + 1

    def geometry(self) -> Geometry:
        out_h = (self.in_h + 2 * self.pad - self.kernel) // self.stride + 1
        out_w = (self.in_w + 2 * self.pad - self.kernel) // self.stride + 1
        return Geometry(out_h, out_w, self.kernel, self.kernel, self.stride, 1, self.pad, self.pad)

    def data(self, rng, weight_range: int = 12):
        """Random weights, their blob and BS operands (padded input channels: weight -CPEND)."""
        # operands for every channel any task of the layer reads (rep05's second channel group
        # reads a full 64-channel group of the blob)
        produced = self.in_c if self.depthwise else self.kernels
        channels = -(-produced // 32) * 32 + self.core_channels
        cpend = rng.integers(-20, 21, channels)
        alu = rng.integers(-(2**15), 2**15, channels)
        mul = rng.integers(2**13, 2**14 + 1, channels)
        if self.depthwise:
            shape = (self.in_c, self.kernel, self.kernel)
            w = rng.integers(-weight_range, weight_range + 1, shape).astype(np.int8)
            blob = pack_depthwise_weights(w)
        else:
            w = rng.integers(-weight_range, weight_range + 1,
                             (self.kernels, self.in_c, self.kernel, self.kernel)).astype(np.int8)
            blob = pack_conv_weights(w, fill=-cpend[:self.kernels])
        return w, blob, (alu, cpend, mul)

    def reference(self, x, w, operands, residual=None) -> np.ndarray:
        """The layer's int8 output [K][OH][OW] from the arithmetic its registers ask for."""
        pad_value = int(np.int8(np.uint8(self.reg("CNA", "PAD_CON1", "PAD_VALUE") & 0xFF)))
        geometry = self.geometry()
        alu, cpend, mul = (np.asarray(v[:self.in_c if self.depthwise else self.kernels]) for v in operands)
        if self.depthwise:
            acc, sums = depthwise_reference(x, w, geometry, pad_value)
        else:
            acc, sums = conv_reference(x, w, geometry, pad_value)
        assert self.reg("CORE", "CLIP_TRUNCATE", "CLIP_TRUNCATE") == 0
        bs_cfg = {n: self.reg("DPU", "BS_CFG", n) for n in ("BS_BYPASS", "BS_ALU_BYPASS", "BS_MUL_BYPASS",
                                                              "BS_RELU_BYPASS", "BS_ALU_ALGO")}
        assert bs_cfg["BS_BYPASS"] == bs_cfg["BS_ALU_BYPASS"] == bs_cfg["BS_MUL_BYPASS"] == 0
        assert bs_cfg["BS_ALU_ALGO"] == 2  # add
        v = bs_reference(acc, BsParams(
            alu=alu, mul=mul, cpend=cpend, shift=self.reg("DPU", "BS_MUL_CFG", "BS_MUL_SHIFT_VALUE"),
            shift_neg=self.reg("DPU", "DATA_FORMAT", "BS_MUL_SHIFT_VALUE_NEG"),
            cpend_on=not self.reg("DPU", "BS_OW_CFG", "OD_BYPASS"), relu=not bs_cfg["BS_RELU_BYPASS"]), sums)
        if not self.reg("DPU", "BN_CFG", "BN_BYPASS"):
            assert self.reg("DPU", "BN_CFG", "BN_MUL_BYPASS") and self.reg("DPU", "BN_CFG", "BN_ALU_BYPASS")
            v = bn_reference(v, 0, 0, 0, relu=not self.reg("DPU", "BN_CFG", "BN_RELU_BYPASS"),
                             mul_on=False, alu_on=False)
        if not self.reg("DPU", "EW_CFG", "EW_BYPASS"):
            assert residual is not None and self.reg("DPU", "EW_CFG", "EW_ALU_ALGO") == 2
            operand = ew_convert_reference(
                residual, self.reg("DPU", "EW_CVT_OFFSET_VALUE", "EW_OP_CVT_OFFSET"),
                self.reg("DPU", "EW_CVT_SCALE_VALUE", "EW_OP_CVT_SCALE"),
                self.reg("DPU", "EW_CVT_SCALE_VALUE", "EW_OP_CVT_SHIFT"),
                round_away=bool(self.reg("DPU", "EW_CFG", "EW_CVT_ROUND")))
            v = sat32(v + operand)
            if not self.reg("DPU", "EW_CFG", "EW_RELU_BYPASS"):
                v = np.maximum(v, 0)
        return out_cvt_reference(v, self.reg("DPU", "OUT_CVT_SCALE", "OUT_CVT_SCALE"),
                                 self.reg("DPU", "OUT_CVT_SHIFT", "OUT_CVT_SHIFT"),
                                 self.reg("DPU", "OUT_CVT_OFFSET", "OUT_CVT_OFFSET"),
                                 round_away=bool(self.reg("DPU", "OUT_CVT_SHIFT", "CVT_ROUND")))

    def place(self, machine: Machine, layout: Layout, name: str, blob, operands) -> None:
        layout.add(f"{name}.w", blob.size)
        machine.memory.load(layout[f"{name}.w"], blob.tobytes())
        data = bias_blob(*operands)
        layout.add(f"{name}.b", len(data))
        machine.memory.load(layout[f"{name}.b"], data)


def informative(expected: np.ndarray, minimum: float = 0.2) -> None:
    share = float(np.mean((expected > -128) & (expected < 127)))
    assert share >= minimum, f"only {share:.2f} of the reference outputs are unsaturated"


def single_conv(case: str, seed: int, weight_range: int = 12, first_layer: bool = False):
    listing = load_listing(case)
    p = listing.case
    depthwise = p["kind"] == "dwconv"
    layer = ConvLayer(listing, 0, p["C"], p["H"], p["W"], p["cout"], p["kh"], p["stride"], p["pad_t"],
                      depthwise)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (layer.in_c, layer.in_h, layer.in_w)).astype(np.int8)
    w, blob, operands = layer.data(rng, weight_range)
    machine = Machine.for_platform("rk3588", ddr_size=DDR)
    layout = Layout()
    if first_layer:  # 3 bytes per pixel, native [1,1,H,W,3] (vendor-corpus 5)
        image = np.ascontiguousarray(x.transpose(1, 2, 0))
        machine.memory.load(layout.add("in", image.size), image.tobytes())
    else:
        cube = to_nc1hwc2(x)
        machine.memory.load(layout.add("in", cube.size), cube.tobytes())
    layer.place(machine, layout, "l", blob, operands)
    geometry = layer.geometry()
    out_channels = -(-(layer.in_c if depthwise else layer.kernels) // 64) * 64
    layout.add("out", out_channels * geometry.out_h * geometry.out_w)
    tables = [bases(layout, feature="in", weights="l.w", output="out", bias="l.b")] * len(listing.tasks)
    run = run_listing(listing, layout, tables, machine)
    got = read_cube(machine, layout["out"], layer.in_c if depthwise else layer.kernels,
                    geometry.out_h, geometry.out_w)
    return got, layer.reference(x, w, operands), run


@pytest.mark.parametrize("case, tasks", [
    ("rep01_conv3x3s1_32to32_56_relu", 1),
    ("rep02_conv1x1_64to128_28", 1),
    ("rep04_dw3x3s1_64_56", 1),
    ("rep05_dw3x3s2_96_112", 6),  # channel groups 0-63 / 64-95 interleaved, H split in 3
    ("rep06_conv3x3s1_64to64_150_bigcbuf", 5),  # H split with WEIGHT_REUSE and delta tasks
])
def test_vendor_conv_stream(case, tasks):
    weight_range = 40 if "dw" in case else 12
    got, expected, run = single_conv(case, seed=zlib.crc32(case.encode()), weight_range=weight_range)
    assert len(run.tasks) == tasks
    informative(expected)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case", ["rep03_conv3x3s2_3to32_224_first",
                                  "rep03b_conv3x3s2_3to32_224_first_meanstd"])
def test_vendor_first_layer_image_input(case):
    got, expected, run = single_conv(case, seed=3, weight_range=60, first_layer=True)
    assert [t.conv.argb_channels for t in run.tasks] == [3, 3, 3]
    assert [t.conv.weight_reuse for t in run.tasks] == [False, True, True]
    informative(expected)
    np.testing.assert_array_equal(got, expected)


def test_rep06_weight_reuse_reads_weights_once_and_rows_overlap():
    _, _, run = single_conv("rep06_conv3x3s1_64to64_150_bigcbuf", seed=6)
    weights = [t.traffic.weight_read for t in run.tasks]
    assert weights == [36864, 0, 0, 0, 0]  # WEIGHT_REUSE on tasks 1..4
    rows = [t.conv.in_height for t in run.tasks]
    assert rows == [34, 34, 34, 34, 22]
    out_rows = [t.conv.out_height for t in run.tasks]
    assert out_rows == [33, 32, 32, 32, 21] and sum(out_rows) == 150
    assert sum(t.traffic.feature_read for t in run.tasks) == sum(rows) * 150 * 64


def test_rep11_fully_connected_with_reshape_task():
    listing = load_listing("rep11_fc_512to1000")
    rng = np.random.default_rng(11)
    x = rng.integers(-128, 128, 512).astype(np.int8)
    layer = ConvLayer(listing, 1, 512, 1, 1, 1000, 1, 1, 0)
    w, blob, operands = layer.data(rng, weight_range=6)
    machine = Machine.for_platform("rk3588", ddr_size=DDR)
    layout = Layout()
    machine.memory.load(layout.add("in0", 512), x.tobytes())  # [1, 512], flat
    layout.add("in0_tp_rs", 512)
    layer.place(machine, layout, "fc", blob, operands)
    layout.add("out", 1024)
    tables = [bases(layout, source="in0", output="in0_tp_rs"),
              bases(layout, feature="in0_tp_rs", weights="fc.w", output="out", bias="fc.b")]
    run = run_listing(listing, layout, tables, machine)
    assert [t.enable_mask for t in run.tasks] == [0x18, 0x1D]
    assert run.tasks[1].conv.out_channels == 1024 and run.tasks[1].conv.kernels == 1000
    got = read_cube(machine, layout["out"], 1000, 1, 1)[:, 0, 0]
    expected = layer.reference(x.reshape(512, 1, 1), w, operands)[:, 0, 0]
    informative(expected)
    np.testing.assert_array_equal(got, expected)


def test_rep12_resblock_with_residual_add():
    listing = load_listing("rep12_resblock_convadd_3x3_64_56")
    rng = np.random.default_rng(12)
    x = rng.integers(-128, 128, (64, 56, 56)).astype(np.int8)
    layers = [ConvLayer(listing, 0, 64, 56, 56, 64, 1, 1, 0), ConvLayer(listing, 1, 64, 56, 56, 64, 3, 1, 1),
              ConvLayer(listing, 2, 64, 56, 56, 64, 3, 1, 1)]
    machine = Machine.for_platform("rk3588", ddr_size=DDR)
    layout = Layout()
    machine.memory.load(layout.add("in0", x.size), to_nc1hwc2(x).tobytes())
    for name in ("relu_out5", "relu_out11", "add_out17"):
        layout.add(name, x.size)
    params = []
    for index, layer in enumerate(layers):
        w, blob, operands = layer.data(rng, weight_range=6)
        layer.place(machine, layout, f"l{index}", blob, operands)
        params.append((w, operands))
    tables = [bases(layout, feature="in0", weights="l0.w", output="relu_out5", bias="l0.b"),
              bases(layout, feature="relu_out5", weights="l1.w", output="relu_out11", bias="l1.b"),
              bases(layout, feature="relu_out11", weights="l2.w", output="add_out17", bias="l2.b",
                    source="relu_out5", operand="relu_out5")]
    run = run_listing(listing, layout, tables, machine)
    first = layers[0].reference(x, *params[0])
    second = layers[1].reference(first, *params[1])
    expected = layers[2].reference(second, *params[2], residual=first)
    np.testing.assert_array_equal(read_cube(machine, layout["relu_out5"], 64, 56, 56), first)
    np.testing.assert_array_equal(read_cube(machine, layout["relu_out11"], 64, 56, 56), second)
    informative(expected)
    np.testing.assert_array_equal(read_cube(machine, layout["add_out17"], 64, 56, 56), expected)
    # COMB_USE=5: the residual comes half through the MRDMA, half through the ERDMA
    last = run.tasks[2].traffic
    assert last.main_read == last.ew_read == 2 * 56 * 56 * 16


# ---------------------------------------------------------------------------------------------
# DPU-only and PPU streams
# ---------------------------------------------------------------------------------------------
def test_rep09_elementwise_add():
    listing = load_listing("rep09_add_64_56")
    rng = np.random.default_rng(9)
    a, b = (rng.integers(-128, 128, (64, 56, 56)).astype(np.int8) for _ in range(2))
    machine = Machine.for_platform("rk3588", ddr_size=DDR)
    layout = Layout()
    for name, value in (("in0", a), ("in1", b)):
        machine.memory.load(layout.add(name, value.size), to_nc1hwc2(value).tobytes())
    layout.add("out", a.size)
    run = run_listing(listing, layout, [bases(layout, source="in0", operand="in1", output="out")], machine)
    f = lambda register, name: listing.field(0, "DPU", register, name)  # noqa: E731
    v = bs_reference(a.astype(np.int64), BsParams(alu=f("BS_ALU_CFG", "BS_ALU_OPERAND"),
                                                  mul=f("BS_MUL_CFG", "BS_MUL_OPERAND"),
                                                  shift=f("BS_MUL_CFG", "BS_MUL_SHIFT_VALUE")))
    operand = ew_convert_reference(b, f("EW_CVT_OFFSET_VALUE", "EW_OP_CVT_OFFSET"),
                                   f("EW_CVT_SCALE_VALUE", "EW_OP_CVT_SCALE"),
                                   f("EW_CVT_SCALE_VALUE", "EW_OP_CVT_SHIFT"))
    expected = out_cvt_reference(sat32(v + operand), f("OUT_CVT_SCALE", "OUT_CVT_SCALE"),
                                 f("OUT_CVT_SHIFT", "OUT_CVT_SHIFT"), f("OUT_CVT_OFFSET", "OUT_CVT_OFFSET"))
    informative(expected)
    np.testing.assert_array_equal(read_cube(machine, layout["out"], 64, 56, 56), expected)
    assert run.tasks[0].traffic.main_read == run.tasks[0].traffic.ew_read == a.size


def test_rep10_sigmoid_uploads_and_uses_the_lut():
    listing = load_listing("rep10_sigmoid_64_56")
    rng = np.random.default_rng(10)
    x = np.arange(64 * 56 * 56).reshape(64, 56, 56) % 256 - 128  # every int8 value, many times
    x = rng.permutation(x.reshape(-1)).reshape(64, 56, 56).astype(np.int8)
    machine = Machine.for_platform("rk3588", ddr_size=DDR)
    layout = Layout()
    machine.memory.load(layout.add("in0", x.size), to_nc1hwc2(x).tobytes())
    layout.add("out", x.size)
    table = bases(layout, source="in0", output="out")
    run = run_listing(listing, layout, [table, table], machine)
    assert len(run.tasks) == 2 and run.tasks[1].groups["DPU"] == 0  # S_POINTER 0x30 cleared the pointer
    f = lambda register, name: listing.field(1, "DPU", register, name)  # noqa: E731
    v = bn_reference(x.astype(np.int64), f("BN_MUL_CFG", "BN_MUL_OPERAND"), f("BN_ALU_CFG", "BN_ALU_OPERAND"),
                     f("BN_MUL_CFG", "BN_MUL_SHIFT_VALUE"))
    le, lo = listing.lut_data[1:514], listing.lut_data[514:1027]  # the first word is a type-0 access

    def table_cfg(name):
        return (f(f"LUT_{name}_START", "V"), f(f"LUT_{name}_END", "V"),
                f("LUT_INFO", f"LUT_{name}_INDEX_SELECT"),
                f(f"LUT_{name}_SLOPE_SCALE", "UFLOW_SCALE"), f(f"LUT_{name}_SLOPE_SHIFT", "UFLOW_SHIFT"),
                f(f"LUT_{name}_SLOPE_SCALE", "OFLOW_SCALE"), f(f"LUT_{name}_SLOPE_SHIFT", "OFLOW_SHIFT"))

    looked_up = lut_reference(v, le, lo, table_cfg("LE"), table_cfg("LO"),
                              (f("LUT_CFG", "LUT_HYBRID_PRIORITY"), f("LUT_CFG", "LUT_UFLOW_PRIORITY"),
                               f("LUT_CFG", "LUT_OFLOW_PRIORITY")))
    clamped = np.maximum(looked_up, 0)  # EW_CFG 0x300: ALU max with EW_OP_VALUE_0 = 0, after the LUT
    expected = out_cvt_reference(clamped, f("OUT_CVT_SCALE", "OUT_CVT_SCALE"),
                                 f("OUT_CVT_SHIFT", "OUT_CVT_SHIFT"), f("OUT_CVT_OFFSET", "OUT_CVT_OFFSET"))
    got = read_cube(machine, layout["out"], 64, 56, 56)
    np.testing.assert_array_equal(got, expected)
    # and it is a sigmoid: within 1 output LSB of the float function (vendor scales)
    s_in, zp_in, s_out, zp_out = 0.038023993372917175, 2, 0.003887634491547942, -128
    ideal = np.round(1 / (1 + np.exp(-(x.astype(np.float64) - zp_in) * s_in)) / s_out) + zp_out
    assert np.max(np.abs(got - np.clip(ideal, -128, 127))) <= 1


def test_rep07_maxpool():
    listing = load_listing("rep07_maxpool_k3s2p1_64_112")
    x = np.random.default_rng(7).integers(-128, 128, (64, 112, 112)).astype(np.int8)
    machine = Machine.for_platform("rk3588", ddr_size=DDR)
    layout = Layout()
    machine.memory.load(layout.add("in0", x.size), to_nc1hwc2(x).tobytes())
    layout.add("out", 64 * 56 * 56)
    run = run_listing(listing, layout, [bases(layout, pool_source="in0", pool_output="out")], machine)
    expected = pool_reference(x, "max", 3, 2, 56, 56, pad_top=1, pad_left=1)
    np.testing.assert_array_equal(read_cube(machine, layout["out"], 64, 56, 56), expected)
    assert run.tasks[0].traffic.ppu_read == x.size and run.tasks[0].traffic.ppu_write == 64 * 56 * 56


def test_rep08_average_pool():
    listing = load_listing("rep08_avgpool_k2s2_64_56")
    x = np.random.default_rng(8).integers(-128, 128, (64, 56, 56)).astype(np.int8)
    machine = Machine.for_platform("rk3588", ddr_size=DDR)
    layout = Layout()
    machine.memory.load(layout.add("in0", x.size), to_nc1hwc2(x).tobytes())
    layout.add("out", 64 * 28 * 28)
    run_listing(listing, layout, [bases(layout, pool_source="in0", pool_output="out")], machine)
    expected = pool_reference(x, "avg", 2, 2, 28, 28)
    np.testing.assert_array_equal(read_cube(machine, layout["out"], 64, 28, 28), expected)


def test_every_listing_chain0_parses():
    from tests.emulator.test_machine_support import corpus_dir

    names = sorted(p.stem for p in corpus_dir().glob("rep*.txt"))
    assert len(names) == 13
    for name in names:
        listing = load_listing(name)
        assert listing.tasks and all(t.enable_mask in (0x18, 0x1D, 0x60) for t in listing.tasks)
