"""An fp16 DPU task's run in one compiled call (issue 20; kernels/dpu_fp_chain.py ``fp16_step``,
kernels/dpu_convert.py ``widen_rows``, units/dpu_plan_fp.py): the reads straight from the region, the chain and the fp16 store must give the bits the separate kernels gave - the rows
gathered, ``fp16_blocks_to_cube``, ``FloatChain.result``, OUT_CVT's ``out_cvt_fp16`` and the atom
rows filled (written out here) - for one-value, per-channel, per-pixel and split (even surfaces
from one region, odd from another) operands, every BS / BN / EW setting, NaN and infinities; and
steps that build their arrays every run (tasks above ``_KEPT_ELEMENTS``) equal the full unit path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import dpu_fp_chain
from npuemu.emulator.kernels.dpu import out_cvt_fp16
from npuemu.emulator.kernels.dpu_convert import fp16_blocks_to_cube, widen_rows
from npuemu.emulator.kernels.dpu_fp_chain import FloatChain
from npuemu.emulator.kernels.fp16 import widening_table
from npuemu.emulator.units import dpu_plan_fp
from tests.emulator.test_dpu_fp_chain import ew_configs, values, x_configs
from tests.emulator.test_task_plans_fp16 import _compare, _Counted, _mismatches

SPECIAL_HALVES = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0x0001, 0x03FF, 0x7BFF], np.uint16)


NO_READ = None  # (a read with no rows: skipped)


def _one_call(cube, reads, table, operand, settings, out, store) -> None:
    """``fp16_step`` on reads given as (region, row offsets, height, lanes, first surface, step) or
    NO_READ and the store as (C2, row offsets, region) of ``out``'s planes."""
    regions = [np.zeros(0, np.uint16) if read is None else read[0] for read in reads]
    blocks = [None if read is None else read[1:6] for read in reads]
    c2, offsets, region = store
    ints, floats = dpu_fp_chain.pack_step(settings, blocks, (offsets, c2, *out.shape))
    dpu_fp_chain.fp16_step(cube, operand, out, *regions, region, ints, floats, table, *dpu_fp_chain.NO_LUT,
                           np.empty(dpu_fp_chain.WORK, np.float32))


def _region(rng, rows: int, row_elements: int, special: bool) -> tuple[np.ndarray, np.ndarray]:
    """Random fp16 bits holding ``rows`` rows at shuffled, gapped offsets: (region as uint16, offsets)."""
    slot = row_elements + int(rng.integers(0, 3))
    offsets = rng.permutation(rows).astype(np.int64) * slot + int(rng.integers(0, 4))
    halves = rng.integers(0, 1 << 16, rows * slot + 8, dtype=np.uint16)
    halves[(halves >> 10 & 0x1F) == 0x1F] &= 0xBFFF  # mostly finite values ...
    if special:  # ... and some zeros, infinities, NaNs, subnormals, the largest
        where = rng.random(halves.size) < 0.1
        halves[where] = rng.choice(SPECIAL_HALVES, int(where.sum()))
    return halves, offsets


def _gathered(region, offsets, surfaces, height, width, lanes) -> np.ndarray:
    """The rows copied out (what ``gather_rows`` did): float16 [S][H*W][L]."""
    line = width * lanes
    rows = np.stack([region[o:o + line] for o in offsets]) if len(offsets) else np.zeros((0, line), np.uint16)
    return rows.view(np.float16).reshape(surfaces, height * width, lanes)


def _read(rng, shape, lanes, special, first=0, step=1, surfaces=None):
    """A region with the fp16 atoms of a [C][H][W] cube's surfaces first, first + step, ...: (the
    ``widen_rows`` read into a new cube, the blocks as float16 [S][H*W][L])."""
    channels, height, width = shape
    surfaces = -(-channels // lanes) if surfaces is None else surfaces
    region, offsets = _region(rng, surfaces * height, width * lanes, special)
    return region, offsets, _gathered(region, offsets, surfaces, height, width, lanes)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 20), st.integers(1, 4), st.integers(1, 7), st.sampled_from([8, 16]), st.booleans(),
       st.integers(0, 2**31))
def test_widen_rows_equals_the_rows_gathered_then_widened(channels, height, width, lanes, special, seed):
    rng = np.random.default_rng(seed)
    shape = (channels, height, width)
    region, offsets, blocks = _read(rng, shape, lanes, special)
    cube = np.full(shape, 7, np.float32)
    widen_rows(region, offsets, height, lanes, 0, 1, widening_table(), cube.reshape(channels, -1).view(np.uint32))
    expected = fp16_blocks_to_cube(blocks, shape)
    assert np.array_equal(cube.view(np.uint32), expected.view(np.uint32))
    # and numpy's own widening, NaN payloads included
    widened = blocks.astype(np.float32).transpose(0, 2, 1).reshape(-1, height, width)[:channels]
    assert np.array_equal(cube.view(np.uint32), widened.view(np.uint32))


#: the canonical NaN every DPU store writes (fp16 0x7E00; NUMERICS.md 37)
CANONICAL32 = 0x7FC00000


