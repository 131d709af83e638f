"""A flying fp16 task's EW from atoms to atoms (kernels/dpu_fp_atoms.py) against a numpy model of NUMERICS.md
4.6 / 7 (the EW operation in fp32, ReLU / ReLUX, the fp16 store with every NaN 0x7E00, lanes past the
channels 0), and units/dpu_plan_fp.py's check that no store row overwrites a source row read later."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.dpu_fp_atoms import PIECE, ew_atoms
from npuemu.emulator.units.dpu_plan_fp import _no_hazard

_SPECIAL = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01,
                     0x3C00, 0xBC00, 0x4000, 0x3555], np.uint16)
_ADD, _MUL, _MAX, _MINUS = 4, 5, 6, 7  # (the forms' indices in dpu_fp_fused.FORMS)


def _ew(value: np.float32, other: np.float32, form: int, relu: bool, relux: bool, limit: np.float32) -> np.float32:
    if form == _ADD:
        value = np.float32(value + other)
    elif form == _MUL:
        value = np.float32(value * other)
    elif form == _MAX:
        value = value if value >= other else other
    else:
        value = np.float32(value - other)
    if relu and value < 0:
        value = np.float32(0)
    if relux and value > limit:
        value = limit
    return value


def _model(main, sources, targets, written, height, width, channels, operand, form, relu, relux, limit):
    out = written.copy()
    with np.errstate(all="ignore"):
        for r in range(sources.size):
            surface = r // height
            for x in range(width):
                for lane in range(8):
                    channel, at = surface * 8 + lane, x * 8 + lane
                    if channel >= channels:
                        out[targets[r] + at] = 0
                        continue
                    value = np.uint16(main[sources[r] + at]).view(np.float16).astype(np.float32)
                    other = operand[0] if operand.size == 1 else operand[channel]
                    result = _ew(value, other, form, relu, relux, limit)
                    out[targets[r] + at] = 0x7E00 if np.isnan(result) else np.float16(result).view(np.uint16)
    return out


@st.composite
def cases(draw):
    surfaces, height, width = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 300))
    channels = draw(st.integers((surfaces - 1) * 8 + 1, surfaces * 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    line, rows = width * 8, surfaces * height
    pool = _SPECIAL if draw(st.booleans()) else rng.integers(0, 1 << 16, 64).astype(np.uint16)
    gap = draw(st.integers(0, 16))
    main = rng.choice(pool, rows * (line + gap) + 8).astype(np.uint16)
    sources = np.arange(rows, dtype=np.int64) * (line + gap) + draw(st.integers(0, 8))
    written = rng.integers(0, 1 << 16, rows * line + 4).astype(np.uint16)
    targets = np.arange(rows, dtype=np.int64) * line + draw(st.integers(0, 4))
    values = rng.choice(pool, channels).view(np.float16).astype(np.float32)
    operand = values[:1] if draw(st.booleans()) else values
    form = draw(st.sampled_from([_ADD, _MUL, _MAX, _MINUS]))
    limit = np.float32(draw(st.sampled_from([0.0, 6.0, -1.0, 65504.0])))
    return main, sources, targets, written, height, width, channels, operand, form, draw(st.booleans()), \
        draw(st.booleans()), limit


@settings(max_examples=150, deadline=None)
@given(cases())
def test_ew_atoms_match_the_model(case):
    main, sources, targets, written, height, width, channels, operand, form, relu, relux, limit = case
    expected = _model(main, sources, targets, written, height, width, channels, operand, form, relu, relux, limit)
    work = np.empty(2 * PIECE, np.float32)
    ew_atoms(main, sources, written, targets, height, width * 8, 8, channels, operand, form, (relu, relux, limit), work)
    np.testing.assert_array_equal(written, expected)


def test_in_place_rows_match_the_model():
    # (each row read and written where it lies: every piece read before it is written)
    rng = np.random.default_rng(5)
    main = rng.choice(_SPECIAL, 2 * 3 * 400 * 8).astype(np.uint16)
    rows = np.arange(6, dtype=np.int64) * 400 * 8
    operand = rng.normal(0, 2, 16).astype(np.float32)
    expected = _model(main, rows, rows, main, 3, 400, 13, operand, _MUL, True, False, np.float32(0))
    ew_atoms(main, rows, main, rows, 3, 400 * 8, 8, 13, operand, _MUL, (True, False, np.float32(0)),
             np.empty(2 * PIECE, np.float32))
    np.testing.assert_array_equal(main, expected)


def test_the_hazard_check():
    region = np.zeros(1000, np.uint16)
    rows = np.array([0, 100, 200], np.int64)
    assert _no_hazard(region, rows, np.zeros(10, np.uint16), rows, 100)  # another array
    assert _no_hazard(region, rows, region, rows, 100)  # in place
    assert _no_hazard(region, rows, region, rows + 300, 100)  # apart
    assert _no_hazard(region, rows + 100, region, rows, 100)  # row j over source row j - 1: read before
    assert not _no_hazard(region, rows, region, rows + 100, 100)  # row j over source row j + 1: read after
    assert not _no_hazard(region, rows, region, rows + 50, 100)  # row j partly over its own source row
    assert not _no_hazard(region, rows, region[10:], rows + 90, 100)  # a view 10 apart: the same as + 100
