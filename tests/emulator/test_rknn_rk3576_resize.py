"""Vendor rk3576 Resize files run in the emulator (emulator/REGISTER_SEMANTICS.md 49): the clear convs and the
unpooling copies (delta tasks on the clear conv's register group) translate, and the output equals the rk3588
twin's bit for bit, the nearest-neighbour repeat of the quantized input (a numpy reference) and the simulator.

Committed vendor files (``tests/data/rk3576_vendor/``; rknn-toolkit2 2.5.0, ``config(target_platform=...)``, one
ONNX ``y = Resize(x, scales=[1, 1, f, f], mode="nearest", coordinate_transformation_mode="asymmetric",
nearest_mode="floor")``, opset 13, built for rk3576 and for rk3588 (``_rk3588``); int8 with
``build(do_quantization=True)`` on 3 calibration inputs ``RandomState(10 + i).randn(shape)``, fp16 without):
``resize2_int8`` x [1, 16, 12, 20] f 2, ``resize4_int8`` x [1, 48, 6, 10] f 4, ``resize2_fp16`` x [1, 16, 12, 20]
f 2; ``resize2_int8_sim.npy.xz``: the simulator's output of ``resize2_int8.rknn`` (``init_runtime(); inference``,
nchw) on ``RandomState(5).randn(1, 16, 12, 20)`` as int8 codes ``rint(y / scale) + zero_point`` (the file's).
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
CASES = {"resize2_int8": ((1, 16, 12, 20), 2), "resize4_int8": ((1, 48, 6, 10), 4),
         "resize2_fp16": ((1, 16, 12, 20), 2)}


def _model(name: str):
    return load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)


def _input(shape) -> np.ndarray:
    return np.random.RandomState(5).randn(*shape).astype(np.float32)


def _run(name: str, chip: str, x: np.ndarray) -> np.ndarray:
    result = RknnRunner(_model(name), chip, (0,)).run([x])
    (_, out), = (result.quantized or result.outputs).items()
    return np.asarray(out)


def _nearest(values: np.ndarray, factor: int) -> np.ndarray:
    return values.repeat(factor, axis=2).repeat(factor, axis=3)


@pytest.mark.parametrize("name", CASES)
def test_vendor_resize_runs_bit_identically_to_its_rk3588_twin(name):
    shape, factor = CASES[name]
    x = _input(shape)
    ours = _run(name, "rk3576", x)
    np.testing.assert_array_equal(ours, _run(f"{name}_rk3588", "rk3588", x))
    if name.endswith("int8"):   # the copy of the quantized input, repeated
        tensor = _model(name).tensor("x")
        codes = np.clip(np.rint(x / tensor.scales[0]) + tensor.zero_points[0], -128, 127)
        np.testing.assert_array_equal(ours.astype(np.int64), _nearest(codes.astype(np.int64), factor))
    else:
        np.testing.assert_array_equal(np.asarray(ours, np.float16), _nearest(x.astype(np.float16), factor))


def test_vendor_resize_equals_the_simulator():
    ours = _run("resize2_int8", "rk3576", _input(CASES["resize2_int8"][0]))
    sim = np.load(io.BytesIO(lzma.decompress((DATA / "resize2_int8_sim.npy.xz").read_bytes())))
    np.testing.assert_array_equal(ours.astype(np.int64), sim.astype(np.int64))


def test_vendor_resize_program_holds_clear_convs_and_delta_copies():
    """The form the translation reads: chain 0 is clear, clear, one copy per surface (later ones deltas), clear,
    clear (REGISTER_SEMANTICS.md 49)."""
    program = _model("resize4_int8").program
    tasks = [program.tasks[i] for i in program.chains[0].tasks]
    assert [(t.enable_mask, t.regcfg_amount) for t in tasks] == [
        (0x1D, 139), (0x1D, 139), (0x18, 30), (0x18, 30), (0x18, 11), (0x1D, 139), (0x1D, 139)]


def test_a_copy_with_an_unknown_word_is_refused_by_name():
    """OUT_CVT_SHIFT (DPU 0x40B4) 1 in the first copy: not the decoded form."""
    model = _model("resize2_int8")
    regcmd = np.array(model.program.regcmd)
    first = model.program.tasks[2].first_word
    index = next(i for i in range(first, first + 30) if int(regcmd[i]) & 0xFFFF == 0x40B4)
    regcmd[index] = np.uint64(int(regcmd[index]) | 1 << 16)
    program = type(model.program)(regcmd, model.program.tasks, model.program.chains, model.program.tails,
                                  model.program.regcmd_tensor, model.program.task_tensor)
    broken = type(model)(**{**{f: getattr(model, f) for f in model.__dataclass_fields__}, "program": program})
    with pytest.raises(UnsupportedProgramError, match="unpooling copy with .*OUT_CVT"):
        RknnRunner(broken, "rk3576", (0,)).run([_input(CASES["resize2_int8"][0])])
