"""``from npuemu.api import RKNN`` runs vendor-style scripts with only the import line changed
(issue 21 item 1): the guide's MobileNet example (section 4.1, rknn_model_zoo's mobilenet.py
flow: config, load_onnx, build, export_rknn, init_runtime, accuracy_analysis, eval_perf,
eval_memory, inference) on the bundled demo network, and a YOLO-style detector script (several
outputs, an NHWC uint8 image) compared with onnxruntime."""

from __future__ import annotations

import runpy
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from npuemu.compiler.quant.images import encode_png
from npuemu.compiler.quant.synthetic import synthetic_batch

MOBILENET_SCRIPT = '''
import sys
import numpy as np
from rknn.api import RKNN

MODEL, DATASET, IMG_PATH, OUT = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
TARGET, QUANT = 'rk3588', True


def softmax(x):
    e = np.exp(x - np.max(x))
    return e / e.sum()


if __name__ == '__main__':
    rknn = RKNN(verbose=False)
    print('--> Config model')
    rknn.config(mean_values=[[0, 0, 0]], std_values=[[255, 255, 255]], target_platform=TARGET)
    print('--> Loading model')
    ret = rknn.load_onnx(model=MODEL)
    if ret != 0:
        print('Load model failed!')
        exit(ret)
    print('--> Building model')
    ret = rknn.build(do_quantization=QUANT, dataset=DATASET)
    if ret != 0:
        print('Build model failed!')
        exit(ret)
    ret = rknn.export_rknn(OUT)
    if ret != 0:
        print('Export rknn model failed!')
        exit(ret)
    img = np.load(IMG_PATH.replace('.png', '_hwc.npy'))   # what cv2.imread + cvtColor give: HWC uint8 RGB
    img = np.expand_dims(img, 0)
    ret = rknn.accuracy_analysis(inputs=[IMG_PATH], target=TARGET)
    if ret != 0:
        print('Accuracy analysis failed!')
        exit(ret)
    ret = rknn.init_runtime(target=TARGET, perf_debug=True)
    if ret != 0:
        print('Init runtime environment failed!')
        exit(ret)
    rknn.eval_perf()
    ret = rknn.init_runtime(target=TARGET, eval_mem=True)
    rknn.eval_memory()
    ret = rknn.init_runtime()
    outputs = rknn.inference(inputs=[img])
    scores = softmax(np.array(outputs[0][0]))
    print('-----TOP 5-----')
    for i in np.argsort(scores)[::-1][:5]:
        print('[{}] score={:.2f}'.format(i, scores[i]))
    np.save(OUT + '.logits.npy', outputs[0])
    rknn.release()
'''


def _vendor_script(text: str, folder: Path) -> Path:
    """The script with its import line changed, and nothing else."""
    assert text.count("from rknn.api import RKNN") == 1
    path = folder / "script.py"
    path.write_text(text.replace("from rknn.api import RKNN", "from npuemu.api import RKNN"), encoding="utf-8")
    return path


def _run(script: Path, argv: list[str], monkeypatch) -> None:
    monkeypatch.chdir(script.parent)
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:  # the vendor scripts call exit(ret) on failure
        pytest.fail(f"the script exited with {stop.code}")


def _images(folder: Path, shape: tuple[int, ...], count: int) -> list[Path]:
    """PNG images (and the same pixels as HWC uint8 .npy) of the input's size."""
    paths = []
    for index in range(count):
        hwc = synthetic_batch(shape, 40 + index)[0].transpose(1, 2, 0).astype(np.uint8)
        path = folder / f"img{index}.png"
        path.write_bytes(encode_png(hwc))
        np.save(folder / f"img{index}_hwc.npy", hwc)
        paths.append(path)
    return paths


def _dataset(folder: Path, images: list[Path]) -> Path:
    path = folder / "dataset.txt"
    path.write_text("".join(f"{image.name}\n" for image in images), encoding="utf-8")
    return path


def test_mobilenet_example_runs_with_only_the_import_changed(tmp_path, monkeypatch, capsys):
    import onnx
    import onnxruntime

    from npuemu.tools.demo_network import INPUT_SHAPE, demo_network

    model = tmp_path / "mobilenet.onnx"
    onnx.save(demo_network(), model)
    images = _images(tmp_path, INPUT_SHAPE, 4)
    dataset = _dataset(tmp_path, images)
    script = _vendor_script(MOBILENET_SCRIPT, tmp_path)
    _run(script, [str(model), str(dataset), str(images[0]), "mobilenet.rknn"], monkeypatch)
    out = capsys.readouterr()
    assert "-----TOP 5-----" in out.out
    assert "Total Operator Elapsed Per Frame Time(us)" in out.out and "OpType" in out.out  # perf_debug: per layer
    assert "Memory Profile Info Dump" in out.out and "Weight Memory" in out.out
    assert "runtime_error" in out.out
    assert "E " not in out.err
    assert "npuemu model file" in out.err  # export_rknn says what it wrote
    snapshot = tmp_path / "snapshot"
    for part in ("error_analysis.txt", "map_name_to_file.txt", "golden/npy", "simulator/npy", "runtime/npy"):
        assert (snapshot / part).exists(), part
    assert (tmp_path / "mobilenet.rknn").read_bytes()[:3] == b"NPU"
    hwc = np.load(tmp_path / "img0_hwc.npy")
    expected = onnxruntime.InferenceSession(str(model)).run(
        None, {"image": (hwc.transpose(2, 0, 1)[None] / 255.0).astype(np.float32)})[0]
    got = np.load(tmp_path / "mobilenet.rknn.logits.npy")
    cosine = float(np.dot(got.ravel(), expected.ravel()) / np.linalg.norm(got) / np.linalg.norm(expected))
    assert got.shape == expected.shape and cosine > 0.99


