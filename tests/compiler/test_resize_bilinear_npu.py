"""Resize linear (bilinear) by one whole factor on the NPU, int8 and float16
(compiler/passes/resize_bilinear.py, LOWERING.md 19.1): an edge-padded copy (1 x 1 DPU
unpooling copies) and s*s depthwise 3x3 phase convs written interleaved.

Checked: the partition (which coordinate modes and factors run on the NPU, which stay host steps
naming the limit); the NPU form's arithmetic written here from the ONNX definition
(:func:`bilinear_form_reference`: edge padding, per-phase 3-tap filters from the coordinate
formula, one rounding) against onnxruntime, and the int8 / float16 builds bit for bit against it
(hypothesis over modes, factors, shapes); accuracy against onnxruntime per variant; the vendor
fixture's model end to end and the task structure (five edge copies per surface, the phase
convs' interleaved write addresses as the vendor's). align_corners to s (n - 1) + 1 (LOWERING.md
33.3): its own reference from the ONNX formula (Fractions) against onnxruntime, the builds bit for
bit against it, the sizes that stay host steps, perf's four phase convs."""

from __future__ import annotations

import lzma
import re
from fractions import Fraction

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.compiler.driver import CompileOptions, prepare
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_build_e2e import cosine
from tests.compiler.test_resize_npu import build, ort_run, resize_model
from tests.shared_data import RKNN_FIXTURES_OPS

#: (coordinate mode, factor) that run on the NPU in both precisions
ON_NPU = [("half_pixel", 2), ("pytorch_half_pixel", 2), ("asymmetric", 2), ("half_pixel", 4), ("asymmetric", 4),
          ("half_pixel", 3), ("tf_half_pixel_for_nn", 2), ("half_pixel_symmetric", 2)]


def conv_then_resize(shape, s: int, mode: str, seed: int = 0):
    """x -> Conv 1x1 -> c -> Resize linear x s -> y, with c a graph output too (its bytes stay
    readable after the run, as the reference's input)."""
    model = resize_model(shape, (s, s), mode, interp="linear", conv=True, seed=seed)
    model.graph.output.append(onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, None))
    return model


# --- the reference: the NPU form from the ONNX definition ---------------------------------------

def _offset(mode: str, s: int, r: int) -> Fraction:
    """Source coordinate of output s*i + r minus i, from the ONNX coordinate formulas."""
    o = Fraction(r)
    if mode == "asymmetric":
        return o / s
    if mode == "tf_half_pixel_for_nn":
        return (o + Fraction(1, 2)) / s
    return (o + Fraction(1, 2)) / s - Fraction(1, 2)  # half_pixel, pytorch_half_pixel (out > 1), symmetric x s


def _filters(mode: str, s: int) -> np.ndarray:
    """[s][3] Fractions: phase r's weights on the edge-padded input's i, i + 1, i + 2."""
    out = np.zeros((s, 3), dtype=object)
    out[:] = Fraction(0)
    for r in range(s):
        c = _offset(mode, s, r)
        j = c.numerator // c.denominator  # floor
        out[r, 1 + j] += 1 - (c - j)
        out[r, 2 + j] += c - j
    return out


def bilinear_form_reference(x: np.ndarray, s: int, mode: str, zero_point: int | None = None) -> np.ndarray:
    """[C, H, W] -> [C, sH, sW]. ``zero_point`` given: x is int8, the result the exact sum of the
    integer weights w*D times (x - zp), divided by D with ties to even (the DPU's OUT_CVT), plus zp,
    saturated. None: x is float16, the weights as stored (float16 of their float32; exact where D is
    a power of two), the exact sum rounded once to float16."""
    c, h, w = x.shape
    filters = _filters(mode, s)
    d = int(np.lcm.reduce([f.denominator for f in filters.reshape(-1)])) ** 2
    xp = np.pad(x.astype(np.int64) - (zero_point or 0) if zero_point is not None else x.astype(np.float64),
                ((0, 0), (1, 1), (1, 1)), mode="edge")
    out = np.zeros((c, s * h, s * w), np.int64 if zero_point is not None else np.float64)  # x [C, H, W]
    for ry in range(s):
        for rx in range(s):
            acc = 0
            for u in range(3):
                for v in range(3):
                    weight = filters[ry, u] * filters[rx, v]
                    assert (weight * d).denominator == 1
                    stored = int(weight * d) if zero_point is not None else \
                        float(np.float16(np.float32(float(weight))))
                    if weight:
                        acc = acc + stored * xp[:, u:u + h, v:v + w]
            out[:, ry::s, rx::s] = acc
    if zero_point is None:
        return out.astype(np.float16)  # exact in float64 for the test inputs, then one rounding
    quotient, remainder = np.divmod(out, d)
    up = (2 * remainder > d) | ((2 * remainder == d) & (quotient % 2 == 1))
    return np.clip(quotient + up + zero_point, -128, 127).astype(np.int8)


