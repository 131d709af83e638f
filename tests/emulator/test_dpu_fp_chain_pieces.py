"""The fp chain run piece by piece with the LUT inside (kernels/dpu_fp_chain.py ``_run_chain``,
NUMERICS.md 37) bit for bit: pieces of a few elements (so that every piece boundary - a run of
channels with the same X operands, a row or plane of the EW operand, the piece size - is crossed),
channel operands drawn from a small pool (runs of equal bits, -0.0 next to 0.0), every EW operand
broadcast, the LUT on or off; against the scalar models of NUMERICS.md 4.6 and 5.1 written in
tests/ (test_dpu_fp_chain.py, reference/lut_fp16.py) and against the per-stage kernels (every bit but a
NaN's sign and payload, see ``_same``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import LutConfig, XStageConfig, bn_stage_fp, bs_stage_fp, ew_stage_fp
from npuemu.emulator.kernels import lut_stage_fp as per_element_lut
from npuemu.emulator.kernels.dpu_fp_chain import FloatChain
from tests.emulator.reference.lut_fp16 import lut_float
from tests.emulator.test_dpu_fp_chain import ew_configs, ew_stage, values, x_configs, x_stage
from tests.emulator.test_kernels_lut import reference_config, tables

F = np.float32
POOL = np.array([0.0, -0.0, 1.5, -2.0, np.nan, np.inf], np.float32)
OPERANDS = ["scalar", "channel", "pixel", "row", "column", "plane", "channel_row", "channel_column"]


def operand_shape(kind: str, shape: tuple) -> tuple:
    c, h, w = shape
    return {"scalar": (1, 1, 1), "channel": (c, 1, 1), "pixel": shape, "row": (1, h, 1), "column": (1, 1, w),
            "plane": (1, h, w), "channel_row": (c, h, 1), "channel_column": (c, 1, w)}[kind]


def reference(data, stages, lut, ew) -> np.ndarray:
    """Element by element: the X stages, the LUT (reference/lut_fp16.py), EW (NUMERICS.md 4.6, 5.1)."""
    out = np.empty_like(data)
    for (c, y, x), value in np.ndenumerate(data):
        v = F(value)
        for config, alu_values, mul_values, mul_first in stages:
            v = x_stage(v, config, alu_values[c], mul_values[c], mul_first)
        if lut is not None:
            config, le, lo = lut
            with np.errstate(over="ignore", invalid="ignore"):
                v = F(lut_float(v, le.tolist(), lo.tolist(), reference_config(config)))
        if ew is not None:
            config, operand = ew
            v = ew_stage(v, config, operand[tuple(i if n > 1 else 0 for i, n in zip((c, y, x), operand.shape))])
        out[c, y, x] = v
    return out


def _same(got: np.ndarray, want: np.ndarray) -> None:
    # a NaN's sign and payload are compared as NaN only: where two NaNs meet (inf x -0.0 = x86's default
    # -NaN, then an EW operand +NaN) the result is whichever operand the compiled instruction takes first,
    # the per-stage numpy kernels one and the compiled chain (af44d64's too) the other; no document says
    # what the DPU does (NUMERICS.md 37)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@settings(max_examples=120, deadline=None)
@given(st.tuples(st.integers(1, 9), st.integers(1, 4), st.integers(1, 6)), st.integers(1, 64),
       st.one_of(st.none(), x_configs()), st.one_of(st.none(), x_configs()), st.one_of(st.none(), ew_configs()),
       st.sampled_from(OPERANDS), st.one_of(st.none(), st.tuples(tables(), tables())), st.integers(0, 2**31))
def test_pieces_match_the_models_and_the_stage_kernels(shape, chunk, bs, bn, ew, operand_kind, lut_tables, seed):
    rng = np.random.default_rng(seed)
    channels = shape[0]
    data = values(rng, shape, True)
    operand = values(rng, operand_shape(operand_kind, shape), True)
    chain, stages, staged = FloatChain(data), [], data
    for config, mul_first in ((bs, False), (bn, True)):
        if config is None:
            continue
        alu_values, mul_values = rng.choice(POOL, channels), rng.choice(POOL[:4], channels)  # (runs of channels)
        chain.x_stage(config, alu=alu_values, mul=mul_values, mul_first=mul_first)
        stages.append((config, alu_values, mul_values, mul_first))
        staged = (bn_stage_fp if mul_first else bs_stage_fp)(staged, config, alu=alu_values, mul=mul_values)
    lut = None
    if lut_tables is not None:
        le_table, lo_table = (rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16) for _ in range(2))
        lut = (LutConfig(le=lut_tables[0], lo=lut_tables[1]), le_table, lo_table)
        staged = per_element_lut(staged, *lut)
    if ew is not None:
        chain.ew(ew, operand)
        staged = ew_stage_fp(staged, ew, operand)
    got = chain.result(lut, chunk=chunk)
    assert got.dtype == np.float32 and got.shape == shape
    _same(got, staged)
    _same(got, reference(data, stages, lut, None if ew is None else (ew, operand)))


def test_channels_with_the_same_operand_bits_run_as_one_piece():
    # -0.0 and 0.0 are equal floats but different operands (x + -0.0 keeps -0.0, x + 0.0 does not):
    # channels 0-1 (0.0), 2 (-0.0), 3-4 (0.0) are three runs, and each channel keeps its own result
    data = np.full((5, 1, 3), -0.0, np.float32)
    chain = FloatChain(data)
    chain.x_stage(XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD), alu=np.array([0.0, 0.0, -0.0, 0.0, 0.0], F))
    runs = chain.settings()[-1][0]
    assert runs.tolist() == [0, 2, 3, 5]
    got = chain.result(chunk=4)
    assert np.signbit(got[:, 0, 0]).tolist() == [False, False, True, False, False]
