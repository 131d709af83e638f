"""npuemu's interleaved writes in the vendor's WDMA split (compiler/LOWERING.md 54, emulator/REGISTER_SEMANTICS.md
52-53): W "lines" (WDMA_SIZE_1.HEIGHT_WDMA W - 1, WIDTH_WDMA 0) of H x the cube's channels (WDMA_SIZE_0.CHANNEL_WDMA
H x C - 1), as the vendor's rk3588 bilinear Resize x2 on [1, 32, 12, 20] writes its four phase convs
(``tests/data/vendor_interleave/bilinear2_{int8,fp16}_rk3588.rknn.xz``: how they were made is said in
tests/emulator/test_vendor_interleave_wdma.py). npuemu's own build of the same ONNX writes those words exactly;
a ConvTranspose's phase convs write them too, row bands keep H x C within the 13-bit field, and the outputs are the
ONNX ConvTranspose's (onnxruntime)."""

from __future__ import annotations

import lzma
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.tools.cli import main
from npuemu.compiler.deconv_phases import MAX_WDMA_CHANNELS, interleave_rows
from npuemu.compiler.lower.interleave_bands import cap_rows
from npuemu.compiler.lower.tiling import CbufRequest, plan_cbuf
from tests.compiler.test_resize_npu import resize_model

DATA = Path(__file__).resolve().parents[1] / "data" / "vendor_interleave"
WRITE_WORDS = ("DPU WDMA_SIZE_0", "DPU WDMA_SIZE_1", "DPU DATA_CUBE_NOTCH_ADDR", "DPU SURFACE_ADD",
               "DPU DST_SURF_STRIDE", "DPU DATA_CUBE_WIDTH", "DPU DATA_CUBE_HEIGHT")


def _tasks(path: Path, out: Path) -> list[dict[str, int]]:
    """Every task's register values (and fields) of a model file, from ``npuemu disasm``; a task starts from the
    values of the task two before (the register groups, REGISTER_SEMANTICS.md 1.1: the vendor's later tasks write
    what changes)."""
    assert main(["disasm", str(path), "-o", str(out)]) == 0
    tasks: list[dict[str, int]] = []
    for line in out.read_text().splitlines():
        if line.startswith(".task"):
            tasks.append({**(tasks[-2] if len(tasks) > 1 else {}), "enable": int(line.split("enable ")[1].split()[0], 16)})
        elif tasks and re.match(r"\s+(DPU|DPU_RDMA|CNA|CORE)\s", line):
            block, register, _, value = line.split()[:4]
            tasks[-1][f"{block} {register}"] = int(value, 16)
            for field, number in re.findall(r"(\w+)=(-?\d+)", line.split(";", 1)[1] if ";" in line else ""):
                tasks[-1][f"{block} {register}.{field}"] = int(number)
    return tasks


def _interleaved(tasks: list[dict[str, int]]) -> list[dict[str, int]]:
    return [t for t in tasks if t.get("DPU DATA_CUBE_NOTCH_ADDR", 0) and t["enable"] & 0xD == 0xD]   # conv tasks


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_own_bilinear_phase_convs_write_the_vendors_words(precision, tmp_path):
    """The four phase convs of Resize(linear, half_pixel) x2 on 12 x 20: WDMA sizes, notch, line and surface
    steps, cube equal the vendor's rk3588 file's word for word (HEIGHT_WDMA 19, CHANNEL_WDMA 767 int8 / 383 fp16)."""
    vendor_file = tmp_path / "vendor.rknn"
    vendor_file.write_bytes(lzma.decompress((DATA / f"bilinear2_{precision}_rk3588.rknn.xz").read_bytes()))
    vendor = _interleaved(_tasks(vendor_file, tmp_path / "vendor.txt"))[:4]   # chain 0 (the blob holds 3 chains)
    shape = (1, 32, 12, 20)
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(resize_model(shape, (2, 2), "half_pixel", interp="linear").SerializeToString())
    quant = []
    if precision == "int8":
        np.save(tmp_path / "x.npy", np.random.RandomState(10).randn(*shape).astype(np.float32))
        (tmp_path / "ds.txt").write_text(str(tmp_path / "x.npy") + "\n")
        quant = ["--dataset", str(tmp_path / "ds.txt")]
    else:
        quant = ["--fp16"]
    assert main(["compile", str(onnx_file), "--target", "rk3588", *quant, "-o", str(tmp_path / "m.npu")]) == 0
    own = _interleaved(_tasks(tmp_path / "m.npu", tmp_path / "own.txt"))
    assert len(own) == len(vendor) == 4
    for mine, theirs in zip(own, vendor):
        assert {word: mine[word] for word in WRITE_WORDS} == {word: theirs[word] for word in WRITE_WORDS}
        assert mine["DPU WDMA_SIZE_1.HEIGHT_WDMA"] == 19 and mine["DPU WDMA_SIZE_1.WIDTH_WDMA"] == 0
        assert mine["DPU WDMA_SIZE_0.CHANNEL_WDMA"] == 12 * (64 if precision == "int8" else 32) - 1


