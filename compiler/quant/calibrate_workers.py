"""Calibration samples evaluated in parallel worker processes (issue 20: compile time).

Each sample's float evaluation is independent, and what calibration keeps of it merges exactly:
min and max in any order (observers.py keeps the first-seen of equal extremes, so 0.0 and -0.0
come out as a sequential run leaves them), histogram counts are whole numbers. So ``workers``
processes (the calling one as worker 0 and ``workers - 1`` forked ones), worker ``i`` taking
samples ``i, i + workers, ...`` in order, give the same ranges bit for bit as one process, in
about 1/workers of the time on as many idle cores.

Used where the caller asks (``CalibrationOptions.workers``: calibration from a dataset file, as
``npuemu compile --quantize`` does; ``NPUEMU_CALIBRATION_WORKERS`` sets it, 1 turns it off) and
only on Linux (``fork``) with samples that can be picked by index. Each worker costs about one float
evaluation's memory. A failing sample raises the first failing sample's error, as a sequential
run does: every worker runs until its own first failure, so the lowest failing index is seen.
"""

from __future__ import annotations

import copy
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
    """Evaluate samples ``0..total-1`` in ``workers`` processes, this one (worker 0) and
    ``workers - 1`` forked ones, and merge each worker's observers into ``observers`` (in worker
    order; merging is exact in any order). This process takes a share rather than waiting: a
    forked worker first faults in its own copy of every page it writes (the evaluation's
    buffers), which this one has warm: one fork fewer (YOLOX det, 20 samples, two processes:
    calibration 5.68-5.77 -> 5.40-5.73 s of CPU, minor faults 100,000 -> 89,000)."""
    context = multiprocessing.get_context("fork")
    messages = context.Queue()
    workers = min(workers, total)
    own = copy.deepcopy(dict(observers))  # worker 0's observers, as fresh as the forked workers' copies
    sys.stdout.flush()  # a child flushes its inherited buffers when it exits
    sys.stderr.flush()
    processes = {first: context.Process(target=_work, daemon=True,
                                        args=(first, workers, total, pick, observers, evaluate_one, messages))
                 for first in range(1, workers)}
    for process in processes.values():
        process.start()
    state = _Collected({0: own}, [], {0})
    try:
        index = 0
        try:
            for index in range(0, total, workers):
                evaluate_one(pick(index), index, own)
                advance()
                state.drain(messages, advance)
        except Exception as error:  # as a worker does: its first failure (the lowest failing sample wins)
            state.failures.append((index, error))
        state.collect(processes, messages, advance)
    finally:
        for process in processes.values():
            if process.is_alive():
                process.terminate()
            process.join()
    if state.failures:
        raise min(state.failures, key=lambda failure: failure[0])[1]
    for worker in range(workers):
        for name, observer in observers.items():
            observer.merge(state.results[worker][name])


class _Collected:
    """The workers' observers (by worker), failures (sample index, error) and finished workers."""

    def __init__(self, results: dict, failures: list, finished: set) -> None:
        self.results, self.failures, self.finished = results, failures, finished

    def take(self, message: tuple, advance: Callable[[], None]) -> None:
        kind, worker, payload = message
        if kind == "sample":
            advance()
            return
        self.finished.add(worker)
        if kind == "done":
            self.results[worker] = payload
        else:
            self.failures.append(payload)

    def drain(self, messages, advance: Callable[[], None]) -> None:
        """The messages already there (a progress step per sample a worker evaluated)."""
        while True:
            try:
                message = messages.get_nowait()
            except queue.Empty:
                return
            self.take(message, advance)

    def collect(self, processes: dict, messages, advance: Callable[[], None]) -> None:
        """Wait for every forked worker's end; one that dies without a word is an error."""
        while len(self.finished) < len(processes) + 1:
            try:
                message = messages.get(timeout=1.0)
            except queue.Empty:
                for worker, process in processes.items():
                    if worker not in self.finished and process.exitcode is not None:
                        raise CompileError(f"calibration worker {worker} exited with code {process.exitcode} "
                                           f"(out of memory? {WORKERS_ENV}=1 calibrates in one process)")
                continue
            self.take(message, advance)


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
