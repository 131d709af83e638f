"""Reading a graph output back from NPU memory (issue 20: ``Runtime.output``, ``npuemu run``).

- :func:`channels_of`: an NC1HWC2 image [C1, surface, C2] (a view of memory) -> its C channels as
  a fresh [C, pixels] array: only the groups holding channels are read, and only their real lanes
  of the last one (the reference, isa/tensor_layout.from_native on a copy of the whole tensor,
  copies every group and lane three times: ~7 ms for PP-OCR det's 1 x 640 x 640 map held in two
  16-lane groups, ~0.3 ms here).
- :func:`widen`: float16 -> float32 as numpy's ``astype(np.float32)`` gives it (exact; F16C's
  widening where the target has it, kernels/fp16.py), ~0.1 ns an element instead of numpy's ~7; a
  signalling NaN (whose quiet bit numpy's own conversion may or may not set, depending on how it
  was built) makes it hand the array to numpy.
- :func:`dequantize`: int8 -> ``float32(float64(q - zero point) * scale)``, the float64 operations
  of the reference (runtime.py ``output``) in one compiled pass instead of three numpy ones.
"""

from __future__ import annotations

import numpy as np

from npuemu.emulator.kernels.output_values import dequantize_values, widen_bits

#: arrays of fewer elements widen with numpy (the same bits; a compiled call costs more there)
SMALL = 64


def channels_of(image: np.ndarray, channels: int, pixels: int) -> np.ndarray:
    """The first ``channels`` channels of NC1HWC2 ``image`` [C1, surface, C2] over its first ``pixels``
    pixels, as a new C-contiguous [channels, pixels] array of the image's type."""
    c2 = image.shape[2]
    out = np.empty((channels, pixels), image.dtype)
    full = channels // c2
    if full:
        np.copyto(out[:full * c2].reshape(full, c2, pixels), image[:full, :pixels].transpose(0, 2, 1))
    rest = channels - full * c2
    if rest:
        np.copyto(out[full * c2:], image[full, :pixels, :rest].T)
    return out


def widen(values: np.ndarray) -> np.ndarray:
    """float16 ``values`` -> float32, the bits of numpy's ``astype(np.float32)``."""
    if values.size < SMALL:
        return values.astype(np.float32)
    out = np.empty(values.shape, np.float32)
    source = np.ascontiguousarray(values)
    if not widen_bits(source.reshape(-1).view(np.uint16), out.reshape(-1)):
        return values.astype(np.float32)
    return out


def dequantize(stored: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """int8 ``stored`` -> float32 ``scale * (stored - zero_point)`` computed in float64 (runtime.py's
    module docstring), rounded once to float32."""
    out = np.empty(stored.shape, np.float32)
    dequantize_values(np.ascontiguousarray(stored).reshape(-1), float(scale), float(zero_point), out.reshape(-1))
    return out
