"""The work of one sweep task, run in a worker process (local pool or Ray): a build, or the timing
report of one point.

A build is what ``npuemu compile`` makes of the point's model and options with the platform keys
the compiler reads (compiler/driver.py ``compiler_overrides``); it is cached on disk by its key, so
every point that differs only in figures the timing model reads shares it. A point is timed as
``npuemu perf`` times a .npu: the build emulated on zero inputs (once per build and worker process:
the DMA byte counts and register states do not depend on the timing figures), then the report
(emulator/timing/report.py) under the point's full platform. With ``values: true`` the build task
also runs the build on the dataset's first samples against the float model (tools/sweep_values.py):
once per build, its value columns go to every row of the build.

Failures are results, not exceptions: :func:`execute` returns an :class:`Outcome` with the error
text, so one bad point becomes one error row (a worker process that dies is the backend's concern).
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BuildJob:
    key: str  # the cache key: model hash, options and the compiler-read overrides
    model: str  # absolute path of the ONNX model
    target: str
    dtype: str
    dataset: str | None
    core_mask: str
    batch_size: int
    sram: bool
    overrides: tuple[tuple[str, Any], ...]  # the keys the compiler reads
    cache_dir: str | None  # where builds are kept (None: only returned as bytes)
    samples: str | None = None  # values: true: the dataset file whose first lines the build is run on
    values_samples: int = 0  # how many of its lines (0: no value columns)


@dataclass(frozen=True)
class PointJob:
    point: str  # Point.id
    build: str  # BuildJob.key
    target: str
    overrides: tuple[tuple[str, Any], ...]  # all of the point's platform keys
    layers: bool = False  # return per-layer rows too


@dataclass
class Outcome:
    error: str | None = None
    seconds: float = 0.0
    path: str | None = None  # a build kept in the cache directory
    cached: bool = False  # the build came from the cache
    totals: dict[str, Any] = field(default_factory=dict)
    layers: list[dict[str, Any]] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # a build's value columns (values: true)


def execute(kind: str, job: Any, source: Any = None) -> Outcome:
    """Run one task; any exception becomes the outcome's error (looked up by name at call time)."""
    started = time.perf_counter()
    try:
        outcome = globals()[kind](job, source)
    except Exception as error:  # noqa: BLE001 - every failure of one point is that point's row
        outcome = Outcome(error=_error_text(error))
    outcome.seconds = outcome.seconds or time.perf_counter() - started
    return outcome


def _error_text(error: Exception) -> str:
    from npuemu.isa.errors import NpuemuError

    if isinstance(error, NpuemuError):
        return str(error)
    where = traceback.extract_tb(error.__traceback__)[-1:]  # an internal error: say where
    place = f" ({Path(where[0].filename).name}:{where[0].lineno})" if where else ""
    return f"{type(error).__name__}: {error}{place}"


# --- builds ------------------------------------------------------------------------------------

def build(job: BuildJob, _source: Any = None) -> Outcome:
    """The model file of a build job, from the cache directory when it is there; with values: true,
    also its value columns (tools/sweep_values.py: once per build, shared by its points)."""
    cached = _cache_path(job)
    if cached is not None and cached.is_file():
        return _with_values(job, Outcome(path=str(cached), cached=True, seconds=0.0), None)
    started = time.perf_counter()
    data = compile_job(job).to_bytes()
    seconds = time.perf_counter() - started
    if cached is None:
        return _with_values(job, Outcome(seconds=seconds, totals={"bytes": data}), data)
    _write_atomically(cached, data)
    return _with_values(job, Outcome(path=str(cached), seconds=seconds), data)


def _with_values(job: BuildJob, outcome: Outcome, data: bytes | None) -> Outcome:
    """The outcome with the build's value columns when the sweep asks for them; the seconds the
    build took stay the compile's."""
    if not job.values_samples:
        return outcome
    from npuemu.isa.container import ModelFile
    from npuemu.tools.sweep_values import build_values

    model = ModelFile.from_bytes(data) if data is not None else ModelFile.read(outcome.path)
    outcome.values = build_values(model, job)
    return outcome


def compile_job(job: BuildJob):
    """The build as `npuemu compile MODEL -t TARGET --quantize --dataset DS | --fp16 --core-mask ...
    --set KEY=VALUE ...` makes it."""
    from npuemu.compiler.driver import CompileOptions, compile_model

    options = CompileOptions(precision=job.dtype, dataset=job.dataset if job.dtype == "int8" else None,
                             core_mask=job.core_mask, sram=job.sram, batch_size=job.batch_size,
                             name=Path(job.model).stem, platform_overrides=dict(job.overrides))
    return compile_model(job.model, job.target, options)


def _cache_path(job: BuildJob) -> Path | None:
    return None if job.cache_dir is None else Path(job.cache_dir) / f"{job.key}.npu"


