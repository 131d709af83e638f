"""`npuemu run` input arrays (issue 21 item 2): --layout nchw|nhwc, uint8 arrays as pixels
preprocessed as the model records, int8 arrays only with --raw-input, each refusal naming the
option to use."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator.runtime import run_model_file
from npuemu.isa.container import ModelFile
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import compile_graph, small_cnn


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from npuemu.compiler.build import build_model

    model, shape = small_cnn()
    path = tmp_path_factory.mktemp("net") / "net.npu"
    build_model(compile_graph(model, shape)).write(path)
    return path, shape


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["run", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_nhwc_array_is_refused_by_name_and_taken_with_layout(model_file, tmp_path, capsys) -> None:
    path, shape = model_file
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.save(tmp_path / "nhwc.npy", x.transpose(0, 2, 3, 1))
    code, _, err = _run(capsys, path, "-i", tmp_path / "nhwc.npy")
    assert code == 2 and "NHWC order" in err and "--layout nhwc" in err
    code, _, err = _run(capsys, path, "-i", tmp_path / "nhwc.npy", "--layout", "nhwc", "-o", tmp_path / "o")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "o" / "f.npy"), run_model_file(path, {"x": x})["f"])


def test_int8_array_needs_raw_input(model_file, tmp_path, capsys) -> None:
    path, shape = model_file
    stored = np.random.default_rng(1).integers(-128, 128, shape).astype(np.int8)
    np.save(tmp_path / "q.npy", stored)
    code, _, err = _run(capsys, path, "-i", tmp_path / "q.npy")
    assert code == 2 and "int8 array: pass --raw-input" in err
    code, _, err = _run(capsys, path, "-i", tmp_path / "q.npy", "--raw-input", "-o", tmp_path / "o")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "o" / "f.npy"), run_model_file(path, {"x": stored})["f"])
    np.save(tmp_path / "f.npy", stored.astype(np.float32))
    code, _, err = _run(capsys, path, "-i", tmp_path / "f.npy", "--raw-input")
    assert code == 2 and "drop --raw-input" in err


def test_uint8_array_is_pixels_with_the_recorded_preprocess(tmp_path, capsys) -> None:
    from npuemu.compiler.quant.images import encode_png

    model, shape = small_cnn()
    (tmp_path / "net.onnx").write_bytes(model.SerializeToString())
    rng = np.random.default_rng(2)
    for i in range(2):
        (tmp_path / f"c{i}.png").write_bytes(encode_png(rng.integers(0, 256, (shape[2], shape[3], 3), np.uint8)))
    (tmp_path / "ds.txt").write_text("c0.png\nc1.png\n")
    out = tmp_path / "net.npu"
    assert main(["compile", str(tmp_path / "net.onnx"), "--quantize", "--dataset", str(tmp_path / "ds.txt"),
                 "--mean", "127.5", "--std", "64", "--no-progress", "-o", str(out)]) == 0
    assert ModelFile.read(out).trailer["compiler"]["options"]["preprocess"]["x"]["mean"] == [127.5]
    pixels = rng.integers(0, 256, (shape[2], shape[3], 3), dtype=np.uint8)
    np.save(tmp_path / "p.npy", pixels)  # HWC, as an image decoder gives it
    code, _, err = _run(capsys, out, "-i", tmp_path / "p.npy", "--layout", "nhwc", "-o", tmp_path / "o")
    assert code == 0, err
    x = ((pixels.transpose(2, 0, 1)[None].astype(np.float32) - 127.5) / 64).astype(np.float32)
    assert np.array_equal(np.load(tmp_path / "o" / "f.npy"), run_model_file(out, {"x": x})["f"])
    (tmp_path / "p.png").write_bytes(encode_png(pixels))  # the same pixels as an image: the same outputs
    code, _, err = _run(capsys, out, "-i", tmp_path / "p.png", "-o", tmp_path / "o2")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "o2" / "f.npy"), np.load(tmp_path / "o" / "f.npy"))


def test_other_integer_arrays_name_the_accepted_types(model_file, tmp_path, capsys) -> None:
    path, shape = model_file
    np.save(tmp_path / "i.npy", np.zeros(shape, np.int32))
    code, _, err = _run(capsys, path, "-i", tmp_path / "i.npy")
    assert code == 2 and "int32 array" in err and "uint8 pixel values" in err and "--raw-input" in err
