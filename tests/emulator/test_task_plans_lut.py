"""Task programs with the DPU's LUT on (issue 20, units/dpu_plan.py ``_lut_store``): a replayed
chain's CNA+CORE+DPU tasks whose EW stage runs the LUT become compiled steps. Each must give what
the full unit path gives - outputs (against the independent LUT reference of test_machine_support),
task records with every DMA counter, register state with the LUT port and RAM - while the LUT RAM
changes mid-chain (each task uploads its own tables, as the compiler's fused activations do). The
last tests break the step on purpose (a LUT RAM held from build time, a table of swapped LUT tables)
and show these checks catch it. The dense-values LUT kernel is checked against the reference too."""

from dataclasses import replace

import numpy as np
import pytest

from npuemu.emulator.kernels import LutConfig, LutTableConfig, lut, lut_stage
from npuemu.emulator.units import dpu_plan
from npuemu.isa.lut_format import data_word
from tests.emulator.test_machine_conv import random_layer, reference_accumulators
from tests.emulator.test_machine_support import (
    MASK_CONV, conv_task, load_cube, lut_reference, out_cvt_reference, read_cube,
)
from tests.emulator.test_task_plans import Counting, _machine, _output, _spec, int8_inputs, paired_runs
from tests.emulator.test_task_plans import _expected as _conv_expected

OUT_SCALE, OUT_SHIFT = 16384, 18  # LUT outputs (entries within +-2000) to int8: v / 16


def _lut_settings(values: np.ndarray, seed: int):
    """LE over [-T, 0] and LO over [0, T] with T a power of two near the BS outputs' 80th percentile
    (so inputs hit, under- and overflow both tables), slopes past the ends, random entries."""
    rng = np.random.default_rng(seed)
    top = max(float(np.percentile(np.abs(values.astype(np.float64)), 80)), 1024.0)
    select = max(0, int(np.ceil(np.log2(top / 512))))
    span = 512 << select
    le = (-span, 0, select, int(rng.integers(-300, 300)), 9, 0, 0)
    lo = (0, span, select, 0, 0, int(rng.integers(-300, 300)), 9)
    tables = np.cumsum(rng.integers(-60, 61, (2, 513)), axis=1).clip(-2000, 2000)
    return le, lo, tables, (1, 0, 1)


