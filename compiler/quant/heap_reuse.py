"""glibc's heap kept for reuse while calibration evaluates the float graph (issue 20).

Every float evaluation allocates the same large numpy temporaries again (im2col windows, padded
inputs, float64 results: 1-40 MB each). glibc serves blocks above its mmap threshold (at most
32 MB, raised dynamically) with fresh mappings and returns freed heap tops above its trim
threshold to the system, so each new block is faulted in and zeroed by the kernel page by page:
measured on the development machine with 20 samples and one process, 82,000 minor faults for
YOLOX det, 91,000-100,000 for MobileNetV2, 50,000 for PP-OCRv4 rec, ~0.15-0.3 s of CPU each.
Inside :func:`reused_heap` large blocks come from the heap and freed memory stays there, so the
next sample reuses pages already mapped (3,000-5,000 faults; YOLOX 5.1-5.2 -> 4.7-5.0 s of
calibration CPU, MobileNetV2 1.45 -> 1.2-1.3 s). Values do not depend on where an array lives
(the same ranges bit for bit: tests/compiler/test_quant_heap_reuse.py, and every model file).

The block sets glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` with ``mallopt`` (forked
calibration workers inherit them) and afterwards sets them to 32 and 64 MB: the fixed values glibc
documents as its dynamic maxima, which a calibration with blocks that large would have reached
anyway (setting them turns the dynamic adjustment off); the heap top above 64 MB is then returned
at the next free. Elsewhere than glibc (musl, macOS) the block does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import platform
from collections.abc import Iterator

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: inside the block: no large block mapped on its own, no heap top returned (1 and 2 GiB; the
#: value is a C int)
HELD_MMAP, HELD_TRIM = 1 << 30, (1 << 31) - 1
#: after it: glibc's dynamic maxima on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX and twice it)
AFTER_MMAP, AFTER_TRIM = 32 << 20, 64 << 20


def _mallopt():
    """glibc's ``mallopt``, or None (another C library, or no symbol)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    except OSError:
        return None
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


@contextlib.contextmanager
def reused_heap() -> Iterator[bool]:
    """Large freed blocks kept in the heap inside the block; yields whether glibc took the setting."""
    mallopt = _mallopt()
    if mallopt is None:
        yield False
        return
    held = bool(mallopt(M_MMAP_THRESHOLD, HELD_MMAP) or mallopt(M_MMAP_THRESHOLD, AFTER_MMAP))
    held = bool(mallopt(M_TRIM_THRESHOLD, HELD_TRIM)) and held
    try:
        yield held
    finally:
        mallopt(M_MMAP_THRESHOLD, AFTER_MMAP)
        mallopt(M_TRIM_THRESHOLD, AFTER_TRIM)
