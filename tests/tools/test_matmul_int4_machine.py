"""The CNA/CORE int4 and mixed-precision paths on the machine, with hand-built register tasks
(emulator/REGISTER_SEMANTICS.md 2.7): CNA IN_PRECISION = the feature's precision, PROC_PRECISION
(= CORE PROC_PRECISION) the weights'; int4 packs two values per byte, features low nibble first
(the guide's A order), weights high nibble first (the guide's B order), weights in
[N/64][K/32][KH][KW][64][32] blocks. The layouts and references below are written from those
descriptions (rknpu-isa.md 4, hardware.md 2), not from the emulator's code.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.emulator.machine import Machine
from npuemu.isa.errors import EmulationError
from tests.emulator.test_machine_support import MASK_CONV, TaskWriter, dpu_writes, read_cube, run_tasks

INT8, INT16, FP16, INT32, FP32, INT4 = 0, 1, 2, 4, 5, 6
FEATURE, WEIGHTS, OUTPUT = 0x10000, 0x200000, 0x300000
#: (feature, weight, DPU processing, output) precision codes, and the weight block (kernels, channels)
PATHS = {
    "int4xint4->int16": (INT4, INT4, INT4, INT16, (64, 32)),
    "int8xint4->int32": (INT8, INT4, INT8, INT32, (64, 32)),
    "fp16xint8->fp32": (FP16, INT8, FP16, FP32, (32, 32)),
    "fp16xint4->fp32": (FP16, INT4, FP16, FP32, (64, 32)),
}
VALUES = {INT4: (-8, 8), INT8: (-128, 128)}


def _nibbles(values: np.ndarray, high_first: bool) -> bytes:
    v = (values.reshape(-1, 2).astype(np.int16) & 0xF).astype(np.uint8)
    first, second = v[:, 0], v[:, 1]
    return (((first << 4) | second) if high_first else (first | (second << 4))).astype(np.uint8).tobytes()


def _feature_bytes(x: np.ndarray, precision: int) -> bytes:
    """[C][H][W] -> NC1HWC2 with 16-byte atoms: C2 = 32 int4 / 16 int8 / 8 fp16."""
    c2 = {INT4: 32, INT8: 16, FP16: 8}[precision]
    channels, height, width = x.shape
    groups = -(-channels // c2)
    padded = np.zeros((groups * c2, height, width), x.dtype)
    padded[:channels] = x
    atoms = padded.reshape(groups, c2, height, width).transpose(0, 2, 3, 1)
    return _nibbles(atoms, high_first=False) if precision == INT4 else np.ascontiguousarray(atoms).tobytes()


def _weight_bytes(w: np.ndarray, precision: int, block: tuple[int, int]) -> bytes:
    """[N][C][KH][KW] -> [N/n][C/c][KH][KW][n][c] (whole blocks: N, C multiples of the block)."""
    n, c = block
    kernels, channels, kh, kw = w.shape
    blocks = w.reshape(kernels // n, n, channels // c, c, kh, kw).transpose(0, 2, 4, 5, 1, 3)
    return _nibbles(blocks, high_first=True) if precision == INT4 else np.ascontiguousarray(blocks).tobytes()


def _task(path: str, channels: int, height: int, width: int, kernels: int, kernel: int, pad: int = 0,
          pad_value: int = 0) -> TaskWriter:
    feature, weight, proc, out, _ = PATHS[path]
    out_h, out_w = height + 2 * pad - kernel + 1, width + 2 * pad - kernel + 1
    weight_bits = 4 if weight == INT4 else 8
    per_kernel = kernel * kernel * channels * weight_bits // 8
    line = width * 16 // 4
    t = TaskWriter()
    t.set("CNA", "CBUF_CON0", WEIGHT_BANK=6, DATA_BANK=6)
    t.set("CNA", "CONV_CON1", IN_PRECISION=feature, PROC_PRECISION=weight)
    t.set("DPU", "S_POINTER", 0xE).set("DPU_RDMA", "S_POINTER", 0xE)
    t.set("CNA", "CONV_CON2", FEATURE_GRAINS=kernel + 1)
    t.set("CNA", "CONV_CON3", CONV_X_STRIDE=1, CONV_Y_STRIDE=1)
    t.set("CNA", "DATA_SIZE0", DATAIN_WIDTH=width, DATAIN_HEIGHT=height)
    t.set("CNA", "DATA_SIZE1", DATAIN_CHANNEL_REAL=(channels - 1) % 64, DATAIN_CHANNEL=channels)
    t.set("CNA", "DATA_SIZE2", DATAOUT_WIDTH=out_w)
    t.set("CNA", "DATA_SIZE3", DATAOUT_ATOMICS=out_w * out_h)
    t.set("CNA", "WEIGHT_SIZE0", WEIGHT_BYTES=per_kernel * kernels)
    t.set("CNA", "WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=per_kernel)
    t.set("CNA", "WEIGHT_SIZE2", WEIGHT_WIDTH=kernel, WEIGHT_HEIGHT=kernel, WEIGHT_KERNELS=kernels)
    t.set("CNA", "CVT_CON0", DATA_SIGN=1, CVT_TYPE=1, CVT_BYPASS=1)
    t.set("CNA", "FEATURE_DATA_ADDR", FEATURE)
    t.set("CNA", "DMA_CON1", LINE_STRIDE=line)
    t.set("CNA", "DMA_CON2", SURF_STRIDE=(width * height - line) % (1 << 28))  # 28 bits, wraps
    t.set("CNA", "FC_DATA_SIZE0", DMA_WIDTH=width, DMA_HEIGHT=height)
    t.set("CNA", "FC_DATA_SIZE1", DMA_CHANNEL=channels)
    t.set("CNA", "DCOMP_ADDR0", WEIGHTS)
    t.set("CNA", "PAD_CON0", PAD_TOP=pad, PAD_LEFT=pad)
    t.set("CNA", "PAD_CON1", pad_value & 0xFFFFFFFF)
    t.set("CORE", "MISC_CFG", PROC_PRECISION=weight, QD_EN=1)
    t.set("CORE", "DATAOUT_SIZE_0", DATAOUT_HEIGHT=out_h - 1, DATAOUT_WIDTH=out_w - 1)
    t.set("CORE", "DATAOUT_SIZE_1", DATAOUT_CHANNEL=kernels - 1)
    dpu_writes(t, out_w, out_h, kernels, kernels, dst=OUTPUT, surface=out_w * out_h, size_e=7, flying=False)
    t.set("DPU", "DATA_FORMAT", OUT_PRECISION=out, IN_PRECISION=proc, PROC_PRECISION=proc)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", BURST_LEN=15, MRDMA_DISABLE=1)
    return t


def _run(path, x, w, kernel, pad=0, pad_value=0):
    feature, weight, _, out, block = PATHS[path]
    machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
    machine.memory.load(FEATURE, _feature_bytes(x, feature))
    machine.memory.load(WEIGHTS, _weight_bytes(w, weight, block))
    task = _task(path, x.shape[0], x.shape[1], x.shape[2], w.shape[0], kernel, pad, pad_value)
    run = run_tasks(machine, [task.task(MASK_CONV)])
    dtype = {INT16: np.int16, INT32: np.int32, FP32: np.float32}[out]
    out_h, out_w = x.shape[1] + 2 * pad - kernel + 1, x.shape[2] + 2 * pad - kernel + 1
    return read_cube(machine, OUTPUT, w.shape[0], out_h, out_w, dtype=dtype), run


def _exact(x, w):
    """Exact (float64 / int64) valid convolution [N][OH][OW]."""
    kernels, _, kh, kw = w.shape
    out_h, out_w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    acc = np.zeros((kernels, out_h, out_w), np.float64)
    for dy in range(kh):
        for dx in range(kw):
            acc += np.einsum("nc,chw->nhw", w[:, :, dy, dx].astype(np.float64),
                             x[:, dy:dy + out_h, dx:dx + out_w].astype(np.float64))
    return acc


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(sorted(PATHS)), st.sampled_from([32, 64, 96]), st.integers(1, 6), st.integers(1, 5),
       st.sampled_from([1, 3]), st.integers(1, 2), st.integers(0, 2**31))
def test_int4_and_mixed_paths_on_the_machine(path, channels, height, width, kernel, groups, seed):
    feature, weight, _, out, block = PATHS[path]
    height, width = height + kernel - 1, width + kernel - 1
    rng = np.random.default_rng(seed)
    kernels = groups * block[0]
    if feature == FP16:
        x = rng.normal(size=(channels, height, width)).astype(np.float16)
    else:
        x = rng.integers(*VALUES[feature], (channels, height, width)).astype(np.int8)
    w = rng.integers(*VALUES[weight], (kernels, channels, kernel, kernel)).astype(np.int8)
    got, _ = _run(path, x, w, kernel)
    exact = _exact(x, w)
    if out == FP32:  # fp32 accumulation of exact products: the fp32 sum's bound (NUMERICS 3.3)
        bound = channels * kernel * kernel * 2.0**-24 * _exact(np.abs(x.astype(np.float64)), np.abs(w))
        assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)
    else:
        limit = np.iinfo(np.int16 if out == INT16 else np.int32)
        np.testing.assert_array_equal(got, np.clip(exact, limit.min, limit.max).astype(got.dtype))


def test_int4_pad_value_is_the_low_nibble():
    """An int4 feature pads with PAD_VALUE's low nibble, sign-extended (REGISTER_SEMANTICS 2.7):
    0x3E reads as -2 (its low byte 0x3E would be 62 as int8)."""
    rng = np.random.default_rng(5)
    x = rng.integers(-8, 8, (32, 3, 4)).astype(np.int8)
    w = rng.integers(-8, 8, (64, 32, 3, 3)).astype(np.int8)
    got, _ = _run("int4xint4->int16", x, w, 3, pad=1, pad_value=0x3E)
    padded = np.full((32, 5, 6), -2, np.int8)
    padded[:, 1:4, 1:5] = x
    np.testing.assert_array_equal(got, _exact(padded, w).astype(np.int16))


def test_int4_output_saturates_to_int16():
    """int4 x int4 sums past int16 saturate at the int16 output (DPU OUT_PRECISION int16)."""
    channels = 1024
    x = np.full((channels, 1, 1), -8, np.int8)
    w = np.full((64, channels, 1, 1), -8, np.int8)
    w[1] = 7
    got, _ = _run("int4xint4->int16", x, w, 1)
    assert got[0, 0, 0] == 32767 and got[1, 0, 0] == -32768  # 65536 and -57344


def test_int4_weight_traffic_and_rate():
    """int4 weights are half the int8 bytes in 64-kernel groups, and the timing model runs the
    MAC at the int4 rate (2048 MACs/cycle: 64 kernels a pass, rk3588.yaml macs)."""
    from npuemu.emulator.timing.npu_cycles import atom_k
    from npuemu.platforms import load_platform

    x = np.ones((64, 1, 1), np.int8)
    w = np.ones((128, 64, 1, 1), np.int8)
    _, run = _run("int4xint4->int16", x, w, 1)
    record = run.tasks[0]
    assert record.conv.weight_bytes == 128 * 64 // 2
    assert record.conv.kernel_group == 64
    assert atom_k(record.conv.precision, load_platform("rk3588")) == 64


@pytest.mark.parametrize("cna, core, message", [
    (dict(IN_PRECISION=INT4, PROC_PRECISION=INT4), dict(PROC_PRECISION=INT8),
     "precisions disagree: CNA.CONV_CON1.PROC_PRECISION=6"),
    (dict(IN_PRECISION=INT4, PROC_PRECISION=INT4, CONV_MODE=3), dict(PROC_PRECISION=INT4, DW_EN=1),
     "depthwise convolution in int4 x int4 is not modelled"),
    (dict(IN_PRECISION=INT4, PROC_PRECISION=FP16), dict(PROC_PRECISION=FP16), "int4 x fp16 .* is not modelled"),
])
def test_inconsistent_or_unmodelled_int4_tasks_are_refused(cna, core, message):
    t = _task("int4xint4->int16", 32, 1, 1, 64, 1)
    t.set("CNA", "CONV_CON1", **cna)
    t.set("CORE", "MISC_CFG", QD_EN=1, **core)
    machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
    with pytest.raises(EmulationError, match=message):
        run_tasks(machine, [t.task(MASK_CONV)])