@pytest.mark.parametrize("mode, s", ON_NPU)
def test_reference_form_equals_onnxruntime(mode, s) -> None:
    """The form (edge padding + per-phase filters) computes onnxruntime's Resize, in float."""
    x = np.random.default_rng(s).normal(0, 1, (1, 3, 5, 6)).astype(np.float16)
    ref = ort_run(resize_model(x.shape, (s, s), mode, interp="linear"), x.astype(np.float32))
    filters = _filters(mode, s)
    d = int(np.lcm.reduce([f.denominator for f in filters.reshape(-1)])) ** 2
    exact = np.zeros_like(ref, dtype=np.float64)
    xp = np.pad(x[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)), mode="edge")
    for ry in range(s):
        for rx in range(s):
            exact[0, :, ry::s, rx::s] = sum(float(filters[ry, u] * filters[rx, v]) * xp[:, u:u + 5, v:v + 6]
                                            for u in range(3) for v in range(3))
    assert d in (4 * s * s, s * s)
    np.testing.assert_allclose(exact, ref, atol=2e-6)


# --- partition --------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("mode, s", ON_NPU)
def test_forms_run_on_the_npu(mode, s, precision) -> None:
    shape = (1, 16, 4, 6)
    samples = [{"x": np.random.default_rng(0).normal(0, 1, shape).astype(np.float32)}]
    front, built = build(resize_model(shape, (s, s), mode, interp="linear"), precision,
                         samples if precision == "int8" else None)
    assert [n.target for n in front.graph.nodes if n.op_type == "Resize"] == ["NPU"]
    assert [step.kind for step in built.schedule()] == ["npu"]


HOST = [("align_corners", (2, 2), "fp16", "do not repeat"), ("half_pixel", (2, 3), "fp16", "one whole factor"),
        ("half_pixel", (1.5, 1.5), "fp16", "one whole factor"), ("half_pixel", (8, 8), "int8", "> 127"),
        ("half_pixel", (9, 9), "fp16", "not 2..8")]


@pytest.mark.parametrize("mode, factors, precision, words", HOST)
def test_other_forms_stay_on_the_host_naming_the_limit(mode, factors, precision, words) -> None:
    shape = (1, 16, 4, 6)
    options = CompileOptions(precision=precision, dataset=[{"x": np.ones(shape, np.float32)}]) \
        if precision == "int8" else CompileOptions(precision=precision)
    front = prepare(resize_model(shape, factors, mode, interp="linear"), "rk3588", options)
    (decision,) = [d for d in front.partition.decisions if d.op == "Resize"]
    assert decision.target == "CPU" and "linear:" in decision.reason and words in decision.reason, decision.reason


@pytest.mark.parametrize("shape, precision", [((1, 16, 2, 8193), "int8"), ((1, 8, 2, 8200), "fp16")])
def test_a_line_too_wide_for_one_pass_stays_on_the_host(shape, precision) -> None:
    """More columns than the WDMA's 8192 lines (the vendor's split: HEIGHT_WDMA is W - 1, LOWERING.md 54): the
    feature-map rule (DPU cube fields) already names that width; a line of many channels no longer limits."""
    options = CompileOptions(precision=precision, dataset=[{"x": np.ones(shape, np.float32)}]) \
        if precision == "int8" else CompileOptions(precision=precision)
    front = prepare(resize_model(shape, (2, 2), "half_pixel", interp="linear"), "rk3588", options)
    (decision,) = [d for d in front.partition.decisions if d.op == "Resize"]
    assert decision.target == "CPU" and "at most 8192 wide" in decision.reason, decision.reason


