"""Choosing the clipping range of a tensor: ``normal`` (min/max), ``kl_divergence``, ``mmse``.

``normal`` keeps the observed [min, max] (with 0 added). The other two search a window of the
tensor's histogram (observers.Histogram: 4096 bins, 0 on a bin edge). A window keeps ``a``
bins below zero and ``b`` above, i.e. the range [-a w, b w]; values outside are clipped.

**kl_divergence** (the TensorRT / MXNet entropy calibration, adapted to asymmetric int8):
for a window, P is the window's histogram with the clipped mass added to its two end bins;
Q merges the *unclipped* window bins into 255 equal groups (one per int8 step; bin j goes to
group floor(255 j / W)) and spreads each group's mass uniformly over the group's bins where P
is non-zero. The cost is KL(P || Q) on the normalized distributions (Q floored at 1e-12
where P is non-zero, so clipping a lone outlier bin is penalized but finite). The symmetric
original searches one threshold; with a zero point, the two ends move independently, so we
search both by coordinate descent: start from the full range, then alternately pick the best
upper end for the current lower end and the best lower end for the current upper end, over a
geometric grid of 48 candidates per side (down to 1/16 of that side, and 0), until neither
changes (at most 4 rounds). Windows narrower than 255 bins are not considered (Q would be as
fine as P and KL blind to rounding).

**mmse** minimizes the expected squared error of quantize-dequantize, computed on the
histogram's bin centers weighted by their counts, with the exact parameters the window would
get (``affine_params``: scale, rounded zero point, saturation). Same coordinate descent over
the grid, then a local refinement down to single bins. The full range is the starting point
and a window is only taken when it lowers the error, so mmse's histogram error is never above
normal's. For weights (``mmse_weight_ranges``) the error is exact: per output channel, both
ends are scaled by one factor t in [0.5, 1] (a 33-point grid) and the t with the smallest
squared error of the channel's own values is kept (the SDK guide's mmse "clips the weights
to a range", 10.3).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .affine import INT8, Range, affine_params, affine_params_array, fake_quantize
from .observers import Histogram

ALGORITHMS = ("normal", "kl_divergence", "mmse")
LEVELS = INT8[1] - INT8[0]  # 255 steps between the 256 int8 values
GRID_POINTS = 48
GRID_SMALLEST = 1.0 / 16
MAX_ROUNDS = 4
WEIGHT_SHRINK = np.linspace(1.0, 0.5, 33)

Cost = Callable[[int, int], float]


def side_grid(bins: int) -> list[int]:
    """Candidate bin counts for one side: geometric from ``bins`` down to bins/16, and 0."""
    if bins <= 0:
        return [0]
    fractions = np.geomspace(1.0, GRID_SMALLEST, GRID_POINTS)
    candidates = {int(round(bins * fraction)) for fraction in fractions} | {0, bins}
    return sorted(candidates, reverse=True)


def coordinate_descent(cost: Cost, negative: list[int], positive: list[int], start: tuple[int, int]) -> tuple[int, int]:
    """Minimize ``cost(a, b)`` over the grids, one coordinate at a time, from ``start``."""
    a, b = start
    best = cost(a, b)
    for _ in range(MAX_ROUNDS):
        moved = False
        for side in ("positive", "negative"):
            grid = positive if side == "positive" else negative
            values = [cost(a, c) if side == "positive" else cost(c, b) for c in grid]
            index = int(np.argmin(values))
            if values[index] < best:
                best, moved = values[index], True
                a, b = (a, grid[index]) if side == "positive" else (grid[index], b)
        if not moved:
            break
    return a, b


def refine(cost: Cost, limits: tuple[int, int], start: tuple[int, int], step: int) -> tuple[int, int]:
    """Local search with a step halving down to one bin."""
    a, b = start
    best = cost(a, b)
    while step >= 1:
        moved = True
        while moved:
            moved = False
            for da, db in ((step, 0), (-step, 0), (0, step), (0, -step)):
                na, nb = a + da, b + db
                if 0 <= na <= limits[0] and 0 <= nb <= limits[1]:
                    value = cost(na, nb)
                    if value < best:
                        a, b, best, moved = na, nb, value, True
        step //= 2
    return a, b


# ---- KL divergence ---------------------------------------------------------------------------

def kl_cost(histogram: Histogram) -> Cost:
    counts = histogram.counts
    zero = histogram.negative_bins

    def cost(a: int, b: int) -> float:
        start, stop = zero - a, zero + b
        width = stop - start
        if width < LEVELS:
            return np.inf
        sliced = counts[start:stop]
        p = sliced.copy()
        p[0] += counts[:start].sum()
        p[-1] += counts[stop:].sum()
        group = (np.arange(width) * LEVELS) // width
        nonzero = p > 0
        group_mass = np.bincount(group, weights=sliced, minlength=LEVELS)
        group_bins = np.bincount(group, weights=nonzero, minlength=LEVELS)
        q = np.where(nonzero, group_mass[group] / np.maximum(group_bins[group], 1), 0.0)
        p_total, q_total = p.sum(), q.sum()
        if p_total <= 0 or q_total <= 0:
            return np.inf
        p, q = p[nonzero] / p_total, np.maximum(q[nonzero] / q_total, 1e-12)
        return float(np.sum(p * np.log(p / q)))

    return cost


def kl_range(histogram: Histogram) -> Range:
    if histogram.counts.sum() == 0 or histogram.size < LEVELS:
        return Range(histogram.edge(0), histogram.edge(histogram.size))
    limits = (histogram.negative_bins, histogram.positive_bins)
    a, b = coordinate_descent(kl_cost(histogram), side_grid(limits[0]), side_grid(limits[1]), limits)
    return Range(-a * histogram.width, b * histogram.width)


# ---- MMSE ------------------------------------------------------------------------------------

def mse_cost(histogram: Histogram) -> Cost:
    counts = histogram.counts
    used = counts > 0
    centers, weights = histogram.centers()[used], counts[used]
    total = max(weights.sum(), 1.0)

    def cost(a: int, b: int) -> float:
        if a + b < LEVELS:
            return np.inf
        scale, zero_point = affine_params(-a * histogram.width, b * histogram.width)
        error = centers - fake_quantize(centers, scale, zero_point)
        return float(np.dot(weights, error * error) / total)

    return cost


def mmse_range(histogram: Histogram) -> Range:
    if histogram.counts.sum() == 0 or histogram.size < LEVELS:
        return Range(histogram.edge(0), histogram.edge(histogram.size))
    limits = (histogram.negative_bins, histogram.positive_bins)
    cost = mse_cost(histogram)
    a, b = coordinate_descent(cost, side_grid(limits[0]), side_grid(limits[1]), limits)
    a, b = refine(cost, limits, (a, b), step=max(1, max(limits) // GRID_POINTS))
    return Range(-a * histogram.width, b * histogram.width)


def histogram_mse(histogram: Histogram, chosen: Range) -> float:
    """Expected squared error of quantizing the histogram's values with ``chosen`` (tests, reports)."""
    used = histogram.counts > 0
    centers, weights = histogram.centers()[used], histogram.counts[used]
    scale, zero_point = affine_params(chosen.lo, chosen.hi)
    error = centers - fake_quantize(centers, scale, zero_point)
    return float(np.dot(weights, error * error) / max(weights.sum(), 1.0))


