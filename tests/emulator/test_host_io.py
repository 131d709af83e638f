"""Issue 20's host-step fast path (emulator/cpu_ops_io.py) reads and stores int8 tensors exactly
as the general path does, and as an independent reference says: NC1HWC2 (C2 lanes per pixel
atom, surfaces ``surface_stride`` pixels apart, padding lanes zero) or row-major ND bytes,
``float32(scale * (q - zero_point))`` read as float64, ``clamp(rint(v / scale) + zero_point)``
stored. The DMA streams are the DmaTraffic field names."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fixed_cost import chain_model
from npuemu.compiler.build import build_model
from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.emulator import cpu_ops, cpu_ops_io
from npuemu.emulator.cpu_ops_io import tensor_io
from npuemu.emulator.memory import STREAMS, DmaTraffic, Memory, TaskDma, Traffic
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import compile_graph

SHAPE = (1, 16, 8, 8)


@pytest.fixture(scope="module")
def model():
    """conv, two host-only Abs steps (their tensors ND int8), conv: NC1HWC2 and ND int8 tensors."""
    return build_model(compile_graph(chain_model(1, 2, input_name="x"), SHAPE))


@pytest.fixture(scope="module")
def model_fp16():
    """The same chain compiled to float16: NC1HWC2 and ND float16 tensors."""
    return build(prepare(chain_model(1, 2, input_name="x"), "rk3588", CompileOptions(precision="fp16")))


def _int8_tensors(runtime: Runtime) -> list[dict]:
    return [info for info in runtime.model.trailer["tensors"]
            if info.get("dtype") == "int8" and "quantization" in info and info["layout"] in ("ND", "NC1HWC2")]


def _reference_bytes(info: dict, stored: np.ndarray) -> np.ndarray:
    """The tensor's memory bytes for int8 values [C, H, W] (the layouts of the module docstring)."""
    if info["layout"] == "ND":
        return stored.reshape(-1).view(np.uint8)
    _, c1, height, width, c2 = info["native_shape"]
    surface = info["surface_stride"]
    image = np.zeros(c1 * surface * c2, np.int8)
    channels = stored.shape[0]
    for c in range(channels):
        for y in range(height):
            for x in range(width):
                image[((c // c2) * surface + y * width + x) * c2 + c % c2] = stored[c, y, x]
    return image.view(np.uint8)


def test_the_model_has_both_layouts(model):
    runtime = Runtime(model)
    layouts = {info["layout"] for info in _int8_tensors(runtime) if tensor_io(runtime, info["name"])}
    assert layouts == {"ND", "NC1HWC2"}


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_read_dequantizes_the_stored_bytes(model, seed):
    runtime = Runtime(model)
    rng = np.random.default_rng(seed)
    for info in _int8_tensors(runtime):
        channels, height, width = info["shape"][1:]
        stored = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
        runtime.machine.memory.load(int(info["address"]), _reference_bytes(info, stored))
        scale, zero_point = info["quantization"]["scale"], info["quantization"]["zero_point"]
        expected = (scale * (stored.astype(np.float64) - zero_point)).astype(np.float32)
        got = tensor_io(runtime, info["name"]).read()
        assert got.dtype == np.float64 and got.shape == tuple(info["shape"])
        assert np.array_equal(got.reshape(channels, height, width), expected.astype(np.float64)), info["name"]


special = st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e300, -1e300, np.inf, -np.inf])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.lists(special, min_size=4, max_size=4))
def test_store_quantizes_like_the_reference(model, seed, specials):
    runtime = Runtime(model)
    rng = np.random.default_rng(seed)
    for info in _int8_tensors(runtime):
        channels, height, width = info["shape"][1:]
        scale, zero_point = info["quantization"]["scale"], info["quantization"]["zero_point"]
        values = rng.normal(size=(channels, height, width)) * scale * 100
        values.reshape(-1)[:4] = specials
        values.reshape(-1)[4:8] = (np.arange(4) + 0.5) * scale  # exact halves of a step: to even
        cpu_ops._store(runtime, info["name"], values.reshape(info["shape"]), "Test")
        stored = np.clip(np.rint(values / scale) + zero_point, -128, 127).astype(np.int8)
        expected = _reference_bytes(info, stored)
        assert np.array_equal(runtime.machine.memory.dump(int(info["address"]), expected.size), expected)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_plan_and_general_path_agree_bit_for_bit(model, seed):
    """Also on NaN (whose int8 cast numpy leaves to the platform): the same operations."""
    rng = np.random.default_rng(seed)
    fast, general = Runtime(model), Runtime(model)
    for info in _int8_tensors(fast):
        name = info["name"]
        general.host_io[name] = None  # no plan: the general path
        values = rng.normal(size=info["shape"]) * 10
        values.reshape(-1)[rng.integers(0, values.size, 5)] = np.nan
        for runtime in (fast, general):
            with np.errstate(invalid="ignore"):
                cpu_ops._store(runtime, name, values, "Test")
        size = int(info["size"])
        assert np.array_equal(fast.machine.memory.dump(int(info["address"]), size),
                              general.machine.memory.dump(int(info["address"]), size))
        assert np.array_equal(cpu_ops._read(fast, name), cpu_ops._read(general, name))


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_float16_plan_and_general_path_agree_bit_for_bit(model_fp16, seed):
    """float16 tensors: a result rounded to float16 (NaN, infinities, overflow included) and read
    back as the general path gives it (an NC1HWC2 map through float32, an ND tensor directly)."""
    rng = np.random.default_rng(seed)
    fast, general = Runtime(model_fp16), Runtime(model_fp16)
    tensors = [info for info in fast.model.trailer["tensors"] if info["dtype"] == "float16"]
    assert {info["layout"] for info in tensors if tensor_io(fast, info["name"])} == {"ND", "NC1HWC2"}
    for info in tensors:
        name = info["name"]
        general.host_io[name] = None
        values = rng.normal(size=info["shape"]) * 10.0 ** rng.integers(-8, 6)
        values.reshape(-1)[rng.integers(0, values.size, 6)] = [np.nan, np.inf, -np.inf, 7e4, -0.0, 1e-9]
        for runtime in (fast, general):
            with np.errstate(over="ignore"):
                cpu_ops._store(runtime, name, values, "Test")
        size = int(info["size"])
        got = fast.machine.memory.dump(int(info["address"]), size)
        assert np.array_equal(got, general.machine.memory.dump(int(info["address"]), size))
        assert np.array_equal(cpu_ops._read(fast, name), cpu_ops._read(general, name), equal_nan=True)
        with np.errstate(over="ignore"):  # the reference: the value rounded to float16
            rounded = values.astype(np.float16).astype(np.float64)
        assert np.array_equal(cpu_ops._read(fast, name), rounded, equal_nan=True)


