"""Reuse of CBUF contents across changes of the bank split (REGISTER_SEMANTICS.md 38).

The Cbuf (units/cna_core.py) keeps the last feature and the last weight set by identity. The exLSTM
reuses contents that a later load with another bank split left in place [V: lstm_int8]:
- the PC's step 13 (static block 13, the h x R conv) sets DATA_REUSE with DATA_BANK 2 / WEIGHT_BANK 10
  after step 8 loaded the same 1 x 1 x 64 int8 h with 1 / 11;
- step 33 sets WEIGHT_REUSE for R (4096 bytes, loaded at split 1 / 11) after another conv loaded its
  4096-byte weights at split 4 / 8.
[I] The data banks come first and the weights start at bank DATA_BANK (CBUF_CON0), each set filling
ceil(bytes / bank size) banks from its start, so a feature held in the first banks stays readable when
the data gets more banks, and weight sets loaded at different starts coexist until a later load covers
their banks. This module keeps those older weight sets beside the Cbuf's own slot and evicts the ones a
new load (feature or weights) overlaps; a reuse of anything else stays refused by name. [C] Bank size
32768 bytes, every platform file's cbuf.bank_bytes (rk3588, rk3568, rk3562).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

BANK_BYTES = 32768
_SPLIT = "banks"


def _split(key: tuple) -> tuple[dict, int]:
    fields = dict(key)
    data_banks = int(str(fields.pop(_SPLIT, "0/0")).split("/")[0])
    return fields, data_banks


def _banks(start: int, nbytes: int) -> range:
    return range(start, start + max(1, -(-nbytes // BANK_BYTES)))


@lru_cache(maxsize=4096)
def _first_bank(key: tuple) -> int:
    """Where a weight set loaded under ``key`` starts: its DATA_BANK (a key repeats every replay)."""
    return _split(key)[1]


def _overlap(a: range, b: range) -> bool:
    return a.start < b.stop and b.start < a.stop


def still_held(cbuf, slot: str, held_key: tuple, held: np.ndarray, wanted: tuple) -> np.ndarray | None:
    """The contents a reuse of ``wanted`` reads when the Cbuf's own slot holds ``held_key`` (module
    note), or None: nothing this task may reuse."""
    if slot == "feature":
        held_fields, held_banks = _split(held_key)
        wanted_fields, wanted_banks = _split(wanted)
        return held if held_fields == wanted_fields and wanted_banks >= held_banks else None
    for key, array, _ in getattr(cbuf, "_older_weights", ()):
        if key == wanted:
            return array
    return None


def weight_banks(key: tuple, nbytes: int) -> range:
    """The banks a weight set of ``nbytes`` loaded under ``key`` fills (module note)."""
    return _banks(_first_bank(key), nbytes)


def remember(cbuf, slot: str, key: tuple, array: np.ndarray, previous: tuple | None) -> range | None:
    """Note a load: evict the older weight sets it overlaps and keep the weight set it replaces
    (``previous``: the Cbuf's former weights as (key, array, their banks), or None). The older sets
    are kept as (key, array, banks). Runs on every conv task's loads (the full unit path's; a
    compiled step checks the common cases itself, units/cna_core.py ``prepare_cna_core``), so the
    common cases - nothing kept, and nothing new to keep or the new weights covering the ones they
    replace; a load that overlaps nothing kept - return without building a list, and the bank ranges
    are compared as intervals. A list it builds is replaced, never changed in place, by one holding
    the same sets where an earlier load left such a one (``_interned``). Returns the banks the load
    fills where it worked them out (None: returned before)."""
    older = getattr(cbuf, "_older_weights", None)
    if not older and (previous is None or previous[0] == key):  # nothing kept, nothing new to keep
        return None
    covered = _banks(0 if slot == "feature" else _first_bank(key), array.nbytes)
    if previous is not None and (previous[0] == key or _overlap(covered, previous[2])):
        previous = None  # (replaced and evicted at once)
    if previous is None and not any(k == key or _overlap(covered, banks) for k, _, banks in older or ()):
        return covered  # (the kept sets stay as they are)
    candidates = [*(older or ()), *((previous,) if previous is not None else ())]
    cbuf._older_weights = _interned(cbuf, [(k, a, banks) for k, a, banks in candidates
                                           if k != key and not _overlap(covered, banks)])
    return covered


#: lists of older weight sets a Cbuf keeps for ``_interned`` (beyond it, they are dropped)
INTERNED_LISTS = 64


def _interned(cbuf, kept: list) -> list:
    """The list an earlier ``remember`` on ``cbuf`` built with the same sets (keys, arrays by
    identity, banks), else ``kept`` (noted for later). A chain's loads change the list in the same
    way every run, so its lists are the same objects run after run, and a compiled step's check
    for the list a keep of its own left unchanged (by identity, units/cna_core.py note before
    ``_covers``) holds on the next run too (issue 20: ppocr_cls kept 166 loads a run, 19 of
    which change the list)."""
    lists = vars(cbuf).setdefault("_older_lists", {})
    signature = tuple((k, id(a), banks.start, banks.stop) for k, a, banks in kept)  # (``lists`` holds the arrays)
    known = lists.get(signature)
    if known is not None:
        return known
    if len(lists) >= INTERNED_LISTS:
        lists.clear()
    lists[signature] = kept
    return kept
