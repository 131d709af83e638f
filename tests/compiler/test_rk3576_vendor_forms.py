"""The vendor rk3576 forms of a Relu6 / Clip(0, x), of PPU pooling and of the fp16 depthwise conv
(emulator/REGISTER_SEMANTICS.md 41, compiler/LOWERING.md 42; isa/rknn/rk3576_ppu.py, rk3576_pack.py,
rk3576_layout.py, rk3576_forms.py), and whole networks built in the vendor layout.

References: the vendor itself. ``tests/data/rk3576_vendor/forms_tasks.npz.xz`` holds one task of chain
0 of the same ONNX built by rknn-toolkit2 2.5.0 for rk3576 and for rk3588 (default config; int8 with 3
random N(0, 1) calibration samples, fp16 "_f16" unquantized), keys NAME.rk3576 / NAME.rk3588 /
NAME.enable, read from the .rknn files with npuemu's reader:
  r6, r6_f16   Conv 16 -> 32 1x1 + Clip(0, 6) on 12 x 20 (record 0)
  mp, mp_f16   Conv 16 -> 16 3x3 on 12 x 20, MaxPool 3x3 s2 p1 (record 1, the PPU task)
  mp2, ap2     the same conv, MaxPool 2x2 s2 / AveragePool 2x2 s2 (record 1)
  ap3p         Conv 16 -> 16 1x1 on 12 x 20, AveragePool 3x3 s2 p1 count_include_pad (record 1)
  dw_f16       depthwise 32 3x3 s2 p1 on 12 x 20 (record 0)
  dw80_f16     depthwise 80 3x3 p1 on 10 x 12 + Clip(0, 6) (record 0)
  gap_f16      Conv 16 -> 32 3x3 on 7 x 7, GlobalAveragePool: a 7x7 depthwise conv (record 1)
  addin_f16    Add of two graph inputs x, z [1, 16, 12, 20]: a DPU-only task (record 0)
  mulin_f16    Mul of the same two inputs (record 0)
Own builds in the vendor layout must run bit-identically to the same build at RK3588 positions.
"""

from __future__ import annotations

import io
import lzma

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from benchmarks import models
from npuemu.compiler.driver import CompileOptions
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_pack import check_round_trip, dpu_vendor_writes, vendor_writes
from npuemu.isa.rknn.rk3576_ppu import check_ppu_round_trip, ppu_vendor_writes, translate_ppu
from npuemu.isa.rknn.rk3576_program import translate_task
from npuemu.isa.words import TARGET_OP_ENABLE, encode_write
from tests.compiler.test_rk3576_vendor_emit import (
    DATA, RK3588, SHIFT, VENDOR, _build, _inputs, _run, _values, both_layouts, conv_model,
)

