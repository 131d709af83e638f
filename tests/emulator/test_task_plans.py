"""Task programs (issue 20, emulator/task_plan.py): a replayed chain's CNA+CORE+DPU tasks run
as compiled steps. They must be indistinguishable from the full path - outputs (against the
independent references of test_machine_support), task records with their DMA counters,
register state, task counter and interrupts - and must never run on stale inputs: a changed
register (another start state) or overwritten weights (the derived cache's epoch) leave the
program unused. The last tests break those two guards on purpose and show the checks here
would catch it."""

from dataclasses import replace

import numpy as np
import pytest

import npuemu.emulator.core as core_module
from npuemu.emulator import task_plan
from npuemu.emulator.kernels.conv_pixels import conv_int8_pixels
from npuemu.emulator.kernels.depthwise import depthwise_int8_atoms
from npuemu.emulator.kernels.dpu import EwConfig, OutCvtConfig, XStageConfig
from npuemu.emulator.kernels import dpu_pixel
from npuemu.emulator.kernels.dpu_pixel import plan_stages, planned_to_atoms
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from npuemu.emulator.machine import Machine
from npuemu.emulator.memory import DerivedCache
from npuemu.emulator.units import cna_core
from npuemu.isa.chain import encode_chain
from npuemu.isa.task import Chain
from tests.emulator.test_machine_conv import CASES, choose_out_cvt, random_layer, reference_accumulators
from tests.emulator.test_machine_support import (
    MASK_CONV, MASK_FLYING, REGMAP, ConvSpec, bias_blob, conv_task, flying_task, load_cube, out_cvt_reference,
    read_cube,
)

ADDRESS = 0xF0_0000
RUNS = 10  # (the first runs fill the groups; replays, then programs, come after)


class Counting:
    """Counts the programs built and the compiled steps run (wrapping ``build_program``)."""

    def __init__(self, monkeypatch) -> None:
        self.built = self.steps = 0
        inner = task_plan.build_program

        def build(tasks, memory, made, *lut_tables):
            program = inner(tasks, memory, made, *lut_tables)
            if program is None:
                return None
            self.built += 1
            return task_plan.ChainProgram(program.epoch, tuple(
                None if step is None else self._counted(step) for step in program.steps), program.plain)

        monkeypatch.setattr(core_module, "build_program", build)

    def _counted(self, step):
        def run(cbuf):
            self.steps += 1
            step(cbuf)
        run.held = step.held
        return run


#: besides test_machine_conv's: depthwise layers whose lanes (48) are fewer than the CORE's
#: channels (64), the 3x3 path's other branch
EXTRA = {
    "depthwise_3x3_40ch": ConvSpec(in_c=40, in_h=7, in_w=9, kernels=40, kernel=3, pad_top=1, pad_left=1,
                                   out_h=7, out_w=9, depthwise=True, pad_value=-2),
    "depthwise_3x3_s2_40ch": ConvSpec(in_c=40, in_h=9, in_w=8, kernels=40, kernel=3, stride=2, pad_top=1,
                                      pad_left=1, out_h=5, out_w=4, depthwise=True, pad_value=3),
}


def _spec(name: str):
    spec = replace({**CASES, **EXTRA}[name], bs_shift=14, out_scale=23000, out_offset=-5)
    x, w, _, bs = random_layer(spec, 0)
    return replace(spec, out_shift=choose_out_cvt(reference_accumulators(spec, x, w, bs)))


def _machine(tasks, full: bool, layer=None, spec=None):
    """A machine holding ``tasks`` (TaskWriters) as one chain and ``layer``'s weights and BS blob;
    ``full``: every run through every task's writes (no replay, so no program: the reference)."""
    machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
    if layer is not None:
        _, _, blob, bs = layer
        machine.memory.load(spec.weights, blob.tobytes())
        machine.memory.load(spec.bias, bias_blob(bs.alu, bs.cpend, bs.mul))
    encoded = encode_chain(Chain(tuple(t.task(mask) for t, mask in tasks)), REGMAP, base_addr=ADDRESS)
    machine.memory.load(ADDRESS, encoded.data)
    if full:
        machine.cores[0].regfile.matches = lambda snapshot: False
    return machine, encoded.first_amount


