"""compiler/gc_freeze.py: the collector's frozen view during a build is scoped (everything frozen
inside comes back at the outermost end), garbage made inside is still collected, a paused block
restores the collector's state, and a calibration inside gives the same ranges as outside."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler.gc_freeze import collector_paused, frozen_heap
from npuemu.compiler.ir import Graph, Node, Tensor
from npuemu.compiler.quant.calibrate import calibrate


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _clean_collector():
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


def test_frozen_objects_come_back_at_the_outermost_end():
    before = gc.get_freeze_count()
    assert before == 0
    with frozen_heap():
        outer = gc.get_freeze_count()
        assert outer > 0
        keep = [object() for _ in range(10)], {"k": [1, 2]}
        with frozen_heap():
            assert gc.get_freeze_count() >= outer  # the inner block freezes what was made since
        assert gc.get_freeze_count() > 0  # the inner end does not unfreeze the outer block's
    assert gc.get_freeze_count() == 0
    assert keep


def test_unfrozen_even_when_the_block_raises():
    with pytest.raises(ValueError):
        with frozen_heap():
            with frozen_heap():
                raise ValueError("x")
    assert gc.get_freeze_count() == 0
    with frozen_heap():  # the nesting count was restored: this block freezes and unfreezes again
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_garbage_made_inside_is_still_collected():
    with frozen_heap():
        _Cycle()
        assert gc.collect() >= 1


@given(st.booleans(), st.booleans())
@settings(max_examples=8, deadline=None)
def test_paused_block_restores_the_collector(enabled: bool, inside: bool):
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()
    try:
        if inside:
            with frozen_heap():
                with collector_paused():
                    assert not gc.isenabled()
                    made = [_Cycle() for _ in range(5)]
                assert gc.isenabled() == enabled
                assert gc.get_freeze_count() > 0  # what the paused block made is frozen with the rest
                assert made
            assert gc.get_freeze_count() == 0
        else:
            with collector_paused():
                assert not gc.isenabled()
            assert gc.isenabled() == enabled
            assert gc.get_freeze_count() == 0  # outside a frozen block nothing stays frozen
    finally:
        gc.enable()


def _graph() -> Graph:
    graph = Graph("g")
    graph.add_tensor(Tensor("x", (1, 3, 6, 6), "float32"))
    graph.add_tensor(Tensor("w", (4, 3, 3, 3), "float32",
                            data=np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)))
    graph.add_tensor(Tensor("y", (1, 4, 4, 4), "float32"))
    graph.inputs, graph.outputs = ["x"], ["y"]
    graph.nodes.append(Node("conv", "Conv", ["x", "w"], ["y"], {"kernel_shape": [3, 3], "strides": [1, 1],
                                                                   "pads": [0, 0, 0, 0], "dilations": [1, 1],
                                                                   "group": 1}))
    return graph


@given(st.integers(0, 2**32 - 1))
@settings(max_examples=10, deadline=None)
def test_calibration_ranges_do_not_depend_on_the_collector(seed: int):
    rng = np.random.default_rng(seed)
    samples = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(3)]
    inside = calibrate(_graph(), samples, progress=False)  # calibrate freezes itself
    gc.disable()
    try:
        outside = calibrate(_graph(), samples, progress=False)
    finally:
        gc.enable()
    assert gc.get_freeze_count() == 0
    assert {k: (v.lo, v.hi) for k, v in inside.ranges.items()} == {k: (v.lo, v.hi) for k, v in outside.ranges.items()}


def test_a_process_that_froze_objects_itself_keeps_its_state():
    gc.freeze()
    frozen = gc.get_freeze_count()
    with frozen_heap():
        made = [_Cycle() for _ in range(5)]
        with collector_paused():
            more = [_Cycle() for _ in range(5)]
        assert gc.get_freeze_count() == frozen  # nothing added to the caller's frozen set
    assert gc.get_freeze_count() == frozen  # and nothing of it unfrozen
    assert made and more
