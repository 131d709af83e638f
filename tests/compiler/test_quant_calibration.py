"""Calibration (compiler/quant/calibrate.py, clipping.py, observers.py): which tensors are
observed, min/max, and the kl_divergence / mmse range searches on synthetic distributions."""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
from onnx import helper

from npuemu.compiler.ir import FusedOp, Graph, Node, Tensor
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.quant.affine import Range, affine_params, fake_quantize
from npuemu.compiler.quant.calibrate import activation_tensors, calibrate
from npuemu.compiler.quant.clipping import histogram_mse, kl_range, mmse_range, mmse_weight_ranges, weight_ranges
from npuemu.compiler.quant.observers import Histogram, RangeObserver
from npuemu.compiler.quant.progress import Progress
from npuemu.isa.errors import CompileError, InputError


def true_mse(values: np.ndarray, chosen: Range) -> float:
    scale, zero_point = affine_params(chosen.lo, chosen.hi)
    return float(np.mean((fake_quantize(values, scale, zero_point) - values) ** 2))


def histogram_of(values: np.ndarray) -> Histogram:
    histogram = Histogram.for_range(float(values.min()), float(values.max()))
    histogram.update(values)
    return histogram


DISTRIBUTIONS = {
    "gaussian": lambda rng: rng.normal(0.3, 1.0, 200_000),
    "laplace_outliers": lambda rng: np.concatenate([rng.laplace(0, 0.5, 200_000), [40.0, -25.0]]),
    "relu_gaussian": lambda rng: np.maximum(rng.normal(0, 1, 200_000), 0),
    "student_t3": lambda rng: rng.standard_t(3, 200_000),
}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_mmse_error_is_not_above_normal(name):
    values = DISTRIBUTIONS[name](np.random.default_rng(1)).astype(np.float32)
    normal = Range(float(values.min()), float(values.max())).including_zero()
    chosen = mmse_range(histogram_of(values))
    assert true_mse(values, chosen) <= true_mse(values, normal)
    assert histogram_mse(histogram_of(values), chosen) <= histogram_mse(histogram_of(values), normal)
    if name in ("laplace_outliers", "student_t3"):  # heavy tails: clipping pays off
        assert true_mse(values, chosen) < 0.8 * true_mse(values, normal)


def test_mmse_on_uniform_keeps_nearly_the_full_range():
    values = np.random.default_rng(2).uniform(-1, 3, 100_000).astype(np.float32)
    chosen = mmse_range(histogram_of(values))
    assert chosen.lo < -0.9 and chosen.hi > 2.8
    assert true_mse(values, chosen) <= 1.01 * true_mse(values, Range(-1, 3))


def test_kl_picks_a_tighter_range_for_heavy_tails():
    values = DISTRIBUTIONS["laplace_outliers"](np.random.default_rng(3)).astype(np.float32)
    chosen = kl_range(histogram_of(values))
    assert chosen.hi < 0.5 * values.max() and chosen.lo > 0.5 * values.min()
    assert chosen.lo <= 0 <= chosen.hi
    # it clips the two outliers, not the body of the distribution
    assert chosen.lo < np.percentile(values, 0.1) and chosen.hi > np.percentile(values, 99.9)


def test_kl_keeps_a_one_sided_distribution_one_sided():
    values = DISTRIBUTIONS["relu_gaussian"](np.random.default_rng(4)).astype(np.float32)
    for search in (kl_range, mmse_range):
        chosen = search(histogram_of(values))
        assert chosen.lo == 0 and 0 < chosen.hi <= values.max()


def test_kl_keeps_the_range_of_a_bounded_uniform():
    values = np.random.default_rng(5).uniform(-2, 2, 100_000).astype(np.float32)
    chosen = kl_range(histogram_of(values))
    assert chosen.lo < -1.5 and chosen.hi > 1.5


def test_histogram_puts_zero_on_an_edge_and_counts_everything():
    histogram = Histogram.for_range(-1.0, 3.0, bins=400)
    assert histogram.edge(histogram.negative_bins) == 0.0
    values = np.array([-1.0, -0.0001, 0.0, 2.9999, 3.0, np.inf, np.nan], dtype=np.float32)
    histogram.update(values)
    assert histogram.counts.sum() == 5  # non-finite values are left out
    assert histogram.counts[histogram.negative_bins - 1] == 1 and histogram.counts[histogram.negative_bins] == 1


