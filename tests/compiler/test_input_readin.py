"""A graph input the runtime permutes as it stores it (passes/input_readin.py, LOWERING.md 33.4,
isa/CONTAINER.md 3.3 ``readin``): the input side of the output readout.

Checked: the pass takes exactly the token edge (a [1, T, *rest] graph input -> Transpose of the
tokens to the end -> Reshape to [1, C, 1, T]) and leaves other Transposes alone; the float graph
against onnxruntime; the Readin against :func:`reference_readin` (index arithmetic written here);
built models carry the record, run no host step and take the caller's [1, T, C] array (the
runtime, `npuemu run`, `npuemu perf` zeros), refuse another shape by name; a model without a
token input carries no ``readin`` key; the reader's bounds refuse a record off a graph input or
with a perm that does not order its axes; the synthetic transformer encoder (issue 19) has no
host step and matches onnxruntime in float16 and int8 (int8 bit for bit against the testing kit's
reference of the built model)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.build import build_model
from npuemu.compiler.float_eval import evaluate
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import calibrate, float16_graph, quantize_graph
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import InputError, NpuemuError
from npuemu.tools.testing_reference import reference_model
from tests.compiler.test_attention_npu import cosine, encoder_layer
from tests.compiler.test_tokens_as_channels import C, T, encoder_block, ort_run


def reference_readin(x: np.ndarray, attrs: dict) -> np.ndarray:
    """Readin by index arithmetic: stored element at flat index i (row-major in ``shape``) is the
    element of x at the position whose permuted coordinates have flat index i."""
    perm, shape = list(attrs["perm"]), [int(d) for d in attrs["shape"]]
    permuted_shape = [x.shape[axis] for axis in perm]
    out = np.empty(int(np.prod(shape)), x.dtype)
    for position in np.ndindex(*x.shape):
        moved = [position[axis] for axis in perm]
        out[int(np.ravel_multi_index(moved, permuted_shape))] = x[position]
    return out.reshape(shape)


def _optimized(model, element_bytes: int = 2):
    graph = import_onnx(model)
    _, split = optimize(graph, PassContext.for_chip("rk3588", 3, element_bytes=element_bytes), check_every_pass=True)
    return graph, split


def _fp16_build(model):
    graph, split = _optimized(model)
    float16_graph(graph)
    return graph, split, build_model(graph)


def _run(built, x: np.ndarray) -> np.ndarray:
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output("y"))


def test_the_reference_is_the_token_transpose():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 3, 8)
    got = reference_readin(x, {"perm": [0, 2, 1], "shape": [1, 8, 1, 3]})
    for t in range(3):
        for c in range(8):
            assert got[0, c, 0, t] == x[0, t, c]


def test_the_token_edge_becomes_one_readin_equal_to_onnxruntime():
    model, shape = encoder_block(False, blocks=1)
    graph, split = _optimized(model, 1)
    (node,) = [node for node in graph.nodes if node.op_type == "Readin"]
    assert node.inputs == ["x"] and node.attrs == {"perm": [0, 2, 1], "shape": [1, shape[2], 1, shape[1]]}
    assert node.target == "NPU" and "Transpose" not in [n.op_type for n in graph.nodes]
    assert {op: n for op, n in split.cpu_ops().items() if op != "Pow"} == {}
    x = np.random.default_rng(3).normal(0, 1, shape).astype(np.float32)
    np.testing.assert_array_equal(evaluate(graph, {"x": x}, return_all=True)[node.outputs[0]],
                                  reference_readin(x, node.attrs))
    np.testing.assert_allclose(evaluate(graph, {"x": x})["y"], ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_other_input_transposes_are_left_alone():
    """An NHWC image input's Transpose (no Reshape after it) and a token Transpose whose output a
    second node reads stay host Transposes: no readin, the graphs as before."""
    weights = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    nhwc = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]), helper.make_node("Conv", ["t", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 6, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weights])
    twice = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
         helper.make_node("Reshape", ["t", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"]),
         helper.make_node("Sigmoid", ["t"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 8, 1, 6], np.int64), "s")])
    for graph_proto in (nhwc, twice):
        model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        graph, _ = _optimized(model)
        assert "Readin" not in [node.op_type for node in graph.nodes]


def test_the_encoder_has_no_host_step_and_matches_onnxruntime_in_float16(tmp_path):
    """The synthetic transformer encoder layer (issue 19): LN, attention, FFN, LN on [1, 40, 64]
    in and out; the model file's schedule is NPU chains only, the input record is the readin."""
    model = encoder_layer(features=64)
    graph, split, built = _fp16_build(model)
    assert dict(split.cpu_ops()) == {}
    assert all(step.kind == "npu" for step in built.schedule())
    assert all(info.target == "NPU" for info in built.layers())
    path = tmp_path / "encoder.npu"
    built.write(path)
    record = next(t for t in ModelFile.read(path).trailer["tensors"] if t["name"] == "x")
    assert record["readin"] == {"perm": [0, 2, 1], "shape": [1, 40, 64]} and record["shape"] == [1, 64, 1, 40]
    x = np.random.default_rng(2).normal(0, 1, (1, 40, 64)).astype(np.float32)
    assert cosine(_run(built, x), ort_run(model, {"x": x})) >= 0.9999


