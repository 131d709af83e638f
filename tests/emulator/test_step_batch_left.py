"""The steady memo's hand-on between batches (task_batches.StepBatch.run's ``left``, issue 20): a batch whose
steady run set the Cbuf from its memo's values passes that dict on, and the next batch whose memo was last found
to hold when the Cbuf was set from the very same dict skips the ids' check. ``_steady_holds`` is checked on its
own (the shortcut taken only for the very dict, the ids compared otherwise, a broken shortcut that trusts any
dict caught), and a model whose chain is two batches in a row (two LUT functions: the second's LUT upload
starts a batch of its own) runs batched, one by one and on the full path with the same outputs, records,
registers, LUT RAM and Cbuf - with the shortcut taken - also after the Cbuf changed between runs."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator import task_batches
from npuemu.emulator.units import cna_core
from tests.compiler.test_build_e2e import Net
from tests.emulator import test_step_batch_fp16 as fp16

pytestmark = fp16.pytestmark


class _Derived:
    epoch, puts = 3, 5


class _Cbuf:
    def __init__(self, **held) -> None:
        self.__dict__.update(held)


def _memo(cbuf: _Cbuf, tasks: tuple) -> list:
    # (StepBatch.run's memo: puts, the Cbuf's keys and ids, ..., the tasks at 5, the values after at 8)
    return [_Derived.puts, task_batches._held(cbuf), None, None, None, tasks, (), (0, 0), None]


def test_the_shortcut_is_taken_for_the_very_dict_alone(monkeypatch):
    objects, tasks = [object(), object()], ()
    cbuf = _Cbuf(feature=objects[0], weights=objects[1])
    memo = _memo(cbuf, tasks)
    set_from = dict(cbuf.__dict__)
    assert task_batches._steady_holds(memo, tasks, cbuf, _Derived, 3, set_from) and memo[8] is set_from
    assert not task_batches._steady_holds(memo, tasks, cbuf, _Derived, 4, set_from)  # (the epoch still checked)
    with monkeypatch.context() as patch:  # (the very dict: no ids' tuple made)
        patch.setattr(task_batches, "_held", lambda cbuf: pytest.fail("ids compared"))
        assert task_batches._steady_holds(memo, tasks, cbuf, _Derived, 3, set_from)
    other = _Cbuf(feature=object(), weights=objects[1])
    other_from = dict(other.__dict__)
    assert not task_batches._steady_holds(memo, tasks, other, _Derived, 3, other_from)  # (another dict: ids compared)
    assert not task_batches._steady_holds(memo, tasks, other, _Derived, 3, None)
    assert memo[8] is set_from  # (a failed check records nothing)
    assert task_batches._steady_holds(memo, tasks, cbuf, _Derived, 3, dict(set_from))  # (equal, not the same: ids)


def test_the_checks_catch_a_shortcut_that_trusts_any_dict(monkeypatch):
    inner = task_batches._steady_holds

    def trusting(memo, tasks, cbuf, derived, epoch, before=None):
        if before is not None and memo[8] is not None and derived.epoch == epoch and derived.puts == memo[0]:
            return True  # (any dict the Cbuf was set from, not the very one)
        return inner(memo, tasks, cbuf, derived, epoch, before)

    monkeypatch.setattr(task_batches, "_steady_holds", trusting)
    with pytest.raises(AssertionError):
        test_the_shortcut_is_taken_for_the_very_dict_alone(monkeypatch)


def _two_luts():
    """conv, Sigmoid, conv, Tanh, conv: two LUT functions, each uploaded before its task."""
    net = Net(11)
    net.conv("c1", "x", "a", 8, 16)
    net.node("Sigmoid", ["a"], ["s"], "sig")
    net.conv("c2", "s", "b", 16, 16, kernel=1)
    net.node("Tanh", ["b"], ["t"], "tanh")
    net.conv("c3", "t", "y", 16, 8)
    return net.model([1, 8, 9, 10], "y"), None


def _shortcuts(monkeypatch) -> list:
    """Counts ``_steady_holds`` calls that took the shortcut."""
    taken, inner = [0], task_batches._steady_holds

    def counted(memo, tasks, cbuf, derived, epoch, before=None):
        if before is not None and memo[8] is before and derived.epoch == epoch:
            taken[0] += 1
        return inner(memo, tasks, cbuf, derived, epoch, before)

    monkeypatch.setattr(task_batches, "_steady_holds", counted)
    return taken


def test_two_batches_in_a_row_hand_the_cbuf_on_and_equal_the_other_paths(monkeypatch, tmp_path):
    monkeypatch.setitem(fp16.MODELS, "two_luts", _two_luts)
    taken = _shortcuts(monkeypatch)
    runtimes, shapes = fp16._compare(tmp_path, "two_luts")
    runs = [task_batches.runs(replay.program[0]) for core in runtimes[0].machine.cores
            for replays in core._replays._entries.values() for replay in replays[1] if replay.program[0]]
    assert any(len(chain) >= 2 and all(batch is not None for _, batch in chain[:2]) for chain in runs if chain)
    rng = np.random.default_rng(2)
    for _ in range(6):  # (each of the two replays' second batch finds its memo, then takes the shortcut)
        fp16._check_equal(runtimes, fp16._run_all(runtimes, fp16._feeds(rng, shapes)))
    assert taken[0] >= 3
    for runtime in runtimes[:2]:  # (a feature slot holding an equal copy: the members again, then steady)
        cbuf = runtime.machine.cores[0].cbuf
        cbuf.feature = cna_core._Resident(*cbuf.feature)
    for _ in range(4):
        fp16._check_equal(runtimes, fp16._run_all(runtimes, fp16._feeds(rng, shapes)))
