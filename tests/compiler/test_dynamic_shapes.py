"""Dynamic input shapes (guide 5.4, compiler/dynamic_shapes.py, isa/CONTAINER.md 3.7).

- each shape set of a dynamic build is, byte for byte, the plain build at that shape with the
  same quantization (fp16: the plain fp16 build; int8: the plain build quantized with the first
  set's ranges), so its outputs are bit-identical; and close to onnxruntime's at every shape;
- the quantization is the first set's everywhere and the weights are stored once;
- run / the API / run_model_file pick the set by the input shapes and refuse others naming the
  allowed sets; perf and mem report the set --shape-set names;
- the file round-trips (format 1.1, header flag bit 1; static files stay 1.0) and hostile
  values of the new trailer record are refused with a one-line error.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, compile_model, prepare
from npuemu.compiler.dynamic_shapes import parse_dynamic_input
from npuemu.compiler.quant import quantize_graph
from npuemu.emulator.runtime import Runtime, run_model_file
from npuemu.isa.container import ModelFile, SectionKind
from npuemu.isa.container_writer import build_file
from npuemu.isa.errors import CompileError, ConfigError, InputError, ModelFileError
from npuemu.tools.cli import main

SETS = ({"x": (1, 3, 16, 16), "y": (1, 4, 8, 8)}, {"x": (1, 3, 8, 12), "y": (1, 4, 4, 6)},
        {"x": (1, 3, 12, 8), "y": (1, 4, 6, 4)})
CLI_SETS = "x=1,3,16,16 & y=1,4,8,8; x=1,3,8,12 y=1,4,4,6;x=1,3,12,8&y=1,4,6,4"


def _model():
    """Two inputs: conv+relu -> strided conv on x, a 1x1 conv on y (half x's size), added, sigmoid."""
    rng = np.random.default_rng(3)
    init = [numpy_helper.from_array(rng.normal(0, s, shape).astype(np.float32), name) for name, shape, s in
            (("w1", (8, 3, 3, 3), 0.4), ("b1", (8,), 0.1), ("w2", (8, 8, 3, 3), 0.2), ("w3", (8, 4, 1, 1), 0.5))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Conv", ["y", "w3"], ["c3"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c2", "c3"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["out"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"]),
              helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, "h", "w"])]
    graph = helper.make_graph(nodes, "two", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _feeds(shapes, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 1, shape).astype(np.float32) for name, shape in shapes.items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dynamic")
    (folder / "net.onnx").write_bytes(_model().SerializeToString())
    lines = []
    for i in range(3):
        for name, value in _feeds(SETS[0], 10 + i).items():
            np.save(folder / f"s{i}_{name}.npy", value)
        lines.append(f"s{i}_x.npy s{i}_y.npy")
    (folder / "ds.txt").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def int8(files):
    options = CompileOptions(dataset=str(files / "ds.txt"), dynamic_input=parse_dynamic_input(CLI_SETS))
    front = prepare(files / "net.onnx", "rk3588", options)
    from npuemu.compiler.driver import build
    return front, build(front)


def _plain_int8_at(files, front0, shapes):
    """The static build at ``shapes`` quantized with the first set's ranges (no calibration)."""
    front = prepare(files / "net.onnx", "rk3588", CompileOptions(precision="float", input_shapes=shapes))
    first = front0.quantization
    quantize_graph(front.graph, first.ranges, per_channel=first.per_channel, weight_clipping=first.weight_clipping)
    options = CompileOptions(dataset=str(files / "ds.txt"))  # the recorded options, as the dynamic build's
    return build_graph(front.graph, "rk3588", options, front0.preprocess)


def _run(model, feeds, dequantize=True):
    runtime = Runtime(model)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return {name: runtime.output(name, dequantize) for name in runtime.outputs}


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# --- parsing ------------------------------------------------------------------------------------

def test_the_cli_syntax_gives_the_sets_by_name():
    assert parse_dynamic_input(CLI_SETS) == [dict(s) for s in SETS]
    assert parse_dynamic_input("x=1,3,4,4;x=1,3,2,2;") == [{"x": (1, 3, 4, 4)}, {"x": (1, 3, 2, 2)}]


@pytest.mark.parametrize("text", ["x=1,3,4,4;x=1,a,2,2", "x=1,3,4,4;1,3,2,2", "x=1,3,0,4;x=1,3,2,2",
                                  "x=1,3,4,4 x=1,3,4,4;x=1,3,2,2"])
def test_bad_cli_sets_are_refused(text):
    with pytest.raises(ConfigError, match="--dynamic-input set"):
        parse_dynamic_input(text)


@pytest.mark.parametrize("sets, message", [
    ([{"x": (1, 3, 16, 16), "y": (1, 4, 8, 8)}], "1 shape set"),
    ([SETS[0], {"x": (1, 3, 8, 8)}], "no shape for y"),
    ([SETS[0], {**SETS[1], "z": (1,)}], "z not input"),
    ([SETS[0], [[1, 3, 8, 8]]], "1 shape\\(s\\); the model has 2 input"),
    ([SETS[0], SETS[0]], "two shape sets are the same"),
])
def test_sets_that_do_not_fit_the_model_are_refused(files, sets, message):
    with pytest.raises(ConfigError, match=message):
        compile_model(files / "net.onnx", "rk3588", CompileOptions(precision="fp16", dynamic_input=sets))


def test_input_shape_and_dynamic_input_together_are_refused(files):
    with pytest.raises(ConfigError, match="--input-shape and --dynamic-input"):
        compile_model(files / "net.onnx", "rk3588", CompileOptions(precision="fp16", dynamic_input=SETS,
                                                                   input_shapes={"x": [1, 3, 16, 16]}))


# --- builds -------------------------------------------------------------------------------------

def test_fp16_sets_are_the_plain_fp16_builds(files):
    model = compile_model(files / "net.onnx", "rk3588", CompileOptions(precision="fp16", dynamic_input=SETS))
    assert model.shape_sets() == SETS
    for index, shapes in enumerate(SETS):
        plain = compile_model(files / "net.onnx", "rk3588", CompileOptions(precision="fp16", input_shapes=shapes))
        view = model.shape_set(index)
        assert view.trailer == plain.trailer and view.sections == plain.sections, index
        assert view.to_bytes() == plain.to_bytes()
        feeds = _feeds(shapes, index)
        got = _run(view, feeds)["out"]
        assert np.array_equal(got, _run(plain, feeds)["out"])
        expected = ort.InferenceSession(_model().SerializeToString()).run(None, feeds)[0]
        assert got.shape == expected.shape and np.abs(got - expected).max() < 0.01


def test_int8_sets_are_plain_builds_with_the_first_sets_quantization(files, int8):
    front, model = int8
    for index, shapes in enumerate(SETS):
        view = model.shape_set(index)
        plain = _plain_int8_at(files, front, shapes)
        assert view.to_bytes() == plain.to_bytes(), f"set {index}"
        feeds = _feeds(shapes, 20 + index)
        got = _run(view, feeds, dequantize=False)["out"]
        assert np.array_equal(got, _run(plain, feeds, dequantize=False)["out"])
        expected = ort.InferenceSession(_model().SerializeToString()).run(None, feeds)[0]
        assert _cosine(_run(view, feeds)["out"], expected) > 0.99


def test_the_first_sets_calibration_is_every_sets_quantization(files, int8):
    """Read from the file: every tensor two sets share has one scale and zero point."""
    _, model = int8
    first = {t.name: t.quantization for t in model.shape_set(0).tensors()}
    for index in (1, 2):
        shared = [t for t in model.shape_set(index).tensors() if t.name in first]
        assert len(shared) >= 5
        for tensor in shared:
            assert tensor.quantization == first[tensor.name], (index, tensor.name)


def test_the_weights_are_stored_once(files, int8):
    _, model = int8
    weights = model.sections_of_kind(SectionKind.WEIGHTS)
    assert len(weights) == 1 and weights[0].size > 0
    assert len(model.sections_of_kind(SectionKind.REGCMD)) == 3  # one chain set per shape set
    for index in range(3):
        view = model.shape_set(index)
        assert view.sections_of_kind(SectionKind.WEIGHTS)[0].data == weights[0].data
    separate = sum(len(model.shape_set(i).to_bytes()) for i in range(3))
    assert len(model.to_bytes()) < separate - 2 * weights[0].size


def _gap_model():
    """The vendor fixture's network (meta.json of dynamic_shape_int8): conv s2 + relu, conv + relu,
    GlobalAveragePool, Flatten, Gemm - the pooling is split into convs whose kernels depend on H, W."""
    rng = np.random.default_rng(7)
    init = [numpy_helper.from_array(rng.normal(0, s, shape).astype(np.float32), name) for name, shape, s in
            (("w1", (16, 3, 3, 3), 0.3), ("b1", (16,), 0.1), ("w2", (32, 16, 3, 3), 0.1), ("b2", (32,), 0.1),
             ("fc", (10, 32), 0.3), ("fb", (10,), 0.1))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _weights_image(model):
    """The weight region's bytes as the loader places them (pieces in address order, no gaps)."""
    pieces = sorted(model.sections_of_kind(SectionKind.WEIGHTS), key=lambda section: section.load_address)
    image = b""
    for piece in pieces:
        assert piece.load_address - pieces[0].load_address == len(image)
        image += piece.data
    return pieces[0].load_address, image


def test_shape_derived_constants_are_the_sets_own_and_the_rest_shared(tmp_path):
    """At 224/160/96 the pooling's kernels differ per set (one stage fewer at 96): set 0's weight
    image is stored in pieces, later sets place the pieces they share and store only their own run."""
    model_proto = _gap_model()
    rng = np.random.default_rng(8)
    samples = [{"x": rng.random((1, 3, 224, 224)).astype(np.float32)} for _ in range(2)]
    sets = [[[1, 3, 224, 224]], [[1, 3, 160, 160]], [[1, 3, 96, 96]]]
    front = prepare(model_proto, "rk3588", CompileOptions(dataset=samples, dynamic_input=sets))
    from npuemu.compiler.driver import build
    model = build(front)
    pieces = model.sections_of_kind(SectionKind.WEIGHTS)
    first = _weights_image(model.shape_set(0))[1]
    assert len(pieces) > 1 and sum(p.size for p in pieces) < 1.1 * len(first)  # not three copies
    session = ort.InferenceSession(model_proto.SerializeToString())
    for index, (shape,) in enumerate(sets):
        plain_front = prepare(model_proto, "rk3588", CompileOptions(precision="float", input_shapes={"x": shape}))
        q = front.quantization
        layers = {node.name for node in plain_front.graph.nodes}
        quantize_graph(plain_front.graph, q.ranges, per_channel=q.per_channel, weight_clipping=q.weight_clipping,
                       layer_dtypes={n: d for n, d in q.layer_dtypes.items() if n in layers and n not in q.conversions})
        plain = build_graph(plain_front.graph, "rk3588", CompileOptions(dataset=samples), front.preprocess)
        view = model.shape_set(index)
        assert view.trailer == plain.trailer and _weights_image(view) == _weights_image(plain)
        x = {"x": rng.random(shape).astype(np.float32)}
        assert np.array_equal(_run(view, x, False)["y"], _run(plain, x, False)["y"])
        assert _cosine(_run(view, x)["y"], session.run(None, x)[0]) > 0.999


def test_a_set_with_layers_the_first_lacks_is_refused_naming_the_tensor():
    """Calibration runs at the first set only: at 224x224 the pooling takes a stage more than at
    96x96, whose output has no range when 96 comes first."""
    samples = [{"x": np.random.default_rng(9).random((1, 3, 96, 96)).astype(np.float32)}]
    with pytest.raises(CompileError, match="set 2: .*no quantization range for tensor.*list first the set"):
        compile_model(_gap_model(), "rk3588", CompileOptions(dataset=samples, dynamic_input=[[[1, 3, 96, 96]],
                                                                                             [[1, 3, 224, 224]]]))


# --- running ------------------------------------------------------------------------------------

def test_run_model_file_picks_the_set_and_refuses_other_shapes(files, int8, tmp_path):
    _, model = int8
    path = tmp_path / "d.npu"
    model.write(path)
    for index, shapes in enumerate(SETS):
        feeds = _feeds(shapes, 30 + index)
        assert np.array_equal(run_model_file(path, feeds)["out"], _run(model.shape_set(index), feeds)["out"])
    with pytest.raises(InputError, match="x=1,3,9,12 y=1,4,4,6 match none of the model's shape sets: "
                       "x=1,3,16,16 y=1,4,8,8; x=1,3,8,12 y=1,4,4,6; x=1,3,12,8 y=1,4,6,4"):
        run_model_file(path, _feeds({"x": (1, 3, 9, 12), "y": (1, 4, 4, 6)}, 0))
    with pytest.raises(InputError, match="match none"):  # each input of the set must match
        run_model_file(path, _feeds({"x": (1, 3, 8, 12), "y": (1, 4, 8, 8)}, 0))


def test_the_cli_compiles_runs_times_and_reports_each_set(files, int8, tmp_path, capsys):
    out = tmp_path / "d.npu"
    assert main(["compile", str(files / "net.onnx"), "--dynamic-input", CLI_SETS, "--quantize", "--dataset",
                 str(files / "ds.txt"), "-o", str(out)]) == 0
    assert "3 shape sets" in capsys.readouterr().out
    assert ModelFile.read(out).sections == int8[1].sections  # the CLI names the graph after the file
    feeds = _feeds(SETS[1], 40)
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
    assert main(["run", str(out), "-i", str(tmp_path / "x.npy"), "-i", str(tmp_path / "y.npy"),
                 "-o", str(tmp_path / "o")]) == 0
    assert "shape set 1 of 3 (x=1,3,8,12 y=1,4,4,6)" in capsys.readouterr().out
    assert np.array_equal(np.load(tmp_path / "o" / "out.npy"), _run(int8[1].shape_set(1), feeds)["out"])
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 5, 5), np.float32))
    assert main(["run", str(out), "-i", str(tmp_path / "bad.npy"), "-i", str(tmp_path / "y.npy")]) != 0
    assert "match none of the model's shape sets: x=1,3,16,16 y=1,4,8,8;" in capsys.readouterr().err
    perf = []
    for index in range(3):
        assert main(["perf", str(out), "--shape-set", str(index), "--json"]) == 0
        perf.append(json.loads(capsys.readouterr().out))
        shapes = {layer["input_shapes"] for layer in perf[-1]["layers"]}
        assert "(1,3,{},{})".format(*SETS[index]["x"][2:]) in shapes and any("shape set" in n for n in perf[-1]["notes"])
    cycles = [sum(layer["npu_cycles"] for layer in report["layers"]) for report in perf]
    assert cycles[0] > cycles[1] and len(set(cycles)) >= 2  # 16x16 does more work than 8x12
    assert main(["perf", str(out), "--shape-set", "3"]) != 0
    assert "3 shape sets (0..2)" in capsys.readouterr().err
    assert main(["mem", str(out), "--shape-set", "2"]) == 0
    assert "shape set 2 of 3" in capsys.readouterr().out


