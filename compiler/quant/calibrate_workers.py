"""Calibration samples evaluated in parallel worker processes (issue 20: compile time).

Each sample's float evaluation is independent, and what calibration keeps of it merges exactly:
min and max in any order (observers.py keeps the first-seen of equal extremes, so 0.0 and -0.0
come out as a sequential run leaves them), histogram counts are whole numbers. So ``workers``
forked processes, worker ``i`` taking samples ``i, i + workers, ...`` in order, give the same
ranges bit for bit as one process, in about 1/workers of the time on as many idle cores.

Used where the caller asks (``CalibrationOptions.workers``: calibration from a dataset file, as
``npuemu compile --quantize`` does; ``NPUEMU_CALIBRATION_WORKERS`` sets it, 1 turns it off) and
only on Linux (``fork``) with samples that can be picked by index. Each worker costs about one float
evaluation's memory. A failing sample raises the first failing sample's error, as a sequential
run does: every worker runs until its own first failure, so the lowest failing index is seen.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from npuemu.isa.errors import CompileError

from .dataset import CalibrationSamples

#: environment override of the default worker count (1: calibrate in this process)
WORKERS_ENV = "NPUEMU_CALIBRATION_WORKERS"
MAX_DEFAULT_WORKERS = 4


def default_workers() -> int:
    """``NPUEMU_CALIBRATION_WORKERS`` if set, else the usable cores, at most 4."""
    value = os.environ.get(WORKERS_ENV, "").strip()
    if value:
        try:
            count = int(value)
        except ValueError:
            raise CompileError(f"{WORKERS_ENV}={value!r}: expected a whole number of processes (1: none)") from None
        if count < 1:
            raise CompileError(f"{WORKERS_ENV}={value!r}: expected 1 or more")
        return count
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def picker(samples: Any) -> Callable[[int], Mapping] | None:
    """A function giving sample ``index`` (read only then), or None when samples have no index."""
    if isinstance(samples, CalibrationSamples):
        return lambda index: samples.load(samples.dataset.entries[index])
    if isinstance(samples, Sequence):
        return samples.__getitem__
    return None


def usable(samples: Any, total: int, workers: int) -> bool:
    """Linux only: elsewhere a forked child of a process that used the system's BLAS (macOS
    Accelerate) or threads is not safe."""
    return (workers > 1 and total > 1 and picker(samples) is not None and sys.platform.startswith("linux")
            and "fork" in multiprocessing.get_all_start_methods())


def run_parallel(total: int, workers: int, pick: Callable[[int], Mapping], observers: Mapping,
                 evaluate_one: Callable[[Mapping, int, Mapping], None], advance: Callable[[], None]) -> None:
    """Evaluate samples ``0..total-1`` in ``workers`` forked processes and merge each worker's
    observers into ``observers`` (in worker order; merging is exact in any order)."""
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    workers = min(workers, total)
    sys.stdout.flush()  # a child flushes its inherited buffers when it exits
    sys.stderr.flush()
    processes = [context.Process(target=_work, args=(first, workers, total, pick, observers, evaluate_one, messages),
                                 daemon=True) for first in range(workers)]
    for process in processes:
        process.start()
    try:
        results, failures = _collect(processes, messages, advance)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()
    if failures:
        raise min(failures, key=lambda failure: failure[0])[1]
    for worker in range(workers):
        for name, observer in observers.items():
            observer.merge(results[worker][name])


def _collect(processes: list, messages, advance: Callable[[], None]) -> tuple[dict, list]:
    """Each worker's observers (by worker) and failures (sample index, error), with a progress
    step per evaluated sample; a worker that dies without a word is an error."""
    results, failures, finished = {}, [], set()
    while len(finished) < len(processes):
        try:
            kind, worker, payload = messages.get(timeout=1.0)
        except queue.Empty:
            for worker, process in enumerate(processes):
                if worker not in finished and process.exitcode is not None:
                    raise CompileError(f"calibration worker {worker} exited with code {process.exitcode} "
                                       f"(out of memory? {WORKERS_ENV}=1 calibrates in one process)")
            continue
        if kind == "sample":
            advance()
            continue
        finished.add(worker)
        if kind == "done":
            results[worker] = payload
        else:
            failures.append(payload)
    return results, failures


def _work(first: int, step: int, total: int, pick: Callable[[int], Mapping], observers: Mapping,
          evaluate_one: Callable[[Mapping, int, Mapping], None], messages) -> None:
    """A worker: samples ``first, first + step, ...`` into its own copy of the observers."""
    index = first
    try:
        for index in range(first, total, step):
            evaluate_one(pick(index), index, observers)
            messages.put(("sample", first, None))
        messages.put(("done", first, dict(observers)))
    except BaseException as error:  # the parent raises it (the lowest failing sample's)
        messages.put(("error", first, (index, _picklable(error))))


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # an exception type that does not pickle: its text in a CompileError
        return CompileError(f"{type(error).__name__}: {error}")