def _state(machine: Machine):
    core = machine.cores[0]
    return core.regfile.snapshot(), core.tasks_run, core.interrupt_raw


def paired_runs(fast: Machine, slow: Machine, amount: int, inputs, load, read) -> list:
    """Each of ``inputs`` through the replaying machine ``fast`` and the full-path ``slow``
    (``load(machine, x)`` stores it, ``read(machine)`` takes what the run left): their task records
    (blocks, groups, decoded states, every DMA counter) and register states are checked equal on
    the way; per input (fast's read, slow's read, x), the reads compared by the caller (a
    deliberately broken step must show in them)."""
    runs = []
    for x in inputs:
        results = []
        for machine in (fast, slow):
            load(machine, x)
            records = machine.run_chain(ADDRESS, amount).tasks
            results.append((records, read(machine)))
        assert results[0][0] == results[1][0]
        assert _state(fast) == _state(slow)
        runs.append((results[0][1], results[1][1], x))
    return runs


def hoist_row_reads(monkeypatch, module) -> None:
    """Break ``module``'s steps on purpose: its ``gather_rows`` copies each row set's bytes of the
    first run and hands them back on every later one (a read hoisted out of the run), which the
    paired checks must catch."""
    inner, kept = module.gather_rows, {}

    def once(data, offsets, rows):
        if id(offsets) not in kept:
            inner(data, offsets, rows)
            kept[id(offsets)] = rows.copy()
        rows[...] = kept[id(offsets)]

    monkeypatch.setattr(module, "gather_rows", once)


def frozen_bs_operands(rng, channels: int) -> dict:
    """Random per-channel BS operands (ALU, CPEND, multiplier), read-only as a plan holds them."""
    operands = dict(bs_alu=rng.integers(-5000, 5000, channels).astype(np.int32),
                    bs_cpend=rng.integers(-20, 20, channels).astype(np.int32),
                    bs_mul=rng.integers(1000, 9000, channels).astype(np.int32))
    for array in operands.values():
        array.flags.writeable = False
    return operands


def int8_inputs(seed: int, shape: tuple, runs: int = RUNS):
    rng = np.random.default_rng(seed)
    return [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(runs)]


def _expected(spec, x, w, bs):
    return out_cvt_reference(reference_accumulators(spec, x, w, bs), spec.out_scale, spec.out_shift, spec.out_offset)


def _output(machine, spec):
    channels = spec.in_c if spec.depthwise else spec.kernels
    return read_cube(machine, spec.output, channels, spec.out_h, spec.out_w)


@pytest.mark.parametrize("name", ["direct_3x3_pad1", "direct_odd_channels_strided", "pointwise_70_kernels",
                                  "depthwise_3x3_24ch", "depthwise_5x5_s2_80ch", "relu_and_truncate",
                                  "depthwise_3x3_40ch", "depthwise_3x3_s2_40ch", "direct_dilated"])
@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_programs_equal_full_runs(monkeypatch, name, tasks):
    spec = _spec(name)
    layer = random_layer(spec, 0)
    counting = Counting(monkeypatch)
    fast, amount = _machine([(conv_task(spec), MASK_CONV)] * tasks, False, layer, spec)
    slow, _ = _machine([(conv_task(spec), MASK_CONV)] * tasks, True, layer, spec)
    rng = np.random.default_rng(1)
    for _ in range(RUNS):
        x = rng.integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
        runs = []
        for machine in (fast, slow):
            load_cube(machine, spec.feature, x)
            runs.append((machine.run_chain(ADDRESS, amount).tasks, _output(machine, spec)))
        (got_records, got), (want_records, want) = runs
        expected = _expected(spec, x, layer[1], layer[3])
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(want, expected)
        assert got_records == want_records  # blocks, groups, decoded states and every DMA counter
        assert _state(fast) == _state(slow)
    assert counting.built >= 1 and counting.steps >= tasks


