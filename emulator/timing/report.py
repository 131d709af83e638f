"""Per-layer timing: the tasks of each layer summed, in the columns of the vendor's perf table.

Layers only label and group tasks (architecture.md, "The one rule"): for an npuemu ``.npu``
file a layer's tasks are its ``trailer.graph.layers[].tasks`` ranges (isa/CONTAINER.md); for a
vendor ``.rknn`` file each task record's ``op_idx`` names its layer (isa/rknn/describe.py).
Shapes and types come from the model file's tensor table, for the report only.

Columns: DDRCycles, NPUCycles and MaxCycles are sums over the layer's tasks of the task figures
(emulator/TIMING.md); Time(us) = sum of task cycles (max + launch overhead) / ``clock.npu_mhz``;
MacUsage(%) = real MACs / (MaxCycles * MACs per cycle of the precision); RW(KB) = bytes read / 1024
(vendor-corpus README §4.2: the vendor's RW(KB) is bytes read).

``ddr_model="vendor"`` reproduces librknnc's static estimate instead (vendor_estimate.py): per
layer DDRCycles = its byte count at the vendor's rate (conv-type layers only, else 0),
MaxCycles = max(DDR, NPU), Time = MaxCycles at the clock, no launch overhead.

The totals (cycles, time, host time) are read from the run's :class:`~npuemu.emulator.timing.
timeline.Timeline`, the one placement of every schedule step that ``run``, ``trace`` and
``calibrate`` read too; the layer rows label its task spans. A split layer's row takes its cores
side by side by the timeline's rule (``concurrent_cycles``); a report without a timeline (one
built by hand, tools/matmul.py) sums its rows.

``report_npu`` works its rows out once per timeline (a steady run hands out the same records, so
the same timeline) and gives each report its own copies when its ``layers`` are first read; a
report whose rows were never read answers ``totals()`` from figures kept with the rows (issue 20:
the benchmark reads only the totals after every inference).
"""

from __future__ import annotations


from collections.abc import Sequence
from dataclasses import dataclass, field

from npuemu.emulator.memo import Memo
from npuemu.emulator.timing.model_index import model_index, shape_text
from npuemu.emulator.timing.task_time import TaskTime
from npuemu.emulator.timing.timeline import Span, Timeline, concurrent_cycles, timeline_npu, timeline_rknn
from npuemu.emulator.units.state import PRECISION_NAMES