def test_the_runtime_takes_the_callers_shape_and_refuses_another():
    graph, _, built = _fp16_build(encoder_block(False, blocks=1)[0])
    runtime = Runtime(built)
    assert runtime.input_shape("x") == runtime.zero_input("x").shape == (1, T, C)
    x = np.random.default_rng(5).normal(0, 1, (1, T, C)).astype(np.float32)
    runtime.set_input("x", x)
    stored = np.asarray(runtime.read_native("x")).reshape(1, C, 1, T)  # the stored map, NCHW
    np.testing.assert_array_equal(stored, reference_readin(x.astype(np.float16), {"perm": [0, 2, 1],
                                                                                   "shape": [1, C, 1, T]}))
    with pytest.raises(InputError, match=rf"expected shape \[1, {T}, {C}\]"):
        runtime.set_input("x", np.zeros((1, C, 1, T), np.float32))


def test_int8_encoder_block_is_bit_exact_against_the_kit():
    model, shape = encoder_block(False, seed=1, blocks=1)
    graph, split = _optimized(model, 1)
    rng = np.random.default_rng(4)
    quantize_graph(graph, calibrate(graph, [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(4)],
                                    progress=False).ranges)
    (node,) = [node for node in graph.nodes if node.op_type == "Readin"]
    assert graph.tensors["x"].quant == graph.tensors[node.outputs[0]].quant  # one quantization (sharing)
    built = build_model(graph)
    assert all(step.kind == "npu" for step in built.schedule())
    x = rng.normal(0, 1, shape).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    stored = np.asarray(runtime.output("y", dequantize=False))
    assert np.array_equal(reference_model(graph, built, {"x": x})["y"].reshape(-1), stored.reshape(-1))
    assert cosine(np.asarray(runtime.output("y")), ort_run(model, {"x": x})) >= 0.99


def test_a_channel_major_input_has_no_readin_key():
    """The encoder block fed [1, C, 1, T] (PP-OCRv4 rec's neck): its Squeeze/Transpose cancel, no
    readin, so the file is what it was."""
    _, _, built = _fp16_build(encoder_block(True, blocks=1)[0])
    assert not any("readin" in tensor for tensor in built.trailer["tensors"])


def _with_record(built, name: str, record: dict) -> bytes:
    trailer = copy.deepcopy(built.trailer)
    for tensor in trailer["tensors"]:
        tensor.pop("readin", None)
        if tensor["name"] == name:
            tensor["readin"] = record
    return ModelFile(built.sections, trailer).to_bytes()


