"""The vendor's rk3576 DataConvert tasks (emulator/REGISTER_SEMANTICS.md 55, isa/rknn/rk3576_convert.py).

Committed (``tests/data/rk3576_vendor/``; rknn-toolkit2 2.5.0 hybrid builds, ``hybrid_quantization_step1(custom_hybrid=
[['a', 'b']])`` then step 2 on the written config, 3 calibration inputs ``RandomState(10 + i).randn(1, 24, 3, 10)``):
ONNX (opset 13) x -> Conv1x1 a -> Conv1x1 b -> Conv1x1 y, 24 channels on 3 x 10, weights ``RandomState(1)``'s draws
(``randn(24, 24, 1, 1) / sqrt(24)``, then ``randn(24) x 0.1`` as bias, per conv), b in float16: built for rk3576
(``convert24_hybrid``) and rk3588 (``_rk3588``). Each holds an int8 -> fp16 and an fp16 -> int8 exDataConvert task.

Checked: each vendor convert translates to its twin register for register; npuemu's own converts (lowered for rk3576)
re-pack into the vendor frame and run, translated back, bit-exact against test_data_convert_npu's numpy reference of
the registers; unknown words are refused by name.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler.lower import Quant, feature_bytes, lower_layer
from npuemu.compiler.lower.lower_convert import ConvertLayer
from npuemu.compiler.memory_plan import TensorLifetime, plan_memory, regcmd_bytes
from npuemu.emulator.machine import Machine
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_convert import (
    as_the_vendor_groups_it, convert_records, convert_specs, convert_vendor_writes, is_vendor_convert,
)
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_program import translate_task
from npuemu.isa.rknn.rk3576_resize import FRAME
from npuemu.isa.task import Chain, RegisterWrite, Task
from npuemu.isa.words import TARGET_MARKER, TARGET_OP_ENABLE, encode_word
from npuemu.platforms import load_platform
from tests.isa.test_rk3576_vendor_resize import _program  # (chain 0's tasks with their words)
from tests.compiler.test_data_convert_npu import _from_native, _native, reference_convert

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR, RK3588, OWN = load_regmap("rk3576_vendor"), load_regmap("rk3588"), load_regmap("rk3576")
PLATFORM = load_platform("rk3576")
NUMPY = {"int8": np.int8, "float16": np.float16}
BS_AT, BN_AT = 0x1000, 0x2000     # where the tests put the records (the stored file's addresses are 0 until relocated)


def _model(name: str):
    return load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)


def _twins() -> list[dict]:
    out = []
    for record, words in _program("convert24_hybrid_rk3588"):
        if record.enable_mask == 0x18:
            values = {}
            for word in (int(w) for w in words):
                if word and word >> 48 not in (TARGET_MARKER, TARGET_OP_ENABLE):
                    block = RK3588.block_for_target(word >> 48)
                    values[(block.name, block.register_at(word & 0xFFFF).name)] = (word >> 16) & 0xFFFFFFFF
            out.append(values)
    return out


def _vendor() -> list:
    """The vendor's two converts with their records moved to BS_AT / BN_AT, and a reader of them."""
    model = _model("convert24_hybrid")
    blobs = {tensor.name: bytes(model.blobs[tensor.blob_index]) for tensor in model.tensors if tensor.blob_index is not None}
    out = []
    for (record, words), records in zip([t for t in _program("convert24_hybrid") if t[0].enable_mask == 0x18],
                                        [(None, "a__float16_BnCfg_BNcfgTensor"),
                                         ("b__int8_BsCfg_BScfgTensor", "b__int8_BnCfg_BNcfgTensor")]):
        task = read_task(words, VENDOR, "convert", record.enable_mask)
        task = type(task)(task.regmap, task.where, {**task.values, ("DPU_RDMA", "BS_CFG_ADDR"): BS_AT if records[0] else 0,
                                                    ("DPU_RDMA", "ADDR_5030"): BN_AT}, task.kept, task.enable)
        memory = {BN_AT: blobs[records[1]], **({BS_AT: blobs[records[0]]} if records[0] else {})}
        out.append((task, lambda address, size, memory=memory: memory[address][:size]))
    return out


def test_the_vendors_converts_translate_to_their_twins_register_for_register():
    vendor, twins = _vendor(), _twins()
    assert len(vendor) == len(twins) == 2
    for (task, read), twin in zip(vendor, twins):
        assert is_vendor_convert(task)
        for block, name, fields in convert_specs(task, read):
            value = fields["raw"] if "raw" in fields else RK3588.register(block, name).pack(fields)
            if not name.endswith("_ADDR"):
                assert value == twin.get((block, name), 0), (block, name, hex(value), hex(twin.get((block, name), 0)))


def test_the_vendor_words_are_the_documented_ones():
    (to_fp16, _), (to_int8, _) = _vendor()
    assert [to_fp16.raw("DPU", n) for n in ("CFG_4038", "BS_MODE", "BS_OW_CFG", "ACT_CFG")] == [0x53, 2, 0x21111, 0x920]
    assert [to_int8.raw("DPU", n) for n in ("CFG_4038", "BS_MODE", "BS_OW_CFG", "ACT_CFG")] == [0x52, 2, 0, 0x920]
    assert [to_fp16.raw("DPU_RDMA", n) for n in ("BRDMA_CFG", "NRDMA_CFG", "ERDMA_CFG", "FEATURE_MODE_CFG")] == [
        0, 0x2, 0x41, 0x9]
    assert [to_int8.raw("DPU_RDMA", n) for n in ("BRDMA_CFG", "NRDMA_CFG", "ERDMA_CFG", "FEATURE_MODE_CFG")] == [
        0x8, 0x2, 0x40000048, 0x10149]