@dataclass
class LayerTime:
    id: int
    op_type: str
    data_type: str
    target: str
    input_shapes: str
    output_shape: str
    full_name: str
    tasks: list[TaskTime] = field(default_factory=list)
    mac_rate: int = 0  # MACs per cycle of the layer's conv precision (0: no conv)
    vendor_ddr: int | None = None  # set in the vendor-estimate mode: librknnc's per-layer DDR cycles
    vendor_npu: int | None = None  # set in the vendor-estimate mode: H1 over the layer's whole plane
    host_us: float = 0.0  # a CPU step's host time (host_model.py); 0 for NPU layers
    cores: list[int] = field(default_factory=list)  # the core of each task (empty: all on one core)
    shared_ddr_rate: float | None = None  # platform ddr.shared_bytes_per_cycle (split layers only)

    def _per_core(self, cycles_of) -> dict[int, int]:
        per_core: dict[int, int] = {}
        for task, core in zip(self.tasks, self.cores or [0] * len(self.tasks)):
            per_core[core] = per_core.get(core, 0) + cycles_of(task)
        return per_core

    @property
    def split(self) -> bool:
        cores = self.cores  # (a set only for a layer of several tasks: the report asks per layer and run)
        return len(cores) > 1 and len(set(cores)) > 1

    def _concurrent(self, cycles_of) -> int:
        """Cores run their shares together: the layer takes the longest core, or - with a shared
        DDR rate on the platform - the time the DDR needs for all the cores' bytes if that is
        longer (TIMING.md, multi-core)."""
        if not self.split:
            return sum(cycles_of(t) for t in self.tasks)
        moved = sum(t.ddr_read_bytes + t.ddr_write_bytes for t in self.tasks)
        return concurrent_cycles(self._per_core(cycles_of), moved, self.shared_ddr_rate)

    def speedup(self) -> float:
        """A split layer's theoretical speed-up: its tasks' cycles on one core over its cycles as split."""
        return self.single_core_cycles / self.cycles if self.split and self.cycles else 1.0

    def workload(self) -> dict[int, float]:
        """Share of the layer's MACs (or, without MACs, of its task cycles) per core, in %."""
        key = (lambda t: t.macs) if self.macs else (lambda t: t.cycles)
        per_core = self._per_core(key)
        total = sum(per_core.values())
        return {core: 100.0 * value / total for core, value in sorted(per_core.items())} if total else {}

    @property
    def single_core_cycles(self) -> int:
        return sum(t.cycles for t in self.tasks) if self.vendor_ddr is None else self.cycles

    @property
    def npu_cycles(self) -> int:
        if self.vendor_npu is not None:
            return self.vendor_npu
        return sum(t.npu_cycles for t in self.tasks)

    @property
    def ddr_cycles(self) -> int:
        if self.vendor_ddr is not None:
            return self.vendor_ddr
        return sum(t.ddr_cycles for t in self.tasks)

    @property
    def max_cycles(self) -> int:
        if self.vendor_ddr is not None:
            return max(self.npu_cycles, self.vendor_ddr)
        return self._concurrent(lambda t: t.max_cycles)

    @property
    def cycles(self) -> int:
        if self.vendor_ddr is not None:
            return self.max_cycles
        return self._concurrent(lambda t: t.cycles)

    @property
    def ddr_read_bytes(self) -> int:
        return sum(t.ddr_read_bytes for t in self.tasks)

    @property
    def ddr_write_bytes(self) -> int:
        return sum(t.ddr_write_bytes for t in self.tasks)

    @property
    def macs(self) -> int:
        return sum(t.macs for t in self.tasks)

    @property
    def sram_hit_bytes(self) -> int:
        return sum(t.sram_hit_bytes for t in self.tasks)

    def mac_usage(self) -> float | None:
        if not self.mac_rate or not self.max_cycles:
            return None
        return 100.0 * self.macs / (self.max_cycles * self.mac_rate)


