"""Runs of fp16 task steps as one compiled call (issue 20, kernels/step_batch_fp16.py ``run_fp16_ops``,
task_batches.py ``StepBatch`` with its fp16 entry, cna_core ``_fp16_batch``, dpu_plan_fp ``batch_form`` /
``batch_runner``).

The interpreter against the kernels called directly on the same arguments (each kind: conv_fp16_step's
depthwise, gemm, narrow and few steps, dpu_fp_chain.fp16_step with its arrays in the thread's buffers):
every array equal after. Small fp16 models (test_task_plans_fp16's, and one of 1-4 kernels) run by three
runtimes - batched, the steps one by one (``runs=None``) and the full unit path - must give the same
output bits, task records (every DMA counter), registers, task counters, interrupts and LUT RAM, and the
batched and one-by-one runtimes the same Cbuf; also where the LUT RAM changes under a LUT member (it runs
as its step and its calls are made again) and where a member raises mid-batch. Broken variants are caught."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator import task_batches
from npuemu.emulator.kernels import (conv_fp16_step, convert_stores, depthwise_fp16_rows, dpu_fp_chain,
                                     gemm_fp32_seq)
from npuemu.emulator.kernels import step_batch_fp16 as batch
from npuemu.emulator.regfile import RegisterFile
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.units import cna_core
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import EmulationError
from tests.compiler.test_build_e2e import Net
from tests.emulator import test_task_plans_fp16 as plans
from tests.emulator.test_conv_fp16_step import _fill, _held_setup, _masked, convs
from tests.emulator.test_dpu_fp_chain import ew_configs, x_configs
from tests.emulator.test_fp16_step_work import _task
from tests.emulator.test_step_batch import _raising_at

pytestmark = pytest.mark.skipif(not depthwise_fp16_rows.available() or gemm_fp32_seq._PLAIN,
                                reason="the one-call steps need F16C in Numba's target and the tile kernel")

NO_BUFFER = np.zeros(1, np.float32)


def _arrays(arguments) -> list:
    """The arrays among a call's arguments (a tuple argument's too)."""
    found = []
    for value in arguments:
        if isinstance(value, np.ndarray):
            found.append(value)
        elif isinstance(value, tuple):
            found += _arrays(value)
    return found


def _same_as_direct(kernel, arguments, buffers=(NO_BUFFER,) * 3, work=None, entry="run_fp16_ops") -> None:
    """``kernel(*arguments)`` and the op of the same call through ``entry`` (``run_fp16_ops``, or the DPU-only
    ``run_fp16_dpu_ops``), each from the same bytes of every array: every array (the thread buffers too) the
    same bytes after."""
    row = batch.encoded_calls(((kernel, arguments),))
    assert row is not None
    arrays = _arrays(arguments) + list(buffers) + ([] if work is None else [work])
    arrays = [array for array in arrays if array.flags.writeable]
    before = [array.copy() for array in arrays]
    with np.errstate(all="ignore"):
        kernel(*(_resolved(value, buffers, work) for value in arguments))
    direct = [array.copy() for array in arrays]
    for array, was in zip(arrays, before):
        array[...] = was
    table = np.array(row, np.int64)
    assert getattr(batch, entry)(table, 0, 1, NO_BUFFER if work is None else work, *buffers) == 1
    for array, want in zip(arrays, direct):
        assert array.tobytes() == want.tobytes()


def _resolved(value, buffers, work):
    """A thread buffer argument as the array the op makes of it."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "buffer":
        source = work if value[1] == batch.WORK_BUFFER else buffers[value[1] - 1]
        return source[:int(np.prod(value[2]))].reshape(value[2])
    return value


def _conv_step(case, kind: str):
    geometry, channels, real, c1, height, width, _, out_channels, _ = case
    rng, (data, offsets, row_bytes), rows, weights, pad = _held_setup(case, 1 if kind == "depthwise" else channels)
    shape = (c1, height, width, 8)
    prepare = {"depthwise": conv_fp16_step.prepare_depthwise_step, "gemm": conv_fp16_step.prepare_gemm_step,
               "few": conv_fp16_step.prepare_few_step}[kind]
    run = prepare(shape, channels, weights, geometry, pad, out_channels, rows)
    assume(run is not None)
    _masked(_fill(rng, data, offsets, row_bytes, shape, channels), real)
    run.arguments[11 if kind == "gemm" else -3 if kind == "depthwise" else -1][...] = np.nan  # (stale output)
    return run