def _write_atomically(path: Path, data: bytes) -> None:
    """Two workers building the same key both succeed; readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".part")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


# --- points ------------------------------------------------------------------------------------

#: build key -> (model file, chain runs): the emulations this worker process keeps
_EMULATED: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
_KEEP = 2


def point(job: PointJob, source: Any) -> Outcome:
    """The timing report of one point; ``source`` is the build's path, its bytes, or a callable
    giving them (a Ray object fetched only when this worker has not emulated the build yet)."""
    from npuemu.compiler.driver import target_platform
    from npuemu.emulator.timing.report import report_npu

    started = time.perf_counter()
    model, runs, emulate_s = _emulation(job, source)
    platform = target_platform(job.target, dict(job.overrides))
    report = report_npu(model, runs, platform)
    outcome = Outcome(totals=row_totals(report, model, platform))
    outcome.totals.update(emulate_s=round(emulate_s, 4),
                          timing_s=round(time.perf_counter() - started - emulate_s, 4))
    if job.layers:
        outcome.layers = [_layer_row(report, layer) for layer in report.layers]
    return outcome


def _emulation(job: PointJob, source: Any) -> tuple[Any, Any, float]:
    """(model, runs, seconds spent emulating now): the build run once on zero inputs as `npuemu
    perf` runs it, on its compiled platform (the overrides it records)."""
    if job.build in _EMULATED:
        _EMULATED.move_to_end(job.build)
        return (*_EMULATED[job.build], 0.0)
    from npuemu.compiler.driver import target_platform
    from npuemu.emulator.runtime import Runtime
    from npuemu.isa.container import ModelFile

    started = time.perf_counter()
    data = source() if callable(source) else source
    model = ModelFile.read(data) if isinstance(data, str) else ModelFile.from_bytes(data)
    runtime = Runtime(model, target_platform(job.target, dict(model.platform().overrides)))
    for name in runtime.inputs:
        runtime.set_input(name, runtime.zero_input(name))
    runtime.run()
    _EMULATED[job.build] = (model, runtime.runs)
    while len(_EMULATED) > _KEEP:
        _EMULATED.popitem(last=False)
    return model, runtime.runs, time.perf_counter() - started


#: the totals of a results row, in column order
TOTALS = ("time_us", "cycles", "npu_cycles", "ddr_cycles", "ddr_read_bytes", "ddr_write_bytes", "ddr_bytes",
          "sram_hit_bytes", "macs", "mac_usage_percent", "tasks", "cpu_time_us", "weight_bytes", "internal_bytes")


def row_totals(report, model, platform) -> dict[str, Any]:
    """A point's totals: the report's (the timeline's frame time), MACs and memory."""
    totals = report.totals()
    macs = sum(layer.macs for layer in report.layers)
    row = {key: totals[key] for key in ("time_us", "cycles", "npu_cycles", "ddr_cycles", "ddr_read_bytes",
                                        "ddr_write_bytes", "sram_hit_bytes", "tasks", "cpu_time_us")}
    row["time_us"] = round(row["time_us"], 3)
    row["cpu_time_us"] = round(row["cpu_time_us"], 3)
    row["ddr_bytes"] = row["ddr_read_bytes"] + row["ddr_write_bytes"]
    row["macs"] = macs
    row["mac_usage_percent"] = _mac_usage(report, platform, macs)
    row.update(_memory(model))
    return {key: row[key] for key in TOTALS}


def _mac_usage(report, platform, macs: int) -> float | None:
    """MACs done over the MACs the cores the build uses could do in the frame's NPU cycles, in %."""
    rates = [layer.mac_rate for layer in report.layers if layer.mac_rate]
    cores = {core for layer in report.layers for core in layer.cores} or {0}
    cycles = report.totals()["cycles"]
    if not rates or not cycles:
        return None
    return round(100.0 * macs / (cycles * max(rates) * len(cores)), 3)


def _memory(model) -> dict[str, int]:
    """Weight and internal-tensor bytes, as `npuemu mem` counts them (its memory map areas)."""
    areas = model.memory_map().areas
    return {"weight_bytes": sum(a.size for a in areas if a.name == "weights"),
            "internal_bytes": sum(a.size for a in areas if a.name == "internal")}


#: the columns of a per-layer row after ``point`` (the perf JSON's names)
LAYER_COLUMNS = ("id", "op_type", "data_type", "target", "full_name", "npu_cycles", "ddr_cycles", "cycles",
                 "ddr_read_bytes", "ddr_write_bytes", "sram_hit_bytes", "macs", "mac_usage_percent", "time_us",
                 "tasks")


def _layer_row(report, layer) -> dict[str, Any]:
    figures = report.layer_json(layer)
    return {key: figures[key] for key in LAYER_COLUMNS}
