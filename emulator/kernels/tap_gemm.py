"""Stride-1 convolutions as one accumulating float32 product per kernel tap (issue 8).

On a pixel-major padded input [Hp * Wp][C] (``conv_pixels``), output pixel (oy, ox) of tap
(ky, kx) reads input row ``(oy + ky*dy) * Wp + ox + kx*dx``: for a fixed tap, the inputs of all
output pixels form one contiguous run of ``L = (OH - 1) * Wp + OW`` rows at a fixed offset (the
rows past OW of each output row are junk, dropped at the end). So the convolution is ``sum over
taps of X_tap [L][C] @ W_tap [C][N]`` with no im2col copy. The products accumulate in the BLAS
output (beta = 1), which needs the CBLAS entry point of the OpenBLAS numpy loaded
(``scipy_cblas_sgemm64_``, 64-bit integers); without it callers keep the im2col path.

Exactness: used only for int8 weights whose whole reduction is one exact chunk
(``mac.exact_chunk_bounds``): every partial sum of a row's products, in any order, is an
integer of magnitude <= 128 * sum(|w|) <= 2**24, so the float32 accumulation across taps is
exact, like the single product it replaces (NUMERICS.md 3.5).
"""

from __future__ import annotations

import ctypes

import numpy as np

_ROW_MAJOR, _NO_TRANS = 101, 111  # CBLAS enums
#: CBLAS sgemm symbols with 64-bit integer arguments (numpy's scipy-openblas64 build).
_SGEMM_NAMES = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")
_sgemm = None
_looked_up = False


def _find_sgemm():
    global _sgemm, _looked_up
    if _looked_up:
        return _sgemm
    _looked_up = True
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps
                            if "openblas" in line.lower() and "/" in line})
        for path in paths:
            library = ctypes.CDLL(path)
            for name in _SGEMM_NAMES:
                if hasattr(library, name):
                    function = getattr(library, name)
                    i64, pointer = ctypes.c_int64, ctypes.c_void_p
                    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, i64, i64, i64,
                                         ctypes.c_float, pointer, i64, pointer, i64, ctypes.c_float,
                                         pointer, i64]
                    function.restype = None
                    _sgemm = function
                    return _sgemm
    except OSError:
        pass  # no /proc or the library will not load: the im2col path stays
    return None


def available() -> bool:
    return _find_sgemm() is not None


def tap_products_pixels(padded: np.ndarray, weights: np.ndarray, kernel_w: int, dilation_y: int,
                        dilation_x: int, padded_w: int, out: np.ndarray) -> None:
    """The pixel-major form: ``padded`` float32 [Hp * Wp][C] (C-contiguous, the padded input
    pixel by pixel), ``weights`` float32 [taps][C][N]; ``out`` float32 [(OH - 1) * Wp + OW][N]
    (C-contiguous) receives, for output pixel (oy, ox) at row oy * Wp + ox, the sum over taps
    of its tap's input pixel (row + ky * dy * Wp + kx * dx) times weights[tap]: every tap's
    input is one contiguous run of rows, so each tap is one product accumulated into ``out``."""
    sgemm = _find_sgemm()
    channels = padded.shape[1]
    taps, _, columns = weights.shape
    for tap in range(taps):
        ky, kx = divmod(tap, kernel_w)
        offset = (ky * dilation_y * padded_w + kx * dilation_x) * channels * 4  # bytes
        sgemm(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, out.shape[0], columns, channels, 1.0,
              padded.ctypes.data + offset, channels, weights[tap].ctypes.data, columns,
              0.0 if tap == 0 else 1.0, out.ctypes.data, columns)
