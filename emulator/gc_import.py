"""The cycle collector kept off the heap while the runtime's modules import (issue 20: first
call in a fresh process).

After ``import numpy, numba`` the process tracks ~80k objects and the collector is due a full
collection; importing the runtime adds ~60k long-lived objects (modules, classes, functions, 194
Numba dispatchers), whose allocations trigger it: one walk of the whole heap, 15-35 ms of the
import's CPU time on the dev machine, for an import's worth of garbage. :func:`paused` switches
automatic collection off while the runtime's modules load, then moves the heap into the
permanent generation (``gc_steady.freeze_imported``: the freeze a Runtime makes after its second
run, made early, without that run's collection of the young generations) before switching it
back on; later collections walk only what is made afterwards. Frozen objects are still freed
when their reference count drops; a cycle among them that is garbage waits for ``gc.unfreeze``
(bounded by the heap at the import, released by ``gc_steady`` as its own freezes are). Only when
objects are freed changes, never a value. A caller that disabled the collector, froze objects
itself, or set ``NPUEMU_GC_FREEZE=0`` keeps its state (with ``NPUEMU_GC_FREEZE=0`` the pause is
kept, nothing is frozen).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from npuemu.emulator import gc_steady


@contextmanager
def paused() -> Iterator[None]:
    """Automatic collection off inside the block (if it was on), the heap frozen after it."""
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc_steady.freeze_imported()  # (while still off)
            gc.enable()