@pytest.mark.parametrize("shape, precision, groups", [((1, 144, 2, 6), "int8", [128, 16]),
                                                      ((1, 72, 3, 4), "fp16", [64, 8])])
def test_wide_maps_run_in_channel_groups(shape, precision, groups) -> None:
    """More than 8 surfaces (144 int8 channels of 16, 72 float16 of 8): the phase convs run per channel
    group, each reading a ChannelSlice of the padded map (a view: no task) and a channel Concat joining
    the groups; float16 bit for bit against the reference. (A wide line no longer groups: the vendor's
    WDMA split counts rows x channels, LOWERING.md 54, tests/compiler/test_vendor_wdma_split.py.)"""
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)}]
    front, built = build(resize_model(shape, (2, 2), "half_pixel", interp="linear"), precision,
                         samples if precision == "int8" else None)
    assert [step.kind for step in built.schedule()] == ["npu"]
    tasks = {layer.name: sum(r.count for r in layer.tasks) for layer in built.layers()}
    assert sum(1 for name in tasks if "_phase" in name) == 4 * len(groups)
    assert [tasks[f"resize_edge_g{g}"] for g in range(len(groups))] == [0] * len(groups) and "resize_concat" in tasks
    if precision == "fp16":
        x = (rng.integers(-64, 64, shape) / 16).astype(np.float16)
        (got,) = _run(built, x.astype(np.float32), ["y"], True)
        np.testing.assert_array_equal(got[0].astype(np.float16), bilinear_form_reference(x[0], 2, "half_pixel"))


# --- bit exactness ----------------------------------------------------------------------------

def _run(built, x: np.ndarray, names: list[str], dequantize: bool) -> list[np.ndarray]:
    runtime = Runtime(built)
    runtime.set_input("x", x)
    runtime.run()
    return [np.asarray(runtime.output(name, dequantize=dequantize)) for name in names]


@settings(max_examples=8, deadline=None)
@given(form=st.sampled_from(ON_NPU), channels=st.sampled_from([3, 16, 40, 128, 200]), height=st.integers(1, 5),
       width=st.integers(2, 7), seed=st.integers(0, 2**16))
def test_int8_is_bit_exact(form, channels, height, width, seed) -> None:
    """Behind a conv (so the input is a stored int8 map of any values), every output byte."""
    mode, s = form
    shape = (1, channels, height, width)
    rng = np.random.default_rng(seed)
    samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    front, built = build(conv_then_resize(shape, s, mode, seed), "int8", samples)
    assert [step.kind for step in built.schedule()] == ["npu"]
    source, got = _run(built, rng.normal(0, 1, shape).astype(np.float32), ["c", "y"], False)
    zero_point = int(front.graph.tensors["y"].quant.zero_point)
    np.testing.assert_array_equal(got[0], bilinear_form_reference(source[0], s, mode, zero_point))


@settings(max_examples=8, deadline=None)
@given(form=st.sampled_from(ON_NPU), channels=st.sampled_from([1, 8, 12, 64, 100]), height=st.integers(1, 5),
       width=st.integers(2, 7), seed=st.integers(0, 2**16))
def test_fp16_is_bit_exact(form, channels, height, width, seed) -> None:
    """Inputs on a 2^-4 grid within +-4: every product and sum is exact in the DPU's float32
    (below 2^2, above 2^-20), so the result is the exact sum rounded once to float16."""
    mode, s = form
    shape = (1, channels, height, width)
    x = (np.random.default_rng(seed).integers(-64, 64, shape) / 16).astype(np.float16)
    _, built = build(resize_model(shape, (s, s), mode, interp="linear"), "fp16")
    assert [step.kind for step in built.schedule()] == ["npu"]
    (got,) = _run(built, x.astype(np.float32), ["y"], True)
    want = bilinear_form_reference(x[0], s, mode)
    np.testing.assert_array_equal(got[0].astype(np.float16).view(np.uint16), want.view(np.uint16))