# ---- weights ---------------------------------------------------------------------------------

def weight_ranges(weights: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (along ``axis``) or whole-tensor (``axis`` None) min and max, as arrays."""
    values = _channels_first(weights, axis)
    return values.min(axis=1), values.max(axis=1)


def mmse_weight_ranges(weights: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Per channel, [t lo, t hi] with the t of WEIGHT_SHRINK that minimizes the channel's
    squared quantization error (t = 1 is min/max and wins ties)."""
    values = _channels_first(weights, axis)
    lo, hi = values.min(axis=1), values.max(axis=1)
    best_error = np.full(lo.shape, np.inf)
    best_t = np.ones(lo.shape)
    for t in WEIGHT_SHRINK:
        scale, zero_point = affine_params_array(t * lo, t * hi)
        error = values - fake_quantize(values, scale, zero_point, axis=0, half_even=False)
        total = np.einsum("ck,ck->c", error, error)
        better = total < best_error * (1 - 1e-12)
        best_error = np.where(better, total, best_error)
        best_t = np.where(better, t, best_t)
    return best_t * lo, best_t * hi


def _channels_first(weights: np.ndarray, axis: int | None) -> np.ndarray:
    values = np.asarray(weights, dtype=np.float64)
    if axis is None:
        return values.reshape(1, -1)
    return np.moveaxis(values, axis, 0).reshape(values.shape[axis], -1)
