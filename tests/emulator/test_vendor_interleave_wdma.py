"""The interleaved DPU write's two WDMA size splits (emulator/kernels/dpu_interleave.py, REGISTER_SEMANTICS.md 52):
npuemu's own phase convs write H lines of W x C channels (HEIGHT_WDMA H - 1, CHANNEL_WDMA W x C - 1, 3.3.1), the
vendor's W lines of H x C (HEIGHT_WDMA W - 1, CHANNEL_WDMA H x C - 1); on a non-square cube both must put every
atom where DATA_CUBE, NOTCH_ADDR_0 and SURFACE_ADD say, against a numpy interleave written here.

Committed vendor file (``tests/data/vendor_interleave/``): ``bilinear2_int8_rk3588.rknn.xz`` is rknn-toolkit2
2.5.0's build (``config(target_platform="rk3588")``, ``build(do_quantization=True)`` on 3 calibration inputs
``RandomState(10 + i).randn(1, 32, 12, 20)``, ``export_rknn``, ``xz -9e``) of one ONNX (opset 13)
``y = Resize(x, scales=[1, 1, 2, 2], mode="linear", coordinate_transformation_mode="half_pixel")`` on x
[1, 32, 12, 20]: 5 edge copies, then 4 2x2 depthwise phase convs (12 x 20 cubes) writing interleaved with
HEIGHT_WDMA 19 / CHANNEL_WDMA 767 - the file the emulator refused before ("WDMA_SIZE_0/1 give 1x20x768").
``bilinear2_fp16_rk3588.rknn.xz``: the same ONNX built without quantization (fp16; CHANNEL_WDMA 383 = 12 x 32 - 1).
``bilinear2_int8_sim_delta.npy.xz``: the simulator's output (``init_runtime(); inference(inputs=[x],
data_format="nchw")`` on ``x = RandomState(5).randn(1, 32, 12, 20)``) as int8 codes ``rint(y / scale) + zp``,
stored as its difference from ``_half_even_bilinear`` below (int8, 804 nonzero; the codes whole are 25 KB).
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.machine import Machine
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import EmulationError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from tests.emulator.test_machine_support import MASK_FLYING, run_tasks, to_nc1hwc2
from tests.emulator.test_dpu_interleave import phase_task

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor_interleave"
SRC, DST = 0x10000, 0x200000
SCALE_ZP = (0.022898174822330475, 4)   # x and y of the vendor file (equal; checked below)


def _set_reading(task, reading: str, width: int, height: int, channels: int):
    """WDMA_SIZE_0/1 as npuemu's own builds ("own": H lines of W x C) or the vendor's ("vendor": W lines of H x C)."""
    lines, per_line = (height, width * channels) if reading == "own" else (width, height * channels)
    task.set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=per_line - 1)
    task.set("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=lines - 1, WIDTH_WDMA=0)
    return task


def _reference_write(phases: dict, s: int, c2: int) -> np.ndarray:
    """Independent model of the write, atom by atom from the registers (both readings place alike): atom (y, x) of
    surface k of phase (ry, rx) at DST_BASE (ry s W + rx) + k DST_SURF_STRIDE + y SURFACE_ADD + x (NOTCH + 1)."""
    c, h, w = phases[0, 0].shape
    surfaces, out_w = -(-c // c2), s * w
    memory = np.zeros((surfaces * s * h * out_w, c2), phases[0, 0].dtype)
    for (ry, rx), cube in phases.items():
        lanes = np.zeros((surfaces * c2, h, w), cube.dtype)
        lanes[:c] = cube
        for k in range(surfaces):
            for y in range(h):
                for x in range(w):
                    atom = (ry * out_w + rx) + k * s * h * out_w + y * s * out_w + x * s
                    memory[atom] = lanes[k * c2:(k + 1) * c2, y, x]
    return memory


def _run(phases: dict, s: int, reading: str) -> np.ndarray:
    c, h, w = phases[0, 0].shape
    channels = -(-c // 16) * 16
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    tasks, src = [], SRC
    for (ry, rx), cube in phases.items():
        m.memory.load(src, to_nc1hwc2(cube, 16).tobytes())
        t = phase_task(w, h, channels, s, ry, rx, src=src, dst=DST, size_e=max(3, channels // 16 - 1))
        tasks.append(_set_reading(t, reading, w, h, channels).task(MASK_FLYING))
        src += channels * h * w + 64
    m.memory.load(DST, np.zeros(channels * s * s * h * w, np.uint8).tobytes())
    run_tasks(m, tasks)
    return m.memory.dump(DST, channels * s * s * h * w).view(np.int8).reshape(-1, 16)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 5), st.integers(2, 7), st.sampled_from([2, 3]), st.integers(1, 33),
       st.sampled_from(["own", "vendor"]), st.integers(0, 2**31))
def test_both_readings_place_every_atom_as_the_reference(height, width, s, channels, reading, seed):
    rng = np.random.default_rng(seed)
    phases = {(ry, rx): rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
              for ry in range(s) for rx in range(s)}
    np.testing.assert_array_equal(_run(phases, s, reading), _reference_write(phases, s, 16))


def test_the_two_readings_write_the_same_bytes_on_a_non_square_cube():
    """12 x 20, as the vendor file's phase convs: HEIGHT_WDMA 11 / 19, the same tensor."""
    rng = np.random.default_rng(3)
    phases = {(ry, rx): rng.integers(-128, 128, (32, 12, 20)).astype(np.int8) for ry in range(2) for rx in range(2)}
    own = _run(phases, 2, "own")
    np.testing.assert_array_equal(own, _run(phases, 2, "vendor"))
    out = own.reshape(2, 24, 40, 16).transpose(0, 3, 1, 2).reshape(32, 24, 40)
    for (ry, rx), cube in phases.items():   # DepthToSpace's out[:, ry::2, rx::2] = phase
        np.testing.assert_array_equal(out[:, ry::2, rx::2], cube)