@pytest.mark.parametrize("where, record, words", [
    ("y", {"perm": [0, 2, 1], "shape": [1, T, C]}, "not a graph input"),
    ("x", {"perm": [0, 1, 1], "shape": [1, T, C]}, "does not order"),
    ("x", {"perm": [0, 2, 1], "shape": [1, T, C - 1]}, "does not hold"),
])
def test_the_reader_bounds_the_record(where, record, words):
    _, _, built = _fp16_build(encoder_block(False, blocks=1)[0])
    ModelFile.from_bytes(_with_record(built, "x", {"perm": [0, 2, 1], "shape": [1, T, C]}))  # the valid one reads
    with pytest.raises(NpuemuError, match=words):
        ModelFile.from_bytes(_with_record(built, where, record))


def test_the_cli_runs_and_inspects_a_readin_model(tmp_path, capsys):
    from npuemu.tools.cli import main

    model, shape = encoder_block(False, blocks=1)
    _, _, built = _fp16_build(model)
    path, array = tmp_path / "block.npu", tmp_path / "x.npy"
    built.write(path)
    x = np.random.default_rng(6).normal(0, 1, shape).astype(np.float32)
    np.save(array, x)
    assert main(["run", str(path), "--input", str(array), "--output-dir", str(tmp_path)]) == 0
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), runtime.output("y"))
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "readin (1)" in out and f"x: [1,{T},{C}] -> perm [0,2,1] -> [1,{C},1,{T}]" in out
    assert main(["perf", str(path)]) == 0
    assert f"x [1, {T}, {C}]" in capsys.readouterr().out


def test_a_multi_batch_build_takes_n_token_arrays():
    """--batch-size 2: each slice's record carries the readin; the caller gives [2, T, C]."""
    from npuemu.compiler.driver import CompileOptions, compile_model

    model, shape = encoder_block(False, blocks=1)
    built = compile_model(model, "rk3588", CompileOptions(precision="fp16", batch_size=2))
    records = {t["name"]: t.get("readin") for t in built.trailer["tensors"] if t["name"].startswith("x")}
    assert records == {name: {"perm": [0, 2, 1], "shape": [1, T, C]} for name in ("x", "x#b0", "x#b1")}
    runtime = Runtime(built)
    assert runtime.input_shape("x") == runtime.zero_input("x").shape == (2, T, C)
    x = np.random.default_rng(7).normal(0, 1, (2, T, C)).astype(np.float32)
    runtime.set_input("x", x)
    runtime.run()
    want = np.concatenate([ort_run(model, {"x": x[i:i + 1]}) for i in range(2)])
    assert cosine(np.asarray(runtime.output("y")), want) >= 0.9999


def test_an_order_keeping_readin_takes_the_one_call_store():
    """A readin record whose perm keeps the axes' order only reshapes (silero-vad's state input): after the
    first store, ``set_input`` takes the per-tensor one-call store (``Runtime._storer``), storing what the
    full path stores, and still refuses another shape."""
    _, _, built = _fp16_build(encoder_block(False, blocks=1)[0])
    built = ModelFile.from_bytes(_with_record(built, "x", {"perm": [0, 1, 2], "shape": [1, C, T]}))
    rng = np.random.default_rng(7)
    first, second = (rng.normal(0, 1, (1, C, T)).astype(np.float32) for _ in range(2))
    runtime, fresh = Runtime(built), Runtime(built)
    runtime.set_input("x", first)
    assert runtime._storers["x"](second)  # (the one-call store took it)
    fresh.set_input("x", second)  # (the full path)
    stored = np.asarray(runtime.read_native("x"))
    np.testing.assert_array_equal(stored, np.asarray(fresh.read_native("x")))
    np.testing.assert_array_equal(stored.reshape(-1), second.astype(np.float16).reshape(-1))
    with pytest.raises(InputError, match=rf"expected shape \[1, {C}, {T}\]"):
        runtime.set_input("x", np.zeros((1, T, C), np.float32))