def test_store_drops_derived_values_and_checks_the_size(model):
    runtime = Runtime(model)
    info = _int8_tensors(runtime)[0]
    memory = runtime.machine.memory
    for layout in ("NC1HWC2", "ND"):  # (an ND int8 result is cast straight into memory)
        other = next(other for other in _int8_tensors(runtime) if other["layout"] == layout)
        address = int(other["address"])
        memory.derived.put("key", address + 4, address + 8, "value")
        cpu_ops._store(runtime, other["name"], np.zeros(other["shape"]), "Test")
        assert memory.derived.get("key") is None, layout
    with pytest.raises(Exception, match="does not fit output"):
        cpu_ops._store(runtime, info["name"], np.zeros(7), "Test")


def test_streams_are_the_traffic_field_names():
    names = {f.name for f in dataclasses.fields(DmaTraffic)} - {"sram_hit_reads", "sram_hit_writes"}
    assert set(STREAMS) == names and len(STREAMS) == len(names)
    dma = TaskDma(Memory(1024), "t")
    for stream in STREAMS:
        dma.count(stream, len(stream))
    dma.count(Traffic.FEATURE_READ, 1)
    assert dma.counts[Traffic.FEATURE_READ] == len("feature_read") + 1
    assert dma.traffic().as_dict() == {**{name: len(name) for name in names}, "feature_read": len("feature_read") + 1,
                                       "sram_hit_reads": 0, "sram_hit_writes": 0}


class _Step:  # the CpuStep fields run_step reads
    def __init__(self, op, inputs, outputs, params):
        self.op, self.inputs, self.outputs, self.params = op, inputs, outputs, params


