"""A steady Runtime moves the heap into the collector's permanent generation (emulator/gc_steady.py,
issue 20 tail latency): after its 2nd run, released when a Runtime alive at a freeze is dropped,
never touching a caller's own freeze, off with NPUEMU_GC_FREEZE=0 / gc_freeze=False; outputs are
those of a Runtime that never freezes, and a process making Runtimes in a loop does not grow."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fixed_cost import chain_model
from npuemu.compiler.build import build_model
from npuemu.emulator import gc_steady
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import compile_graph

SHAPE = (1, 16, 8, 8)


@pytest.fixture(scope="module")
def model():
    return build_model(compile_graph(chain_model(1, 1, input_name="x"), SHAPE))


def _fresh_state():
    """Each test starts and ends with nothing frozen and the module's bookkeeping at rest."""
    gc.unfreeze()
    gc.collect()
    for name in ("ours", "release_pending", "collecting"):
        setattr(gc_steady._state, name, False)
    gc_steady._state.count = gc_steady._state.epoch = 0
    gc_steady._state.fulls_at_release = -1


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.delenv("NPUEMU_GC_FREEZE", raising=False)
    enabled = gc.isenabled()
    gc.enable()
    _fresh_state()
    yield
    _fresh_state()
    if not enabled:
        gc.disable()


def _inputs(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def _run(runtime: Runtime, seed: int) -> np.ndarray:
    runtime.set_input("x", _inputs(seed))
    runtime.run()
    return runtime.output("output", dequantize=False)


def test_frozen_after_the_second_run_and_released_when_dropped(model):
    runtime = Runtime(model)
    _run(runtime, 0)
    assert gc.get_freeze_count() == 0
    _run(runtime, 1)
    assert gc.get_freeze_count() > 0 and gc_steady._state.ours
    del runtime
    assert gc.get_freeze_count() == 0 and not gc_steady._state.ours


def test_outputs_equal_those_of_a_runtime_that_never_freezes(model):
    frozen, plain = Runtime(model), Runtime(model, gc_freeze=False)
    for seed in range(10):
        assert np.array_equal(_run(frozen, seed), _run(plain, seed))
    assert gc.get_freeze_count() > 0


@pytest.mark.parametrize("how", ["environment", "argument"])
def test_opt_out(model, monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("NPUEMU_GC_FREEZE", "0")
        runtime = Runtime(model)
    else:
        runtime = Runtime(model, gc_freeze=False)
    for seed in range(5):
        _run(runtime, seed)
    assert gc.get_freeze_count() == 0


def test_nothing_while_the_caller_disabled_the_collector(model):
    runtime = Runtime(model)
    gc.disable()
    try:
        for seed in range(5):
            _run(runtime, seed)
        assert gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_a_caller_who_froze_first_keeps_the_state(model):
    holder = [[object()] for _ in range(100)]
    gc.freeze()
    frozen = gc.get_freeze_count()
    runtime = Runtime(model)
    for seed in range(5):
        _run(runtime, seed)
    assert gc.get_freeze_count() <= frozen  # nothing added (only deaths)
    del runtime
    assert gc.get_freeze_count() > 0 and holder  # and nothing of it unfrozen


def test_a_caller_who_froze_on_top_keeps_the_state(model):
    runtime = Runtime(model)
    for seed in range(3):
        _run(runtime, seed)
    ours = gc.get_freeze_count()
    holder = [[object()] for _ in range(1000)]
    gc.freeze()  # the caller's own, on top of ours
    assert gc.get_freeze_count() > ours
    del runtime
    assert gc.get_freeze_count() > ours // 2 and holder  # not unfrozen (the Runtime's own objects died)


def test_garbage_made_after_the_freeze_is_collected(model):
    runtime = Runtime(model)
    for seed in range(3):
        _run(runtime, seed)
    assert gc.get_freeze_count() > 0

    class Node:
        pass

    node = Node()
    node.me = node  # a cycle
    alive = weakref.ref(node)
    del node
    gc.collect()
    assert alive() is None
    _run(runtime, 4)


def test_a_runtime_in_a_cycle_is_released_after_the_collection_that_frees_it(model):
    runtime = Runtime(model)
    for seed in range(3):
        _run(runtime, seed)
    assert gc.get_freeze_count() > 0
    runtime.self_reference = runtime  # only the collector can free it: its finalizer runs inside a collection
    del runtime
    assert gc.get_freeze_count() > 0  # frozen, so not collected yet
    gc.unfreeze()  # (a caller unfreezing: the Runtime is garbage to the next full collection)
    gc.collect()
    assert not gc_steady._state.ours and not gc_steady._state.release_pending
    assert gc.get_freeze_count() == 0


def _tracked_after(model, count: int, keep: Runtime | None) -> int:
    for i in range(count):
        runtime = Runtime(model)
        for seed in range(3):
            _run(runtime, seed + i)
        if keep is not None:
            _run(keep, i)
        del runtime
    gc.collect()
    return len(gc.get_objects()) + gc.get_freeze_count()


@pytest.mark.parametrize("long_lived", [False, True])
def test_runtimes_made_and_dropped_in_a_loop_do_not_grow(model, long_lived):
    keep = Runtime(model) if long_lived else None
    _tracked_after(model, 5, keep)
    after_10 = _tracked_after(model, 10, keep)
    after_50 = _tracked_after(model, 40, keep)
    assert after_50 < after_10 + 1000  # a Runtime per loop left frozen adds ~4,600 (40 x ~115)
    one_runtime = Runtime(model)
    _run(one_runtime, 0)
    del one_runtime
    if keep is None:
        assert gc.get_freeze_count() == 0


@settings(max_examples=12)
@given(st.lists(st.sampled_from(["make", "run", "drop", "caller_freeze", "caller_unfreeze", "collect"]),
                min_size=1, max_size=14))
def test_any_order_of_runs_drops_and_caller_freezes(model, actions):
    _fresh_state()
    runtimes: list[Runtime] = []
    plain = Runtime(model, gc_freeze=False)
    caller = False
    for i, action in enumerate(actions):
        if action == "make" or not runtimes and action in ("run", "drop"):
            runtimes.append(Runtime(model))
        elif action == "run":
            assert np.array_equal(_run(runtimes[i % len(runtimes)], i), _run(plain, i))
        elif action == "drop":
            runtimes.pop(i % len(runtimes))
        elif action == "caller_freeze":
            gc.freeze()
            caller = True
        elif action == "caller_unfreeze":
            gc.unfreeze()
            caller = False
        else:
            gc.collect()
    if not caller:
        runtimes.clear()
        gc.collect()
        # all our Runtimes dropped and no caller freeze left: nothing may stay frozen
        assert gc.get_freeze_count() == 0
    _fresh_state()
