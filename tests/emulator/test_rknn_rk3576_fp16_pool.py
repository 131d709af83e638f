"""The vendor's rk3576 fp16 average pools run: a depthwise conv without a bias record (emulator/REGISTER_SEMANTICS.md
56.1, isa/rknn/rk3576_pool_fp16.py).

Files (``tests/data/rk3576_vendor/``), made with rknn-toolkit2 2.5.0, ``build(do_quantization=False)``, opset 14:
``pool3s2_fp16.rknn.xz``: ``config(target_platform="rk3576")`` of AveragePool(kernel 3x3, strides 2, pads 1,
count_include_pad 1) of x [1, 16, 12, 20]; ``pool2s2_fp16.rknn.xz``: AveragePool(2x2, strides 2, no pads) of x [1, 24,
12, 20]. ``pool*_fp16_dw_rk3588.rknn.xz``: the same arithmetic written as a Conv (group = channels, weights 1 / area,
bias 0, the same kernel / strides / pads) built for rk3588 - the vendor's own RK3588 depthwise conv of these weights
(the rk3588 build of the AveragePool itself is a PPU pool, another arithmetic). ``vend_sim.npz.xz``: the simulator's
outputs (``init_runtime(); inference``) of the rk3576 builds on ``x = RandomState(5).randn``, as float16.
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
from tests.emulator.test_rknn_rk3576_bilinear import _patched  # (word patching of a vendor file)

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
with lzma.open(DATA / "vend_sim.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    SIM = {name: _archive[name] for name in _archive.files}
#: name: (input shape, kernel, stride, pad)
POOLS = {"pool3s2_fp16": ((1, 16, 12, 20), 3, 2, 1), "pool2s2_fp16": ((1, 24, 12, 20), 2, 2, 0)}


def _data(name: str) -> bytes:
    return lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes())


def _input(name: str) -> np.ndarray:
    return np.random.RandomState(5).randn(*POOLS[name][0]).astype(np.float32)


def _run(data: bytes, target: str, x: np.ndarray, cores=(0,)) -> np.ndarray:
    (_, out), = RknnRunner(load_rknn(data, target), target, cores).run([x]).outputs.items()
    return np.asarray(out, dtype=np.float32)


def _reference(x: np.ndarray, kernel: int, stride: int, pad: int) -> np.ndarray:
    """The mean over each window, pads counted as zeros, of the float16 input (float64 sums)."""
    x = np.pad(x.astype(np.float16).astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    rows = (x.shape[2] - kernel) // stride + 1
    cols = (x.shape[3] - kernel) // stride + 1
    out = np.zeros(x.shape[:2] + (rows, cols))
    for dy in range(kernel):
        for dx in range(kernel):
            out += x[:, :, dy:dy + stride * rows:stride, dx:dx + stride * cols:stride]
    return out / kernel ** 2


@pytest.mark.parametrize("name", sorted(POOLS))
def test_vendor_fp16_pool_runs_bit_identically_to_the_vendors_depthwise_conv(name):
    """The bias-less pool conv (BS stage passed through, no record) gives exactly what the vendor's RK3588 depthwise
    conv with a zero bias record gives on the same weights."""
    x = _input(name)
    ours = _run(_data(name), "rk3576", x)
    np.testing.assert_array_equal(ours, _run(_data(f"{name}_dw_rk3588"), "rk3588", x))
    assert len(np.unique(ours)) > 400


@pytest.mark.parametrize("name", sorted(POOLS))
def test_vendor_fp16_pool_is_the_mean_within_its_fp16_weight(name):
    """fp16 weights 1 / area (1/9 is 0.11108 in fp16, 1/4 exact) times the window sum, rounded to fp16: within
    one fp16 step of the exact mean plus the weight's relative error."""
    shape, kernel, stride, pad = POOLS[name]
    x = _input(name)
    ours = _run(_data(name), "rk3576", x).reshape(-1).astype(np.float64)
    exact = _reference(x, kernel, stride, pad).reshape(-1)
    weight = float(np.float16(1.0 / kernel ** 2))
    bound = np.abs(exact) * abs(weight * kernel ** 2 - 1.0) + np.spacing(np.abs(exact).astype(np.float16)) + 1e-7
    assert np.all(np.abs(ours - exact) <= bound)
    assert np.dot(ours, exact) / np.linalg.norm(ours) / np.linalg.norm(exact) > 0.99999


@pytest.mark.parametrize("name", sorted(POOLS))
def test_vendor_fp16_pool_is_close_to_the_simulator(name):
    """The simulator does not compute the hardware's sums (its 3x3 average is not by the fp16 weight 1/9, and its 2x2
    sums round differently near 0: up to 79 fp16 steps of tiny values): 60-61 % of the outputs equal, at most
    9.8e-4 apart (one step at |y| in [1, 2)) [measured: 59.9 % / 61.5 %, max 9.77e-4 both]."""
    ours = _run(_data(name), "rk3576", _input(name))
    sim = SIM[name].astype(np.float32).reshape(ours.shape)
    assert np.abs(ours - sim).max() <= 2.0 ** -10 and np.mean(ours == sim) > 0.55


def test_vendor_fp16_pool_core_programs_agree():
    """Its single-core program on core 1 and its 2-core program give chain 0's output."""
    x = _input("pool3s2_fp16")
    single = _run(_data("pool3s2_fp16"), "rk3576", x)
    for cores in ((1,), (0, 1)):
        np.testing.assert_array_equal(_run(_data("pool3s2_fp16"), "rk3576", x, cores), single)


def test_a_bias_less_depthwise_conv_of_another_form_is_refused_by_name():
    """DPU_RDMA 0x5044 reading fp16 (the conv with a bias's 0x40010052) with no record is not the pool's form."""
    data = _patched(_data("pool3s2_fp16"), 0x5044, 0x40000010, 0x40010052)
    with pytest.raises(UnsupportedProgramError, match="depthwise conv without a bias record"):
        RknnRunner(load_rknn(data, "t"), "rk3576", (0,))