def _with_lut(task, le, lo, tables, priorities, ew: str):
    """``task`` with its tables uploaded first and its EW stage running the LUT (then, with
    ``ew`` "add_relu", a register operand added and the ReLU; "erdma": the ERDMA's)."""
    for table in (0, 1):
        task.set("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=table, LUT_ADDR=0)
        for entry in tables[table]:
            task.set("DPU", "LUT_ACCESS_DATA", LUT_ACCESS_DATA=data_word(entry))
    task.set("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=0)
    task.set("DPU", "LUT_CFG", LUT_HYBRID_PRIORITY=priorities[0], LUT_UFLOW_PRIORITY=priorities[1],
             LUT_OFLOW_PRIORITY=priorities[2])
    task.set("DPU", "LUT_INFO", LUT_LE_INDEX_SELECT=le[2], LUT_LO_INDEX_SELECT=lo[2])
    for name, cfg in (("LE", le), ("LO", lo)):
        task.set("DPU", f"LUT_{name}_START", cfg[0] & 0xFFFFFFFF).set("DPU", f"LUT_{name}_END", cfg[1] & 0xFFFFFFFF)
        task.set("DPU", f"LUT_{name}_SLOPE_SCALE", UFLOW_SCALE=cfg[3] & 0xFFFF, OFLOW_SCALE=cfg[5] & 0xFFFF)
        task.set("DPU", f"LUT_{name}_SLOPE_SHIFT", UFLOW_SHIFT=cfg[4], OFLOW_SHIFT=cfg[6])
    if ew == "add_relu":
        task.set("DPU", "EW_CFG", EW_OP_CVT_BYPASS=1, EW_OP_TYPE=0, EW_ALU_ALGO=2)
        task.set("DPU", "EW_OP_VALUE_0", 37)
    elif ew == "erdma":  # the operand from the ERDMA (the task's ERDMA settings), converted, added, ReLU
        task.set("DPU", "EW_CFG", EW_CVT_ROUND=1, EW_DATA_MODE=1, EDATA_SIZE=1, EW_ALU_ALGO=2, EW_OP_SRC=1)
    else:
        task.set("DPU", "EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1, EW_OP_BYPASS=1)
    return task


def _chain(name: str, ew: str, tasks: int):
    """``tasks`` copies of one conv, each uploading its own tables (seeded by its index) and
    writing its own output: per task its spec, the layer, the chain, per task its LUT settings."""
    spec = replace(_spec(name), out_scale=OUT_SCALE, out_shift=OUT_SHIFT, out_offset=0)
    layer = random_layer(spec, 0)
    values = reference_accumulators(spec, layer[0], layer[1], layer[3])
    settings = [_lut_settings(values, 10 + index) for index in range(tasks)]
    specs = [replace(spec, output=spec.output + index * 0x40000) for index in range(tasks)]  # one output each
    chain = [(_with_lut(conv_task(one), *lut_settings, ew), MASK_CONV) for one, lut_settings in zip(specs, settings)]
    return specs, layer, chain, settings


def _expected(spec, x, layer, settings):
    """The reference: BS (test_machine_conv), the LUT (test_machine_support), OUT_CVT."""
    le, lo, tables, priorities = settings
    looked_up = lut_reference(reference_accumulators(spec, x, layer[1], layer[3]), tables[0], tables[1], le, lo,
                              priorities)
    return out_cvt_reference(looked_up, spec.out_scale, spec.out_shift, spec.out_offset)


def _compare(monkeypatch, name: str, ew: str, tasks: int, seed: int = 1):
    """Both machines over RUNS inputs: per run and task (fast output, slow output, expected or
    None), and the counting."""
    specs, layer, chain, settings = _chain(name, ew, tasks)
    spec = specs[0]
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    runs = paired_runs(fast, slow, amount, int8_inputs(seed, (spec.in_c, spec.in_h, spec.in_w)),
                       lambda machine, x: load_cube(machine, spec.feature, x),
                       lambda machine: [_output(machine, one) for one in specs])  # (states: LUT port and RAM too)
    outputs = [(mine, theirs, _expected(spec, x, layer, lut_settings) if ew == "identity" else None)
               for got, want, x in runs for mine, theirs, lut_settings in zip(got, want, settings)]
    return outputs, counting


@pytest.mark.parametrize("name", ["direct_3x3_pad1", "pointwise_70_kernels", "depthwise_3x3_24ch",
                                  "depthwise_3x3_40ch", "direct_odd_channels_strided"])
@pytest.mark.parametrize("ew, tasks", [("identity", 2), ("add_relu", 2), ("identity", 3)])
def test_lut_steps_equal_full_runs(monkeypatch, name, ew, tasks):
    outputs, counting = _compare(monkeypatch, name, ew, tasks)
    for got, want, expected in outputs:
        np.testing.assert_array_equal(got, want)
        if expected is not None:
            np.testing.assert_array_equal(got, expected)
    assert counting.built >= 1 and counting.steps >= tasks  # the LUT tasks did run as steps


def _interleaved(task, spec, rx: int):
    """``task`` writing its cube as phase (0, rx) of a 2H x 2W tensor at ``spec.output`` (the
    interleaved write, kernels/dpu_interleave.py: one W*C-channel pixel a line in WDMA_SIZE,
    NOTCH_ADDR_0 1, SURFACE_ADD two output rows, DST_SURF_STRIDE the whole surface)."""
    width, height = 2 * spec.out_w, 2 * spec.out_h
    task.set("DPU", "DST_BASE_ADDR", spec.output + rx * 16)
    task.set("DPU", "DST_SURF_STRIDE", DST_SURF_STRIDE=width * height)
    task.set("DPU", "DATA_CUBE_NOTCH_ADDR", NOTCH_ADDR_1=1, NOTCH_ADDR_0=1)
    task.set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=spec.out_w * spec.core_channels - 1)
    task.set("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=spec.out_h - 1, WIDTH_WDMA=0)
    task.set("DPU", "SURFACE_ADD", SURF_ADD=2 * width)
    return task


@pytest.mark.parametrize("with_lut", [True, False])
def test_interleaved_steps_equal_full_runs(monkeypatch, with_lut):
    """Two convs (with the LUT or without) writing the phases (0, 0) and (0, 1) of one tensor
    through the interleaved write: their steps store single-atom rows, as the full path's write does."""
    spec = _spec("direct_3x3_pad1")
    if with_lut:
        spec = replace(spec, out_scale=OUT_SCALE, out_shift=OUT_SHIFT, out_offset=0)
    layer = random_layer(spec, 0)
    values = reference_accumulators(spec, layer[0], layer[1], layer[3])
    settings = [_lut_settings(values, 20 + rx) for rx in range(2)]
    tasks = [_with_lut(conv_task(spec), *settings[rx], "identity") if with_lut else conv_task(spec) for rx in range(2)]
    chain = [(_interleaved(task, spec, rx), MASK_CONV) for rx, task in enumerate(tasks)]
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    runs = paired_runs(fast, slow, amount, int8_inputs(3, (spec.in_c, spec.in_h, spec.in_w)),
                       lambda machine, x: load_cube(machine, spec.feature, x),
                       lambda machine: read_cube(machine, spec.output, spec.kernels, 2 * spec.out_h, 2 * spec.out_w))
    for got, want, x in runs:
        np.testing.assert_array_equal(got, want)
        for rx in range(2):
            want = _expected(spec, x, layer, settings[rx]) if with_lut else _conv_expected(spec, x, layer[1], layer[3])
            np.testing.assert_array_equal(got[:, 0::2, rx::2], want)
    assert counting.steps >= 2


def _mismatches(monkeypatch, ew: str = "identity") -> int:
    outputs, counting = _compare(monkeypatch, "direct_3x3_pad1", ew, 2)
    assert counting.steps >= 2
    return sum(int(not np.array_equal(got, want)) for got, want, _ in outputs)


def test_the_checks_catch_a_lut_ram_held_from_build_time(monkeypatch):
    """A step reading a copy of the LUT RAM made when it was built (the second task's tables: the
    chain's last upload) gives the first task the wrong tables; the comparison sees it."""
    inner = dpu_plan._lut_store

    def held(state, fixed, stages, tail, tables, *rest):
        return inner(state, fixed, stages, tail, tables.copy(), *rest)

    assert _mismatches(monkeypatch) == 0
    monkeypatch.setattr(dpu_plan, "_lut_store", held)
    assert _mismatches(monkeypatch) > 0


def test_the_checks_catch_a_table_of_swapped_tables(monkeypatch):
    """The steps' LUT + EW + OUT_CVT table (``after_lut_values``) made from LO and LE swapped."""
    inner = lut.after_lut_values.get

    def swapped(params, le, lo, *rest):
        return inner(params, lo, le, *rest)

    monkeypatch.setattr(lut.after_lut_values, "get", swapped)
    assert _mismatches(monkeypatch) > 0


# ---------------------------------------------------------------------------------------------
# The dense values of lut_stage
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_lut_stage_with_dense_values_equals_the_reference(seed):
    """The second call of a (settings, tables) pair builds its dense values; every call, inputs
    inside and far outside the tables' span (and at the int32 ends), equals the reference."""
    rng = np.random.default_rng(seed)
    select = int(rng.integers(0, 4))
    span = 512 << select
    le = (-span - int(rng.integers(0, 50)), int(rng.integers(-20, 20)), select, int(rng.integers(-500, 500)),
          int(rng.integers(0, 12)), int(rng.integers(-500, 500)), int(rng.integers(0, 12)))
    lo = (int(rng.integers(-20, 20)), span, select, int(rng.integers(-500, 500)), int(rng.integers(0, 12)),
          int(rng.integers(-500, 500)), int(rng.integers(0, 12)))
    tables = rng.integers(-32768, 32768, (2, 513)).astype(np.int16)
    priorities = tuple(int(v) for v in rng.integers(0, 2, 3))
    config = LutConfig(le=LutTableConfig(*le), lo=LutTableConfig(*lo), hybrid_priority=priorities[0],
                       uflow_priority=priorities[1], oflow_priority=priorities[2])
    x = np.concatenate([rng.integers(-3 * span, 3 * span, 3000), [-(2**31), 2**31 - 1, le[0], lo[1]],
                        rng.integers(-(2**31), 2**31, 50)]).astype(np.int32)
    want = lut_reference(x, tables[0].astype(np.int64), tables[1].astype(np.int64), le, lo, priorities)
    for _ in range(3):
        np.testing.assert_array_equal(lut_stage(x, config, tables[0], tables[1]), want)
    base, values = lut.dense_values.get(config.parameters(), tables[0], tables[1])
    width = lo[1] - le[0] + 1
    assert values.size == 3 * width and base == le[0] - width  # (the calls above did use them)
