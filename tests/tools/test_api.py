"""``npuemu.api.RKNN`` method by method (tools/api/): what each honours, what it refuses by name,
and the vendor's return conventions (0 / -1 / None with one ``E <method>:`` line, no traceback)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from npuemu.api import RKNN
from npuemu.compiler.quant.images import encode_png
from npuemu.compiler.quant.synthetic import synthetic_batch
from npuemu.tools.demo_network import INPUT_SHAPE, demo_network
from tests.shared_data import RKNN_FIXTURES

MEAN, STD = [[0, 0, 0]], [[255, 255, 255]]


@pytest.fixture()
def demo(tmp_path: Path) -> dict:
    """The demo network, a PNG dataset and the same images as HWC uint8 arrays."""
    import onnx

    onnx.save(demo_network(), tmp_path / "demo.onnx")
    images = [synthetic_batch(INPUT_SHAPE, 3 + i)[0].transpose(1, 2, 0).astype(np.uint8) for i in range(3)]
    for index, image in enumerate(images):
        (tmp_path / f"im{index}.png").write_bytes(encode_png(image))
    (tmp_path / "ds.txt").write_text("im0.png\nim1.png\nim2.png\n", encoding="utf-8")
    return {"model": str(tmp_path / "demo.onnx"), "dataset": str(tmp_path / "ds.txt"), "images": images,
            "folder": tmp_path}


def _built(demo: dict, **config) -> RKNN:
    rknn = RKNN()
    assert rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588", **config) == 0
    assert rknn.load_onnx(model=demo["model"]) == 0
    assert rknn.build(do_quantization=True, dataset=demo["dataset"]) == 0
    return rknn


def _float_reference(demo: dict, image: np.ndarray) -> np.ndarray:
    import onnxruntime

    session = onnxruntime.InferenceSession(demo["model"])
    return session.run(None, {"image": (image.transpose(2, 0, 1)[None] / 255.0).astype(np.float32)})[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a.ravel(), b.ravel()) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("argument, value", [
    ("quantized_dtype", "w8a16"),
    ("quantized_hybrid_level", 1), ("remove_weight", True), ("float_dtype", "bfloat16"),
    ("quantized_algorithm", "best"), ("quantized_method", "tensor"), ("target_platform", "rk9999"),
])
def test_config_refuses_what_it_cannot_honour_by_name(argument, value, capsys):
    assert RKNN().config(**{argument: value}) == -1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("E config:") and (argument in err[0] or str(value) in err[0])


def test_mistakes_return_minus_one_or_none_with_one_error_line(demo, capsys):
    rknn = RKNN()
    assert rknn.build(dataset=demo["dataset"]) == -1  # no load_onnx
    assert rknn.load_onnx(model=str(demo["folder"] / "missing.onnx")) == -1
    assert rknn.init_runtime() == -1
    assert rknn.inference(inputs=[demo["images"][0]]) is None
    assert rknn.eval_perf() is None and rknn.eval_memory() is None
    assert rknn.load_onnx(model=demo["model"]) == 0
    assert rknn.build(do_quantization=True) == -1  # no dataset
    assert rknn.config(mean_values=[[0, 0, 0], [1]], std_values=STD) == 0
    assert rknn.build(dataset=demo["dataset"]) == -1  # two mean lists, one input
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("E ")]
    assert len(lines) == 8 and "Traceback" not in err
    assert "load_onnx(model=...) first" in lines[0] and "missing.onnx" in lines[1] and "no model" in lines[2]
    assert "init_runtime() first" in lines[3] and "needs a calibration dataset" in lines[6]
    assert "mean_values holds 2 list(s)" in lines[7]


def test_runtime_arguments_for_a_board_are_refused(demo, capsys):
    rknn = _built(demo)
    assert rknn.init_runtime(device_id="515e9b401c060c0b") == -1
    assert rknn.init_runtime(target="rk3568") == -1  # built for rk3588
    assert rknn.init_runtime(async_mode=True) == -1
    assert rknn.init_runtime(core_mask=5) == -1
    assert rknn.init_runtime(target="RK3588") == 0
    assert rknn.eval_memory() is None  # needs eval_mem=True, as the vendor's
    assert rknn.eval_perf(fix_freq=False) is None
    assert rknn.inference(inputs=[demo["images"][0]], inputs_pass_through=[1]) is None
    err = capsys.readouterr().err
    for name in ("device_id", "rk3568", "async_mode", "core_mask=5", "eval_mem=True", "fix_freq",
                 "inputs_pass_through"):
        assert name in err, name


def test_inference_layouts_and_mean_std(demo):
    rknn = _built(demo)
    assert rknn.init_runtime() == 0
    image = demo["images"][1]
    nhwc = rknn.inference(inputs=[image])[0]
    assert nhwc.dtype == np.float32 and nhwc.shape == (1, 10)
    assert np.array_equal(rknn.inference(inputs=[image[None]])[0], nhwc)
    nchw = image.transpose(2, 0, 1)[None]
    assert np.array_equal(rknn.inference(inputs=[nchw], data_format="nchw")[0], nhwc)
    assert np.array_equal(rknn.inference(inputs=[image.astype(np.float32)], data_format=["nhwc"])[0], nhwc)
    assert _cosine(nhwc, _float_reference(demo, image)) > 0.99
    assert rknn.inference(inputs=[image[:16]]) is None  # wrong size: an error, not a crash


def test_float16_build_matches_onnxruntime(demo):
    rknn = RKNN()
    rknn.config(mean_values=MEAN, std_values=STD)
    rknn.load_onnx(model=demo["model"])
    assert rknn.build(do_quantization=False, dataset=demo["dataset"]) == 0  # dataset unused, with a warning
    assert rknn.init_runtime() == 0
    image = demo["images"][2]
    got = rknn.inference(inputs=[image])[0]
    assert np.abs(got - _float_reference(demo, image)).max() < 0.02


def test_export_then_load_rknn_runs_the_same_model(demo, capsys):
    rknn = _built(demo, custom_string="model=demo;v=1")
    path = demo["folder"] / "demo.rknn"
    assert rknn.export_rknn(str(path)) == 0
    assert "npuemu model file" in capsys.readouterr().err
    rknn.init_runtime()
    before = rknn.inference(inputs=[demo["images"][0]])[0]
    rknn.release()
    again = RKNN()
    assert again.load_rknn(str(path)) == 0 and again.init_runtime() == 0
    assert np.array_equal(again.inference(inputs=[demo["images"][0]])[0], before)  # mean/std from the file
    assert again.accuracy_analysis(inputs=[str(demo["folder"] / "im0.png")]) == -1  # original model lost
    from npuemu.isa.container import ModelFile
    assert ModelFile.read(path).extra["custom_string"] == "model=demo;v=1"


def test_core_mask_rebuilds_the_split_with_the_same_values(demo):
    rknn = _built(demo)
    rknn.init_runtime()
    single = rknn.inference(inputs=[demo["images"][0]])[0]
    assert rknn.init_runtime(core_mask=RKNN.NPU_CORE_0_1_2, perf_debug=True) == 0
    assert np.array_equal(rknn.inference(inputs=[demo["images"][0]])[0], single)
    assert "Up:" in rknn.eval_perf(is_print=False)  # the split layers' speed-up
    capped = _built(demo, single_core_mode=True)
    assert capped.init_runtime(core_mask=RKNN.NPU_CORE_0_1) == -1


def test_nhwc_npy_dataset_and_batch(demo):
    folder = demo["folder"]
    for index, image in enumerate(demo["images"]):
        np.save(folder / f"s{index}.npy", image[None])  # NHWC, as the vendor's examples store them
    (folder / "npy.txt").write_text("s0.npy\ns1.npy\ns2.npy\n", encoding="utf-8")
    png = _built(demo)
    rknn = RKNN()
    rknn.config(mean_values=MEAN, std_values=STD)
    rknn.load_onnx(model=demo["model"])
    assert rknn.build(do_quantization=True, dataset=str(folder / "npy.txt"), rknn_batch_size=2) == 0
    assert rknn.init_runtime() == 0
    batch = np.stack(demo["images"][:2])
    out = rknn.inference(inputs=[batch])[0]
    png.init_runtime()
    single = png.inference(inputs=[demo["images"][1]])[0]
    assert out.shape == (2, 10) and np.array_equal(out[1:], single)  # same samples, same calibration


def test_hybrid_quantization_steps(demo, monkeypatch):
    monkeypatch.chdir(demo["folder"])
    rknn = RKNN()
    rknn.config(mean_values=MEAN, std_values=STD, target_platform="rk3588")
    rknn.load_onnx(model=demo["model"])
    assert rknn.hybrid_quantization_step1(dataset=demo["dataset"]) == 0
    cfg = demo["folder"] / "demo.quantization.cfg"
    assert (demo["folder"] / "demo.model").is_file() and json.loads((demo["folder"] / "demo.data").read_text())
    text = cfg.read_text()
    layer = text.index('"expand')  # move one conv to float16, as the guide's custom_quantize_layers
    cfg.write_text(text[:layer] + text[layer:].replace("dtype: int8", "dtype: float16", 1))
    rknn.release()
    hybrid = RKNN()
    assert hybrid.hybrid_quantization_step2("demo.model", "demo.data", "demo.quantization.cfg") == 0
    assert hybrid.init_runtime() == 0
    image = demo["images"][0]
    assert _cosine(hybrid.inference(inputs=[image])[0], _float_reference(demo, image)) > 0.99
    assert hybrid.accuracy_analysis(inputs=["im0.png"], output_dir="snap") == 0
    assert (demo["folder"] / "snap" / "error_analysis.txt").read_text().count("(hybrid)") == 1
    assert RKNN().hybrid_quantization_step2("demo.model", "demo.onnx", "demo.quantization.cfg") == -1


def test_verbose_file_gets_the_log(demo):
    log = demo["folder"] / "build.log"
    rknn = RKNN(verbose=True, verbose_file=str(log))
    rknn.config(target_platform="rk3588")
    rknn.load_onnx(model=demo["model"])
    rknn.build(do_quantization=False)
    rknn.release()
    assert "I build: built demo for rk3588" in log.read_text()


@pytest.mark.skipif(not (RKNN_FIXTURES / "rep03b_conv3x3s2_3to32_224_first_meanstd").is_dir(),
                    reason="the vendor .rknn fixtures (shared/rknn-fixtures) are not present")
def test_load_rknn_runs_a_vendor_file(capsys):
    import lzma

    fixture = RKNN_FIXTURES / "rep03b_conv3x3s2_3to32_224_first_meanstd"
    with lzma.open(fixture / "input_0.npy.xz") as handle:
        nchw = np.load(handle)
    rknn = RKNN()
    assert rknn.load_rknn(str(fixture / "model.rknn")) == 0
    assert rknn.init_runtime(perf_debug=True, eval_mem=True) == 0
    out = rknn.inference(inputs=[nchw], data_format="nchw")
    nhwc = rknn.inference(inputs=[nchw.transpose(0, 2, 3, 1)])
    assert np.array_equal(out[0], nhwc[0])
    assert "Total Operator Elapsed Per Frame Time(us)" in rknn.eval_perf(is_print=False)
    assert "Weight Memory" in rknn.eval_memory(is_print=False)
    assert rknn.init_runtime(core_mask=RKNN.NPU_CORE_0_1_2) == -1
    assert rknn.export_rknn("x.rknn") == -1


def test_the_package_is_mapped_for_wheels():
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    assert "npuemu.api" in setuptools["packages"] and setuptools["package-dir"]["npuemu.api"] == "tools/api"


def test_model_pruning_is_the_prune_pass(tmp_path):
    """config(model_pruning=True) (guide 5.8) is the driver's --prune: all-zero conv channels go,
    the outputs stay (tests/compiler/test_prune.py holds the pass itself)."""
    import onnx

    from tests.compiler.test_prune import _model

    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    sizes = {}
    for pruning in (False, True):
        rknn = RKNN()
        assert rknn.config(model_pruning=pruning) == 0
        assert rknn.load_onnx(model=str(path)) == 0
        assert rknn.build(do_quantization=False) == 0
        out = tmp_path / f"m_{pruning}.npu"
        assert rknn.export_rknn(str(out)) == 0
        sizes[pruning] = out.stat().st_size
        rknn.release()
    assert sizes[True] < sizes[False]
