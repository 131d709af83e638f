"""The calibration dataset (compiler/quant/dataset.py, preprocess.py): the vendor's text
format, .npy and image samples, mean/std/BGR preprocessing, and every refusal, each naming
the dataset file, the line and the sample file."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.quant.dataset import CalibrationSamples, read_dataset
from npuemu.compiler.quant.images import encode_png
from npuemu.compiler.quant.preprocess import InputPreprocess, preprocess_for_inputs
from npuemu.isa.errors import ConfigError, InputError

IMAGE = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3) * 4  # distinct values per channel


@pytest.fixture
def graph(onnx_case):
    """One image input x [1, 3, 4, 5]."""
    return import_onnx(onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 3, 4, 5]}, ["y"]))


@pytest.fixture
def two_inputs(onnx_case):
    """x [1, 3, 4, 5] and v [1, 6]."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["v"], ["z"])]
    return import_onnx(onnx_case.model(nodes, {"x": [1, 3, 4, 5], "v": [1, 6]}, ["y", "z"]))


def write_dataset(folder: Path, text: str, files: dict[str, bytes | np.ndarray]) -> Path:
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, np.ndarray):
            np.save(path, content)
        else:
            path.write_bytes(content)
    dataset = folder / "ds.txt"
    dataset.write_text(text)
    return dataset


def load_all(dataset: Path, graph, preprocess=None) -> list[dict[str, np.ndarray]]:
    return list(CalibrationSamples(read_dataset(dataset, list(graph.inputs)), graph, preprocess))


def test_lines_paths_and_samples(tmp_path, two_inputs):
    npy = np.arange(6, dtype=np.float32).reshape(1, 6)
    text = "# comment\n\nimgs/a.png v.npy\n   \n{absolute} v_nobatch.npy\n".format(absolute=tmp_path / "imgs" / "a.png")
    dataset = write_dataset(tmp_path, text, {"imgs/a.png": encode_png(IMAGE), "v.npy": npy, "v_nobatch.npy": npy[0]})
    parsed = read_dataset(dataset, ["x", "v"])
    assert [entry.line for entry in parsed.entries] == [3, 5]
    samples = load_all(dataset, two_inputs)
    assert len(samples) == 2
    for sample in samples:
        assert sample["x"].shape == (1, 3, 4, 5) and sample["x"].dtype == np.float32
        assert np.array_equal(sample["x"][0], IMAGE.transpose(2, 0, 1))  # HWC RGB -> CHW, no scaling
        assert np.array_equal(sample["v"], npy)


def test_mean_std_and_bgr(tmp_path, graph):
    gray = IMAGE[:, :, 0]
    dataset = write_dataset(tmp_path, "a.png\nb.npy\ng.png\n", {"a.png": encode_png(IMAGE),
                                                                 "b.npy": IMAGE.transpose(2, 0, 1)[None].astype(np.float32),
                                                                 "g.png": encode_png(gray)})
    preprocess = {"x": InputPreprocess((10.0, 20.0, 30.0), (2.0, 4.0, 8.0), bgr=True)}
    image, array, grey = (sample["x"] for sample in load_all(dataset, graph, preprocess))
    chw = IMAGE.transpose(2, 0, 1).astype(np.float64)
    mean, std = np.array([10, 20, 30.0])[:, None, None], np.array([2, 4, 8.0])[:, None, None]
    assert np.allclose(image[0], (chw[::-1] - mean) / std)  # BGR first, then mean/std in the new order
    assert np.allclose(array[0], (chw - mean) / std)  # .npy samples are not reordered
    assert np.allclose(grey[0], (np.repeat(gray[None].astype(np.float64), 3, axis=0) - mean) / std)


def test_rgba_drops_alpha_for_three_channels(tmp_path, graph):
    rgba = np.concatenate([IMAGE, np.full((4, 5, 1), 7, np.uint8)], axis=2)
    dataset = write_dataset(tmp_path, "a.png\n", {"a.png": encode_png(rgba)})
    assert np.array_equal(load_all(dataset, graph)[0]["x"][0], IMAGE.transpose(2, 0, 1))


