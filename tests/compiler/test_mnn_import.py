"""MNN model files: the reader (compiler/mnn_import.py) against MNN's own ONNX converter.

The .mnn files are made by the converter in the MNN wheel from PyPI (3.6.1), run in a venv of
its own as ../shared/docs/models.md advises (its console script installs packages and posts a
usage log at import; `_tools.mnnconvert` does neither). The venv is made once under
~/.cache/npuemu (or NPUEMU_MNN_PYTHON names a Python that has MNN). Checked: the same model
through the .mnn file and the .onnx file gives the same outputs (onnxruntime on both ONNX
forms, and the emulator on both fp16 builds) and, where the converter keeps the ops, the same
fused graph. Damaged files give one NpuemuError line, never another exception.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.compiler.mnn_import import mnn_to_onnx
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import ModelFileError, NpuemuError, UnsupportedOpError
from npuemu.tools.cli import main

MNN_VERSION = "3.6.1"


# ---- the converter -----------------------------------------------------------------------------

def _mnn_python() -> str:
    given_python = os.environ.get("NPUEMU_MNN_PYTHON")
    if given_python:
        return given_python
    venv = Path.home() / ".cache" / "npuemu" / f"mnn-{MNN_VERSION}-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        # --no-deps: MNN's declared dependencies are not needed by the converter
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", f"MNN=={MNN_VERSION}", "numpy"],
                       check=True, capture_output=True)
    return str(python)


@pytest.fixture(scope="session")
def to_mnn(tmp_path_factory):
    """ONNX model -> path of the .mnn file MNN's converter makes of it."""
    python = _mnn_python()
    folder = tmp_path_factory.mktemp("mnn")

    def convert(model: onnx.ModelProto, name: str) -> Path:
        onnx_path, mnn_path = folder / f"{name}.onnx", folder / f"{name}.mnn"
        onnx.save(model, str(onnx_path))
        code = ("import _tools; _tools.mnnconvert(['mnnconvert', '-f', 'ONNX', '--modelFile', "
                f"{str(onnx_path)!r}, '--MNNModel', {str(mnn_path)!r}, '--bizCode', 'test'])")
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
        assert mnn_path.is_file(), done.stdout + done.stderr
        return mnn_path
    return convert


# ---- models ------------------------------------------------------------------------------------

def _model(nodes, shape, weights, outputs=("y",), opset=13) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in weights.items()]
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def _f(rng, shape, scale=0.3):
    return rng.normal(0, scale, shape).astype(np.float32)