def test_range_observer_ignores_non_finite():
    observer = RangeObserver()
    observer.update(np.array([np.nan, -2.0, 5.0, np.inf]))
    assert (observer.lo, observer.hi, observer.non_finite) == (-2.0, 5.0, 2)


def test_weight_ranges_per_channel_and_mmse_clipping():
    rng = np.random.default_rng(6)
    weights = rng.normal(0, 1, (4, 3, 3, 3))
    weights[2, 0, 0, 0] = 30.0  # one outlier in channel 2
    lo, hi = weight_ranges(weights, 0)
    assert np.allclose(hi, weights.reshape(4, -1).max(axis=1)) and lo.shape == (4,)
    mlo, mhi = mmse_weight_ranges(weights, 0)
    assert np.all(mhi <= hi) and np.all(mlo >= lo)
    whole_lo, whole_hi = weight_ranges(weights, None)
    assert whole_hi.shape == (1,) and whole_hi[0] == 30.0


# ---- calibrate() over a graph ----------------------------------------------------------------

def fused_graph() -> Graph:
    """x -> Conv+Relu+Add(x) -> y as one fused node, plus an index output that stays integer."""
    rng = np.random.default_rng(0)
    graph = Graph("fused")
    graph.add_tensor(Tensor("x", (1, 2, 4, 4), "float32"))
    graph.add_tensor(Tensor("w", (2, 2, 1, 1), "float32", rng.normal(0, 1, (2, 2, 1, 1)).astype(np.float32)))
    graph.add_tensor(Tensor("y", (1, 2, 4, 4), "float32"))
    graph.add_tensor(Tensor("i", (1, 1, 4, 4), "int64"))
    conv = Node("conv", "Conv", ["x", "w"], ["y"], {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0],
                                                     "dilations": [1, 1], "group": 1},
                fused=[FusedOp("Relu"), FusedOp("Add", inputs=["x"], carry_index=0)])
    argmax = Node("argmax", "ArgMax", ["y"], ["i"], {"axis": 1, "keepdims": 1, "select_last_index": 0})
    graph.nodes = [conv, argmax]
    graph.inputs, graph.outputs = ["x"], ["y", "i"]
    graph.check()
    return graph


def test_only_materialized_float_tensors_are_observed():
    graph = fused_graph()
    assert activation_tensors(graph) == ["x", "y"]
    samples = [{"x": np.random.default_rng(seed).uniform(-1, 1, (1, 2, 4, 4)).astype(np.float32)} for seed in range(3)]
    result = calibrate(graph, samples, "normal", progress=False)
    assert set(result.ranges) == {"x", "y"}
    x_all = np.concatenate([sample["x"].ravel() for sample in samples])
    assert result.ranges["x"] == Range(float(x_all.min()), float(x_all.max()))
    assert result.samples == 3


def test_two_pass_algorithms_accept_a_generator(onnx_case):
    model = onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 8]}, ["y"])
    graph = import_onnx(model)
    samples = ({"x": np.random.default_rng(seed).normal(0, 1, (1, 8)).astype(np.float32)} for seed in range(5))
    result = calibrate(graph, samples, "mmse", progress=False)
    assert result.samples == 5 and result.ranges["y"].lo == 0.0 and result.ranges["y"].hi > 0


def test_calibration_errors(onnx_case):
    graph = import_onnx(onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 4]}, ["y"]))
    with pytest.raises(InputError, match="at least one sample"):
        calibrate(graph, [], "normal", progress=False)
    with pytest.raises(CompileError, match="unknown calibration algorithm 'minmax'"):
        calibrate(graph, [], "minmax", progress=False)


def test_non_finite_activations_are_reported(onnx_case, caplog):
    graph = import_onnx(onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 3]}, ["y"]))
    sample = {"x": np.array([[1.0, np.inf, -2.0]], dtype=np.float32)}
    with caplog.at_level(logging.WARNING):
        result = calibrate(graph, [sample], "normal", progress=False)
    assert result.ranges["x"] == Range(-2.0, 1.0)
    assert "non-finite" in caplog.text


class _Terminal(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_bar_only_on_a_terminal_and_when_enabled():
    for tty, enabled, drawn in ((True, True, True), (False, True, False), (True, False, False)):
        stream = _Terminal(tty)
        with Progress(2, "calibrating", enabled=enabled, stream=stream) as bar:
            bar.advance()
            bar.advance()
        assert ("2/2" in stream.getvalue()) is drawn
