"""The vendor's int8 DPU-only tasks on rk3576: a standalone Add, Add + Relu and Mul of two graph inputs,
their BS operands read from the per-task record in memory (emulator/REGISTER_SEMANTICS.md 44.1,
isa/rknn/rk3576_dpu.py).

``tests/data/rk3576_vendor/{add,addr,mul}_int8.rknn.xz``: rknn-toolkit2 2.5.0,
``config(target_platform="rk3576")``, ``build(do_quantization=True)`` with 3 calibration pairs
``(RandomState(0).randn(shape) * a, ... * b)`` (drawn alternately) of ONNX ``y = x + z`` (a, b = 1, 3),
``y = Relu(x + z)`` (2, 0.5) and ``y = x * z`` (1, 3), x, z [1, 16, 12, 20] float32.
``dpu_int8_runs.npz.xz``: per case ``<case>.sim``, the vendor simulator's output (``init_runtime();
inference``) on ``xa = RandomState(1).randn(shape) * a`` then ``xb = <same generator>.randn(shape) * b``
as int8 codes ``rint(y / scale) + zp``, channels 0-3; ``<case>.rk3588``, the first task of the vendor's
rk3588 build of the same ONNX (its 69 register words), the twin the translation must give.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import default_bases, load_rknn, plan_memory, relocate
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_dpu import DPU_ONLY_ENABLE
from npuemu.isa.rknn.rk3576_pack import check_round_trip, dpu_record, dpu_vendor_writes
from npuemu.isa.rknn.rk3576_program import region_reader, translate_task
from npuemu.isa.words import encode_write

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
SHAPE = (1, 16, 12, 20)
SCALES = {"add": (1.0, 3.0), "addr": (2.0, 0.5), "mul": (1.0, 3.0)}
VENDOR, RK3588 = load_regmap("rk3576_vendor"), load_regmap("rk3588")
with lzma.open(DATA / "dpu_int8_runs.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    RUNS = {name: _archive[name] for name in _archive.files}
#: Registers the translation writes otherwise than the twin, as for the fp16 DPU-only tasks: the LUT
#: slope words rk3576.yaml lacks, and MRDMA_FP16TOFP32_EN (rk3576_pack.FREE_BITS: no unit reads it here).
KNOWN = {("DPU", "LUT_LE_SLOPE_SHIFT"), ("DPU", "LUT_LO_SLOPE_SCALE"), ("DPU", "LUT_LO_SLOPE_SHIFT")}
FREE = {("DPU_RDMA", "FEATURE_MODE_CFG"): 0x8}
#: relocated here, 0 in the twin's stored stream
ADDRESSES = {("DPU", "DST_BASE_ADDR"), ("DPU_RDMA", "SRC_BASE_ADDR"), ("DPU_RDMA", "EW_BASE_ADDR"),
             ("DPU_RDMA", "BS_CFG_ADDR")}


def _data(case: str) -> bytes:
    return lzma.decompress((DATA / f"{case}_int8.rknn.xz").read_bytes())


def _inputs(case: str) -> list[np.ndarray]:
    rng = np.random.RandomState(1)
    a, b = SCALES[case]
    xa = (rng.randn(*SHAPE) * a).astype(np.float32)
    return [xa, (rng.randn(*SHAPE) * b).astype(np.float32)]


def _run(data: bytes, case: str) -> np.ndarray:
    (_, out), = RknnRunner(load_rknn(data, case), "rk3576", (0,)).run(_inputs(case)).quantized.items()
    return np.asarray(out).astype(np.int64)


@pytest.mark.parametrize("case", SCALES)
def test_int8_dpu_only_task_runs_bit_exactly_against_the_simulator(case):
    ours = _run(_data(case), case)[:, :4]
    sim = RUNS[f"{case}.sim"].astype(np.int64)
    np.testing.assert_array_equal(ours, sim)
    assert len(np.unique(sim)) > 30


def _relocated(case: str):
    """The vendor task as relocated at the runner's default bases, and a reader of the file's constant
    regions (where the BS record ``<input>_BsCfg_BScfgTensor`` lies) by device address."""
    model = load_rknn(_data(case), case)
    plan = plan_memory(model)
    program = relocate(model, plan, default_bases(model, plan))
    record = model.program.tasks[model.program.chains[0].tasks[0]]
    words = program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]
    return read_task(words, VENDOR, case, record.enable_mask), region_reader(model, program)


@pytest.mark.parametrize("case", SCALES)
def test_translation_is_the_rk3588_twin_register_for_register(case):
    """BS_CFG 0x20040 (0x20050: the Mul's multiplier bypassed), BS_ALU_CFG, BS_MUL_CFG and DATA_FORMAT's
    negative shift from the record; the EW stage (the Mul's 0x810f4094 -> 0x904002c4), OUT_CVT_SCALE
    without the vendor's bit 16."""
    twin = _twin(case)
    task, read = _relocated(case)
    ours = {(b, n): v for b, n, v in translate_task(task, RK3588, read)}
    differ = {key for key in (set(ours) | set(twin)) - ADDRESSES
              if ours.get(key, 0) & ~FREE.get(key, 0) != twin.get(key, 0) & ~FREE.get(key, 0)}
    assert differ <= KNOWN, {key: (hex(ours.get(key, 0)), hex(twin.get(key, 0))) for key in differ - KNOWN}
    assert twin[("DPU", "BS_ALU_CFG")] != 0 and ours[("DPU", "BS_CFG")] in (0x20040, 0x20050)


def test_a_record_with_two_different_alu_operands_is_refused_by_name():
    """The record holds the ALU operand twice in every build; a record that does not is named."""
    data = bytearray(_data("add"))
    blob = (-9).to_bytes(4, "little", signed=True) + bytes(12) + (-9).to_bytes(4, "little", signed=True)
    position = data.find(blob)
    assert position > 0 and data.find(blob, position + 1) < 0
    data[position + 16:position + 20] = (-8).to_bytes(4, "little", signed=True)
    with pytest.raises(UnsupportedProgramError, match="int8 DPU-only BS record"):
        RknnRunner(load_rknn(bytes(data), "add"), "rk3576", (0,))


@pytest.mark.parametrize("case", SCALES)
def test_the_twin_repacks_to_the_vendors_words_and_record(case):
    """The inverse (rk3576_pack.dpu_vendor_writes / dpu_record, what npuemu's own int8 builds emit):
    the rk3588 twin's registers pack into the vendor's 89 words, word for word (addresses 0 in both
    stored streams), its record into the vendor's first 64 bytes, and the round trip holds."""
    values = _twin(case)
    writes = dpu_vendor_writes(values, RK3588, case, 0)
    model = load_rknn(_data(case), case)
    record = model.program.tasks[model.program.chains[0].tasks[0]]
    stored = model.program.regcmd[record.regcmd_addr // 8:record.regcmd_addr // 8 + record.regcfg_amount]
    assert [encode_write(VENDOR, b, n, v) for b, n, v in writes] == [int(w) for w in stored]
    task, read = _relocated(case)
    ours = dpu_record(values, RK3588)
    assert ours == read(task.raw("DPU_RDMA", "BS_CFG_ADDR"), 64)
    check_round_trip(values, RK3588, VENDOR, writes, 0, case, DPU_ONLY_ENABLE, ours)


def _twin(case: str) -> dict[tuple[str, str], int]:
    twin = {}
    for word in (int(w) for w in RUNS[f"{case}.rk3588"]):
        block = RK3588.block_for_target(word >> 48)
        register = block.register_at(word & 0xFFFF) if block else None
        if register is not None:
            twin[(block.name, register.name)] = (word >> 16) & 0xFFFFFFFF
    return twin
