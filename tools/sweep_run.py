"""A sweep from its file to its rows: the points grouped by build, builds and points scheduled on a
backend (points of a finished build before the next builds, so rows come early and a worker's
emulation of a build serves its next points), one row written as each point finishes."""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuemu.tools.sweep_backends import Task
from npuemu.tools.sweep_rows import CsvRows, results_columns
from npuemu.tools.sweep_spec import Point, SweepSpec, iter_columns, points
from npuemu.tools.sweep_values import VALUE_COLUMNS
from npuemu.tools.sweep_worker import LAYER_COLUMNS, TOTALS, BuildJob, Outcome, PointJob


@dataclass
class Plan:
    """The points still to run, grouped by the build they share."""

    spec: SweepSpec
    builds: dict[str, BuildJob] = field(default_factory=dict)
    members: dict[str, list[Point]] = field(default_factory=dict)  # build key -> its points
    skipped: int = 0


@dataclass
class Summary:
    points: int = 0
    errors: int = 0
    skipped: int = 0
    builds: int = 0
    cached_builds: int = 0
    build_s: float = 0.0
    wall_s: float = 0.0

    def text(self, output: Path) -> str:
        ok = self.points - self.errors
        return (f"{output}: {self.points} point(s) run ({ok} ok, {self.errors} with an error), {self.skipped} already "
                f"there; {self.builds} build(s) ({self.cached_builds} from the cache, {self.build_s:.1f} s "
                f"building); {self.wall_s:.1f} s")


def plan(spec: SweepSpec, done: set[str], cache_dir: Path | None) -> Plan:
    """Group the points not ``done`` by build key (model hash, options, compiler-read overrides)."""
    from npuemu.compiler.driver import compiler_overrides

    result = Plan(spec)
    hashes: dict[str, str] = {}
    dataset = str(spec.resolve(spec.dataset).resolve()) if spec.dataset else None
    for point in points(spec):
        if point.id in done:
            result.skipped += 1
            continue
        model = str(spec.resolve(point.model).resolve())
        compiled = tuple(compiler_overrides(dict(point.overrides)).items())
        job = BuildJob("", model, spec.target_ref, point.dtype, dataset if point.dtype == "int8" else None,
                       point.core_mask, point.batch_size, point.sram, compiled,
                       None if cache_dir is None else str(cache_dir), dataset if spec.values else None,
                       spec.values_samples if spec.values else 0)
        key = _build_key(job, hashes)
        result.builds.setdefault(key, BuildJob(key, *_fields(job)[1:]))
        result.members.setdefault(key, []).append(point)
    return result


def _fields(job: BuildJob) -> list[Any]:
    return [getattr(job, name) for name in BuildJob.__dataclass_fields__]


def _build_key(job: BuildJob, hashes: dict[str, str]) -> str:
    """A hash of everything a build depends on: the model's and the dataset's bytes, the target,
    the options and the overrides the compiler reads (not where the cache is)."""
    parts = [_file_hash(job.model, hashes), _dataset_hash(job.dataset, hashes) if job.dataset else None,
             job.target, _file_hash(job.target, hashes) if Path(job.target).is_file() else None,
             job.dtype, job.core_mask, job.batch_size, job.sram, [list(item) for item in job.overrides]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def _file_hash(path: str, hashes: dict[str, str]) -> str:
    if path not in hashes:
        try:
            hashes[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            hashes[path] = "missing"  # the build reports the missing file, as a row
    return hashes[path]


def _dataset_hash(path: str, hashes: dict[str, str]) -> str:
    """The dataset file and every sample file it names (paths relative to it)."""
    if path not in hashes:
        digest = hashlib.sha256(_file_hash(path, {}).encode())
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        for name in text.split():
            digest.update(_file_hash(str(Path(path).parent / name), {}).encode())
        hashes[path] = digest.hexdigest()
    return hashes[path]


class Sweep:
    """One run of a sweep: its plan, the backend, the result files and the counts."""

    def __init__(self, spec: SweepSpec, output: Path, layers: Path | None, cache_dir: Path | None) -> None:
        swept = list(iter_columns(spec))
        self.spec = spec
        self.rows = CsvRows(output, results_columns(swept, TOTALS + (VALUE_COLUMNS if spec.values else ())))
        done = {row["point"] for row in self.rows.previous}
        self.layers = CsvRows(layers, ["point", *LAYER_COLUMNS], keep=done) if layers else None
        self.plan = plan(spec, done, cache_dir)
        self.summary = Summary(skipped=self.plan.skipped)
        self.build_s: dict[str, float] = {}
        self.values: dict[str, dict[str, Any]] = {}  # build key -> its value columns (values: true)
        self.by_id = {point.id: point for members in self.plan.members.values() for point in members}

    def run(self, backend) -> Summary:
        started = time.perf_counter()
        queue: deque[Task] = deque(Task("build", job) for job in self.plan.builds.values())
        try:
            while queue or backend.busy():
                while queue and backend.room():
                    backend.submit(queue.popleft())
                for task, outcome in backend.completed():
                    queue.extendleft(reversed(self._finished(task, outcome, backend)))
        finally:
            self.summary.wall_s = time.perf_counter() - started
            self.rows.close()
            if self.layers:
                self.layers.close()
        return self.summary

    def _finished(self, task: Task, outcome: Outcome, backend) -> list[Task]:
        """Write what a finished task gives; the point tasks a finished build makes possible."""
        if task.kind == "point":
            self._write(task.job.point, task.job.build, outcome)
            return []
        key = task.job.key
        self.summary.builds += 1
        self.summary.cached_builds += outcome.cached
        self.summary.build_s += outcome.seconds
        self.build_s[key] = 0.0 if outcome.cached else round(outcome.seconds, 4)
        self.values[key] = outcome.values
        if outcome.error is not None:
            for point in self.plan.members[key]:
                self._write(point.id, key, outcome)
            return []
        source = backend.source(task, outcome)
        return [Task("point", PointJob(point.id, key, self.spec.target_ref, point.overrides, self.layers is not None),
                     source) for point in self.plan.members[key]]

    def _write(self, point_id: str, build: str, outcome: Outcome) -> None:
        point = self.by_id[point_id]
        row: dict[str, Any] = {"point": point_id, "target": self.spec.target, **point.columns(), "build": build,
                               "build_s": self.build_s.get(build), "error": outcome.error}
        if outcome.error is None:
            row.update(outcome.totals)
            row.update(self.values.get(build, {}))
        self.summary.points += 1
        self.summary.errors += outcome.error is not None
        if self.layers:
            for layer in outcome.layers:
                self.layers.write({"point": point_id, **layer})
        self.rows.write(row)  # after its layers: a point whose row is there is complete