def test_constant_operands_are_fresh_on_every_run(model, monkeypatch):
    """A constant operand is parsed once per step but every run hands the op its own copy: an op
    that changes its inputs in place does not change the next run's constant."""
    runtime = Runtime(model)
    nd = [info for info in _int8_tensors(runtime) if info["layout"] == "ND"]
    source, target = nd[0]["name"], nd[-1]["name"]

    def add_in_place(inputs, params):
        inputs[1] += 1.0  # a misbehaving op: it changes its operand
        return [inputs[0] * 0.0 + inputs[1]]

    monkeypatch.setitem(cpu_ops.OPS, "Add", add_in_place)
    constant = {"constant": {"values": [0.5], "shape": [1], "dtype": "float32"}}
    step = _Step("Add", (source,), (target,), {"operands": [{"tensor": 0}, constant]})
    results = []
    for _ in range(3):
        cpu_ops.run_step(runtime, step)
        results.append(cpu_ops._read(runtime, target))
    assert np.array_equal(results[0], results[1]) and np.array_equal(results[1], results[2])
    scale, zero_point = nd[-1]["quantization"]["scale"], nd[-1]["quantization"]["zero_point"]
    stored = np.clip(np.rint(1.5 / scale) + zero_point, -128, 127)
    assert np.all(results[0] == np.float32(scale * (stored - zero_point)))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.sampled_from([8, 16, 32]), st.integers(1, 5), st.integers(1, 5), st.integers(0, 3),
       st.integers(0, 1), st.booleans(), st.booleans(), st.booleans(), st.integers(0, 2**32 - 1))
def test_plans_on_varied_geometry_match_the_plain_layout_path(channels, c2, height, width, extra_pixels,
                                                              extra_groups, is_int8, is_nd, kept, seed):
    """The plan's NC1HWC2 store (a kept zero-padded image, filled through views) and read (one
    lookup of every byte, then the view) against tensor_layout's to_native / from_native and the
    plain arithmetic: channels not a multiple of C2, surfaces longer than the map, spare C1
    groups, int8 and float16; padding bytes that held garbage come out zero. ND tensors (int8:
    cast straight into memory) against their row-major bytes. ``kept``: a map small enough to
    keep its image, else one laid out afresh (as a map above _KEPT_IMAGE_BYTES is)."""
    with mock.patch.object(cpu_ops_io, "_KEPT_IMAGE_BYTES", 1 << 20 if kept else 0):
        _check_plan_on_geometry(channels, c2, height, width, extra_pixels, extra_groups, is_int8, is_nd, seed)


def _check_plan_on_geometry(channels, c2, height, width, extra_pixels, extra_groups, is_int8, is_nd, seed):
    from npuemu.emulator.cpu_ops_io import TensorIO
    from npuemu.isa import tensor_layout

    rng = np.random.default_rng(seed)
    c1 = -(-channels // c2) + extra_groups
    surface = height * width + extra_pixels
    if is_nd:  # row-major: no C2 lanes, no surface padding
        c1, c2, surface = channels, 1, height * width
    dtype = np.dtype(np.int8 if is_int8 else np.float16)
    nbytes = c1 * surface * c2 * dtype.itemsize
    memory = Memory(nbytes + 64)
    address, region = 32, memory.regions[0]
    scale, zero_point = (float(rng.uniform(0.01, 2.0)), int(rng.integers(-20, 20))) if is_int8 else (None, 0)
    shape = (1, channels, height, width)
    plan = TensorIO(memory, region, address, nbytes, shape, scale, zero_point,
                    None if is_nd else (channels, height, width, c1, c2, surface))
    for _ in range(2):  # the second store goes through the same kept image
        garbage = rng.integers(0, 256, nbytes + 64).astype(np.uint8)
        memory.load(0, garbage)  # padding bytes included
        values = rng.normal(size=shape) * 60
        values.reshape(-1)[: min(3, values.size)] = [np.inf, -np.inf, 0.5][: min(3, values.size)]
        with np.errstate(over="ignore"):
            plan.store(values, "t", "Test")
            stored = (np.clip(np.rint(values / scale) + zero_point, -128, 127) if is_int8 else values).astype(dtype)
        expected = tensor_layout.to_native(stored.reshape(channels, height, width), c1, c2, surface)
        assert np.array_equal(memory.dump(address, nbytes), expected.reshape(-1).view(np.uint8))
        assert np.array_equal(memory.dump(0, address), garbage[:address])  # the bytes around it untouched
        assert np.array_equal(memory.dump(address + nbytes, 32), garbage[address + nbytes:])
        cube = tensor_layout.from_native(expected.reshape(-1), channels, height, width, c1, c2, surface)
        if is_int8:  # float32(scale * (q - zero point)), as float64
            reference = (scale * (cube.astype(np.float64) - zero_point)).astype(np.float32)
        else:
            reference = cube.astype(np.float32)
        got = plan.read()
        assert got.dtype == np.float64 and got.shape == shape
        assert np.array_equal(got.reshape(channels, height, width), reference.astype(np.float64))
