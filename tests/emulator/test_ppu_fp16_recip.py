"""fp16 PPU average pools: RECIP_KERNEL_WIDTH/HEIGHT hold the fp16 bits of 2^16 / k (NUMERICS.md 38,
REGISTER_SEMANTICS.md 57).

``tests/data/vendor_ppu_fp16/avg_pools.npz`` holds derived facts of rknn-toolkit2 2.5.0 rk3588 fp16 builds
(``do_quantization=False``) of single AveragePools / a GlobalAveragePool: k1x3 ([1, 16, 1, 40], kernel 1x3 s1
p0,1), k1x2 (1x2 s1x2), k2 ([1, 24, 12, 20] 2x2 s2), k3s2 ([1, 16, 12, 20] 3x3 s2 p1), k5 ([1, 40, 14, 14] 5x5
s1 p2), k7 ([1, 16, 14, 14] 7x7 s1 p3), k3x5 ([1, 16, 12, 20] 3x5 s1 p1,2), g1 (GlobalAveragePool over 1 x 1 of
16 channels); pads counted, input ``RandomState(5).randn * 2 + 0.5``. Per build: the PPU task's
POOLING_KERNEL_CFG, POOLING_PADDING_CFG, RECIP_KERNEL_WIDTH, RECIP_KERNEL_HEIGHT words (read with
``npuemu disasm``), channel 0 of the fp32 input (all of g1's) and the vendor simulator's output for it.
The simulator pools the fp32 input with fp32 1 / k (it does not read the RECIP words), so the emulator
is held to the hardware reading within a bound, not bit for bit.
"""

import lzma
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.compiler.quant_regs import pool_reciprocal
from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import PoolConfig, nc1hwc2_to_nchw, nchw_to_nc1hwc2, pool_nc1hwc2
from npuemu.emulator.kernels.ppu import fp16_recip_value
from npuemu.isa.errors import EmulationError, UnsupportedProgramError
from tests.emulator.reference import pooling as ref

FIXTURE = Path(__file__).parent.parent / "data" / "vendor_ppu_fp16" / "avg_pools.npz"
VENDOR_WORDS = {1: 0x7C00, 2: 0x7800, 3: 0x7555, 5: 0x7266, 7: 0x7092}  # [V ORC] the builds above


def builds():
    data = np.load(FIXTURE)
    for name in sorted({key.rsplit("_", 1)[0] for key in data.files}):
        yield name, data[f"{name}_regs"], data[f"{name}_x"], data[f"{name}_sim"]


def geometry(regs):
    kernel, pads = int(regs[0]), int(regs[1])
    return dict(kernel_w=(kernel & 15) + 1, kernel_h=((kernel >> 8) & 15) + 1, stride_x=((kernel >> 16) & 15) + 1,
                stride_y=((kernel >> 20) & 15) + 1, pad_left=pads & 7, pad_top=(pads >> 4) & 7,
                pad_right=(pads >> 8) & 7, pad_bottom=(pads >> 12) & 7)


def test_compiler_writes_the_vendor_words():
    for kernel, word in VENDOR_WORDS.items():
        assert pool_reciprocal(kernel, "float16") == word
    for name, regs, _, _ in builds():
        g = geometry(regs)
        assert (pool_reciprocal(g["kernel_w"], "float16"), pool_reciprocal(g["kernel_h"], "float16")) == \
            (regs[2], regs[3]), name
    assert [pool_reciprocal(k) for k in (1, 2, 3)] == [65536, 32768, 21845]  # int8 keeps the integer form


def test_int8_pools_keep_the_integer_form():
    """The vendor's int8 AveragePool 2x2 s2 (ap2) and 3x3 s1 p1 (ap3p) on rk3576 and their rk3588 twins
    (tests/data/rk3576_vendor/forms_tasks.npz.xz) write round(2^16 / k): 0x8000, 0x5555."""
    import io

    with lzma.open(FIXTURE.parent.parent / "rk3576_vendor" / "forms_tasks.npz.xz") as f:
        tasks = np.load(io.BytesIO(f.read()))
    for case, kernel in (("ap2", 2), ("ap3p", 3)):
        for chip in ("rk3576", "rk3588"):
            words = [int(w) for w in tasks[f"{case}.{chip}"] if int(w) >> 48 and int(w) & 0xFFFF in (0x6038, 0x603C)]
            assert [(w >> 16) & 0xFFFFFFFF for w in words] == [pool_reciprocal(kernel)] * 2, (case, chip)


