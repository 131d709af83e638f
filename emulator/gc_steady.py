"""The cycle collector's view of a steady Runtime's working set (issue 20: tail latency).

Once a model has run a few times, its Runtime holds a large, long-lived object graph: the
decoded chains, task records, replays and their steps, memos, kept plans (ppocr_rec int8: the
process tracks 300-500k objects). CPython's collector runs a full (oldest-generation) collection
when the objects promoted since the last one exceed a quarter of the oldest generation; in a
steady loop each run promotes ~1k short-lived objects, so every ~100-150 runs one run pays a walk
of the whole heap: rec 0.18-0.29 s of CPU, cls 0.07 s (a 35 ms run), invisible in a median.

After a Runtime's 2nd, 4th, 8th, ... run (its working set is built by then: replays start at run
2) :func:`Tracker.after_run` collects the young generations (the first time; later a full
collection, which then walks only what is not frozen: cheap) and moves the heap into the
permanent generation (``gc.freeze``). Later collections, full ones included, walk only the objects
made since. Frozen objects are still freed when their reference count drops; only a cycle among
them that becomes garbage waits for ``gc.unfreeze``. That is bounded by the heap at the freeze,
and released: when a Runtime that was alive at one of our freezes is dropped (a process creating
Runtimes, or recompiling a model, in a loop) the heap is unfrozen, and no Runtime freezes again
until a full collection has run (so the dropped one's cycles are collected first).

A process that froze objects itself keeps its own state: a Runtime does not freeze when the
permanent generation is not empty and not ours, and ours is not unfrozen once it has grown (someone froze on
top). Nothing is done while automatic collection is disabled. Only when objects are freed
changes, never a value. Opt out: ``NPUEMU_GC_FREEZE=0`` (read when a Runtime is made and at each freeze) or
``Runtime(..., gc_freeze=False)``.
"""

from __future__ import annotations

import gc
import os
import weakref

#: the first run count after which a Runtime freezes; later ones at its doubles
FIRST_FREEZE = 2
#: objects a freeze may move beyond those counted (made by callbacks between count and freeze)
SLACK = 64


class _State:
    """Process-wide: the permanent generation is one per interpreter."""

    ours = False         # the permanent generation holds (as far as we know) only what we froze
    count = 0            # gc.get_freeze_count() right after our last freeze
    epoch = 0            # number of our freezes; a Tracker made at epoch e saw freezes > e
    release_pending = False
    collecting = False   # inside a collection (set by _watch): no unfreeze there
    watching = False
    fulls_at_release = -1  # full collections counted at our last release: wait for one more


_state = _State()


def enabled_by_environment() -> bool:
    return os.environ.get("NPUEMU_GC_FREEZE", "1") != "0"


def _full_collections() -> int:
    return gc.get_stats()[-1]["collections"]


def _watch(phase: str, info: dict) -> None:
    """gc callback: a Runtime dropped inside a collection (a Runtime in a cycle) must not unfreeze
    while the collector walks its lists; the release then happens when that collection stops."""
    _state.collecting = phase == "start"
    if phase == "stop" and _state.release_pending:
        _release()


def _release() -> None:
    _state.release_pending = False
    if not _state.ours:
        return
    _state.ours = False
    if gc.get_freeze_count() > _state.count + SLACK:  # someone froze on top of ours: theirs now, left alone
        return
    gc.unfreeze()
    _state.fulls_at_release = _full_collections()


def _dropped(epoch: int) -> None:
    """weakref.finalize callback of a Runtime: it was alive at a freeze if ``epoch`` < the count."""
    if epoch < _state.epoch and _state.ours:
        _state.release_pending = True
        if not _state.collecting:
            _release()


def _freeze() -> str:
    """Freeze the heap (collecting cycles first) unless the caller manages the collector.

    ``gc.get_freeze_count`` walks every frozen object (~50 ms for 500k here), so it is asked only
    while nothing of ours is frozen (then it is 0, or a caller's set: once per Runtime) and once
    after the first freeze; a later freeze adds what it moves (the unfrozen heap, small)."""
    if not gc.isenabled() or not enabled_by_environment():
        return "off"
    if _state.fulls_at_release >= 0 and _full_collections() <= _state.fulls_at_release:
        return "waiting"  # a dropped Runtime's cycles are not collected yet
    if not _state.ours and gc.get_freeze_count():
        return "caller's"  # a caller's own frozen set: theirs to manage
    if not _state.watching:
        gc.callbacks.append(_watch)
        _state.watching = True
    if _state.ours:
        gc.collect()  # walks only what is not frozen: the objects made since our last freeze
        added = sum(len(gc.get_objects(generation)) for generation in range(3))
        gc.freeze()
        _state.count += added
    else:
        gc.collect(1)  # the young generations' cycles; the oldest is the whole heap (too slow)
        gc.freeze()
        _state.count = gc.get_freeze_count()
        _state.ours = True
    _state.epoch += 1
    return "frozen"


def freeze_imported() -> str:
    """Freeze the heap as the runtime's modules finish importing (emulator/gc_import.py), as ours.

    Called with automatic collection paused by the import (the caller's setting is checked
    there); the rules of :func:`_freeze` otherwise: not with ``NPUEMU_GC_FREEZE=0``, not over a
    caller's own frozen set, not twice. Nothing is collected first: the young generations then
    hold the import's objects, whose walk is what this saves."""
    if not enabled_by_environment():
        return "off"
    if _state.ours or gc.get_freeze_count():
        return "caller's"
    gc.freeze()
    if not _state.watching:
        gc.callbacks.append(_watch)
        _state.watching = True
    _state.count, _state.ours = gc.get_freeze_count(), True  # (all of it ours: it was empty; ~4 ms)
    return "frozen"


class Tracker:
    """One Runtime's runs: when it next tries a freeze. ``after_run`` costs a compare per run."""

    __slots__ = ("runs", "next", "__weakref__")

    def __init__(self, runtime: object, enabled: bool = True) -> None:
        self.runs = 0
        self.next = FIRST_FREEZE if enabled else float("inf")
        if enabled:
            finalizer = weakref.finalize(runtime, _dropped, _state.epoch)
            finalizer.atexit = False

    def after_run(self) -> None:
        self.runs += 1
        if self.runs >= self.next:
            done = _freeze()
            if done == "waiting":
                self.next = self.runs + 1  # after a release: retry each run until a full collection ran
            else:  # (a caller's frozen set is counted by walking it: not tried again for this Runtime)
                self.next = float("inf") if done == "caller's" else self.runs * 2
