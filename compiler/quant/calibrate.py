"""Calibration: run the float graph over the samples and choose each activation's range.

Statistics are kept for every tensor the NPU materializes in memory: the graph inputs and the
outputs of nodes (after their fused parts); values inside a fused node are never stored, so
they get none. Only float tensors are quantized (index tensors stay integers).

``normal`` needs one pass (min/max). ``kl_divergence`` and ``mmse`` make a second pass that
fills a histogram per tensor over the range found in the first (clipping.py explains both).
With ``kl_divergence`` the graph outputs keep their min/max: what reads them is the user's
post-processing (a threshold on a probability map, an argmax), not a layer whose input
distribution KL is meant to preserve, and KL clips sparse outputs hard (PP-OCRv4 det's
sigmoid map [0, 1] became [0, 0.066], saturating every text pixel).
The samples are evaluated one at a time, so memory stays at one evaluation plus the
statistics (4096 float64 counts per tensor); with ``workers`` > 1 (the compile command's
default on a multi-core machine) as many forked processes share them out, with the same
ranges bit for bit (calibrate_workers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError, InputError

from ..depthwise_kernel import calibration_ops
from ..float_eval import evaluate
from ..gc_freeze import frozen_heap
from ..ir import Graph, Tensor
from .affine import Range
from .blas_threads import single_threaded_blas
from .calibrate_workers import picker, run_parallel, usable
from .clipping import ALGORITHMS, kl_range, mmse_range
from .heap_reuse import reused_heap
from .observers import Histogram, RangeObserver
from .progress import Progress

log = logging.getLogger(__name__)

Sample = Mapping[str, np.ndarray]


@dataclass
class CalibrationResult:
    """Per activation tensor: the clipping range to quantize with and the observed min/max."""

    ranges: dict[str, Range]
    observed: dict[str, Range]
    algorithm: str
    samples: int


def is_float_tensor(tensor: Tensor) -> bool:
    return np.dtype(tensor.dtype).kind == "f"


def activation_tensors(graph: Graph) -> list[str]:
    """Materialized float tensors: graph inputs, then node outputs in execution order."""
    names = [name for name in graph.inputs if is_float_tensor(graph.tensors[name])]
    for node in graph.nodes:
        names += [name for name in node.outputs if is_float_tensor(graph.tensors[name])]
    return list(dict.fromkeys(names))


def calibrate(graph: Graph, samples: Iterable[Sample], algorithm: str = "normal", *,
              progress: bool = True, workers: int = 1) -> CalibrationResult:
    """Ranges of every activation tensor of ``graph`` from ``samples`` (dicts by input name),
    evaluated in ``workers`` processes where that is possible (calibrate_workers.py)."""
    if algorithm not in ALGORITHMS:
        raise CompileError(f"unknown calibration algorithm '{algorithm}'; expected one of {', '.join(ALGORITHMS)}")
    if algorithm != "normal" and iter(samples) is samples:  # a generator cannot be read twice
        samples = list(samples)
    names = activation_tensors(graph)
    passes = 1 if algorithm == "normal" else 2
    total = _count(samples)
    observers = {name: RangeObserver() for name in names}
    ops = calibration_ops(graph, total * passes)  # compiled kernels where they repay loading them
    with frozen_heap():  # Numba's objects, loaded just now, too (gc_freeze.py)
        return _calibrate(graph, samples, algorithm, names, observers, passes, total, progress, workers, ops)


def _calibrate(graph: Graph, samples: Iterable[Sample], algorithm: str, names: list[str], observers: dict,
               passes: int, total: int, progress: bool, workers: int, ops: Mapping | None) -> CalibrationResult:
    count = _run(graph, samples, observers, f"calibrating ({algorithm}) 1/{passes}" if passes > 1 else "calibrating",
                 total, progress, workers, ops)
    if count == 0:
        raise InputError("calibration needs at least one sample; the dataset is empty")
    observed = {name: _observed(name, observer) for name, observer in observers.items()}
    if algorithm == "normal":
        ranges = dict(observed)
    else:
        histograms = {name: Histogram.for_range(r.lo, r.hi) for name, r in observed.items()}
        _run(graph, samples, histograms, f"calibrating ({algorithm}) 2/2", total, progress, workers, ops)
        choose = kl_range if algorithm == "kl_divergence" else mmse_range
        ranges = {name: choose(histogram).including_zero() for name, histogram in histograms.items()}
        if algorithm == "kl_divergence":  # graph outputs keep min/max (see the module docstring)
            ranges.update({name: observed[name] for name in graph.outputs if name in observed})
    log.info("calibrated %d tensors on %d samples with %s", len(ranges), count, algorithm)
    return CalibrationResult(ranges, observed, algorithm, count)


def _count(samples: Iterable[Sample]) -> int:
    try:
        return len(samples)  # type: ignore[arg-type]
    except TypeError:
        return 0


def _run(graph: Graph, samples: Iterable[Sample], observers: Mapping, label: str, total: int, progress: bool,
         workers: int = 1, ops: Mapping | None = None) -> int:
    """Evaluate every sample, feeding each watched tensor's value to its observer (with ``ops``
    in place of the registry's: ``depthwise_kernel.calibration_ops``)."""

    def evaluate_one(sample: Sample, index: int, observers: Mapping) -> None:
        def hook(tensor: Tensor, value: np.ndarray) -> np.ndarray:
            observer = observers.get(tensor.name)
            if observer is not None and not tensor.is_const:
                observer.update(value, index)
            return value

        evaluate(graph, sample, tensor_hook=hook, ops=ops)

    count = 0
    # one BLAS thread and large blocks kept for reuse (blas_threads.py, heap_reuse.py: why)
    with single_threaded_blas(), reused_heap(), Progress(total, label, enabled=progress) as bar:
        if usable(samples, total, workers):
            run_parallel(total, workers, picker(samples), observers, evaluate_one, bar.advance)
            return total
        for index, sample in enumerate(samples):
            evaluate_one(sample, index, observers)
            count += 1
            bar.advance()
    return count


def _observed(name: str, observer: RangeObserver) -> Range:
    if observer.non_finite:
        log.warning("tensor '%s': %d non-finite value(s) in calibration were ignored", name, observer.non_finite)
    if not observer.seen:
        log.warning("tensor '%s' had no finite value in calibration; it gets the range [0, 1]", name)
        return Range(0.0, 1.0)
    return Range(observer.lo, observer.hi).including_zero()
