"""Vendor rk3576 ``.rknn`` files with the forms of emulator/REGISTER_SEMANTICS.md 41 run on the emulator:
an fp16 depthwise conv with Relu6 and an int8 PPU max pool, translated into RK3588 positions.

``tests/data/rk3576_vendor/dw80_f16.rknn.xz``: rknn-toolkit2 2.5.0, ``target_platform="rk3576"``,
``build(do_quantization=False)`` of ONNX depthwise Conv 80 -> 80 (group 80) 3x3 pad 1 on 10 x 12 then
Clip(0, 6). ``mp.rknn.xz``: the same toolkit, int8 (3 calibration inputs ``RandomState(0).randn``) of
Conv 16 -> 16 3x3 pad 1 on 12 x 20 then MaxPool 3x3 stride 2 pad 1 (record 1 is a PPU task).
``forms_runs.npz.xz``: the vendor simulator's output (``init_runtime(); inference``) on the input
``2 * RandomState(0).randn(shape)`` (float32): ``mp.sim`` the int8 codes ``rint(y / scale) + zp``,
``dw80_f16.sim`` the fp16 values of channels 0-7 and 72-79 (both 64-channel groups).
The emulated rk3588 twins of both (not committed) give outputs identical to these runs.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn import load_rknn

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
with lzma.open(DATA / "forms_runs.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    RUNS = {name: _archive[name] for name in _archive.files}


def _model(name: str):
    return load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)


def _run(model, shape):
    x = np.random.RandomState(0).randn(*shape).astype(np.float32) * 2
    run = RknnRunner(model, "rk3576", (0,)).run([x])
    (_, out), = run.quantized.items()
    return np.asarray(out)


def test_fp16_depthwise_relu6_runs_within_one_fp16_step_of_the_simulator():
    """measured: 80 % identical, the rest one fp16 step (|y| <= 6: at most 2^-8) - the emulator's fp16
    depthwise accumulation order, the same on the emulated rk3588 twin."""
    out = _run(_model("dw80_f16"), (1, 80, 10, 12)).astype(np.float32).reshape(1, 80, 10, 12)
    ours = np.concatenate([out[:, :8], out[:, 72:]], 1)
    sim = RUNS["dw80_f16.sim"].astype(np.float32)
    assert np.abs(ours - sim).max() <= 2.0 ** -8
    assert np.mean(ours == sim) > 0.75
    assert ours.max() == 6.0 and ours.min() == 0.0   # the Relu6 bound in CLAMP2/3 applies


def test_int8_max_pool_runs_within_one_lsb_of_the_simulator():
    """measured: 99.8 % identical, 1 LSB otherwise (the conv's requantization, as in 10.3)."""
    ours = _run(_model("mp"), (1, 16, 12, 20)).astype(np.int64).ravel()
    sim = RUNS["mp.sim"].astype(np.int64).ravel()
    assert np.abs(ours - sim).max() <= 1
    assert np.mean(ours == sim) > 0.99


def test_a_max_pool_with_unseen_pad_words_is_refused_by_name():
    """The PPU task's pad words must be the lowest value four times; anything else names the task."""
    data = bytearray(lzma.decompress((DATA / "mp.rknn.xz").read_bytes()))
    model = load_rknn(bytes(data), "mp")
    record = model.program.tasks[model.program.chains[0].tasks[1]]
    words = model.program.regcmd
    index = next(i for i in range(record.regcmd_addr // 8, record.regcmd_addr // 8 + record.regcfg_amount)
                 if int(words[i]) & 0xFFFF == 0x604C)
    position = data.find(int(words[index]).to_bytes(8, "little"))
    assert position > 0
    data[position + 2:position + 6] = (5).to_bytes(4, "little")
    with pytest.raises(UnsupportedProgramError, match="pad words"):
        RknnRunner(load_rknn(bytes(data), "mp"), "rk3576", (0,))
