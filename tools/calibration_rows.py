"""The real-board per-layer measurements of ../shared/docs/calibration.md, as data.

Copied from calibration.md Table A (RK3588, guide §3.2.3) and Table B (RK3562 class, guide
§8.2.1 figure 8-3 and §8.2.2 figure 8-4); tests/emulator/test_timing_calibration.py checks this
copy against the markdown table cell by cell. Shapes are (C, H, W); ``ddr``/``npu``/``max`` are
the profiler's NPU-clock cycles and ``time_us`` the measured per-layer time (per-layer
profiling on). Kernel size, stride and padding are the ones calibration.md infers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CalibrationRow:
    chip: str
    table: str
    id: int
    op: str                      # the profile's OpType (fused name)
    inputs: tuple[tuple[int, int, int], ...]  # (C, H, W) per feature input
    weight: tuple[int, int, int, int] | None  # (O, I, KH, KW)
    out: tuple[int, int, int]
    stride: int | None
    ddr: int
    npu: int
    max: int
    time_us: float
    uint8_input: bool = False    # the profile's "(uint8 input)": a packed first-layer image

    @property
    def name(self) -> str:
        return f"{self.chip} {self.table}{self.id} {self.op}"

    @property
    def is_conv(self) -> bool:
        return self.weight is not None


def _conv(chip, table, id_, op, cin_hw, weight, out, stride, ddr, npu, max_, time, uint8=False):
    return CalibrationRow(chip, table, id_, op, (cin_hw,), weight, out, stride, ddr, npu, max_, time, uint8)


def _ew(chip, table, id_, op, inputs, out, ddr, npu, max_, time):
    return CalibrationRow(chip, table, id_, op, tuple(inputs), None, out, None, ddr, npu, max_, time)


_A = "rk3588", "A"
_B = "rk3562", "B"

ROWS: tuple[CalibrationRow, ...] = (
    _conv(*_A, 2, "ConvRelu", (3, 224, 224), (32, 3, 3, 3), (32, 112, 112), 2, 94150, 112896, 112896, 428, True),
    _conv(*_A, 3, "ConvRelu", (32, 112, 112), (32, 32, 1, 1), (32, 112, 112), 1, 139965, 50176, 135965, 351),
    _conv(*_A, 4, "ConvRelu", (32, 112, 112), (32, 32, 3, 3), (32, 112, 112), 1, 135965, 112896, 135965, 333),
    _conv(*_A, 5, "Conv", (32, 112, 112), (16, 32, 1, 1), (16, 112, 112), 1, 101942, 50176, 101942, 219),
    _conv(*_B, 1, "ConvExSwish", (3, 480, 640), (32, 3, 3, 3), (32, 240, 320), 2, 794117, 1382400, 1382400, 2805,
          True),
    _conv(*_B, 2, "ConvExSwish", (32, 240, 320), (64, 32, 3, 3), (64, 120, 160), 2, 665207, 691200, 691200, 1605),
    _conv(*_B, 3, "ConvExSwish", (64, 120, 160), (32, 64, 1, 1), (32, 120, 160), 1, 332036, 153600, 332036, 832),
    _conv(*_B, 4, "ConvExSwish", (64, 120, 160), (32, 64, 1, 1), (32, 120, 160), 1, 332036, 153600, 332036, 788),
    _conv(*_B, 5, "ConvExSwish", (32, 120, 160), (32, 32, 1, 1), (32, 120, 160), 1, 248988, 153600, 248988, 722),
    _conv(*_B, 6, "ConvExSwish", (32, 120, 160), (32, 32, 3, 3), (32, 120, 160), 1, 250087, 345600, 345600, 768),
    _ew(*_B, 7, "Add", [(32, 120, 160)] * 2, (32, 120, 160), 329574, 0, 329574, 298),
    _ew(*_B, 8, "Concat", [(32, 120, 160)] * 2, (64, 120, 160), 494407, 0, 494407, 453),
    _conv(*_B, 9, "ConvExSwish", (64, 120, 160), (64, 64, 1, 1), (64, 120, 160), 1, 497258, 307200, 497258, 1427),
    _conv(*_B, 10, "ConvExSwish", (64, 120, 160), (128, 64, 3, 3), (128, 60, 80), 2, 401854, 691200, 691200, 962),
    _conv(*_B, 11, "ConvExSwish", (128, 60, 80), (64, 128, 1, 1), (64, 60, 80), 1, 167682, 76800, 167682, 405),
    _ew(*_B, 117, "Sigmoid", [(83, 60, 80)], (83, 60, 80), 186625, 0, 186625, 541),
    _conv(*_B, 118, "ConvRelu", (128, 60, 80), (128, 128, 3, 3), (128, 60, 80), 1, 327096, 1382400, 1382400, 1595),
    _conv(*_B, 120, "Conv", (128, 60, 80), (4, 128, 1, 1), (4, 60, 80), 1, 103405, 19200, 103405, 150),
    _conv(*_B, 121, "Conv", (128, 60, 80), (1, 128, 1, 1), (1, 60, 80), 1, 103345, 19200, 103345, 150),
    _ew(*_B, 122, "Sigmoid", [(1, 60, 80)], (1, 60, 80), 32181, 0, 32181, 142),
    _ew(*_B, 144, "Mul", [(83, 60, 80), (1, 60, 80)], (83, 60, 80), 319655, 0, 319655, 414),
)

# CPU-side rows of Table B (calibration.md, below the table), microseconds on the board's CPU.
CPU_ROWS: tuple[tuple[str, str, float], ...] = (
    ("ReduceMax", "(1,83,60,80)->(1,1,60,80)", 7441.0),
    ("ArgMax", "", 7389.0),
    ("Reshape", "", 69.0),
    ("OutputOperator", "", 13.0),
)


def rows_for(chip: str | None = None) -> tuple[CalibrationRow, ...]:
    return tuple(row for row in ROWS if chip is None or row.chip == chip)