def _rewritten_weights_outputs(monkeypatch, spec):
    """Outputs of runs 1..4 with the first weights, then runs with new weights loaded over them."""
    layer = random_layer(spec, 0)
    counting = Counting(monkeypatch)
    machine, amount = _machine([(conv_task(spec), MASK_CONV)] * 2, False, layer, spec)
    x = np.random.default_rng(3).integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
    load_cube(machine, spec.feature, x)
    for _ in range(8):
        machine.run_chain(ADDRESS, amount)
    used = counting.steps
    new = random_layer(spec, 7)
    machine.memory.load(spec.weights, new[2].tobytes())  # a host write over the weight bytes
    outputs = []
    for _ in range(8):
        machine.run_chain(ADDRESS, amount)
        outputs.append(_output(machine, spec))
    return outputs, _expected(spec, x, new[1], layer[3]), _expected(spec, x, layer[1], layer[3]), used, counting


def test_overwritten_weights_are_not_taken_from_a_program(monkeypatch):
    spec = _spec("direct_3x3_pad1")
    outputs, expected, _, used, counting = _rewritten_weights_outputs(monkeypatch, spec)
    assert used > 0  # a program ran before the write
    for got in outputs:
        np.testing.assert_array_equal(got, expected)
    assert counting.built >= 2 and counting.steps > used  # built again after the write, and used


def test_the_epoch_check_is_what_catches_overwritten_weights(monkeypatch):
    # broken on purpose: a derived cache whose epoch stays put when a write drops what it kept
    # leaves the program holding the old weights
    def drop(self, keys):
        for key in keys:
            del self._entries[key]
        self._index = None

    monkeypatch.setattr(DerivedCache, "_drop", drop)
    spec = _spec("direct_3x3_pad1")
    outputs, expected, stale, _, _ = _rewritten_weights_outputs(monkeypatch, spec)
    assert not np.array_equal(stale, expected)
    assert any(np.array_equal(got, stale) for got in outputs)
    assert not all(np.array_equal(got, expected) for got in outputs)


def _unwritten_shift_task(spec):
    """``conv_task`` without its OUT_CVT_SHIFT write: the value is whatever the register holds."""
    writer = conv_task(spec)
    writer.writes = [w for w in writer.writes if (w.block, w.register) != ("DPU", "OUT_CVT_SHIFT")]
    return writer


