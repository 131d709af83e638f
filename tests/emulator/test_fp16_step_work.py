"""The fp16 DPU step's shared working buffer and merged store rows (issue 20, session 18;
kernels/dpu_fp_chain.py ``fp16_step`` with ``IN_WORK`` arrays, units/dpu_plan_fp.py ``_store``).

A small task that stores its result within the step hands ``fp16_step`` empty arrays (``IN_WORK``)
and the thread's working buffer: the cube, the EW operand and the result then live in that buffer
(whatever an earlier task left there), and must give the bits of a task with arrays of its own.
A store whose surfaces' narrow rows follow each other in the region goes one row a surface: the
region must end up with the same bytes as row by row. References: ``FloatChain.result`` (the
separate per-stage kernels, tested against the numpy model of NUMERICS.md 4.6) and the atom rows
written out here with numpy's float16 rounding."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import dpu_fp_chain
from npuemu.emulator.kernels.dpu_convert import fp16_blocks_to_cube
from npuemu.emulator.kernels.dpu_fp_chain import IN_WORK, FloatChain
from npuemu.emulator.kernels.fp16 import widening_table
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms
from npuemu.emulator.units import dpu_plan_fp
from tests.emulator.test_dpu_fp_chain import ew_configs, values, x_configs
from tests.emulator.test_fp16_dpu_step import _read


def _atoms(out: np.ndarray, c2: int, offsets: np.ndarray, data: np.ndarray) -> None:
    """The atom rows of ``out`` rounded to fp16 by numpy (row r: surface r // H, line r % H, lanes past C
    zero), written in row order."""
    with np.errstate(over="ignore"):  # (values past fp16 round to infinities, as OUT_CVT)
        halves = out.astype(np.float16).view(np.uint16)
    channels, height, width = halves.shape
    for r, offset in enumerate(offsets):
        surface, y = divmod(r, height)
        row = np.zeros((width, c2), np.uint16)
        lanes = min(c2, channels - surface * c2)
        row[:, :lanes] = halves[surface * c2:surface * c2 + lanes, y].T
        data[offset:offset + width * c2] = row.reshape(-1)


def _finite(rng, shape):
    # (numpy's float16 cast rounds NaN payloads its own way: finite values and infinities here; NaN in
    # the one-call tests of test_fp16_dpu_step.py)
    data = values(rng, shape, True)
    data[np.isnan(data)] = np.float32(1.5)
    return data


def _task(rng, channels, height, width, flying, operand_kind, bs, bn, ew):
    """One task: (the step's arguments but the arrays, the expected result, the store's offsets and region)."""
    shape, lanes, table = (channels, height, width), 8, widening_table()
    surfaces = -(-channels // lanes)
    reads, regions = [None, None, None], [np.zeros(0, np.uint16)] * 3
    if flying:
        region, offsets, blocks = _read(rng, shape, lanes, False)
        reads[0], regions[0] = (offsets, height, lanes, 0, 1), region
        cube, expected_in = None, fp16_blocks_to_cube(blocks, shape)
    else:
        cube = _finite(rng, shape)
        expected_in = cube.copy()
    operand = _finite(rng, (1, 1, 1))
    if operand_kind != "scalar":
        operand_shape = (channels, 1, 1) if operand_kind == "channel" else shape
        region, offsets, blocks = _read(rng, operand_shape, lanes, False)
        reads[1], regions[1] = (offsets, operand_shape[1], lanes, 0, 1), region
        operand = fp16_blocks_to_cube(blocks, operand_shape)
    chains = FloatChain(np.zeros(shape, np.float32)), FloatChain(expected_in)
    for config, mul_first in ((bs, False), (bn, True)):
        if config is not None:
            alu, mul = _finite(rng, channels), _finite(rng, channels)
            for chain in chains:
                chain.x_stage(config, alu=alu, mul=mul, mul_first=mul_first)
    if ew is not None:
        for chain in chains:
            chain.ew(ew, operand)
    offsets = rng.permutation(surfaces * height).astype(np.int64) * (width * lanes)
    store = (offsets, lanes, channels, height, width)
    ints, floats = dpu_fp_chain.pack_step(chains[0].settings(), reads, store, shape + operand.shape)
    region = rng.integers(0, 1 << 16, surfaces * height * width * lanes, dtype=np.uint16)
    expected = region.copy()
    _atoms(chains[1].result(), lanes, offsets, expected)
    # (the arrays the step fills are handed empty: IN_WORK; a register operand as it is)
    steps = (IN_WORK if flying else cube, operand if operand_kind == "scalar" else IN_WORK, regions, ints, floats,
             table)
    return steps, expected, region


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 4), st.integers(1, 9), st.booleans(),
                          st.sampled_from(["scalar", "channel", "pixel"]), st.one_of(st.none(), x_configs()),
                          st.one_of(st.none(), x_configs()), st.one_of(st.none(), ew_configs())),
                min_size=1, max_size=4), st.integers(0, 2**31))
def test_tasks_in_one_working_buffer_equal_the_separate_kernels(tasks, seed):
    """Tasks run one after another in one working buffer that starts with garbage (NaN bits, other
    tasks' values): each stores the bits of the separate kernels."""
    rng = np.random.default_rng(seed)
    work = rng.integers(0, 1 << 32, dpu_fp_chain.WORK, dtype=np.uint32).view(np.float32)
    for channels, height, width, flying, operand_kind, bs, bn, ew in tasks:
        (cube, operand, regions, ints, floats, table), expected, region = _task(
            rng, channels, height, width, flying, operand_kind, bs, bn, ew)
        dpu_fp_chain.fp16_step(cube, operand, IN_WORK, *regions, region, ints, floats, table, *dpu_fp_chain.NO_LUT,
                               work)
        assert np.array_equal(region, expected)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.integers(1, 20), st.sampled_from([8, 16]),
       st.sampled_from(["dense", "gap", "shuffled", "overlap"]), st.integers(0, 2**31))
