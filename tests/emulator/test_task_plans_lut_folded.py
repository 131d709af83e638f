"""Task programs whose LUT step folds BN into its table (issue 20, units/dpu_plan.py ``_lut_store``
with kernels/lut_folded.py, NUMERICS.md 41): a replayed chain of CNA+CORE+DPU tasks with BN's MUL
on (one register operand, shifts per sign), the LUT flat past both ends (slope scales 0) and each
task uploading its own tables mid-chain. The steps must give what the full unit path gives -
outputs, task records with every DMA counter, register state with the LUT port and RAM - and run
the folded kernel, with its int32 factors (NUMERICS.md 86); a LUT RAM held from build time is caught."""

import numpy as np
import pytest

from npuemu.emulator.kernels import lut_folded
from npuemu.emulator.units import dpu_plan
from tests.emulator.test_machine_support import load_cube
from tests.emulator.test_task_plans import Counting, _machine, _output, int8_inputs, paired_runs
from tests.emulator.test_task_plans_lut import _chain

BN_MUL, BN_SHIFT, BN_SHIFT_NEG = 3000, 11, 12


def _folding(task, spec, seed: int):
    """``task`` with BN's MUL on (a register operand) and both LUT tables flat past their ends,
    over [-T, T] with T = 512 << (4 + seed) (the table's values past the ends within reach)."""
    select = 4 + seed
    task.set("DPU", "LUT_INFO", LUT_LE_INDEX_SELECT=select, LUT_LO_INDEX_SELECT=select)
    task.set("DPU", "LUT_LE_START", (-(512 << select)) & 0xFFFFFFFF).set("DPU", "LUT_LE_END", 0)
    task.set("DPU", "LUT_LO_START", 0).set("DPU", "LUT_LO_END", 512 << select)
    task.set("DPU", "BN_CFG", BN_ALU_BYPASS=1, BN_RELU_BYPASS=int(seed % 2 == 0))
    task.set("DPU", "BN_MUL_CFG", BN_MUL_OPERAND=BN_MUL + 97 * seed, BN_MUL_SHIFT_VALUE=BN_SHIFT)
    task.set("DPU", "DATA_FORMAT", BS_MUL_SHIFT_VALUE_NEG=spec.bs_shift, BN_MUL_SHIFT_VALUE_NEG=BN_SHIFT_NEG)
    for name in ("LE", "LO"):
        task.set("DPU", f"LUT_{name}_SLOPE_SCALE", UFLOW_SCALE=0, OFLOW_SCALE=0)
    return task


def _runs(monkeypatch, name: str, tasks: int):
    """Both machines over the inputs: per run the fast and the slow outputs; the counting; how
    many times the folded kernel ran."""
    specs, layer, chain, _ = _chain(name, "identity", tasks)
    chain = [(_folding(task, spec, index), mask) for index, ((task, mask), spec) in enumerate(zip(chain, specs))]
    ran = [0, 0]
    inner = lut_folded.folded_to_atoms

    def counted(*args):
        ran[0] += 1
        ran[1] += args[-1].shape[0] == lut_folded.NARROW_ROWS  # (the int32 factors passed: NUMERICS.md 86)
        inner(*args)

    monkeypatch.setattr(lut_folded, "folded_to_atoms", counted)
    counting = Counting(monkeypatch)
    spec = specs[0]
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    runs = paired_runs(fast, slow, amount, int8_inputs(2, (spec.in_c, spec.in_h, spec.in_w)),
                       lambda machine, x: load_cube(machine, spec.feature, x),
                       lambda machine: [_output(machine, one) for one in specs])
    return [(got, want) for got, want, _ in runs], counting, ran


@pytest.mark.parametrize("name", ["direct_3x3_pad1", "pointwise_70_kernels", "depthwise_3x3_24ch",
                                  "direct_odd_channels_strided"])
def test_folded_steps_equal_full_runs(monkeypatch, name):
    runs, counting, ran = _runs(monkeypatch, name, 3)
    for got, want in runs:
        for mine, theirs in zip(got, want):
            np.testing.assert_array_equal(mine, theirs)
    assert counting.built >= 1 and counting.steps >= 3 and ran[0] >= 3  # the steps ran the folded kernel
    assert ran[1] == ran[0]  # each with its int32 factors (one BS shift, int32 operands)


def test_the_checks_catch_a_lut_ram_held_from_build_time(monkeypatch):
    """A step reading a copy of the LUT RAM made when it was built folds the last task's tables
    into every task's table; the comparison sees it."""
    inner = dpu_plan._lut_store

    def held(state, fixed, stages, tail, tables, *rest):
        return inner(state, fixed, stages, tail, tables.copy(), *rest)

    monkeypatch.setattr(dpu_plan, "_lut_store", held)
    runs, _, ran = _runs(monkeypatch, "direct_3x3_pad1", 2)
    assert ran[0] >= 2
    assert any(not np.array_equal(mine, theirs) for got, want in runs for mine, theirs in zip(got, want))
