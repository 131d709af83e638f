"""The vendor's rk3576 image input: raw uint8 pixels normalized and quantized by the CNA's input converter
(emulator/REGISTER_SEMANTICS.md 47.1, isa/rknn/rk3576_image.py, emulator/kernels/cna_convert.py).

``tests/data/rk3576_vendor/image_{exact,imagenet}.rknn.xz``: rknn-toolkit2 2.5.0, ONNX Conv 3 -> K 3x3 + Relu,
weights ``RandomState(0).randn(K, 3, 3, 3) * 0.3``, bias the next ``randn(K) * 0.2``;
exact: K 24, s2 p1 on [1, 3, 20, 24], ``config(target_platform="rk3576", mean_values=[[128, 100, 60]],
std_values=[[64, 32, 16]])`` (its weight blob holds 32 kernels, 1152 bytes, slot 12 says 864);
imagenet: K 48, s1 p1 on [1, 3, 16, 20], mean [123.675, 116.28, 103.53] / std [58.395, 57.12, 57.375];
``image_rows.rknn.xz``: K 16, a 1x1 conv (CONV_MODE 6, the kernel row folded into channels) on [1, 3, 12, 16]
without mean / std (scale 1, zero point -128; its weight blob 512 bytes, slot 12 says 128);
``build(do_quantization=True)`` with 3 calibration images ``RandomState(0).randint(0, 256, (1, 3, H, W))``
(float32). ``image_sim.npz.xz``: the simulator's outputs (``init_runtime(); inference(inputs=[img])``, img
``RandomState(1).randint(0, 256, (1, H, W, 3))`` uint8 NHWC; float32 NCHW gives the same) as int8 codes
``rint(y / scale) + zp``: exact and rows whole, imagenet channels 0, 31, 32, 47.
"""

from __future__ import annotations