@pytest.mark.parametrize("kernel", range(1, 17))  # POOLING_KERNEL_CFG's 4-bit kernel fields: 1..16
def test_encoding_round_trip(kernel):
    word = pool_reciprocal(kernel, "float16")
    assert word < 1 << 16
    value = fp16_recip_value(word)
    # the value is fp16(1 / k) scaled by 2^16: RNE of 1 / k to 11 significant bits (exact for powers of two)
    assert value == float(np.float16(1 / kernel)) * 65536
    assert abs(value * kernel / 65536 - 1) <= 2.0**-11
    assert ref.fp16_recip(word) == np.float32(value)


def test_decoding_special_words():
    assert fp16_recip_value(0x7C00) == 65536.0  # exponent 31 is a number, not infinity
    assert fp16_recip_value(0x7FFF) == 131008.0
    assert fp16_recip_value(0x0001) == 2.0**-24
    assert fp16_recip_value(0x8000 | 0x3C00) == -1.0
    with pytest.raises(EmulationError, match="bits above 15"):
        fp16_recip_value(0x10000)  # the int8 form of k = 1


def test_decoding_an_fp16_average_pool_refuses_the_integer_form():
    # units/ppu.decode_ppu: the int8 form's 2^16 (k = 1) in an fp16 average pool's RECIP field is refused by
    # name; the fp16 form's 0x7c00 decodes
    from npuemu.emulator.regfile import RegisterFile
    from npuemu.emulator.units.ppu import decode_ppu
    from npuemu.emulator.units.state import FP16
    from tests.emulator.test_machine_support import REGMAP, pool_task

    for recip in (0x10000, 0x7C00):
        task = pool_task(4, 4, 8, method=nm.POOL_AVERAGE, kernel=1, stride=1, out_w=4, out_h=4, src=0x1000,
                         dst=0x2000)
        task.set("PPU", "DATA_FORMAT", INDEX_ADD=16, PROC_PRECISION=FP16)
        task.set("PPU", "RECIP_KERNEL_WIDTH", RECIP_KERNEL_WIDTH=recip)
        task.set("PPU", "RECIP_KERNEL_HEIGHT", RECIP_KERNEL_HEIGHT=recip)
        regfile = RegisterFile(REGMAP)
        regfile.apply(regfile.resolve(tuple(task.writes)), "t")
        if recip >> 16:
            with pytest.raises(EmulationError, match=r"t: fp16 average pool with PPU.RECIP_KERNEL_WIDTH=0x10000: "
                                                     r"bit 16 is set"):
                decode_ppu(regfile.view("PPU"), "t")
        else:
            state = decode_ppu(regfile.view("PPU"), "t")
            assert (state.recip_kernel_w, state.recip_kernel_h) == (0x7C00, 0x7C00)


def run_build(regs, x):
    g = geometry(regs)
    channels, height, width = x.shape
    out_h = (height + g["pad_top"] + g["pad_bottom"] - g["kernel_h"]) // g["stride_y"] + 1
    out_w = (width + g["pad_left"] + g["pad_right"] - g["kernel_w"]) // g["stride_x"] + 1
    config = PoolConfig(nm.POOL_AVERAGE, out_h=out_h, out_w=out_w, recip_kernel_w=int(regs[2]),
                        recip_kernel_h=int(regs[3]), **g)
    halves = x.astype(np.float16)
    got = nc1hwc2_to_nchw(pool_nc1hwc2(nchw_to_nc1hwc2(halves, 8), config), channels)
    cfg = {name: getattr(config, name) for name in config.__dataclass_fields__}
    cfg["recip_w"], cfg["recip_h"] = config.recip_kernel_w, config.recip_kernel_h
    return got, ref.pool_float(halves, cfg)


