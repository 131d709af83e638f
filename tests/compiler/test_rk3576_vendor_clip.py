"""A conv with a Clip whose lower bound is not 0 in the vendor's rk3576 layout, both ways (isa/rknn/rk3576_clip.py;
emulator/REGISTER_SEMANTICS.md 46.5, compiler/LOWERING.md 46.3).

References: the vendor itself. ``tests/data/rk3576_vendor/clip_pair.npz.xz``: Conv 3x3 16 -> 16 pad 1 on 12 x 12 +
Clip(-1, 2) (weights ``RandomState(1).randn * sqrt(2 / 144)``, bias ``* 0.1``), built by rknn-toolkit2 2.5.0 int8 (3
calibration samples ``RandomState(0).randn(1, 16, 12, 12)``) for rk3576 and rk3588: the conv task of chain 0 of each
(clip.rk3576, 139 words; clip.rk3588, 126) and the 64 bytes of ``y_BnCfg_BNcfgTensor`` (clip.bn).
"""

from __future__ import annotations

import io
import lzma

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn.rk3576_clip import clip_record
from npuemu.isa.rknn.rk3576_layout import read_task
from npuemu.isa.rknn.rk3576_pack import check_round_trip, vendor_writes
from npuemu.isa.rknn.rk3576_program import translate_task
from npuemu.isa.words import encode_write
from tests.compiler.test_rk3576_vendor_emit import DATA, RK3588, SHIFT, VENDOR, _values, conv_model
from tests.compiler.test_rk3576_vendor_forms import _same, _with

with lzma.open(DATA / "clip_pair.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    PAIR = {name: _archive[name] for name in _archive.files}


def _signed(value: int) -> int:
    return value - (1 << 32) if value >> 31 else value


def _as_npuemu_writes_it(twin):
    """The twin's Clip (BN add -L, ReLU, ReLU-X H - L, EW add L) in npuemu's arrangement (BN max L, ReLU-X H),
    written here from the twin's own numbers: L = EW_OP_VALUE_0, H = BN_RELUX_CMP_VALUE + L."""
    low = _signed(twin[("DPU", "EW_OP_VALUE_0")])
    assert -low == twin[("DPU", "BN_ALU_CFG")]
    values = {**twin, ("DPU", "BN_CFG"): 0xD0, ("DPU", "BN_ALU_CFG"): low & 0xFFFFFFFF,
              ("DPU", "BN_RELUX_CMP_VALUE"): twin[("DPU", "BN_RELUX_CMP_VALUE")] + low, ("DPU", "EW_CFG"): 0x383,
              **{("DPU", f"EW_OP_VALUE_{i}"): 0 for i in range(8)}}   # the twin writes L into all eight
    values.update({(block, "S_POINTER"): twin[("DPU", "S_POINTER")] for block in ("CNA", "CORE")})
    return values, low


def test_clip_repacks_to_the_vendors_words_and_record():
    ours, low = _as_npuemu_writes_it(_values(PAIR["clip.rk3588"], RK3588))
    writes = vendor_writes(ours, RK3588, shift_address=0, where="clip", clip=0)
    assert [encode_write(VENDOR, b, n, v) for b, n, v in writes] == [int(w) for w in PAIR["clip.rk3576"]]
    high = _signed(ours[("DPU", "BN_RELUX_CMP_VALUE")])
    assert clip_record((low, high)) == PAIR["clip.bn"].tobytes()
    check_round_trip(ours, RK3588, VENDOR, writes, SHIFT, "clip", record=clip_record((low, high)))


def test_vendor_clip_translates_to_its_twin():
    record = PAIR["clip.bn"].tobytes()
    task = read_task(PAIR["clip.rk3576"], VENDOR, "clip")
    ours = {(b, n): v for b, n, v in translate_task(
        task, RK3588, lambda address, size: (record if size == 64 else SHIFT.to_bytes(2, "little"))[:size])}
    twin = _values(PAIR["clip.rk3588"], RK3588)
    assert {key for key in set(ours) & set(twin) if ours[key] != twin[key]} == {("CNA", "CONV_CON2")}


def test_a_record_the_form_does_not_hold_is_refused():
    task = read_task(PAIR["clip.rk3576"], VENDOR, "clip")
    record = bytearray(PAIR["clip.bn"].tobytes())
    record[16] ^= 1   # the two ALU entries differ
    with pytest.raises(UnsupportedProgramError, match="Clip task with NRDMA_CFG"):
        translate_task(task, RK3588, lambda address, size: (bytes(record) if size == 64 else bytes(2))[:size])


def clip_model(low, high, kernel=(3, 3), cout=16):
    model = conv_model(16, cout, (12, 20), kernel, (1, 1), (kernel[0] // 2, kernel[1] // 2) * 2)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(low, np.float32), "lo"),
                                    numpy_helper.from_array(np.array(high, np.float32), "hi")])
    return _with(model, helper.make_node("Clip", ["t", "lo", "hi"], ["y"]))


@pytest.mark.parametrize("low, high, kernel, cout", [(-1.0, 2.0, (3, 3), 16), (-0.5, 0.7, (1, 1), 40),
                                                     (0.3, 4.0, (3, 3), 32), (-3.0, -0.2, (3, 3), 16)])
def test_own_clip_build_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, low, high, kernel, cout):
    """Inputs past the calibrated range too (``_same``): both bounds cut."""
    _same(clip_model(low, high, kernel, cout), 16, monkeypatch)
