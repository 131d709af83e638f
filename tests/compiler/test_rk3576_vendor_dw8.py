"""int8 depthwise convs in the vendor's rk3576 layout (isa/rknn/rk3576_dw8.py, emulator/REGISTER_SEMANTICS.md
45.2, compiler/LOWERING.md 45.2) and the packed image input stored unpacked (45.1).

References: the vendor itself. ``tests/data/rk3576_vendor/dw8_pairs.npz.xz`` holds, for ONNX models built by
rknn-toolkit2 2.5.0 for rk3576 and for rk3588 (int8, 3 random N(0, 1) calibration samples; read with npuemu's
reader), one chain-0 task's words (NAME.rk3576 / NAME.rk3588 / NAME.enable) and its weight cube and BS record
bytes (NAME.TARGET.cube / .record):
  dw     depthwise 32 3x3 s2 p1 on 12 x 20 (task 0; tensors c1_w / c1_b)
  dw6    depthwise 32 3x3 p1 on 12 x 20 + Clip(0, 6) (task 0)
  dw80   depthwise 80 3x3 p1 on 10 x 12 + Clip(0, 6) (task 0: 64 + 16 channel blocks)
  gap    Conv 16 -> 32 3x3 on 7 x 7, GlobalAveragePool: a 7x7 depthwise conv (task 1; y_2conv0_i1 / _i2),
         whose CPEND is 128
The layouts are checked against the vendor's bytes with an independent reading written here.
"""

from __future__ import annotations

import io
import lzma

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn import rk3576_dw8
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_pack import check_round_trip, vendor_writes
from npuemu.isa.rknn.rk3576_program import translate_task
from npuemu.isa.words import encode_write
from tests.compiler.test_rk3576_vendor_emit import DATA, RK3588, SHIFT, VENDOR, _build, _check_same, _inputs, _run, _values
from tests.compiler.test_rk3576_vendor_forms import relu6_model