with lzma.open(DATA / "forms_tasks.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    TASKS = {name: _archive[name] for name in _archive.files}
POOLS = ("mp", "mp2", "ap2", "ap3p", "mp_f16")
CONVS = ("r6_f16", "dw_f16", "dw80_f16", "gap_f16")   # word for word; int8 r6 below (its bound)


def _words(writes, regmap):
    return [encode_write(regmap, block, name, value) for block, name, value in writes]


def _shift(case):
    return 0 if case.endswith("_f16") else SHIFT   # fp16 builds' shift word is 0x0000 [V ORC]


def _translated(case):
    task = read_task(TASKS[f"{case}.rk3576"], VENDOR, case, int(TASKS[f"{case}.enable"]))
    word = _shift(case).to_bytes(2, "little")
    return {(b, n): v for b, n, v in translate_task(task, RK3588, lambda address, size: word[:size])}


# --- the vendor's pairs -----------------------------------------------------------------------


@pytest.mark.parametrize("case", CONVS)
def test_conv_forms_repack_to_the_vendors_words_and_translate_to_the_twin(case):
    """fp16 Relu6 (the bound as fp32 bits), fp16 depthwise (CONV_MODE 1, SIZE_E 3, output padded to
    32 channels at RK3588 positions), GlobalAveragePool as a 7x7 depthwise conv."""
    values = _values(TASKS[f"{case}.rk3588"], RK3588)
    writes = vendor_writes(values, RK3588, shift_address=0, where=case)
    assert _words(writes, VENDOR) == [int(w) for w in TASKS[f"{case}.rk3576"]]
    check_round_trip(values, RK3588, VENDOR, writes, _shift(case), case)
    ours = _translated(case)
    assert {key for key in set(ours) & set(values) if ours[key] != values[key]} == {("CNA", "CONV_CON2")}


def test_int8_relu6_repacks_to_the_vendors_words_but_the_bound():
    """Everything but CLAMP2/3's max is the vendor's word; the bound is npuemu's RK3588 ReLU-X value
    (30962), where the vendor writes a looser 42470 (the int8 output saturates at 6.0 before either)."""
    values = _values(TASKS["r6.rk3588"], RK3588)
    writes = vendor_writes(values, RK3588, shift_address=0, where="r6")
    ours, theirs = _words(writes, VENDOR), [int(w) for w in TASKS["r6.rk3576"]]
    assert len(ours) == len(theirs)
    differ = [(VENDOR.block_for_target(o >> 48).register_at(o & 0xFFFF).name, (o >> 16) & 0xFFFFFFFF,
               (t >> 16) & 0xFFFFFFFF) for o, t in zip(ours, theirs) if o != t]
    assert differ == [("CLAMP2_MAX", 30962, 42470), ("CLAMP3_MAX", 30962, 42470)]
    check_round_trip(values, RK3588, VENDOR, writes, SHIFT, "r6")
    translated = _translated("r6")
    twin = _values(TASKS["r6.rk3588"], RK3588)
    assert {k for k in set(translated) & set(twin) if translated[k] != twin[k]} == {
        ("CNA", "CONV_CON2"), ("DPU", "BN_RELUX_CMP_VALUE")}
    assert translated[("DPU", "BN_CFG")] == 0x92 and translated[("DPU", "BN_RELUX_CMP_VALUE")] == 42470


@pytest.mark.parametrize("case", POOLS)
def test_ppu_task_repacks_to_the_vendors_words_and_translates_to_its_twin(case):
    values = _values(TASKS[f"{case}.rk3588"], RK3588)
    writes = ppu_vendor_writes(values, RK3588, case)
    assert _words(writes, VENDOR) == [int(w) for w in TASKS[f"{case}.rk3576"]]
    check_ppu_round_trip(values, VENDOR, writes, case)
    back = translate_ppu(read_task(TASKS[f"{case}.rk3576"], VENDOR, case, int(TASKS[f"{case}.enable"])))
    assert _words(back, RK3588) == [int(w) for w in TASKS[f"{case}.rk3588"]]


@pytest.mark.parametrize("case", ["addin_f16", "mulin_f16"])
def test_fp16_dpu_only_add_and_mul_repack_to_the_vendors_words_and_translate_to_the_twin(case):
    values = _values(TASKS[f"{case}.rk3588"], RK3588)
    writes = dpu_vendor_writes(values, RK3588, case)
    assert _words(writes, VENDOR) == [int(w) for w in TASKS[f"{case}.rk3576"]]
    check_round_trip(values, RK3588, VENDOR, writes, 0, case, 0x18)
    ours = _translated(case)
    assert {key for key in set(ours) & set(values) if ours[key] != values[key]} == set()
    # the twin's LUT slope words have no vendor position; the LUT is off in both
    assert {name for _, name in set(values) - set(ours)} <= {"LUT_LE_SLOPE_SHIFT", "LUT_LO_SLOPE_SCALE",
                                                             "LUT_LO_SLOPE_SHIFT"}


def _with_word(case, offset, value):
    words = [int(w) for w in TASKS[f"{case}.rk3576"]]
    index = next(i for i, w in enumerate(words) if w & 0xFFFF == offset)
    words[index] = (words[index] & ~(0xFFFFFFFF << 16)) | (value << 16)
    return np.array(words, np.uint64)


def test_what_the_new_forms_do_not_cover_is_refused_by_name():
    with pytest.raises(UnsupportedProgramError, match="op-enable 0x18; only conv tasks"):   # a BS stage in use
        _translated_words(_with_word("addin_f16", 0x4038, 0x100012), 0x18)
    with pytest.raises(UnsupportedProgramError, match="pad words"):
        translate_ppu(read_task(_with_word("ap2", 0x604C, 5), VENDOR, "ap2", 0x60))
    with pytest.raises(UnsupportedProgramError, match="pad words"):   # fp16 average with a max pool's pad words
        translate_ppu(read_task(_with_word("mp_f16", 0x6024, 0x10), VENDOR, "mp_f16", 0x60))
    with pytest.raises(UnsupportedProgramError, match="only int8 average / max, fp16 max and pad-0 fp16 average"):
        translate_ppu(read_task(_with_word("mp_f16", 0x6024, 0x12), VENDOR, "mp_f16", 0x60))   # fp16 min pool
    with pytest.raises(UnsupportedProgramError, match="BS_OW_CFG"):   # a word its own fields do not give
        _translated_words(_with_word("dw_f16", 0x4050, 0x23133))


def _translated_words(words, enable=0x1D):
    task = read_task(words, VENDOR, "vendor task", enable)
    return translate_task(task, RK3588, lambda address, size: bytes(size))


# --- own builds -------------------------------------------------------------------------------


def _with(model, node):
    """``model`` (output ``y``) fed through ``node``, which reads ``t`` and writes ``y``."""
    for n in model.graph.node:
        if n.output[0] == "y":
            n.output[0] = "t"
    model.graph.node.append(node)
    return model


def relu6_model(kernel=(1, 1), hi=6.0, cin=16, cout=32, group=1):
    model = conv_model(cin, cout, (12, 20), kernel, (1, 1), (kernel[0] // 2, kernel[1] // 2) * 2)
    if group > 1:   # depthwise: one input channel per kernel
        weights = np.random.default_rng(1).normal(size=(cout, 1, *kernel)).astype(np.float32)
        model.graph.initializer[0].CopyFrom(numpy_helper.from_array(weights, "w"))
        model.graph.node[0].attribute.append(helper.make_attribute("group", group))
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0, np.float32), "lo"),
                                    numpy_helper.from_array(np.array(hi, np.float32), "hi")])
    return _with(model, helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))


