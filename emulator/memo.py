"""The emulator's one memo: values derived once and looked up again on every later run.

A network runs the same tasks every inference, so what the emulator works out from a task's
decoded state, weights or settings (CNA plans, GEMM operands, DPU settings vectors, resolved
register writes, ...) is computed once and reused. Every such table is a :class:`Memo`:

- Keys are tuples of parts. The first ``identity`` parts are objects compared by identity
  (decoded states, tasks, read-only arrays: hashing them by value would cost more than the
  lookup saves, and arrays cannot be hashed); the rest are values compared by equality.
- An identity part is held by a weak reference whose death drops the entry, so an ``id()``
  reused by a later object never finds a stale value; an object that cannot be weakly
  referenced (an ``int``, ``None``) is held strongly by its entry, so its id cannot be reused
  while the entry lives. Either way a hit means: the very same objects, and equal values.
- Identity keys are only correct for objects that do not change: frozen states, tasks, and
  arrays marked read-only (callers check ``flags.writeable`` before memoising on an array).
- A memo holds at most ``limit`` entries and starts over when full: a bound on memory, not
  an eviction policy (a network's working set is far smaller than the default).

Values that depend on memory bytes are not memoised here: they live in the memory's
``DerivedCache`` (``emulator/memory.py``), which drops them when a write touches their bytes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")

#: Entries per memo before it starts over (see the module docstring).
LIMIT = 4096

_MISSING: Any = object()


class _Held:
    """A strong reference with the call interface of ``weakref.ref`` (for objects that cannot
    be weakly referenced)."""

    __slots__ = ("target",)

    def __init__(self, target: object) -> None:
        self.target = target

    def __call__(self) -> object:
        return self.target


class Memo(Generic[V]):
    """``build(*key)`` computed once per key (see the module docstring for how keys compare).

    ``memo(*key)`` returns the memoised value, building it on a miss; ``get``/``put`` serve
    callers whose value needs more than the key to build or is replaced when it goes stale."""

    __slots__ = ("_build", "_identity", "_limit", "_entries", "__weakref__")

    def __init__(self, build: Callable[..., V] | None = None, *, identity: int = 0,
                 limit: int = LIMIT) -> None:
        self._build = build
        self._identity = identity
        self._limit = limit
        self._entries: dict[Hashable, Any] = {}

    def __call__(self, *key: Any) -> V:
        # The two hot cases inline (memos are looked up several times per task): value keys,
        # and one identity part.
        count = self._identity
        if count == 0:
            value = self._entries.get(key, _MISSING)
        elif count == 1:  # (the slot of _slot, inline)
            entry = self._entries.get(id(key[0]) if len(key) == 1 else (id(key[0]),) + key[1:])
            value = entry[1] if entry is not None and entry[0][0]() is key[0] else _MISSING
        elif count == 2:
            value = self._lookup_two(key, _MISSING)
        else:
            value = self._lookup_many(key)
        if value is _MISSING:
            value = self.put(self._build(*key), *key)
        return value

    def get(self, *key: Any, default: Any = None) -> V | Any:
        """The value stored for ``key``, or ``default``."""
        count = self._identity
        if count == 0:
            return self._entries.get(key, default)
        if count == 1:  # (the slot of _slot, inline)
            entry = self._entries.get(id(key[0]) if len(key) == 1 else (id(key[0]),) + key[1:])
            return entry[1] if entry is not None and entry[0][0]() is key[0] else default
        if count == 2:
            return self._lookup_two(key, default)
        value = self._lookup_many(key)
        return default if value is _MISSING else value

    def _lookup_two(self, key: tuple, default: Any) -> Any:
        # two identity parts (a unit's state and its RDMA's, looked up every task): _slot and
        # the check of _lookup_many, unrolled
        entry = self._entries.get((id(key[0]), id(key[1])) + key[2:])
        if entry is None:
            return default
        refs = entry[0]
        return entry[1] if refs[0]() is key[0] and refs[1]() is key[1] else default

    def _lookup_many(self, key: tuple) -> Any:
        entry = self._entries.get(self._slot(key))
        if entry is None:
            return _MISSING
        for ref, part in zip(entry[0], key):
            if ref() is not part:
                return _MISSING
        return entry[1]

    def put(self, value: V, *key: Any) -> V:
        """Store ``value`` for ``key`` (replacing any entry) and return it."""
        if len(self._entries) >= self._limit:
            self._entries.clear()
        if self._identity == 0:
            self._entries[key] = value
            return value
        slot = self._slot(key)
        refs = tuple(self._reference(part, slot) for part in key[:self._identity])
        self._entries[slot] = (refs, value)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _slot(self, key: tuple) -> Hashable:
        # the dict key: ids for the identity parts (a lone identity part: its id alone)
        count = self._identity
        if count == 1:
            return id(key[0]) if len(key) == 1 else (id(key[0]),) + key[1:]
        return tuple(map(id, key[:count])) + key[count:]

    def _reference(self, part: object, slot: tuple) -> Callable[[], object]:
        try:
            return weakref.ref(part, self._forget(slot))
        except TypeError:  # ints, None, ...: held by the entry instead
            return _Held(part)

    def _forget(self, slot: tuple) -> Callable[[weakref.ref], None]:
        # the entry goes with its object (the memo itself only through a weak reference, so
        # entries never keep a memo alive)
        memo = weakref.ref(self)

        def forget(_: weakref.ref) -> None:
            owner = memo()
            if owner is not None:
                owner._entries.pop(slot, None)

        return forget
