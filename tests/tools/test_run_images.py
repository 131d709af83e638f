"""`npuemu run model.npu --input img.png`: images are decoded, shaped NCHW and preprocessed with
the mean/std the model was compiled with (recorded in the model file's compiler options)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from npuemu.compiler.quant.images import encode_png
from npuemu.emulator.runtime import run_model_file
from npuemu.isa.container import ModelFile
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import cosine, small_cnn


def test_run_takes_an_image_and_applies_the_compiled_preprocessing(tmp_path, capsys) -> None:
    model, shape = small_cnn()
    (tmp_path / "net.onnx").write_bytes(model.SerializeToString())
    rng = np.random.default_rng(0)
    lines = []
    for i in range(4):
        image = rng.integers(0, 256, (shape[2], shape[3], 3), dtype=np.uint8)
        (tmp_path / f"c{i}.png").write_bytes(encode_png(image))
        lines.append(f"c{i}.png")
    (tmp_path / "ds.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "net.npu"
    assert main(["compile", str(tmp_path / "net.onnx"), "--quantize", "--dataset", str(tmp_path / "ds.txt"),
                 "--mean", "127.5", "--std", "64", "--no-progress", "-o", str(out)]) == 0
    assert ModelFile.read(out).trailer["compiler"]["options"]["preprocess"]["x"] == \
        {"mean": [127.5], "std": [64.0], "bgr": False}
    image = rng.integers(0, 256, (shape[2], shape[3], 3), dtype=np.uint8)
    (tmp_path / "test.png").write_bytes(encode_png(image))
    capsys.readouterr()
    assert main(["run", str(out), "--input", str(tmp_path / "test.png"), "--output-dir", str(tmp_path / "o")]) == 0
    got = np.load(tmp_path / "o" / "f.npy")
    x = ((image.transpose(2, 0, 1)[None].astype(np.float32) - 127.5) / 64).astype(np.float32)
    assert np.array_equal(got, run_model_file(out, {"x": x})["f"])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert cosine(got, want) >= 0.99


def test_run_refuses_an_image_of_the_wrong_size(tmp_path, capsys) -> None:
    from npuemu.compiler.build import build_model
    from tests.compiler.test_build_e2e import compile_graph

    model, shape = small_cnn()
    build_model(compile_graph(model, shape)).write(tmp_path / "net.npu")
    (tmp_path / "big.png").write_bytes(encode_png(np.zeros((5, 7, 3), np.uint8)))
    assert main(["run", str(tmp_path / "net.npu"), "--input", str(tmp_path / "big.png")]) == 2
    assert "image is 5x7 (HxW), input 'x' expects 16x16" in capsys.readouterr().err