def pool_model(op, kernel, stride, pads, cin=16, size=(12, 20)):
    model = conv_model(cin, cin, size, (3, 3), (1, 1), (1, 1, 1, 1), relu=True)
    return _with(model, helper.make_node(op, ["t"], ["y"], kernel_shape=list(kernel), strides=list(stride),
                                         pads=list(pads)))


def _same(model, cin, monkeypatch, fp16=False, size=(12, 20)):
    samples = _inputs(cin, size, count=2)
    samples.append({"x": samples[0]["x"] * 4})   # past the calibrated range: the bound and saturation cut
    vendor = _build(model, samples[:2], fp16, True)
    old = _build(model, samples[:2], fp16, False, monkeypatch)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    for sample in samples:
        np.testing.assert_array_equal(_run(vendor, sample["x"]), _run(old, sample["x"]))
    return vendor


@pytest.mark.parametrize("fp16", [False, True])
@pytest.mark.parametrize("hi, kernel", [(6.0, (1, 1)), (0.8, (3, 3))])
def test_own_relu6_build_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, hi, kernel, fp16):
    _same(relu6_model(kernel=kernel, hi=hi), 16, monkeypatch, fp16)


def _has_ppu_vendor_words(built) -> bool:
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    return any(int(w) >> 48 == VENDOR.block("PPU").target and int(w) & 0xFFFF == 0x604C for w in words)