@pytest.mark.parametrize("name", ["g1", "k1x2", "k1x3", "k2", "k3s2", "k3x5", "k5", "k7"])
def test_vendor_pools_against_reference_and_simulator(name):
    regs, x, sim = next((r, x, s) for n, r, x, s in builds() if n == name)
    got, expected = run_build(regs, x)
    assert np.array_equal(got, expected)
    sim32 = sim.astype(np.float32)
    step = np.abs(np.nextafter(sim, np.float16(np.inf)).astype(np.float32) - sim32)
    # the simulator averages the unrounded fp32 input with fp32 1 / k: within the input's rounding, the
    # fp16 1 / k's error (<= 2^-11 relative per axis) and one output step of it
    bound = step + np.abs(sim32) * 2.0**-10 + 2.0**-11 * np.abs(x).max()
    assert np.all(np.abs(got.astype(np.float32) - sim32) <= bound), name
    # the int8 form's reading of the same words (0x7555 as 30037 / 2^16: 1.89x for k = 3) is far off
    integer = expected.astype(np.float64) * (int(regs[2]) * int(regs[3])) / (
        fp16_recip_value(int(regs[2])) * fp16_recip_value(int(regs[3])))
    assert not np.all(np.abs(integer - sim32) <= bound), name


@st.composite
def fp16_pools(draw):
    kh, kw = draw(st.integers(1, 16)), draw(st.integers(1, 16))
    sy, sx = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pads = [draw(st.integers(0, min(7, k - 1))) for k in (kh, kh, kw, kw)]
    height, width = draw(st.integers(max(1, kh - pads[0] - pads[1]), 18)), draw(st.integers(max(1, kw - pads[2] - pads[3]), 18))
    out_h, out_w = (height + pads[0] + pads[1] - kh) // sy + 1, (width + pads[2] + pads[3] - kw) // sx + 1
    channels = draw(st.integers(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1e-3, 1.0, 300.0]))
    x = (rng.standard_normal((channels, height, width)) * scale).astype(np.float16)
    pad_value = float(np.float16(draw(st.floats(-4, 4, width=16))))
    config = PoolConfig(nm.POOL_AVERAGE, kh, kw, out_h, out_w, sy, sx, pads[0], pads[1], pads[2], pads[3],
                        pad_value, pool_reciprocal(kw, "float16"), pool_reciprocal(kh, "float16"))
    return x, config


def numpy_average(x, config):
    """Independent fp16 average: a padded float32 plane, fp32 sums in window order, fp32 products with
    fp16(1 / k) (the vendor's word / 2^16), W then H, RNE to fp16."""
    c, h, w = x.shape
    plane = np.full((c, h + config.pad_top + config.pad_bottom + config.kernel_h,
                     w + config.pad_left + config.pad_right + config.kernel_w), config.pad_value, np.float32)
    plane[:, config.pad_top:config.pad_top + h, config.pad_left:config.pad_left + w] = x
    total = np.zeros((c, config.out_h, config.out_w), np.float32)
    for ky in range(config.kernel_h):
        for kx in range(config.kernel_w):
            window = plane[:, ky:ky + config.stride_y * config.out_h:config.stride_y,
                           kx:kx + config.stride_x * config.out_w:config.stride_x]
            total = (total + window[:, :config.out_h, :config.out_w]).astype(np.float32)
    rw, rh = np.float32(np.float16(1 / config.kernel_w)), np.float32(np.float16(1 / config.kernel_h))
    return ((total * rw).astype(np.float32) * rh).astype(np.float32).astype(np.float16)


@given(fp16_pools())
def test_fp16_average_matches_numpy(case):
    x, config = case
    got = nc1hwc2_to_nchw(pool_nc1hwc2(nchw_to_nc1hwc2(x, 8), config), x.shape[0])
    expected = numpy_average(x, config)
    assert np.array_equal(got.view(np.uint16), expected.view(np.uint16))
    # and within the fp16 reciprocals' error (2^-11 relative each) and the output rounding (2^-11) of the exact
    # mean, plus the fp32 sum's rounding (relative to the window's magnitude)
    exact, magnitude = numpy_average_exact(x, config)
    bound = np.abs(exact) * 2.0**-9 + magnitude * 2.0**-20 + 2.0**-24
    assert np.all(np.abs(got.astype(np.float64) - exact) <= bound)