YOLO_SCRIPT = '''
import sys
import numpy as np
from rknn.api import RKNN

ONNX_MODEL, DATASET, IMG, RKNN_MODEL = sys.argv[1:5]
OBJ_THRESH = 0.25


def post_process(outputs):
    boxes = []
    for output in outputs:
        grid = output[0]                          # [anchors * (5 + classes), h, w]
        score = grid[4::6].max()
        boxes.append((grid.shape[-1], float(score)))
    return boxes


if __name__ == '__main__':
    rknn = RKNN(verbose=True)
    rknn.config(mean_values=[[0, 0, 0]], std_values=[[255, 255, 255]], target_platform='rk3588',
                quantized_algorithm='normal', quantized_method='channel', optimization_level=3)
    ret = rknn.load_onnx(model=ONNX_MODEL)
    if ret != 0:
        exit(ret)
    ret = rknn.build(do_quantization=True, dataset=DATASET)
    if ret != 0:
        exit(ret)
    ret = rknn.export_rknn(RKNN_MODEL)
    if ret != 0:
        exit(ret)
    ret = rknn.init_runtime()
    if ret != 0:
        exit(ret)
    img = np.load(IMG)                            # HWC uint8, as cv2.imread gives
    outputs = rknn.inference(inputs=[img])
    print('heads', post_process(outputs))
    np.savez(RKNN_MODEL + '.outputs.npz', *outputs)
    rknn.release()
'''


def detector_network(seed: int = 7):
    """A small YOLO-like detector: a strided backbone and three 1x1 heads (stride 8, 16, 32 of a
    64x64 image), 3 anchors x (5 + 1 class) channels each, Sigmoid on the heads."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, initializers, outputs = [], [], []

    def conv(name, x, cin, cout, kernel, stride, activation):
        weights = rng.normal(0, (2.0 / (cin * kernel * kernel)) ** 0.5, (cout, cin, kernel, kernel))
        initializers.extend([numpy_helper.from_array(weights.astype(np.float32), f"{name}.w"),
                             numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"{name}.b")])
        nodes.append(helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [f"{name}.c"], name=name,
                                      kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=[kernel // 2] * 4))
        nodes.append(helper.make_node(activation, [f"{name}.c"], [name], name=f"{name}.act"))
        return name

    x = conv("stem", "images", 3, 8, 3, 2, "Relu")
    x = conv("c2", x, 8, 16, 3, 2, "Relu")
    p3 = conv("c3", x, 16, 16, 3, 2, "Relu")
    p4 = conv("c4", p3, 16, 32, 3, 2, "Relu")
    p5 = conv("c5", p4, 32, 32, 3, 2, "Relu")
    for index, (feature, channels) in enumerate(((p3, 16), (p4, 32), (p5, 32))):
        outputs.append(conv(f"head{index}", feature, channels, 18, 1, 1, "Sigmoid"))
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_yolo_style_script_runs_with_only_the_import_changed(tmp_path, monkeypatch, capsys):
    import onnx
    import onnxruntime

    model = tmp_path / "detector.onnx"
    onnx.save(detector_network(), model)
    images = _images(tmp_path, (1, 3, 64, 64), 4)
    dataset = _dataset(tmp_path, images)
    script = _vendor_script(YOLO_SCRIPT, tmp_path)
    _run(script, [str(model), str(dataset), str(tmp_path / "img1_hwc.npy"), "detector.rknn"], monkeypatch)
    out = capsys.readouterr()
    assert "heads [(8," in out.out and "E " not in out.err
    got = np.load(tmp_path / "detector.rknn.outputs.npz")
    hwc = np.load(tmp_path / "img1_hwc.npy")
    expected = onnxruntime.InferenceSession(str(model)).run(
        None, {"images": (hwc.transpose(2, 0, 1)[None] / 255.0).astype(np.float32)})
    assert len(got.files) == 3
    for index, want in enumerate(expected):
        value = got[f"arr_{index}"]
        assert value.dtype == np.float32 and value.shape == want.shape
        assert np.abs(value - want).max() < 0.05  # int8 quantization of sigmoid outputs
