"""The cycle collector's view of the heap frozen while a build runs (issue 20: compile time).

CPython's collector runs a full (oldest-generation) collection whenever the objects that
survived the younger collections grow by a quarter of those already in the oldest generation,
and each full collection walks every tracked object of the process: numpy's, onnx's and
protobuf's modules, the imported graph, and, once calibration has loaded Numba (compiler/
depthwise_kernel.py), Numba's and LLVM's large object graphs. Lowering keeps tens of thousands of
new objects (tasks, register writes) alive, so it triggers such collections: measured in one
process, PP-OCRv4 rec (20 samples): 4 full collections, 0.23 s of CPU (0.15 s in lowering,
0.08 s in calibration), ~10% of its compile; YOLOX det 0.02 s, MobileNetV2 0.01 s.

Inside :func:`frozen_heap` the objects that exist when it starts are in the collector's
permanent generation (``gc.freeze``): collections still run, over the objects made since, and
the objects the build makes still get collected. A nested block freezes what was made since the
outer one started (calibration nests one after loading Numba, so its objects are left out too).
At the end of the outermost block ``gc.unfreeze`` returns the frozen objects to the oldest
generation (a cycle that became garbage meanwhile is collected at the next
full collection). A process that has frozen objects itself keeps its own state: the blocks then
do nothing. Forked calibration workers (quant/calibrate_workers.py) inherit the frozen
state (a full collection there does not walk, and so does not copy, the pages it shares). Only when and where objects are
freed changes, never a value: the model files stay byte-identical.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: [nesting depth, whether the outermost block froze]: only the outermost block unfreezes, and
#: only what it froze (it leaves alone a process that froze objects itself, e.g. before forking)
_state = [0, False]


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Run the block with the objects existing now left out of the collector's walks."""
    outermost = _state[0] == 0
    if outermost:
        _state[1] = gc.get_freeze_count() == 0
    if _state[1]:
        gc.freeze()
    _state[0] += 1
    try:
        yield
    finally:
        _state[0] -= 1
        if outermost and _state[1]:
            gc.unfreeze()
            _state[1] = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block without automatic collections, for a block that only adds long-lived
    objects (importing and loading Numba: ~two full collections otherwise, 0.04-0.08 s of CPU
    walking its half-built object graph). Inside a :func:`frozen_heap` block what it made is
    frozen with the rest at its end; elsewhere the next collection walks it once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _state[0] and _state[1]:
            gc.freeze()
        if enabled:
            gc.enable()
