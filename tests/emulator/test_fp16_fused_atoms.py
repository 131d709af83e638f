"""The fp16 output kernels of issue 20's fp16 speed work, bit for bit against references written in
tests (NUMERICS.md 5.1, 7 and 4.6, NUMERICS.md 30):

- ``fp16_atoms.planes_to_fp16_atoms`` (OUT_CVT's fp16 rounding fused into the NC1HWC2 atom stores)
  against numpy: fp32 -> fp16 through float64 (``test_fp16_fast.reference_to_half``) and the atoms
  laid out by index arithmetic;
- the vectorised fp LUT (``lut_fp.lut_float``, its tables on the kernel's stack) on arrays long enough
  for the vector loop and every remainder, in place too, against ``reference/lut_fp16.py``;
- the fp chain's passes between a result and a scratch plane (``dpu_fp_chain``) on planes long enough
  for the vector loops, against ``test_dpu_fp_chain``'s scalar model.

Each check is also run on a deliberately broken kernel, which it must catch."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import LutConfig, LutTableConfig
from npuemu.emulator.kernels.dpu_fp_chain import FloatChain
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms
from npuemu.emulator.kernels.lut_fp import lut_float, prepared
from tests.emulator.reference.lut_fp16 import lut_float as reference_lut
from tests.emulator.test_dpu_fp_chain import ew_configs, reference, values, x_configs
from tests.emulator.test_fp16_fast import reference_to_half
from tests.emulator.test_kernels_lut import reference_config, tables

#: fp32 bit patterns of every fp16 rounding case: zeros, subnormal results and their ties, the
#: largest finite value and the overflow edge (65520), infinities, NaNs with payloads
SPECIAL_BITS = np.array([0x00000000, 0x80000000, 0x33000000, 0x33000001, 0x33800000, 0x38800000, 0x387FE000,
                         0x387FF000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x7F800000, 0xFF800000, 0x7FC00000,
                         0x7F800001, 0xFFFFFFFF, 0x3F801000, 0x3F803000, 0x00000001], np.uint32)


#: the fp16 NaN every DPU store writes
CANONICAL16 = 0x7E00


def expected_atoms(planes_bits: np.ndarray, c2: int, offsets: np.ndarray, size: int) -> np.ndarray:
    """The region after storing: row r = surface r // H, line r % H; element x * C2 + lane of a row is
    channel s * C2 + lane of pixel x rounded to fp16 (a NaN: 0x7E00), 0 past the channels; rows stored
    in order."""
    channels, height, width = planes_bits.shape
    halves = reference_to_half(planes_bits.reshape(-1)).reshape(planes_bits.shape)
    # every NaN the canonical fp16 NaN (the DPU's stores in default-NaN mode, NUMERICS.md 37)
    halves[np.isnan(planes_bits.view(np.float32))] = CANONICAL16
    data = np.full(size, 0xABCD, np.uint16)
    for r, offset in enumerate(offsets):
        s, y = divmod(r, height)
        atoms = np.zeros((width, c2), np.uint16)
        lanes = min(c2, channels - s * c2)
        atoms[:, :lanes] = halves[s * c2:s * c2 + lanes, y].T
        data[offset:offset + width * c2] = atoms.reshape(-1)
    return data


def truncating_store(planes, c2, offsets, data):
    """Broken on purpose: fp16 by dropping the low mantissa bits (no rounding)."""
    planes_to_fp16_atoms(planes & np.uint32(0xFFFFE000), c2, offsets, data)


def mismatches(kernel, planes_bits: np.ndarray, c2: int, offsets: np.ndarray, size: int) -> int:
    data = np.full(size, 0xABCD, np.uint16)
    kernel(planes_bits, c2, offsets, data)
    return int(np.count_nonzero(data != expected_atoms(planes_bits, c2, offsets, size)))


def planes_case(rng, channels: int, height: int, width: int, c2: int, overlap: bool):
    """Random fp32 planes (normal values, bit patterns, the rounding cases) and row offsets of a
    shuffled (or, with ``overlap``, partly overlapping) row order in a region with gaps."""
    bits = rng.integers(0, 2**32, (channels, height, width), dtype=np.uint64).astype(np.uint32)
    normal = (rng.standard_normal((channels, height, width)) * 4).astype(np.float32).view(np.uint32)
    bits = np.where(rng.random(bits.shape) < 0.6, normal, bits)
    bits.reshape(-1)[:SPECIAL_BITS.size] = SPECIAL_BITS[:bits.size]
    rows = -(-channels // c2) * height
    line = width * c2
    slots = rng.permutation(rows + 2)[:rows]
    offsets = (slots * (line + 3)).astype(np.int64)
    if overlap and rows > 1:
        offsets[-1] = offsets[0] + line // 2  # the later row wins where they overlap
    return bits, offsets, int((rows + 3) * (line + 3))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 5), st.integers(1, 70), st.sampled_from([8, 16]), st.booleans(),
       st.integers(0, 2**32 - 1))
def test_planes_to_fp16_atoms_matches_the_rounding_and_layout(channels, height, width, c2, overlap, seed):
    rng = np.random.default_rng(seed)
    bits, offsets, size = planes_case(rng, channels, height, width, c2, overlap)
    assert mismatches(planes_to_fp16_atoms, bits, c2, offsets, size) == 0


def test_a_store_that_does_not_round_is_caught():
    bits, offsets, size = planes_case(np.random.default_rng(3), 12, 3, 40, 8, False)
    assert mismatches(truncating_store, bits, 8, offsets, size) > 0


def _lut_case(seed: int):
    rng = np.random.default_rng(seed)
    le_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    lo_table = rng.integers(-(2**15), 2**15, nm.LUT_ENTRIES).astype(np.int16)
    return rng, le_table, lo_table


def lut_mismatches(kernel, le, lo, priorities, seed: int, length: int, in_place: bool) -> int:
    rng, le_table, lo_table = _lut_case(seed)
    config = LutConfig(le=le, lo=lo, hybrid_priority=priorities[0], uflow_priority=priorities[1],
                       oflow_priority=priorities[2])
    low, high = min(le.start, lo.start) - 2**12, max(le.end, lo.end) + 2**12
    data = rng.uniform(low, high, length).astype(np.float32)
    data[rng.random(length) < 0.05] = np.nan
    data[:4] = np.float32([le.start, le.end, lo.start, lo.end])[:length]
    packed, params = prepared(config, le_table, lo_table)
    out = data.copy() if in_place else np.empty_like(data)
    kernel(out if in_place else data, packed, params, out)
    cfg = reference_config(config)
    with np.errstate(over="ignore", invalid="ignore"):
        want = np.array([reference_lut(v, le_table.tolist(), lo_table.tolist(), cfg) for v in data], np.float32)
    nan = np.isnan(want)
    return int(np.count_nonzero(out[~nan].view(np.uint32) != want[~nan].view(np.uint32))
               + np.count_nonzero(~np.isnan(out[nan])))


def lut_of_whole_inputs(data, packed, params, out):
    """Broken on purpose: the inputs' fractions dropped before the LUT (a wrong interpolation)."""
    lut_float(np.floor(data).astype(np.float32), packed, params, out)


