"""What an ``--auto-hybrid`` choice costs in NPU time (compiler/QUANTIZATION.md 12).

The search (compiler/quant/auto_hybrid.py) decides on accuracy alone; its price is in the
timing model: the all-int8 build and the hybrid build of the same graph, calibration and
chip, each run once on the emulator (timing depends on the register programs and DMA byte
counts, not on values, so the inputs are zeros) and compared by their frame totals
(emulator/TIMING.md: NPU cycles of the frame, time at the NPU clock, host-step time). float16
layers run at the fp16 MAC rate and move twice the bytes; a ``DataConvert`` at each int8 /
float16 boundary is one more step.

This module lives in ``tools`` because it needs both the compiler and the emulator.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from npuemu.compiler.driver import build_graph
from npuemu.compiler.quant import quantize_graph
from npuemu.isa.errors import NpuemuError


@dataclass(frozen=True)
class FrameCost:
    cycles: int  # the frame's NPU cycles on the timeline (perf's total)
    time_us: float
    host_us: float  # host steps' share of the time
    host_layers: int


def frame_cost(model: Any, platform: Any) -> FrameCost:
    """One run of ``model`` on zero inputs, timed (``npuemu perf``'s totals)."""
    from npuemu.emulator.runtime import Runtime
    from npuemu.emulator.timing.report import report_npu

    runtime = Runtime(model, platform)
    for name in runtime.inputs:
        runtime.set_input(name, runtime.zero_input(name))
    runtime.run()
    totals = report_npu(model, runtime.runs, runtime.machine.platform).totals()
    host = sum(1 for info in model.layers() if info.target != "NPU")
    return FrameCost(int(totals["cycles"]), float(totals["time_us"]), float(totals["cpu_time_us"]), host)


def int8_model(front: Any) -> Any:
    """The all-int8 build of the graph the search ran on (same ranges and weight method)."""
    choice, result = front.auto_hybrid, front.quantization
    graph = copy.deepcopy(choice.float_graph)
    quantize_graph(graph, choice.ranges, per_channel=result.per_channel, weight_clipping=result.weight_clipping)
    options = dataclasses.replace(front.options, on_phase=None, platform_overrides={})
    return build_graph(graph, front.platform, options, front.preprocess)


def hybrid_model(front: Any) -> Any:
    if front.model is not None:
        return front.model
    options = dataclasses.replace(front.options, on_phase=None, platform_overrides={})
    return build_graph(front.graph, front.platform, options, front.preprocess)


def cost_lines(front: Any) -> list[str]:
    """The int8 and hybrid frame costs, or why they could not be measured."""
    try:
        int8 = frame_cost(int8_model(front), front.platform)
        if not front.auto_hybrid.moved:
            return [f"auto-hybrid: NPU time unchanged: {_cost(int8)}"]
        hybrid = frame_cost(hybrid_model(front), front.platform)
    except NpuemuError as error:
        return [f"auto-hybrid: NPU cycles not measured (the build or run failed: {error})"]
    ratio = hybrid.cycles / int8.cycles if int8.cycles else float("nan")
    return [f"auto-hybrid: NPU time int8 {_cost(int8)}",
            f"auto-hybrid: NPU time hybrid {_cost(hybrid)}; {ratio:.2f}x the int8 cycles"]


def _cost(cost: FrameCost) -> str:
    return (f"{cost.cycles} cycles, {cost.time_us:.1f} us ({cost.host_layers} host layer(s), "
            f"{cost.host_us:.1f} us on the host)")


def summary_lines(front: Any) -> list[str]:
    """What ``npuemu compile --auto-hybrid`` prints after the quantization summary."""
    return front.auto_hybrid.summary_lines() + cost_lines(front)


__all__ = ["FrameCost", "cost_lines", "frame_cost", "hybrid_model", "int8_model", "summary_lines"]
