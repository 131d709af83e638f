"""No-copy Concat and Split (LOWERING.md 10.1): a Concat input or Split output stored inside its
neighbour's bytes emits no task; the whole network's output is bit-identical to the build that
keeps every DPU copy, in int8 and float16."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from onnx import numpy_helper

from npuemu.compiler.build import build_model
from npuemu.compiler.driver import CompileOptions, prepare
from npuemu.compiler.lower import ConcatLayer, Quant, SliceLayer
from npuemu.compiler.lower.driver import copy_views
from npuemu.emulator.runtime import Runtime
from npuemu.platforms import load_platform
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import Net, cosine, onnxruntime_float

SHAPE = (1, 3, 12, 16)


def inception_block():
    """Two branches concatenated, the concatenation split again and the halves convolved, a
    nested concat of the first concat with a branch, a concat whose last input ends inside a
    surface, and a tensor feeding two concats (only one can hold it). Branches have 32
    channels: an int8 conv on RK3588 writes its channels rounded up to 32 (placement.py)."""
    net = Net(5)
    net.conv("a", "x", "a0", 3, 32)
    net.node("Relu", ["a0"], ["a1"], "ra")
    net.conv("b", "x", "b0", 3, 32)
    net.node("Relu", ["b0"], ["b1"], "rb")
    net.node("Concat", ["a1", "b1"], ["c1"], "cat1", axis=1)
    net.inits.append(numpy_helper.from_array(np.array([32, 32], np.int64), "sizes"))
    net.node("Split", ["c1", "sizes"], ["s0", "s1"], "split", axis=1)
    net.conv("d", "s0", "d0", 32, 32)
    net.node("Relu", ["d0"], ["d1"], "rd")
    net.conv("e", "s1", "e0", 32, 5, kernel=1)
    net.node("Relu", ["e0"], ["e1"], "re")
    net.node("Concat", ["c1", "d1", "e1"], ["c2"], "cat2", axis=1)
    net.node("Concat", ["a1", "d1"], ["c3"], "cat3", axis=1)  # a1 and d1 are already held by cat1/cat2
    net.conv("f", "c2", "f0", 101, 16)
    net.conv("g", "c3", "g0", 64, 16, kernel=1)
    net.node("Add", ["f0", "g0"], ["y"], "add")
    return net.model(list(SHAPE), "y")


def _graph(model, dtype):
    """The driver's quantized graph; the tests build it with and without elided copies."""
    if dtype == "float16":
        return prepare(model, "rk3588", CompileOptions(precision="fp16")).graph
    rng = np.random.default_rng(3)
    samples = [{"x": rng.normal(size=SHAPE).astype(np.float32)} for _ in range(4)]
    return prepare(model, "rk3588", CompileOptions(dataset=samples)).graph


def _run(built, output, x, dequantize=False):
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return runtime.output(output, dequantize=dequantize)


def _tasks(built, op_type):
    return sum(info.task_count for info in built.layers() if info.op_type == op_type)


@pytest.mark.parametrize("dtype", ["int8", "float16"])
def test_no_copy_build_equals_the_copy_build(dtype) -> None:
    model = inception_block()
    graph = _graph(model, dtype)
    copied, viewed = build_model(graph, elide_copies=False), build_model(graph)
    x = np.random.default_rng(4).normal(size=SHAPE).astype(np.float32)
    output = graph.outputs[0]
    want, got = _run(copied, output, x), _run(viewed, output, x)
    assert np.array_equal(want, got)
    assert np.unique(got).size > 8, "a degenerate output would pass trivially"
    layers = {info.name: info for info in viewed.layers()}
    # cat1 and the split are views; cat3 keeps its copies (a1 lives inside cat1); cat2 nests cat1
    # inside it in float16, while in int8 the quantizer gives its narrow input e1 a scale of its
    # own (sharing.py CONCAT_MAX_GROWTH), so it stays a requantizing copy
    cat2 = 0 if dtype == "float16" else 3
    assert [layers[name].task_count for name in ("cat1", "cat2", "split_0", "split_1", "cat3")] == [0, cat2, 0, 0, 2]
    assert _tasks(copied, "Concat") == 7 and _tasks(viewed, "Concat") == 2 + cat2
    assert _tasks(copied, "ChannelSlice") == 2 and _tasks(viewed, "ChannelSlice") == 0
    # float16 Concat and Split copies run on the NPU too (no host step)
    assert [step.kind for step in viewed.schedule()] == [step.kind for step in copied.schedule()] == ["npu"]
    if dtype == "float16":
        assert cosine(_run(viewed, output, x, dequantize=True), onnxruntime_float(model, x)) >= 0.9999


@pytest.mark.parametrize("options", [{"cores": (0, 1, 2)}, {"sram": True}, {"batch": 2}])
def test_no_copy_holds_with_cores_sram_and_batch(options) -> None:
    """Multi-core row splits write into the views, SRAM placement moves a root with its views,
    and batch slices relocate them with their context's internal area."""
    graph = _graph(inception_block(), "float16")
    copied, viewed = build_model(graph, elide_copies=False, **options), build_model(graph, **options)
    batch = options.get("batch", 1)
    x = np.random.default_rng(6).normal(size=(batch, *SHAPE[1:])).astype(np.float32)
    output = graph.outputs[0]
    assert np.array_equal(_run(copied, output, x), _run(viewed, output, x))
    assert _tasks(viewed, "Concat") < _tasks(copied, "Concat")
    if options.get("sram"):
        regions = {t.name: t.region for t in viewed.tensors()}
        assert regions["a1"] == regions["c1"] == regions["c2"]  # a view lives where its root does


