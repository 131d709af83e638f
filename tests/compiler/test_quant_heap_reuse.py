"""Calibration keeps glibc's large freed blocks for reuse (compiler/quant/heap_reuse.py): repeated
large allocations stop faulting pages in inside the block, and the ranges are the same bits."""

from __future__ import annotations

import contextlib
import importlib
import platform
import resource
import subprocess
import sys

import numpy as np
import pytest

from tests.compiler.test_quant_calibrate_workers import bits, samples, small_graph

calibrate_module = importlib.import_module("npuemu.compiler.quant.calibrate")  # (the package exports the function)
GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


#: run in a fresh interpreter: the allocator's state there does not depend on earlier tests
FAULTS = """
import resource
from npuemu.compiler.quant.heap_reuse import reused_heap

def faults(count=6, size=40 << 20):  # above glibc's largest dynamic mmap threshold (32 MB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(count):
        block = bytearray(size)  # zero-filled by a write of every page
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

outside = faults()
with reused_heap() as held:
    faults(1)  # the heap grows once
    inside = faults()
print(outside, inside, held)
"""


@pytest.mark.skipif(not GLIBC, reason="mallopt thresholds are glibc's (elsewhere the block does nothing)")
def test_large_blocks_are_reused_inside_the_block() -> None:
    """Six 40 MB blocks allocated, written and freed in turn: by default a fresh mapping each
    (every page faulted in), inside the block the same heap pages again."""
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True).stdout.split()
    outside, inside, held = int(out[0]), int(out[1]), out[2]
    pages = (40 << 20) // resource.getpagesize()
    assert held == "True"
    assert outside >= 3 * pages
    assert inside < pages // 2


def test_calibration_ranges_do_not_depend_on_the_heap(monkeypatch) -> None:
    graph, data = small_graph(), [{"x": x} for x in samples(5)]
    with_reuse = calibrate_module.calibrate(graph, data, progress=False)
    monkeypatch.setattr(calibrate_module, "reused_heap", contextlib.nullcontext)
    without = calibrate_module.calibrate(graph, data, progress=False)
    assert bits(with_reuse.ranges) == bits(without.ranges) and bits(with_reuse.observed) == bits(without.observed)
    assert np.isfinite([r.lo for r in without.ranges.values()]).all()