@pytest.mark.parametrize("op, kernel, stride, pads, fp16", [
    ("MaxPool", (3, 3), (2, 2), (1, 1, 1, 1), False), ("MaxPool", (2, 2), (2, 2), (0, 0, 0, 0), False),
    ("AveragePool", (2, 2), (2, 2), (0, 0, 0, 0), False), ("AveragePool", (3, 3), (2, 2), (0, 0, 0, 0), False),
    ("MaxPool", (3, 3), (2, 2), (1, 1, 1, 1), True)])
def test_own_pool_build_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, op, kernel, stride, pads, fp16):
    assert _has_ppu_vendor_words(_same(pool_model(op, kernel, stride, pads), 16, monkeypatch, fp16))


@pytest.mark.parametrize("channels, kernel, hi", [(32, (3, 3), 6.0), (80, (3, 3), None), (16, (5, 3), 6.0)])
def test_own_fp16_depthwise_build_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, channels, kernel, hi):
    model = relu6_model(kernel=kernel, cin=channels, cout=channels, group=channels, hi=hi or 6.0)
    if hi is None:   # no activation: the conv writes y
        model.graph.node.pop()
        model.graph.node[-1].output[0] = "y"
    _same(model, channels, monkeypatch, fp16=True)


def depthwise_model(channels, size, kernel, stride, pads, relu6, seed=0):
    rng = np.random.default_rng(seed)
    weights = rng.normal(size=(channels, 1, *kernel)).astype(np.float32)
    bias = rng.normal(0, 0.1, channels).astype(np.float32)
    model = conv_model(channels, channels, size, kernel, stride, pads)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(weights, "w"))
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(bias, "b"))
    model.graph.node[0].attribute.append(helper.make_attribute("group", channels))
    if relu6:
        model.graph.initializer.extend([numpy_helper.from_array(np.array(0, np.float32), "lo"),
                                        numpy_helper.from_array(np.array(6, np.float32), "hi")])
        model = _with(model, helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))
    return model


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.sampled_from([8, 16, 24, 40, 72, 96]), height=st.integers(3, 16), width=st.integers(3, 16),
       kh=st.integers(1, 3), kw=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
       relu6=st.booleans())
def test_fp16_depthwise_convs_in_the_vendor_layout_run_bit_identically(monkeypatch, channels, height, width, kh, kw,
                                                                      stride, pad, relu6):
    pads = (min(pad, kh - 1), min(pad, kw - 1)) * 2   # pads below the kernel (a compiler limit, 39's test)
    model = depthwise_model(channels, (height, width), (kh, kw), (stride, stride), pads, relu6)
    _same(model, channels, monkeypatch, fp16=True, size=(height, width))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["MaxPool", "AveragePool"]), kernel=st.integers(2, 3), stride=st.integers(1, 3),
       pad=st.integers(0, 1), height=st.integers(4, 14), width=st.integers(4, 14), fp16=st.booleans())
def test_pools_in_the_vendor_layout_run_bit_identically(monkeypatch, op, kernel, stride, pad, height, width, fp16):
    if fp16 and op == "AveragePool":   # no vendor form (REGISTER_SEMANTICS.md 41): the build falls back
        op = "MaxPool"
    model = pool_model(op, (kernel, kernel), (stride, stride), (min(pad, kernel - 1),) * 4, size=(height, width))
    _same(model, 16, monkeypatch, fp16, size=(height, width))