@settings(max_examples=40, deadline=None)
@given(tables(), tables(), st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 1)),
       st.integers(0, 2**32 - 1), st.integers(1, 700), st.booleans())
def test_vector_lut_matches_the_model_at_every_length(le, lo, priorities, seed, length, in_place):
    assert lut_mismatches(lut_float, le, lo, priorities, seed, length, in_place) == 0


def test_a_lut_of_whole_inputs_is_caught():
    le, lo = LutTableConfig(start=-16384, end=0, index_select=5), LutTableConfig(start=0, end=16384, index_select=5)
    assert lut_mismatches(lut_of_whole_inputs, le, lo, (1, 0, 1), 5, 300, False) > 0


@settings(max_examples=40, deadline=None)
@given(st.tuples(st.integers(1, 3), st.integers(1, 12), st.integers(8, 40)), st.one_of(st.none(), x_configs()),
       st.one_of(st.none(), x_configs()), st.one_of(st.none(), ew_configs()),
       st.sampled_from(["scalar", "channel", "pixel", "row"]), st.integers(0, 2**31))
def test_chain_on_long_planes_matches_the_model(shape, bs, bn, ew, operand_kind, seed):
    """Planes of 8..480 elements: the chain's vectorised loops (scratch / result ping-pong, the EW
    operand read once for one value) run their vector bodies, not only their remainders."""
    rng = np.random.default_rng(seed)
    channels = shape[0]
    data = values(rng, shape, True)
    operand = values(rng, {"scalar": (1, 1, 1), "channel": (channels, 1, 1), "pixel": shape,
                           "row": (1, shape[1], 1)}[operand_kind], True)
    chain, stages = FloatChain(data), []
    for config, mul_first in ((bs, False), (bn, True)):
        if config is not None:
            alu_values, mul_values = values(rng, channels, True), values(rng, channels, True)
            chain.x_stage(config, alu=alu_values, mul=mul_values, mul_first=mul_first)
            stages.append((config, alu_values, mul_values, mul_first))
    if ew is not None:
        chain.ew(ew, operand)
    got = chain.result()
    expected = reference(data, stages, None if ew is None else (ew, operand))
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))
