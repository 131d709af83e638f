"""The derived-value cache (emulator/memory.py ``DerivedCache``) keeps an index of its entries'
byte ranges that it does not rebuild on every put or drop (issue 20: PP-OCRv4 rec's float16
islands recompute values every run). Whatever the order of puts, drops and writes, the entries
it keeps must be exactly those a plain list of ranges would keep: every value whose bytes a
write overlaps is gone, every other value is still there."""

from hypothesis import given, settings, strategies as st
import numpy as np

from npuemu.emulator import memory
from npuemu.emulator.memory import DerivedCache

KEYS = st.integers(0, 40)
RANGES = st.tuples(st.integers(0, 4000), st.integers(1, 300)).map(lambda r: (r[0], r[0] + r[1]))
OPS = st.one_of(
    st.tuples(st.just("put"), KEYS, RANGES),
    st.tuples(st.just("write"), RANGES),
    st.tuples(st.just("rows"), st.lists(st.integers(0, 4200), min_size=1, max_size=6), st.integers(1, 64)),
    st.tuples(st.just("clear")),
    st.tuples(st.just("drop"), st.integers(0, 3)),  # (one of the kept row drops, ``DROPS``)
)
#: the rows of the ``rows_drop`` drops a test keeps (as a task program's steps do): (starts, row bytes)
DROPS = (([100, 260], 32), ([0], 4000), ([1200, 1300, 1400], 8), ([3990], 64))


def _reference(ops):
    """The entries left by a plain model: a dict of key -> (low, high)."""
    live = {}
    for op in ops:
        if op[0] == "put":
            live[op[1]] = op[2]
        elif op[0] == "write":
            low, high = op[1]
            live = {k: (a, b) for k, (a, b) in live.items() if not (a < high and b > low)}
        elif op[0] in ("rows", "drop"):
            starts, size = (op[1], op[2]) if op[0] == "rows" else DROPS[op[1]]
            live = {k: (a, b) for k, (a, b) in live.items()
                    if not any(a < s + size and b > s for s in starts)}
        else:
            live = {}
    return live


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=200), st.sampled_from([memory._ROWS_BY_KEYS_MAX, 0]))
def test_kept_values_are_those_no_write_overlapped(ops, rows_by_keys):
    """(``rows_by_keys`` 0: a write's rows checked entry by entry, the path of writes of many rows
    over many entries.)"""
    memory._ROWS_BY_KEYS_MAX, kept = rows_by_keys, memory._ROWS_BY_KEYS_MAX
    try:
        _check(ops)
    finally:
        memory._ROWS_BY_KEYS_MAX = kept


def _check(ops):
    cache = DerivedCache()
    drops = [cache.rows_drop(np.array(starts, np.int64), size) for starts, size in DROPS]
    for step, op in enumerate(ops):
        if op[0] == "put":
            cache.put(op[1], *op[2], ("value", op[1], op[2]))
        elif op[0] == "write":
            cache.invalidate(*op[1])
        elif op[0] == "rows":
            cache.invalidate_rows(np.array(op[1], np.int64), op[2])
        elif op[0] == "drop":
            drops[op[1]]()
        else:
            cache.clear()
        expected = _reference(ops[:step + 1])
        assert len(cache) == len(expected)
        for key, bounds in expected.items():
            assert cache.get(key) == ("value", key, bounds)


def test_many_puts_between_writes_keep_the_index_and_stay_exact():
    """A chain that re-puts its values every run (the case the kept index is for): 300 rounds
    of dropping and re-putting 50 values among 1000 kept ones."""
    cache = DerivedCache()
    for key in range(1000):
        cache.put(key, key * 100, key * 100 + 50, key)
    for round_ in range(300):
        first = (round_ * 7) % 950
        cache.invalidate(first * 100, (first + 50) * 100)
        assert all(cache.get(k) is None for k in range(first, first + 50))
        for key in range(first, first + 50):
            cache.put(key, key * 100, key * 100 + 50, key)
    assert all(cache.get(k) == k for k in range(1000))
    cache.invalidate(0, 100_000)
    assert len(cache) == 0


def test_a_write_finds_each_value_put_since_the_index_was_built():
    """Values put after the index was built wait beside it: a write must find every one of them,
    wherever it lies relative to the others (the first put's range, the last one's, between)."""
    cache = DerivedCache()
    cache.put("kept", 5000, 5100, 0)
    cache.invalidate(0, 10)  # builds the index
    for key, low in (("a", 100), ("b", 900), ("c", 400), ("d", 20)):
        cache.put(key, low, low + 10, key)
    for key, low in (("b", 900), ("d", 20), ("c", 400), ("a", 100)):
        cache.invalidate(low + 5, low + 6)
        assert cache.get(key) is None
    assert cache.get("kept") == 0


def searching(monkeypatch) -> None:
    """Every ``rows_drop`` drop searches the cache (``invalidate_rows``) on every call: its skip needs a
    ``puts`` it has seen, and this makes each reading of it a new number (tests injecting a failure into
    ``invalidate_rows`` reach it from the steps' drops too)."""
    ticks = iter(range(1 << 62))
    monkeypatch.setattr(DerivedCache, "puts", property(lambda self: next(ticks), lambda self, value: None),
                        raising=False)


def test_a_kept_drop_skips_the_search_only_while_nothing_was_put(monkeypatch):
    cache = DerivedCache()
    cache.put("over", 100, 110, 1)
    drop, searches = cache.rows_drop(np.array([96], np.int64), 8), []
    inner = DerivedCache.invalidate_rows
    monkeypatch.setattr(DerivedCache, "invalidate_rows", lambda self, *a: searches.append(1) or inner(self, *a))
    drop()
    drop()
    assert cache.get("over") is None and len(searches) == 1
    cache.put("other", 5000, 5010, 2)  # (anywhere: the next call searches again)
    cache.put("over", 100, 110, 3)
    drop()
    assert cache.get("over") is None and cache.get("other") == 2 and len(searches) == 2
    searching(monkeypatch)
    drop()
    drop()
    assert len(searches) == 4
