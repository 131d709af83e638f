"""The one-pass input store (emulator/input_store.py, issue 20: ``Runtime.set_input``) against
references written here: the quantization formula of runtime.py's module docstring in numpy,
numpy's own ``astype(np.float16)``, and the NC1HWC2 layout of isa/tensor_layout.py's docstring
element by element. Odd geometry (channel counts 1..40 that leave a partial group, extra zero
groups, surfaces longer than the map, packed atoms C2 = C and atoms of 8/16/32 lanes: the word
and lane kernels and the general loops), saturation, rounding ties, inf, NaN (refused: the runtime
then takes its reference path), fp16 ties a float64 -> float32 -> float16 double rounding gets
wrong, subnormals, -0.0, overflow, both input float types, non-contiguous inputs; then the
runtime: set_input's bytes equal the reference path's on int8 and float16 builds (a 3-channel
input: the compiled-constant kernels; 16 channels: the general loops), derived values over the
input are dropped, NaN inputs store as before."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from benchmarks.fixed_cost import chain_model
from npuemu.compiler.build import build_model
from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.emulator import input_store
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import compile_graph


def reference_quantize(values: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """q = clamp(round_half_even(x / s) + z, -128, 127) in float64 (runtime.py's docstring)."""
    x = values.astype(np.float64)
    return np.clip(np.rint(x / scale) + zero_point, -128, 127).astype(np.int8)


def reference_image(stored: np.ndarray, c1: int, surface: int, c2: int) -> np.ndarray:
    """[C, pixels] -> [C1, surface, C2] element by element; everything else 0."""
    image = np.zeros((c1, surface, c2), stored.dtype)
    channels, pixels = stored.shape
    for c in range(channels):
        for p in range(pixels):
            image[c // c2, p, c % c2] = stored[c, p]
    return image


@st.composite
def geometry(draw):
    c2 = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32]))
    channels = c2 if draw(st.booleans()) else draw(st.integers(1, min(40, 3 * c2 + 1)))  # (often packed)
    c1 = -(-channels // c2) + draw(st.integers(0, 1))  # sometimes a whole zero group past C
    pixels = draw(st.integers(1, 40))
    surface = pixels + draw(st.integers(0, 5))
    return channels, pixels, c1, surface, c2


def laid_out(values: np.ndarray, how: int) -> np.ndarray:
    """The same [C, pixels] values as a C-contiguous array (0), a Fortran one (1), a transposed view of a
    [pixels, C] array (2) or a [C, H, W] view with a step in W (3)."""
    if how == 1:
        return np.asfortranarray(values)
    if how == 2:
        return np.ascontiguousarray(values.T).T
    if how == 3:
        wide = np.zeros((values.shape[0], 1, 2 * values.shape[1]), values.dtype)
        wide[:, 0, ::2] = values
        return wide[:, :, ::2]
    return values


def stale_image(shape: tuple, dtype, fill, odd: bool) -> np.ndarray:
    """An image of stale values ``fill`` (every one must be rewritten), at an odd address if ``odd`` (the
    word kernels then write unaligned words)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + 1, np.uint8)[1:] if odd else np.zeros(nbytes, np.uint8)
    image = raw.view(dtype).reshape(shape)
    image[...] = fill
    return image


SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 126.5, 127.5, -128.5, -127.5, 1e30, -1e30, np.inf, -np.inf]


@settings(max_examples=150, deadline=None)
@given(geometry(), st.sampled_from([np.float32, np.float64]), st.integers(0, 2 ** 32 - 1),
       st.sampled_from([1.0, 0.5, 0.25, 0.0173, 3.0, 1e-3]), st.integers(-128, 127), st.booleans(),
       st.integers(0, 3), st.booleans())
def test_quantize_into_matches_the_reference(geo, dtype, seed, scale, zero_point, specials, layout, odd):
    channels, pixels, c1, surface, c2 = geo
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((channels, pixels)) * 200 * scale).astype(dtype)
    if specials:  # exact ties (x / s = k + 0.5 for the power-of-two scales), saturation, inf
        picks = rng.integers(0, len(SPECIAL), values.size)
        mask = rng.random(values.size) < 0.5
        flat = values.reshape(-1)
        flat[mask] = (np.array(SPECIAL)[picks[mask]] * scale).astype(dtype)
        # and near-ties of any scale, an ulp either side: x / s rounds differently from x * (1 / s) there
        near = (rng.integers(-140, 140, values.size) + 0.5) * scale
        near = near.astype(dtype)
        step = rng.integers(0, 3, values.size)  # (down, none, up)
        near = np.where(step == 1, near, np.nextafter(near, np.where(step == 0, -np.inf, np.inf).astype(dtype)))
        mask = rng.random(values.size) < 0.3
        flat[mask] = near[mask]
    image = stale_image((c1, surface, c2), np.int8, 99, odd)
    assert input_store.quantize_into(image, laid_out(values, layout), scale, zero_point)
    expected = reference_image(reference_quantize(values, scale, zero_point), c1, surface, c2)
    assert np.array_equal(image, expected)


@settings(max_examples=40, deadline=None)
@given(geometry(), st.integers(0, 2 ** 32 - 1))
def test_quantize_into_refuses_nan(geo, seed):
    channels, pixels, c1, surface, c2 = geo
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((channels, pixels)).astype(np.float32)
    values.reshape(-1)[rng.integers(0, values.size)] = np.nan
    assert not input_store.quantize_into(np.zeros((c1, surface, c2), np.int8), values, 0.1, 0)


#: fp16 specials: zeros, the largest half and the overflow threshold 65520 (and past it), infinities,
#: subnormals and the halfway points below them, a tie (1 + 2**-11) and its neighbours
SPECIAL16 = [0.0, -0.0, 65504.0, 65519.0, 65520.0, -65520.0, 1e6, np.inf, -np.inf, 2.0 ** -24, 2.0 ** -25,
             1.5 * 2.0 ** -25, 2.0 ** -14, 1.0 - 2.0 ** -12, 1.0 + 2.0 ** -11, -(1.0 + 3 * 2.0 ** -11), 3e-8,
             1e-40, -1e-40]
#: float64 values a rounding through float32 gets wrong: a tie of fp16 plus or minus less than half
#: a float32 ulp (float32 makes it the tie, which then rounds to even)
DOUBLE_TRAPS = [1.0 + 2.0 ** -11 + 2.0 ** -40, 1.0 + 3 * 2.0 ** -11 - 2.0 ** -40, -(1.0 + 2.0 ** -11 + 2.0 ** -30),
                2.0 ** -25 + 2.0 ** -60, 65520.0 - 2.0 ** -20, 2.0 ** -24 * (1.5 + 2.0 ** -30)]


@settings(max_examples=150, deadline=None)
@given(geometry(), st.sampled_from([np.float32, np.float64]), st.integers(0, 2 ** 32 - 1),
       st.sampled_from([1e-6, 1.0, 1e4, 1e6]), st.booleans(), st.booleans(), st.integers(0, 3), st.booleans())
def test_halve_into_matches_numpy(geo, dtype, seed, magnitude, specials, nan, layout, odd):
    channels, pixels, c1, surface, c2 = geo
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((channels, pixels)) * magnitude).astype(dtype)
    flat = values.reshape(-1)
    if specials:
        pool = np.array(SPECIAL16 + (DOUBLE_TRAPS if dtype == np.float64 else []))
        mask = rng.random(values.size) < 0.5
        flat[mask] = pool[rng.integers(0, len(pool), values.size)[mask]] * rng.choice([-1.0, 1.0], values.size)[mask]
    if nan:  # (a quiet NaN with a payload, a signalling one: numpy decides their bits)
        flat[rng.integers(0, values.size)] = np.array(0x7FA00001 if dtype == np.float32 else 0x7FF0000000000123,
                                                      np.uint32 if dtype == np.float32 else np.uint64).view(dtype)
    image = stale_image((c1, surface, c2), np.float16, 7, odd)
    done = input_store.halve_into(image, laid_out(values, layout))
    expected = reference_image(values.astype(np.float16), c1, surface, c2)
    assert done or nan  # (refused only for a NaN; then the runtime converts with numpy)
    if done:
        assert np.array_equal(image.view(np.uint16), expected.view(np.uint16))


@settings(max_examples=150, deadline=None)
@given(geometry(), st.sampled_from([(np.int8, np.int8), (np.float32, np.float16), (np.float64, np.float16),
                                    (np.float16, np.float16)]), st.integers(0, 2 ** 32 - 1), st.booleans())
def test_copy_into_matches_the_reference(geo, types, seed, transposed):
    channels, pixels, c1, surface, c2 = geo
    source, stored = types
    rng = np.random.default_rng(seed)
    if source == np.int8:
        values = rng.integers(-128, 128, (channels, pixels)).astype(np.int8)
    else:  # beyond float16's range, below its subnormals, ties of its rounding, inf and NaN
        values = (rng.standard_normal((channels, pixels)) * rng.choice([1e-6, 1.0, 1e4, 1e6])).astype(source)
        values.reshape(-1)[: min(3, values.size)] = [np.nan, np.inf, 1.0 + 2.0 ** -11][: min(3, values.size)]
    if transposed:
        values = np.ascontiguousarray(values.T).T  # a non-contiguous view of the same values
    image = np.full((c1, surface, c2), 7, stored)
    input_store.copy_into(image, values)
    expected = reference_image(values.astype(stored), c1, surface, c2)
    assert np.array_equal(image.view(np.uint8 if stored == np.int8 else np.uint16),
                          expected.view(np.uint8 if stored == np.int8 else np.uint16))


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        input_store.copy_into(np.zeros((1, 4, 2), np.int8), np.zeros((3, 4), np.int8))
    with pytest.raises(ValueError, match="do not fit"):
        input_store.quantize_into(np.zeros((1, 4, 4), np.int8), np.zeros((3, 5), np.float32), 1.0, 0)


# --- the runtime ------------------------------------------------------------------------------

SHAPE = (1, 16, 8, 8)
RGB = (1, 3, 12, 10)


def rgb_model() -> onnx.ModelProto:
    """A 3-channel input (int8: a packed atom of 3 bytes; fp16: 3 lanes of 8) into a 3x3 conv."""
    w = (np.random.default_rng(0).standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["y"], ["out"])]
    graph = helper.make_graph(nodes, "rgb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(RGB))],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, *RGB[2:]])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def models():
    """{(precision, input channels): model file}."""
    return {("int8", 16): build_model(compile_graph(chain_model(1, 0, input_name="x"), SHAPE)),
            ("fp16", 16): build(prepare(chain_model(1, 0, input_name="x"), "rk3588", CompileOptions(precision="fp16"))),
            ("int8", 3): build_model(compile_graph(rgb_model(), RGB)),
            ("fp16", 3): build(prepare(rgb_model(), "rk3588", CompileOptions(precision="fp16")))}


@pytest.fixture(scope="module")
def int8_model(models):
    return models["int8", 16]


def _input_bytes(runtime: Runtime, name: str) -> np.ndarray:
    info = runtime.tensor_info(name)
    _, c1, _, _, c2 = info["native_shape"]
    nbytes = c1 * info["surface_stride"] * c2 * (1 if info["dtype"] == "int8" else 2)
    return runtime.machine.memory.dump(int(info["address"]), nbytes)


def _expected_bytes(runtime: Runtime, name: str, stored: np.ndarray) -> np.ndarray:
    info = runtime.tensor_info(name)
    _, c1, _, _, c2 = info["native_shape"]
    return reference_image(stored.reshape(stored.shape[1], -1), c1, info["surface_stride"], c2).reshape(-1).view(
        np.uint8)


def _stale(runtime: Runtime, name: str, rng) -> None:
    """Random bytes over the input tensor: every one must be rewritten."""
    runtime.machine.memory.load(int(runtime.tensor_info(name)["address"]),
                                rng.integers(0, 256, _input_bytes(runtime, name).size).astype(np.uint8))


@pytest.mark.parametrize("channels", [16, 3])
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int8]),
       nan=st.booleans())
def test_set_input_int8_stores_the_reference_bytes(models, channels, seed, dtype, nan):
    runtime = Runtime(models["int8", channels])
    name = runtime.inputs[0]
    shape = tuple(runtime.tensor_info(name)["shape"])
    rng = np.random.default_rng(seed)
    _stale(runtime, name, rng)
    if dtype == np.int8:
        x = rng.integers(-128, 128, shape).astype(np.int8)
        stored = x
    else:
        x = (rng.standard_normal(shape) * 4).astype(dtype)
        x.reshape(-1)[:4] = [np.inf, -np.inf, 1e9, np.nan if nan else 0.0]
        scale, zero_point = runtime.quantization(name)
        stored = reference_quantize(x, scale, zero_point)  # (numpy's own NaN conversion, as before)
    runtime.set_input(name, x)
    assert np.array_equal(_input_bytes(runtime, name), _expected_bytes(runtime, name, stored))


@pytest.mark.parametrize("channels", [16, 3])
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), dtype=st.sampled_from([np.float32, np.float64, np.float16]),
       nan=st.booleans(), transposed=st.booleans())
def test_set_input_fp16_stores_the_reference_bytes(models, channels, seed, dtype, nan, transposed):
    runtime = Runtime(models["fp16", channels])
    name = runtime.inputs[0]
    shape = tuple(runtime.tensor_info(name)["shape"])
    rng = np.random.default_rng(seed)
    _stale(runtime, name, rng)
    x = (rng.standard_normal(shape) * 1e3).astype(dtype)
    x.reshape(-1)[:3] = [np.array(0x7FA00001, np.uint32).view(np.float32) if nan else -0.0, np.inf, 1e6]
    if transposed:  # (a non-contiguous array of the same values)
        x = np.ascontiguousarray(x.transpose(0, 3, 2, 1)).transpose(0, 3, 2, 1)
    x.flags.writeable = False  # (as np.load(..., mmap_mode="r") gives it)
    runtime.set_input(name, x)
    assert np.array_equal(_input_bytes(runtime, name), _expected_bytes(runtime, name, x.astype(np.float16)))


def test_set_input_drops_derived_values_over_the_input(int8_model):
    runtime = Runtime(int8_model)
    name = runtime.inputs[0]
    address = int(runtime.tensor_info(name)["address"])
    derived = runtime.machine.memory.derived
    derived.put(("test", "over the input"), address + 16, address + 32, "stale")
    derived.put(("test", "elsewhere"), address - 64, address - 48, "kept")
    runtime.set_input(name, np.zeros(SHAPE, np.float32))
    assert derived.get(("test", "over the input")) is None
    assert derived.get(("test", "elsewhere")) == "kept"


def test_set_input_keeps_its_shape_errors(int8_model):
    runtime = Runtime(int8_model)
    with pytest.raises(Exception, match="expected shape"):
        runtime.set_input(runtime.inputs[0], np.zeros((1, 16, 8, 9), np.float32))