def _conv_transpose(shape, c_out: int, seed: int = 0):
    rng = np.random.RandomState(seed)
    weights = (rng.randn(shape[1], c_out, 2, 2) * 0.3).astype(np.float32)
    bias = (rng.randn(c_out) * 0.1).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([node], "deconv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_a_tall_phase_is_cut_into_row_bands_in_the_vendors_split(precision, tmp_path):
    """A 1-channel ConvTranspose k2 s2 on 300 x 12: each phase is 300 rows of 12 pixels, which fit the CBUF in one
    task, but 300 rows x 32 (int8) / 16 (fp16) allocated channels pass CHANNEL_WDMA's 8192 in int8: there the
    phases run in two 150-row bands. Every interleaved task writes W lines of H x C within the field; the output
    is onnxruntime's ConvTranspose (cosine)."""
    from npuemu.compiler.driver import CompileOptions, compile_model
    from npuemu.emulator.runtime import Runtime

    shape = (1, 8, 300, 12)
    model = _conv_transpose(shape, 1)
    x = np.random.RandomState(4).randn(*shape).astype(np.float32)
    options = CompileOptions(precision="fp16") if precision == "fp16" else CompileOptions(dataset=[{"x": x}])
    built = compile_model(model, "rk3588", options)
    assert sum(step.kind == "cpu" for step in built.schedule()) == 0
    built.write(tmp_path / "m.npu")
    phases = _interleaved(_tasks(tmp_path / "m.npu", tmp_path / "m.txt"))
    allocated = 32 if precision == "int8" else 16
    assert len(phases) == 4 * (2 if precision == "int8" else 1)
    for task in phases:
        rows, width = task["DPU DATA_CUBE_HEIGHT.HEIGHT"] + 1, task["DPU DATA_CUBE_WIDTH.WIDTH"] + 1
        assert (rows, width) == ((150 if precision == "int8" else 300), 12)
        assert task["DPU WDMA_SIZE_1.HEIGHT_WDMA"] == width - 1 and task["DPU WDMA_SIZE_1.WIDTH_WDMA"] == 0
        assert task["DPU WDMA_SIZE_0.CHANNEL_WDMA"] == rows * allocated - 1 < MAX_WDMA_CHANNELS
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = np.asarray(runtime.output("y"), np.float64)
    assert got.shape == want.shape
    assert float(np.dot(got.ravel(), want.ravel()) / np.linalg.norm(got) / np.linalg.norm(want)) > 0.999


@settings(max_examples=60, deadline=None)
@given(height=st.integers(1, 700), kernel=st.integers(1, 3), pad=st.integers(0, 2), channels=st.sampled_from([1, 8, 64]),
       allocated=st.sampled_from([16, 32, 64, 128, 256]), weight_bytes=st.sampled_from([64, 200_000]))
def test_capped_bands_cover_the_output_each_reading_what_it_needs(height, kernel, pad, channels, allocated,
                                                                 weight_bytes):
    """``cap_rows`` on any stride-1 plan (a phase conv's): the bands tile the output rows in order, none taller than
    8192 // allocated, each reading input rows [out_start - pad_top, out_end - 1 - pad_top + kernel) clipped to
    the input, the first keeping the pad top (tiling.split_rows' rule, restated here)."""
    pad = min(pad, kernel - 1)
    out_height = height + 2 * pad - kernel + 1
    if out_height < 1:
        return
    request = CbufRequest(layer="t", height=height, width=40, channels=channels, element_bytes=1, kernel_h=kernel,
                          stride_y=1, pad_top=pad, out_height=out_height, weight_bytes=weight_bytes)
    tiles = cap_rows(plan_cbuf(request), request, allocated).row_tiles
    limit = interleave_rows(allocated)
    assert limit == MAX_WDMA_CHANNELS // allocated
    assert [t.out_start for t in tiles] == [0] + list(np.cumsum([t.out_rows for t in tiles[:-1]]))
    assert sum(t.out_rows for t in tiles) == out_height and all(1 <= t.out_rows <= limit for t in tiles)
    for t in tiles:
        first, last = t.out_start - pad, t.out_start + t.out_rows - 1 - pad + kernel - 1
        assert t.in_start == max(0, first) and t.in_start + t.in_rows == min(height, last + 1)
        assert t.pad_top == (pad if t.out_start == 0 else 0)


def test_plans_within_the_limit_are_kept_as_they_are():
    request = CbufRequest(layer="t", height=40, width=40, channels=16, element_bytes=1, kernel_h=1, stride_y=1,
                          pad_top=0, out_height=40, weight_bytes=64)
    plan = plan_cbuf(request)
    assert cap_rows(plan, request, 32) is plan
    assert [(t.out_start, t.out_rows, t.in_start, t.in_rows) for t in cap_rows(plan, request, 256).row_tiles] == \
        [(0, 20, 0, 20), (20, 20, 20, 20)]   # 8192 // 256 = 32 rows at most: two even bands


def test_a_wide_bilinear_map_runs_in_one_channel_group():
    """64 float16 channels x 130 columns was a line past CHANNEL_WDMA in npuemu's split (two channel groups); in the
    vendor's split the phase convs write 130 lines of 2 x 64 channels: one group, four phase convs, bit for bit
    against tests/compiler/test_resize_bilinear_npu.py's reference of the bilinear form."""
    from npuemu.emulator.runtime import Runtime
    from tests.compiler.test_resize_bilinear_npu import bilinear_form_reference
    from tests.compiler.test_resize_npu import build

    shape = (1, 64, 2, 130)
    _, built = build(resize_model(shape, (2, 2), "half_pixel", interp="linear"), "fp16")
    tasks = {layer.name: sum(r.count for r in layer.tasks) for layer in built.layers()}
    assert sum(1 for name in tasks if "_phase" in name) == 4 and "resize_concat" not in tasks
    x = (np.random.default_rng(1).integers(-64, 64, shape) / 16).astype(np.float16)
    runtime = Runtime(built)
    runtime.set_input("x", x.astype(np.float32))
    runtime.run()
    got = np.asarray(runtime.output("y", dequantize=True))
    np.testing.assert_array_equal(got[0].astype(np.float16), bilinear_form_reference(x[0], 2, "half_pixel"))