def cnn_model() -> tuple[onnx.ModelProto, list[int]]:
    """Conv+Relu, depthwise+Clip(0,6), MaxPool, 1x1 conv + residual, x*sigmoid(x), GAP, Gemm, Softmax."""
    r = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]), n("Relu", ["c1"], ["r1"]),
             n("Conv", ["r1", "w2", "b2"], ["c2"], group=8, pads=[1, 1, 1, 1], strides=[2, 2]),
             n("Clip", ["c2", "lo", "hi"], ["r2"]), n("MaxPool", ["r2"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             n("Conv", ["p", "w3", "b3"], ["c3"]), n("Add", ["c3", "p"], ["a"]), n("Sigmoid", ["a"], ["s"]),
             n("Mul", ["a", "s"], ["m"]), n("GlobalAveragePool", ["m"], ["g"]), n("Flatten", ["g"], ["f"]),
             n("Gemm", ["f", "wf", "bf"], ["y0"], transB=1), n("Softmax", ["y0"], ["y"], axis=1)]
    weights = {"w1": _f(r, (8, 3, 3, 3)), "b1": _f(r, 8, .1), "w2": _f(r, (8, 1, 3, 3)), "b2": _f(r, 8, .1),
               "lo": np.float32(0), "hi": np.float32(6), "w3": _f(r, (8, 8, 1, 1)), "b3": _f(r, 8, .1),
               "wf": _f(r, (10, 8)), "bf": _f(r, 10, .1)}
    return _model(nodes, [1, 3, 16, 16], weights), [1, 3, 16, 16]


def mixed_model() -> tuple[onnx.ModelProto, list[int]]:
    """Asymmetric conv pads, LeakyRelu, AveragePool with and without the padding counted,
    Concat, PRelu, Tanh, MaxPool ceil_mode, ReduceMean, Sub/Div/Max, Transpose, Reshape."""
    r = np.random.default_rng(1)
    n = helper.make_node
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    nodes = [n("Conv", ["x", "w1", "b1"], ["c1"], pads=[0, 1, 2, 1]), n("LeakyRelu", ["c1"], ["l1"], alpha=0.1),
             n("AveragePool", ["l1"], ["ap0"], count_include_pad=0, **pool),
             n("AveragePool", ["l1"], ["ap1"], count_include_pad=1, **pool), n("Concat", ["ap0", "ap1"], ["cat"], axis=1),
             n("PRelu", ["cat", "slope"], ["pr"]), n("Tanh", ["pr"], ["t"]),
             n("MaxPool", ["t"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
             n("ReduceMean", ["mp"], ["rm"], axes=[2, 3], keepdims=1), n("Sub", ["mp", "rm"], ["sb"]),
             n("Div", ["sb", "dv"], ["dd"]), n("Max", ["dd", "mx"], ["mm"]),
             n("Transpose", ["mm"], ["tr"], perm=[0, 1, 3, 2]), n("Reshape", ["tr", "shp"], ["y"])]
    weights = {"w1": _f(r, (8, 3, 3, 3)), "b1": _f(r, 8, .1), "slope": r.uniform(0, .5, (16, 1, 1)).astype(np.float32),
               "dv": np.float32([2]), "mx": np.float32([-0.2]), "shp": np.int64([1, -1])}
    return _model(nodes, [1, 3, 15, 15], weights), [1, 3, 15, 15]


def upsample_model() -> tuple[onnx.ModelProto, list[int]]:
    """ConvTranspose (stride 2, output_padding; grouped), HardSwish, Resize nearest (scales) and
    linear (sizes), standalone BatchNormalization, Slice with steps, ReduceSum."""
    r = np.random.default_rng(2)
    n = helper.make_node
    nodes = [n("ConvTranspose", ["x", "wt", "bt"], ["d"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1],
               kernel_shape=[3, 3]), n("HardSwish", ["d"], ["hs"]),
             n("Resize", ["hs", "", "sc"], ["up"], mode="nearest", coordinate_transformation_mode="asymmetric",
               nearest_mode="floor"),
             n("Resize", ["hs", "", "", "sz"], ["up2"], mode="linear", coordinate_transformation_mode="half_pixel"),
             n("Concat", ["up", "up2"], ["cat"], axis=1), n("BatchNormalization", ["cat", "g", "be", "mu", "var"], ["bn"]),
             n("Slice", ["bn", "st", "en", "ax", "stp"], ["sl"]),
             n("ConvTranspose", ["sl", "wt2"], ["d2"], strides=[2, 2], group=2, kernel_shape=[2, 2]),
             n("ReduceSum", ["d2", "rax"], ["y"], keepdims=0)]
    weights = {"wt": _f(r, (4, 6, 3, 3)), "bt": _f(r, 6, .1), "sc": np.float32([1, 1, 4, 4]),
               "sz": np.int64([1, 6, 48, 48]), "g": r.uniform(.5, 1.5, 12).astype(np.float32), "be": _f(r, 12, .1),
               "mu": _f(r, 12, .1), "var": r.uniform(.5, 1.5, 12).astype(np.float32), "st": np.int64([1, 0]),
               "en": np.int64([100, 10]), "ax": np.int64([2, 1]), "stp": np.int64([2, 1]), "wt2": _f(r, (10, 3, 2, 2)),
               "rax": np.int64([1])}
    return _model(nodes, [1, 4, 6, 6], weights, opset=14), [1, 4, 6, 6]


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _fused(source, precision="float"):
    front = prepare(source, "rk3588", CompileOptions(precision=precision))
    return front, [(node.display_op, node.target) for node in front.graph.nodes]


# ---- the two paths agree -----------------------------------------------------------------------

@pytest.mark.parametrize("make", [cnn_model, mixed_model, upsample_model])
def test_mnn_graph_computes_what_the_onnx_model_does(make, to_mnn) -> None:
    model, shape = make()
    read = mnn_to_onnx(to_mnn(model, make.__name__))
    x = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    want, got = _ort(model, x), _ort(read, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_cnn_fuses_and_partitions_as_the_onnx_path_does(to_mnn) -> None:
    model, _ = cnn_model()
    _, from_onnx = _fused(model)
    _, from_mnn = _fused(to_mnn(model, "cnn_fused"))
    assert from_mnn == from_onnx
    assert ("Conv+Relu", "NPU") in from_mnn and ("Conv+Clip", "NPU") in from_mnn  # MNN's fused relu/relu6 flags


def test_mixed_model_fuses_as_onnx_except_the_converters_own_rewrite(to_mnn) -> None:
    # MNN's converter writes x / 2 as x * 0.5: that layer differs. It also writes PRelu as
    # x * Select(x < 0, slope, 1), which the reader gives back as PRelu (no Less/Where host steps)
    model, _ = mixed_model()
    _, from_onnx = _fused(model)
    _, from_mnn = _fused(to_mnn(model, "mixed_fused"))
    assert ("PRelu", "NPU") in from_mnn and not any(op in ("Less", "Where") for op, _ in from_mnn)
    assert [("Div", "NPU") if op == ("Mul", "NPU") else op for op in from_mnn] == from_onnx


def test_fp16_builds_of_both_paths_give_identical_outputs(to_mnn) -> None:
    model, shape = cnn_model()
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    outputs = []
    for source in (model, to_mnn(model, "cnn_fp16")):
        graph = prepare(source, "rk3588", CompileOptions(precision="fp16")).graph
        runtime = Runtime(build_graph(graph))
        runtime.set_input("x", x)
        runtime.run()
        outputs.append(runtime.output(graph.outputs[0]))
    np.testing.assert_array_equal(outputs[0], outputs[1])
    want = _ort(model, x)
    assert float(np.abs(outputs[1] - want).max()) <= 2e-3 * float(np.abs(want).max())


def test_cli_compiles_an_mnn_file(to_mnn, tmp_path, capsys) -> None:
    model, _ = cnn_model()
    path = to_mnn(model, "cnn_cli")
    out = tmp_path / "cnn.npu"
    assert main(["compile", str(path), "--fp16", "-o", str(out), "--partition-report"]) == 0
    assert out.stat().st_size > 0
    assert "Conv+Relu" in capsys.readouterr().out


# ---- refusals ----------------------------------------------------------------------------------

def test_unmapped_op_is_refused_naming_op_and_node(to_mnn) -> None:
    n = helper.make_node
    model = _model([n("LRN", ["x"], ["y"], size=3)], [1, 4, 6, 6], {})
    with pytest.raises(UnsupportedOpError, match=r"MNN op 'y' \(LRN\): not supported"):
        mnn_to_onnx(to_mnn(model, "lrn"))


def test_missing_and_tiny_files_are_refused(tmp_path) -> None:
    with pytest.raises(ModelFileError, match="no such MNN file"):
        mnn_to_onnx(tmp_path / "none.mnn")
    (tmp_path / "tiny.mnn").write_bytes(b"\x04\x00")
    with pytest.raises(ModelFileError, match="not a readable MNN model"):
        mnn_to_onnx(tmp_path / "tiny.mnn")


def test_a_huge_vector_length_names_its_offset(to_mnn, tmp_path) -> None:
    model, _ = cnn_model()
    data = bytearray(to_mnn(model, "cnn_huge").read_bytes())
    root = int.from_bytes(data[:4], "little")
    vtable = root - int.from_bytes(data[root:root + 4], "little", signed=True)
    slot = int.from_bytes(data[vtable + 4 + 2 * 7:vtable + 6 + 2 * 7], "little")  # Net.tensorName (seed: slot 18)
    vector = root + slot + int.from_bytes(data[root + slot:root + slot + 4], "little")
    data[vector:vector + 4] = (0x7FFFFFFF).to_bytes(4, "little")
    path = tmp_path / "huge.mnn"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match=rf"vector of 2147483647 x 4 bytes runs past the end at offset {vector}"):
        mnn_to_onnx(path)


@pytest.fixture(scope="module")
def cnn_bytes(to_mnn) -> bytes:
    return to_mnn(cnn_model()[0], "cnn_damaged").read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_files_fail_with_one_error_line(cnn_bytes, tmp_path_factory, data) -> None:
    damaged = bytearray(cnn_bytes)
    if data.draw(st.booleans(), "truncate"):
        damaged = damaged[:data.draw(st.integers(0, len(damaged) - 1), "length")]
    else:
        for _ in range(data.draw(st.integers(1, 8), "flips")):
            at = data.draw(st.integers(0, len(damaged) - 1), "at")
            damaged[at] = data.draw(st.integers(0, 255), "byte")
    path = tmp_path_factory.mktemp("damaged") / "d.mnn"
    path.write_bytes(bytes(damaged))
    try:
        mnn_to_onnx(path)
    except NpuemuError as error:
        assert "\n" not in str(error) and str(path) in str(error)


def test_dynamic_mnn_input_dims_are_fixed_by_input_shape(to_mnn) -> None:
    model, _ = cnn_model()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "H", "W"
    path = to_mnn(model, "cnn_dynamic")
    with pytest.raises(NpuemuError, match=r"cnn_dynamic.mnn.*input .x. dim 2 .* is dynamic"):
        prepare(path, "rk3588", CompileOptions(precision="float"))
    front = prepare(path, "rk3588", CompileOptions(precision="float", input_shapes={"x": [1, 3, 24, 24]}))
    assert front.graph.tensors["x"].shape == (1, 3, 24, 24)


def _rapidocr_model(name: str) -> Path:
    import importlib.util
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the real-model test needs `pip install --no-deps rapidocr-onnxruntime==1.4.4` (docs/models.md)")
    return Path(list(spec.submodule_search_locations)[0]) / "models" / name


@pytest.mark.parametrize("name,shape", [("ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
                                        ("ch_PP-OCRv4_det_infer.onnx", [1, 3, 64, 64])])
def test_real_models_through_mnn_match_the_onnx_path(name, shape, to_mnn) -> None:
    # MobileNetV3-small classifier (HardSwish, SE blocks, StridedSlice shape arithmetic) and DBNet
    # (Interp nearest, Deconvolution); MNN's converter folds some Adds into conv biases and writes
    # HardSigmoid as Add+ReLU6+Mul, so layer names differ; layer counts and placements do not
    model = onnx.load(str(_rapidocr_model(name)))
    path = to_mnn(model, name.removesuffix(".onnx"))
    x = np.random.default_rng(4).uniform(-1, 1, shape).astype(np.float32)
    want, got = _ort(model, x), _ort(mnn_to_onnx(path), x)
    # float32 rounding of the folded biases: measured <= 1.2e-7 absolute (DBNet's map peaks near 1e-3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=max(1e-6, 1e-5 * float(np.abs(want).max())))
    options = CompileOptions(precision="float", input_shapes={"x": shape})
    fused = [[node.target for node in prepare(source, "rk3588", options).graph.nodes] for source in (model, path)]
    assert fused[0] == fused[1]
