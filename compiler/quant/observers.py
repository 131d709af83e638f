"""Statistics of one tensor over the calibration samples: its range and its histogram.

Non-finite values (a float model can overflow on an odd sample) are left out of both and
counted, so one inf does not turn a scale into inf; calibration warns about them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: Histogram resolution for kl_divergence and mmse. With the narrowest window the searches
#: consider (255 bins, one per int8 step), the tightest range is 1/16 of the observed one.
HISTOGRAM_BINS = 4096


def _finite(values: np.ndarray) -> tuple[np.ndarray, int]:
    values = np.asarray(values, dtype=np.float32).reshape(-1)
    finite = np.isfinite(values)
    if finite.all():
        return values, 0
    return values[finite], int(values.size - finite.sum())


@dataclass
class RangeObserver:
    """Running min and max (the ``normal`` algorithm needs nothing else).

    ``lo_at`` / ``hi_at`` are the sample indices the extremes were first seen at: min and max
    keep the first of equal values, and 0.0 == -0.0, so merging the observers of samples
    evaluated in parallel (:meth:`merge`) needs them to keep the sign a sequential run keeps."""

    lo: float = math.inf
    hi: float = -math.inf
    count: int = 0
    non_finite: int = 0
    lo_at: int = 0
    hi_at: int = 0

    def update(self, values: np.ndarray, at: int = 0) -> None:
        """Take one sample's values (``at``: its index; samples come in increasing order)."""
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        if not values.size:
            return
        # finite extremes mean every value is finite (a NaN or an infinity would be one): two
        # passes over the values in the common case, the filtering path only otherwise
        lo, hi = float(values.min()), float(values.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):
            values, bad = _finite(values)
            self.non_finite += bad
            if not values.size:
                return
            lo, hi = float(values.min()), float(values.max())
        if lo < self.lo:
            self.lo, self.lo_at = lo, at
        if hi > self.hi:
            self.hi, self.hi_at = hi, at
        self.count += values.size

    def merge(self, other: "RangeObserver") -> None:
        """Take another observer's samples, as if they had come in index order with these."""
        if other.lo < self.lo or (other.lo == self.lo and other.lo_at < self.lo_at):
            self.lo, self.lo_at = other.lo, other.lo_at
        if other.hi > self.hi or (other.hi == self.hi and other.hi_at < self.hi_at):
            self.hi, self.hi_at = other.hi, other.hi_at
        self.count += other.count
        self.non_finite += other.non_finite

    @property
    def seen(self) -> bool:
        return self.count > 0


@dataclass
class Histogram:
    """Counts over equal bins of ``width`` with 0 on a bin edge: ``negative_bins`` bins cover
    [-negative_bins * width, 0) and ``positive_bins`` bins cover [0, positive_bins * width].
    Values outside land in the end bins (there are none when the range came from pass 1)."""

    width: float
    negative_bins: int
    positive_bins: int
    counts: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.counts is None:
            self.counts = np.zeros(self.negative_bins + self.positive_bins, dtype=np.float64)

    @classmethod
    def for_range(cls, lo: float, hi: float, bins: int = HISTOGRAM_BINS) -> "Histogram":
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        if hi - lo <= 0:
            return cls(1.0, 0, 1)
        width = (hi - lo) / bins
        # ceil with a little slack so floating-point noise does not add an empty bin
        negative = int(math.ceil(-lo / width - 1e-9)) if lo < 0 else 0
        positive = int(math.ceil(hi / width - 1e-9)) if hi > 0 else 0
        return cls(width, negative, max(positive, 1 if negative == 0 else positive))

    @property
    def size(self) -> int:
        return self.negative_bins + self.positive_bins

    def update(self, values: np.ndarray, at: int = 0) -> None:
        values, _ = _finite(values)
        if not values.size:
            return
        index = np.floor(values.astype(np.float64) / self.width).astype(np.int64) + self.negative_bins
        np.clip(index, 0, self.size - 1, out=index)
        self.counts += np.bincount(index, minlength=self.size)

    def merge(self, other: "Histogram") -> None:
        """Add another histogram of the same bins (whole counts: exact in any order)."""
        self.counts += other.counts

    def centers(self) -> np.ndarray:
        return (np.arange(self.size) - self.negative_bins + 0.5) * self.width

    def edge(self, index: int) -> float:
        """Real value of bin edge ``index`` (0 = the lowest edge)."""
        return (index - self.negative_bins) * self.width