def test_store_blocks_equal_the_rows_written_one_by_one(channels, height, width, c2, layout, seed):
    """``_store``'s block (merged surfaces where dense) stores the bytes of the rows written in order:
    dense surfaces (each row where the last ends), a gap between two rows of a surface, surfaces
    shuffled in the region, and surfaces that overlap (a later one overwrites an earlier one's end)."""
    rng = np.random.default_rng(seed)
    surfaces, line = -(-channels // c2), width * c2
    order = rng.permutation(surfaces) if layout == "shuffled" else np.arange(surfaces)
    pitch = height * line - (line // 2 if layout == "overlap" else 0)
    offsets = (order[:, None] * pitch + np.arange(height)[None, :] * line).reshape(-1).astype(np.int64)
    if layout == "gap" and height > 1:
        row = int(rng.integers(1, height))
        offsets[row::height] += c2  # (every surface: line `row` onwards one atom later)
        offsets += np.repeat(order, height) * c2 * height
    offsets += int(rng.integers(0, 3))
    out = _finite(rng, (channels, height, width))
    region = rng.integers(0, 1 << 16, int(offsets.max()) + line + 8, dtype=np.uint16)
    expected = region.copy()
    _atoms(out, c2, offsets, expected)
    (rows, lanes, planes, block_height, block_width), data = dpu_plan_fp._store(channels, height, width, c2,
                                                                               offsets, region)
    dense = layout in ("dense", "shuffled", "overlap") and 1 < height and width < 16 and height * width <= 1024
    assert (block_height == 1 and rows.size == surfaces) == dense or height == 1
    stored = out[:planes].reshape(planes, block_height, block_width).view(np.uint32)
    planes_to_fp16_atoms(stored, lanes, rows, data)
    assert np.array_equal(region, expected)