# --- accuracy against onnxruntime ---------------------------------------------------------------

@pytest.mark.parametrize("mode, s", ON_NPU)
def test_accuracy_against_onnxruntime(mode, s) -> None:
    """int8: within half an LSB of onnxruntime on the same (stored) input, +1e-4 LSB for the float
    rounding of the scale; float16: within half a float16 ulp of the value where the weights are
    exact in float16 (factors 2, 4); factor 3 adds the weights' own rounding (ninths, relative
    error <= 2^-11 each, weights summing to 1): at most 2^-11 x max |x| more."""
    shape = (1, 24, 5, 6)
    rng = np.random.default_rng(s)
    samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    front, built = build(conv_then_resize(shape, s, mode), "int8", samples)
    source, got = _run(built, rng.normal(0, 1, shape).astype(np.float32), ["c", "y"], True)
    alone = resize_model(shape, (s, s), mode, interp="linear")
    lsb = float(front.graph.tensors["y"].quant.scale)
    assert np.abs(got - ort_run(alone, source.astype(np.float32))).max() / lsb <= 0.5 + 1e-4
    x = rng.normal(0, 2, shape).astype(np.float16).astype(np.float32)
    _, built16 = build(alone, "fp16")
    (got16,) = _run(built16, x, ["y"], True)
    ref = ort_run(alone, x)
    ulp = np.spacing(np.abs(ref).astype(np.float16)).astype(np.float32)
    weight_rounding = 0.0 if s & (s - 1) == 0 else 2.0 ** -11 * np.abs(x).max()
    assert np.all(np.abs(got16 - ref) <= ulp / 2 + weight_rounding + 1e-7)


def test_upsample_linear_runs_on_the_npu() -> None:
    """Upsample-9 mode linear (imported as Resize asymmetric): on the NPU, within half an ulp."""
    shape = (1, 16, 4, 6)
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Upsample", ["x", "scales"], ["y"], mode="linear")], "upsample",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape))],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [scales])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 9)], ir_version=7)
    _, built = build(model, "fp16")
    assert [step.kind for step in built.schedule()] == ["npu"]
    x = np.random.default_rng(0).normal(0, 1, shape).astype(np.float16).astype(np.float32)
    (got,) = _run(built, x, ["y"], True)
    ref = ort_run(model, x)
    assert np.all(np.abs(got - ref) <= np.spacing(np.abs(ref).astype(np.float16)).astype(np.float32) / 2 + 1e-7)


# --- the vendor fixture -------------------------------------------------------------------------

def _fixture_array(name: str) -> np.ndarray:
    with lzma.open(RKNN_FIXTURES_OPS / "resize_bilinear_2x_int8" / name) as f:
        return np.load(f)


@pytest.mark.parametrize("precision, bound", [("int8", 0.99985), ("fp16", 0.9999999)])
def test_vendor_fixture_model_against_onnxruntime(precision, bound) -> None:
    """The fixture's input_0 (on the vendor's int8 grid), calibrated on itself. int8: cosine
    0.999896 against onnxruntime (the vendor simulator's: 0.999912, meta.json) - the input is
    requantized onto our own grid (scale 0.02658 from its min/max, the vendor's 0.02884), which
    is all of the gap: on its stored input the form is within half an LSB (test above)."""
    model = onnx.load(RKNN_FIXTURES_OPS / "resize_bilinear_2x_int8" / "model.onnx")
    x = _fixture_array("input_0.npy.xz").astype(np.float32)
    _, built = build(model, precision, [{"x": x}] if precision == "int8" else None)
    assert [step.kind for step in built.schedule()] == ["npu"]
    (got,) = _run(built, x, ["y"], True)
    assert cosine(got, ort_run(model, x)) >= bound
    assert cosine(got, _fixture_array("sim_output_0.npy.xz")) >= 0.9998