def test_preprocess_options(two_inputs):
    both = preprocess_for_inputs(two_inputs, ["127.5"], ["x=1,2,3"])
    assert both["x"] == InputPreprocess((127.5,), (1.0, 2.0, 3.0)) and both["v"] == InputPreprocess((127.5,), (1.0,))
    ordered = preprocess_for_inputs(two_inputs, ["0,0,0", "5"])
    assert ordered["x"].mean == (0.0, 0.0, 0.0) and ordered["v"].mean == (5.0,)
    assert preprocess_for_inputs(two_inputs, ["v=-1"])["v"].mean == (-1.0,)


@pytest.mark.parametrize("means,stds,message", [
    (["x=1,2"], [], "mean has 2 values; the input has 3 channels"),
    (["1", "2", "3"], [], "--mean is given 3 times; the model has 2 input(s)"),
    (["w=1"], [], "--mean names input 'w'; the model's inputs are ['x', 'v']"),
    (["x=1", "x=2"], [], "--mean is given twice for input 'x'"),
    ([], ["x=0"], "every std value must be non-zero"),
    (["a,b"], [], "--mean 'a,b': expected [NAME=]V0,V1,... with numbers"),
    (["v=1,2"], [], "input 'v': mean has 2 values; the input has 6 channels"),
])
def test_preprocess_option_errors(two_inputs, means, stds, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        preprocess_for_inputs(two_inputs, means, stds)


# ---- refusals --------------------------------------------------------------------------------

def expect(error_type, message: str, action) -> str:
    with pytest.raises(error_type) as caught:
        action()
    text = str(caught.value)
    assert message in text, text
    return text


def test_missing_or_empty_dataset(tmp_path, graph):
    expect(InputError, "ds.txt: no such dataset file", lambda: read_dataset(tmp_path / "ds.txt", ["x"]))
    dataset = write_dataset(tmp_path, "# nothing\n\n", {})
    expect(InputError, "the dataset has no samples", lambda: read_dataset(dataset, ["x"]))
    dataset.write_bytes(b"a.png\n\xff\xfe\n")
    expect(InputError, "expected a UTF-8 text file", lambda: read_dataset(dataset, ["x"]))


def test_wrong_number_of_files_names_the_line(tmp_path, two_inputs):
    dataset = write_dataset(tmp_path, "a.png v.npy\na.png\n", {"a.png": encode_png(IMAGE), "v.npy": np.zeros((1, 6))})
    text = expect(InputError, "line 2: 1 file(s) for a model with 2 input(s) (x, v)", lambda: read_dataset(dataset, ["x", "v"]))
    assert str(dataset) in text


def test_missing_file_and_unknown_type(tmp_path):
    dataset = write_dataset(tmp_path, "a.png\nmissing.npy\n", {"a.png": encode_png(IMAGE)})
    expect(InputError, "line 2: missing.npy: no such file (paths are relative to the dataset's folder",
           lambda: read_dataset(dataset, ["x"]))
    dataset.write_text("a.bmp\n")
    expect(InputError, "line 1: a.bmp: unsupported file type; expected .npy, .png, .jpg, .jpeg",
           lambda: read_dataset(dataset, ["x"]))


@pytest.mark.parametrize("content,message", [
    (np.zeros((1, 3, 5, 4), np.float32), "b.npy: shape [1, 3, 5, 4] does not match input 'x' [1, 3, 4, 5]"),
    (np.zeros((1, 3, 4, 5), np.complex64), "b.npy: dtype complex64 is not a real number type"),
    (np.array(["a"] * 60).reshape(1, 3, 4, 5), "b.npy: dtype <U1 is not a real number type"),
    (b"not an npy file", "b.npy: not a readable .npy array"),
])
def test_bad_npy(tmp_path, graph, content, message):
    dataset = write_dataset(tmp_path, "\nb.npy\n", {"b.npy": content})
    expect(InputError, f"ds.txt: line 2: {message}", lambda: load_all(dataset, graph))


def test_pickled_npy_is_refused(tmp_path, graph):
    dataset = write_dataset(tmp_path, "b.npy\n", {})
    np.save(tmp_path / "b.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    expect(InputError, "line 1: b.npy: not a readable .npy array", lambda: load_all(dataset, graph))


@pytest.mark.parametrize("name,content,message", [
    ("a.png", b"\x89PNG\r\n\x1a\n garbage", "a.png: PNG"),
    ("a.png", encode_png(np.zeros((6, 5, 3), np.uint8)),
     "a.png: image is 6x5 (HxW), input 'x' expects 4x5 (shape [1, 3, 4, 5]); images are not resized"),
    ("a.png", encode_png(np.zeros((4, 5, 2), np.uint8)), None),  # gray + alpha -> gray -> 3 channels: fine
])
def test_bad_images(tmp_path, graph, name, content, message):
    dataset = write_dataset(tmp_path, f"{name}\n", {name: content})
    if message is None:
        assert load_all(dataset, graph)[0]["x"].shape == (1, 3, 4, 5)
    else:
        expect(InputError, f"ds.txt: line 1: {message}", lambda: load_all(dataset, graph))


def test_image_for_an_input_that_is_not_an_image(tmp_path, two_inputs, onnx_case):
    dataset = write_dataset(tmp_path, "a.png a.png\n", {"a.png": encode_png(IMAGE)})
    expect(InputError, "a.png: an image can only feed an input of shape [1, C, H, W]; input 'v' is [1, 6]",
           lambda: load_all(dataset, two_inputs))
    mono = import_onnx(onnx_case.model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 1, 4, 5]}, ["y"]))
    dataset = write_dataset(tmp_path, "a.png\n", {})
    expect(InputError, "a RGB image cannot feed input 'x' with 1 channel(s)", lambda: load_all(dataset, mono))


