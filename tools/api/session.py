"""What ``RKNN.init_runtime()`` sets up (guide 3.2.1): a model on the emulated NPU.

No board is contacted. :class:`NpuSession` runs an npuemu model file (built by ``build()`` or
read by ``load_rknn()``) with :class:`~npuemu.emulator.runtime.Runtime`; :class:`RknnSession`
runs a vendor ``.rknn`` file with :class:`~npuemu.emulator.rknn_runner.RknnRunner` (its chain 0
on core 0). Both give ``inference``'s outputs, ``eval_perf``'s per-layer report (the timing
model of ``npuemu perf``) and ``eval_memory``'s report (``npuemu mem``).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from npuemu.isa.errors import ConfigError

from .inputs import apply_mean_std, formats_for, to_model_layout


class NpuSession:
    """An npuemu model file loaded into the emulator's runtime."""

    def __init__(self, model: Any, path: str | None = None) -> None:
        from npuemu.emulator.runtime import Runtime

        self.model, self.path = model, path
        self.runtime = Runtime(model.shape_set(0))  # a dynamic-shape model: its first set until run() picks
        self.chip = model.platform().chip
        options = model.compiler().options or {}
        self.preprocess = dict(options.get("preprocess") or {})  # recorded by the build: mean/std per input

    def input_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, self.runtime.input_shape(name)) for name in self.runtime.inputs]  # readin: the caller's

    def run(self, arrays: Sequence[Any], data_format: Any) -> list[np.ndarray]:
        """inference(): layout, mean/std, quantize on store, run, dequantized float32 outputs."""
        shapes = self._shape_set(arrays, data_format)
        _check_count(arrays, shapes)
        for (name, shape), array, layout in zip(shapes, arrays, formats_for(data_format, len(shapes))):
            label = f"input {name!r}"
            values = apply_mean_std(to_model_layout(array, shape, layout, label), self.preprocess.get(name), label)
            self.runtime.set_input(name, values)
        self.runtime.run()
        return [np.asarray(self.runtime.output(name), np.float32) for name in self.runtime.outputs]

    def _shape_set(self, arrays: Sequence[Any], data_format: Any) -> list[tuple[str, tuple[int, ...]]]:
        """A dynamic-shape model (guide 5.4): the runtime of the set the arrays' shapes match (NCHW
        after data_format; an InputError names the sets when none does). The input shapes."""
        if self.model.shape_sets() and len(arrays) == len(self.runtime.inputs):
            ranks = [len(self.runtime.model.tensor(name).shape or ()) for name in self.runtime.inputs]
            chosen = self.model.for_input_shapes(dict(zip(self.runtime.inputs, _nchw_shapes(arrays, data_format, ranks))))
            if chosen.trailer != self.runtime.model.trailer:
                from npuemu.emulator.runtime import Runtime
                self.runtime = Runtime(chosen)
        return [(name, self.runtime.input_shape(name)) for name in self.runtime.inputs]

    def perf(self):
        """eval_perf(): the last inference's timing (zero inputs if none ran: timing does not
        depend on values)."""
        from npuemu.emulator.timing.report import report_npu

        if not self.runtime.runs:
            self.run([np.zeros(shape, np.float32) for _, shape in self.input_shapes()], "nchw")
        report = report_npu(self.runtime.model, self.runtime.runs, self.runtime.machine.platform)
        report.model = self.path or "model built in memory"
        return report

    def memory(self):
        """eval_memory(): the model file's memory report (written to a temporary file when it
        was built in memory, for its size)."""
        from npuemu.emulator.timing.memory_report import memory_npu

        if self.path is not None:
            return memory_npu(self.runtime.model, self.path)
        with tempfile.TemporaryDirectory(prefix="npuemu-api-") as folder:
            path = os.path.join(folder, "model.npu")
            self.model.write(path)
            report = memory_npu(self.runtime.model, path)
        report.model = "model built in memory"
        return report


class RknnSession:
    """A vendor ``.rknn`` file laid out for the emulator (chain 0 on core 0)."""

    def __init__(self, model: Any, path: str, chip: str) -> None:
        from npuemu.emulator.rknn_runner import RknnRunner

        self.model, self.path, self.chip = model, path, chip
        self.runner = RknnRunner(model, chip)
        self.result = None

    def input_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(tensor.name, tuple(tensor.shape)) for tensor in self.runner.input_tensors]

    def run(self, arrays: Sequence[Any], data_format: Any) -> list[np.ndarray]:
        """inference(): layout here; the file's own mean/std and quantization in the runner."""
        if self.model.graph_shapes and isinstance(arrays, (list, tuple)):  # dynamic shapes: the inputs' graph
            from npuemu.emulator.rknn_runner import RknnRunner, dynamic_graph
            from npuemu.isa.rknn import load_rknn

            ranks = [len(shape) for _, shape in self.input_shapes()]
            index = dynamic_graph(self.model, _nchw_shapes(arrays, data_format, ranks))
            if index != self.model.graph_index:
                self.model = load_rknn(self.path, graph_index=index)
                self.runner, self.result = RknnRunner(self.model, self.chip), None
        shapes = self.input_shapes()
        _check_count(arrays, shapes)
        values = [to_model_layout(array, shape, layout, f"input {name!r}")
                  for (name, shape), array, layout in zip(shapes, arrays, formats_for(data_format, len(shapes)))]
        self.result = self.runner.run(values)
        return [np.asarray(self.result.outputs[t.name], np.float32) for t in self.runner.output_tensors]

    def perf(self):
        from npuemu.emulator.timing.report import report_rknn
        from npuemu.platforms import load_platform

        if self.result is None:
            self.run([np.zeros(shape, np.float32) for _, shape in self.input_shapes()], "nchw")
        report = report_rknn(self.model, self.result, load_platform(self.chip))
        report.model = self.path
        return report

    def memory(self):
        from npuemu.emulator.timing.memory_report import memory_rknn

        return memory_rknn(self.model, self.path)


def _nchw_shapes(arrays: Sequence[Any], data_format: Any, ranks: list[int]) -> list[tuple[int, ...]]:
    """Each input array's shape in the model's NCHW order (data_format applied, an image's
    missing batch axis added): what a dynamic-shape model picks its shape set by."""
    shapes = []
    for array, layout, rank in zip(arrays, formats_for(data_format, len(ranks)), ranks):
        shape = tuple(np.shape(array))
        shape = (1, *shape) if len(shape) == 3 and rank == 4 else shape
        shapes.append((shape[0], shape[3], shape[1], shape[2]) if len(shape) == 4 and layout == "nhwc" else shape)
    return shapes


def _check_count(arrays: Sequence[Any], shapes: list[tuple[str, tuple[int, ...]]]) -> None:
    from npuemu.isa.errors import InputError

    if isinstance(arrays, np.ndarray) or not isinstance(arrays, (list, tuple)):
        raise InputError("inputs: expected a list with one array per model input, e.g. inputs=[img]")
    if len(arrays) != len(shapes):
        raise InputError(f"inputs: {len(arrays)} array(s) given; the model takes {len(shapes)}: "
                         + ", ".join(f"{name} {list(shape)}" for name, shape in shapes))


def check_rknn_core_mask(mask: str) -> None:
    """A vendor .rknn file runs its chain 0 on core 0 (README: multi-core chains not yet)."""
    if mask not in ("auto", "0"):
        raise ConfigError(f"core_mask {mask}: a vendor .rknn file runs on the emulator as its single-core chain 0 "
                          "on core 0 (multi-core chains of .rknn files are not run yet); use NPU_CORE_AUTO or "
                          "NPU_CORE_0")