def _disasm_tasks(tmp_path, precision: str) -> list[dict[str, int]]:
    """Our build of the fixture's model, disassembled: per task {"BLOCK REGISTER": value}."""
    from npuemu.tools.cli import main

    x = _fixture_array("input_0.npy.xz").astype(np.float32)
    np.save(tmp_path / "c.npy", x)
    (tmp_path / "ds.txt").write_text("c.npy\n")
    quant = ["--dataset", str(tmp_path / "ds.txt")] if precision == "int8" else ["--fp16"]
    model = RKNN_FIXTURES_OPS / "resize_bilinear_2x_int8" / "model.onnx"
    assert main(["compile", str(model), *quant, "-o", str(tmp_path / "m.npu")]) == 0
    assert main(["disasm", str(tmp_path / "m.npu"), "-o", str(tmp_path / "m.txt")]) == 0
    tasks: list[dict[str, int]] = []
    for line in (tmp_path / "m.txt").read_text().splitlines():
        if line.startswith(".task"):
            tasks.append({"enable": int(line.split("enable ")[1].split()[0], 16)})
        elif tasks and re.match(r"\s+(DPU|DPU_RDMA|CNA|CORE)\s", line):
            block, register, _, value = line.split()[:4]
            tasks[-1][f"{block} {register}"] = int(value, 16)
            for field, number in re.findall(r"(\w+)=(-?\d+)", line.split(";", 1)[1] if ";" in line else ""):
                tasks[-1][f"{block} {register}.{field}"] = int(number)
    return tasks


@pytest.mark.parametrize("precision, surfaces", [("int8", 2), ("fp16", 4)])
def test_task_structure_follows_the_vendors(precision, surfaces, tmp_path) -> None:
    """32 channels at 40 x 40: five 1 x 1 unpooling copies per C2 surface (the vendor: five for all
    surfaces), the interior written with line notch 2 at pixel (1, 1) of the 42-wide map, the
    columns read and written with notch 41; then four depthwise phase convs whose DPU write
    registers are the vendor's (resize_bilinear_2x_int8 tasks 5-8: DST_SURF_STRIDE 6400, NOTCH 1,
    SURFACE_ADD 160, CHANNEL_WDMA 2559, DST_BASE_ADDR offsets 0 / 16 / 1280 / 1296 bytes)."""
    tasks = _disasm_tasks(tmp_path, precision)
    copies, phases = tasks[:5 * surfaces], tasks[5 * surfaces:]
    assert len(phases) == 4 and all(t["enable"] == 0x18 for t in copies) and all(t["enable"] == 0x1d for t in phases)
    for task in copies:
        assert task["DPU_RDMA SRC_DMA_CFG.UNPOOLING_EN"] == 1 and task["DPU_RDMA SRC_DMA_CFG.KERNEL_WIDTH"] == 0 \
            and task["DPU_RDMA SRC_DMA_CFG.KERNEL_STRIDE_HEIGHT"] == 0  # kernel = stride = field + 1 = 1
    interior, top, bottom, left, right = copies[:5]
    assert interior["DPU DST_BASE_ADDR"] - top["DPU DST_BASE_ADDR"] == 42 * 16
    assert interior["DPU DATA_CUBE_NOTCH_ADDR"] == 0x00020002
    for column in (left, right):
        assert column["DPU DATA_CUBE_WIDTH"] == 0 and column["DPU DATA_CUBE_NOTCH_ADDR"] == 0x00290029
        assert column["DPU_RDMA SRC_DMA_CFG.LINE_NOTCH_ADDR"] == 41
    base = phases[0]["DPU DST_BASE_ADDR"]
    assert [t["DPU DST_BASE_ADDR"] - base for t in phases] == [0, 16, 1280, 1296]
    for task in phases:
        assert task["CNA CONV_CON1.CONV_MODE"] == 3 and task["DPU DST_SURF_STRIDE.DST_SURF_STRIDE"] == 6400
        assert task["DPU DATA_CUBE_NOTCH_ADDR"] == 0x00010001 and task["DPU SURFACE_ADD.SURF_ADD"] == 160
        assert task["DPU WDMA_SIZE_0.CHANNEL_WDMA"] == 40 * (64 if precision == "int8" else 32) - 1


