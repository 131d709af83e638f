"""The output reads (emulator/output_read.py, issue 20: ``Runtime.output``) against references
written here: the NC1HWC2 layout of isa/tensor_layout.py's docstring element by element, numpy's
``astype(np.float32)`` of float16 (every bit pattern: NaN payloads, signalling NaNs, subnormals,
-0.0), the dequantization of runtime.py's module docstring in numpy; then ``Runtime.output`` of
an int8 and a float16 build against the tensor's bytes read back by the reference layout, over two
runs (``output``'s per-tensor readers read memory as it is)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fixed_cost import chain_model
from npuemu.compiler.build import build_model
from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.emulator import output_read
from npuemu.emulator.kernels import output_values
from npuemu.emulator.runtime import Runtime
from npuemu.isa import tensor_layout
from tests.compiler.test_build_e2e import compile_graph


def reference_channels(image: np.ndarray, channels: int, pixels: int) -> np.ndarray:
    """[C1, surface, C2] -> [channels, pixels], element by element."""
    c2 = image.shape[2]
    out = np.zeros((channels, pixels), image.dtype)
    for c in range(channels):
        for p in range(pixels):
            out[c, p] = image[c // c2, p, c % c2]
    return out


@settings(max_examples=150, deadline=None)
@given(st.sampled_from([1, 2, 3, 4, 8, 16, 32]), st.integers(1, 40), st.integers(0, 1), st.integers(1, 30),
       st.integers(0, 4), st.sampled_from([np.int8, np.float16]), st.integers(0, 2 ** 32 - 1))
def test_channels_of_matches_the_layout(c2, channels, extra, pixels, surface_pad, dtype, seed):
    c1 = -(-channels // c2) + extra
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 16, (c1, pixels + surface_pad, c2)).astype(np.uint16)
    image = bits.astype(np.uint8).view(np.int8) if dtype == np.int8 else bits.view(np.float16)  # (any bits: NaNs too)
    got = output_read.channels_of(image, channels, pixels)
    assert got.flags.c_contiguous and got.dtype == image.dtype
    expected = reference_channels(image, channels, pixels)
    width = np.uint8 if dtype == np.int8 else np.uint16
    assert np.array_equal(got.view(width), expected.view(width))


def test_widen_gives_numpys_bits_for_every_pattern():
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    for part in (halves, halves[:0x7C00], halves[0x7C00:0x7E00], halves.reshape(256, 256)[:, ::3], halves[:10]):
        got = output_read.widen(part)
        assert got.shape == part.shape and got.dtype == np.float32
        assert np.array_equal(got.view(np.uint32), part.astype(np.float32).view(np.uint32))
    # a signalling NaN (0x7C01..0x7DFF, either sign) is left to numpy, whose own build decides its quiet bit
    bits = halves.view(np.uint16)
    signalling = ((bits & 0x7E00) == 0x7C00) & ((bits & 0x1FF) != 0)
    for pattern in (0x7C01, 0x7DFF, 0xFD00, 0x7E00, 0x7C00, 0x0001, 0xFBFF):
        expected = not signalling[pattern]
        assert output_values.widen_bits(np.full(100, pattern, np.uint16), np.empty(100, np.float32)) == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.integers(1, 5000), st.floats(1e-8, 1e8), st.integers(-128, 127))
def test_dequantize_matches_the_reference(seed, size, scale, zero_point):
    stored = np.random.default_rng(seed).integers(-128, 128, size).astype(np.int8)
    expected = (np.subtract(stored.astype(np.float64), zero_point) * scale).astype(np.float32)
    got = output_read.dequantize(stored.reshape(1, -1), scale, zero_point)
    assert got.shape == (1, size) and np.array_equal(got.reshape(-1).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_runtime_output_reads_the_reference_values(precision):
    model = chain_model(1, 0, input_name="x")
    built = build_model(compile_graph(model, (1, 16, 8, 8))) if precision == "int8" else \
        build(prepare(model, "rk3588", CompileOptions(precision="fp16")))
    runtime = Runtime(built)
    for seed in (1, 2):  # (the second run read by the readers the first one's calls made: the new values)
        runtime.set_input("x", np.random.default_rng(seed).standard_normal((1, 16, 8, 8)).astype(np.float32))
        runtime.run()
        _check_outputs(runtime)


def _check_outputs(runtime: Runtime) -> None:
    """Each output (stored and dequantized) against its bytes in memory through the reference layout."""
    for name in runtime.outputs:
        info = runtime.tensor_info(name)
        _, c1, height, width, c2 = info["native_shape"]
        dtype = np.int8 if info["dtype"] == "int8" else np.float16
        surface = int(info["surface_stride"])
        raw = runtime.machine.memory.dump(int(info["address"]), c1 * surface * c2 * np.dtype(dtype).itemsize)
        channels = info["shape"][1]
        stored = tensor_layout.from_native(raw.view(dtype), channels, height, width, c1, c2, surface)
        stored = stored.reshape(info["shape"])
        got = runtime.output(name, dequantize=False)
        assert got.dtype == dtype and np.array_equal(got.view(np.uint8), np.ascontiguousarray(stored).view(np.uint8))
        if dtype == np.float16:
            expected = stored.astype(np.float32)
        else:
            scale, zero_point = runtime.quantization(name)
            expected = (np.subtract(stored, zero_point, dtype=np.float64) * scale).astype(np.float32)
        assert np.array_equal(runtime.output(name).view(np.uint32), expected.view(np.uint32))
