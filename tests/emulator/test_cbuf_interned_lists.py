"""The older weight sets' lists ``cbuf_reuse.remember`` builds are shared between loads that leave
the same sets (issue 20, kernels/cbuf_reuse.py ``_interned``): a sequence of loads run twice gives
the very same list objects the second time (what the compiled steps' identity checks rely on),
each with the module rule's contents; other arrays under the same keys give other lists; the store
stays bounded."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import cbuf_reuse
from npuemu.emulator.units import cna_core
from tests.emulator.test_task_fixed_cost_steps import _reference_remember

LOADS = st.lists(st.tuples(st.sampled_from(["feature", "weights"]), st.integers(0, 11), st.integers(0, 3),
                           st.integers(1, 3 * 32768)), min_size=1, max_size=14)


def _run(cbuf, loads, arrays):
    """The loads as the full path makes them (Cbuf.keep); the list after each, and its contents."""
    lists = []
    for (slot, bank, address, _), array in zip(loads, arrays):
        key = (("address", address), ("banks", f"{bank}/{12 - bank}"))
        cbuf.keep(slot, key, array, "here")
        lists.append(cbuf._older_weights)
    return lists, [[(k, id(a), b) for k, a, b in kept] for kept in lists]


def _rule(loads, arrays):
    """The module rule (test_task_fixed_cost_steps' reference) after each load, as (key, array id) pairs."""
    older, weights, out = [], None, []
    for (slot, bank, address, _), array in zip(loads, arrays):
        key = (("address", address), ("banks", f"{bank}/{12 - bank}"))
        older = _reference_remember(older, slot, key, array.nbytes, weights if slot == "weights" else None)
        if slot == "weights":
            weights = (key, array)
        out.append([(k, id(a)) for k, a in older])
    return out


def _reset(cbuf):
    cbuf.feature = cbuf.weights = None
    cbuf._older_weights = ()


@settings(max_examples=200, deadline=None)
@given(LOADS)
def test_a_repeated_sequence_gives_the_same_lists(loads):
    arrays = [np.zeros(nbytes, np.int8) for *_, nbytes in loads]
    cbuf = cna_core.Cbuf()
    first, contents = _run(cbuf, loads, arrays)
    _reset(cbuf)
    second, again = _run(cbuf, loads, arrays)
    assert [[(k, a) for k, a, _ in kept] for kept in contents] == _rule(loads, arrays)
    assert again == contents
    assert all(two is one for one, two in zip(first, second))


def test_the_same_sets_share_one_list_and_other_arrays_do_not():
    cbuf = cna_core.Cbuf()
    low, high, other = np.zeros(100, np.int8), np.zeros(100, np.int8), np.zeros(100, np.int8)
    key_low, key_high = (("address", 1), ("banks", "1/11")), (("address", 2), ("banks", "4/8"))
    cbuf.keep("weights", key_low, low, "a")
    cbuf.keep("weights", key_high, high, "b")  # low kept beside (bank 1 vs 4)
    kept = cbuf._older_weights
    assert [k for k, _, _ in kept] == [key_low]
    cbuf.keep("weights", key_low, low, "c")  # high kept, low evicted (its key)
    cbuf.keep("weights", key_high, high, "d")  # low kept again: the same sets as before
    assert cbuf._older_weights is kept
    cbuf.keep("weights", key_low, other, "e")
    cbuf.keep("weights", key_high, high, "f")  # other array under low's key: another list
    assert cbuf._older_weights is not kept and cbuf._older_weights[0][1] is other


def test_the_store_is_bounded(monkeypatch):
    monkeypatch.setattr(cbuf_reuse, "INTERNED_LISTS", 3)
    cbuf = cna_core.Cbuf()
    high = np.zeros(16, np.int8)
    key_high = (("address", 0), ("banks", "6/6"))
    for address in range(1, 9):
        cbuf.keep("weights", (("address", address), ("banks", "1/11")), np.zeros(16, np.int8), "a")
        cbuf.keep("weights", key_high, high, "b")
        assert len(vars(cbuf)["_older_lists"]) <= 3
        assert [dict(k)["address"] for k, _, _ in cbuf._older_weights] == [address]