@dataclass
class PerfReport:
    model: str
    platform: str
    npu_mhz: float
    layers: list[LayerTime]
    unassigned: list[TaskTime] = field(default_factory=list)  # tasks no layer claims
    notes: list[str] = field(default_factory=list)
    ddr_model: str = "board"  # "board": fitted board model; "vendor": librknnc's static estimate
    host_submit_overhead_us: float = 0.0  # the platform's launch.host_submit_overhead_us
    layer_overhead_us: float = 0.0  # added per NPU layer (perf --profile-layers: per-layer profiling)
    batch: dict = field(default_factory=lambda: {"size": 1, "contexts": 1})  # trailer "batch" (multi-batch builds)
    core_count: int = 3  # the chip's NPU cores: the WorkLoad column's title (guide: 0/1/2 on RK3588, 0/1 on RK3576)
    timeline: Timeline | None = None  # the run's one timeline: the board totals come from it
    # what the figures rest on (explain.py): the DDR model used and the time model's error band
    ddr_info: dict = field(default_factory=dict)
    time_band: dict = field(default_factory=dict)

    def explain(self, platform) -> "PerfReport":
        """Fill ``ddr_info`` and ``time_band`` from the platform the report was timed with (each report its
        own copies of the texts worked out once per platform and DDR model: a report follows every inference)."""
        (info, info_lists), (band, band_lists) = _EXPLAINED(platform, self.ddr_model)
        self.ddr_info, self.time_band = _copied(info, info_lists), _copied(band, band_lists)
        return self

    def header_lines(self) -> list[str]:
        """The lines perf prints above its table: the DDR model and the time figures' error band."""
        lines = [self.ddr_info["text"]] if self.ddr_info else []
        return lines + ([f"Time(us) error band: {self.time_band['text']}"] if self.time_band else [])

    def _extra_us(self, layer: LayerTime) -> float:
        """Time beyond the layer's task cycles: the profiled host submit and a CPU step's host time."""
        return (self.layer_overhead_us if layer.tasks else 0.0) + layer.host_us

    def layer_time_us(self, layer: LayerTime) -> float:
        return self.time_us(layer.cycles) + self._extra_us(layer)

    def time_us(self, cycles: int) -> float:
        return cycles / self.npu_mhz

    @property
    def all_tasks(self) -> list[TaskTime]:
        return [t for layer in self.layers for t in layer.tasks] + list(self.unassigned)

    def totals(self) -> dict:
        source = self.__dict__.get("_row_source")
        if source is not None and self.__dict__.get("_layers") is None:
            # rows not handed out yet (report_npu): the totals of the memoised rows they would copy
            known = source.totals(self)
            if known is not None:
                return dict(known)
        return self._totals(self.layers, self.unassigned)

    def _totals(self, layers: Sequence[LayerTime], unassigned: Sequence[TaskTime]) -> dict:
        parts = list(layers) + list(unassigned)  # both have the cycle properties
        cycles, time_us, cpu_us = self._frame(parts, layers)
        # one pass (this runs after every inference): a layer row on one core without the
        # vendor's estimate is the plain sum of its tasks' figures, the properties' own rule;
        # the byte counts are every task's (all_tasks: the layers', then the unassigned ones)
        npu = ddr = longest = single = read = written = sram = count = 0
        for part in parts:
            if not isinstance(part, LayerTime):
                npu, ddr, longest, single = (npu + part.npu_cycles, ddr + part.ddr_cycles,
                                             longest + part.max_cycles, single + part.cycles)
                read, written, sram = (read + part.ddr_read_bytes, written + part.ddr_write_bytes,
                                       sram + part.sram_hit_bytes)
                count += 1
                continue
            tasks = part.tasks
            count += len(tasks)
            if part.vendor_ddr is not None or part.vendor_npu is not None or part.split:
                npu, ddr, longest, single = (npu + part.npu_cycles, ddr + part.ddr_cycles,
                                             longest + part.max_cycles, single + part.single_core_cycles)
                for task in tasks:
                    read, written, sram = (read + task.ddr_read_bytes, written + task.ddr_write_bytes,
                                           sram + task.sram_hit_bytes)
                continue
            for task in tasks:
                npu, ddr, longest, single = (npu + task.npu_cycles, ddr + task.ddr_cycles,
                                             longest + task.max_cycles, single + task.cycles)
                read, written, sram = (read + task.ddr_read_bytes, written + task.ddr_write_bytes,
                                       sram + task.sram_hit_bytes)
        return {"npu_cycles": npu, "ddr_cycles": ddr, "max_cycles": longest, "cycles": cycles,
                "ddr_read_bytes": read, "ddr_write_bytes": written, "sram_hit_bytes": sram,
                "time_us": time_us, "single_core_cycles": single, "cpu_time_us": cpu_us,
                "tasks": count, "ddr_model": self.ddr_model}

    def _frame(self, parts: list, layers: Sequence[LayerTime]) -> tuple[int, float, float]:
        """(NPU cycles, time in us, host us) of the frame: the timeline's end (board model), plus
        the per-layer host submit of ``--profile-layers``, which the timeline does not place; the
        vendor's static estimate (and a report without a timeline) sums its layer rows."""
        if self.timeline is not None and self.ddr_model == "board":
            profiled = sum(self.layer_overhead_us for layer in layers if layer.tasks)
            return self.timeline.npu_cycles, self.timeline.total_us + profiled, self.timeline.host_us
        cycles = sum(p.cycles for p in parts)
        time_us = self.time_us(cycles) + sum(self._extra_us(layer) for layer in layers)
        return cycles, time_us, sum(layer.host_us for layer in layers)

    def speedup(self) -> float:
        """Theoretical speed-up of the multi-core split: the model's cycles if every task ran on
        one core, over its cycles as split (1.0 for a single-core model)."""
        totals = self.totals()
        return totals["single_core_cycles"] / totals["cycles"] if totals["cycles"] else 1.0

    def ranking(self) -> list[dict]:
        """The vendor's "Operator Time Consuming Ranking Table": per OpType the layers (CallNumber),
        host and NPU time, total and its share of the frame, longest first (no GPU: 0)."""
        rows: dict[str, dict] = {}
        for layer in self.layers:
            row = rows.setdefault(layer.op_type, {"op_type": layer.op_type, "calls": 0, "cpu_time_us": 0.0,
                                                  "gpu_time_us": 0.0, "npu_time_us": 0.0})
            row["calls"] += 1
            spent = self.layer_time_us(layer)
            row["cpu_time_us" if layer.target.upper() == "CPU" and not layer.tasks else "npu_time_us"] += spent
        frame = sum(row["cpu_time_us"] + row["npu_time_us"] for row in rows.values())
        for row in rows.values():
            row["total_time_us"] = row["cpu_time_us"] + row["gpu_time_us"] + row["npu_time_us"]
            row["time_ratio_percent"] = 100.0 * row["total_time_us"] / frame if frame else 0.0
        return sorted(rows.values(), key=lambda row: (-row["total_time_us"], row["op_type"]))

    def layer_json(self, layer: LayerTime) -> dict:
        """One layer's raw figures under the plain names of the JSON/CSV schema (TIMING.md, reports)."""
        return {"id": layer.id, "op_type": layer.op_type, "data_type": layer.data_type,
                "target": layer.target, "input_shapes": layer.input_shapes,
                "output_shape": layer.output_shape, "full_name": layer.full_name,
                "npu_cycles": layer.npu_cycles, "ddr_cycles": layer.ddr_cycles,
                "max_cycles": layer.max_cycles, "cycles": layer.cycles,
                "ddr_read_bytes": layer.ddr_read_bytes, "ddr_write_bytes": layer.ddr_write_bytes,
                "sram_hit_bytes": layer.sram_hit_bytes,
                "macs": layer.macs, "mac_usage_percent": layer.mac_usage(),
                "time_us": self.layer_time_us(layer), "host_us": layer.host_us,
                "tasks": len(layer.tasks),
                "workload": {str(core): share for core, share in layer.workload().items()},
                "speedup": layer.speedup()}

    def to_csv(self) -> str:
        """The JSON's layers as CSV rows (same names; ``workload`` as one ``workload_core<k>`` column per
        core), then a ``total`` row with the totals' figures under the same column names."""
        import csv
        import io

        cores = sorted({int(c) for layer in self.layers for c in layer.workload()}) or [0]
        rows = []
        for layer in self.layers:
            row = self.layer_json(layer)
            workload = row.pop("workload")
            rows.append(row | {f"workload_core{c}": workload.get(str(c), "") for c in cores})
        columns = list(rows[0]) if rows else list(self.layer_json(LayerTime(0, "", "", "", "", "", "")))
        totals = self.totals()
        rows.append({key: totals.get(key, "") for key in columns} | {"id": "total", "speedup": self.speedup()})
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row.get(key, "") for key in columns})
        return out.getvalue()

    def to_json(self) -> dict:
        layers = [self.layer_json(layer) for layer in self.layers]
        return {"model": self.model, "platform": self.platform, "npu_mhz": self.npu_mhz,
                "ddr_model": self.ddr_model, "ddr_model_info": dict(self.ddr_info), "time_band": dict(self.time_band),
                "layer_overhead_us": self.layer_overhead_us, "layers": layers,
                "unassigned_tasks": len(self.unassigned), "totals": self.totals(), "speedup": self.speedup(),
                "batch": dict(self.batch), "ranking": self.ranking(),
                "notes": list(self.notes)}

    def format_table(self) -> str:
        header = ["ID", "OpType", "DataType", "Target", "InputShape", "OutputShape", "DDRCycles",
                  "NPUCycles", "MaxCycles", "Time(us)", "MacUsage(%)",
                  f"WorkLoad({'/'.join(str(core) for core in range(self.core_count))})", "TaskNumber", "RW(KB)",
                  "FullName"]
        rows = []
        for layer in self.layers:
            usage = layer.mac_usage()
            rows.append([str(layer.id), layer.op_type, layer.data_type, layer.target, layer.input_shapes,
                         layer.output_shape, str(layer.ddr_cycles), str(layer.npu_cycles),
                         str(layer.max_cycles), f"{self.layer_time_us(layer):.1f}",
                         "" if usage is None else f"{usage:.2f}", _workload_text(layer), str(len(layer.tasks)),
                         f"{layer.ddr_read_bytes / 1024:.0f}", layer.full_name])
        totals = self.totals()
        speedup = self.speedup()
        rows.append(["Total", "", "", "", "", "", str(totals["ddr_cycles"]), str(totals["npu_cycles"]),
                     str(totals["max_cycles"]), f"{totals['time_us']:.1f}", "",
                     f"Up:{speedup:.2f}x" if speedup != 1.0 else "", str(totals["tasks"]),
                     f"{totals['ddr_read_bytes'] / 1024:.0f}", ""])
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        numeric = set(range(6, 14)) - {11}

        def line(cells):
            return "  ".join(c.rjust(w) if i in numeric else c.ljust(w)
                             for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
        out = [line(header), "-" * len(line(header))]
        out += [line(r) for r in rows[:-1]] + ["-" * len(line(header)), line(rows[-1])]
        out += [f"Total Operator Elapsed Per Frame Time(us): {totals['time_us']:.1f}",
                "Total Memory Read/Write Per Frame Size(KB): "
                f"{(totals['ddr_read_bytes'] + totals['ddr_write_bytes']) / 1024:.1f}", "",
                "Operator Time Consuming Ranking Table"]
        ranking = [["OpType", "CallNumber", "CPUTime(us)", "GPUTime(us)", "NPUTime(us)", "TotalTime(us)",
                    "TimeRatio(%)"]]
        ranking += [[row["op_type"], str(row["calls"]), f"{row['cpu_time_us']:.1f}", f"{row['gpu_time_us']:.1f}",
                     f"{row['npu_time_us']:.1f}", f"{row['total_time_us']:.1f}", f"{row['time_ratio_percent']:.2f}%"]
                    for row in self.ranking()]
        rank_widths = [max(len(r[i]) for r in ranking) for i in range(len(ranking[0]))]
        out += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, rank_widths))).rstrip()
                for r in ranking]
        return "\n".join(out)