def add_model(channels=16, size=(12, 20), op="Add"):
    """y = x + z (or x * z) of two graph inputs: npuemu's standalone Add / Mul, a DPU-only task (the Add
    of two conv outputs fuses into the second conv, LOWERING.md 6)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, *size])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, channels, *size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph([helper.make_node(op, ["x", "z"], ["y"])], "eltwise", [x, z], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("channels, size, dpu_only, op", [
    (16, (12, 20), True, "Add"), (24, (6, 6), True, "Add"), (8, (9, 4), True, "Add"), (40, (7, 9), False, "Add"),
    (32, (5, 6), False, "Add"), (16, (12, 20), True, "Mul"), (24, (6, 6), True, "Mul")])
def test_own_fp16_standalone_add_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, channels, size, dpu_only,
                                                                            op):
    """A DPU-only Add or Mul, or (40 and 32 channels) npuemu's identity conv of x with z added through
    the ERDMA alone (section 39's residual form, whose unread MRDMA address the round trip now skips)."""
    model = add_model(channels, size, op)
    rng = np.random.default_rng(4)
    feeds = {name: rng.normal(size=(1, channels, *size)).astype(np.float32) for name in ("x", "z")}
    options = CompileOptions(precision="fp16")
    vendor, old = both_layouts(model, options)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert (0x18 in _enables(vendor)) == dpu_only
    outputs = []
    for built in (vendor, old):
        runtime = Runtime(built)
        for name, value in feeds.items():
            runtime.set_input(name, value)
        runtime.run()
        outputs.append(runtime.output("y", dequantize=False))
    np.testing.assert_array_equal(*outputs)


def _enables(built):
    """The op-enable masks of the build's tasks (from the regcmd tails: the last word of each fetch)."""
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    return {(int(w) >> 16) & 0xFFFF for w in words if int(w) >> 48 == TARGET_OP_ENABLE}


def test_fp16_average_pool_ppu_task_takes_the_vendor_form():
    """The toolkit makes fp16 average pools depthwise convs (as npuemu's -O3 does since LOWERING.md 51.2:
    tests/compiler/test_rk3576_vendor_fp16_pool.py) but its GlobalAveragePool over 1 x 1 is a PPU average pool
    with pad words 0 (REGISTER_SEMANTICS.md 57): a build that keeps one on the PPU (-O1) now writes that form
    and gives the RK3588-position build's output."""
    model = pool_model("AveragePool", (2, 2), (2, 2), (0, 0, 0, 0))
    vendor, old = both_layouts(model, CompileOptions(precision="fp16", optimization_level=1))
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    x = np.random.default_rng(3).normal(size=(1, 16, 12, 20)).astype(np.float32)
    np.testing.assert_array_equal(_run(vendor, x), _run(old, x))


# --- whole networks ---------------------------------------------------------------------------


def _network(model, monkeypatch, fp16, size):
    rng = np.random.default_rng(5)
    samples = [{"input": rng.normal(size=(1, 3, size, size)).astype(np.float32)} for _ in range(2)]
    options = CompileOptions(precision="fp16") if fp16 else CompileOptions(dataset=samples)
    vendor, old = both_layouts(model, options)
    outputs = []
    for built in (vendor, old):
        runtime = Runtime(built)
        runtime.set_input("input", samples[0]["input"])
        runtime.run()
        outputs.append(runtime.output("logits", dequantize=False))
    np.testing.assert_array_equal(*outputs)
    return vendor


def _benchmark(name, size):
    if name == "mobilenetv2":
        return models.mobilenetv2(size=size, classes=10)[0]
    return models.resnet(18, size, classes=10)[0]


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18"])
def test_fp16_mobilenetv2_and_resnet18_build_in_the_vendor_layout_and_run_alike(monkeypatch, name):
    """benchmarks/models.py's networks at 64 x 64: image input (fp16 inputs are not packed), depthwise,
    Relu6, residual Adds, max pool, GlobalAveragePool (a depthwise conv over the final 2 x 2), FC."""
    model = _benchmark(name, 64)
    built = _network(model, monkeypatch, True, 64)
    assert built.trailer["platform"]["register_layout"] == "rk3576_vendor"


@pytest.mark.parametrize("name", ["mobilenetv2", "resnet18"])
def test_int8_networks_build_in_the_vendor_layout_and_run_alike(monkeypatch, name):
    """int8 at 32 x 32: the 3-channel input in the vendor's image-input form (3-byte pixels, LOWERING.md 52)
    and the int8 depthwise convs (GlobalAveragePool's too) in the vendor's form (LOWERING.md 45); outputs
    equal the RK3588-position build's bit for bit."""
    built = _network(_benchmark(name, 32), monkeypatch, False, 32)
    assert built.trailer["platform"]["register_layout"] == "rk3576_vendor"
    assert built.trailer["platform"]["image_inputs"]["input"]["pixel_bytes"] == 3
