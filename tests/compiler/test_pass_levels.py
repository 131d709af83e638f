"""The pass pipeline: optimization levels, the fixpoint and health check between stages, the
generated SUPPORT.md, and ``npuemu compile -O``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from npuemu.compiler.ir_text import format_graph
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, pipeline, run_passes
from npuemu.compiler.passes.support_doc import support_markdown
from npuemu.isa.errors import CompileError
from npuemu.tools.cli import main
from tests.compiler.pass_cases import fused, ops, weights

RNG = np.random.default_rng(51)
F = np.float32


def _network(onnx_case):
    """Conv+BN+Relu, a written-out hard-swish, a residual add, Reshape chain, GAP and an FC."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "b", "m", "v"], ["n1"], name="bn"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["cl"]),
        helper.make_node("Mul", ["c2", "cl"], ["mu"]), helper.make_node("Div", ["mu", "six"], ["hs"]),
        helper.make_node("Add", ["hs", "r1"], ["res"], name="residual"),
        helper.make_node("GlobalAveragePool", ["res"], ["gap"], name="gap"),
        helper.make_node("Reshape", ["gap", "s1"], ["f1"]), helper.make_node("Reshape", ["f1", "s2"], ["f2"]),
        helper.make_node("Gemm", ["f2", "fc_w", "fc_b"], ["y"], name="fc"),
    ]
    inits = {"w1": weights(RNG, [8, 3, 3, 3]), "w2": weights(RNG, [8, 8, 3, 3]), "b2": weights(RNG, [8]),
             "g": RNG.uniform(0.5, 1.5, 8).astype(F), "b": weights(RNG, [8]), "m": weights(RNG, [8]),
             "v": RNG.uniform(0.5, 2, 8).astype(F), "three": F(3), "zero": F(0), "six": F(6),
             "s1": np.array([1, 8, 1], np.int64), "s2": np.array([1, 8], np.int64),
             "fc_w": weights(RNG, [8, 5]), "fc_b": weights(RNG, [5])}
    return onnx_case.model(nodes, {"x": [1, 3, 20, 20]}, ["y"], inits)


@pytest.mark.parametrize("level, expected", [
    (0, ["Conv", "BatchNormalization", "Relu", "Conv", "Add", "Clip", "Mul", "Div", "Add", "GlobalAveragePool",
         "Reshape", "Reshape", "Gemm"]),
    (1, ["Conv+Relu", "Conv+HardSwish+Add", "GlobalAveragePool", "FullyConnected"]),  # FC reads through the reshapes
    (2, ["Conv+Relu", "Conv+HardSwish+Add", "GlobalAveragePool", "FullyConnected"]),
    (3, ["Conv+Relu", "Conv+HardSwish+Add", "Conv", "Conv", "Conv", "Reshape"]),  # GAP as 2 convs, FC as a conv
])
def test_each_level_keeps_the_output(onnx_case, rand, level, expected):
    model = _network(onnx_case)
    graph = fused(onnx_case, model, {"x": rand([1, 3, 20, 20], seed=1)}, level=level)
    assert ops(graph) == expected


def test_level_0_changes_nothing(onnx_case):
    model = _network(onnx_case)
    imported, passed = import_onnx(model), import_onnx(model)
    log = run_passes(passed, PassContext.for_chip("rk3588", 0))
    assert log.total() == 0 and format_graph(passed) == format_graph(imported)
    assert not any(node.fused for node in passed.nodes)


def test_levels_are_checked():
    with pytest.raises(CompileError, match="optimization level 4 is not one of 0, 1, 2, 3"):
        pipeline.check_level(4)


def _with_stage(monkeypatch, item):
    stage = pipeline.Stage("broken", 1, (item,))
    monkeypatch.setattr(pipeline, "STAGES", (*pipeline.STAGES, stage))


def test_health_check_names_a_pass_that_breaks_the_graph(onnx_case, monkeypatch):
    def drop_first_node(graph, ctx):
        """A buggy pass: removes a node whose output is still read."""
        graph.nodes.pop(0)
        return 1

    _with_stage(monkeypatch, drop_first_node)
    with pytest.raises(CompileError, match="after pass 'drop_first_node': .*node 'conv2' reads 'r1' before it is defined"):
        run_passes(import_onnx(_network(onnx_case)), PassContext.for_chip("rk3588", 1), check_every_pass=True)


def test_health_check_catches_a_wrong_shape(onnx_case, monkeypatch):
    def widen(graph, ctx):
        """A buggy pass: makes a tensor's recorded shape wrong."""
        name = graph.nodes[0].outputs[0]
        graph.tensors[name] = dataclasses.replace(graph.tensors[name], shape=(1, 9, 20, 20))
        return 0

    _with_stage(monkeypatch, widen)
    with pytest.raises(CompileError, match="after stage 'broken': node 'conv1' .* the graph says \\[1, 9, 20, 20\\]"):
        run_passes(import_onnx(_network(onnx_case)), PassContext.for_chip("rk3588", 1))


def test_a_pass_that_never_settles_is_an_error(onnx_case, monkeypatch):
    _with_stage(monkeypatch, lambda graph, ctx: 1)
    with pytest.raises(CompileError, match="stage 'broken' did not reach a fixpoint"):
        run_passes(import_onnx(_network(onnx_case)), PassContext.for_chip("rk3588", 1))


def test_support_document_is_up_to_date():
    path = Path(__file__).resolve().parents[2] / "compiler" / "SUPPORT.md"
    assert path.read_text(encoding="utf-8") == support_markdown(), \
        "compiler/SUPPORT.md is stale: python -m npuemu.compiler.passes.support_doc > compiler/SUPPORT.md"


def test_compile_option_selects_the_level(onnx_case, tmp_path, capsys):
    path = tmp_path / "net.onnx"
    onnx.save(_network(onnx_case), str(path))
    assert main(["compile", str(path), "-O", "1"]) == 0
    out = capsys.readouterr().out
    assert "4 layers" in out
    assert "optimization level 1 for rk3588: 3 layers on the NPU, 1 on the CPU (GlobalAveragePool x1)" in out
    assert main(["compile", str(path)]) == 0
    assert "optimization level 3 for rk3588: 6 layers on the NPU, 0 on the CPU\n" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compile", str(path), "--optimization-level", "5"])
