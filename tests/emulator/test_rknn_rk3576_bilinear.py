"""The vendor's rk3576 bilinear Resize and x8 nearest Resize run (emulator/REGISTER_SEMANTICS.md 56.2, 56.3;
isa/rknn/rk3576_bilinear.py): edge copies with a line notch (DPU_RDMA 0x5078), interleaved depthwise phase convs,
int8 depthwise convs with one CPEND for all channels (CNA 0x1074).

Files (``tests/data/rk3576_vendor/``), rknn-toolkit2 2.5.0 builds of ONNX (opset 14) ``Resize(x, scales [1, 1, f, f])``
for rk3576 and (``*_rk3588``) for rk3588; int8 with 3 calibration inputs ``RandomState(10 + i).randn``:
``bilinear_int8``: linear, half_pixel, f 2, x [1, 16, 6, 10]; ``bilinear48_int8``: the same on [1, 48, 5, 9] (two
channel groups, a conv between DPU-only tasks); ``bilinear_fp16``: the same fp16 (``do_quantization=False``) on
[1, 32, 12, 20]; ``resize8_int8``: nearest, asymmetric, floor, f 8, x [1, 32, 3, 5]. ``vend_sim.npz.xz``: the
simulator's output codes (``init_runtime(); inference`` on ``x = RandomState(5).randn``) of ``bilinear_int8`` and
``resize8_int8`` with their (scale, zero point).
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
with lzma.open(DATA / "vend_sim.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    SIM = {name: _archive[name] for name in _archive.files}
SHAPES = {"bilinear_int8": (1, 16, 6, 10), "bilinear48_int8": (1, 48, 5, 9), "bilinear_fp16": (1, 32, 12, 20),
          "resize8_int8": (1, 32, 3, 5)}


def _data(name: str) -> bytes:
    return lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes())


def _input(name: str) -> np.ndarray:
    return np.random.RandomState(5).randn(*SHAPES[name]).astype(np.float32)


def _run(data: bytes, target: str, x: np.ndarray, cores=(0,)) -> np.ndarray:
    (_, out), = RknnRunner(load_rknn(data, target), target, cores).run([x]).outputs.items()
    return np.asarray(out, dtype=np.float32)


def _input_quantization(name: str) -> tuple[float, int]:
    tensor, = [t for t in load_rknn(_data(name), name).tensors if t.name == "x"]
    return tensor.scales[0], tensor.zero_points[0]


def _bilinear2(x: np.ndarray) -> np.ndarray:
    """ONNX Resize(linear, half_pixel) x2 over the last two axes, float64: each output the 1/4 - 3/4 mix of its two
    nearest inputs, edges clamped."""
    def along(a, axis):
        n = a.shape[axis]
        index = np.arange(n)
        before = np.take(a, np.clip(index - 1, 0, n - 1), axis=axis)
        after = np.take(a, np.clip(index + 1, 0, n - 1), axis=axis)
        out = np.stack([0.25 * before + 0.75 * a, 0.75 * a + 0.25 * after], axis=axis + 1)
        shape = list(a.shape)
        shape[axis] *= 2
        return out.reshape(shape)
    return along(along(x.astype(np.float64), 2), 3)


@pytest.mark.parametrize("name", ["bilinear_int8", "bilinear48_int8", "bilinear_fp16", "resize8_int8"])
def test_vendor_resize_runs_bit_identically_to_its_rk3588_twin(name):
    x = _input(name)
    ours = _run(_data(name), "rk3576", x)
    np.testing.assert_array_equal(ours, _run(_data(f"{name}_rk3588"), "rk3588", x))
    assert len(np.unique(ours)) > 100


@pytest.mark.parametrize("name", ["bilinear_int8", "bilinear48_int8"])
def test_vendor_int8_bilinear_is_the_exact_mix_of_the_codes_halves_toward_zero(name):
    """Output code - z = (9a + 3b + 3c + d) / 16 of the input codes - z, rounded to nearest, exact halves toward 0 (the
    phase convs' OUT_CVT 19418 >> 23 is a hair under 1 / 432, REGISTER_SEMANTICS.md 52)."""
    scale, zero = _input_quantization(name)
    x = _input(name)
    codes = np.clip(np.round(x / scale) + zero, -128, 127) - zero
    exact = _bilinear2(codes)
    ours = np.round(_run(_data(name), "rk3576", x) / scale)   # the output's scale and zero point are the input's
    half = np.abs(exact - np.floor(exact) - 0.5) < 1e-9
    np.testing.assert_array_equal(ours[~half], np.round(exact[~half]))
    np.testing.assert_array_equal(ours[half], np.trunc(exact[half]))
    assert 0.05 < half.mean() < 0.2


def test_vendor_fp16_bilinear_is_the_exact_mix_rounded_once():
    x = _input("bilinear_fp16")
    expected = _bilinear2(x.astype(np.float16)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(_run(_data("bilinear_fp16"), "rk3576", x), expected)


def _codes_of(name: str, out: np.ndarray) -> np.ndarray:
    scale, zero = SIM[f"{name}_scale"]
    return np.round(out / scale).astype(np.int64) + int(zero)


def test_vendor_int8_bilinear_against_the_simulator():
    """The simulator rounds exact halves to even where the hardware form rounds them toward zero: 94.9 % of the codes
    equal, the rest one code apart [measured]."""
    ours = _codes_of("bilinear_int8", _run(_data("bilinear_int8"), "rk3576", _input("bilinear_int8")))
    sim = SIM["bilinear_int8_q"].astype(np.int64).reshape(ours.shape)
    assert np.abs(ours - sim).max() == 1 and np.mean(ours == sim) > 0.93


def test_vendor_x8_nearest_resize_equals_the_simulator_and_the_repeat():
    """The x8 build's extra int8 depthwise conv (CPEND 0 in CNA 0x1074, identity OUT_CVT) and the unpooling copies:
    every code equals the simulator's and the nearest repeat of the quantized input."""
    x = _input("resize8_int8")
    ours = _codes_of("resize8_int8", _run(_data("resize8_int8"), "rk3576", x))
    np.testing.assert_array_equal(ours, SIM["resize8_int8_q"].astype(np.int64).reshape(ours.shape))
    scale, zero = _input_quantization("resize8_int8")
    codes = np.clip(np.round(x / scale) + zero, -128, 127).astype(np.int64)
    np.testing.assert_array_equal(ours, codes.repeat(8, axis=2).repeat(8, axis=3))


@pytest.mark.parametrize("name", ["bilinear_int8", "bilinear_fp16", "resize8_int8"])
def test_vendor_resize_core_programs_agree(name):
    """The single-core program on core 1 and the 2-core program give chain 0's output."""
    x = _input(name)
    single = _run(_data(name), "rk3576", x)
    for cores in ((1,), (0, 1)):
        np.testing.assert_array_equal(_run(_data(name), "rk3576", x, cores), single)


def _patched(data: bytes, offset: int, old: int, new: int) -> bytes:
    """``data`` with every command word writing ``old`` at register ``offset`` writing ``new`` instead."""
    needle = offset.to_bytes(2, "little") + old.to_bytes(4, "little")
    out, found = bytearray(data), 0
    position = out.find(needle)
    while position >= 0:
        out[position + 2:position + 6] = new.to_bytes(4, "little")
        found += 1
        position = out.find(needle, position + 1)
    assert found, (hex(offset), hex(old))
    return bytes(out)


@pytest.mark.parametrize("offset, old, new, message", [
    (0x5078, 0xB, 0x2000B, "DPU-only copy with a notch"),                 # a line notch past 13 bits
    (0x1074, 0x8080, 0x8081, "depthwise conv with a bias-only record"),   # two CPEND bytes that differ
    (0x4050, 0x23333, 0x13333, "depthwise conv with a bias-only record"),  # another 0x4050
])
def test_a_bilinear_form_not_decoded_is_refused_by_name(offset, old, new, message):
    data = _patched(_data("bilinear_int8"), offset, old, new)
    with pytest.raises(UnsupportedProgramError, match=message):
        RknnRunner(load_rknn(data, "t"), "rk3576", (0,))
