"""Feature-map layout in NPU memory, stated once: the compiler places tensors by it
(``compiler/lower/placement.py``) and the emulator's runtime stores and reads them by it
(``emulator/runtime.py``), from the geometry the model file records for each tensor
(``native_shape`` and ``surface_stride``, isa/CONTAINER.md 3.3).

- **NC1HWC2**: C1 = ceil(C / C2) channel groups ("surfaces"), each an H x W grid of pixel
  atoms of C2 channels; padding channels are zero (hardware.md 2; rknpu-isa.md 4). An atom is
  16 bytes on RK3588-class chips, so C2 = 16 / element size (int8 16, fp16 8, int32 4); 8 bytes
  on RK3566/68 (C2 int8 8, fp16 4). The per-chip C2 figures live in ``platforms/*.yaml``.
- **Native shape** ``(1, C1, H, W, C2)`` (hardware.md 2: RK3568 int8 (1,13,4,4) ->
  (1,2,4,4,8)); a packed first-layer image has C2 = C (hardware.md 2: (1,3,224,224) ->
  (1,1,224,224,3)).
- **Surface stride**: surfaces sit ``align(H*W, 4)`` pixels apart (64-byte multiples), a 1x1
  surface 1 atom (vendor-corpus tasks.csv: DPU DST_SURF_STRIDE on all 628 rk3588 conv tasks,
  75x75 -> 5628, 7x7 -> 52, 1x1 -> 1); with 8-byte atoms a 1x1 surface is 2 atoms, so
  surfaces stay on the 16-byte address boundary [C]. A record without a surface stride is
  compact (H*W).
- **Addresses** are 32-bit and the DMA address registers hold bits 31:4, so tensors start on
  16-byte boundaries (rknpu-isa.md 4).
"""

from __future__ import annotations

import numpy as np

ATOM_BYTES = 16  # RK3588-class NC1HWC2 atom (rknpu-isa.md 4); RK356x: 8 (its platform's C2)
ADDRESS_ALIGN = 16  # DST/DCOMP/PPU/PC addresses are bits 31:4 (rknpu-isa.md 4)
ADDRESS_SPACE = 1 << 32  # every DMA address register is 32-bit (rknpu-isa.md 4)


def _align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def surface_atoms(height: int, width: int, pixel_bytes: int = ATOM_BYTES) -> int:
    """Pixels from one C1 surface to the next (module docstring)."""
    pixels = height * width
    return max(1, ADDRESS_ALIGN // pixel_bytes) if pixels == 1 else _align(pixels, 4)


def native_shape(c1: int, height: int, width: int, c2: int) -> tuple[int, int, int, int, int]:
    return (1, c1, height, width, c2)


def to_native(values: np.ndarray, c1: int, c2: int, surface: int) -> np.ndarray:
    """[C][H][W] -> the tensor's memory image [C1][surface][C2] (same dtype), padding 0."""
    channels, height, width = values.shape
    pixels = height * width
    padded = np.zeros((c1 * c2, pixels), values.dtype)
    padded[:channels] = values.reshape(channels, pixels)
    image = np.zeros((c1, surface, c2), values.dtype)
    image[:, :pixels, :] = padded.reshape(c1, c2, pixels).transpose(0, 2, 1)
    return image


def from_native(image: np.ndarray, channels: int, height: int, width: int, c1: int, c2: int,
                surface: int) -> np.ndarray:
    """The memory image (flat, C1 * surface * C2 elements) -> [C][H][W] (a view)."""
    pixels = height * width
    grouped = image.reshape(c1, surface, c2)[:, :pixels, :].transpose(0, 2, 1)
    return grouped.reshape(c1 * c2, height, width)[:channels]