@pytest.mark.parametrize("wdma", [(0, 12 * 20 - 1, 32 - 1), (0, 20 - 1, 12 * 32 - 2), (0, 12 - 1, 20 * 32 + 15),
                                  (1, 20 - 1, 12 * 32 - 1)])
def test_other_splits_are_still_refused(wdma):
    """(WIDTH, HEIGHT, CHANNEL)_WDMA: a pixel line, a count one channel short, a wrong count, a width 2."""
    t = phase_task(20, 12, 32, 2, 0, 0, src=SRC, dst=DST)
    t.set("DPU", "WDMA_SIZE_1", WIDTH_WDMA=wdma[0], HEIGHT_WDMA=wdma[1]).set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=wdma[2])
    with pytest.raises(EmulationError, match="DPU sizes disagree"):
        run_tasks(Machine.for_platform("rk3588", ddr_size=16 << 20), [t.task(MASK_FLYING)])


def test_a_one_line_cube_without_notch_stays_the_plain_write():
    """W x 1 with WDMA 1 x W x C is dpu_transpose.relines' plain write (pixels contiguous), not the vendor split."""
    x = np.random.default_rng(1).integers(-128, 128, (16, 1, 6)).astype(np.int8)
    m = Machine.for_platform("rk3588", ddr_size=16 << 20)
    m.memory.load(SRC, to_nc1hwc2(x, 16).tobytes())
    t = phase_task(6, 1, 16, 1, 0, 0, src=SRC, dst=DST, notch=0)
    t.set("DPU", "SURFACE_ADD", SURF_ADD=6)
    _set_reading(t, "vendor", 6, 1, 16)
    m.memory.load(DST, np.zeros(6 * 16, np.uint8).tobytes())
    run_tasks(m, [t.task(MASK_FLYING)])
    np.testing.assert_array_equal(m.memory.dump(DST, 6 * 16).view(np.int8).reshape(6, 16), x[:, 0].T)


# --- the vendor's rk3588 bilinear Resize file --------------------------------------------------------------------
def _model():
    return load_rknn(lzma.decompress((DATA / "bilinear2_int8_rk3588.rknn.xz").read_bytes()), "bilinear2_int8")


def _input_codes(x: np.ndarray) -> np.ndarray:
    scale, zp = SCALE_ZP
    return np.clip(np.rint(x / scale) + zp, -128, 127).astype(np.int64)


