"""The int8 element-wise Sub in the vendor's rk3576 layout (compiler/LOWERING.md 48.1, emulator/REGISTER_SEMANTICS.md
48): the vendor writes ``x - z`` as its DPU-only Add with the EW operand converter's scale negated; npuemu's own Sub
(EW ALU minus) is re-packed into that form (``rk3576_dpu.minus_as_add``), also over channels padded to an atom and
with a broadcast operand (EW_SURF_STRIDE 0), outputs bit-identical to the RK3588-position build.

Committed vendor files (rknn-toolkit2 2.5.0, ``config(target_platform=...)``, ``build(do_quantization=True)`` with 3
calibration pairs ``x = RandomState(10 + i).randn(shape)``, ``z = <same generator>.randn(shape) * 0.5``) of ONNX
``y = x - z`` (opset 14), x, z float32:
``sub_int8.rknn.xz`` / ``sub_int8_rk3588.rknn.xz`` ([1, 16, 12, 20], rk3576 and its rk3588 twin),
``sub24_int8.rknn.xz`` / ``sub24_int8_rk3588.rknn.xz`` ([1, 24, 12, 20]), and of ``y = x + z`` / ``y = x * z`` on
[1, 24, 12, 20] ``add24_int8.rknn.xz`` / ``mul24_int8.rknn.xz`` with their ``_rk3588`` twins (the same calibration);
``sub_int8_sim.npy.xz``: the toolkit simulator's output of the rk3576 file (``init_runtime(); inference``) on
``x = RandomState(5).randn(1, 16, 12, 20)``, ``z = <same generator>.randn(...) * 0.5`` as int8 codes
``rint(y / 0.036023498) + 8`` (the file's output scale and zero point).
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from npuemu.compiler.driver import CompileOptions
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import default_bases, load_rknn, plan_memory, relocate
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_program import region_reader, translate_task
from npuemu.isa.rknn.rk3576_dpu import DPU_ONLY_ENABLE, minus_as_add
from npuemu.isa.rknn.rk3576_pack import check_round_trip, dpu_record, dpu_vendor_writes
from tests.compiler.test_rk3576_vendor_dpu_int8 import _run
from npuemu.isa.words import encode_write
from tests.compiler.test_rk3576_vendor_emit import both_layouts

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR, RK3588 = load_regmap("rk3576_vendor"), load_regmap("rk3588")
SHAPES = {"sub": (1, 16, 12, 20), "sub24": (1, 24, 12, 20), "add24": (1, 24, 12, 20), "mul24": (1, 24, 12, 20)}
EW_MUL_INT8 = 0x904002C4
EW_ADD_INT8, EW_MINUS_INT8 = 0x904202C0, 0x904402C0


def _file(name: str) -> bytes:
    return lzma.decompress((DATA / name).read_bytes())


def _vendor_inputs(shape) -> list[np.ndarray]:
    rng = np.random.RandomState(5)
    x = rng.randn(*shape).astype(np.float32)
    return [x, (rng.randn(*shape) * 0.5).astype(np.float32)]


def _run_vendor(name: str, chip: str, inputs) -> np.ndarray:
    (_, out), = RknnRunner(load_rknn(_file(name), name), chip, (0,)).run(inputs).quantized.items()
    return np.asarray(out).astype(np.int64)


@pytest.mark.parametrize("case", SHAPES)
def test_vendor_sub_runs_bit_identically_to_its_rk3588_twin(case):
    inputs = _vendor_inputs(SHAPES[case])
    ours = _run_vendor(f"{case}_int8.rknn.xz", "rk3576", inputs)
    np.testing.assert_array_equal(ours, _run_vendor(f"{case}_int8_rk3588.rknn.xz", "rk3588", inputs))
    assert len(np.unique(ours)) > 100


def test_vendor_sub_against_the_simulator_within_one_step():
    ours = _run_vendor("sub_int8.rknn.xz", "rk3576", _vendor_inputs(SHAPES["sub"]))
    sim = np.load(io.BytesIO(lzma.decompress((DATA / "sub_int8_sim.npy.xz").read_bytes()))).astype(np.int64)
    assert np.abs(ours - sim).max() <= 1
    assert (ours == sim).mean() > 0.999


def _twin_task(case: str) -> dict[tuple[str, str], int]:
    """The rk3588 twin's first task as RK3588 register values (stored addresses 0)."""
    model = load_rknn(_file(f"{case}_int8_rk3588.rknn.xz"), case)
    record = model.program.tasks[model.program.chains[0].tasks[0]]
    twin = {}
    for word in model.program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]:
        word = int(word)
        block = RK3588.block_for_target(word >> 48)
        register = block.register_at(word & 0xFFFF) if block else None
        if register is not None:
            twin[(block.name, register.name)] = (word >> 16) & 0xFFFFFFFF
    return twin