def _get_layers(report: PerfReport) -> list[LayerTime]:
    layers = report.__dict__.get("_layers")
    if layers is None:
        source = report.__dict__.get("_row_source")
        if source is not None:  # (report_npu's rows: this report's own copies, made on first use)
            layers = report.__dict__["_layers"] = [_copy_row(row) for row in source.rows]
    return layers


def _set_layers(report: PerfReport, layers: list[LayerTime]) -> None:
    report.__dict__["_layers"] = layers
    report.__dict__.pop("_row_source", None)


def _report_state(report: PerfReport) -> dict:
    """copy / pickle: the rows made first, so a copy shares them as it shares any field."""
    _get_layers(report)
    return report.__dict__


# ``layers`` stays the dataclass field it was (constructor, fields(), eq, repr, asdict, replace);
# only its storage is a property, so that report_npu can defer the per-report row copies (issue 20:
# 979 rows per inference on PP-OCR rec, most reports only asked for totals()).
PerfReport.layers = property(_get_layers, _set_layers)
PerfReport.__getstate__ = _report_state


class _RowSource:
    """report_npu's memoised rows of one (timeline, model, platform, DDR model), their unassigned
    tasks, and the totals of reports that still hold exactly these (by the report fields totals
    reads besides them)."""

    __slots__ = ("rows", "unassigned", "timeline", "_totals")

    def __init__(self, rows: tuple[LayerTime, ...], unassigned: list[TaskTime], timeline: Timeline) -> None:
        self.rows, self.unassigned, self.timeline = rows, unassigned, timeline
        self._totals: dict[tuple, dict] = {}

    def totals(self, report: PerfReport) -> dict | None:
        """``report.totals()`` worked out once per (DDR model, layer overhead, clock), or None when the
        report's timeline or unassigned tasks are no longer this source's."""
        unassigned = report.unassigned
        if report.timeline is not self.timeline or len(unassigned) != len(self.unassigned) or \
                any(a is not b for a, b in zip(unassigned, self.unassigned)):
            return None
        key = (report.ddr_model, report.layer_overhead_us, report.npu_mhz)
        known = self._totals.get(key)
        if known is None:
            known = self._totals[key] = report._totals(self.rows, self.unassigned)
        return known


