"""``fp16_atoms_ir.planes_to_atoms`` (session 21: the fp16 DPU store's rows transposed in registers, used by
``fp16_atoms._store_rows`` / ``_store_runs``) against a model written here: numpy's float32 -> float16 cast
(round to nearest even, overflow to infinity) with every NaN the canonical 0x7E00, lane l of pixel i at
element 8 i + l. Cases: 0 .. 41 pixels (blocks of 8 and the tail), planes further apart than their width,
NaNs of either sign with payloads, ties at half an fp16 step, the overflow edge, subnormals, -0; the
bytes around the atoms untouched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from npuemu.emulator.kernels.fp16_atoms_ir import halves_native, planes_to_atoms

#: float32 bit patterns at the rounding's edges (NaNs, infinities, the largest fp16 and the overflow tie,
#: ties to even and just past them, the smallest subnormal's half, -0)
SPECIAL = np.array([0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0x7F800000, 0xFF800000, 0x477FE000, 0x477FF000, 0x477FEFFF,
                    0x3F801000, 0x3F803000, 0x3F801001, 0x33000000, 0x33000001, 0x80000000, 0x387FC000, 0x00000001],
                   np.uint32)


@njit
def _store(planes, first, count, data, at):
    planes_to_atoms(planes[:, first:].ctypes.data, planes.strides[0], data[at:].ctypes.data, count)


def _model(lanes: np.ndarray) -> np.ndarray:
    """uint32 [8][count] fp32 bits -> uint16 [count * 8] atoms."""
    values = lanes.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        halves = values.astype(np.float16).view(np.uint16).copy()
    halves[np.isnan(values)] = 0x7E00
    return halves.T.reshape(-1)


@pytest.mark.skipif(not halves_native(), reason="planes_to_atoms needs F16C")
@settings(max_examples=150, deadline=None)
@given(st.integers(0, 41), st.integers(0, 6), st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_planes_to_atoms_round_like_the_model(count, pad, first, seed):
    rng = np.random.default_rng(seed)
    planes = rng.integers(0, 1 << 32, (8, first + count + pad), dtype=np.uint64).astype(np.uint32)
    if planes.size:
        picks = rng.integers(0, planes.size, 12)
        planes.reshape(-1)[picks] = rng.choice(SPECIAL, picks.size)
    near = rng.integers(-2**17, 2**17, planes.shape).astype(np.float32)  # (values in fp16's range too)
    planes = np.where(rng.random(planes.shape) < 0.5, near.view(np.uint32), planes)
    data = rng.integers(0, 1 << 16, count * 8 + 9, dtype=np.uint32).astype(np.uint16)
    want = data.copy()
    want[3:3 + count * 8] = _model(planes[:, first:first + count])
    _store(planes, first, count, data, 3)
    assert np.array_equal(data, want)
