"""The fp16 CNA fetch widens each float16 value while it gathers the planes (issue 20: no float32
copy of the atoms first): bit for bit numpy's float16 -> float32 conversion, every one of the
65536 bit patterns (NaN payloads, subnormals, infinities, signed zeros) included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.mac import ConvGeometry, fetch_padded_input


def reference(atoms: np.ndarray, channels: int, geometry: ConvGeometry, pad_value: float) -> np.ndarray:
    """Planes [C][H][W] of the atoms, widened by numpy, placed at (pad_top, pad_left) in planes of
    the padded size filled with the pad value (cropped where the padded size ends first)."""
    groups, height, width, c2 = atoms.shape
    planes = atoms.transpose(0, 3, 1, 2).reshape(groups * c2, height, width)[:channels].astype(np.float32)
    out = np.full((channels, geometry.padded_h, geometry.padded_w), np.float32(pad_value), np.float32)
    rows = min(height, geometry.padded_h - geometry.pad_top)
    columns = min(width, geometry.padded_w - geometry.pad_left)
    out[:, geometry.pad_top:geometry.pad_top + rows, geometry.pad_left:geometry.pad_left + columns] = \
        planes[:, :rows, :columns]
    return out


def test_every_float16_bit_pattern_widens_as_numpy_does():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    atoms = bits.view(np.float16).reshape(4, 32, 64, 8)  # 4 surfaces of 32x64 pixels, C2 = 8
    geometry = ConvGeometry(3, 3, 32, 64, pad_top=1, pad_left=1)  # padded 34 x 66
    got = fetch_padded_input(atoms, 32, geometry, -1.5)
    assert np.array_equal(got.view(np.uint32), reference(atoms, 32, geometry, -1.5).view(np.uint32))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 9), st.integers(1, 9), st.integers(0, 2), st.integers(0, 2),
       st.integers(1, 3), st.integers(1, 3), st.integers(0, 2**31 - 1), st.floats(-4, 4, width=16))
def test_padded_fetch_of_float16_atoms(groups, height, width, pad_top, pad_left, kernel, stride, seed, pad):
    c2 = 8
    rng = np.random.default_rng(seed)
    atoms = rng.integers(0, 1 << 16, (groups, height, width, c2), dtype=np.uint32).astype(np.uint16).view(np.float16)
    channels = int(rng.integers(1, groups * c2 + 1))
    out_h = max(1, (height + 2 * pad_top - kernel) // stride + 1)
    out_w = max(1, (width + 2 * pad_left - kernel) // stride + 1)
    geometry = ConvGeometry(kernel, kernel, out_h, out_w, stride, stride, pad_top=pad_top, pad_left=pad_left)
    got = fetch_padded_input(atoms, channels, geometry, pad)
    assert np.array_equal(got.view(np.uint32), reference(atoms, channels, geometry, pad).view(np.uint32))


def test_int8_atoms_keep_their_path():
    atoms = np.arange(-64, 64, dtype=np.int8).reshape(1, 4, 2, 16)
    geometry = ConvGeometry(3, 3, 4, 2, pad_top=1, pad_left=1)
    assert np.array_equal(fetch_padded_input(atoms, 16, geometry, 3), reference(atoms, 16, geometry, 3))


def test_bad_channel_count_is_refused():
    with pytest.raises(Exception, match="cannot hold"):
        fetch_padded_input(np.zeros((1, 2, 2, 8), np.float16), 9, ConvGeometry(1, 1, 2, 2), 0.0)
