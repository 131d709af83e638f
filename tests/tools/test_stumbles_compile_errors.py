"""Compile errors with a known way out say it (issue 21 item 2): a fused part the build cannot
lower names `-O 0`, which runs no fusion pass (compiler/SUPPORT.md), so the part becomes a layer
of its own; that build then goes through."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from npuemu.compiler import build_adapt
from npuemu.compiler.lower import Activation
from npuemu.isa.errors import CompileError, UnsupportedOpError

NODE = SimpleNamespace(layer_name="conv_1", display_op="ConvRelu")


def test_second_fused_activation_names_o0() -> None:
    part = SimpleNamespace(op_type="Sigmoid", inputs=[], attrs={})
    with pytest.raises(CompileError, match=r"layer conv_1 \(ConvRelu\): a second fused activation \(Sigmoid\) is "
                                           r"not lowered; compile with -O 0 to build it unfused"):
        build_adapt._fused_part(None, NODE, part, Activation("relu"), None)


def test_second_fused_residual_add_names_o0() -> None:
    part = SimpleNamespace(op_type="Add", inputs=["a", "b"], attrs={})
    with pytest.raises(CompileError, match=r"only one fused residual Add with one operand is lowered; compile with "
                                           r"-O 0"):
        build_adapt._fused_part(None, NODE, part, Activation("none"), None)


def test_unknown_fused_activation_names_o0() -> None:
    part = SimpleNamespace(op_type="Mish", inputs=[], attrs={})
    with pytest.raises(UnsupportedOpError, match=r"fused Mish is not lowered yet; compile with -O 0"):
        build_adapt._activation(None, NODE, part)


def test_o0_builds_what_fusion_would_fuse(tmp_path) -> None:
    """The way out works: at -O 0 a conv and its activation are separate layers and the model
    file builds and runs (the small CNN's ConvRelu layers become Conv + Relu)."""
    import numpy as np

    from npuemu.emulator.runtime import run_model_file
    from npuemu.isa.container import ModelFile
    from npuemu.tools.cli import main
    from tests.compiler.test_build_e2e import small_cnn

    model, shape = small_cnn()
    (tmp_path / "net.onnx").write_bytes(model.SerializeToString())
    assert main(["compile", str(tmp_path / "net.onnx"), "--fp16", "-O", "0", "-o", str(tmp_path / "net.npu")]) == 0
    layers = ModelFile.read(tmp_path / "net.npu").trailer["graph"]["layers"]
    assert not any(layer.get("fused") for layer in layers if len(layer.get("fused") or ()) > 1)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert all(np.isfinite(v).all() for v in run_model_file(tmp_path / "net.npu", {"x": x}).values())
