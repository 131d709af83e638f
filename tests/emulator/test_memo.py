"""emulator/memo.py: value keys by equality, identity keys by the very object (never a stale
entry for a reused id), the bound."""

import gc

import numpy as np

from npuemu.emulator.memo import Memo


def counting(builds: list):
    def build(*key):
        builds.append(key)
        return len(builds)
    return build


def test_value_keys_build_once_per_equal_key():
    builds: list = []
    memo = Memo(counting(builds))
    assert memo(1, "a") == memo(1, "a") == 1
    assert memo(2, "a") == 2 and len(builds) == 2
    assert memo.get(3, "a") is None and memo.get(3, "a", default=0) == 0


def test_none_is_a_value_that_is_stored():
    builds: list = []
    memo = Memo(lambda key: builds.append(key))  # returns None
    assert memo(1) is None and memo(1) is None and builds == [1]


def test_identity_keys_follow_the_object_not_its_value():
    builds: list = []
    memo = Memo(counting(builds), identity=1)
    a, b = np.zeros(3), np.zeros(3)
    assert memo(a, 1) == memo(a, 1) == 1
    assert memo(b, 1) == 2  # an equal array, another object
    assert memo(a, 2) == 3  # the value parts still count


def test_an_entry_dies_with_its_object_so_a_reused_id_is_never_a_hit():
    memo = Memo(identity=1)
    for value in range(50):  # each array dies before the next; CPython often reuses the address
        array = np.full(4, value)
        assert memo.get(array) is None
        memo.put(value, array)
        assert memo.get(array) == value
        del array
        gc.collect()
        assert len(memo) == 0


def test_objects_without_weak_references_are_held_by_their_entry():
    memo = Memo(counting([]), identity=2)
    key = 10**30  # an int: no weak reference, so the entry holds it
    assert memo(key, None, "x") == memo(key, None, "x") == 1
    assert memo(10**30 + 1, None, "x") == 2


def test_two_identity_parts_each_count_and_each_can_end_the_entry():
    builds = iter(range(1, 100))
    memo = Memo(lambda *key: next(builds), identity=2)  # (keeps no key alive)
    a, b, c = np.zeros(2), np.zeros(2), np.zeros(2)
    assert memo(a, b) == memo(a, b) == 1 and memo.get(a, b) == 1
    assert memo(b, a) == 2 and memo(a, c) == 3 and memo(a, None) == memo(a, None) == 4
    assert memo(a, b, "v") == 5 and memo.get(a, b, "w") is None  # value parts after them
    assert memo.get(c, b, default="no") == "no"
    count = len(memo)
    del b
    gc.collect()
    assert len(memo) == count - 3  # (a, b), (b, a) and (a, b, "v") went with b
    for _ in range(20):  # a new object at a dead one's address is never a hit
        d = np.zeros(2)
        assert memo.get(a, d) is None and memo.get(d, a) is None
        del d


def test_the_memo_starts_over_when_full():
    builds: list = []
    memo = Memo(counting(builds), limit=3)
    for key in range(4):
        memo(key)
    assert len(memo) == 1 and memo(3) == 4 and memo(0) == 5