@pytest.mark.parametrize("index, word, value", [(0, ("DPU", "ACT_CFG"), 0x902), (1, ("DPU_RDMA", "BRDMA_CFG"), 0x1a),
                                                (0, ("DPU", "BS_OW_CFG"), 0x21011), (1, ("DPU", "CFG_4038"), 0x53),
                                                (1, ("DPU", "CLAMP2_MIN"), 0)])
def test_a_convert_with_an_unknown_word_is_refused_by_name(index, word, value):
    task, read = _vendor()[index]
    broken = type(task)(task.regmap, task.where, {**task.values, word: value}, task.kept, task.enable)
    with pytest.raises(UnsupportedProgramError, match=f"DataConvert with .*{word[1].split('_MIN')[0]}"):
        convert_specs(broken, read)


def test_a_record_the_builds_do_not_hold_is_refused():
    task, read = _vendor()[1]
    with pytest.raises(UnsupportedProgramError, match="record"):
        convert_specs(task, lambda address, size: (b"\x01" + bytes(15) + b"\x02" + bytes(47)) if address == BN_AT
                      else read(address, size))   # ALU entries that differ


# --- npuemu's own converts --------------------------------------------------------------------------------------


def _lowered(layer: ConvertLayer):
    dtypes = {layer.input: layer.source_dtype, layer.output: layer.to}
    lifetimes = [TensorLifetime(name, feature_bytes(layer.shape, dtype, PLATFORM),
                                kind="output" if name == layer.output else "input") for name, dtype in dtypes.items()]

    def lower(plan):
        placements = {name: plan.feature(name, layer.shape, dtype, PLATFORM) for name, dtype in dtypes.items()}
        return placements, lower_layer(layer, placements, PLATFORM, OWN)

    _, first = lower(plan_memory({}, lifetimes))
    plan = plan_memory({}, lifetimes, regcmd_bytes(first.tasks) + 4096)
    placements, lowered = lower(plan)
    return plan, placements, lowered.tasks[0]


def _through_the_vendor_layout(task: Task, records_at: int) -> tuple[Task, bytes]:
    """The task packed in the vendor frame and translated back; the records' bytes (placed at ``records_at``)."""
    values = {(w.block, w.register): w.value for w in task.writes}
    grouped = as_the_vendor_groups_it(values, OWN)
    bs, bn = convert_records(grouped, OWN)
    writes = convert_vendor_writes(grouped, OWN, "own", (records_at, records_at + 64))
    assert [(block, name) for block, name, _ in writes] == FRAME
    memory = {records_at: bs or bytes(64), records_at + 64: bn}
    words = [encode_word(VENDOR.block(block).target, value, VENDOR.register(block, name).offset)
             for block, name, value in writes]
    back = translate_task(read_task(words, VENDOR, "own", 0x18), OWN, lambda address, size: memory[address][:size],
                          own_build=True)
    for key, value in grouped.items():
        if key[1] not in ("S_POINTER", "WEIGHT"):
            assert dict(((b, n), v) for b, n, v in back).get(key, 0) == value, (key, hex(value))
    return Task(tuple(RegisterWrite(b, n, v) for b, n, v in back), 0x18), (bs or bytes(64)) + bn


def _run(layer: ConvertLayer, x: np.ndarray, vendor: bool) -> np.ndarray:
    plan, placements, task = _lowered(layer)
    regcmd = plan["regcmd"]
    records_at = regcmd.address + regcmd.size - 4096
    records = b""
    if vendor:
        task, records = _through_the_vendor_layout(task, records_at)
    chain = encode_chain(Chain((task,)), OWN, base_addr=regcmd.address, scale=PLATFORM.pc.data_amount_scale)
    machine = Machine.for_platform("rk3576", ddr_size=plan.end + (1 << 16))
    machine.memory.load(placements[layer.input].address, _native(x, placements[layer.input]).view(np.uint8))
    machine.memory.load(regcmd.address, chain.data)
    if records:
        machine.memory.load(records_at, np.frombuffer(records, np.uint8))
    machine.run_chain(regcmd.address, chain.first_amount)
    out = placements[layer.output]
    return _from_native(machine.memory.dump(out.address, out.size).view(NUMPY[layer.to]), out)


@settings(max_examples=12, deadline=None)
@given(scale=st.floats(1e-3, 4.0), zero_point=st.integers(-128, 127), to=st.sampled_from(["int8", "float16"]),
       channels=st.sampled_from([8, 16, 24, 40, 128]), height=st.integers(1, 3), width=st.integers(1, 12),
       seed=st.integers(0, 2 ** 16))
def test_own_converts_run_through_the_vendor_layout_bit_exactly(scale, zero_point, to, channels, height, width, seed):
    layer = ConvertLayer("convert", "x", "y", (channels, height, width), Quant(scale, zero_point), to)
    rng = np.random.default_rng(seed)
    if to == "float16":
        x = rng.integers(-128, 128, size=layer.shape).astype(np.int8)
    else:
        x = ((rng.random(layer.shape) * 400 - 200) * scale).astype(np.float16)
    got = _run(layer, x, vendor=True)
    want = reference_convert(x, layer)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.array_equal(got.view(np.uint8), _run(layer, x, vendor=False).view(np.uint8))