with lzma.open(DATA / "dw8_pairs.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    PAIRS = {name: _archive[name] for name in _archive.files}
CASES = ("dw", "dw6", "dw80", "gap")
TAPS = {"dw": 9, "dw6": 9, "dw80": 9, "gap": 49}
CHANNELS = {"dw": 32, "dw6": 32, "dw80": 80, "gap": 32}
#: the int8 Relu6 bound the vendor writes looser than its rk3588 twin (LOWERING.md 42: npuemu keeps the twin's)
RELU6_BOUND = {("DPU", "CLAMP2_MAX"), ("DPU", "CLAMP3_MAX")}


def _bytes(case, target, key):
    return PAIRS[f"{case}.{target}.{key}"].tobytes()


def _reference_cube(rk3588: bytes, cpend: np.ndarray, taps: int, channels: int) -> bytes:
    """REGISTER_SEMANTICS.md 45.2's reading: per 64-channel block (channels rounded up to 16), per tap, per
    channel pair: the two weights, then the two channels' CPEND mod 256."""
    stored = len(rk3588) // taps
    out = bytearray(2 * len(rk3588))
    for block in range(0, stored, 64):
        held = min(64, stored - block)
        for tap in range(taps):
            for c in range(held):
                src = block * taps + tap * held + c
                dst = 2 * block * taps + tap * 2 * held + 4 * (c // 2) + c % 2
                out[dst] = rk3588[src]
                out[dst + 2] = int(cpend[block + c]) & 0xFF if block + c < len(cpend) else 0
    return bytes(out)


def _cpend(record: bytes) -> np.ndarray:
    return np.frombuffer(record, np.uint8).reshape(-1, 64)[:, 32:48].copy().view("<i2").reshape(-1)


@pytest.mark.parametrize("case", CASES)
def test_vendor_cube_and_record_are_the_twins_with_cpend_moved(case):
    """The rk3576 cube is the rk3588 one with each channel pair followed by its CPEND; the record drops CPEND."""
    cube, record = _bytes(case, "rk3588", "cube"), _bytes(case, "rk3588", "record")
    cpend = _cpend(record)
    assert _reference_cube(cube, cpend, TAPS[case], CHANNELS[case]) == _bytes(case, "rk3576", "cube")
    assert rk3576_dw8.vendor_cube(cube, cpend, TAPS[case]) == _bytes(case, "rk3576", "cube")
    groups = np.frombuffer(record, np.uint8).reshape(-1, 64)
    expected = np.concatenate([groups[:, :32], groups[:, 48:]], axis=1).tobytes()
    assert rk3576_dw8.vendor_record(record) == expected == _bytes(case, "rk3576", "record")[:len(expected)]


@pytest.mark.parametrize("case", CASES)
def test_translation_memory_gives_back_the_twins_cube_and_record(case):
    channels = -(-CHANNELS[case] // 64) * 64
    cube, record = rk3576_dw8.rk3588_memory(_bytes(case, "rk3576", "cube"),
                                            _bytes(case, "rk3576", "record")[:channels * 6], TAPS[case], channels)
    assert cube == _bytes(case, "rk3588", "cube")
    assert record == _bytes(case, "rk3588", "record")[:channels * 8]


@pytest.mark.parametrize("case", CASES)
def test_repacked_twin_is_the_vendors_task_and_round_trips(case):
    """Word for word but the int8 Relu6 bound; the translation (own builds) gives the twin back with the BS
    address moved past the vendor record to the room an own build leaves."""
    values = _values(PAIRS[f"{case}.rk3588"], RK3588)
    writes = vendor_writes(values, RK3588, shift_address=0, where=case)
    names = [(block, name) for block, name, _ in writes]
    mine = [encode_write(VENDOR, block, name, value) for block, name, value in writes]
    differ = {names[i] for i, (a, b) in enumerate(zip(mine, PAIRS[f"{case}.rk3576"])) if a != int(b)}
    assert len(mine) == len(PAIRS[f"{case}.rk3576"]) and differ <= RELU6_BOUND
    spare = 6 * -(-CHANNELS[case] // 64) * 64
    moved = {**values, ("DPU_RDMA", "BS_BASE_ADDR"): values.get(("DPU_RDMA", "BS_BASE_ADDR"), 0) + spare}
    check_round_trip(moved, RK3588, VENDOR, writes, SHIFT, case)
    with pytest.raises(UnsupportedProgramError):   # the unmoved record is not what comes back
        check_round_trip(values, RK3588, VENDOR, writes, SHIFT, case)


@pytest.mark.parametrize("case", CASES)
def test_vendor_files_int8_depthwise_stays_refused(case):
    """A vendor .rknn keeps no room for the RK3588 record: the translation of vendor files refuses it."""
    task = read_task(PAIRS[f"{case}.rk3576"], VENDOR, case, int(PAIRS[f"{case}.enable"]))
    word = SHIFT.to_bytes(2, "little")
    with pytest.raises(UnsupportedProgramError, match="depthwise"):
        translate_task(task, RK3588, lambda address, size: word[:size])


def test_cpend_outside_the_byte_refused():
    with pytest.raises(UnsupportedProgramError, match="CPEND"):
        rk3576_dw8.vendor_cube(bytes(9 * 16), np.full(16, -128), 9)


# --- own builds ---------------------------------------------------------------------------------


def depthwise_model(channels, kernel, stride=(1, 1), relu6=True, seed=1, size=(12, 20)):
    rng = np.random.default_rng(seed)
    pads = [kernel[0] // 2, kernel[1] // 2] * 2
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=list(kernel), strides=list(stride),
                              pads=pads, group=channels)]
    inits = [numpy_helper.from_array(rng.normal(size=(channels, 1, *kernel)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(0, 0.1, channels).astype(np.float32), "b")]
    if relu6:
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
        inits += [numpy_helper.from_array(np.array(0, np.float32), "lo"),
                  numpy_helper.from_array(np.array(6, np.float32), "hi")]
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, *size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("channels, kernel, stride, relu6", [(32, (3, 3), (1, 1), True), (96, (3, 3), (2, 2), False),
                                                             (200, (3, 3), (1, 1), True), (16, (5, 3), (1, 2), True)])
def test_own_int8_depthwise_builds_run_alike_in_both_layouts(monkeypatch, channels, kernel, stride, relu6):
    _check_same(depthwise_model(channels, kernel, stride, relu6), channels, (12, 20), monkeypatch)


def test_a_layer_split_by_channels_runs_alike(monkeypatch):
    """144 channels on 56 x 56: three tasks of 64, 64 and 16 channels, each with its own cube, record and room."""
    built = _check_same(depthwise_model(144, (3, 3), size=(56, 56)), 144, (56, 56), monkeypatch)
    addresses = set()
    for word in (int(w) for w in np.frombuffer(built.section("regcmd").data, "<u8")):
        block = VENDOR.block_for_target(word >> 48)
        register = block.register_at(word & 0xFFFF) if block else None
        if register is not None and (block.name, register.name) == ("DPU_RDMA", "BS_BASE_ADDR"):
            addresses.add(word >> 16 & 0xFFFFFFFF)
    assert len(addresses) == 3


def _memory(built, address, size):
    section = built.section("weights")
    base = next(a.base for a in built.memory_map().areas if a.name == "weights")
    return section.data[address - base:address - base + size]


def test_own_build_stores_the_vendor_blobs(monkeypatch):
    """The weight constant is the vendor cube (the reference layout above, from the RK3588-position build's
    cube and CPEND), the BS constant the vendor record followed by room for RK3588's."""
    model = relu6_model(cin=32, cout=32, group=32, kernel=(3, 3))
    vendor = _check_same(model, 32, (12, 20), monkeypatch)
    old = _build(model, _inputs(32, (12, 20), count=2), False, False, monkeypatch)
    new_words = _values(np.frombuffer(vendor.section("regcmd").data, "<u8"), VENDOR)
    old_words = _values(np.frombuffer(old.section("regcmd").data, "<u8"), RK3588)
    cube = _memory(old, old_words[("CNA", "DCOMP_ADDR0")], 9 * 32)
    record = _memory(old, old_words[("DPU_RDMA", "BS_BASE_ADDR")], 64 * 8)
    assert new_words[("CNA", "WEIGHT_BYTES")] == 2 * 9 * 32
    assert _memory(vendor, new_words[("CNA", "DCOMP_ADDR0")], 2 * 9 * 32) == _reference_cube(cube, _cpend(record), 9, 32)
    groups = np.frombuffer(record, np.uint8).reshape(-1, 64)
    stored = _memory(vendor, new_words[("DPU_RDMA", "BS_BASE_ADDR")], 64 * 14)
    assert stored == np.concatenate([groups[:, :32], groups[:, 48:]], axis=1).tobytes() + bytes(64 * 8)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(channels=st.integers(8, 80), kh=st.integers(1, 3), kw=st.integers(1, 3), sy=st.integers(1, 2),
       sx=st.integers(1, 2), relu6=st.booleans(), seed=st.integers(0, 99))
def test_drawn_int8_depthwise_convs_run_alike(monkeypatch, channels, kh, kw, sy, sx, relu6, seed):
    samples = _inputs(channels, (9, 11), count=2, seed=seed)
    model = depthwise_model(channels, (kh, kw), (sy, sx), relu6, seed, size=(9, 11))
    vendor = _build(model, samples)
    old = _build(model, samples, False, False, monkeypatch)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    for sample in samples:
        np.testing.assert_array_equal(_run(vendor, sample["x"]), _run(old, sample["x"]))
