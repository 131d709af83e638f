"""Calibration in worker processes (compiler/quant/calibrate_workers.py): the same ranges, bit for
bit, as one process for every algorithm; the first failing sample's error; a dead worker and a
bad worker count are clear errors."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.quant.calibrate import calibrate
from npuemu.compiler.quant.calibrate_workers import WORKERS_ENV, default_workers
from npuemu.compiler.quant.observers import Histogram, RangeObserver
from npuemu.compiler.quant.pipeline import CalibrationOptions, calibrate_dataset
from npuemu.isa.errors import CompileError, InputError

SHAPE = [1, 3, 8, 8]


def small_graph():
    """conv -> relu -> conv -> sigmoid: tensors of both signs, one never negative."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal((2, 4, 1, 1)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"]),
             helper.make_node("Sigmoid", ["c2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], inits)
    return import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


def write_dataset(folder, arrays) -> str:
    names = []
    for index, array in enumerate(arrays):
        names.append(f"s{index}.npy")
        np.save(folder / names[-1], array)
    (folder / "ds.txt").write_text("".join(name + "\n" for name in names))
    return str(folder / "ds.txt")


def samples(count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(SHAPE) * (1 + index)).astype(np.float32) for index in range(count)]


def bits(ranges) -> dict:
    return {name: (np.float64(r.lo).tobytes(), np.float64(r.hi).tobytes()) for name, r in ranges.items()}


@pytest.mark.parametrize("algorithm", ["normal", "kl_divergence", "mmse"])
@pytest.mark.parametrize("workers", [2, 3])
def test_workers_give_the_same_ranges_bit_for_bit(tmp_path, algorithm, workers):
    graph = small_graph()
    dataset = write_dataset(tmp_path, samples(7))
    one = calibrate_dataset(graph, dataset, None, CalibrationOptions(algorithm, progress=False, workers=1))
    many = calibrate_dataset(graph, dataset, None, CalibrationOptions(algorithm, progress=False, workers=workers))
    assert bits(many.ranges) == bits(one.ranges) and bits(many.observed) == bits(one.observed)
    assert many.samples == one.samples == 7
    # samples in memory, by index, too
    listed = calibrate(graph, [{"x": x} for x in samples(7)], algorithm, progress=False, workers=workers)
    assert bits(listed.ranges) == bits(one.ranges)


@pytest.mark.parametrize("first_sign", [1.0, -1.0])
def test_equal_extremes_keep_the_first_seen_zero_sign(first_sign):
    """min(0.0, -0.0) keeps its first argument: merged observers keep the earlier sample's zero."""
    zeros = [np.full(SHAPE, first_sign * 0.0, np.float32), np.full(SHAPE, -first_sign * 0.0, np.float32)]
    sequential = RangeObserver()
    for index, values in enumerate(zeros):
        sequential.update(values, index)
    parts = [RangeObserver(), RangeObserver()]
    for index, values in enumerate(zeros):
        parts[index].update(values, index)
    for order in (parts, parts[::-1]):
        merged = RangeObserver()
        for part in order:
            merged.merge(part)
        assert math.copysign(1, merged.lo) == math.copysign(1, sequential.lo) == first_sign
        assert math.copysign(1, merged.hi) == math.copysign(1, sequential.hi) == first_sign
        assert merged.count == sequential.count


def test_histograms_merge_to_the_whole_count():
    values = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    whole, halves = Histogram.for_range(-4, 4), [Histogram.for_range(-4, 4), Histogram.for_range(-4, 4)]
    whole.update(values)
    halves[0].update(values[:400])
    halves[1].update(values[400:])
    halves[0].merge(halves[1])
    assert np.array_equal(halves[0].counts, whole.counts)


def test_the_first_failing_sample_is_reported(tmp_path):
    """Samples 2 and 3 are bad (wrong shape); worker 0 meets 2, worker 1 meets 3: 2 is reported,
    as a sequential run reports it."""
    arrays = samples(6)
    arrays[2] = arrays[2][:, :, :4]
    arrays[3] = arrays[3][:, :2]
    dataset = write_dataset(tmp_path, arrays)
    for workers in (1, 2):
        with pytest.raises(InputError, match="line 3: s2.npy"):
            calibrate_dataset(small_graph(), dataset, None, CalibrationOptions(progress=False, workers=workers))


class DyingSamples(Sequence):
    """Sample 1 ends its process at once (as the kernel's out-of-memory killer would)."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index):
        if index == 1:
            os._exit(3)
        return {"x": samples(1)[0]}


def test_a_dead_worker_is_a_clear_error():
    with pytest.raises(CompileError, match=f"calibration worker 1 exited with code 3.*{WORKERS_ENV}=1"):
        calibrate(small_graph(), DyingSamples(), progress=False, workers=2)


def test_worker_count_from_the_environment(monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "3")
    assert default_workers() == 3
    for bad in ("0", "two"):
        monkeypatch.setenv(WORKERS_ENV, bad)
        with pytest.raises(CompileError, match=WORKERS_ENV):
            default_workers()
    monkeypatch.delenv(WORKERS_ENV)
    assert 1 <= default_workers() <= 4
