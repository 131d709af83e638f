"""A DPU task program's ERDMA operand reader with COMB_USE = 5 (issue 20, units/dpu_plan.py
``_ew_reader`` / ``_split_rows``: the residual add's operand whose even surfaces the MRDMA reads from
SRC_BASE_ADDR and odd ones the ERDMA from EW_BASE_ADDR, REGISTER_SEMANTICS 3.4), its rows located
once: each run's operand must be the bytes at the addresses worked out here by hand (surface 2k line
y at SRC + k * SURF_STRIDE + y * LINE_STRIDE, surface 2k + 1 line y at EW + k * EW_NOTCH_STRIDE +
y * EW_LINE_STRIDE) and equal to the full path's read (``units.dpu._ew_operand``), also after the
memory changes between runs; odd surface counts, int8 / int16 operands, notched strides."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.memory import Memory, TaskDma, gather_rows
from npuemu.emulator.units import dpu, dpu_plan
from npuemu.emulator.units.state import INT8, INT16
from tests.emulator.test_dpu_int_to_fp16_step import _EW_OFF, _OFF, _states

SRC, EW, MEMORY = 0x1000, 0x30000, 1 << 19
WHERE = "test task"


@st.composite
def split_cases(draw):
    precision = draw(st.sampled_from([INT8, INT16]))
    lanes = 16 // (2 if precision == INT16 else 1)
    channels, height, width = draw(st.integers(lanes + 1, 5 * lanes)), draw(st.integers(1, 4)), draw(st.integers(1, 9))
    notch = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    ew_line = (width + draw(st.integers(0, 2))) * 16
    ew_notch = ew_line * height + draw(st.integers(0, 3)) * 16
    return precision, lanes, channels, height, width, notch, ew_line, ew_notch, draw(st.integers(0, 2**32 - 1))


def _expected(memory_bytes, precision, lanes, channels, height, width, rdma):
    """[S][H*W][C2] from the byte addresses, one line at a time."""
    dtype = np.dtype(np.int16 if precision == INT16 else np.int8)
    surfaces, row = -(-channels // lanes), width * 16
    out = np.empty((surfaces, height, row), np.uint8)
    for s in range(surfaces):
        for y in range(height):
            if s % 2 == 0:
                start = rdma.src_address + (s // 2) * rdma.surface_stride + y * rdma.line_stride
            else:
                start = rdma.ew_address + (s // 2) * rdma.ew_notch_stride + y * rdma.ew_line_stride
            out[s, y] = memory_bytes[start:start + row]
    return out.view(dtype).reshape(surfaces, height * width, lanes)


@settings(max_examples=60, deadline=None)
@given(split_cases())
def test_the_split_operand_is_read_from_both_dmas(case):
    precision, lanes, channels, height, width, notch, ew_line, ew_notch, seed = case
    state, rdma = _states(channels, height, width, precision, _OFF, _OFF, _EW_OFF, None, notch=notch, size_e=1)
    ew = replace(_EW_OFF, bypass=False, op_bypass=False, op_from_dma=True)
    state = replace(state, flying=False, ew=ew)
    rdma = replace(rdma, flying=False, comb_use=dpu.COMB_SPLIT, erdma_enabled=True, erdma_mode=dpu.ERDMA_PER_PIXEL,
                   erdma_size=2 if precision == INT16 else 1, ew_address=EW, ew_line_stride=ew_line,
                   ew_notch_stride=ew_notch)
    rng = np.random.default_rng(seed)
    memory, raw = Memory(MEMORY), rng.integers(0, 256, MEMORY, dtype=np.uint8)
    memory.load(0, raw)
    operand = dpu._ew_operand(state, rdma, TaskDma(memory, WHERE), WHERE)
    read = dpu_plan._ew_reader(state, rdma, memory, WHERE, operand)
    assert read.__name__ == "read"  # (the located reader, not the full path's)
    data, offsets, row_bytes, shape, dtype = read.copied  # (a caller copying the rows itself: dpu_plan._ew_chained)
    for _ in range(2):  # (the second time after new bytes: the rows are copied per run, not kept)
        copied = np.empty((offsets.size, row_bytes), np.uint8)
        gather_rows(data, offsets, copied)
        assert np.array_equal(copied.view(dtype).reshape(shape), read())
        got = read()
        expected = _expected(raw, precision, lanes, channels, height, width, rdma)
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
        assert np.array_equal(got, dpu._ew_operand(state, rdma, TaskDma(memory, WHERE), WHERE))
        raw = rng.integers(0, 256, MEMORY, dtype=np.uint8)
        memory.load(0, raw)