# --- align_corners to s (n - 1) + 1 (LOWERING.md 33.3) ------------------------------------------

def corner_model(shape, out_hw, conv: bool = False, seed: int = 0):
    """x -> [Conv 1x1 -> c ->] Resize linear align_corners to ``out_hw`` (by sizes) -> y (and c)."""
    channels = shape[1]
    nodes, inits, source = [], [], "x"
    if conv:
        weight = np.random.default_rng(seed).normal(0, 1 / np.sqrt(channels), (channels, channels, 1, 1))
        inits.append(onnx.numpy_helper.from_array(weight.astype(np.float32), "w"))
        nodes.append(onnx.helper.make_node("Conv", ["x", "w"], ["c"], name="conv"))
        source = "c"
    inits.append(onnx.numpy_helper.from_array(np.array([*shape[:2], *out_hw], np.int64), "sizes"))
    nodes.append(onnx.helper.make_node("Resize", [source, "", "", "sizes"], ["y"], name="resize", mode="linear",
                                       coordinate_transformation_mode="align_corners"))
    outputs = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in
               (("y", "c") if conv else ("y",))]
    graph = onnx.helper.make_graph(nodes, "corners", [onnx.helper.make_tensor_value_info(
        "x", onnx.TensorProto.FLOAT, list(shape))], outputs, inits)
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8)


