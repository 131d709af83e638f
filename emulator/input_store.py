"""Storing a graph input into NPU memory in one pass (issue 20: ``Runtime.set_input``).

The runtime's reference path (runtime.py ``_store_input`` -> ``write_native``) quantizes the whole
array in float64 (``clip(rint(x / scale) + zero_point, -128, 127)``, five temporaries), converts
it to int8, lays it out in NC1HWC2 through two zero-filled copies (isa/tensor_layout.to_native)
and copies that into memory: ~4 ms for PP-OCR det's 3x640x640 input. Here the same values go
straight from the caller's array into the tensor's bytes in memory:

- :func:`quantize_into`: float32/float64 values -> int8 atoms: per element the same float64
  operations as the reference (x / scale - a true division -, round half to even, + zero point,
  clamp), the value into its atom slot; padding lanes and surface padding written 0, as the
  reference's zero-filled image has them. A NaN (whose int8 conversion numpy leaves to the
  platform) makes it return False and the caller takes the reference path, which rewrites every
  byte.
- :func:`halve_into`: float32/float64 values -> float16 atoms, numpy's ``astype(np.float16)``
  rounding (to nearest even, once: a float64 goes through float32 rounded to odd, which keeps the
  one rounding exact; overflow to infinity, subnormals, -0.0); a NaN (whose payload numpy's own
  conversion decides) makes it return False: the caller converts with numpy then.
- :func:`copy_into`: values already in the stored type (int8 stored values, float16 values) ->
  atoms with one numpy ``copyto`` (a single channel group) or one transposed copy of the values padded
  to whole groups (several), padding 0.

Speed (issue 20, NUMERICS.md section on the input store): a group of at most ``FAST_LANES`` real
channels (every image input: 1-4 channels) is one compiled loop over its pixels whose lane count
and atom size are compile-time constants, so LLVM vectorises the division / conversion and the
interleave (kernels/input_atoms.py); ~0.2 ns an element instead of ~1.8 (a branch and a scalar
division per lane). Wider groups keep the per-lane loop (``_quantize_atoms``) or ``copy_into``.

All write every byte of the tensor's ``C1 x surface x C2`` image, so memory ends up byte for byte
as the reference leaves it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.input_atoms import atoms_as_lanes, atoms_as_words

#: element types quantize_into and halve_into take (others: the reference path)
QUANTIZE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: real channels of a group the compiled-constant kernels take (more: the per-lane loop)
FAST_LANES = 4


@njit(cache=True, error_model="numpy")  # (numpy's error model: x / 0 is inf or NaN, as in numpy)
def _quantize_atoms(values, scale, zero_point, image):
    c1, surface, c2 = image.shape
    channels, pixels = values.shape
    for group in range(c1):
        for pixel in range(pixels):
            for lane in range(c2):
                channel = group * c2 + lane
                if channel < channels:
                    q = np.rint(values[channel, pixel] / scale) + zero_point
                    if q != q:
                        return False
                    if q < -128.0:
                        q = -128.0
                    elif q > 127.0:
                        q = 127.0
                    image[group, pixel, lane] = np.int8(q)
                else:
                    image[group, pixel, lane] = 0
        for pixel in range(pixels, surface):
            for lane in range(c2):
                image[group, pixel, lane] = 0
    return True


def _store_groups(image: np.ndarray, flat: np.ndarray, how) -> bool | None:
    """``flat`` [C, pixels] into ``image`` group by group with the compiled-constant kernels;
    None (nothing written) where they do not apply, False on a NaN."""
    c1, surface, c2 = image.shape
    channels = flat.shape[0]
    atom_bytes = c2 * image.itemsize
    # (a packed atom - C2 = C, e.g. 3 bytes - holds whole groups; other atoms of a size no word
    # divides, with a partial group, are left to the general loops)
    if min(c2, channels) > FAST_LANES or (atom_bytes % 8 and channels % c2):
        return None
    bits = image.view(np.uint8 if image.itemsize == 1 else np.uint16)
    for group in range(c1):
        first = group * c2
        lanes = min(c2, channels - first)
        if lanes <= 0:
            image[group] = 0
            continue
        rows = tuple(flat[first + lane] for lane in range(lanes))
        if atom_bytes % 8 == 0:
            done = atoms_as_words(rows, how, bits[group].reshape(-1).view(np.uint64), (0,) * (atom_bytes // 8))
        else:
            done = atoms_as_lanes(rows, how, bits[group].reshape(-1))
        if not done:
            return False
    return True


def quantize_into(image: np.ndarray, values: np.ndarray, scale: float, zero_point: int) -> bool:
    """Quantize float ``values`` [C, H, W] (or [C, H*W]) into the int8 NC1HWC2 ``image``
    [C1, surface, C2] (a view of the tensor's memory); False (image partly written) on a NaN."""
    channels = values.shape[0]
    flat = np.ascontiguousarray(values).reshape(channels, -1)
    _check(image, flat)
    done = _store_groups(image, flat, (float(scale), float(zero_point)))
    if done is None:
        done = _quantize_atoms(flat, float(scale), float(zero_point), image)
    return bool(done)


def halve_into(image: np.ndarray, values: np.ndarray) -> bool:
    """float32/float64 ``values`` [C, H, W] (or [C, H*W]) as ``astype(np.float16)`` gives them into the
    float16 NC1HWC2 ``image`` [C1, surface, C2]; False (image partly written) on a NaN."""
    channels = values.shape[0]
    flat = np.ascontiguousarray(values).reshape(channels, -1)
    _check(image, flat)
    done = _store_groups(image, flat, None)
    if done is None:
        copy_into(image, flat.astype(np.float16))
        return True
    return done


def copy_into(image: np.ndarray, values: np.ndarray) -> None:
    """``values`` [C, H, W] (or [C, H*W]) converted to ``image``'s element type as ``astype`` does,
    into the NC1HWC2 ``image`` [C1, surface, C2], padding 0."""
    channels = values.shape[0]
    flat = values.reshape(channels, -1)
    _check(image, flat)
    c1, surface, c2 = image.shape
    pixels = flat.shape[1]
    image[:, pixels:, :] = 0
    if c1 > 1:
        # (one transposed copy of the values padded to C1 x C2 channels: a group at a time costs ~0.25 us of
        # numpy calls per group - silero-vad's 576-channel fp16 input 142 -> 2.5 us -, and is no faster on
        # wide images: TIMING.md, "copy_into in one copy")
        padded = np.zeros((c1 * c2, pixels), image.dtype) if channels < c1 * c2 else np.empty((c1 * c2, pixels),
                                                                                              image.dtype)
        np.copyto(padded[:channels], flat, casting="unsafe")
        image[:, :pixels] = padded.reshape(c1, c2, pixels).transpose(0, 2, 1)
        return
    # one channel group: its atoms built in a contiguous buffer (a fresh zeroed one - calloc'd pages - where
    # lanes pad it: cheaper than zeroing them), then one plain copy (a strided cast or copy straight into
    # the image is slower, measured on 3-channel inputs)
    atoms = np.zeros((pixels, c2), image.dtype) if channels < c2 else np.empty((pixels, c2), image.dtype)
    np.copyto(atoms[:, :channels], flat.T, casting="unsafe")
    image[0, :pixels] = atoms


def store_into(image: np.ndarray, values: np.ndarray, quantization: tuple[float, int] | None = None,
               halve: bool = False) -> bool:
    """``values`` [C, H, W] into ``image`` as the runtime stores an input: quantized with ``quantization`` if
    given, converted to float16 if ``halve`` (both from float32 / float64 values only), else converted as
    ``copy_into`` does; False (nothing written, or a NaN met) where the reference path must store them."""
    if halve or quantization is not None:
        if values.dtype not in QUANTIZE_DTYPES:
            return False
        return halve_into(image, values) if halve else quantize_into(image, values, *quantization)
    copy_into(image, values)
    return True


def _check(image: np.ndarray, flat: np.ndarray) -> None:
    if image.ndim != 3 or flat.ndim != 2:
        raise ValueError(f"expected an image [C1, surface, C2] and values [C, pixels], got {image.shape} and "
                         f"{flat.shape}")
    c1, surface, c2 = image.shape
    channels, pixels = flat.shape
    if channels > c1 * c2 or pixels > surface:
        raise ValueError(f"values of {channels} channels x {pixels} pixels do not fit an image of {c1} x {c2} "
                         f"channels and {surface}-pixel surfaces")