def numpy_average_exact(x, config):
    """The exact mean (float64) and the mean magnitude of each window."""
    c, h, w = x.shape
    plane = np.full((c, h + config.pad_top + config.pad_bottom + config.kernel_h,
                     w + config.pad_left + config.pad_right + config.kernel_w), config.pad_value, np.float64)
    plane[:, config.pad_top:config.pad_top + h, config.pad_left:config.pad_left + w] = x
    total, magnitude = np.zeros((c, config.out_h, config.out_w)), np.zeros((c, config.out_h, config.out_w))
    for ky in range(config.kernel_h):
        for kx in range(config.kernel_w):
            window = plane[:, ky:ky + config.stride_y * config.out_h:config.stride_y,
                           kx:kx + config.stride_x * config.out_w:config.stride_x][:, :config.out_h, :config.out_w]
            total, magnitude = total + window, magnitude + np.abs(window)
    area = config.kernel_h * config.kernel_w
    return total / area, magnitude / area


# --- rk3576: the vendor's fp16 GlobalAveragePool over 1 x 1 is a PPU average pool -------------------------
# gap1_fp16_rk3576.rknn.xz: rknn-toolkit2 2.5.0 rk3576 fp16 build of GlobalAveragePool on [1, 16, 1, 1] (helper
# VEND's build, /tmp/VEND/mk.py ``gap1``; xz -9): two PPU tasks, pad words 0, RECIP_KERNEL_* 0x7c00.
GAP1 = FIXTURE.parent / "gap1_fp16_rk3576.rknn.xz"


def _gap1_tasks():
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.isa.rknn import load_rknn
    from npuemu.isa.rknn.rk3576_layout import read_task

    vendor = load_regmap("rk3576_vendor")
    program = load_rknn(lzma.decompress(GAP1.read_bytes()), "gap1").program
    for index in program.chains[0].tasks:
        record = program.tasks[index]
        words = program.regcmd[record.first_word:record.tail_word]
        yield vendor, words, read_task(words, vendor, f"gap1 {index}", record.enable_mask)


def test_rk3576_vendor_fp16_global_average_pool_runs():
    from npuemu.emulator.rknn_runner import RknnRunner
    from npuemu.isa.rknn import load_rknn

    x = np.random.RandomState(5).randn(1, 16, 1, 1).astype(np.float32)
    model = load_rknn(lzma.decompress(GAP1.read_bytes()), "gap1")
    (_, out), = RknnRunner(model, "rk3576", (0,)).run([x]).outputs.items()
    # the mean of one element is the element, rounded to fp16 (the vendor simulator gives the same 16 values)
    assert np.array_equal(np.asarray(out, np.float32).ravel(), x.astype(np.float16).astype(np.float32).ravel())


def test_rk3576_fp16_average_pool_words_round_trip():
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.isa.rknn.rk3576_ppu import check_ppu_round_trip, ppu_vendor_writes, translate_ppu
    from npuemu.isa.words import TARGET_MARKER, TARGET_OP_ENABLE, encode_write

    rk3588 = load_regmap("rk3588")
    for vendor, words, task in _gap1_tasks():
        twin = translate_ppu(task)
        values = dict(((block, name), value) for block, name, value in twin)
        assert values[("PPU", "RECIP_KERNEL_WIDTH")] == values[("PPU", "RECIP_KERNEL_HEIGHT")] == 0x7C00
        writes = ppu_vendor_writes(values, rk3588, "gap1")   # npuemu's own-build direction
        register_words = [int(w) for w in words if int(w) and int(w) >> 48 not in (TARGET_MARKER, TARGET_OP_ENABLE)]
        assert [encode_write(vendor, b, n, v) for b, n, v in writes] == register_words
        check_ppu_round_trip(values, vendor, writes, "gap1")
        values[("PPU", "PADDING_VALUE_1_CFG")] = 0x3C00   # an fp16 average's nonzero pad has no known form
        with pytest.raises(UnsupportedProgramError, match="fp16 average pool with pad 0"):
            ppu_vendor_writes(values, rk3588, "gap1 pad")
