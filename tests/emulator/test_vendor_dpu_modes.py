"""DPU modes of the vendor's programs beyond npuemu's own (REGISTER_SEMANTICS.md 35): the channel max
(MINMAX_CTL with OFFSET_PEND, kernels/dpu_reduce.py) and the fp16 -> int16 output
(kernels/dpu_fp_to_int16.py), both first met in exSoftmax13 (rknn-fixtures-ops softmax_last_*).

Committed builds (tests/data/vendor_dpu_modes, a few KB): rknn-toolkit2 2.5.0,
``RKNN.config(target_platform='rk3588')``, ``load_onnx`` of a one-node ONNX model (opset 13, float32
input), ``build(do_quantization=False)``, ``export_rknn``, then ``xz -9``; the vendor simulator's output
(``init_runtime()``; ``inference(inputs=[x], data_format='nchw')``) saved as ``<name>_sim.npy.xz``.
The input x is ``(RandomState(7).randn(*shape) * scale)`` rounded to float16:
- cast_i16: Cast(to=INT16) on 1x16x4x8, scale 2; cast_i16w: the same model, scale 20000;
- smax_w: Softmax(axis=3) on 1x2x3x24, scale 2.
Every reference here is numpy on the input, not the emulator's code.
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import rknn_runner
from npuemu.emulator.kernels import dpu_fp_to_int16, dpu_reduce
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import EmulationError
from npuemu.isa.rknn import load_rknn
from tests.shared_data import RKNN_FIXTURES_OPS

HERE = Path(__file__).resolve().parents[1] / "data" / "vendor_dpu_modes"
BUILDS = {"cast_i16": ((1, 16, 4, 8), 2.0), "cast_i16w": ((1, 16, 4, 8), 20000.0), "smax_w": ((1, 2, 3, 24), 2.0)}


def _input(name: str) -> np.ndarray:
    shape, scale = BUILDS[name]
    return (np.random.RandomState(7).randn(*shape) * scale).astype(np.float16).astype(np.float32)


def _runner(name: str, tmp_path: Path) -> RknnRunner:
    path = tmp_path / f"{name}.rknn"
    path.write_bytes(lzma.decompress((HERE / f"{name}.rknn.xz").read_bytes()))
    return RknnRunner(load_rknn(path))


def _sim(name: str) -> np.ndarray:
    return np.load(lzma.open(HERE / f"{name}_sim.npy.xz"))


class _Kept:
    """Keeps the memory of the Machine a run builds, to read what the tasks wrote."""

    memory = None


@pytest.fixture
def kept(monkeypatch) -> _Kept:
    kept = _Kept()
    machine = rknn_runner.Machine

    def build(memory, platform):
        kept.memory = memory
        return machine(memory, platform)

    monkeypatch.setattr(rknn_runner, "Machine", build)
    return kept


# --- fp16 -> int16 ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cast_i16", "cast_i16w"])
def test_cast_to_int16_equals_the_simulator(name, tmp_path, kept):
    """The runner does not hand out int16 outputs (its own refusal, after the NPU ran); the output tensor's
    NC1HWC2 int16 atoms (8 lanes) are read from the memory the run left."""
    runner = _runner(name, tmp_path)
    with pytest.raises(EmulationError, match="int16"):
        runner.run([_input(name)])
    (y,) = runner.output_tensors
    n, c, h, w = y.shape
    raw = kept.memory.dump(runner._address(y), c * h * w * 2).view("<i2")
    got = raw.reshape(c // 8, h, w, 8).transpose(0, 3, 1, 2).reshape(n, c, h, w)
    sim = _sim(name)
    np.testing.assert_array_equal(got, sim)
    # the two readings the simulator rules out: rounding (-907.5, 0.81) and saturation (33824)
    x = _input(name)
    assert not np.array_equal(got, np.clip(np.rint(x), -32768, 32767).astype(np.int16))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=64))
def test_fp_to_int16_is_c_truncation_wrapped(values):
    data = np.array(values, np.float32).reshape(-1, 1, 1)
    expected = np.array([((int(v) + 32768) % 65536) - 32768 for v in values], np.int16).reshape(data.shape)
    np.testing.assert_array_equal(dpu_fp_to_int16.fp_to_int16(data, 1, 0, 0, 0, "t"), expected)


def test_fp_to_int16_refuses_other_out_cvt():
    with pytest.raises(EmulationError, match="CVT_ROUND=1"):
        dpu_fp_to_int16.fp_to_int16(np.zeros((1, 1, 1), np.float32), 1, 0, 0, 1, "t")


# --- exSoftmax13: the channel max, then the register reading of the whole stream ----------------
def _schraudolph_softmax(x16: np.ndarray) -> np.ndarray:
    """exSoftmax13 as its registers read [V: softmax_last task 7 BS MUL 0x65c5 = 1477 (1024 log2 e),
    BN ALU add 15300.624 = 1024 (15 - 0.058), BN ReLU, fp16 -> int16, read as fp16 bits by the sum and the
    division]: the max, x - max in fp16, exp by the int16 bit pattern, an fp32 sum rounded to fp16, e / sum."""
    x = x16.astype(np.float32)
    d = (x - x.max(-1, keepdims=True)).astype(np.float16).astype(np.float32)
    v = np.trunc(np.maximum(d * np.float32(1477.0) + np.float32(15300.624), 0)).astype(np.int16)
    e = v.view(np.float16).astype(np.float32)
    s = e.sum(-1, keepdims=True, dtype=np.float32).astype(np.float16).astype(np.float32)
    return (e / s).astype(np.float16)


@pytest.fixture
def max_writes(monkeypatch) -> list[np.ndarray]:
    """The fp16 values each MINMAX_CTL task wrote, read back from memory right after the task (later tasks
    reuse the buffer)."""
    writes: list[np.ndarray] = []
    run_reduce = dpu_reduce.run_reduce

    def recording(state, rdma, dma, where):
        run_reduce(state, rdma, dma, where)
        writes.append(dma.memory.dump(state.dst_address, 2 * state.width).view("<f2").copy())

    monkeypatch.setattr(dpu_reduce, "run_reduce", recording)
    return writes


def test_channel_max_is_every_rows_max(tmp_path, max_writes):
    """smax_w: the max tasks write one fp16 per softmax row, the exact max of the row [V: the only reading that
    makes the stream a softmax on a wide input: with another value exp overflows]."""
    runner = _runner("smax_w", tmp_path)
    x = np.random.RandomState(3).randn(*BUILDS["smax_w"][0]).astype(np.float32) * 30
    run = runner.run([x])
    x16 = x.astype(np.float16)
    np.testing.assert_array_equal(np.concatenate(max_writes), x16.max(-1).reshape(-1))
    (y,) = run.quantized.values()
    np.testing.assert_array_equal(y, _schraudolph_softmax(x16))


def test_softmax_build_against_the_simulator(tmp_path):
    """The simulator's exSoftmax13 computes an exact exp (its log-ratios follow x - max to 4e-4 with no
    pattern in the fraction of x log2 e), where the registers give the bit-pattern exp (6 % relative error, 0.058
    RMS correction in BN_ALU): the run is the register reading bit for bit and within 0.0108 of the simulator
    (measured 0.01074; onnxruntime vs simulator 1.1e-4)."""
    runner = _runner("smax_w", tmp_path)
    x = _input("smax_w")
    (y,) = runner.run([x]).quantized.values()
    np.testing.assert_array_equal(y, _schraudolph_softmax(x.astype(np.float16)))
    err = np.abs(y.astype(np.float64) - _sim("smax_w"))
    assert err.max() <= 0.0108, err.max()


#: measured max |emu - sim| on input_0 (the register reading's gap, above): 0.0083 for both builds
SOFTMAX_FIXTURES = {"softmax_last_fp16": 0.0084, "softmax_last_int8": 0.0084}


@pytest.mark.parametrize("case", sorted(SOFTMAX_FIXTURES))
def test_softmax_fixture_runs(case):
    folder = RKNN_FIXTURES_OPS / case
    x = np.load(lzma.open(folder / "input_0.npy.xz"))
    run = RknnRunner(load_rknn(folder / "model.rknn")).run([x])
    (out,) = run.outputs.values()
    sim = np.load(lzma.open(folder / "sim_output_0.npy.xz")).reshape(out.shape)
    np.testing.assert_array_equal(out, _schraudolph_softmax(x.astype(np.float16)).astype(np.float32))
    assert np.abs(out.astype(np.float64) - sim).max() <= SOFTMAX_FIXTURES[case]
    assert json.loads((folder / "meta.json").read_text())["case"] == "softmax_last"


# --- OFFSET_PEND without MINMAX_CTL: the padding channels' value --------------------------------
def test_exmatmul_pad_channel_holds_the_zero_point(monkeypatch):
    """matmul_act_int8's exMatMul copies each head of q (15 channels) into 16-lane atoms with OFFSET_PEND -3, q's
    zero point: lanes 0-14 are the quantised q rows, lane 15 is -3 (the pad the next conv's input converter,
    CVT_OFFSET +3, turns into 0). The run then goes through that converter (REGISTER_SEMANTICS 36)."""
    folder = RKNN_FIXTURES_OPS / "matmul_act_int8"
    copies: list[np.ndarray] = []
    fill = dpu_reduce.fill_pending

    def recording(state, dma):
        fill(state, dma)
        copies.append(dma.memory.dump(state.dst_address, state.width * 16).view(np.int8).reshape(state.width, 16))

    monkeypatch.setattr(dpu_reduce, "fill_pending", recording)
    runner = RknnRunner(load_rknn(folder / "model.rknn"))
    inputs = [np.load(lzma.open(folder / f"input_0_{n}.npy.xz")) for n in ("q", "kt")]
    runner.run(inputs)
    q = runner.quantize_input(0, inputs[0])
    assert tuple(runner.input_tensors[0].zero_points) == (-3,)
    assert len(copies) == 8
    for head, atoms in enumerate(copies):
        np.testing.assert_array_equal(atoms[:, :15], q[0, head])
        assert (atoms[:, 15] == -3).all()


def _reduce_state(**changes) -> SimpleNamespace:
    """What the checks read of a DpuState: softmax_last task 2's values unless changed."""
    stage = SimpleNamespace(bypass=True)
    base = dict(minmax_ctl=7, offset_pend=0xFBFF, in_precision=2, proc_precision=2, out_precision=2, bs=stage, bn=stage,
                ew=stage, out_cvt=SimpleNamespace(scale=1, shift=0, offset=0), height=1, transpose=None, flying=True,
                channels=16, orig_channels=15, atom_bytes=16, pixel_step=0)
    base.update(changes)
    return SimpleNamespace(**base)