def _store_reference(out: np.ndarray, c2: int, offsets: np.ndarray, data: np.ndarray) -> None:
    """The atom rows of the fp16 cube (row r: surface r // H, line r % H; lanes past C are 0)."""
    halves = out_cvt_fp16(out).view(np.uint16)
    channels, height, width = halves.shape
    for r, offset in enumerate(offsets):
        surface, y = divmod(r, height)
        row = np.zeros((width, c2), np.uint16)
        lanes = min(c2, channels - surface * c2)
        row[:, :lanes] = halves[surface * c2:surface * c2 + lanes, y].T
        data[offset:offset + width * c2] = row.reshape(-1)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20), st.integers(1, 4), st.integers(1, 7), st.sampled_from([8, 16]),
       st.sampled_from(["core", "flying"]), st.sampled_from(["scalar", "channel", "pixel", "split"]),
       st.one_of(st.none(), x_configs()), st.one_of(st.none(), x_configs()), st.one_of(st.none(), ew_configs()),
       st.booleans(), st.integers(0, 2**31))
def test_one_call_equals_the_separate_kernels(channels, height, width, lanes, main_kind, operand_kind, bs, bn, ew,
                                              special, seed):
    rng = np.random.default_rng(seed)
    shape, no_read = (channels, height, width), NO_READ
    table = widening_table()
    surfaces = -(-channels // lanes)
    # the main cube: the CORE's float32 result, or an MRDMA read
    if main_kind == "core":
        cube, main_read = values(rng, shape, special), no_read
        expected_in = cube.copy()
    else:
        region, offsets, blocks = _read(rng, shape, lanes, special)
        cube = np.empty(shape, np.float32)
        main_read = (region, offsets, height, lanes, 0, 1)
        expected_in = fp16_blocks_to_cube(blocks, shape)
    # the EW operand: a register value, or ERDMA reads (a split operand: even / odd surfaces)
    reads = [no_read, no_read]
    if operand_kind == "scalar":
        operand = values(rng, (1, 1, 1), special)
        expected_operand = operand
    else:
        operand_shape = (channels, 1, 1) if operand_kind == "channel" else shape
        operand = np.empty(operand_shape, np.float32)
        if operand_kind == "split":
            even, odd = -(-surfaces // 2), surfaces // 2
            first, first_offsets, first_blocks = _read(rng, shape, lanes, special, surfaces=even)
            second, second_offsets, second_blocks = _read(rng, shape, lanes, special, surfaces=odd)
            reads = [(first, first_offsets, height, lanes, 0, 2), (second, second_offsets, height, lanes, 1, 2)]
            blocks = np.empty((surfaces, height * width, lanes), np.float16)
            blocks[0::2], blocks[1::2] = first_blocks, second_blocks
        else:
            region, offsets, blocks = _read(rng, operand_shape, lanes, special)
            reads[0] = (region, offsets, operand_shape[1], lanes, 0, 1)
        expected_operand = fp16_blocks_to_cube(blocks, operand_shape)
    # the chain, recorded twice: for the one call, and run the separate way on the separate reads
    chains = FloatChain(np.zeros(shape, np.float32)), FloatChain(expected_in)
    for config, mul_first in ((bs, False), (bn, True)):
        if config is not None:
            alu_values, mul_values = values(rng, channels, special), values(rng, channels, special)
            for chain in chains:
                chain.x_stage(config, alu=alu_values, mul=mul_values, mul_first=mul_first)
    if ew is not None:
        for chain in chains:
            chain.ew(ew, expected_operand)
    # the store: the WDMA's atom rows at shuffled offsets of a uint16 region
    out_rows = surfaces * height
    slot = width * lanes + lanes * int(rng.integers(0, 2))
    out_offsets = rng.permutation(out_rows).astype(np.int64) * slot
    region16 = rng.integers(0, 1 << 16, out_rows * slot + lanes, dtype=np.uint16)
    expected16 = region16.copy()
    out = np.empty(shape, np.float32)
    _one_call(cube, (main_read, reads[0], reads[1]), table, operand, chains[0].settings(), out,
              (lanes, out_offsets, region16))
    expected = chains[1].result()
    # (the chain's result leaves with its NaNs canonical, the one call's working planes at its store)
    bits = out.view(np.uint32).copy()
    bits[np.isnan(out)] = CANONICAL32
    assert np.array_equal(bits, expected.view(np.uint32))
    _store_reference(expected, lanes, out_offsets, expected16)
    assert np.array_equal(region16, expected16)


def test_no_stage_copies_the_cube_and_a_store_without_rows_writes_nothing():
    rng = np.random.default_rng(1)
    cube = values(rng, (3, 2, 5), True)
    out, region = np.full((3, 2, 5), 9, np.float32), np.arange(64, dtype=np.uint16)
    _one_call(cube, (NO_READ,) * 3, widening_table(), np.zeros((1, 1, 1), np.float32), FloatChain(cube).settings(),
              out, (8, np.zeros(0, np.int64), region))
    assert np.array_equal(out.view(np.uint32), cube.view(np.uint32))
    assert np.array_equal(region, np.arange(64, dtype=np.uint16))


@pytest.mark.parametrize("name", ["flying", "conv_bias_lut", "gate"])
def test_steps_allocating_their_arrays_each_run_equal_the_full_path(monkeypatch, tmp_path, name):
    """A task above ``_KEPT_ELEMENTS`` builds its arrays every run (every task here, with the limit 0;
    and ``WORK_ARRAY`` 0, so that no task places them in the thread's working buffer)."""
    monkeypatch.setattr(dpu_plan_fp, "_KEPT_ELEMENTS", 0)
    monkeypatch.setattr(dpu_plan_fp, "WORK_ARRAY", 0)
    counted = _Counted(monkeypatch)
    outputs, _ = _compare(tmp_path, name)
    assert _mismatches(outputs) == 0 and counted.runs > 0