def _weighted_sums(values: np.ndarray) -> np.ndarray:
    """16 x the half-pixel bilinear x2 of [N][C][H][W] ``values``, edges repeated: 1 3 3 9 over 2 x 2 neighbours."""
    def along(a: np.ndarray, axis: int) -> np.ndarray:
        n = a.shape[axis]
        before = np.take(a, np.clip(np.arange(n) - 1, 0, n - 1), axis=axis)
        after = np.take(a, np.clip(np.arange(n) + 1, 0, n - 1), axis=axis)
        shape = list(a.shape)
        shape[axis] = 2 * n
        return np.stack([3 * a + before, 3 * a + after], axis=axis + 1).reshape(shape)
    return along(along(values, 2), 3)


def _register_bilinear(codes: np.ndarray) -> np.ndarray:
    """The vendor program in integers: weights 27 x (1, 3, 3, 9) (stored minus 128, BS_OW_OP 128 adds it back),
    OUT_CVT_SCALE 19418 >> 23 rounding half up (19418 / 2**23 a hair under 1 / 432), OUT_CVT_OFFSET zp [V]."""
    acc = 27 * _weighted_sums(codes - SCALE_ZP[1])
    return np.clip(((acc * 19418 + (1 << 22)) >> 23) + SCALE_ZP[1], -128, 127)


def _half_even_bilinear(codes: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(_weighted_sums(codes - SCALE_ZP[1]) / 16) + SCALE_ZP[1], -128, 127).astype(np.int64)


def test_vendor_file_writes_the_vendor_split():
    regmap = load_regmap("rk3588")
    sizes = {regmap.register("DPU", name).offset: name for name in ("WDMA_SIZE_0", "WDMA_SIZE_1")}
    words = [(sizes[int(w) & 0xFFFF], (int(w) >> 16) & 0xFFFF_FFFF) for w in _model().program.regcmd
             if int(w) & 0xFFFF in sizes]
    assert ("WDMA_SIZE_1", 0x00130000) in words and ("WDMA_SIZE_0", 767) in words   # 20 lines of 12 x 64


def test_vendor_bilinear_runs_and_matches_the_simulator_but_its_ties():
    model = _model()
    assert (model.tensor("x").scales[0], model.tensor("x").zero_points[0]) == SCALE_ZP
    assert (model.tensor("y").scales[0], model.tensor("y").zero_points[0]) == SCALE_ZP
    x = np.random.RandomState(5).randn(1, 32, 12, 20).astype(np.float32)
    result = RknnRunner(model, "rk3588", (0,)).run([x])
    ours = np.asarray(result.quantized["y"]).astype(np.int64)
    codes = _input_codes(x)
    np.testing.assert_array_equal(ours, _register_bilinear(codes))   # the registers, exactly
    delta = np.load(io.BytesIO(lzma.decompress((DATA / "bilinear2_int8_sim_delta.npy.xz").read_bytes())))
    sim = _half_even_bilinear(codes) + delta
    ties = _weighted_sums(codes - SCALE_ZP[1]) % 16 == 8
    differ = ours != sim
    # 1 LSB, on exact halves only: the hardware's scale rounds them toward zero, the simulator to even
    assert np.abs(ours - sim).max() == 1 and not differ[~ties].any()
    assert differ.sum() == 1419 and ties.sum() == 2788


def test_vendor_fp16_bilinear_is_the_exactly_rounded_bilinear():
    """fp16: the phase convs' weights (1/16, 3/16, 9/16) are exact and the sum is rounded to float16 once, so the
    output is numpy's bilinear of the float16 input, in float64, rounded to float16 (the simulator's differs on
    10673 of 30720 values by up to 1.95e-3 - not committed, REGISTER_SEMANTICS.md 52)."""
    model = load_rknn(lzma.decompress((DATA / "bilinear2_fp16_rk3588.rknn.xz").read_bytes()), "bilinear2_fp16")
    x = np.random.RandomState(5).randn(1, 32, 12, 20).astype(np.float16)
    result = RknnRunner(model, "rk3588", (0,)).run([x.astype(np.float32)])
    ours = np.asarray(result.quantized["y"], np.float16)
    expected = (_weighted_sums(x.astype(np.float64)) / 16).astype(np.float16)
    np.testing.assert_array_equal(ours.view(np.uint16), expected.view(np.uint16))
