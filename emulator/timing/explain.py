"""What perf's figures rest on, for its table header and JSON (issue 24 items 3 and 5).

``ddr_model_info``: which DDR model a report uses, what it is fitted to (the platform YAML's
``ddr.source`` / ``vendor_estimate.source``) and how to get the other. Users compare perf's
default (board-fitted) DDR cycles with the vendor's build log, whose static estimate assumes a
DDR about 4x faster (rk3588: 23.654 B/cycle against the fitted 5.887 read / 5.928 write).

``time_band``: the error of the time model on the board rows of calibration.md, per chip. These
are the residuals of ``npuemu calibrate -t CHIP`` (emulator/TIMING.md, Calibration; 2026-11-24,
the YAML figures as fitted), relative errors (model - board) / board of each fit row's profiled
time; tests/emulator/test_timing_calibration.py recomputes them and fails if they drift. They
are single-layer rows with per-layer profiling: no whole model was timed on a board, so the band
is the least uncertainty of a whole-model figure, not a bound on it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimeBand:
    rows: tuple[str, ...]  # the calibration.md fit rows the residuals come from
    low: float  # most negative relative time error (model below the board)
    high: float  # most positive
    median_abs: float  # median |error| over those rows

    def board_range(self) -> tuple[float, float]:
        """Where the board's time lies relative to a model figure T: T / (1 + high) .. T / (1 + low)."""
        return 1.0 / (1.0 + self.high) - 1.0, 1.0 / (1.0 + self.low) - 1.0


# Residuals of `npuemu calibrate -t rk3588` / `-t rk3562` (fit rows only; TIMING.md Calibration).
# rk3588: A2 -26.2%, A3 -16.4%, A4 +7.8%, A5 +18.5%. rk3562: the 13 fit rows lie in -4.8..+10.8%
# (B3 -4.8, B7 +10.8); the rows npuemu builds otherwise (B8 Concat +9.6, B117/B122 Sigmoid with
# the vendor's separate LUT task -65/-77, B144 -17.7) are not fit rows and not in the band.
TIME_BANDS = {
    "rk3588": TimeBand(("A2", "A3", "A4", "A5"), -0.262, 0.185, 0.174),
    "rk3562": TimeBand(("B1", "B2", "B3", "B4", "B5", "B6", "B7", "B9", "B10", "B11", "B118", "B120", "B121"),
                       -0.048, 0.108, 0.020),
}


def time_band(platform, ddr_model: str) -> dict:
    """The error band of the report's time figures (JSON ``time_band``)."""
    if ddr_model == "vendor":
        return {"calibrated": False, "text": "the vendor's static estimate, not a board prediction: no error band"}
    band = TIME_BANDS.get(platform.name)
    if band is None:
        return {"calibrated": False, "rows": [],
                "text": f"{platform.name} has no board rows in calibration.md; its DDR and launch figures are "
                        f"borrowed ({platform.ddr.source}): no error band can be stated - expect at least rk3588's "
                        f"(board {_pct_range(TIME_BANDS['rk3588'].board_range())} of the model's figure)"}
    lo, hi = band.board_range()
    return {"calibrated": True, "rows": list(band.rows), "model_error_low": band.low, "model_error_high": band.high,
            "median_abs_error": band.median_abs, "board_low": lo, "board_high": hi,
            "text": f"time model error on {len(band.rows)} board row(s) of calibration.md "
                    f"({band.rows[0]}-{band.rows[-1]}): {100 * band.low:+.1f}% .. {100 * band.high:+.1f}%, median "
                    f"|error| {100 * band.median_abs:.1f}%; the board's time is likely {_pct_range((lo, hi))} of "
                    "these figures (single-layer rows; whole models were not timed on a board)"}


def _pct_range(bounds: tuple[float, float]) -> str:
    return f"{100 * bounds[0]:+.0f}%..{100 * bounds[1]:+.0f}%"


def ddr_model_info(platform, ddr_model: str) -> dict:
    """Which DDR model the report uses, what it rests on and how to get the other (JSON ``ddr_model_info``)."""
    ddr, vendor = platform.ddr, platform.vendor_estimate
    board = f"read {ddr.read_bytes_per_cycle:g} / write {ddr.write_bytes_per_cycle:g} B/cycle"
    if ddr_model == "vendor":
        return {"name": "vendor", "rate": f"{vendor.ddr_bytes_per_cycle:g} B/cycle",
                "source": vendor.source or "",
                "text": f"DDR model: vendor - librknnc's static estimate ({vendor.ddr_bytes_per_cycle:g} B/cycle, "
                        "as the vendor's build log prints; no launch overhead); not a board prediction. "
                        f"Default --ddr-model board: fitted to board profiles ({board})"}
    ratio = ""
    if vendor.ddr_bytes_per_cycle:
        slow = vendor.ddr_bytes_per_cycle / min(ddr.read_bytes_per_cycle, ddr.write_bytes_per_cycle)
        fast = vendor.ddr_bytes_per_cycle / max(ddr.read_bytes_per_cycle, ddr.write_bytes_per_cycle)
        span = f"{fast:.1f}" if f"{fast:.1f}" == f"{slow:.1f}" else f"{fast:.1f}-{slow:.1f}"
        # per byte; whole models differ further as the two count bytes differently (TIMING.md)
        ratio = (f"; per byte its DDR cycles are {span}x those of the vendor's static estimate "
                 f"({vendor.ddr_bytes_per_cycle:g} B/cycle)")
    other = " --ddr-model vendor gives the vendor's build-log figures" if vendor.ddr_bytes_per_cycle else ""
    return {"name": "board", "rate": board, "source": ddr.source or "",
            "text": f"DDR model: board (default) - {board}, {ddr.source or 'no source given'}{ratio};{other}"}