@pytest.mark.parametrize("case", SHAPES)
def test_the_twin_is_an_add_of_the_negated_operand_and_repacks_word_for_word(case):
    """The vendor's Sub: EW ALU add (not minus) with a negative 16-bit converter scale; the twin re-packed gives
    the vendor's 89 words word for word (24 channels: the real count 23 in DPU 0x402C / 0x4030 and DPU_RDMA 0x5014,
    the twin's padded 31 in CHANNEL at RK3588 positions) and the round trip holds. The Add: the same frame, the
    scale positive; the Mul: 44.4's Mul frame, padded alike.""" 
    twin = _twin_task(case)
    if case == "add24":   # this twin writes ORIG_CHANNEL 31 (the padded count), its rk3576 build the real 23
        assert twin[("DPU", "DATA_CUBE_CHANNEL")] == 0x1F001F
        twin[("DPU", "DATA_CUBE_CHANNEL")] = 0x17001F
    scale = twin[("DPU", "EW_CVT_SCALE_VALUE")] & 0xFFFF
    assert twin[("DPU", "EW_CFG")] == (EW_MUL_INT8 if case == "mul24" else EW_ADD_INT8)
    assert (scale >= 0x8000) == case.startswith("sub")
    writes = dpu_vendor_writes(twin, RK3588, case, 0)
    model = load_rknn(_file(f"{case}_int8.rknn.xz"), case)
    record = model.program.tasks[model.program.chains[0].tasks[0]]
    stored = model.program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]
    assert [encode_write(VENDOR, b, n, v) for b, n, v in writes] == [int(w) for w in stored]
    check_round_trip(twin, RK3588, VENDOR, writes, 0, case, DPU_ONLY_ENABLE, dpu_record(twin, RK3588))


#: as tests/emulator/test_rknn_rk3576_dpu_int8.py: registers the translation writes otherwise than the twin (the LUT
#: slope words rk3576.yaml lacks, the unread MRDMA_FP16TOFP32_EN) and the addresses (relocated here, 0 in the twin)
KNOWN = {("DPU", "LUT_LE_SLOPE_SHIFT"), ("DPU", "LUT_LO_SLOPE_SCALE"), ("DPU", "LUT_LO_SLOPE_SHIFT"),
         ("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR"), ("DPU_RDMA", "EW_BASE_ADDR"),
         ("DPU_RDMA", "BS_CFG_ADDR")}
FREE = {("DPU_RDMA", "FEATURE_MODE_CFG"): 0x8}


@pytest.mark.parametrize("case", ["sub", "sub24", "mul24"])
def test_the_vendor_task_translates_to_its_twin_register_for_register(case):
    """The padded tasks' real count (23 in every channel word) comes back as the twin's CHANNEL 31 (DPU, WDMA,
    DPU_RDMA); the Sub's negative converter scale as written."""
    model = load_rknn(_file(f"{case}_int8.rknn.xz"), case)
    plan = plan_memory(model)
    program = relocate(model, plan, default_bases(model, plan))
    record = model.program.tasks[model.program.chains[0].tasks[0]]
    words = program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]
    task = read_task(words, VENDOR, case, record.enable_mask)
    ours = {(b, n): v for b, n, v in translate_task(task, RK3588, region_reader(model, program))}
    twin = _twin_task(case)
    differ = {key for key in (set(ours) | set(twin)) - KNOWN
              if ours.get(key, 0) & ~FREE.get(key, 0) != twin.get(key, 0) & ~FREE.get(key, 0)}
    assert differ <= {("DPU", "DATA_CUBE_CHANNEL")}, {k: (hex(ours.get(k, 0)), hex(twin.get(k, 0))) for k in differ}
    assert ours[("DPU", "DATA_CUBE_CHANNEL")] & 0xFFFF == twin[("DPU", "DATA_CUBE_CHANNEL")] & 0xFFFF   # CHANNEL
    assert ours[("DPU_RDMA", "DATA_CUBE_CHANNEL")] == twin[("DPU_RDMA", "DATA_CUBE_CHANNEL")]


def _rshift_round(value: int, shift: int, even: bool) -> int:
    """value / 2^shift to nearest, ties to even or away from zero (an independent reading of NUMERICS.md 1)."""
    if shift == 0:
        return value
    quotient, remainder = divmod(abs(value), 1 << shift)
    half = 1 << (shift - 1)
    up = remainder > half or (remainder == half and (not even or quotient & 1))
    return (quotient + up) * (1 if value >= 0 else -1)


