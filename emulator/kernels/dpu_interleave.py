"""The DPU WDMA's interleaved (strided) write: each pixel of the written cube lands ``NOTCH_ADDR_0 + 1``
atoms after the previous one and each line ``SURFACE_ADD`` atoms after the previous one, so that
several tasks (one per output phase) fill one tensor between them - the way the vendor writes the
four 2 x 2 phase convs of Resize bilinear x2 straight into the 80 x 80 output
(emulator/REGISTER_SEMANTICS.md 3.3.1, compiler/LOWERING.md 19).

What the registers say [V] (rknn-fixtures-ops resize_bilinear_2x_int8 / _fp16, tasks 5-8, per
phase a 40 x 40 cube of 32 channels; a plain conv's values in brackets):
- WDMA_SIZE_1 WIDTH_WDMA 0, HEIGHT_WDMA 39; WDMA_SIZE_0 CHANNEL_WDMA 2559 (int8, CHANNEL 64) /
  1279 (fp16, CHANNEL 32) = cube width x CHANNEL - 1 [plain: the cube's W - 1 / H - 1 / C - 1];
- DATA_CUBE_NOTCH_ADDR NOTCH_ADDR_0 = NOTCH_ADDR_1 = 1 [0, or unused];
- SURFACE_ADD 160 atoms = two 80-atom output rows [plain: the SIZE_E group step];
- DST_SURF_STRIDE 6400 atoms = one whole 80 x 80 output surface, SIZE_E 3 (4 surfaces a group,
  more than the 2 (int8) / 4 (fp16) surfaces written) [plain: the same meaning];
- DST_BASE_ADDR 0 / 1280 / 16 / 1296 bytes = phase row x one output row + phase column x one atom.

How it is read here [I]: WIDTH_WDMA 0 on a cube W > 1 wide with HEIGHT_WDMA x CHANNEL_WDMA the
cube's atoms is the mode's switch (a plain write's WDMA sizes equal the cube's, and _check_dpu
refuses any other disagreement). Two splits of that count are taken: the vendor's W lines of H x C
channels (its rk3588 / rk3576 bilinear Resize on 12 x 20: HEIGHT_WDMA 19, CHANNEL_WDMA 767 [V],
REGISTER_SEMANTICS.md 52; npuemu's own builds since compiler/LOWERING.md 54) and H lines of W x C
(3.3.1's first reading, npuemu's builds before: older model files keep running); the 40 x 40 fixture
cannot tell them apart. Neither split places anything: the DATA_CUBE's W and H,
NOTCH_ADDR_0 and SURFACE_ADD do, the same way for both (the vendor's HEIGHT_WDMA lines at SURFACE_ADD
steps would run past its own 24-row output). Atom of pixel x, line y, surface s goes to
``DST_BASE_ADDR + s * DST_SURF_STRIDE + y * SURFACE_ADD + x * (NOTCH_ADDR_0 + 1) * atom``.
SURFACE_ADD then is no group step: a write of more surfaces than one SIZE_E group is refused.
NOTCH_ADDR_1 (equal to NOTCH_ADDR_0 in both builds) has no modelled effect.
"""

from __future__ import annotations

import numpy as np

from npuemu.emulator.units.state import DpuState
from npuemu.isa.errors import EmulationError


def is_interleaved(state: DpuState) -> bool:
    """Whether the WDMA writes pixels ``pixel_step`` bytes and lines ``surface_add`` bytes apart."""
    return state.pixel_step != 0


def pixel_step(cube: tuple[int, int, int], wdma: tuple[int, int, int], notch: int, atom_bytes: int) -> int:
    """``DpuState.pixel_step``: (NOTCH_ADDR_0 + 1) atoms if ``wdma`` (WDMA_SIZE_1/0 as (width, height,
    channels), each field + 1) gives the interleaved form of the DATA_CUBE ``cube`` (width, height,
    channels): a width-1 line of W x CHANNEL channels (or the vendor's H x CHANNEL), W > 1; else 0."""
    width, height, channels = cube
    if width > 1 and wdma == (1, height, width * channels):  # H lines of W x C (3.3.1; npuemu's older builds)
        return (notch + 1) * atom_bytes
    # the vendor's sizes, W lines of H x C [V] (REGISTER_SEMANTICS.md 52): the same atoms, placed by the
    # DATA_CUBE and the steps alike; H 1 without a notch stays dpu_transpose.relines' plain write
    if width > 1 and wdma == (1, width, height * channels) and (height > 1 or notch):
        return (notch + 1) * atom_bytes
    return 0


def check_interleave(state: DpuState, c2: int, where: str) -> int:
    """The surfaces written; refuses a write that would need SURFACE_ADD as the group step too."""
    surfaces = -(-min(state.channels, state.orig_channels) // c2)
    if surfaces > state.size_e + 1:
        raise EmulationError(
            f"{where}: interleaved DPU write (WDMA_SIZE gives one {state.width * state.channels}-channel pixel a "
            f"line) of {surfaces} surfaces with SIZE_E={state.size_e}: SURFACE_ADD is the line step in this "
            f"mode, so more than one SIZE_E group of surfaces is not modelled")
    return surfaces


def wdma_pixels(state: DpuState, c2: int, where: str = "DPU") -> tuple[int, np.ndarray, int]:
    """(surfaces written, the address of every atom [S][H*W] surface-major, the atom's bytes)."""
    surfaces = check_interleave(state, c2, where)
    s = np.arange(surfaces, dtype=np.int64)[:, None, None] * state.dst_surface_stride
    y = np.arange(state.height, dtype=np.int64)[None, :, None] * state.surface_add
    x = np.arange(state.width, dtype=np.int64)[None, None, :] * state.pixel_step
    starts = (state.dst_address + s + y + x).reshape(-1)
    return surfaces, starts, state.atom_bytes


def as_pixel_rows(state: DpuState, planes: np.ndarray) -> np.ndarray:
    """The output [C][H][W] as the WDMA's rows: one atom a row ([C][H*W][1]) when interleaved."""
    if not is_interleaved(state):
        return planes
    return planes.reshape(planes.shape[0], -1, 1)