def test_the_api_builds_and_infers_at_each_shape(files, int8, tmp_path, monkeypatch):
    from npuemu.api import RKNN

    monkeypatch.chdir(tmp_path)
    rknn = RKNN()
    sets = [[list(s["x"]), list(s["y"])] for s in SETS]
    assert rknn.config(target_platform="rk3588", dynamic_input=sets) == 0
    assert rknn.load_onnx(str(files / "net.onnx")) == 0
    assert rknn.build(do_quantization=False) == 0
    assert rknn.init_runtime() == 0
    for index, shapes in enumerate(SETS):
        feeds = _feeds(shapes, 50 + index)
        got = rknn.inference(inputs=[feeds["x"], feeds["y"]], data_format="nchw")[0]
        plain = compile_model(files / "net.onnx", "rk3588", CompileOptions(precision="fp16", input_shapes=shapes))
        assert np.array_equal(got, _run(plain, feeds)["out"])
    bad = _feeds({"x": (1, 3, 9, 9), "y": (1, 4, 4, 6)}, 0)
    assert rknn.inference(inputs=[bad["x"], bad["y"]], data_format="nchw") is None  # the vendor's: logged, None


# --- the container --------------------------------------------------------------------------------

def test_round_trip_version_and_flag(int8, tmp_path):
    _, model = int8
    data = model.to_bytes()
    assert struct.unpack_from("<HHI", data, 8) == (1, 1, 2)  # format 1.1, flag bit 1: dynamic shapes
    again = ModelFile.from_bytes(data)
    assert again == model and again.shape_sets() == SETS and again.format_version == (1, 1)
    static = model.shape_set(1)
    assert struct.unpack_from("<HHI", static.to_bytes(), 8) == (1, 0, 0)  # a static file stays 1.0
    assert ModelFile.from_bytes(static.to_bytes()).shape_sets() == ()


