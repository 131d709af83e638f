"""The WINDOW_EW op of kernels/step_batch.py (issue 20, session 25: ppocr_cls int8's seven residual convolutions a
run ran as steps of their own between its batches): a convolution's CORE step, its EW operand's rows copied out of
memory (units/dpu_plan.py ``_ew_chained``: ``_ew_reader``'s ``copied``, a plain or a split read) and the chain with
the EW stage (kernels/dpu_pixel_plan.py ``_ew_chain``) as one ``int8_core_step.gemm_ew_chain`` call, one op of a
batch. End to end on int8 builds with residual adds (the compiler's Conv + Add fusion): steady runs with the batches,
with the steps one by one (no batch) and on the full unit path (no task program) give the same outputs bit for bit,
with onnxruntime's within the quantization; the op is in the batches' tables and runs (where the host has the VNNI
convolution whose steps it takes). A broken op (the operand read from the wrong rows) is caught."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.emulator import task_batches
from npuemu.emulator.kernels import gemm_int8, step_batch
from npuemu.emulator.units import dpu_plan
from npuemu.emulator.runtime import Runtime

RUNS = 4


def _model(channels: int, size: int) -> bytes:
    """conv 3x3 + ReLU -> a; conv 1x1 (a) + a -> b; conv 1x1 (b) + b -> y: two residual adds."""
    rng = np.random.RandomState(0)
    inits = [numpy_helper.from_array((rng.randn(channels, 3, 3, 3) * 0.3).astype(np.float32), "w0"),
             numpy_helper.from_array((rng.randn(channels, channels, 1, 1) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.randn(channels, channels, 1, 1) * 0.2).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["a"]),
             helper.make_node("Conv", ["a", "w1"], ["c1"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c1", "a"], ["b"]),
             helper.make_node("Conv", ["b", "w2"], ["c2"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c2", "b"], ["y"])]
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def _outputs(built, inputs, monkeypatch, mode: str) -> list:
    with monkeypatch.context() as patch:
        if mode == "steps":
            patch.setattr(task_batches, "batched", lambda steps, tasks: None)
        elif mode == "full":
            patch.setattr("npuemu.emulator.core.build_program", lambda *args, **kwargs: None)
        runtime = Runtime(built)
        got = []
        for x in inputs:
            runtime.set_input("x", x)
            runtime.run()
            got.append(runtime.output("y", dequantize=False).copy())
        return got


def _ew_ops(monkeypatch) -> list:
    """Counts of WINDOW_EW rows in the tables of the batches made while the patch lasts."""
    made, original = [], task_batches.batched

    def counting(steps, tasks):
        runs = original(steps, tasks)
        for _, batch in runs or ():
            if batch is not None:
                made.append(int((batch.ops[batch.start:batch.start + batch.ends[-1], 0] == step_batch.WINDOW_EW).sum()))
        return runs

    monkeypatch.setattr(task_batches, "batched", counting)
    return made


@pytest.mark.parametrize("channels,size", [(32, 6), (48, 5), (16, 9)])
def test_residual_convolutions_batched_equal_steps_and_the_full_path(tmp_path, monkeypatch, channels, size):
    path = tmp_path / "residual.onnx"
    path.write_bytes(_model(channels, size))
    rng = np.random.RandomState(1)
    inputs = [rng.randn(1, 3, size, size).astype(np.float32) for _ in range(RUNS)] * 2  # (replays: the steady state)
    built = compile_model(path, "rk3588", CompileOptions(precision="int8", dataset=[{"x": x} for x in inputs[:2]]))
    made = _ew_ops(monkeypatch)
    batched = _outputs(built, inputs, monkeypatch, "batched")
    one_by_one, full = (_outputs(built, inputs, monkeypatch, mode) for mode in ("steps", "full"))
    for got, steps, slow in zip(batched, one_by_one, full):
        np.testing.assert_array_equal(got, steps)
        np.testing.assert_array_equal(got, slow)
    assert (sum(made) > 0) == gemm_int8.available()  # (the VNNI convolution's steps take the chained form)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    scale = np.abs(session.run(None, {"x": inputs[0]})[0]).max() / 127
    runtime = Runtime(built)
    runtime.set_input("x", inputs[0])
    runtime.run()
    assert np.abs(runtime.output("y") - session.run(None, {"x": inputs[0]})[0]).max() <= 4 * scale


def test_a_broken_operand_read_is_caught(tmp_path, monkeypatch):
    """(Without the VNNI convolution no step takes the chained form: no op to break, none made - checked above.)"""
    path = tmp_path / "residual.onnx"
    path.write_bytes(_model(32, 6))
    rng = np.random.RandomState(2)
    inputs = [rng.randn(1, 3, 6, 6).astype(np.float32) for _ in range(RUNS)] * 2
    built = compile_model(path, "rk3588", CompileOptions(precision="int8", dataset=[{"x": x} for x in inputs[:2]]))
    right = _outputs(built, inputs, monkeypatch, "steps")
    real = dpu_plan._ew_chained

    def shifted(*arguments):  # (the operand's rows one row on: another pixel's values)
        made = real(*arguments)
        if made is None:
            return None
        drop, (kind, chain, fallback) = made
        return drop, (kind, chain[:4] + (np.roll(chain[4], 1),) + chain[5:], fallback)

    monkeypatch.setattr(dpu_plan, "_ew_chained", shifted)
    made = _ew_ops(monkeypatch)
    broken = _outputs(built, inputs, monkeypatch, "batched")
    assert sum(made) > 0 or not gemm_int8.available()
    assert any(not np.array_equal(a, b) for a, b in zip(right, broken)) == (sum(made) > 0)
