"""fp16 DPU steps writing interleaved (units/dpu_plan_fp.py, issue 20): a ConvTranspose's stride-phase
convs write one tensor between them, each pixel a single atom apart (kernels/dpu_interleave.py). With
``--fp16`` their DPU tasks (with Sigmoid's LUT, and without) now run as task-program steps, their fp16
rounding fused into the atom stores (kernels/fp16_atoms.py). Two runtimes of one model file, one
whose cores never replay (the full unit path), must give the same output bits, task records (every
DMA counter) and register state on every run, and the interleaved steps must have run; a step whose
store drops a row is caught."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npuemu.emulator import task_plan
from npuemu.emulator.units import dpu_plan_fp
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import Net
from tests.emulator.test_task_plans_fp16 import RUNS, _mismatches, _runtimes, _state

SHAPE = (1, 8, 10, 12)


def _deconv(activation: str | None) -> onnx.ModelProto:
    """conv, then ConvTranspose 2x2 stride 2 (four phase convs writing interleaved), then ``activation``."""
    net = Net(7)
    net.conv("c1", "x", "a", 8, 16)
    net.const("wt", net.rng.normal(0, 0.3, (16, 12, 2, 2)))
    net.const("bt", net.rng.normal(0, 0.1, 12))
    net.node("ConvTranspose", ["a", "wt", "bt"], ["u" if activation else "y"], "up", strides=[2, 2],
             kernel_shape=[2, 2])
    if activation:
        net.node(activation, ["u"], ["y"], "act")
    return net.model(list(SHAPE), "y")


class _Interleaved:
    """Counts the runs of interleaved fp16 DPU steps (wrapping ``prepare_fp_dpu`` as task_plan calls it)."""

    def __init__(self, monkeypatch) -> None:
        self.runs = 0
        inner = task_plan.prepare_fp_dpu

        def prepare(state, *args):
            run = inner(state, *args)
            if run is None or state.pixel_step == 0:
                return run

            def counted(source):
                self.runs += 1
                run(source)
            counted.held = run.held
            return counted

        monkeypatch.setattr(task_plan, "prepare_fp_dpu", prepare)


def _compare(tmp_path, activation: str | None) -> list:
    onnx.save(_deconv(activation), tmp_path / "deconv.onnx")
    path = str(tmp_path / "deconv.npu")
    assert main(["compile", str(tmp_path / "deconv.onnx"), "--fp16", "-o", path]) == 0
    fast, slow = _runtimes(path)
    rng = np.random.default_rng(0)
    outputs = []
    for _ in range(RUNS):
        x = rng.normal(0, 1, SHAPE).astype(np.float32)
        for runtime in (fast, slow):
            runtime.set_input("x", x)
            runtime.run()
        assert [run.tasks for run in fast.runs] == [run.tasks for run in slow.runs]  # every DMA counter
        assert _state(fast) == _state(slow)
        outputs.append([(fast.output(o, False), slow.output(o, False)) for o in fast.outputs])
    return outputs


@pytest.mark.parametrize("activation", ["Sigmoid", None])
def test_interleaved_fp16_steps_equal_full_runs(monkeypatch, tmp_path, activation):
    counted = _Interleaved(monkeypatch)
    outputs = _compare(tmp_path, activation)
    assert _mismatches(outputs) == 0
    assert counted.runs >= (RUNS - 3) * 4  # the four phase convs' DPU tasks ran as steps (from the 4th run)


def test_a_step_dropping_a_row_is_caught(monkeypatch, tmp_path):
    inner = dpu_plan_fp._store

    def short(*args):
        (offsets, *fields), data = inner(*args)
        return (offsets[:-1], *fields), data  # the last atom row never stored

    monkeypatch.setattr(dpu_plan_fp, "_store", short)
    assert _mismatches(_compare(tmp_path, "Sigmoid")) > 0