def _workload_text(layer: LayerTime) -> str:
    """The vendor's WorkLoad column: per-core shares of a split layer, "100%" on one core."""
    shares = layer.workload()
    if not shares:
        return ""
    if len(shares) == 1:
        (core, _), = shares.items()
        return f"core{core} 100%"
    text = "/".join(f"{shares.get(core, 0.0):.1f}%" for core in range(max(shares) + 1))
    # the guide's "50.0%/50.0%/0.0% - Up:50.0%": the split's gain over one core
    return f"{text} - Up:{100.0 * (layer.speedup() - 1.0):.1f}%" if layer.split else text


def _mac_rate(tasks_records, platform) -> tuple[str, int]:
    for record in tasks_records:
        state = record.conv
        if state is not None:
            name = PRECISION_NAMES.get(state.precision, "")
            return name.upper(), int(getattr(platform.macs, name, 0) or 0)
    for record in tasks_records:
        if record.dpu is not None:
            return PRECISION_NAMES.get(record.dpu.out_precision, "").upper(), 0
    return "", 0


DDR_MODELS = ("board", "vendor")


def _check_ddr_model(ddr_model: str) -> None:
    if ddr_model not in DDR_MODELS:
        from npuemu.isa.errors import ConfigError
        raise ConfigError(f"unknown DDR model {ddr_model!r}; expected one of: {', '.join(DDR_MODELS)}")