@pytest.mark.parametrize("changes, register", [
    ({"minmax_ctl": 5}, r"MINMAX_CTL=5 with this value"),
    ({"out_precision": 1}, r"MINMAX_CTL=7 with IN/PROC/OUT_PRECISION"),
    ({"bs": SimpleNamespace(bypass=False)}, r"MINMAX_CTL=7 with a BS/BN/EW stage"),
    ({"height": 2}, r"MINMAX_CTL=7 with DATA_CUBE_HEIGHT.HEIGHT"),
])
def test_other_reductions_are_refused_by_name(changes, register):
    dpu_reduce.check_reduce(_reduce_state(), "t")   # the vendor's form passes
    with pytest.raises(EmulationError, match=register):
        dpu_reduce.check_reduce(_reduce_state(**changes), "t")


@pytest.mark.parametrize("changes", [{"in_precision": 2, "proc_precision": 2, "out_precision": 2},
                                     {"orig_channels": 16}, {"orig_channels": 1, "channels": 32},
                                     {"ew": SimpleNamespace(bypass=False)}])
def test_offset_pend_outside_the_pad_form_is_refused(changes):
    int8 = {"minmax_ctl": 0, "offset_pend": 0xFFFD, "in_precision": 0, "proc_precision": 0, "out_precision": 0}
    dpu_reduce.check_pending(_reduce_state(**int8), "t")
    with pytest.raises(EmulationError, match=r"OFFSET_PEND=65533 is modelled only"):
        dpu_reduce.check_pending(_reduce_state(**{**int8, **changes}), "t")



def test_a_nan_channel_max_is_stored_as_the_canonical_nan(tmp_path, monkeypatch):
    """The fp16 channel max of pixels whose channels hold NaNs of both signs and several payloads (placed in the
    MRDMA's source right before each max task) stores the canonical NaN 0x7E00 (NUMERICS.md 37: the DPU's stores
    in default-NaN mode); the other pixels keep their max."""
    nans = np.array([0x7E01, 0xFE2A, 0x7D55], np.uint16)
    writes: list[np.ndarray] = []
    run_reduce = dpu_reduce.run_reduce

    def poisoned(state, rdma, dma, where):
        dma.memory.load(rdma.src_address, nans.view(np.uint8))  # (surface 0: pixel 0's lanes 0-2)
        run_reduce(state, rdma, dma, where)
        writes.append(dma.memory.dump(state.dst_address, 2 * state.width).view("<u2").copy())

    monkeypatch.setattr(dpu_reduce, "run_reduce", poisoned)
    runner = _runner("smax_w", tmp_path)
    runner.run([np.random.RandomState(5).randn(*BUILDS["smax_w"][0]).astype(np.float32)])
    assert writes
    for written in writes:
        assert written[0] == 0x7E00
        assert not np.isnan(written[1:].view(np.float16)).any()
