"""The one-pass input store (emulator/input_store.py, issue 20: ``Runtime.set_input``) against
references written here: the quantization formula of runtime.py's module docstring in numpy,
and the NC1HWC2 layout of isa/tensor_layout.py's docstring element by element. Odd geometry
(channel counts that leave a partial group, extra zero groups, surfaces longer than the map),
saturation, rounding ties, inf, NaN (refused: the runtime then takes its reference path), both
input float types; then the runtime: set_input's bytes equal the reference path's on an int8
and a float16 build, derived values over the input are dropped, NaN inputs store as before."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    c2 = draw(st.sampled_from([1, 3, 4, 8, 16]))
    channels = draw(st.integers(1, 3 * c2 + 1))
    c1 = -(-channels // c2) + draw(st.integers(0, 1))  # sometimes a whole zero group past C
    pixels = draw(st.integers(1, 40))
    surface = pixels + draw(st.integers(0, 5))
    return channels, pixels, c1, surface, c2


SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 126.5, 127.5, -128.5, -127.5, 1e30, -1e30, np.inf, -np.inf]


@settings(max_examples=150, deadline=None)
@given(geometry(), st.sampled_from([np.float32, np.float64]), st.integers(0, 2 ** 32 - 1),
       st.sampled_from([1.0, 0.5, 0.25, 0.0173, 3.0, 1e-3]), st.integers(-128, 127), st.booleans(),
       st.booleans())
def test_quantize_into_matches_the_reference(geo, dtype, seed, scale, zero_point, specials, fortran):
    channels, pixels, c1, surface, c2 = geo
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal((channels, pixels)) * 200 * scale).astype(dtype)
    if specials:  # exact ties (x / s = k + 0.5 for the power-of-two scales), saturation, inf
        picks = rng.integers(0, len(SPECIAL), values.size)
        mask = rng.random(values.size) < 0.5
        flat = values.reshape(-1)
        flat[mask] = (np.array(SPECIAL)[picks[mask]] * scale).astype(dtype)
    if fortran:
        values = np.asfortranarray(values)
    image = np.full((c1, surface, c2), 99, np.int8)  # (stale bytes: every one must be rewritten)
    assert input_store.quantize_into(image, values, scale, zero_point)
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


@pytest.fixture(scope="module")
def int8_model():
    return build_model(compile_graph(chain_model(1, 0, input_name="x"), SHAPE))


@pytest.fixture(scope="module")
def fp16_model():
    return build(prepare(chain_model(1, 0, input_name="x"), "rk3588", CompileOptions(precision="fp16")))


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


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([np.float32, np.float64, np.float16, np.int8]),
       st.booleans())
def test_set_input_int8_stores_the_reference_bytes(int8_model, seed, dtype, nan):
    runtime = Runtime(int8_model)
    name = runtime.inputs[0]
    rng = np.random.default_rng(seed)
    runtime.machine.memory.load(int(runtime.tensor_info(name)["address"]),
                                rng.integers(0, 256, _input_bytes(runtime, name).size).astype(np.uint8))
    if dtype == np.int8:
        x = rng.integers(-128, 128, SHAPE).astype(np.int8)
        stored = x
    else:
        x = (rng.standard_normal(SHAPE) * 4).astype(dtype)
        x.reshape(-1)[:4] = [np.inf, -np.inf, 1e9, np.nan if nan else 0.0]
        scale, zero_point = runtime.quantization(name)
        stored = reference_quantize(x, scale, zero_point)  # (numpy's own NaN conversion, as before)
    runtime.set_input(name, x)
    assert np.array_equal(_input_bytes(runtime, name), _expected_bytes(runtime, name, stored))


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([np.float32, np.float64]))
def test_set_input_fp16_stores_the_reference_bytes(fp16_model, seed, dtype):
    runtime = Runtime(fp16_model)
    name = runtime.inputs[0]
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(SHAPE) * 1e3).astype(dtype)
    x.reshape(-1)[:3] = [np.nan, np.inf, 1e6]
    runtime.set_input(name, x)
    info = runtime.tensor_info(name)
    _, c1, _, _, c2 = info["native_shape"]
    image = reference_image(x.astype(np.float16).reshape(SHAPE[1], -1), c1, info["surface_stride"], c2)
    assert np.array_equal(_input_bytes(runtime, name), image.reshape(-1).view(np.uint8))


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