def _sub_values(scale: int, offset: int, shift: int, round_away: bool) -> dict[tuple[str, str], int]:
    return {("DPU", "EW_CFG"): EW_MINUS_INT8 | round_away << 30, ("DPU", "DATA_FORMAT"): 0,
            ("DPU", "EW_CVT_SCALE_VALUE"): shift << 16 | scale & 0xFFFF, ("DPU", "EW_CVT_OFFSET_VALUE"): offset & 0xFFFFFFFF}


@settings(max_examples=300, deadline=None)
@given(v=st.integers(-(1 << 30), 1 << 30), e=st.integers(-128, 127), offset=st.integers(-255, 255),
       scale=st.integers(-32767, 32767), shift=st.integers(0, 31), round_away=st.booleans())
def test_minus_as_add_gives_the_same_integers(v, e, offset, scale, shift, round_away):
    """v - cvt(e) (ALU minus) equals v + cvt'(e) with the rewritten scale, for either rounding mode."""
    values = _sub_values(scale, offset, shift, round_away)
    rewritten = minus_as_add(values, RK3588)
    assert rewritten[("DPU", "EW_CFG")] == EW_ADD_INT8 | round_away << 30
    word = rewritten[("DPU", "EW_CVT_SCALE_VALUE")]
    assert word >> 16 == shift
    negated = (word & 0xFFFF) - ((word & 0x8000) << 1)
    minus = v - _rshift_round((e + offset) * scale, shift, not round_away)
    assert minus == v + _rshift_round((e + offset) * negated, shift, not round_away)


@pytest.mark.parametrize("values", [
    _sub_values(-0x8000, 0, 2, False),                                    # -(-32768) does not fit the field
    {**_sub_values(100, 0, 2, False), ("DPU", "DATA_FORMAT"): 2},         # fp16 (PROC_PRECISION 2): not seen
    {**_sub_values(100, 0, 2, False), ("DPU", "EW_CFG"): EW_ADD_INT8},    # already an Add
    _sub_values(30000, 1 << 20, 0, False),                                # the product could saturate
])
def test_minus_as_add_leaves_other_tasks_alone(values):
    assert minus_as_add(values, RK3588) == values


def _sub_model(channels: int, size: tuple[int, int], z_channels: int, op: str = "Sub") -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, *size])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, z_channels, *size])
    graph = helper.make_graph([helper.make_node(op, ["x", "z"], ["y"])], "sub", [x, z],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _feeds(channels, size, z_channels, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return {"x": (rng.normal(size=(1, channels, *size)) * scale).astype(np.float32),
            "z": (rng.normal(size=(1, z_channels, *size)) * 0.5 * scale).astype(np.float32)}


def _ew_configs(built) -> set[int]:
    words = np.frombuffer(next(s for s in built.sections if s.name == "regcmd").data, "<u8")
    offset = RK3588.register("DPU", "EW_CFG").offset
    return {(int(w) >> 16) & 0xFFFFFFFF for w in words if int(w) & 0xFFFF == offset}


@pytest.mark.parametrize("channels, size, z_channels, op", [
    (16, (12, 20), 16, "Sub"), (24, (6, 10), 24, "Sub"), (48, (5, 7), 48, "Sub"), (120, (1, 40), 1, "Sub"),
    (40, (3, 8), 1, "Sub"), (24, (6, 10), 24, "Add"), (40, (3, 8), 1, "Add"), (24, (6, 10), 24, "Mul"),
    (120, (1, 40), 120, "Mul"),
])
def test_own_int8_sub_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, channels, size, z_channels, op):
    """Whole operands (16, 48 channels), channels padded to an atom (24, 40, 120; the Add's and Mul's too) and a
    channel-broadcast operand (z with 1 channel: npuemu's lane-replicating conv, then the Sub reading one surface
    for every surface, as ppocr_rec's LayerNorm ``x - mean``)."""
    model = _sub_model(channels, size, z_channels, op)
    options = CompileOptions(dataset=[_feeds(channels, size, z_channels, seed) for seed in (0, 1)])
    vendor, old = both_layouts(model, options)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert (EW_MINUS_INT8 in _ew_configs(old)) == (op == "Sub")   # npuemu's own Sub: ALU minus
    for seed, scale in ((5, 1.0), (6, 4.0)):          # 4.0: past the calibrated range, saturating
        feeds = _feeds(channels, size, z_channels, seed, scale)
        np.testing.assert_array_equal(_run(vendor, feeds), _run(old, feeds))
