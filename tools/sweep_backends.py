"""Where sweep tasks run: ``local`` (a process pool on this machine) or ``ray`` (one Ray task per
build and per point, on a local Ray instance or an existing cluster).

Both give the scheduler (tools/sweep_run.py) the same four calls: ``room()`` (may it submit),
``submit(task)``, ``completed()`` (block until tasks finish; their outcomes) and ``close()``;
``source(task, outcome)`` says how the points of a finished build get its model file.

A worker that dies has its task retried once. The local pool cannot tell which of its running
tasks killed it, so it keeps at most ``workers`` tasks in flight and, after a death, runs the tasks
that were in flight again one at a time: a task that kills its worker again on its own is the
culprit, and becomes an error row. Ray retries a task whose worker died itself (``max_retries=1``).
"""

from __future__ import annotations

import concurrent.futures as futures
from collections import deque
from dataclasses import dataclass
from typing import Any

from npuemu.tools import sweep_worker
from npuemu.tools.sweep_worker import Outcome

DIED = "the worker process died running this task, and again on its retry"


@dataclass
class Task:
    kind: str  # "build" or "point" (sweep_worker function names)
    job: Any
    source: Any = None  # a point's build: path, bytes or Ray reference
    deaths: int = 0  # worker deaths while this task was in flight


class LocalBackend:
    """A process pool of ``workers`` processes (fork: a worker starts with this process's imports)."""

    def __init__(self, workers: int) -> None:
        self.workers = max(1, workers)
        self._pool = self._new_pool()
        self._in_flight: dict[futures.Future, Task] = {}
        self._retry: deque[Task] = deque()  # run alone, one at a time

    def _new_pool(self) -> futures.ProcessPoolExecutor:
        import multiprocessing

        return futures.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))

    def room(self) -> bool:
        return not self._retry and len(self._in_flight) < self.workers

    def busy(self) -> bool:
        return bool(self._in_flight or self._retry)

    def submit(self, task: Task) -> None:
        future = self._pool.submit(sweep_worker.execute, task.kind, task.job, task.source)
        self._in_flight[future] = task

    def source(self, task: Task, outcome: Outcome) -> Any:
        return outcome.path if outcome.path is not None else outcome.totals["bytes"]

    def completed(self) -> list[tuple[Task, Outcome]]:
        if not self._in_flight and self._retry:
            self.submit(self._retry.popleft())
        done, _ = futures.wait(self._in_flight, return_when=futures.FIRST_COMPLETED)
        finished: list[tuple[Task, Outcome]] = []
        for future in done:
            if future not in self._in_flight:
                continue  # already counted by _died with the rest of a broken pool
            task = self._in_flight.pop(future)
            error = future.exception()
            if isinstance(error, futures.process.BrokenProcessPool):
                finished += self._died(task)
            elif error is not None:  # not raised by the task (execute catches those): pickling, ...
                finished.append((task, Outcome(error=f"{type(error).__name__}: {error}")))
            else:
                finished.append((task, future.result()))
        return finished

    def _died(self, task: Task) -> list[tuple[Task, Outcome]]:
        """The pool broke: every task in flight with it is suspect; retry each alone once."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = self._new_pool()
        suspects = [task, *self._in_flight.values()]
        self._in_flight.clear()
        finished = []
        for suspect in suspects:
            suspect.deaths += 1
            if suspect.deaths >= 2:
                finished.append((suspect, Outcome(error=DIED)))
            else:
                self._retry.append(suspect)
        return finished

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class RayBackend:
    """Ray tasks: on the cluster at ``address``, else on a local Ray instance started here (and
    stopped by :meth:`close`). Builds return the model file's bytes as a Ray object the point tasks
    take by reference, so no file system needs to be shared."""

    def __init__(self, workers: int | None, address: str | None) -> None:
        import ray

        from npuemu.isa.errors import ConfigError

        self._ray = ray
        if address:
            ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        else:
            ray.init(num_cpus=workers or None, include_dashboard=False, ignore_reinit_error=True,
                     log_to_driver=False)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        if cpus < 1:
            raise ConfigError("the Ray cluster offers no CPU")
        self.workers = workers or cpus
        self._build = ray.remote(num_returns=2, max_retries=1)(_ray_build)
        self._point = ray.remote(max_retries=1)(_ray_point)
        self._in_flight: dict[Any, tuple[Task, Any]] = {}

    def room(self) -> bool:
        return len(self._in_flight) < 2 * self.workers  # a second task queued per worker keeps it busy

    def busy(self) -> bool:
        return bool(self._in_flight)

    def submit(self, task: Task) -> None:
        if task.kind == "build":
            outcome, data = self._build.remote(task.job)
            self._in_flight[outcome] = (task, data)
        else:  # the reference in a list: Ray passes it unresolved, the worker fetches it if needed
            self._in_flight[self._point.remote(task.job, [task.source])] = (task, None)

    def source(self, task: Task, outcome: Outcome) -> Any:
        return outcome.totals.pop("data_ref")

    def completed(self) -> list[tuple[Task, Outcome]]:
        ready, _ = self._ray.wait(list(self._in_flight), num_returns=1)
        finished = []
        for ref in ready:
            task, data = self._in_flight.pop(ref)
            try:
                outcome = self._ray.get(ref)
            except self._ray.exceptions.RayError as error:  # the worker died twice (one retry)
                outcome = Outcome(error=f"{DIED} (Ray: {type(error).__name__})")
            if task.kind == "build" and outcome.error is None:
                outcome.totals["data_ref"] = data
            finished.append((task, outcome))
        return finished

    def close(self) -> None:
        self._ray.shutdown()


def _ray_build(job) -> tuple[Outcome, bytes | None]:
    outcome = sweep_worker.execute("build", job)
    data = outcome.totals.pop("bytes", None)
    if data is None and outcome.path is not None:
        with open(outcome.path, "rb") as source:
            data = source.read()
    return outcome, data


def _ray_point(job, boxed: list) -> Outcome:
    import ray

    return sweep_worker.execute("point", job, lambda: ray.get(boxed[0]))


def backend(name: str, workers: int | None, address: str | None):
    """The backend by name; Ray is an optional extra and says how to install it."""
    import os

    from npuemu.isa.errors import ConfigError

    if name == "local":
        if address:
            raise ConfigError("--address names a Ray cluster: use it with --backend ray")
        return LocalBackend(workers or os.cpu_count() or 1)
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError('--backend ray needs Ray: pip install -e ".[ray]" (or pip install ray)') from None
    return RayBackend(workers, address)