def _poke_shift(machine, shift: int) -> None:
    """OUT_CVT_SHIFT in both DPU groups, as the host could set it between runs."""
    offset = REGMAP.register("DPU", "OUT_CVT_SHIFT").offset
    for group in machine.cores[0].regfile.blocks["DPU"].groups:
        group[offset] = REGMAP.pack("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=shift)


def _changed_register_outputs(monkeypatch, spec):
    """Outputs with OUT_CVT_SHIFT (which the chain does not write) changed after programs ran;
    and the references."""
    layer = random_layer(spec, 0)
    counting = Counting(monkeypatch)
    machine, amount = _machine([(_unwritten_shift_task(spec), MASK_CONV)] * 2, False, layer, spec)
    x = np.random.default_rng(4).integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
    load_cube(machine, spec.feature, x)
    _poke_shift(machine, spec.out_shift)
    for _ in range(8):
        machine.run_chain(ADDRESS, amount)
    np.testing.assert_array_equal(_output(machine, spec), _expected(spec, x, layer[1], layer[3]))
    used = counting.steps
    _poke_shift(machine, spec.out_shift - 1)
    outputs = []
    for _ in range(3):
        machine.run_chain(ADDRESS, amount)
        outputs.append(_output(machine, spec))
    v = reference_accumulators(spec, x, layer[1], layer[3])
    changed = out_cvt_reference(v, spec.out_scale, spec.out_shift - 1, spec.out_offset)
    return outputs, changed, _expected(spec, x, layer[1], layer[3]), used


def test_a_changed_register_does_not_reuse_a_program(monkeypatch):
    spec = _spec("pointwise_70_kernels")
    outputs, changed, _, used = _changed_register_outputs(monkeypatch, spec)
    assert used > 0
    for got in outputs:
        np.testing.assert_array_equal(got, changed)


def test_the_start_state_check_is_what_catches_a_changed_register(monkeypatch):
    # broken on purpose: a replay (and its program) taken whatever the register state
    monkeypatch.setattr("npuemu.emulator.regfile.RegisterFile.matches", lambda self, snapshot: True)
    spec = _spec("pointwise_70_kernels")
    outputs, changed, old, _ = _changed_register_outputs(monkeypatch, spec)
    assert not np.array_equal(changed, old)
    np.testing.assert_array_equal(outputs[0], old)  # stale: what the test above catches


def test_a_flying_int8_to_fp16_copy_between_convolutions_is_a_step(monkeypatch):
    """A flying DPU copy converting int8 to fp16 between convolutions: a step since session 16
    (units/dpu_plan_convert.py; until then the full path), equal to the full path in outputs,
    records and state. Forms that still take the full path inside a program:
    test_dpu_int_to_fp16_step.py and test_replay_loose_match.py."""
    spec = _spec("pointwise_70_kernels")
    layer = random_layer(spec, 0)
    copy = flying_task(spec.out_w, spec.out_h, 80, src=spec.output, dst=0x380000)
    copy.set("DPU", "DATA_FORMAT", OUT_PRECISION=2)  # fp16 out: 8-lane atoms
    copy.set("DPU", "OUT_CVT_OFFSET", 0).set("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=0)  # (the conv's group)
    chain = [(conv_task(spec), MASK_CONV), (copy, MASK_FLYING), (conv_task(spec), MASK_CONV)]
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    rng = np.random.default_rng(5)
    for _ in range(RUNS):
        x = rng.integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
        results = []
        for machine in (fast, slow):
            load_cube(machine, spec.feature, x)
            records = machine.run_chain(ADDRESS, amount).tasks
            results.append((records, machine.memory.dump(0x380000, 10 * spec.out_h * spec.out_w * 16)))
            np.testing.assert_array_equal(_output(machine, spec), _expected(spec, x, layer[1], layer[3]))
        assert results[0][0] == results[1][0]
        np.testing.assert_array_equal(results[0][1], results[1][1])  # the copy's output
        halves = results[0][1].view(np.float16).reshape(10, spec.out_h, spec.out_w, 8)
        values = halves.transpose(0, 3, 1, 2).reshape(80, spec.out_h, spec.out_w)[:spec.kernels]
        np.testing.assert_array_equal(values, _expected(spec, x, layer[1], layer[3]))  # each int8 as an fp16
        assert _state(fast) == _state(slow)
    program = fast.cores[0]._replays.get(fast.cores[0]._fetch(ADDRESS, amount))[0].program[0]
    assert [step is None for step in program.steps] == [False, False, False]
    assert counting.steps >= 3


def test_weight_reuse_takes_the_cbuf_as_the_full_path_does(monkeypatch):
    spec = _spec("direct_3x3_pad1")
    layer = random_layer(spec, 0)
    second = replace(spec, weight_reuse=True, output=0x340000)
    chain = [(conv_task(spec), MASK_CONV), (conv_task(second), MASK_CONV)]
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    rng = np.random.default_rng(6)
    for _ in range(RUNS):
        x = rng.integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
        records = []
        for machine in (fast, slow):
            load_cube(machine, spec.feature, x)
            records.append(machine.run_chain(ADDRESS, amount).tasks)
            np.testing.assert_array_equal(_output(machine, second), _expected(spec, x, layer[1], layer[3]))
        assert records[0] == records[1]
        assert records[0][1].traffic.weight_read == 0  # taken from the CBUF, not fetched
    assert counting.steps >= 2


# ---------------------------------------------------------------------------------------------
# The prepared kernels against the kernels they stand for (same inputs, same bits)
# ---------------------------------------------------------------------------------------------
STORE_CONFIGS = {
    # the float64 chain: BS add + CPEND, OUT_CVT
    "chain": dict(bs=XStageConfig(alu_enable=True, mul_enable=True, shift_positive=14, shift_negative=14,
                                  cpend_enable=True), cvt=OutCvtConfig(23000, 17, -5)),
    # the int64 stages: a BS ALU max is no chain form
    "stages": dict(bs=XStageConfig(alu_enable=True, alu_algo=0, mul_enable=True, shift_positive=3, shift_negative=5,
                                   cpend_enable=True), cvt=OutCvtConfig(20000, 16, 3)),
    # with an EW add of a per-pixel operand
    "ew": dict(bs=XStageConfig(alu_enable=True, mul_enable=True, shift_positive=10, shift_negative=10,
                               cpend_enable=True), ew=EwConfig(cvt_enable=True, cvt_scale=300, cvt_shift=2,
                                                               op_enable=True, relu=True),
               cvt=OutCvtConfig(21000, 15, 1)),
}


@pytest.mark.parametrize("config", sorted(STORE_CONFIGS))
@pytest.mark.parametrize("huge_sums", [False, True])
def test_prepared_store_equals_planned_to_atoms(config, huge_sums):
    rng = np.random.default_rng(sorted(STORE_CONFIGS).index(config))
    channels, height, width, c2 = 40, 3, 5, 16
    surfaces, pixels = 3, height * width
    settings = STORE_CONFIGS[config]
    operands = frozen_bs_operands(rng, channels)
    ew_type = np.dtype(np.int8) if "ew" in settings else None
    plan = plan_stages(channels, np.int8, np.int32, ew_type, **settings, **operands)
    offsets = (np.arange(surfaces * height, dtype=np.int64) * width * 2)
    store = prepare_planned_to_atoms(plan, pixels, width, np.zeros(1, np.uint64), offsets, c2, surfaces)
    assert store is not None
    for run in range(3):
        data = rng.integers(-(2**20), 2**20, (1, pixels, channels)).astype(np.int32)
        top = 2**40 if huge_sums else 2**12  # past the chain's window bound: the stages path
        sums = rng.integers(-top, top, (1, height, width)).astype(np.int64)
        operand = rng.integers(-128, 128, (1, pixels, channels)).astype(np.int8) if ew_type else None
        outputs = []
        for prepared in (True, False):
            words = np.zeros(surfaces * height * width * 2, np.uint64)
            if prepared:
                store = prepare_planned_to_atoms(plan, pixels, width, words, offsets, c2, surfaces)
                store(data, sums, operand)
            else:
                planned_to_atoms(plan, data, width, words, offsets, c2, surfaces, sums, operand)
            outputs.append(words)
        np.testing.assert_array_equal(outputs[0], outputs[1])
        assert outputs[0].any()


@pytest.mark.parametrize("name", ["direct_3x3_pad1", "direct_odd_channels_strided", "pointwise_70_kernels",
                                  "direct_dilated", "depthwise_3x3_24ch", "depthwise_5x5_s2_80ch",
                                  "depthwise_3x3_40ch", "relu_and_truncate"])
def test_prepared_conv_kernels_equal_the_plain_ones(name):
    spec = _spec(name)
    machine, amount = _machine([(conv_task(spec), MASK_CONV)], True, random_layer(spec, 0), spec)
    state = machine.run_chain(ADDRESS, amount).tasks[0].conv  # (its weights now in the derived cache)
    plan = cna_core._PLANS(state)
    weights = machine.memory.derived.get((int(plan.weight_rows[0]), plan.weight_bytes, plan.weight_cache_key))
    assert weights is not None and not weights.flags.writeable
    kernel = cna_core._prepared_kernel(state, plan)
    rng = np.random.default_rng(9)
    for _ in range(3):
        feature = rng.integers(-128, 128, plan.feature_shape).astype(np.int8)
        if plan.mask_channels:
            cna_core._mask_channels(feature, state.real_channels)
        got = kernel(feature, weights)
        if state.depthwise:
            want = depthwise_int8_atoms(feature, weights, plan.geometry, state.pad_value, state.clip_truncate,
                                        plan.round_mode, state.out_channels)
        else:
            want = conv_int8_pixels(feature, state.in_channels, state.real_channels, weights, plan.geometry,
                                    state.pad_value, state.clip_truncate, plan.round_mode, state.out_channels)
        np.testing.assert_array_equal(got.data, want[0])
        np.testing.assert_array_equal(got.window_sums, want[1])


def test_weights_a_chain_writes_every_run_keep_only_that_task_on_the_full_path(monkeypatch):
    """Task 1 takes its weights from the bytes task 0 writes (as a conv on a computed operand
    would): every run drops them from the derived cache. Task 1 runs the full path each time,
    task 0 keeps its step, and both machines agree bit for bit."""
    spec = _spec("pointwise_70_kernels")
    layer = random_layer(spec, 0)
    second = replace(spec, weights=spec.output, output=0x340000)
    chain = [(conv_task(spec), MASK_CONV), (conv_task(second), MASK_CONV)]
    counting = Counting(monkeypatch)
    fast, amount = _machine(chain, False, layer, spec)
    slow, _ = _machine(chain, True, layer, spec)
    rng = np.random.default_rng(8)
    for run in range(RUNS):
        x = rng.integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
        results = []
        for machine in (fast, slow):
            load_cube(machine, spec.feature, x)
            records = machine.run_chain(ADDRESS, amount).tasks
            results.append((records, _output(machine, second)))
        assert results[0][0] == results[1][0]
        np.testing.assert_array_equal(results[0][1], results[1][1])
        np.testing.assert_array_equal(_output(fast, spec), _expected(spec, x, layer[1], layer[3]))
        if run == RUNS - 5:
            steps = counting.steps
    assert counting.steps - steps >= 4  # task 0's step ran on in the last runs
    program = fast.cores[0]._replays.get(fast.cores[0]._fetch(ADDRESS, amount))[0].program
    assert program[0] is not None and program[1] == task_plan.MAX_BUILDS


# ---------------------------------------------------------------------------------------------
# One prepared store run again and again (as a program runs it), inputs changing every run
# ---------------------------------------------------------------------------------------------
HELD_CONFIGS = {
    **STORE_CONFIGS,
    # no CPEND: no window sums at all
    "no_cpend": dict(bs=XStageConfig(alu_enable=True, mul_enable=True, shift_positive=12, shift_negative=12,
                                     relu=True), cvt=OutCvtConfig(25000, 16, -3)),
}


def _held_case(config: str, channels: int, surfaces: int, per_tensor: bool, seed: int):
    """A stage plan of ``config`` and the inputs of five runs: data, window sums (the third run's
    past the chain's bound: the stages path in between) and EW operands that change every run."""
    rng = np.random.default_rng(seed)
    height, width = 3, 50  # 150 pixels: several blocks of BLOCK_ELEMENTS // channels
    settings = HELD_CONFIGS[config]
    operands = frozen_bs_operands(rng, channels)
    ew_type = np.dtype(np.int8) if "ew" in settings else None
    plan = plan_stages(channels, np.int8, np.int32, ew_type, **settings, **operands)
    runs = []
    for run in range(5):
        data = rng.integers(-(2**20), 2**20, (1, height * width, channels)).astype(np.int32)
        top = 2**40 if run == 2 else 2**12
        sums = rng.integers(-top, top, (1, height, width)).astype(np.int64)
        shape = (1, 1, 1) if per_tensor else (1, height * width, channels)
        operand = rng.integers(-128, 128, shape).astype(np.int8) if ew_type else None
        runs.append((data, sums, operand))
    offsets = np.arange(surfaces * height, dtype=np.int64) * width * 2
    return plan, runs, (height * width, width, offsets, 16, surfaces)


def _held_mismatches(config: str, channels: int, surfaces: int, per_tensor: bool, seed: int = 0) -> list[int]:
    """The runs in which one prepared store, run again and again, wrote other words than
    ``planned_to_atoms`` on the same inputs."""
    plan, runs, (pixels, width, offsets, c2, surfaces) = _held_case(config, channels, surfaces, per_tensor, seed)
    words = np.zeros(surfaces * pixels * 2, np.uint64)
    store = prepare_planned_to_atoms(plan, pixels, width, words, offsets, c2, surfaces)
    assert store is not None
    wrong = []
    for index, (data, sums, operand) in enumerate(runs):
        words[:] = 0
        store(data, sums, operand)
        want = np.zeros_like(words)
        planned_to_atoms(plan, data, width, want, offsets, c2, surfaces, sums, operand)
        assert want.any()
        if not np.array_equal(words, want):
            wrong.append(index)
    return wrong


@pytest.mark.parametrize("config, per_tensor", [(name, False) for name in sorted(HELD_CONFIGS)] + [("ew", True)])
@pytest.mark.parametrize("channels, surfaces", [(40, 2), (48, 3)])  # atoms narrower than the channels, equal
def test_a_prepared_store_run_again_equals_planned_to_atoms(config, channels, surfaces, per_tensor):
    assert _held_mismatches(config, channels, surfaces, per_tensor) == []


def test_the_checks_catch_an_operand_kept_from_another_run(monkeypatch):
    # broken on purpose: a per-tensor EW operand kept from the first run (as if converted once
    # when the store was prepared) must fail the comparison above
    from npuemu.emulator.kernels import dpu_pixel_plan

    converted, first = dpu_pixel_plan._operand, []

    def kept(ew_operand, channels, pixels):
        first.append(ew_operand)
        return converted(first[0], channels, pixels)

    monkeypatch.setattr(dpu_pixel_plan, "_operand", kept)
    assert _held_mismatches("ew", 48, 3, True) == [1, 3, 4]  # (run 2: past the chain's bound, saturated)


# ---------------------------------------------------------------------------------------------
# The chain's arithmetic form (kernels/dpu_pixel.py _chain_value): ALU and CPEND premultiplied
# by MUL * 2**-shift, and BS's clamp from 0 as one max before the rounding
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("scale", [3 << 13, -(3 << 13)])  # OUT_CVT non-decreasing (BS's clamp folded) or not
@pytest.mark.parametrize("shift, mul_top", [(1, 1), (1, 2**15 - 1), (14, 2**15 - 1)])
def test_the_chain_rounds_ties_and_zero_as_the_int64_stages(monkeypatch, relu, scale, shift, mul_top):
    """Sums whose product by MUL * 2**-shift lands on ties (+-k.5), just either side of 0, past
    BN's RELUX bound and large, through the chain (checked to run; BS's clamp from 0 where BN's
    ReLU is on) against the per-element reference chain."""
    from tests.emulator.test_dpu_pixel import as_atoms, expected_cube
    from tests.emulator.test_dpu_pixel import run as run_pass

    calls = []
    kernel = dpu_pixel._chain_pixels_to_atoms
    monkeypatch.setattr(dpu_pixel, "_chain_pixels_to_atoms", lambda *args: calls.append(args[5]) or kernel(*args))
    channels, height, width = 16, 4, 6
    rng = np.random.default_rng(shift + mul_top)
    bs = XStageConfig(alu_enable=True, mul_enable=True, shift_positive=shift, shift_negative=shift,
                      cpend_enable=True)
    bn = XStageConfig(relu=relu, relux=True, relux_value=40)
    cvt = OutCvtConfig(scale, 14 + shift, -3)
    mul = np.where(rng.random(channels) < 0.5, mul_top, 1).astype(np.int32)
    alu = rng.integers(-3, 4, channels).astype(np.int32)
    cpend = rng.integers(-2, 3, channels).astype(np.int32)
    data = rng.integers(-4, 5, (channels, height, width)).astype(np.int32)
    data[:, 0, :] = rng.integers(-(2**31), 2**31, (channels, width))  # large sums of both signs
    sums = rng.integers(-3, 4, (1, height, width)).astype(np.int64)
    # rows 1 and 2: (data + CPEND * window + ALU) * MUL = ties +-(2j + 1) * 2**(shift-1), and
    # values in (-2**shift, 0), where MUL is 1
    odd = (2 * np.arange(width) + 1) * (1 << (shift - 1)) * np.where(np.arange(width) % 2, -1, 1)
    small = -rng.integers(1, 1 << shift, width)
    for row, target in ((1, odd), (2, small)):
        data[:, row, :] = target[None, :] - cpend[:, None] * sums[0, row][None, :] - alu[:, None]
    atoms, _ = run_pass(data, "hwc", channels, np.int8, 16, 1, bs=bs, bs_alu=alu, bs_cpend=cpend, bs_mul=mul,
                        window_sum=sums, bn=bn, cvt=cvt)
    want = expected_cube(data, sums, alu, cpend, mul, (0, 1), None, {"bs": bs, "bn": bn, "cvt": cvt}, np.int8)
    np.testing.assert_array_equal(atoms, as_atoms(want, 16, 1, np.int8))
    assert len(calls) == 1 and (calls[0][dpu_pixel.CH_LOW1] == 0) == relu
    # the data holds what the form could get wrong: ties, and sums below 0 (a ReLU's 0)
    products = (data.astype(np.int64) + cpend[:, None, None] * sums + alu[:, None, None]) * mul[:, None, None]
    assert np.any(products % (1 << shift) == 1 << (shift - 1)) and np.any((products < 0) & (products > -(1 << shift)))


def test_the_reference_catches_operands_not_premultiplied(monkeypatch):
    # broken on purpose: the chain given ALU and CPEND without the MUL * 2**-shift factor (the
    # form before the premultiplied one) must fail the comparison above
    made = dpu_pixel._chain_operands

    def unscaled(matrix, bs):
        floats, tops = made(matrix, bs)
        floats = floats.copy()
        floats[:2] /= floats[2]
        return floats, tops

    monkeypatch.setattr(dpu_pixel, "_chain_operands", unscaled)
    with pytest.raises(AssertionError):
        test_the_chain_rounds_ties_and_zero_as_the_int64_stages(monkeypatch, False, 3 << 13, 1, 1)


@pytest.mark.parametrize("scale", [3 << 13, -(3 << 13)])
def test_the_reference_catches_a_chain_without_bs_clamp(monkeypatch, scale):
    # broken on purpose: the chain's BS/BN clamp opened at the top (BN's RELUX lost) must fail
    # the comparison above, in the folded form (scale >= 0) and the other
    made = dpu_pixel.chain_settings

    def opened(*args):
        settings = made(*args)
        if settings is None:
            return None
        chain = settings[0].copy()
        chain[dpu_pixel.CH_HIGH1] = dpu_pixel.CHAIN_BOUND
        return chain, settings[1]

    monkeypatch.setattr(dpu_pixel, "chain_settings", opened)
    with pytest.raises(AssertionError):
        test_the_chain_rounds_ties_and_zero_as_the_int64_stages(monkeypatch, True, scale, 1, 1)


# ---------------------------------------------------------------------------------------------
# The CORE stage's conversion of one exact chunk's sums (kernels/conv_pixels.py _core_rows exact)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel, channels", [(1, 1024), (3, 113)])  # a 1x1 product; the per-tap products
@pytest.mark.parametrize("sign", [1, -1])
def test_one_chunk_sums_at_the_float32_bound_convert_exactly(kernel, channels, sign):
    """All -128 inputs and weights of -128 (or 127, 127 ... for the other sign): the sums reach
    the one-chunk bound 2**24 (1024 products of 2**14), where the float32 sums enter int32 by
    conversion alone; against int64 sums, through the plain and the prepared kernel."""
    from npuemu.emulator.kernels import ConvGeometry
    from npuemu.emulator.kernels.conv_pixels import PixelOperands, prepare_conv_int8_pixels

    size, kernels = 6, 3
    x = np.full((channels, size, size), -128, np.int8)
    w = np.full((kernels, channels, kernel, kernel), -128 if sign > 0 else 127, np.int8)
    w[1, : channels // 2] = 1  # a second magnitude in the same product
    w.flags.writeable = False
    pad = kernel // 2
    geometry = ConvGeometry(kernel, kernel, size, size, pad_top=pad, pad_left=pad)
    assert len(PixelOperands.build(w, channels).bounds) == 2  # one exact chunk
    padded = np.full((channels, size + 2 * pad, size + 2 * pad), -128, np.int64)
    want = np.zeros((size * size, kernels), np.int64)
    for ky in range(kernel):
        for kx in range(kernel):
            window = padded[:, ky:ky + size, kx:kx + size].reshape(channels, -1)
            want += window.T @ w[:, :, ky, kx].astype(np.int64).T
    if kernel == 1:
        assert np.abs(want).max() == (1 << 24 if sign > 0 else 127 * 128 * 1024)
    atoms = np.ascontiguousarray(x.reshape(channels // 16 if channels % 16 == 0 else -1, 16, size, size)
                                 .transpose(0, 2, 3, 1)) if channels % 16 == 0 else None
    if atoms is None:  # 113 channels in 8 atoms of 16 lanes, the last lanes 0
        lanes = np.zeros((128, size, size), np.int8)
        lanes[:channels] = x
        atoms = np.ascontiguousarray(lanes.reshape(8, 16, size, size).transpose(0, 2, 3, 1))
    prepared = prepare_conv_int8_pixels(atoms.shape, channels, channels, w, geometry, -128, 0, 0, kernels + 2)
    for out, sums in (conv_int8_pixels(atoms, channels, channels, w, geometry, -128, 0, 0, kernels + 2),
                      prepared(atoms)):
        np.testing.assert_array_equal(out[:, :kernels], want)
        assert not out[:, kernels:].any()
        np.testing.assert_array_equal(sums.reshape(-1), np.full(size * size, -128 * channels * kernel * kernel))
