"""Resize nearest by whole factors on the NPU, int8 and float16 (compiler/lower/lower_resize.py,
LOWERING.md 19): DPU-only unpooling tasks, one per C2 surface, as the vendor's
resize_nearest_2x_int8 / _fp16 builds.

Checked: the partition (which coordinate / nearest modes reduce to the unpooling gather; the
others, bilinear and fractional scales stay host steps naming the limit); int8 and float16
builds bit for bit against :func:`reference_nearest` (the ONNX index map written here from the
operator's definition) over shapes, factors and modes (hypothesis); the registers of the
vendor fixture's model equal the vendor's task for task (addresses aside); end to end against
onnxruntime."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build_graph, prepare
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.shared_data import RKNN_FIXTURES_OPS

F32 = np.float32


def _source_index(mode: str, rounding: str, out_size: int, in_size: int, scale: float) -> np.ndarray:
    """ONNX Resize (opset 13+): x_original per coordinate_transformation_mode, then nearest_mode,
    clamped to the input; in float32 as onnxruntime evaluates it."""
    o = np.arange(out_size, dtype=F32)
    s = F32(scale)
    if mode == "asymmetric":
        x = o / s
    elif mode in ("half_pixel", "pytorch_half_pixel"):
        x = (o + F32(0.5)) / s - F32(0.5)
    elif mode == "tf_half_pixel_for_nn":
        x = (o + F32(0.5)) / s
    elif mode == "align_corners":
        x = o * F32(in_size - 1) / F32(out_size - 1)
    else:
        raise ValueError(mode)
    if rounding == "floor":
        index = np.floor(x)
    elif rounding == "ceil":
        index = np.ceil(x)
    elif rounding == "round_prefer_floor":
        index = np.where(x - np.floor(x) == F32(0.5), np.floor(x), np.floor(x + F32(0.5)))
    else:  # round_prefer_ceil
        index = np.floor(x + F32(0.5))
    return np.clip(index, 0, in_size - 1).astype(np.int64)


def reference_nearest(x: np.ndarray, factors: tuple[int, int], mode: str = "asymmetric",
                      rounding: str = "floor") -> np.ndarray:
    """Nearest Resize of an [N, C, H, W] array by whole factors (fy, fx): a gather along H, W."""
    fy, fx = factors
    _, _, height, width = x.shape
    rows = _source_index(mode, rounding, height * fy, height, fy)
    cols = _source_index(mode, rounding, width * fx, width, fx)
    return x[:, :, rows][:, :, :, cols]


def resize_model(shape, factors, mode="asymmetric", rounding="floor", interp="nearest", conv=False, seed=0):
    """x -> [Conv 1x1 ->] Resize(scales 1, 1, fy, fx) -> y."""
    channels = shape[1]
    nodes, inits, source = [], [], "x"
    if conv:
        weight = np.random.default_rng(seed).normal(0, 1 / np.sqrt(channels), (channels, channels, 1, 1))
        inits.append(numpy_helper.from_array(weight.astype(np.float32), "w"))
        nodes.append(helper.make_node("Conv", ["x", "w"], ["c"], name="conv"))
        source = "c"
    inits += [numpy_helper.from_array(np.array([], np.float32), "roi"),
              numpy_helper.from_array(np.array([1, 1, *factors], np.float32), "scales")]
    nodes.append(helper.make_node("Resize", [source, "roi", "scales"], ["y"], name="resize", mode=interp,
                                  coordinate_transformation_mode=mode, nearest_mode=rounding))
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def build(model, precision: str, samples=None):
    options = CompileOptions(precision=precision, dataset=samples) if samples is not None else \
        CompileOptions(precision=precision)
    front = prepare(model, "rk3588", options)
    return front, build_graph(front.graph)


def ort_run(model, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


#: (coordinate mode, nearest mode, factors) that reduce to output o <- input o // f
ON_NPU = [("asymmetric", "floor", (2, 2)), ("asymmetric", "floor", (3, 1)), ("half_pixel", "round_prefer_floor", (2, 2)),
          ("half_pixel", "round_prefer_ceil", (3, 2)), ("pytorch_half_pixel", "round_prefer_floor", (4, 4)),
          ("asymmetric", "round_prefer_floor", (2, 2)), ("tf_half_pixel_for_nn", "floor", (2, 3)),
          ("align_corners", "round_prefer_floor", (2, 2))]  # x = o (n-1)/(2n-1) rounds to o // 2
#: ... and forms that do not, with the words their host-step reason must hold
ON_HOST = [("asymmetric", "round_prefer_ceil", (2, 2), "does not copy"), ("half_pixel", "floor", (2, 2), "does not copy"),
           ("align_corners", "floor", (2, 2), "does not copy"),
           ("asymmetric", "floor", (2.5, 2.5), "is not 1..8 x input")]


# --- partition ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, rounding, factors", ON_NPU)
def test_gather_forms_run_on_the_npu(mode, rounding, factors) -> None:
    front, built = build(resize_model((1, 16, 4, 6), factors, mode, rounding), "fp16")
    assert [(node.op_type, node.target) for node in front.graph.nodes] == [("Resize", "NPU")]
    assert [step.kind for step in built.schedule()] == ["npu"]


@pytest.mark.parametrize("mode, rounding, factors, words", ON_HOST)
def test_other_forms_stay_on_the_host_naming_the_limit(mode, rounding, factors, words) -> None:
    front = prepare(resize_model((1, 16, 4, 6), factors, mode, rounding), "rk3588", CompileOptions(precision="fp16"))
    (decision,) = front.partition.decisions
    assert decision.target == "CPU" and "upsampling of H and W by whole factors" in decision.reason and words in decision.reason


def test_align_corners_bilinear_stays_on_the_host() -> None:
    """Bilinear by whole factors runs on the NPU (tests/compiler/test_resize_bilinear_npu.py);
    align_corners has no phase form."""
    front = prepare(resize_model((1, 16, 4, 6), (2, 2), "align_corners", interp="linear"), "rk3588",
                    CompileOptions(precision="fp16"))
    (decision,) = front.partition.decisions
    assert decision.target == "CPU" and "linear: coordinate_transformation_mode align_corners" in decision.reason


def test_one_task_per_surface() -> None:
    """40 float16 channels: 5 surfaces of 8 (the vendor: 8 tasks for 64), also behind an identity
    conv whose output is allocated with padding surfaces (those are not copied)."""
    _, built = build(resize_model((1, 40, 3, 5), (2, 2)), "fp16")
    tasks = {layer.name: sum(r.count for r in layer.tasks) for layer in built.layers()}
    assert tasks["resize"] == 5


# --- bit exactness ----------------------------------------------------------------------------

@settings(max_examples=6, deadline=None)
@given(form=st.sampled_from(ON_NPU), channels=st.sampled_from([3, 16, 24, 40]), height=st.integers(1, 6),
       width=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_int8_resize_is_bit_exact(form, channels, height, width, seed) -> None:
    mode, rounding, factors = form
    shape = (1, channels, height, width)
    rng = np.random.default_rng(seed)
    samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    front, built = build(resize_model(shape, factors, mode, rounding, conv=True, seed=seed), "int8", samples)
    (resize,) = [node for node in front.graph.nodes if node.op_type == "Resize"]
    assert resize.target == "NPU"
    runtime = Runtime(built)
    runtime.set_input("x", rng.normal(0, 1, shape).astype(np.float32))
    runtime.run()
    source = np.asarray(runtime.output(resize.inputs[0], dequantize=False))
    got = np.asarray(runtime.output("y", dequantize=False))
    np.testing.assert_array_equal(got, reference_nearest(source, factors, mode, rounding))


@settings(max_examples=6, deadline=None)
@given(form=st.sampled_from(ON_NPU), channels=st.sampled_from([1, 8, 12, 64]), height=st.integers(1, 6),
       width=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_fp16_resize_is_bit_exact(form, channels, height, width, seed) -> None:
    mode, rounding, factors = form
    shape = (1, channels, height, width)
    x = np.random.default_rng(seed).normal(0, 3, shape).astype(np.float16)
    _, built = build(resize_model(shape, factors, mode, rounding), "fp16")
    runtime = Runtime(built)
    runtime.set_input("x", x.astype(np.float32))
    runtime.run()
    got = np.asarray(runtime.output("y")).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), reference_nearest(x, factors, mode, rounding).view(np.uint16))


def test_reference_agrees_with_onnxruntime() -> None:
    x = np.random.default_rng(5).normal(0, 1, (1, 2, 5, 7)).astype(np.float32)
    for mode, rounding, factors in ON_NPU:
        model = resize_model(x.shape, factors, mode, rounding)
        np.testing.assert_array_equal(reference_nearest(x, factors, mode, rounding), ort_run(model, x))


# --- the vendor fixture -------------------------------------------------------------------------

def _tasks(listing: str) -> list[list[tuple[str, str, str]]]:
    tasks: list[list[tuple[str, str, str]]] = []
    for line in listing.splitlines():
        if line.startswith(".task"):
            tasks.append([])
        elif tasks and re.match(r"\s+(DPU|DPU_RDMA|CNA|CORE)\s", line):
            block, register, _, value = line.split()[:4]
            tasks[-1].append((block, register, value))
    return tasks


@pytest.mark.parametrize("case, precision", [("resize_nearest_2x_int8", "int8"), ("resize_nearest_2x_fp16", "fp16")])
def test_registers_equal_the_vendors(case, precision, tmp_path) -> None:
    """Task 0 of ours and the vendor's: the same 67 writes in the same order, equal except the
    addresses (tensor-relative in the vendor's listing); as many tasks as the vendor's chain 0."""
    from npuemu.tools.cli import main

    folder = RKNN_FIXTURES_OPS / case
    samples = tmp_path / "ds.txt"
    np.save(tmp_path / "c.npy", np.random.default_rng(0).normal(0, 1, (1, 64, 40, 40)).astype(np.float32))
    samples.write_text("c.npy\n")
    quant = ["--dataset", str(samples)] if precision == "int8" else ["--fp16"]
    assert main(["compile", str(folder / "model.onnx"), *quant, "-o", str(tmp_path / "m.npu")]) == 0
    assert main(["disasm", str(tmp_path / "m.npu"), "-o", str(tmp_path / "m.txt")]) == 0
    ours = _tasks((tmp_path / "m.txt").read_text())
    vendor = _tasks((folder / "regcmd.txt").read_text())
    chain0 = len([1 for line in (folder / "regcmd_tasks.txt").read_text().splitlines()
                  if re.match(r"\s+\d+\s+0\s", line)])
    assert len(ours) == chain0
    assert [(b, r) for b, r, _ in ours[0]] == [(b, r) for b, r, _ in vendor[0]]
    differ = [(b, r) for (b, r, v), (_, _, w) in zip(ours[0], vendor[0]) if v != w]
    assert set(differ) <= {("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR")}, differ


@pytest.mark.parametrize("precision, bound", [("int8", 0.9995), ("fp16", 0.999999)])
def test_vendor_fixture_model_against_onnxruntime(precision, bound) -> None:
    model = onnx.load(RKNN_FIXTURES_OPS / "resize_nearest_2x_int8" / "model.onnx")
    rng = np.random.default_rng(7)
    samples = [{"x": rng.normal(0, 1, (1, 64, 40, 40)).astype(np.float32)} for _ in range(2)]
    _, built = build(model, precision, samples if precision == "int8" else None)
    x = rng.normal(0, 1, (1, 64, 40, 40)).astype(np.float32)
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    assert cosine(np.asarray(runtime.output("y")), ort_run(model, x)) >= bound
