"""npuemu's own rk3576 ConvTranspose (its interleaved phase convs, compiler/deconv_phases.py) in the vendor's layout
(compiler/LOWERING.md 54, emulator/REGISTER_SEMANTICS.md 53.2; isa/rknn/rk3576_deconv.py): the build keeps the
vendor layout, every phase conv task carries the interleaved write's vendor words (checked here against the
RK3588-position build's task, by the rule restated below), and the outputs equal the RK3588-position build's bit
for bit and onnxruntime's ConvTranspose (cosine)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_rk3576_vendor_emit import both_layouts
from tests.compiler.test_vendor_wdma_split import _tasks


def deconv_model(shape, c_out: int, kernel: int, pads: int = 0, activation: str | None = None, seed: int = 1,
                 depth_to_space: bool = False):
    """y = ConvTranspose(x) (stride 2, + bias) [-> Relu / Sigmoid], or y = DepthToSpace(x, 2, CRD); opset 13."""
    rng = np.random.RandomState(seed)
    inits, nodes = [], []
    if depth_to_space:
        nodes.append(helper.make_node("DepthToSpace", ["x"], ["y"], blocksize=2, mode="CRD"))
    else:
        inits += [numpy_helper.from_array((rng.randn(shape[1], c_out, kernel, kernel) * 0.2).astype(np.float32), "w"),
                  numpy_helper.from_array((rng.randn(c_out) * 0.3).astype(np.float32), "b")]
        nodes.append(helper.make_node("ConvTranspose", ["x", "w", "b"], ["t" if activation else "y"],
                                      kernel_shape=[kernel, kernel], strides=[2, 2], pads=[pads] * 4))
        if activation:
            nodes.append(helper.make_node(activation, ["t"], ["y"]))
    graph = helper.make_graph(nodes, "deconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run(built, x: np.ndarray, dequantize: bool) -> np.ndarray:
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return np.asarray(runtime.output("y", dequantize=dequantize), np.float64 if dequantize else None)


def _phase_tasks(built, path) -> list[dict[str, int]]:
    """The conv tasks of a model file that write through a DPU notch, from ``npuemu disasm``."""
    built.write(path)
    return [t for t in _tasks(path, path.with_suffix(".txt")) if t["enable"] == 0x1D
            and (t.get("DPU DATA_CUBE_NOTCH", 0) or t.get("DPU DATA_CUBE_NOTCH_ADDR", 0))]


def check_vendor_phase_words(vendor: dict[str, int], own: dict[str, int]) -> None:
    """The interleaved write's vendor words of one phase conv task against its RK3588-position twin (the rule of
    REGISTER_SEMANTICS.md 53.2, restated): 0x401C NOTCH_ADDR_0; WDMA_SIZE HEIGHT_WDMA W - 1, WIDTH 0; BS_CHANNEL
    [31:16] H x real channels - 1, [15:0] 0x700; 0x40B8 SURFACE_ADD - (W (notch + 1) - notch)."""
    width, height = own["DPU DATA_CUBE_WIDTH.WIDTH"] + 1, own["DPU DATA_CUBE_HEIGHT.HEIGHT"] + 1
    notch = own["DPU DATA_CUBE_NOTCH_ADDR.NOTCH_ADDR_0"]
    real = own["DPU DATA_CUBE_CHANNEL.ORIG_CHANNEL"] + 1
    assert own["DPU DATA_CUBE_NOTCH_ADDR.NOTCH_ADDR_1"] == notch >= 1
    assert (own["DPU WDMA_SIZE_1.HEIGHT_WDMA"], own["DPU WDMA_SIZE_1.WIDTH_WDMA"]) == (width - 1, 0)
    assert own["DPU WDMA_SIZE_0.CHANNEL_WDMA"] == height * (own["DPU DATA_CUBE_CHANNEL.CHANNEL"] + 1) - 1
    assert vendor["DPU DATA_CUBE_NOTCH"] == notch
    assert vendor["DPU WDMA_SIZE"] == (width - 1) << 16
    assert vendor["DPU BS_CHANNEL"] == (height * real - 1) << 16 | 0x700
    assert vendor["DPU SURFACE_JUMP"] == own["DPU SURFACE_ADD.SURF_ADD"] - (width * (notch + 1) - notch)


CASES = {   # name: (shape, model arguments)
    "k2s2_relu": ((1, 16, 12, 20), dict(c_out=24, kernel=2, activation="Relu")),
    "k2s2_one_channel_sigmoid": ((1, 16, 10, 36), dict(c_out=1, kernel=2, activation="Sigmoid")),   # det's head
    "k4s2p1_cropped": ((1, 16, 8, 12), dict(c_out=8, kernel=4, pads=1)),
    "depth_to_space": ((1, 64, 6, 10), dict(c_out=0, kernel=0, depth_to_space=True)),
    "k2s2_40_channels": ((1, 8, 6, 10), dict(c_out=40, kernel=2)),   # two channel groups
}


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_own_conv_transpose_runs_in_the_vendor_layout(name, precision, tmp_path):
    shape, arguments = CASES[name]
    model = deconv_model(shape, **arguments)
    samples = [{"x": np.random.RandomState(seed).randn(*shape).astype(np.float32)} for seed in (10, 11, 12)]
    options = CompileOptions(precision="fp16") if precision == "fp16" else CompileOptions(dataset=samples)
    vendor, old = both_layouts(model, options)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer.get("notice")
    phases, twins = _phase_tasks(vendor, tmp_path / "v.npu"), _phase_tasks(old, tmp_path / "o.npu")
    assert len(phases) == len(twins) >= 4
    for task, twin in zip(phases, twins):
        check_vendor_phase_words(task, twin)
    x = np.random.RandomState(5).randn(*shape).astype(np.float32)
    np.testing.assert_array_equal(_run(vendor, x, False), _run(old, x, False))
    got = _run(vendor, x, True)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


def test_own_fp16_bilinear_phase_convs_take_the_vendor_form_too():
    """The bilinear Resize's depthwise phase convs (section 19) go the same way: the vendor's depthwise phase conv
    words (0x300, REGISTER_SEMANTICS.md 49.1 / 56.2, translated back by rk3576_bilinear) - fp16 holds the vendor
    layout and the RK3588-position build's outputs. (int8 ones fall back by name: the vendor's int8 phase conv is
    another form, rk3576_bilinear's constant CPEND.)"""
    from tests.compiler.test_resize_npu import resize_model

    shape = (1, 32, 12, 20)
    vendor, old = both_layouts(resize_model(shape, (2, 2), "half_pixel", interp="linear", conv=True),
                               CompileOptions(precision="fp16"))
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor"
    x = np.random.RandomState(5).randn(*shape).astype(np.float32)
    np.testing.assert_array_equal(_run(vendor, x, False), _run(old, x, False))