def _views(layers, shapes, aligns=None, internal=None, dtype="int8"):
    platform = load_platform("rk3588")
    dtypes = dict.fromkeys(shapes, dtype)
    views, elided = copy_views(layers, shapes, dtypes, aligns or {}, set(shapes) if internal is None else internal,
                               platform)
    return views, [layer.name for layer in elided]


def test_copy_views_conditions() -> None:
    """Each condition of LOWERING.md 10.1 on its own: the layer keeps its copy when one fails."""
    q, other = Quant(0.1, 0), Quant(0.2, 0)
    shapes = {"a": (32, 4, 6), "b": (20, 4, 6), "y": (52, 4, 6)}
    surface = 24 * 16  # 4 x 6 pixels of 16 int8 bytes
    cat = ConcatLayer("cat", ("a", "b"), "y", (shapes["a"], shapes["b"]), (q, q), q)
    assert _views([cat], shapes) == ({"a": ("y", 0), "b": ("y", 2 * surface)}, ["cat"])
    # the last input may end inside a surface; a graph input/output or another scale may not take part
    assert _views([cat], shapes, internal={"a", "b"}) == ({}, [])
    assert _views([cat], shapes, internal={"y", "b"}) == ({}, [])
    assert _views([dataclasses.replace(cat, input_quants=(q, other))], shapes) == ({}, [])
    # a 16-channel int8 conv output is allocated (and written) as 32 channels: it would overwrite b
    narrow = {"a": (16, 4, 6), "b": (20, 4, 6), "y": (36, 4, 6)}
    cat16 = ConcatLayer("cat", ("a", "b"), "y", (narrow["a"], narrow["b"]), (q, q), q)
    assert _views([cat16], narrow) == ({"a": ("y", 0), "b": ("y", surface)}, ["cat"])
    assert _views([cat16], narrow, aligns={"a": 32}) == ({}, [])
    # nested: the inner concat's last input writes 32 channels, past the inner output's 48 - so
    # the inner output may not sit before another input of the outer concat
    nest = {"a": (32, 4, 6), "b": (16, 4, 6), "o": (48, 4, 6), "c": (16, 4, 6), "p": (64, 4, 6)}
    inner = ConcatLayer("in", ("a", "b"), "o", (nest["a"], nest["b"]), (q, q), q)
    outer = ConcatLayer("out", ("o", "c"), "p", (nest["o"], nest["c"]), (q, q), q)
    assert _views([inner, outer], nest, aligns={"b": 32})[1] == ["in"]
    assert _views([inner, outer], nest)[1] == ["in", "out"]
    swapped = dataclasses.replace(outer, inputs=("c", "o"), shapes=(nest["c"], nest["o"]))
    assert _views([inner, swapped], nest, aligns={"b": 32})[1] == ["in", "out"]
    # a Split output on a surface boundary is a view unless requantized; a later Concat of it copies
    split = SliceLayer("s1", "y", "s", (52, 4, 6), 32, 20, q, q)
    shapes_s = shapes | {"s": (20, 4, 6), "t": (52, 4, 6)}
    assert _views([split], shapes_s) == ({"s": ("y", 2 * surface)}, ["s1"])
    assert _views([dataclasses.replace(split, output_quant=other)], shapes_s) == ({}, [])
    recat = ConcatLayer("re", ("a", "s"), "t", (shapes["a"], shapes_s["s"]), (q, q), q)
    assert _views([split, recat], shapes_s) == ({"s": ("y", 2 * surface)}, ["s1"])
    # float16: C2 = 8, so an 8-channel input fills its surface
    half = {"a": (8, 4, 6), "b": (8, 4, 6), "y": (16, 4, 6)}
    cat8 = ConcatLayer("cat", ("a", "b"), "y", (half["a"], half["b"]), (None, None), None, "float16")
    assert _views([cat8], half, dtype="float16") == ({"a": ("y", 0), "b": ("y", surface)}, ["cat"])
    assert _views([cat8], half) == ({}, [])  # int8 (C2 = 16): the 8-channel input would share a surface


def test_mem_report_counts_the_views(tmp_path, capsys) -> None:
    """`npuemu mem` lists the elided layers and the bytes stored as views (the copy build none)."""
    graph = _graph(inception_block(), "float16")
    for elide in (True, False):
        build_model(graph, elide_copies=elide).write(tmp_path / f"{elide}.npu")
    assert main(["mem", "--json", str(tmp_path / "True.npu")]) == 0
    figures = json.loads(capsys.readouterr().out)["no_copy"]
    # views: a1, b1 (in c1), s0, s1 (in c1), c1, d1, e1 (in c2): 32-channel fp16 12 x 16 maps are
    # 4 surfaces of 192 atoms x 16 bytes = 12288 bytes, c1 8 surfaces; e1 (5 channels) is a conv
    # output allocated with its channels rounded up to 16: 2 surfaces
    assert figures == {"layers": 4, "view_tensors": 7, "view_bytes": 5 * 12288 + 24576 + 6144}
    assert main(["mem", "--json", str(tmp_path / "False.npu")]) == 0
    assert "no_copy" not in json.loads(capsys.readouterr().out)
