"""Cycles of one task: ``max(compute, DDR) + (1 - overlap) * min(compute, DDR) + launch``.

compute = the MAC cycles (model H1, npu_cycles.py) of a conv task, or the DPU/PPU unit cycles of
a task without MAC work (unit_cycles.py). In a conv task the CORE and the data DMA overlap by the
platform's ``ddr.compute_overlap`` (1 = fully, the vendor's estimator's Total = max(DDR, NPU) on
all 4284 corpus rows, vendor-corpus README §4.1; fitted per chip to calibration.md). A task
without a conv overlaps fully: its DPU/PPU consumes the read stream and feeds the write stream as
they flow (no CBUF staging), so its time is max(unit, DDR) on every chip (emulator/TIMING.md
"Per task"; the RK3562 Add row takes 0.90 x its DDR cycles, not DDR + unit). ``launch`` is what
the task costs before its units start: the PC fetching its register commands (``regcmd`` bytes at the DDR read rate,
ddr.py) plus the platform's fixed ``launch.task_overhead_cycles`` (dispatch; fitted to
calibration.md by ``npuemu calibrate --fit``). DDR cycles count the data streams only, so the
regcmd bytes are timed once, in the launch (emulator/TIMING.md "One count per byte").
Only the task's decoded register state and its DMA byte counts are used (architecture.md,
"The one rule").

The formula lives in one place, :func:`time_work`: a task's work (:class:`TaskWork`, what the
registers and the DMA say) timed with a set of fitted figures (:class:`TaskFigures`, the
platform's or, in ``npuemu calibrate --fit``, candidates being fitted).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from npuemu.emulator.memo import Memo
from npuemu.emulator.timing.ddr import data_read_bytes, ddr_bytes, ddr_cycles_at, fetch_cycles_at
from npuemu.emulator.timing.npu_cycles import task_npu_cycles
from npuemu.emulator.timing.unit_cycles import conv_output_cycles, unit_cycles


@dataclass(frozen=True)
class TaskTime:
    core: int
    index: int
    npu_cycles: int
    ddr_cycles: int       # data streams (feature, weight, bias, EW, DPU/PPU reads and writes)
    ddr_read_bytes: int   # every byte read, regcmd fetch included
    ddr_write_bytes: int
    overhead_cycles: int  # launch: fixed per-task overhead + regcmd fetch cycles
    macs: int  # MACs of the real work (conv tasks), for MAC usage
    regcmd_bytes: int = 0
    unit_cycles: int = 0  # DPU/PPU cycles of a task without MAC work (not in the NPUCycles column)
    serial_cycles: int = 0  # the part of min(compute, DDR) not hidden by the overlap
    sram_hit_bytes: int = 0  # bytes read from or written to SRAM instead of DDR (no DDR cycles)

    # Cached on the (frozen) instance: a report reads them several times per task, and the
    # timeline hands out the same TaskTime for a task that repeats its run (timeline._TIMED).
    @functools.cached_property
    def compute_cycles(self) -> int:
        return max(self.npu_cycles, self.unit_cycles)

    @functools.cached_property
    def max_cycles(self) -> int:
        return max(self.compute_cycles, self.ddr_cycles) + self.serial_cycles

    @functools.cached_property
    def cycles(self) -> int:
        return self.max_cycles + self.overhead_cycles


@dataclass(frozen=True)
class TaskWork:
    """What one task does, from its registers and its DMA counters: independent of the fitted
    figures, so calibration can time the same work with candidate figures."""

    core: int
    index: int
    npu_cycles: int
    unit_cycles: int      # DPU/PPU cycles of a task without a conv (0 for a conv task)
    data_read_bytes: int  # DDR reads of the data streams (no regcmd fetch)
    write_bytes: int      # DDR writes
    regcmd_bytes: int
    conv: bool = True     # a CNA/CORE task (its output bound and overlap apply)
    macs: int = 0
    sram_hit_bytes: int = 0
    output_bytes: int | None = None  # every byte the DPU/PPU wrote, SRAM included (None: write_bytes)

    @property
    def written(self) -> int:
        """Bytes a conv task's output path writes (the output bound), wherever they go."""
        return self.write_bytes if self.output_bytes is None else self.output_bytes


@dataclass(frozen=True)
class TaskFigures:
    """The fitted figures the task formula uses (platform YAML ``ddr``, ``launch``, ``cycle_model``)."""

    read_bytes_per_cycle: float
    write_bytes_per_cycle: float
    compute_overlap: float
    task_overhead_cycles: int
    conv_write_bytes_per_cycle: float | None = None

    @classmethod
    def of(cls, platform) -> TaskFigures:
        """The platform's figures: one object per (frozen) platform, so timings memoised by
        the figures' identity (timeline._TIMED) are found again on the next report."""
        return _FIGURES(platform) if cls is TaskFigures else _figures_of(cls, platform)


def _figures_of(cls, platform) -> TaskFigures:
    ddr = platform.ddr
    return cls(ddr.read_bytes_per_cycle, ddr.write_bytes_per_cycle, ddr.compute_overlap,
               platform.launch.task_overhead_cycles, platform.cycle_model.conv_write_bytes_per_cycle)


_FIGURES: Memo[TaskFigures] = Memo(lambda platform: _figures_of(TaskFigures, platform), identity=1)


def serial_part(compute: int, ddr: int, overlap: float, conv: bool = True) -> int:
    """Cycles of the shorter of compute and DMA that the overlap (``ddr.compute_overlap``) does
    not hide (none without a conv)."""
    return round((1.0 - overlap) * min(compute, ddr)) if conv else 0


def task_work(record, platform) -> TaskWork:
    """The figure-independent work of a :class:`~npuemu.emulator.core.TaskRecord` (records and
    platforms are frozen: worked out once per pair, emulator/memo.py; the core hands out the
    same record again for a task that repeats its last run)."""
    return _WORK(record, platform)


def _task_work(record, platform) -> TaskWork:
    traffic = record.traffic
    conv = record.conv is not None
    return TaskWork(record.core, record.index, task_npu_cycles(record, platform),
                    0 if conv else unit_cycles(record, platform), data_read_bytes(traffic),
                    ddr_bytes(traffic)[1], traffic.regcmd_read, conv,
                    record.conv.macs if conv else 0, traffic.sram_hit_reads + traffic.sram_hit_writes,
                    traffic.write_bytes)


_WORK: Memo[TaskWork] = Memo(_task_work, identity=2, limit=1 << 16)


def time_work(work: TaskWork, fig: TaskFigures) -> TaskTime:
    """The task formula (module note), the one place it is written."""
    unit = conv_output_cycles(work.written, fig.conv_write_bytes_per_cycle) if work.conv else work.unit_cycles
    ddr = ddr_cycles_at(work.data_read_bytes, work.write_bytes, fig.read_bytes_per_cycle, fig.write_bytes_per_cycle)
    launch = fig.task_overhead_cycles + fetch_cycles_at(work.regcmd_bytes, fig.read_bytes_per_cycle)
    return TaskTime(work.core, work.index, work.npu_cycles, ddr, work.data_read_bytes + work.regcmd_bytes,
                    work.write_bytes, launch, work.macs, work.regcmd_bytes, unit,
                    serial_part(max(work.npu_cycles, unit), ddr, fig.compute_overlap, work.conv),
                    work.sram_hit_bytes)


def time_task(record, platform) -> TaskTime:
    return time_work(task_work(record, platform), TaskFigures.of(platform))


def time_tasks(records: Iterable, platform) -> tuple[TaskTime, ...]:
    return tuple(time_task(record, platform) for record in records)