@settings(max_examples=60, deadline=None)
@given(convs(depthwise=True))
def test_depthwise_ops_equal_the_kernel_called_directly(case):
    run = _conv_step(case, "depthwise")
    assert run.kernel is conv_fp16_step.depthwise_step
    _same_as_direct(run.kernel, run.arguments)


@settings(max_examples=80, deadline=None)
@given(convs())
def test_gemm_and_narrow_ops_equal_the_kernel_called_directly(case):
    run = _conv_step(case, "gemm")
    assert run.kernel in (conv_fp16_step.gemm_step, conv_fp16_step.narrow_step, conv_fp16_step.narrow_halves_step)
    _same_as_direct(run.kernel, run.arguments)


@settings(max_examples=60, deadline=None)
@given(convs(few=True))
def test_few_ops_equal_the_kernel_called_directly(case):
    run = _conv_step(case, "few")
    assert run.kernel is conv_fp16_step.few_step
    _same_as_direct(run.kernel, run.arguments)


@settings(max_examples=80, deadline=None)
@given(st.tuples(st.integers(1, 20), st.integers(1, 4), st.integers(1, 9), st.booleans(),
                 st.sampled_from(["scalar", "channel", "pixel"]), st.one_of(st.none(), x_configs()),
                 st.one_of(st.none(), x_configs()), st.one_of(st.none(), ew_configs())),
       st.sampled_from(["work", "buffers", "own"]), st.integers(0, 2**31),
       st.sampled_from(["run_fp16_ops", "run_fp16_dpu_ops"]))
def test_dpu_ops_equal_the_kernel_called_directly(task, where, seed, entry):
    """``fp16_step`` with its cube, operand and result in the DPU's working buffer (``IN_WORK``), in the thread's
    result / operand / cube buffers (``("buffer", index, shape)``), or arrays of its own; buffers of garbage."""
    rng = np.random.default_rng(seed)
    channels, height, width, flying, operand_kind, bs, bn, ew = task
    (cube, operand, regions, ints, floats, table), _, region = _task(rng, channels, height, width, flying,
                                                                     operand_kind, bs, bn, ew)
    shape = (channels, height, width)
    garbage = lambda size: rng.integers(0, 1 << 32, size, dtype=np.uint32).view(np.float32)  # noqa: E731
    work, buffers = garbage(dpu_fp_chain.WORK), (garbage(shape[0] * height * width + 3), garbage(channels * height
                                                                                                * width + 5),
                                                 garbage(channels * height * width + 1))
    out = dpu_fp_chain.IN_WORK
    if where != "work":
        in_buffer = where == "buffers"
        out = ("buffer", 1, shape) if in_buffer else garbage(np.prod(shape)).reshape(shape)
        if cube is dpu_fp_chain.IN_WORK:
            cube = ("buffer", 3, shape) if in_buffer else garbage(np.prod(shape)).reshape(shape)
        if operand is dpu_fp_chain.IN_WORK:
            operand_shape = (channels, 1, 1) if operand_kind == "channel" else shape
            operand = ("buffer", 2, operand_shape) if in_buffer else garbage(np.prod(operand_shape)).reshape(
                operand_shape)
    arguments = (cube, operand, out, *regions, region, ints, floats, table, *dpu_fp_chain.NO_LUT,
                 ("buffer", batch.WORK_BUFFER, (dpu_fp_chain.WORK,)))
    _same_as_direct(dpu_fp_chain.fp16_step, arguments, buffers, work, entry)


def test_without_f16c_only_the_dpu_kind_is_made_and_its_entry_runs_it(monkeypatch):
    """A target without F16C (``halves_native`` False): conv_fp16_step's kernels are never prepared there and
    would not link (their IR widens halves with F16C's instructions), so no op of theirs is made and the
    batches call the DPU-only entry (with the conversions' kinds), which does not compile them."""
    assert batch.entry() is batch.run_fp16_ops  # (this host: F16C, the tests' other kinds run)
    monkeypatch.setattr(batch, "halves_native", lambda: False)
    # (the conversions' kernels - kernels/convert_stores.py - pick their loops for the target themselves)
    assert set(batch.kinds().values()) == {batch.DPU, batch.CONVERT, batch.TO_INT8}
    assert batch.entry() is batch.run_fp16_dpu_ops
    arguments = tuple(np.zeros((1,) * ndim, dtype) if form == "array" else 0 if form == "n" else
                      np.float32(0) if form == "f4" else np.uint32(0) if form == "u4" else (0,) * 11
                      for form, dtype, ndim, _ in batch._PARSED[batch.DEPTHWISE])
    assert batch.encoded_calls(((conv_fp16_step.depthwise_step, arguments),)) is None