def _hostile(model, change, flags=2, version=(1, 1)):
    trailer = json.loads(json.dumps(model.trailer))
    change(trailer)
    return build_file(model.sections, trailer, version, flags)


def _set(trailer, index):
    return trailer["dynamic"]["sets"][index]


HOSTILE = {
    "one set": (lambda t: t["dynamic"].update(sets=t["dynamic"]["sets"][:1]), "2..32 entries"),
    "33 sets": (lambda t: t["dynamic"].update(sets=t["dynamic"]["sets"] * 11), "2..32 entries"),
    "not an object": (lambda t: t.update(dynamic=[1]), "expected an object"),
    "unknown input": (lambda t: t["dynamic"].update(inputs=["x", "q"]), "distinct graph inputs"),
    "repeated input": (lambda t: t["dynamic"].update(inputs=["x", "x"]), "distinct graph inputs"),
    "negative dim": (lambda t: _set(t, 1)["shapes"][0].__setitem__(2, -1), "0..2147483647"),
    "huge dim": (lambda t: _set(t, 1)["shapes"][0].__setitem__(2, 1 << 40), "0..2147483647"),
    "rank 9": (lambda t: _set(t, 1)["shapes"].__setitem__(0, [1] * 9), "1..8 entries"),
    "too many elements": (lambda t: _set(t, 1)["shapes"].__setitem__(0, [65536, 65536, 2]), "elements"),
    "one shape for two inputs": (lambda t: _set(t, 1)["shapes"].pop(), "2..2 entries"),
    "repeated set": (lambda t: t["dynamic"]["sets"].__setitem__(2, _set(t, 1)), "repeats"),
    "set 0 with keys": (lambda t: _set(t, 0).update(schedule=[]), "set 0 is the top-level"),
    "set without schedule": (lambda t: _set(t, 1).pop("schedule"), "missing key"),
    "unknown section": (lambda t: _set(t, 1)["sections"][0].update(name="nope"), "not a section"),
    "section twice": (lambda t: _set(t, 1)["sections"].append(dict(_set(t, 1)["sections"][0])), "listed twice"),
    "region none": (lambda t: _set(t, 1)["sections"][0].update(region="none"), "one of ddr, sram"),
    "address beyond 32 bits": (lambda t: _set(t, 1)["sections"][0].update(load_address=1 << 33), "0..4294967295"),
    "placement extra key": (lambda t: _set(t, 1)["sections"][0].update(size=1), "exactly name"),
    "view name twice": (lambda t: _set(t, 1)["sections"][1].update({"as": _set(t, 1)["sections"][0]["as"]}), "used twice"),
    "view name control char": (lambda t: _set(t, 1)["sections"][0].update({"as": "a\x01"}), "control character"),
    "shape not the tensor's": (lambda t: _set(t, 1)["shapes"][0].__setitem__(2, 9), "tensor record says"),
    "tensor outside memory": (lambda t: _set(t, 1)["tensors"][0].update(address=1 << 31), "sets\\[1\\]"),
    "chain into weights": (lambda t: _set(t, 2)["schedule"][0]["chain"].update(section="weights"), "sets\\[2\\]"),
    "huge region": (lambda t: _set(t, 1)["memory_map"]["regions"][0].update(size=1 << 40), "sets\\[1\\]"),
    "orphan unplaced section": (lambda t: _set(t, 2).update(sections=[p for p in _set(t, 2)["sections"]
                                                                      if "@" not in p["name"]]), "no shape set places"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_dynamic_records_are_refused(int8, case):
    change, message = HOSTILE[case]
    data = _hostile(int8[1], change)
    with pytest.raises(ModelFileError, match=message):
        ModelFile.from_bytes(data)


def test_flag_and_version_must_agree_with_the_record(int8):
    model = int8[1]
    with pytest.raises(ModelFileError, match="flag bit 1 .* is clear but the trailer has a 'dynamic'"):
        ModelFile.from_bytes(_hostile(model, lambda t: None, flags=0))
    with pytest.raises(ModelFileError, match="needs format 1.1"):
        ModelFile.from_bytes(_hostile(model, lambda t: None, version=(1, 0)))
    with pytest.raises(ModelFileError, match="flag bit 1 .* is set but the trailer has no"):
        ModelFile.from_bytes(_hostile(model, lambda t: t.pop("dynamic")))


@pytest.mark.parametrize("case", ["huge dim", "33 sets", "tensor outside memory", "huge region"])
@pytest.mark.parametrize("command", [["run"], ["perf"], ["mem"], ["inspect"], ["trace"]])
def test_hostile_files_give_a_one_line_error_on_the_command_line(int8, tmp_path, capsys, command, case):
    path = tmp_path / "h.npu"
    path.write_bytes(_hostile(int8[1], HOSTILE[case][0]))
    extra = ["-o", str(tmp_path / "t.json")] if command == ["trace"] else []
    assert main([*command, str(path), *extra]) != 0
    err = capsys.readouterr().err.strip()
    assert "trailer.dynamic" in err and "Traceback" not in err and len(err.splitlines()) == 1


# --- the vendor's dynamic-shape build (rknn-fixtures-ops/dynamic_shape_int8) --------------------

VENDOR = "dynamic_shape_int8"
#: max |q_emu - q_sim| in output LSBs per shape set, measured 4 / 8 / 2 (10 outputs; the vendor's
#: GAP is three chained pooling convs, where the emulator's rounding differs); cos vs sim >= 0.9994
VENDOR_MAX_LSB = (4, 8, 2)


def _vendor_case():
    from tests.shared_data import RKNN_FIXTURES_OPS

    folder = RKNN_FIXTURES_OPS / VENDOR
    return folder, json.loads((folder / "meta.json").read_text())


def _vendor_input(meta, index):
    """The fixture's test input ``index``, regenerated by the recipe in its meta.json (only input_0 ships)."""
    recipe, tensor = meta["data"]["test_inputs"], meta["inputs"][0]
    x = np.random.RandomState(recipe["seeds"][index]).rand(*recipe["shapes"][index][0]).astype(np.float32)
    q = np.clip(np.rint(x / tensor["scale"]) + tensor["zero_point"], -128, 127)
    return ((q - tensor["zero_point"]) * tensor["scale"]).astype(np.float32)


def _xz(path):
    import lzma
    return np.load(lzma.open(path))


@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_vendor_dynamic_rknn_runs_at_each_shape(index):
    from npuemu.emulator.rknn_runner import RknnRunner, dynamic_graph
    from npuemu.isa.rknn import load_rknn

    folder, meta = _vendor_case()
    shapes = [tuple(s[0]) for s in meta["build"]["config"]["dynamic_input"]]
    first = load_rknn(folder / "model.rknn")
    assert [entry[0] for entry in first.graph_shapes] == shapes
    x = _vendor_input(meta, index)
    if index == 0:
        assert np.array_equal(x, _xz(folder / "input_0.npy.xz"))  # the recipe is the fixture's
    assert dynamic_graph(first, [x.shape]) == index
    model = load_rknn(folder / "model.rknn", graph_index=index)
    assert model.input_tensors[0].shape == shapes[index]
    # weights stored once: a later graph's const tensors read graphs[0]'s bytes
    for name in ("w1", "b2", "w7", "b8", "w17", "b18"):
        assert bytes(model.blob(model.tensor(name))) == bytes(first.blob(first.tensor(name))) != b""
    run = RknnRunner(model).run([x])
    out = meta["outputs"][0]
    sim = _xz(folder / f"sim_output_{index}.npy.xz").astype(np.float64)
    q_sim = np.rint(sim / np.float32(out["scale"])).astype(np.int64) + out["zero_point"]
    assert np.abs(run.quantized["y"].astype(np.int64) - q_sim).max() <= VENDOR_MAX_LSB[index]
    ours = run.outputs["y"].ravel().astype(np.float64)
    assert _cosine(ours, sim) > 0.9994
    assert _cosine(ours, _xz(folder / f"ort_output_{index}.npy.xz")) > 0.9993


def test_npuemu_run_picks_the_vendor_graph_and_refuses_other_shapes(tmp_path, capsys):
    folder, meta = _vendor_case()
    np.save(tmp_path / "x1.npy", _vendor_input(meta, 1))
    assert main(["run", str(folder / "model.rknn"), "-i", str(tmp_path / "x1.npy")]) == 0
    assert "shape set 1 of 3 (1,3,160,160)" in capsys.readouterr().out
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 128, 128), np.float32))
    assert main(["run", str(folder / "model.rknn"), "-i", str(tmp_path / "bad.npy")]) != 0
    assert "match none of the file's shape sets: 1,3,224,224; 1,3,160,160; 1,3,96,96" in capsys.readouterr().err
    assert main(["perf", str(folder / "model.rknn"), "--shape-set", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "shape set 2 of 3 (1,3,96,96)" in report["notes"][0]
    listings, layers = [], meta["librknnc"]["layers"]  # the vendor's table lists each shape set in turn
    for layer in layers:
        if layer["id"] == 0:
            listings.append([])
        listings[-1].append(layer)
    vendor = [(layer["op_type"], layer["output_shape"]) for layer in listings[2] if layer["target"] == "NPU"]
    ours = [(layer["op_type"], layer["output_shape"]) for layer in report["layers"] if layer["target"] == "NPU"]
    assert ours == vendor and len(vendor) == 5


def test_the_api_runs_the_vendor_dynamic_rknn_at_each_shape(capsys):
    from npuemu.emulator.rknn_runner import RknnRunner
    from npuemu.isa.rknn import load_rknn
    from npuemu.api import RKNN

    folder, meta = _vendor_case()
    rknn = RKNN()
    assert rknn.load_rknn(str(folder / "model.rknn")) == 0 and rknn.init_runtime() == 0
    for index in (2, 0, 1):
        x = _vendor_input(meta, index)
        got = rknn.inference(inputs=[x], data_format="nchw")[0]
        expected = RknnRunner(load_rknn(folder / "model.rknn", graph_index=index)).run([x]).outputs["y"]
        assert np.array_equal(got, expected)
    assert rknn.inference(inputs=[np.zeros((1, 3, 50, 50), np.float32)], data_format="nchw") is None
    assert "match none of the file's shape sets" in capsys.readouterr().err


@pytest.mark.parametrize("index", [0, 1, 2])
def test_vendor_perf_per_shape_is_the_vendor_table(index, capsys):
    """`perf --shape-set N --ddr-model vendor` on the dynamic .rknn: per NPU layer the NPU and DDR
    cycles of the vendor's build-time table for that shape (it lists each shape's layers in turn)."""
    folder, meta = _vendor_case()
    assert main(["perf", str(folder / "model.rknn"), "--shape-set", str(index), "--ddr-model", "vendor",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    listings = []
    for layer in meta["librknnc"]["layers"]:
        if layer["id"] == 0:
            listings.append([])
        listings[-1].append(layer)
    vendor = [(l["npu_cycles"], l["ddr_cycles"]) for l in listings[index] if l["target"] == "NPU"]
    ours = [(l["npu_cycles"], l["ddr_cycles"]) for l in report["layers"] if l["target"] == "NPU"]
    assert ours == vendor


def test_our_dynamic_build_of_the_vendor_model_has_its_npu_cycles_per_shape(tmp_path, capsys):
    """The fixture's model.onnx built by npuemu with the vendor's three shape sets: per shape, the
    NPU layers and their MAC cycles are those of the vendor's table for that shape."""
    folder, meta = _vendor_case()
    rng = np.random.default_rng(11)
    for i in range(2):
        np.save(tmp_path / f"c{i}.npy", rng.random((1, 3, 224, 224)).astype(np.float32))
    (tmp_path / "ds.txt").write_text("c0.npy\nc1.npy\n")
    out = tmp_path / "v.npu"
    assert main(["compile", str(folder / "model.onnx"), "--dynamic-input", "x=1,3,224,224;x=1,3,160,160;x=1,3,96,96",
                 "--quantize", "--dataset", str(tmp_path / "ds.txt"), "-o", str(out)]) == 0
    capsys.readouterr()
    listings = []
    for layer in meta["librknnc"]["layers"]:
        if layer["id"] == 0:
            listings.append([])
        listings[-1].append(layer)
    for index in range(3):
        assert main(["perf", str(out), "--shape-set", str(index), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        ours = [l["npu_cycles"] for l in report["layers"] if l["target"] == "NPU" and l["tasks"]]  # not a view
        assert ours == [l["npu_cycles"] for l in listings[index] if l["target"] == "NPU"]