def _vendor_ddr(npu_cycles: int, nbytes: int, platform) -> int:
    from npuemu.emulator.timing.vendor_estimate import vendor_ddr_cycles

    # librknnc fills DDR cycles for conv-type layers only (vendor-corpus README §4.1)
    return vendor_ddr_cycles(nbytes, platform) if npu_cycles else 0


def _layer_spans(timeline: Timeline) -> dict[int, list[Span]]:
    """Each graph layer's task spans, in schedule order (the layers label the timeline)."""
    out: dict[int, list[Span]] = {}
    for span in timeline.task_spans():
        for layer in span.layers:
            out.setdefault(layer, []).append(span)
    return out


def _unassigned(timeline: Timeline) -> list[TaskTime]:
    return [span.time for span in timeline.task_spans() if not span.layers]


def _npu_rows(model, timeline: Timeline, platform, ddr_model: str) -> tuple[LayerTime, ...]:
    """``report_npu``'s layer rows (templates: ``_copy_row`` hands out copies)."""
    _, tensors, model_layers, shapes = model_index(model)
    by_layer, host_us = _layer_spans(timeline), timeline.layer_host_us()
    layers = []
    for info, (in_shapes, out_shapes) in zip(model_layers, shapes):
        spans = by_layer.get(info.id, [])
        records = [span.record for span in spans]
        dtype, rate = _mac_rate(records, platform)
        if not dtype and info.outputs and info.outputs[0] in tensors:
            dtype = (tensors[info.outputs[0]].dtype or "").upper()
        timed = LayerTime(
            info.id, info.op_type, dtype, info.target or ("NPU" if records else "CPU"),
            in_shapes or "\\", out_shapes, info.name, [span.time for span in spans], rate,
            cores=[span.lane for span in spans], shared_ddr_rate=platform.ddr.shared_bytes_per_cycle)
        if not records:  # a host layer: the time of its host steps on the timeline
            timed.host_us = host_us.get(info.id, 0.0)
        if ddr_model == "vendor":
            from npuemu.emulator.timing.vendor_estimate import npu_layer_bytes, vendor_layer_npu_cycles
            timed.vendor_npu = vendor_layer_npu_cycles(records, platform)
            sizes = [int(tensors[n].size or 0) for n in (*info.inputs, *info.outputs) if n in tensors]
            timed.vendor_ddr = _vendor_ddr(timed.npu_cycles, npu_layer_bytes(sizes, records, platform), platform)
        layers.append(timed)
    return tuple(layers)


def _copy_row(row: LayerTime) -> LayerTime:
    """A LayerTime equal to ``row`` with lists of its own (a report's rows may be edited)."""
    copy = object.__new__(LayerTime)
    fields = row.__dict__.copy()  # (one dict copy, then the lists: issue 20, a row per task)
    fields["tasks"], fields["cores"] = list(row.tasks), list(row.cores)
    copy.__dict__ = fields
    return copy


#: per (timeline, model trailer, platform) objects and DDR model: report_npu's rows and unassigned tasks
_NPU_ROWS: Memo[_RowSource] = Memo(identity=3, limit=16)