def test_jpeg_without_pillow_says_what_to_do(tmp_path, graph, monkeypatch):
    monkeypatch.setitem(sys.modules, "PIL", None)  # import fails as if Pillow were not installed
    dataset = write_dataset(tmp_path, "a.jpg\n", {"a.jpg": b"\xff\xd8\xff"})
    expect(InputError, "line 1: a.jpg: reading JPEG needs Pillow, which is not installed: pip install 'npuemu[images]'",
           lambda: load_all(dataset, graph))


class _FakeImage:
    """The part of a Pillow image read_jpeg uses."""

    def __init__(self, array: np.ndarray, mode: str):
        self.array, self.mode = array, mode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def convert(self, mode: str) -> "_FakeImage":
        return _FakeImage(self.array if mode == "RGB" else self.array[:, :, 0], mode)

    def __array__(self, dtype=None, copy=None):
        return self.array if dtype is None else self.array.astype(dtype)


def test_jpeg_goes_through_pillow(tmp_path, graph, monkeypatch):
    def open_image(path):
        if Path(path).name == "bad.jpg":
            raise OSError("cannot identify image file")
        return _FakeImage(IMAGE, "RGB")

    monkeypatch.setitem(sys.modules, "PIL", types.SimpleNamespace(Image=types.SimpleNamespace(open=open_image)))
    dataset = write_dataset(tmp_path, "a.jpeg\n", {"a.jpeg": b"jpeg bytes", "bad.jpg": b"x"})
    assert np.array_equal(load_all(dataset, graph)[0]["x"][0], IMAGE.transpose(2, 0, 1))
    dataset.write_text("bad.jpg\n")
    expect(InputError, "line 1: bad.jpg: not a readable JPEG: cannot identify image file", lambda: load_all(dataset, graph))
