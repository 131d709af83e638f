"""Automatic hybrid precision: move the layers that cost the most int8 accuracy to float16
until the model's cosine against the float model reaches a target (QUANTIZATION.md 12).

Two steps, both on the fake-quant evaluator (float arithmetic, no build):

1. **Rank once.** A *unit* is one int8 activation tensor with its producer's quantized
   constants (weights, bias, operands); keeping it out of int8 takes its producer and every
   reader to float16 (``float16_layers_for``). Each unit is scored by the graph outputs'
   cosine when only that unit is stored quantized and everything else stays float (the
   ``tensor_sensitivity`` question, which finds amplifying stems that single-layer cosines
   miss). Only the nodes downstream of the unit are recomputed; the rest reuse the float
   values.
2. **Move in order, bisect the count.** The first k units of the ranking give a float16 layer
   set; the whole hybrid graph (``quantize_graph`` with those dtypes, DataConvert nodes and
   all) is evaluated on the calibration samples, and the smallest k that meets the target is
   found by galloping (k = 1, 2, 4, ...) then bisection. Errors of different tensors partly
   cancel, so "prefix k passes" is not strictly monotone in k: bisection assumes it is, and
   every figure reported is a measured one.

The target holds when **every** checked sample's worst graph-output cosine reaches it (the
minimum over the samples; the mean is reported too): an average would let one badly served
input hide behind easy ones. A few samples that pass say little about the next input, so the
target must also hold for the *predicted* worst cosine of a new input (``predicted_worst``: a
one-sided 95 % prediction bound on the samples' errors 1 - cos, taken as log-normal;
QUANTIZATION.md 15), and the hybrid must not be worse than plain int8 on the samples (min and
mean). The minimum makes the checks cheap to fail: the samples are checked
worst-first (their all-int8 order) and a check stops at the first one below the target. The
ranking runs on the ``rank_samples`` samples int8 serves worst, the ones that decide.
Everything is deterministic: same graph, ranges and samples give the same choice (ties keep
graph and sample order).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from ..float_eval import evaluate, run_node
from ..ir import Graph
from . import convert_op
from .accuracy import cosine, float16_layers_for
from .affine import Range
from .calibrate import calibrate
from .config import QuantConfig, config_from_ranges
from .fake_quant import fake_quant_evaluate, storage_hook
from .preprocess import identity_preprocess
from .quantize import FLOAT16, INT8, QuantizationResult, quantize_graph

#: The target when none is given (``--auto-hybrid`` without a value): the vendor's yellow line
#: in its accuracy table (tools/accuracy.py WARN_COSINE). Chosen.
DEFAULT_TARGET = 0.99
#: Calibration samples the whole-model check runs on (the first ones); each check costs one
#: fake-quant evaluation per sample. Chosen to bound the search's time.
MAX_CHECK_SAMPLES = 8
#: Calibration samples the ranking runs on (the ones int8 serves worst): it evaluates the
#: downstream part of the graph once per unit per sample, the search's dominant cost. Chosen.
RANK_SAMPLES = 1
#: Student's t, one-sided 95 %, by degrees of freedom (1..10); beyond, the Cornish-Fisher
#: expansion z + (z^3 + z) / (4 df) with z = 1.645 (within 0.02 of the exact value at df = 10).
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)

Sample = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Unit:
    """One int8 activation tensor and what keeping it out of int8 takes."""

    tensor: str
    layers: tuple[str, ...]  # node names to set to float16: its producer and every reader
    cosine: float  # the outputs' cosine with only this unit quantized (mean over ranking samples)


@dataclass(frozen=True)
class Check:
    """One whole-model evaluation of a float16 layer set (figures over the samples checked: all
    of them when it passed, up to the first failing one otherwise)."""

    units: int  # the ranking prefix it moves
    layers: int
    minimum: float
    mean: float
    samples: int  # samples evaluated
    passed: bool
    predicted: float = float("nan")  # predicted worst cosine of a new input (all samples evaluated)


@dataclass
class AutoHybridResult:
    target: float
    moved: list[str]  # node names set to float16, in ranking order
    int8: Check
    hybrid: Check
    ranking: list[Unit]
    checks: list[Check]  # every whole-model evaluation, in the order made
    samples: int  # calibration samples checked
    rank_samples: int
    float_graph: Graph = field(repr=False, default=None)  # the float graph searched (for cycle reports)
    ranges: dict[str, Range] = field(repr=False, default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)  # layer -> why it cannot be float16

    @property
    def reached(self) -> bool:
        return self.hybrid.passed

    def layer_dtypes(self) -> dict[str, str]:
        return {name: FLOAT16 for name in self.moved}

    def summary_lines(self) -> list[str]:
        """What ``npuemu compile --auto-hybrid`` prints."""
        lines = [f"auto-hybrid: target cosine {self.target:g} on every one of {self.samples} calibration sample(s) "
                 f"and predicted for a new input (worst output, fake quant vs float); int8 {_figures(self.int8)}"]
        if not self.moved:
            lines.append("auto-hybrid: int8 meets the target; no layer moved to float16" if self.int8.passed else
                         "auto-hybrid: no layer set reached the target without being worse than int8 on the "
                         "calibration samples; no layer moved to float16")
            return lines
        verdict = "meets the target" if self.reached else "still below the target (every ranked tensor moved)"
        lines.append(f"auto-hybrid: {len(self.moved)} layer(s) moved to float16 (the {self.hybrid.units} most harmful "
                     f"of {len(self.ranking)} int8 tensors): hybrid {_figures(self.hybrid)}, {verdict}")
        lines.append("auto-hybrid: float16 layers: " + ", ".join(self.moved))
        lines.append(f"auto-hybrid: ranked on {self.rank_samples} sample(s), {len(self.checks)} whole-model check(s)")
        if self.blocked:
            first = next(iter(self.blocked.items()))
            lines.append(f"auto-hybrid: {len(self.blocked)} layer(s) kept int8, tensors around them not ranked: "
                         f"{first[0]} {first[1]}" + (", ..." if len(self.blocked) > 1 else ""))
        return lines


def _figures(check: Check) -> str:
    predicted = "" if np.isnan(check.predicted) else f", predicted worst of a new input {check.predicted:.5f}"
    return f"cosine min {check.minimum:.5f} / mean {check.mean:.5f}{predicted}"


def predicted_worst(scores: Sequence[float]) -> float:
    """The cosine a new input stays above with ~95 % confidence, from the samples' cosines: the
    errors 1 - cos taken as log-normal (per-input errors on a model spread over a factor, not a
    difference), the one-sided prediction bound exp(m + t s sqrt(1 + 1/n)) on the error, with m,
    s the mean and sample deviation of the log errors and t Student's for n - 1 degrees of
    freedom. One sample shows no spread: its own cosine. QUANTIZATION.md 15."""
    errors = np.maximum(1.0 - np.asarray(scores, np.float64), 1e-12)
    if errors.size < 2:
        return float(1.0 - errors.max())
    logs, freedom = np.log(errors), errors.size - 1
    t = _T95[freedom - 1] if freedom <= len(_T95) else 1.645 + (1.645 ** 3 + 1.645) / (4 * freedom)
    return float(1.0 - np.exp(logs.mean() + t * logs.std(ddof=1) * np.sqrt(1.0 + 1.0 / errors.size)))


def auto_hybrid(graph: Graph, samples: Sequence[Sample], ranges: Mapping[str, Range], *,
                target: float = DEFAULT_TARGET, per_channel: bool = True, weight_clipping: str = "minmax",
                rank_samples: int = RANK_SAMPLES, check_samples: int = MAX_CHECK_SAMPLES,
                platform: Any = None, predict: bool = True) -> AutoHybridResult:
    """Choose the float16 layers of ``graph`` (float, after the passes; left unchanged) for
    ``target`` (module docstring). ``ranges``: the int8 calibration of ``graph``; ``platform``
    (when given): layers that cannot be float16 on it are never moved (``float16_blocked``);
    ``predict=False``: no prediction bound, the samples' minimum decides (as before QUANTIZATION.md
    15; the never-worse-than-int8 rule still applies)."""
    if not 0.0 < target <= 1.0:
        raise CompileError(f"auto-hybrid target cosine {target}: expected a value in (0, 1], e.g. 0.99")
    samples = list(samples)[:check_samples]
    if not samples:
        raise CompileError("auto-hybrid needs at least one calibration sample")
    search = _Search(graph, samples, ranges, target, per_channel, weight_clipping, predict)
    int8 = search.int8_check()
    result = AutoHybridResult(target, [], int8, int8, [], search.checks, len(samples), 0, graph, dict(ranges))
    if int8.passed:
        return result
    worst = search.order[:max(1, rank_samples)]
    result.rank_samples = len(worst)
    result.blocked = float16_blocked(graph, platform) if platform is not None else {}
    result.ranking = rank_units(search.quantized(()), [samples[index] for index in worst], result.blocked)
    count = _bisect(search, result.ranking)
    result.moved = _prefix_layers(result.ranking, count)
    result.hybrid = search.check(count, result.moved)
    if not result.hybrid.passed:  # the whole ranking falls short: keep it only if it beats int8
        result.hybrid = search.complete(count, result.moved)
        if not search.not_worse(result.hybrid):
            result.moved, result.hybrid = [], int8
    return result


def quantize_auto_hybrid(graph: Graph, samples: Sequence[Sample], ranges: Mapping[str, Range], *,
                         target: float = DEFAULT_TARGET, per_channel: bool = True, weight_clipping: str = "minmax",
                         platform: Any = None) -> tuple[QuantizationResult, AutoHybridResult]:
    """Search (``auto_hybrid``), then quantize ``graph`` in place with the chosen dtypes."""
    float_graph = copy.deepcopy(graph)
    choice = auto_hybrid(float_graph, samples, ranges, target=target, per_channel=per_channel,
                         weight_clipping=weight_clipping, platform=platform)
    result = quantize_graph(graph, ranges, layer_dtypes=choice.layer_dtypes() or None, per_channel=per_channel,
                            weight_clipping=weight_clipping)
    return result, choice


def calibrate_auto_hybrid(graph: Graph, samples: Iterable[Sample], options: Any, target: float = DEFAULT_TARGET,
                          platform: Any = None) -> tuple[QuantizationResult, AutoHybridResult]:
    """The ``--quantize --auto-hybrid`` build: calibrate on all ``samples`` (a re-iterable:
    a list or ``CalibrationSamples``) with ``options`` (a ``CalibrationOptions``), search on the
    first ``MAX_CHECK_SAMPLES``, quantize ``graph`` in place. With nothing moved the graph is
    annotated exactly as the plain int8 build annotates it."""
    calibration = calibrate(graph, samples, options.algorithm, progress=options.progress)
    checked = list(itertools.islice(iter(samples), MAX_CHECK_SAMPLES))
    result, choice = quantize_auto_hybrid(graph, checked, calibration.ranges, target=target,
                                          per_channel=options.per_channel, weight_clipping=options.weight_clipping,
                                          platform=platform)
    result.algorithm, result.observed = calibration.algorithm, calibration.observed
    return result, choice


def proposed_config(graph: Graph, samples: Iterable[Sample], options: Any,
                    preprocess: Mapping[str, Any] | None = None, *, check_samples: int = MAX_CHECK_SAMPLES,
                    target: float = DEFAULT_TARGET, model: str = "", chip: str = "",
                    platform: Any = None) -> tuple[QuantConfig, AutoHybridResult]:
    """Hybrid step 1 with a proposal (the vendor's ``hybrid_quantization_step1(proposal=True)``):
    the quant config of ``graph`` (float) calibrated on ``samples`` with the auto-hybrid choice,
    checked on the first ``check_samples``, as its layer dtypes - a config to read and edit."""
    calibration = calibrate(graph, samples, options.algorithm, progress=options.progress)
    checked = list(itertools.islice(iter(samples), check_samples))
    choice = auto_hybrid(graph, checked, calibration.ranges, target=target, per_channel=options.per_channel,
                         weight_clipping=options.weight_clipping, check_samples=check_samples, platform=platform)
    config = config_from_ranges(graph, calibration.ranges, layer_dtypes=choice.layer_dtypes(),
                                preprocess=preprocess or identity_preprocess(graph), per_channel=options.per_channel,
                                weight_clipping=options.weight_clipping, algorithm=calibration.algorithm, model=model,
                                target=chip)
    return config, choice


class _Search:
    """Whole-model checks of float16 layer sets against the float outputs, memoized."""

    def __init__(self, graph: Graph, samples: list[Sample], ranges: Mapping[str, Range], target: float,
                 per_channel: bool, weight_clipping: str, predict: bool = True):
        self.graph, self.samples, self.ranges, self.target, self.predict = graph, samples, ranges, target, predict
        self.int8: Check | None = None
        self.options = {"per_channel": per_channel, "weight_clipping": weight_clipping}
        self.references = [evaluate(graph, sample) for sample in samples]
        self.order = list(range(len(samples)))  # worst-first once the int8 check ran
        self.checks: list[Check] = []
        self.memo: dict[frozenset, Check] = {}

    def quantized(self, layers: Sequence[str]) -> Graph:
        hybrid = copy.deepcopy(self.graph)
        quantize_graph(hybrid, self.ranges, layer_dtypes={name: FLOAT16 for name in layers} or None, **self.options)
        return hybrid

    def _scores(self, graph: Graph, stop_below: float | None) -> list[float]:
        scores = []
        for index in self.order:
            scores.append(_worst_output(graph, fake_quant_evaluate(graph, self.samples[index]),
                                        self.references[index]))
            if stop_below is not None and scores[-1] < stop_below:
                break
        return scores

    def _record(self, key: frozenset, units: int, scores: list[float]) -> Check:
        complete = len(scores) == len(self.samples)
        predicted = predicted_worst(scores) if complete else float("nan")
        check = Check(units, len(key), float(min(scores)), float(np.mean(scores)), len(scores), False, predicted)
        passed = complete and check.minimum >= self.target and (not self.predict or predicted >= self.target)
        self.memo[key] = replace(check, passed=passed and self.not_worse(check))
        self.checks.append(self.memo[key])
        return self.memo[key]

    def not_worse(self, check: Check) -> bool:
        """Not below plain int8 on the samples, in minimum or mean (True for int8 itself)."""
        return self.int8 is None or (check.minimum >= self.int8.minimum and check.mean >= self.int8.mean)

    def int8_check(self) -> Check:
        """All samples (no early stop), and they are ordered worst-first for the later checks."""
        scores = self._scores(self.quantized(()), None)
        self.order = sorted(self.order, key=lambda index: (scores[index], index))
        self.int8 = self._record(frozenset(), 0, scores)
        return self.int8

    def complete(self, units: int, layers: Sequence[str]) -> Check:
        """``check`` on every sample (a failing check stops early; a comparison needs them all)."""
        check = self.check(units, layers)
        if check.samples < len(self.samples):
            check = self._record(frozenset(layers), units, self._scores(self.quantized(layers), None))
        return check

    def check(self, units: int, layers: Sequence[str]) -> Check:
        key = frozenset(layers)
        if key not in self.memo:
            self._record(key, units, self._scores(self.quantized(layers), self.target))
        return self.memo[key]


def _worst_output(graph: Graph, values: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    return min(cosine(values[name], reference[name]) for name in graph.outputs)


def _prefix_layers(ranking: list[Unit], count: int) -> list[str]:
    return list(dict.fromkeys(name for unit in ranking[:count] for name in unit.layers))


def _bisect(search: _Search, ranking: list[Unit]) -> int:
    """The smallest ranking prefix whose hybrid graph meets the target, assuming that more
    units never hurt (module docstring); the whole ranking if even that falls short. Galloping
    (1, 2, 4, ... units) then bisection: the answer is usually a few units, and a check that
    fails is cheap (it stops at the first sample below the target)."""
    low, high = 0, 1  # prefix `low` fails (checked: int8)
    while high < len(ranking) and not search.check(high, _prefix_layers(ranking, high)).passed:
        low, high = high, 2 * high
    high = min(high, len(ranking))
    if not search.check(high, _prefix_layers(ranking, high)).passed:
        return high
    while high - low > 1:
        middle = (low + high) // 2
        if search.check(middle, _prefix_layers(ranking, middle)).passed:
            high = middle
        else:
            low = middle
    return high


# ---- ranking --------------------------------------------------------------------------------

def float16_blocked(graph: Graph, platform: Any) -> dict[str, str]:
    """Layers that cannot become float16 in this build, with the reason. The graph passes sized
    the CBUF channel tiling for int8 (one byte per element); a direct conv whose input and
    weights fit the CBUF only at that size would fail to lower in float16 (passes/cbuf_fit.py)."""
    from ..passes.cbuf_fit import cbuf_fit, conv_geometry

    blocked = {}
    for node in graph.nodes:
        if node.op_type == "Conv" and node.attrs.get("group", 1) == 1 and len(graph.tensors[node.inputs[0]].shape) == 4:
            fits, detail = cbuf_fit(platform, conv_geometry(graph, node), 2)
            if not fits:
                blocked[node.name] = f"does not fit the CBUF in float16 ({detail})"
    return blocked


def rank_units(graph: Graph, samples: Sequence[Sample], blocked: Mapping[str, str] | None = None) -> list[Unit]:
    """Every int8 activation tensor of the all-int8 ``graph`` as a unit, most harmful first
    (lowest outputs' cosine with only that unit quantized; ties in graph order). A unit that
    would take a ``blocked`` layer to float16 is left out (it cannot be kept out of int8)."""
    blocked = blocked or {}
    hook = storage_hook(graph)
    references = [evaluate(graph, sample, return_all=True) for sample in samples]
    producers = graph.producers()
    units = []
    for name in _int8_activations(graph):
        wanted = float16_layers_for(graph, [name])
        # a DataConvert (a float16 island's edge, quant/islands.py) is remade by every quantize_graph
        layers = tuple(node.name for node in graph.nodes if node.name in wanted and node.op_type != convert_op.OP_TYPE)
        if not layers or any(layer in blocked for layer in layers):
            continue
        quantized = {name, *_quantized_constants(graph, producers.get(name))}
        scores = [_worst_output(graph, _only(graph, reference, quantized, hook), reference)
                  for reference in references]
        units.append(Unit(name, layers, float(np.mean(scores))))
    order = sorted(range(len(units)), key=lambda index: (units[index].cosine, index))
    return [units[index] for index in order]


def _int8_activations(graph: Graph) -> list[str]:
    names = [name for name in graph.inputs if _is_int8(graph, name)]
    names += [name for node in graph.nodes for name in node.outputs if _is_int8(graph, name)]
    return list(dict.fromkeys(names))


def _is_int8(graph: Graph, name: str) -> bool:
    quant = graph.tensors[name].quant
    return quant is not None and quant.dtype == INT8


def _quantized_constants(graph: Graph, node: Any) -> list[str]:
    """The constants a node reads that int8 stores approximately (weights, bias, operands)."""
    if node is None:
        return []
    return [name for name in node.all_inputs if graph.tensors[name].is_const
            and graph.tensors[name].quant is not None and graph.tensors[name].quant.dtype != FLOAT16]


def _only(graph: Graph, reference: Mapping[str, np.ndarray], quantized: set[str], hook) -> dict[str, np.ndarray]:
    """The graph outputs when only the ``quantized`` tensors are stored as their ``quant`` says:
    the nodes no changed value reaches keep their float ``reference`` values."""
    changed: dict[str, np.ndarray] = {}
    for name in quantized:
        tensor = graph.tensors[name]
        if tensor.is_const:
            changed[name] = hook(tensor, tensor.data)
        elif name in reference and name in graph.inputs:
            changed[name] = hook(tensor, reference[name])

    def fetch(name: str) -> np.ndarray:
        if name in changed:
            return changed[name]
        return reference[name] if name in reference else graph.tensors[name].data

    for node in graph.nodes:
        touched = any(name in changed for name in node.all_inputs)
        if not touched and not quantized.intersection(node.outputs):
            continue
        results = run_node(node, fetch) if touched else [reference[name] for name in node.outputs]
        for name, value in zip(node.outputs, results):
            tensor = graph.tensors[name]
            value = np.asarray(value).astype(tensor.dtype, copy=False)
            changed[name] = hook(tensor, value) if name in quantized else value
    return {name: fetch(name) for name in graph.outputs}


__all__ = ["DEFAULT_TARGET", "AutoHybridResult", "Check", "Unit", "auto_hybrid", "calibrate_auto_hybrid",
           "predicted_worst", "proposed_config", "quantize_auto_hybrid", "rank_units"]
