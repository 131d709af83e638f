"""An fp16 task's two halves in one frame (issue 20): a one-call fp16 CORE step (cna_core ``_fused_run``)
hands its result array straight to its DPU step (units/dpu_plan_fp.py ``run.direct``) through
``then_into``, without the CoreResult, its check per run or a frame per half. Runs of the models of
test_task_plans_fp16 with the composed steps must equal the full unit path's (output bits, every DMA
counter, register state), the composed steps must have run, and a DPU half that reads the wrong cube
is caught; a CORE result the DPU does not take keeps the two plain halves."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator import task_plan
from tests.emulator.test_task_plans_fp16 import _compare, _mismatches


class _Direct:
    """Counts the composed runs (wrapping ``prepare_fp_dpu``'s ``run.direct`` as task_plan finds it);
    ``broken``: each composed run reads a zero cube instead of the CORE's result."""

    def __init__(self, monkeypatch, broken: bool = False) -> None:
        self.runs = 0
        inner = task_plan.prepare_fp_dpu

        def prepare(*args):
            run = inner(*args)
            if run is None:
                return None
            direct = run.direct

            def counted(data):
                self.runs += 1
                direct(np.zeros_like(data) if broken and data is not None else data)

            counted.takes, counted.run = direct.takes, direct.run
            run.direct = counted
            return run

        monkeypatch.setattr(task_plan, "prepare_fp_dpu", prepare)


@pytest.mark.parametrize("name", ["conv_bias_lut", "gate"])
def test_composed_fp16_steps_equal_full_runs(monkeypatch, tmp_path, name):
    direct = _Direct(monkeypatch)
    outputs, _ = _compare(tmp_path, name)
    assert _mismatches(outputs) == 0
    assert direct.runs >= 4  # the composed steps ran


def test_a_composed_step_reading_the_wrong_cube_is_caught(monkeypatch, tmp_path):
    _Direct(monkeypatch, broken=True)
    outputs, _ = _compare(tmp_path, "conv_bias_lut")
    assert _mismatches(outputs) > 0


def test_a_cube_the_dpu_does_not_take_keeps_the_plain_halves(monkeypatch, tmp_path):
    # (no DPU takes the CORE's result: every task's step is ``dpu.run(cna(cbuf))``, the same bits)
    inner = task_plan.prepare_fp_dpu

    def prepare(*args):
        run = inner(*args)
        if run is not None:
            run.direct.takes = lambda data: False
        return run

    monkeypatch.setattr(task_plan, "prepare_fp_dpu", prepare)
    outputs, _ = _compare(tmp_path, "conv_bias_lut")
    assert _mismatches(outputs) == 0
