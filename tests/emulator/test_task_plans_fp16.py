"""Task programs of fp16 tasks (issue 20, units/dpu_plan_fp.py ``prepare_fp_dpu``, cna_core.py
``prepare_cna_core``'s fp16 kernel): a replayed chain's fp16 CNA+CORE->DPU tasks (with the BRDMA's
bias, the LUT, a residual operand split between MRDMA and ERDMA) and fp16 flying DPU tasks (an
ERDMA operand, the LUT, the fp16 -> int8 conversion) run as compiled steps, and so do convs whose
weights the chain writes every run (a MatMul of two activations).

Small ONNX models are compiled with ``--fp16`` and run by two runtimes of the same file: one as
usual, one whose cores never replay (every task through the full unit path, the reference). Each
run must give the same output bits, the same task records (every DMA counter) and the same register
state; the steps must have run. The last tests break a step on purpose (the EW operand or the
weights read once, when the step was built) and show these checks catch it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import npuemu.emulator.core as core_module
from npuemu.emulator import task_plan
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.units import cna_core, dpu_plan_fp
from npuemu.emulator.units.state import FP16
from npuemu.isa.container import ModelFile
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import Net
from tests.compiler.test_matmul_activations_npu import matmul_model

RUNS = 6  # (the first run fills the replays; the programs run from the second on)


def _conv_bias_lut() -> tuple[onnx.ModelProto, tuple]:
    """conv + bias + ReLU, depthwise + Sigmoid (the LUT on the conv's DPU), 1x1 conv + residual Add."""
    net = Net(3)
    net.conv("c1", "x", "a", 8, 24)
    net.node("Relu", ["a"], ["a1"], "r1")
    net.conv("dw", "a1", "b", 24, 24, group=24)
    net.node("Sigmoid", ["b"], ["b1"], "sig")
    net.conv("pw", "b1", "c", 24, 24, kernel=1)
    net.node("Add", ["c", "a1"], ["y"], "add")
    return net.model([1, 8, 10, 12], "y"), (1, 8, 10, 12)


def _flying() -> tuple[onnx.ModelProto, tuple]:
    """Two convs' outputs added (a flying Add, the operand from the ERDMA), then Sigmoid and Mul by it."""
    net = Net(4)
    net.conv("c1", "x", "a", 8, 16)
    net.conv("c2", "x", "b", 8, 16, kernel=1)
    net.node("Mul", ["a", "b"], ["m"], "mul")
    net.node("Sigmoid", ["m"], ["s"], "sig")
    net.node("Add", ["s", "b"], ["y"], "add")
    return net.model([1, 8, 9, 11], "y"), (1, 8, 9, 11)


def _gate() -> tuple[onnx.ModelProto, tuple]:
    """An SE gate: the Mul by one value per channel (the ERDMA's per-channel operand, mode 0)."""
    net = Net(6)
    net.conv("c1", "x", "a", 8, 24)
    net.node("GlobalAveragePool", ["a"], ["g"], "gap")
    net.conv("c2", "g", "h", 24, 24, kernel=1)
    net.node("Sigmoid", ["h"], ["s"], "sig")
    net.node("Mul", ["a", "s"], ["y"], "gate")
    return net.model([1, 8, 10, 12], "y"), None


def _matmul() -> tuple[onnx.ModelProto, tuple]:
    """A MatMul of two activations (test_matmul_activations_npu's model, 8 heads): 1x1 convs whose
    weights are the second operand's bytes (a graph input, written before every run)."""
    return matmul_model((1, 8, 40, 15), (1, 8, 15, 40)), None


def _weights_dropped_at_build(monkeypatch) -> None:
    """The fp16 convs' weights dropped from the derived cache as each program is built: what a chain
    that writes its convs' weights itself (ppocr_rec's attention) leaves, so the steps read them per run."""
    inner = task_plan.build_program

    def build(tasks, memory, *rest):
        for task in tasks:
            conv = task[2][1]["conv"]
            if conv is not None and conv.precision == FP16 and not conv.weight_reuse:
                plan = cna_core._PLANS(conv)
                memory.derived.invalidate(int(plan.weight_rows[0]), int(plan.weight_rows[0]) + plan.weight_bytes)
        return inner(tasks, memory, *rest)

    monkeypatch.setattr(core_module, "build_program", build)


MODELS = {"conv_bias_lut": _conv_bias_lut, "flying": _flying, "gate": _gate, "matmul": _matmul}


def _compiled(tmp_path, name: str) -> tuple[str, dict]:
    model, _ = MODELS[name]()
    onnx.save(model, tmp_path / f"{name}.onnx")
    path = str(tmp_path / f"{name}.npu")
    assert main(["compile", str(tmp_path / f"{name}.onnx"), "--fp16", "-o", path]) == 0
    shapes = {one.name: [d.dim_value for d in one.type.tensor_type.shape.dim] for one in model.graph.input}
    return path, shapes


def _runtimes(path: str) -> tuple[Runtime, Runtime]:
    fast, slow = Runtime(ModelFile.read(path)), Runtime(ModelFile.read(path))
    for core in slow.machine.cores:
        core.regfile.matches = lambda snapshot: False  # never replayed: no program, the full path
    return fast, slow


def _state(runtime: Runtime) -> list:
    return [(core.regfile.snapshot(), core.tasks_run, core.interrupt_raw) for core in runtime.machine.cores]


class _Counted:
    """Counts the runs of fp16 DPU steps (wrapping ``prepare_fp_dpu`` as task_plan calls it)."""

    def __init__(self, monkeypatch) -> None:
        self.runs = 0
        inner = task_plan.prepare_fp_dpu

        def prepare(*args):
            run = inner(*args)
            if run is None:
                return None

            def counted(source):
                self.runs += 1
                run(source)
            counted.held = run.held
            return counted

        monkeypatch.setattr(task_plan, "prepare_fp_dpu", prepare)


def _compare(tmp_path, name: str, seed: int = 0) -> tuple[list, int]:
    """Both runtimes over RUNS inputs: per run (fast output, slow output); asserts records and state equal."""
    path, shapes = _compiled(tmp_path, name)
    fast, slow = _runtimes(path)
    rng = np.random.default_rng(seed)
    outputs = []
    for _ in range(RUNS):
        feeds = {name: rng.normal(0, 1, one).astype(np.float32) for name, one in shapes.items()}
        for runtime in (fast, slow):
            for name, x in feeds.items():
                runtime.set_input(name, x)
            runtime.run()
        assert [run.tasks for run in fast.runs] == [run.tasks for run in slow.runs]  # every DMA counter
        assert _state(fast) == _state(slow)  # registers, pointers, task counters, interrupts
        outputs.append([(fast.output(o, False), slow.output(o, False)) for o in fast.outputs])
    return outputs, sum(len(run.tasks) for run in slow.runs)


def _mismatches(outputs: list) -> int:
    return sum(not np.array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
               for run in outputs for a, b in run)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp16_steps_equal_full_runs(monkeypatch, tmp_path, name):
    counted = _Counted(monkeypatch)
    outputs, tasks = _compare(tmp_path, name)
    assert _mismatches(outputs) == 0
    assert counted.runs >= (RUNS - 2) * 2  # the fp16 DPU tasks ran as steps


def test_weights_dropped_when_the_step_is_made_are_read_each_run(monkeypatch, tmp_path):
    """Weights not in the derived cache as the step is made (a chain writing them every run) are read
    each run (``prepare_cna_core``'s ``fetch``), and the runs equal the full path's."""
    _weights_dropped_at_build(monkeypatch)
    fetched = []
    inner = cna_core._weights_fetcher

    def fetcher(*args):
        fetch = inner(*args)

        def counted():
            fetched.append(1)
            return fetch()
        return counted

    monkeypatch.setattr(cna_core, "_weights_fetcher", fetcher)
    outputs, _ = _compare(tmp_path, "matmul")
    assert _mismatches(outputs) == 0
    assert len(fetched) >= RUNS - 2  # the steps read them on every replay


@pytest.mark.parametrize("name", ["flying", "conv_bias_lut"])
def test_the_checks_catch_rows_read_once_when_the_step_was_built(monkeypatch, tmp_path, name):
    """The MRDMA / ERDMA rows (the flying Add's cube and operand, the residual split between MRDMA and
    ERDMA) read as the step is made and reused: caught."""
    inner = dpu_plan_fp._surface_rows

    def once(*args):
        data, offsets, height, lanes = inner(*args)
        return data.copy(), offsets, height, lanes  # the region's bytes as they were then

    monkeypatch.setattr(dpu_plan_fp, "_surface_rows", once)
    outputs, _ = _compare_or_records(tmp_path, name)
    assert outputs


def test_the_checks_catch_weights_held_from_build_time(monkeypatch, tmp_path):
    """The weights a ``fetch`` step reads each run, read once as it is made: caught."""
    inner = cna_core._weights_fetcher

    def once(*args):
        first = inner(*args)()
        return lambda: first

    monkeypatch.setattr(cna_core, "_weights_fetcher", once)
    _weights_dropped_at_build(monkeypatch)
    outputs, _ = _compare_or_records(tmp_path, "matmul")
    assert outputs


def _compare_or_records(tmp_path, name: str):
    """``_compare`` expected to fail: the broken step shows as different outputs or records."""
    try:
        outputs, _ = _compare(tmp_path, name)
    except AssertionError:
        return ["records or state differ"], 0
    return (["outputs differ"] if _mismatches(outputs) else []), 0