def align_corners_reference(x: np.ndarray, out_hw: tuple[int, int], zero_point: int | None = None) -> np.ndarray:
    """[C, H, W] -> [C, S_h, S_w] from the ONNX formula: source o (n-1)/(S-1) as a Fraction, the
    two taps' exact weights. int8 (``zero_point``): the exact sum of (x - zp) x w, rounded once half
    to even, + zp, saturated; float16: the exact sum rounded once to float16 (weights as stored)."""
    def taps(n_in: int, n_out: int) -> list[tuple[int, Fraction]]:
        out = []
        for o in range(n_out):
            position = Fraction(o * (n_in - 1), n_out - 1)
            j = min(position.numerator // position.denominator, n_in - 1)
            out.append((j, position - j))
        return out

    c, h, w = x.shape
    values = x.astype(np.int64) - zero_point if zero_point is not None else x.astype(np.float64)
    rows, cols = taps(h, out_hw[0]), taps(w, out_hw[1])
    d = int(np.lcm.reduce([f.denominator for _, f in rows + cols])) ** 2
    out = np.zeros((c, *out_hw), np.int64 if zero_point is not None else np.float64)
    for oy, (jy, fy) in enumerate(rows):
        for ox, (jx, fx) in enumerate(cols):
            acc = 0
            for dy, wy in ((0, 1 - fy), (1, fy)):
                for dx, wx in ((0, 1 - fx), (1, fx)):
                    weight = wy * wx
                    if weight:
                        stored = int(weight * d) if zero_point is not None else float(np.float16(float(weight)))
                        acc = acc + stored * values[:, jy + dy, jx + dx]
            out[:, oy, ox] = acc
    if zero_point is None:
        return out.astype(np.float16)
    quotient, remainder = np.divmod(out, d)
    up = (2 * remainder > d) | ((2 * remainder == d) & (quotient % 2 == 1))
    return np.clip(quotient + up + zero_point, -128, 127).astype(np.int8)


CORNERS = [((1, 16, 20, 20), (39, 39)), ((1, 3, 5, 7), (9, 13)), ((1, 40, 4, 6), (13, 21)), ((1, 8, 3, 4), (17, 25))]


@pytest.mark.parametrize("shape, out_hw", CORNERS)
def test_align_corners_reference_equals_onnxruntime(shape, out_hw) -> None:
    x = np.random.default_rng(1).normal(0, 1, shape).astype(np.float16)
    ref = ort_run(corner_model(shape, out_hw), x.astype(np.float32))
    c, h, w = shape[1:]
    exact = np.zeros((c, *out_hw))
    for oy in range(out_hw[0]):
        for ox in range(out_hw[1]):
            sy, sx = oy * (h - 1) / (out_hw[0] - 1), ox * (w - 1) / (out_hw[1] - 1)
            jy, jx = min(int(sy), h - 2), min(int(sx), w - 2)
            fy, fx = sy - jy, sx - jx
            patch = x[0, :, jy:jy + 2, jx:jx + 2].astype(np.float64)
            exact[:, oy, ox] = ((1 - fy) * (1 - fx) * patch[:, 0, 0] + (1 - fy) * fx * patch[:, 0, 1]
                                + fy * (1 - fx) * patch[:, 1, 0] + fy * fx * patch[:, 1, 1])
    np.testing.assert_allclose(exact, ref[0], atol=2e-6)


@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("shape, out_hw", CORNERS)
def test_align_corners_is_bit_exact_on_the_npu(shape, out_hw, precision) -> None:
    """Behind a conv in int8 (any stored values), every output byte against the reference; fp16
    on a 2^-4 grid (exact products and sums in float32), rounded once; no edge copy: s*s convs."""
    rng = np.random.default_rng(shape[1])
    if precision == "int8":
        samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
        front, built = build(corner_model(shape, out_hw, conv=True), "int8", samples)
        source, got = _run(built, rng.normal(0, 1, shape).astype(np.float32), ["c", "y"], False)
        zero_point = int(front.graph.tensors["y"].quant.zero_point)
        want = align_corners_reference(source[0], out_hw, zero_point)
    else:
        x = (rng.integers(-64, 64, shape) / 16).astype(np.float16)
        front, built = build(corner_model(shape, out_hw), "fp16")
        (got,) = _run(built, x.astype(np.float32), ["y"], True)
        got, want = got.astype(np.float16).view(np.uint16), align_corners_reference(x[0], out_hw).view(np.uint16)
    assert [step.kind for step in built.schedule()] == ["npu"]
    s = (out_hw[0] - 1) // (shape[2] - 1)
    phases = [layer.name for layer in built.layers() if "_phase" in layer.name]
    assert len(phases) % (s * s) == 0 and len(phases) >= s * s  # s*s per channel group
    assert not any("edge" in layer.name for layer in built.layers())
    np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("precision, bound", [("int8", 0.9998), ("fp16", 0.9999999)])  # int8: the input's rounding
def test_align_corners_against_onnxruntime(precision, bound) -> None:
    shape, out_hw = (1, 16, 20, 20), (39, 39)
    rng = np.random.default_rng(3)
    x = rng.normal(0, 1, shape).astype(np.float32)
    samples = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    _, built = build(corner_model(shape, out_hw), precision, samples if precision == "int8" else None)
    (got,) = _run(built, x, ["y"], True)
    assert cosine(got, ort_run(corner_model(shape, out_hw), x)) >= bound


@pytest.mark.parametrize("out_hw, words", [((40, 40), "do not repeat"), ((39, 40), "do not repeat"),
                                           ((20 * 9 - 8, 20 * 9 - 8), "not 2..8")])
def test_other_align_corners_sizes_stay_on_the_host(out_hw, words) -> None:
    """20 -> 40 (o x 19/39): the vendor's table runs it on the CPU too."""
    front = prepare(corner_model((1, 16, 20, 20), out_hw), "rk3588", CompileOptions(precision="fp16"))
    (decision,) = [d for d in front.partition.decisions if d.op == "Resize"]
    assert decision.target == "CPU" and "align_corners" in decision.reason and words in decision.reason, decision.reason


def test_align_corners_perf_counts_the_phase_convs() -> None:
    """`npuemu perf`: four depthwise phase convs (as the vendor's four), each NPU cycles > 0."""
    from npuemu.emulator.timing.report import report_npu

    shape, out_hw = (1, 16, 20, 20), (39, 39)
    _, built = build(corner_model(shape, out_hw), "fp16")
    runtime = Runtime(built)
    runtime.set_input("x", np.ones(shape, np.float32))
    runtime.run()
    layers = [entry for entry in report_npu(built, runtime.runs, runtime.machine.platform).layers if entry.tasks]
    assert len(layers) == 4 and all(entry.target == "NPU" for entry in layers)
    assert all(task.npu_cycles > 0 for entry in layers for task in entry.tasks)
