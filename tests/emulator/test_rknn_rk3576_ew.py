"""The vendor's rk3576 fp16 DPU-only Max / Sub / padded Mul and its standalone LUT tasks run in the emulator
(emulator/REGISTER_SEMANTICS.md 54, isa/rknn/rk3576_ew.py).

Committed vendor files (``tests/data/rk3576_vendor/``), rknn-toolkit2 2.5.0, ``config(target_platform="rk3576")``
and the same ONNX (opset 14) built with ``target_platform="rk3588"`` as the ``_rk3588`` twin:
``ew_max16_fp16`` / ``ew_sub16_fp16``: ``y = Max(x, z)`` / ``x - z`` on [1, 16, 12, 20], ``ew_mul20_fp16``:
``x * z`` on [1, 20, 4, 10] (20 channels: fp16 pads to 24), all ``build(do_quantization=False)``;
``lut1_hsw_int8``: ``y = HardSwish(x)`` on [1, 16, 12, 20], ``build(do_quantization=True)`` with 3 calibration
samples ``RandomState(10 + i).randn`` (i = 0, 1, 2); ``lut1_hsw_fp16`` / ``lut1_tanh_fp16`` / ``lut1_sig_fp16``:
HardSwish / Tanh / Sigmoid of the same input, fp16 (the Sigmoid: rk3576 only). ``lut1_hsw_int8_sim.npy.xz``: the
toolkit simulator's output of the rk3576 HardSwish build (``init_runtime(); inference``) on
``x = RandomState(5).randn(1, 16, 12, 20)``, as int8 codes ``rint(y / 0.0156242) - 104`` (the file's output
quantization).
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn import load_rknn

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
SHAPES = {"ew_max16_fp16": (1, 16, 12, 20), "ew_sub16_fp16": (1, 16, 12, 20), "ew_mul20_fp16": (1, 20, 4, 10)}
LUT_SHAPE = (1, 16, 12, 20)


def _data(name: str) -> bytes:
    return lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes())


def _run(name: str, target: str, inputs, quantized: bool = False) -> np.ndarray:
    result = RknnRunner(load_rknn(_data(name), name), target, (0,)).run(inputs)
    (_, out), = (result.quantized if quantized else result.outputs).items()
    return np.asarray(out).astype(np.int64 if quantized else np.float32)


def _fp16_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| in fp16 steps (ordered bit patterns, +0 and -0 one value)."""
    def ordered(v):
        bits = v.astype(np.float16).view(np.int16).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFF), bits)
    return np.abs(ordered(a) - ordered(b))


@pytest.mark.parametrize("name", SHAPES)
def test_vendor_fp16_max_sub_and_padded_mul_run_bit_identically_to_their_twins(name):
    rng = np.random.RandomState(3)
    inputs = [(rng.randn(*SHAPES[name]) * 2).astype(np.float32) for _ in range(2)]
    ours = _run(name, "rk3576", inputs)
    np.testing.assert_array_equal(ours, _run(f"{name}_rk3588", "rk3588", inputs))
    x, z = (v.astype(np.float16).astype(np.float32) for v in inputs)   # the fp16 inputs the NPU reads
    reference = {"ew_max16_fp16": np.maximum(x, z), "ew_sub16_fp16": x - z, "ew_mul20_fp16": x * z}[name]
    # Max is exact; Sub and Mul round once to fp16
    assert _fp16_steps(ours, reference.astype(np.float16).astype(np.float32)).max() <= (0 if "max" in name else 1)


@pytest.mark.parametrize("name", ["lut1_hsw_int8", "lut1_tanh_fp16"])
def test_vendor_standalone_lut_runs_bit_identically_to_its_twin(name):
    """int8: the record's ALU operand (12, the input's -zero point) times its multiplier is the twin's BN_ALU_CFG;
    fp16 Tanh: the factor 2^-15 in OUT_CVT is the twin's MINUS_EXP 15."""
    x = (np.random.RandomState(7).randn(*LUT_SHAPE) * 2).astype(np.float32)
    quantized = name.endswith("int8")
    ours = _run(name, "rk3576", [x], quantized)
    np.testing.assert_array_equal(ours, _run(f"{name}_rk3588", "rk3588", [x], quantized))
    assert len(np.unique(ours)) > 100


def test_vendor_int8_standalone_hardswish_runs_bit_exactly_against_the_simulator():
    x = np.random.RandomState(5).randn(*LUT_SHAPE).astype(np.float32)
    sim = np.load(io.BytesIO(lzma.decompress((DATA / "lut1_hsw_int8_sim.npy.xz").read_bytes()))).astype(np.int64)
    ours = _run("lut1_hsw_int8", "rk3576", [x], quantized=True)
    np.testing.assert_array_equal(ours, sim)
    assert len(np.unique(sim)) > 50


def test_vendor_fp16_standalone_hardswish_runs_within_one_step_of_its_two_task_twin():
    """As the conv + HardSwish of REGISTER_SEMANTICS.md 50.2: the rk3576 task scales the table by the 15-bit
    24577 x 2^-13 x 2^-15, the twin by two fp16 multipliers in a second task."""
    x = (np.random.RandomState(7).randn(*LUT_SHAPE) * 2).astype(np.float32)
    steps = _fp16_steps(_run("lut1_hsw_fp16", "rk3576", [x]), _run("lut1_hsw_fp16_rk3588", "rk3588", [x]))
    assert steps.max() <= 1 and np.mean(steps == 0) > 0.5


def test_vendor_fp16_standalone_sigmoid_with_an_underflow_slope_is_refused_by_name():
    """The vendor's standalone Sigmoid writes an LE underflow slope (0x4150 / 0x4154 0x5a435a43, 0x4160 0x16161616)
    that no decoded register holds: refused, naming the word."""
    with pytest.raises(UnsupportedProgramError, match="0x4150"):
        _run("lut1_sig_fp16", "rk3576", [np.zeros(LUT_SHAPE, np.float32)])