import io
import lzma
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.emulator.kernels.cna_convert import ImageConvert, convert_image_pixels
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import EmulationError, InputError, ModelFileError
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_image import vendor_weights

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
CASES = {"exact": (24, 20, 24), "imagenet": (48, 16, 20), "rows": (16, 12, 16)}   # kernels, H, W
B_CHANNELS = [0, 31, 32, 47]
with lzma.open(DATA / "image_sim.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    SIM = {name: _archive[name].astype(np.int64) for name in _archive.files}


def _model(case: str):
    return load_rknn(lzma.decompress((DATA / f"image_{case}.rknn.xz").read_bytes()), f"image_{case}")


def _image(case: str) -> np.ndarray:
    _, height, width = CASES[case]
    return np.random.RandomState(1).randint(0, 256, (1, height, width, 3)).astype(np.uint8).transpose(0, 3, 1, 2)


def _run(case: str, cores=None, image=None) -> np.ndarray:
    run = RknnRunner(_model(case), "rk3576", cores).run([_image(case) if image is None else image])
    (_, out), = run.quantized.items()
    return np.asarray(out).astype(np.int64)[0]


# --- the weight cube -------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["exact", "imagenet"])
def test_image_cube_holds_the_onnx_weights(case):
    """Per 32-kernel block, taps in order, 4 channels a kernel (the pixel's 3, then one no pixel byte meets):
    the ONNX weights quantized per output channel, asymmetric over [min(w, 0), max(w, 0)] -> [-128, 127]."""
    kernels = CASES[case][0]
    weights = np.random.RandomState(0).randn(kernels, 3, 3, 3).astype(np.float32) * np.float32(0.3)
    model = _model(case)
    tensor = next(t for t in model.tensors if t.name == "w")
    cube = bytes(model.blobs[tensor.blob_index])
    stored = -(-kernels // 16) * 16   # 24 kernels stored as 32 (zeros)
    assert len(cube) == stored * 9 * 4
    ours = vendor_weights(cube, stored, 3, 3, 2).astype(np.int64)
    assert not ours[kernels:].any()
    for kernel in range(kernels):
        low, high = min(float(weights[kernel].min()), 0.0), max(float(weights[kernel].max()), 0.0)
        scale = (high - low) / 255
        expected = np.clip(np.rint(weights[kernel] / scale) + np.rint(-128 - low / scale), -128, 127)
        np.testing.assert_array_equal(ours[kernel], expected)


# --- end to end against the simulator ------------------------------------------------------------


def test_image_input_matches_the_simulator_where_the_offsets_are_exact():
    """exact: zero point -68, scale 1/16, so zp - mean / (std x scale) is an integer for every channel (-100,
    -118, -128): the register model is the simulator's float normalization, up to the product's rounding
    (ties to even: 3 of 2880 outputs 1 LSB off, as the float model; ties up: 359)."""
    ours, sim = _run("exact"), SIM["exact"]
    assert ours.shape == sim.shape and len(np.unique(sim)) > 100
    assert np.abs(ours - sim).max() <= 1 and (ours != sim).sum() <= 5


def test_image_cube_in_kernel_rows_holds_the_onnx_weights():
    """CONV_MODE 6: per 32-kernel block, kernel rows [ky][kernel][kx x 4 channels, padded to 16 bytes] (a 1x1:
    4 bytes and 12 zeros a kernel); the blob's second half 0."""
    weights = np.random.RandomState(0).randn(16, 3, 1, 1).astype(np.float32) * np.float32(0.3)
    model = _model("rows")
    tensor = next(t for t in model.tensors if t.name == "w")
    cube = np.frombuffer(bytes(model.blobs[tensor.blob_index]), np.int8)
    ours = vendor_weights(cube[:256].tobytes(), 16, 1, 1, 6).astype(np.int64)
    assert not cube[:256].reshape(16, 16)[:, 4:].any() and not cube[256:].any()
    for kernel in range(16):
        low, high = min(float(weights[kernel].min()), 0.0), max(float(weights[kernel].max()), 0.0)
        scale = (high - low) / 255
        expected = np.clip(np.rint(weights[kernel] / scale) + np.rint(-128 - low / scale), -128, 127)
        np.testing.assert_array_equal(ours[kernel], expected)


def test_image_input_in_kernel_rows_matches_the_simulator():
    """The 1x1 (CONV_MODE 6) with mean 0 / std 1: offsets -128, exact; 3 of 3072 outputs 1 LSB off (the float
    model misses the same 3)."""
    ours, sim = _run("rows"), SIM["rows"]
    assert ours.shape == sim.shape and len(np.unique(sim)) > 100
    assert np.abs(ours - sim).max() <= 1 and (ours != sim).sum() <= 5


@pytest.mark.parametrize("cores", [(1,), (0, 1)])
def test_image_input_other_programs(cores):
    """The single-core program on core 1 and the 2-core one (rows split: the second core's feature address
    9 rows of 32 3-byte pixels on) give the single-core outputs."""
    np.testing.assert_array_equal(_run("exact", cores), _run("exact"))


def _converter_words(model) -> dict[int, int]:
    """The first task's CNA words by offset, read from the stored regcmd (target 0x0201)."""
    task = model.program.tasks[model.program.chains[0].tasks[0]]
    words = np.asarray(model.program.regcmd[task.regcmd_addr // 8:task.regcmd_addr // 8 + task.regcfg_amount])
    return {int(w) & 0xFFFF: (int(w) >> 16) & 0xFFFFFFFF for w in words if int(w) >> 48 == 0x0201}


def _signed(value: int) -> int:
    return value - (1 << 32) if value >> 31 else value


def test_image_input_register_model_against_the_simulator():
    """imagenet: the offsets zp - mean x s are not integers (-127.51, -123.11, -110.71) and the registers hold them
    rounded (-128, -123, -111), so the CNA's quantized input (the register model, read here from the stored
    words) differs from the simulator's float one, rint((x - mean) / std / scale) + zp, by 1 on 10-47 % of the
    pixels of a channel. That difference through the ONNX conv, Delta, explains ours - sim: ours is
    rint(sim + Delta / output scale) within 1 LSB everywhere, though sim itself is up to 2 away."""
    model = _model("imagenet")
    words = _converter_words(model)
    con0, scales = words[0x1048], (words[0x104C] & 0xFFFF, words[0x104C] >> 16, words[0x1050] & 0xFFFF)
    truncates = [(con0 >> (4 + 6 * c)) & 0x3F for c in range(3)]
    offsets = [_signed(words[0x1054 + 4 * c]) for c in range(3)]
    pixels = _image("imagenet")[0].astype(np.int64)
    register = np.stack([np.clip(np.array([round(Fraction(int(x) * scales[c], 1 << truncates[c]))
                                            for x in pixels[c].reshape(-1)]).reshape(pixels[c].shape)
                                  + offsets[c], -128, 127) for c in range(3)])
    norm, tensor = model.normalization[0], model.input_tensors[0]
    scale = float(np.float32(tensor.scales[0]))
    real = (pixels - np.array(norm.mean[:3])[:, None, None]) / np.array(norm.std[:3])[:, None, None]
    floats = np.clip(np.rint(real / scale) + tensor.zero_points[0], -128, 127)
    assert 0.05 < (register != floats).mean() < 0.5
    step = np.pad((register - floats) * scale, ((0, 0), (1, 1), (1, 1)))
    weights = np.random.RandomState(0).randn(48, 3, 3, 3).astype(np.float32)[B_CHANNELS] * np.float32(0.3)
    delta = sum(np.einsum("kc,chw->khw", weights[:, :, dy, dx], step[:, dy:dy + 16, dx:dx + 20])
                for dy in range(3) for dx in range(3))
    ours, sim = _run("imagenet")[B_CHANNELS], SIM["imagenet"]
    expected = np.clip(np.rint(sim + delta / float(np.float32(model.output_tensors[0].scales[0]))), -128, 127)
    assert np.abs(ours - expected).max() <= 1 and (ours != expected).mean() < 0.3
    assert np.abs(ours - sim).max() == 2 and (ours != sim).mean() > (ours != expected).mean()


# --- the runner's input ----------------------------------------------------------------------------


def test_runner_writes_raw_pixels_in_padded_rows():
    """3-byte pixels in rows of align(W, 16) = 32 pixels, the padding 0: the tensor's 1536 bytes."""
    runner = RknnRunner(_model("imagenet"), "rk3576")
    image = _image("imagenet")
    pixels = runner.image_pixels(0, image)
    assert pixels.shape == (16, 32, 3) and pixels.dtype == np.uint8 and pixels.size == 1536
    np.testing.assert_array_equal(pixels[:, :20], image[0].transpose(1, 2, 0))
    assert not pixels[:, 20:].any()
    np.testing.assert_array_equal(_run("imagenet", image=image.astype(np.float32)), _run("imagenet"))


@pytest.mark.parametrize("bad", [lambda x: x.astype(np.float32) + 0.5, lambda x: x.astype(np.int8),
                                 lambda x: x.astype(np.int16) - 1, lambda x: x[:, :, :8]])
def test_runner_refuses_other_than_raw_pixels(bad):
    with pytest.raises(InputError, match="input 0"):
        RknnRunner(_model("exact"), "rk3576").run([bad(_image("exact"))])


def test_runner_refuses_to_quantize_the_image_input_on_the_host():
    with pytest.raises(InputError, match="not quantized on the host"):
        RknnRunner(_model("exact"), "rk3576").quantize_input(0, _image("exact").astype(np.float32))


def test_runner_refuses_a_channel_reorder():
    model = _model("exact")
    swapped = replace(model.normalization[0], channel_order=(2, 1, 0))
    model = replace(model, normalization=(swapped, *model.normalization[1:]))
    with pytest.raises(EmulationError, match=r"input 0 reorders its channels \[2, 1, 0\]"):
        RknnRunner(model, "rk3576").run([_image("exact")])


def test_runner_refuses_an_input_tensor_of_another_size():
    model = _model("exact")
    index = next(i for i, t in enumerate(model.tensors) if t.name == RknnRunner(model, "rk3576").input_tensors[0].name)
    tensors = list(model.tensors)
    tensors[index] = replace(tensors[index], size=tensors[index].size + 16)
    model = replace(model, tensors=tuple(tensors))
    with pytest.raises(ModelFileError, match="holds .* bytes, not the 1920"):
        RknnRunner(model, "rk3576").image_pixels(0, _image("exact"))


# --- the converter's arithmetic ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=12, max_size=12), st.lists(st.integers(0, 0xFFFF), min_size=3,
       max_size=3), st.lists(st.integers(0, 20), min_size=3, max_size=3),
       st.lists(st.integers(-32768, 32767), min_size=3, max_size=3))
def test_image_converter_rounds_the_product_to_even(values, scales, truncates, offsets):
    """y_c = sat_int8(round_half_even(x_c x SCALE_c / 2^TRUNCATE_c) + OFFSET_c) on the pixel's bytes; the
    atom's other channels untouched."""
    feature = np.zeros((1, 1, 4, 16), np.int8)
    feature[0, 0, :, :3] = np.array(values, np.uint8).reshape(4, 3).view(np.int8)
    feature[0, 0, :, 3:] = 7
    out = convert_image_pixels(feature, ImageConvert(tuple(offsets), tuple(scales), tuple(truncates)))
    for pixel in range(4):
        for c in range(3):
            x = values[pixel * 3 + c]
            expected = min(127, max(-128, round(Fraction(x * scales[c], 1 << truncates[c])) + offsets[c]))
            assert out[0, 0, pixel, c] == expected
    assert (out[..., 3:] == 7).all()
