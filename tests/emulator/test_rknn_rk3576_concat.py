"""Vendor rk3576 Concat copies run in the emulator (emulator/REGISTER_SEMANTICS.md 49.2): the plain copy and the
requantizing one (the BS record's ALU operand) translate, the output equals the rk3588 twin's bit for bit and the
simulator's within 1 LSB; both twin copies re-pack into the vendor's 89 words word for word and each vendor copy
translates to its twin register for register.

Committed (``tests/data/rk3576_vendor/``; rknn-toolkit2 2.5.0, int8, ``build(do_quantization=True)`` on 3 calibration
pairs ``x = RandomState(10 + i).randn(1, 16, 12, 20)``, ``z = <same>.randn(...) * 0.5``): ONNX (opset 13)
``y = Concat(Conv(x, w1), Conv(z, w2), axis=1)`` with ``w1`` [16, 16, 1, 1] = ``RandomState(1)``'s third draw x 0.3 and
``w2`` [32, 16, 1, 1] its fourth x 0.6 (after a [16, 24, 2, 2] and a [24] draw), no bias, built for rk3576
(``concat_int8``) and rk3588 (``_rk3588``); ``concat_int8_sim.npy.xz``: the simulator's output rows 0-4 on
``x = RandomState(5).randn``, ``z = <same>.randn x 0.5`` as int8 codes ``rint(y / scale) + zero_point``.
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
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.rk3576_concat import copy_specs, copy_vendor_writes, is_vendor_copy
from npuemu.isa.rknn.rk3576_dpu import pack_record
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_resize import FRAME
from npuemu.isa.words import TARGET_MARKER, TARGET_OP_ENABLE

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR, RK3588, OWN = load_regmap("rk3576_vendor"), load_regmap("rk3588"), load_regmap("rk3576")
SHAPE = (1, 16, 12, 20)


def _model(name: str):
    return load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)


def _inputs():
    rng = np.random.RandomState(5)
    x = rng.randn(*SHAPE).astype(np.float32)
    return [x, (rng.randn(*SHAPE) * 0.5).astype(np.float32)]


def _run(name: str, chip: str) -> np.ndarray:
    (_, out), = RknnRunner(_model(name), chip, (0,)).run(_inputs()).quantized.items()
    return np.asarray(out).astype(np.int64)


def test_vendor_concat_runs_bit_identically_to_its_twin_and_near_the_simulator():
    ours = _run("concat_int8", "rk3576")
    np.testing.assert_array_equal(ours, _run("concat_int8_rk3588", "rk3588"))
    sim = np.load(io.BytesIO(lzma.decompress((DATA / "concat_int8_sim.npy.xz").read_bytes()))).astype(np.int64)
    part = ours[:, :, :sim.shape[2]]
    assert np.abs(part - sim).max() <= 1 and (part == sim).mean() > 0.998
    assert len(np.unique(ours)) > 100


def _chain0(name: str):
    program = _model(name).program
    return [(program.tasks[i], program.regcmd[program.tasks[i].first_word:program.tasks[i].tail_word])
            for i in program.chains[0].tasks]


def _twin_copies() -> list[dict]:
    out = []
    for record, words in _chain0("concat_int8_rk3588"):
        if record.enable_mask != 0x18:
            continue
        values = {}
        for word in (int(w) for w in words):
            if word and word >> 48 not in (TARGET_MARKER, TARGET_OP_ENABLE):
                block = RK3588.block_for_target(word >> 48)
                values[(block.name, block.register_at(word & 0xFFFF).name)] = (word >> 16) & 0xFFFFFFFF
        out.append(values)
    return out


def _vendor_copies():
    return [read_task(words, VENDOR, "concat", record.enable_mask) for record, words in _chain0("concat_int8")
            if record.enable_mask == 0x18]


def _record(twin: dict) -> bytes | None:
    """The BS record the twin's BS stage means (the vendor's ``c_NamedByInput_BsCfg_BScfgTensor`` holds [10, 10])."""
    if twin[("DPU", "BS_CFG")] == 0x53:
        return None
    alu = twin[("DPU", "BS_ALU_CFG")]
    return pack_record(alu - (1 << 32) if alu >> 31 else alu, None, 0, 0)


def test_the_twins_copies_re_pack_into_the_vendors_word_for_word():
    copies, twins = _vendor_copies(), _twin_copies()
    assert len(copies) == len(twins) == 2 and all(is_vendor_copy(task) for task in copies)
    for task, twin in zip(copies, twins):
        writes = copy_vendor_writes(twin, OWN, "twin", _record(twin))
        assert [(block, name) for block, name, _ in writes] == FRAME
        for block, name, value in writes:
            expected = 0 if name.startswith("RSV_") else task.values[(block, name)]
            assert value == expected, (block, name, hex(value), hex(expected))


def test_the_vendors_copies_translate_to_their_twins():
    for task, twin in zip(_vendor_copies(), _twin_copies()):
        record = _record(twin) or b""
        for block, name, fields in copy_specs(task, lambda address, size: record[:size]):
            value = fields["raw"] if "raw" in fields else RK3588.register(block, name).pack(fields)
            assert value == twin.get((block, name), 0), (block, name, hex(value))


def test_a_copy_with_an_unknown_word_is_refused_by_name():
    task = _vendor_copies()[1]
    broken = type(task)(task.regmap, task.where, {**task.values, ("DPU", "ACT_CFG"): 0x902}, task.kept, task.enable)
    with pytest.raises(UnsupportedProgramError, match="DPU-only copy with DPU.ACT_CFG"):
        copy_specs(broken, lambda address, size: bytes(size))