def report_rknn(model, run, platform, ddr_model: str = "board") -> PerfReport:
    """Per-layer report of an :class:`~npuemu.emulator.rknn_runner.RknnRun` of ``model``."""
    _check_ddr_model(ddr_model)
    timeline = timeline_rknn(model, run, platform)
    by_layer, host_us = _layer_spans(timeline), timeline.layer_host_us()   # host: rknn_cpu_layers.py
    layers = []
    for layer in model.layers:
        spans = by_layer.get(layer.index, [])
        records = [span.record for span in spans]
        out = [model.tensors[i] for i in layer.outputs]
        dtype, rate = _mac_rate(records, platform)
        if not dtype and out:
            dtype = out[0].dtype_name.upper()
        timed = LayerTime(
            layer.index, layer.op_type, dtype, layer.unit,
            ",".join(shape_text(model.tensors[i].shape) for i in layer.inputs) or "\\",
            shape_text(out[0].shape) if out else "", layer.name, [span.time for span in spans], rate,
            cores=[span.lane for span in spans], shared_ddr_rate=platform.ddr.shared_bytes_per_cycle)
        timed.host_us = host_us.get(layer.index, 0.0)
        if ddr_model == "vendor":
            from npuemu.emulator.timing.vendor_estimate import estimated_op, rknn_layer_bytes, vendor_layer_npu_cycles
            timed.vendor_npu = vendor_layer_npu_cycles(records, platform) if estimated_op(layer.op_type) else 0
            timed.vendor_ddr = _vendor_ddr(timed.npu_cycles, rknn_layer_bytes(model, layer, records, platform),
                                           platform)
        layers.append(timed)
    return PerfReport(model.source, platform.name, platform.clock.npu_mhz, layers, _unassigned(timeline),
                      ddr_model=ddr_model, host_submit_overhead_us=platform.launch.host_submit_overhead_us,
                      core_count=platform.cores.count, timeline=timeline).explain(platform)


def _explained(platform, ddr_model: str) -> tuple[dict, dict]:
    from npuemu.emulator.timing.explain import ddr_model_info, time_band

    return tuple((info, tuple(key for key, value in info.items() if isinstance(value, list)))
                 for info in (ddr_model_info(platform, ddr_model), time_band(platform, ddr_model)))


#: per (platform, DDR model): ``PerfReport.explain``'s two dicts, each with its keys whose values are lists (a
#: platform is frozen: platforms/groups.py)
_EXPLAINED: Memo[tuple] = Memo(_explained, identity=1)


def _copied(info: dict, lists: tuple) -> dict:
    """A copy of an ``explain`` dict a report may change without touching the memoised one (its lists too:
    ``lists``, the keys that hold them, worked out once)."""
    copy = dict(info)
    for key in lists:
        copy[key] = list(copy[key])
    return copy


def report_npu(model, runs: Sequence, platform, ddr_model: str = "board",
               timeline: Timeline | None = None) -> PerfReport:
    """Per-layer report of a ``.npu`` model's chain runs (``Runtime.runs``, one per NPU step),
    its totals read from the run's timeline (built here unless given)."""
    _check_ddr_model(ddr_model)
    timeline = timeline or timeline_npu(model, runs, platform)
    batch = model.trailer.get("batch") or {"size": 1, "contexts": 1}  # compiler/batch.py
    # The rows are a function of the timeline (handed out again for a run that repeats the last
    # one's records), the model and the platform: worked out once, each report gets copies.
    # (with the timeline's spans no layer claims: a copy per report too)
    source = _NPU_ROWS.get(timeline, model.trailer, platform, ddr_model)
    if source is None:
        source = _NPU_ROWS.put(_RowSource(_npu_rows(model, timeline, platform, ddr_model), _unassigned(timeline),
                                          timeline), timeline, model.trailer, platform, ddr_model)
    report = PerfReport(str(getattr(model, "path", "")) or "model", platform.name, platform.clock.npu_mhz,
                        None, list(source.unassigned), ddr_model=ddr_model,
                        host_submit_overhead_us=platform.launch.host_submit_overhead_us, batch=dict(batch),
                        core_count=platform.cores.count, timeline=timeline).explain(platform)
    # the rows are copied when first read (_get_layers); totals() before that reads the source's
    report.__dict__["_row_source"] = source
    if batch["size"] > 1:
        report.notes.append(f"batch {batch['size']}: {batch['contexts']} context(s) on as many cores, the slices of a "
                            "wave side by side on the timeline with the DDR shared (TIMING.md, multi-batch)")
    return report