def _int8_reference(values, half_even: bool, shape: tuple, c2: int, offsets, data) -> np.ndarray:
    """``data`` after the fp16 -> int8 store, written here: each value rounded (half to even, or half away from
    zero), NaN 0, saturated to int8; row r of the atoms surface r // H, line r % H, lane l channel s * C2 + l of
    the first ``shape[0]`` channels, lanes past them 0."""
    wide = values.astype(np.float64)
    rounded = np.rint(wide) if half_even else np.sign(wide) * np.floor(np.abs(wide) + 0.5)
    ints = np.clip(np.where(np.isnan(rounded), 0.0, rounded), -128, 127).astype(np.int64)
    channels, height, width = shape
    planes = ints[:channels * height * width].reshape(shape)
    out = data.copy()
    for row, at in enumerate(offsets.tolist()):
        surface, y = divmod(row, height)
        for x in range(width):
            for lane in range(c2):
                channel = surface * c2 + lane
                out[at + x * c2 + lane] = planes[channel, y, x] & 0xFF if channel < channels else 0
    return out


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 3), st.integers(1, 5), st.sampled_from([8, 16]), st.booleans(),
       st.integers(0, 2**32 - 1), st.sampled_from(["run_fp16_ops", "run_fp16_dpu_ops"]))
def test_int8_store_ops_write_the_reference_bytes(channels, height, width, c2, half_even, seed, entry):
    """The TO_INT8 op (kernels/convert_stores.py ``int8_store``: an fp16 step's int8 output) through either entry,
    and the call itself, against the store written above: ties, NaN, infinities, values past int8; rows in a
    random order with gaps; the last surface's lanes past the channels."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(channels * height * width + 3) * 90).astype(np.float32)
    values[rng.integers(0, values.size, 6)] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.5, -2.5, 127.5,
                                                                   -128.5, 1e9], np.float32), 6)
    values[: values.size // 3] = np.round(values[: values.size // 3]) + 0.5  # (ties)
    surfaces, line = -(-channels // c2), width * c2
    offsets = (rng.permutation(surfaces * height + 2)[:surfaces * height] * (line + 3) + 5).astype(np.int64)
    data = rng.integers(0, 256, int(offsets.max()) + line + 9).astype(np.uint8)
    ints = np.zeros(values.size, np.int8)
    planes = ints[:channels * height * width].view(np.uint8).reshape(channels, height, width)
    arguments = (values, half_even, ints, planes, c2, offsets, data)
    expected = _int8_reference(values, half_even, (channels, height, width), c2, offsets, data)
    row = batch.encoded_calls(((convert_stores.int8_store, arguments),))
    assert getattr(batch, entry)(np.array(row), 0, 1, NO_BUFFER, NO_BUFFER, NO_BUFFER, NO_BUFFER) == 1
    np.testing.assert_array_equal(data, expected)
    data[...] = rng.integers(0, 256, data.size)
    expected = _int8_reference(values, half_even, (channels, height, width), c2, offsets, data)
    convert_stores.int8_store(*arguments)
    np.testing.assert_array_equal(data, expected)


def test_arguments_off_the_spec_make_no_op():
    arguments = tuple(np.zeros((1,) * ndim, dtype) if form == "array" else 0 if form == "n" else
                      np.float32(0) if form == "f4" else np.uint32(0) if form == "u4" else (0,) * 11
                      for form, dtype, ndim, _ in batch._PARSED[batch.DEPTHWISE])
    assert batch.encoded(batch.DEPTHWISE, arguments) is not None
    for at, other in ((0, np.zeros(1, np.int8)), (2, np.zeros((2, 2), np.uint8)[:, :1]), (11, True), (7, 0.5),
                      (6, (0,) * 10), (5, ("buffer", 0, (1, 1)))):
        assert batch.encoded(batch.DEPTHWISE, arguments[:at] + (other,) + arguments[at + 1:]) is None
    assert batch.encoded(batch.DEPTHWISE, arguments[:-1]) is None
    assert batch.encoded_calls(((len, ()),)) is None  # (a kernel no kind runs)


def _few() -> tuple[onnx.ModelProto, tuple]:
    """Convs of 1-4 kernels (few_step: the pointwise and the direct loop) between wider ones, a Sigmoid."""
    net = Net(7)
    net.conv("c1", "x", "a", 8, 16)
    net.conv("c2", "a", "b", 16, 3, kernel=1)
    net.node("Sigmoid", ["b"], ["s"], "sig")
    net.conv("c3", "s", "c", 3, 2)
    net.conv("c4", "c", "y", 2, 12)
    return net.model([1, 8, 9, 10], "y"), None


MODELS = dict(plans.MODELS, few=_few)


def _one_by_one(runtime: Runtime) -> Runtime:
    """``runtime``'s programs run without their batches (``_run_steps``' loop of single steps)."""
    for core in runtime.machine.cores:
        inner = core._run_steps
        core._run_steps = lambda replay, steps, epoch, runs=None, inner=inner: inner(replay, steps, epoch, None)
    return runtime


def _cbufs(runtime: Runtime) -> list:
    return [tuple(None if slot is None else (slot.key, slot.array.tobytes()) for slot in (cbuf.feature, cbuf.weights))
            + (tuple(key for key, _, _ in cbuf._older_weights),) for cbuf in (core.cbuf for core in
                                                                              runtime.machine.cores)]


def _state(runtime: Runtime) -> list:
    return plans._state(runtime) + [core.regfile.lut.tables.tobytes() for core in runtime.machine.cores]


def _runtimes(tmp_path, name: str) -> tuple:
    monkeypatched = dict(plans.MODELS)
    plans.MODELS.update(MODELS)
    try:
        path, shapes = plans._compiled(tmp_path, name)
    finally:
        plans.MODELS.clear()
        plans.MODELS.update(monkeypatched)
    batched, full = plans._runtimes(path)
    return (batched, _one_by_one(Runtime(ModelFile.read(path))), full), shapes


def _feeds(rng, shapes: dict) -> dict:
    return {name: rng.normal(0, 1, one).astype(np.float32) for name, one in shapes.items()}


def _run_all(runtimes, feeds) -> list:
    for runtime in runtimes:
        for name, x in feeds.items():
            runtime.set_input(name, x)
        runtime.run()
    return [[np.asarray(runtime.output(o, False)).tobytes() for o in runtime.outputs] for runtime in runtimes]


def _check_equal(runtimes, outputs) -> None:
    batched, one, full = runtimes
    assert outputs[0] == outputs[1] == outputs[2]
    assert [run.tasks for run in batched.runs] == [run.tasks for run in one.runs] == [run.tasks for run in full.runs]
    assert _state(batched) == _state(one) == _state(full)
    assert _cbufs(batched) == _cbufs(one)


class _Ops:
    """Counts the fp16 ops run by kind (wrapping ``run_fp16_ops`` as the batches made from then on call it)."""

    def __init__(self, monkeypatch) -> None:
        self.kinds: dict = {}
        inner = batch.run_fp16_ops

        def counted(table, start, stop, *buffers):
            for kind in table[start:stop, 0]:
                self.kinds[int(kind)] = self.kinds.get(int(kind), 0) + 1
            return inner(table, start, stop, *buffers)

        monkeypatch.setattr(batch, "run_fp16_ops", counted)


def _compare(tmp_path, name: str, runs: int = plans.RUNS, seed: int = 0) -> tuple:
    runtimes, shapes = _runtimes(tmp_path, name)
    rng = np.random.default_rng(seed)
    for _ in range(runs):
        _check_equal(runtimes, _run_all(runtimes, _feeds(rng, shapes)))
    return runtimes, shapes


#: the op kinds each model's batches run
KINDS = {"conv_bias_lut": {batch.DEPTHWISE, batch.GEMM, batch.DPU}, "gate": {batch.NARROW_HALVES, batch.GEMM, batch.DPU},
         "flying": {batch.GEMM, batch.DPU}, "matmul": {batch.GEMM, batch.DPU}, "few": {batch.FEW, batch.DPU}}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_batches_equal_steps_one_by_one_and_the_full_path(monkeypatch, tmp_path, name):
    ops = _Ops(monkeypatch)
    _compare(tmp_path, name)
    assert KINDS[name] <= set(ops.kinds)


def _remakes(monkeypatch) -> list:
    remade, inner = [], task_batches.StepBatch._remake

    def remake(self, member):
        remade.append(member)
        inner(self, member)

    monkeypatch.setattr(task_batches.StepBatch, "_remake", remake)
    return remade


def test_a_lut_member_whose_ram_changed_runs_as_its_step_and_is_made_again(monkeypatch, tmp_path):
    """The LUT RAM changed after the chain's LUT writes, differently each run (in the batched and one-by-one
    runtimes alike; the full path takes no such writes): the LUT members find their tables stale, run as
    their steps, are made again, and the two runtimes still equal."""
    # (the writes taken as stores of part of the RAM: after a store of the whole RAM the steady memo knows its
    # bytes, which no change after it can be in a real run - test_step_batch_steady's whole-RAM tests)
    monkeypatch.setattr(task_batches, "lut_ram_after", lambda steps: None)
    remade = _remakes(monkeypatch)
    (batched, one, _), shapes = _compare(tmp_path, "flying")
    first, change, inner = len(remade), [0], RegisterFile.apply_lut
    assert first >= 1  # (the first batched run: the calls made for a stand-in)

    def apply_lut(self, steps, where):
        inner(self, steps, where)
        self.lut.tables[:, 3 + change[0]] += 7

    monkeypatch.setattr(RegisterFile, "apply_lut", apply_lut)
    rng = np.random.default_rng(3)
    for change[0] in range(3):
        outputs = _run_all((batched, one), _feeds(rng, shapes))
        assert outputs[0] == outputs[1]
        assert [run.tasks for run in batched.runs] == [run.tasks for run in one.runs]
        assert _state(batched) == _state(one) and _cbufs(batched) == _cbufs(one)
    assert len(remade) >= first + 3


def test_the_checks_catch_lut_members_that_never_find_their_calls_stale(monkeypatch, tmp_path):
    """A batch whose LUT members' check always gives the tables their calls were made for (the stand-in at
    first: they never run their DPU)."""
    inner = cna_core._fp16_batch

    def blind(*args):
        pre, calls, fallback, lut, entry = inner(*args)
        if lut is not None:
            lut = (lambda table=lut[2]: table, lut[1], lut[2])
        return pre, calls, fallback, lut, entry

    monkeypatch.setattr(cna_core, "_fp16_batch", blind)
    with pytest.raises(AssertionError):
        _compare(tmp_path, "conv_bias_lut")


def test_the_checks_catch_ops_in_the_wrong_order(monkeypatch, tmp_path):
    """Each member's DPU op before its CORE op (the DPU reads the last run's result)."""
    inner = task_batches._encoded_calls

    def swapped(calls, entry=task_batches.INT8):
        rows = inner(calls, entry)
        return rows if rows is None or entry != task_batches.FP16 else rows[::-1]

    monkeypatch.setattr(task_batches, "_encoded_calls", swapped)
    with pytest.raises(AssertionError):
        _compare(tmp_path, "gate")


def _raised_ends(monkeypatch, tmp_path, call: int) -> list:
    """(outputs, state, Cbuf) of the batched and one-by-one runtimes after their chain raised at ``call``."""
    (batched, one, _), shapes = _compare(tmp_path, "gate", runs=4)
    feeds = _feeds(np.random.default_rng(9), shapes)
    ends = []
    for runtime in (batched, one):
        for name, x in feeds.items():
            runtime.set_input(name, x)
        with monkeypatch.context() as patch:
            _raising_at(patch, call)
            with pytest.raises(EmulationError):
                runtime.run()
        memory = [hashlib.sha1(region.data).hexdigest() for region in runtime.machine.memory.regions]
        ends.append((memory, _state(runtime), _cbufs(runtime), [core.tasks_run for core in runtime.machine.cores]))
    return ends


@pytest.mark.parametrize("call", [1, 2, 4])
def test_an_exception_mid_batch_leaves_what_the_steps_one_by_one_leave(monkeypatch, tmp_path, call):
    ends = _raised_ends(monkeypatch, tmp_path, call)
    assert ends[0] == ends[1]


def test_the_checks_catch_a_batch_dropping_the_raising_members_calls(monkeypatch, tmp_path):
    """A batch that takes no note of a member's calls coming before the part of its ``pre`` that raised (the
    DPU's drop of derived values, after its kernels in the step): that member's output is not written."""
    monkeypatch.setattr(task_batches, "CALLS_BEFORE", "not_set")
    ends = _raised_ends(monkeypatch, tmp_path, 2)
    assert ends[0] != ends[1]
