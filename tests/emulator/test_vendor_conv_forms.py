"""Vendor rk3588 conv forms the emulator once ran wrong or refused (REGISTER_SEMANTICS.md 34).

``tests/data/vendor_rk3588/<case>.rknn.xz`` are rknn-toolkit2 2.5.0 builds of one ONNX Conv
(opset 13, float32, weights ``RandomState(1).randn(co, ci / group, kh, kw) * 0.1`` then bias
``randn(co) * 0.5`` from the same generator), ``RKNN.config(target_platform='rk3588')``,
``build(do_quantization=True, dataset=3 N(0,1) inputs)`` for int8 or ``do_quantization=False``
for fp16, ``export_rknn``, ``xz -9``. The input is ``RandomState(11).randn(1, ci, h, w)``
(float32; fp16 cases rounded to float16 first, because the vendor's simulator convolves the
float32 values unrounded where the NPU reads the float16 tensor: with fp16-exact inputs its
output is bit-identical to the emulator's). ``sim_outputs.npz.xz`` holds the simulator's output
(``init_runtime(); inference(inputs=[x], data_format='nchw')``): int8 as output codes
``rint(y / scale) + zp`` (exact), fp16 as float16 values.

What each case pins:
- int8_32x9x9, fp16_16x6x9_s12: a graph input whose H*W is not a multiple of 4 with two
  surfaces; the vendor reads it with H*W pixels per surface (81, 54), not align(H*W, 4): read
  padded, the outputs were 121 LSB / 2.0 off.
- fp16_5to17, fp16_20to17, fp16_40to17, fp16_56to17: the vendor's fp16 weight blocking
  (partial input group of 8, 16 or 32 channels; tail kernels not padded to even), which the
  emulator refused ("weight sizes disagree") before reading the blocking from the sizes;
- dw_int8_48, dw_int8_112, dw_fp16_24 (Conv with group = channels): the vendor's depthwise
  blocking, the partial group likewise 1, 2 or 4 atoms (48 -> 64, 112 -> 64 + 64, fp16 24 -> 32);
  refused before.
- the shipped rknn-fixtures-ops matmul_rows_fp16 (MatMul [1,40,120] x [120,360] + bias): its
  FC stores 120 input channels as 128 and 360 kernels unpadded, and its transposing convs write
  1-pixel lines W + NOTCH_ADDR_0 atoms apart; refused, then 4.9 off, now bit-identical.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.rknn import load_rknn
from tests.shared_data import RKNN_FIXTURES_OPS

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor_rk3588"

class Case(NamedTuple):
    ci: int
    co: int
    h: int
    w: int
    kh: int
    kw: int
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)   # top, left, bottom, right
    fp16: bool = False
    depthwise: bool = False                          # group = ci = co


CASES = {
    "int8_32x9x9": Case(32, 16, 9, 9, 3, 3, pads=(1, 1, 1, 1)),
    "fp16_16x6x9_s12": Case(16, 16, 6, 9, 1, 3, (1, 2), (0, 1, 0, 1), fp16=True),
    "fp16_5to17": Case(5, 17, 9, 11, 3, 2, pads=(1, 0, 1, 1), fp16=True),
    "fp16_20to17": Case(20, 17, 6, 8, 1, 1, fp16=True),
    "fp16_40to17": Case(40, 17, 5, 7, 3, 2, pads=(1, 0, 1, 1), fp16=True),
    "fp16_56to17": Case(56, 17, 6, 8, 1, 1, fp16=True),
    "dw_int8_48": Case(48, 48, 7, 9, 3, 5, pads=(1, 2, 1, 2), depthwise=True),
    "dw_int8_112": Case(112, 112, 6, 7, 3, 3, pads=(1, 1, 1, 1), depthwise=True),
    "dw_fp16_24": Case(24, 24, 6, 7, 3, 3, pads=(1, 1, 1, 1), fp16=True, depthwise=True),
}
BLOCKED = sorted(name for name, case in CASES.items() if case.fp16 or case.depthwise)


def _model(name: str, tmp_path: Path):
    path = tmp_path / f"{name}.rknn"
    path.write_bytes(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()))
    return load_rknn(path)


def _input(name: str) -> np.ndarray:
    case = CASES[name]
    x = np.random.RandomState(11).randn(1, case.ci, case.h, case.w).astype(np.float32)
    return x.astype(np.float16).astype(np.float32) if case.fp16 else x


def _onnx_weights(name: str) -> np.ndarray:
    case = CASES[name]
    per_group = 1 if case.depthwise else case.ci
    return (np.random.RandomState(1).randn(case.co, per_group, case.kh, case.kw) * 0.1).astype(np.float32)


@pytest.fixture(scope="module")
def sims():
    with lzma.open(DATA / "sim_outputs.npz.xz") as f:
        archive = np.load(io.BytesIO(f.read()))
        return {name: archive[name] for name in archive.files}


@pytest.mark.parametrize("name", sorted(CASES))
def test_vendor_conv_matches_the_simulator(name, sims, tmp_path):
    model = _model(name, tmp_path)
    run = RknnRunner(model).run([_input(name)])
    assert run.host_layers == ()
    (got,) = run.outputs.values()
    sim, case = sims[name], CASES[name]
    (sy, sx), (pt, pl, pb, pr) = case.strides, case.pads
    out_h, out_w = (case.h + pt + pb - case.kh) // sy + 1, (case.w + pl + pr - case.kw) // sx + 1
    assert sim.shape == got.shape == (1, case.co, out_h, out_w)
    if case.fp16:
        np.testing.assert_array_equal(got.astype(np.float16), sim)
    else:
        tensor = model.output_tensors[0]
        codes = np.rint(got.astype(np.float64) / np.float32(tensor.scales[0])) + tensor.zero_points[0]
        assert np.abs(codes - sim).max() <= 1   # measured: 1 LSB on 0.08 / 0.1 / 0.17 % of the outputs


def _partial(rest: int, atom: int, block: int) -> int:
    """A partial group of ``rest`` channels as stored: 1, 2 or 4 atoms (at most the block)."""
    return min(n for n in (atom, 2 * atom, 4 * atom, block) if n >= rest)


def _vendor_depthwise_blob(weights: np.ndarray, block: int, atom: int) -> np.ndarray:
    """Reference packing of the vendor's depthwise weights from its native shapes (48 int8
    channels -> [1,1,3,5,1,64]; 112 -> [1,2,3,3,1,64]; 24 fp16 -> [1,1,3,3,1,32]): groups of
    ``block`` channels, the last rounded up to 1, 2 or 4 atoms, each [KH][KW][channels], padding 0."""
    channels, _, kh, kw = weights.shape
    blocks = []
    for first in range(0, channels, block):
        group = weights[first:first + block, 0]
        size = block if len(group) == block else _partial(len(group), atom, block)
        stored = np.zeros((kh, kw, size), weights.dtype)
        stored[..., :len(group)] = group.transpose(1, 2, 0)
        blocks.append(stored.reshape(-1))
    return np.concatenate(blocks)


def _vendor_fp16_blob(weights: np.ndarray) -> np.ndarray:
    """Reference packing of the vendor's fp16 conv weights, written from its native shapes
    (``npuemu inspect``: (17,40,1,1) -> [1,1,1,1,16,32] + [1,1,1,1,16,8] + [1,1,1,1,1,32] +
    [1,1,1,1,1,8]): output groups of 16 kernels (the last as many as are left), in each the
    input groups of 32 channels then the partial group rounded up to 8, 16 or 32, each block
    [KH][KW][kernels][channels], padded channels 0."""
    oc, ic, kh, kw = weights.shape
    full, rest = divmod(ic, 32)
    groups = [32] * full + ([_partial(rest, 8, 32)] if rest else [])
    blocks = []
    for first in range(0, oc, 16):
        kernels = weights[first:first + 16]
        start = 0
        for size in groups:
            block = np.zeros((kh, kw, len(kernels), size), np.float16)
            real = kernels[:, start:start + size].transpose(2, 3, 0, 1)
            block[..., :real.shape[3]] = real
            blocks.append(block.reshape(-1))
            start += size
    return np.concatenate(blocks)


@pytest.mark.parametrize("name", BLOCKED)
def test_vendor_weight_blob_is_the_reference_blocking(name, tmp_path):
    """The committed files' weight blobs against the independent packings above, so the rule the
    emulator reads (cna_core._vendor_blocking) is the vendor's byte for byte."""
    model, case = _model(name, tmp_path), CASES[name]
    (tensor,) = [t for t in model.tensors if t.name == "w1"]
    dtype = np.float16 if case.fp16 else np.int8
    blob = np.frombuffer(bytes(model.blob(tensor)), dtype)
    if case.fp16:
        weights = _onnx_weights(name).astype(np.float16)
    else:   # int8: the file's own values (quantised per channel); the check is their positions
        weights = None
    if case.depthwise and weights is None:
        # int8 values are the vendor's quantisation: check the size and that the lanes the rule
        # calls padding hold its one fill value (17 in both builds) in every tap
        stored = _vendor_depthwise_blob(np.ones((case.co, 1, case.kh, case.kw), np.int8), 64, 16)
        assert blob.size == stored.size == tensor.size
        padding = blob[stored == 0]
        assert padding.size == (stored.size // (case.kh * case.kw) - case.co) * case.kh * case.kw > 0
        assert np.unique(padding).size == 1
        return
    expected = (_vendor_depthwise_blob(weights, 32, 8) if case.depthwise else _vendor_fp16_blob(weights))
    assert blob.size == expected.size == tensor.size // 2
    np.testing.assert_array_equal(blob.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("sample", [0, 1, 2])
def test_vendor_matmul_rows_fp16_is_bit_identical_to_the_simulator(sample):
    """The fixture's inputs are fp16 values, so the simulator's output is the NPU's exactly. npuemu's
    fp16 sums run k after k from +0 (NUMERICS.md 3.3), the simulator's order: the same bits on every
    CPU (with OpenBLAS's order, 1-7 of 14,400 values were one fp16 ULP off on a Zen 5 core)."""
    folder = RKNN_FIXTURES_OPS / "matmul_rows_fp16"
    x = np.load(lzma.open(folder / f"input_{sample}.npy.xz"))
    sim = np.load(lzma.open(folder / f"sim_output_{sample}.npy.xz"))
    assert np.array_equal(x.astype(np.float16).astype(np.float32), x)
    run = RknnRunner(load_rknn(folder / "model.rknn")).run([x])
    (got,) = run.outputs.values()
    np.testing.assert_array_equal(got, sim.reshape(got.shape))
