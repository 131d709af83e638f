"""The DPU's and PPU's canonical NaN (NUMERICS.md 37, default-NaN mode): every NaN they store in a float
format is that format's canonical NaN - fp16 0x7E00, bf16 0x7FC0, fp32 0x7FC00000 - whatever NaNs met in
the chain (inf - inf, inf x 0, NaN x NaN, a NaN operand against a NaN input) and whatever payload a NaN
read from memory had. The store kernels against references written here (numpy's rounding, NaN ->
the canonical pattern), the shared conversion left as it was, and fp16 programs compiled end to end
(BS bias, BN scales, EW operands from memory, the LUT, ReLU, PPU pools) fed NaNs of both signs and many
payloads and infinities: every NaN output is 0x7E00 (read back as 0x7FC00000), on this host and in
subprocesses compiled for ``NUMBA_CPU_NAME=haswell`` (no AVX-512) and ``generic`` (no F16C)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.emulator.kernels import PoolConfig, pool_nc1hwc2
from npuemu.emulator.kernels.dpu import out_cvt_fp16
from npuemu.emulator.kernels.dpu_bf16 import fp32_to_bf16_bits
from npuemu.emulator.kernels.dpu_fp_chain import FloatChain
from npuemu.emulator.kernels.fp16 import fp32_to_fp16, fp32_to_fp16_canonical
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms

ROOT = Path(__file__).resolve().parents[2]
CANONICAL16, CANONICAL32, CANONICAL_BF16 = 0x7E00, 0x7FC00000, 0x7FC0
#: fp32 NaNs of both signs, quiet and signalling, several payloads (x86's default NaN among them)
NANS32 = np.array([0x7FC00001, 0xFFC00000, 0x7F800001, 0xFFFFFFFF, 0x7FD55555, 0xFF812345, 0x7FC02000],
                  np.uint32)
#: fp16 NaNs of both signs, quiet and signalling, several payloads
NANS16 = np.array([0x7E01, 0xFE2A, 0x7D55, 0xFC01, 0x7FFF, 0xFFFF, 0xFE00], np.uint16)


def nan_rich32(rng, shape, share=0.3):
    """float32 bits: NaNs of NANS32, +-inf, zeros and normal values."""
    bits = rng.normal(size=shape).astype(np.float32).view(np.uint32)
    pick = rng.random(shape)
    bits[pick < share] = rng.choice(NANS32, int((pick < share).sum()))
    bits[(pick >= share) & (pick < share + 0.1)] = 0x7F800000
    bits[(pick >= share + 0.1) & (pick < share + 0.2)] = 0xFF800000
    return bits


def reference_half(bits):
    """fp16 bits of fp32 ``bits``: numpy's round to nearest even through float64, NaN -> 0x7E00."""
    singles = bits.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        halves = singles.astype(np.float64).astype(np.float16).view(np.uint16).copy()
    halves[np.isnan(singles)] = CANONICAL16
    return halves


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20), st.integers(1, 40), st.integers(1, 40), st.sampled_from([8, 16]), st.integers(0, 2**32 - 1))
def test_the_atom_store_and_the_conversions_store_every_nan_canonical(channels, height, width, c2, seed):
    rng = np.random.default_rng(seed)
    bits = nan_rich32(rng, (channels, height, width))
    want = reference_half(bits)
    # the atom store (both loops: rows narrower and wider than _WIDE_ROW), rows in order
    surfaces = -(-channels // c2)
    offsets = np.arange(surfaces * height, dtype=np.int64) * width * c2
    data = np.full(offsets.size * width * c2, 0xABCD, np.uint16)
    planes_to_fp16_atoms(bits, c2, offsets, data)
    padded = np.zeros((surfaces * c2, height, width), np.uint16)
    padded[:channels] = want
    expected = padded.reshape(surfaces, c2, height, width).transpose(0, 2, 3, 1).reshape(-1)
    assert np.array_equal(data, expected)
    # OUT_CVT's fp16 conversion (the unit path), the canonical variant, bf16
    assert np.array_equal(out_cvt_fp16(bits.view(np.float32)).view(np.uint16), want)
    assert np.array_equal(fp32_to_fp16_canonical(bits.view(np.float32)).view(np.uint16), want)
    bf16 = fp32_to_bf16_bits(bits.view(np.float32))
    nan = np.isnan(bits.view(np.float32))
    assert (bf16[nan] == CANONICAL_BF16).all() and not np.isnan(bf16[~nan].astype(np.uint32) << 16).any()


def test_the_shared_conversion_keeps_its_nan_payloads():
    # (the input quantisation and host ops use fp32_to_fp16: sign and payload top kept, NUMERICS.md 7)
    halves = fp32_to_fp16(NANS32.view(np.float32)).view(np.uint16)
    assert halves.tolist() == [0x7E00, 0xFE00, 0x7E00, 0xFFFF, 0x7EAA, 0xFE09, 0x7E01]


@pytest.mark.parametrize("stages", ["none", "x", "ew"])
def test_the_chain_result_holds_canonical_nans_only(stages):
    """The fp32 outputs' rule: ``FloatChain.result`` (the unit path's stages) hands back canonical NaNs,
    a pass-through cube included; inf - inf and inf x 0 inside the chain too."""
    from npuemu.emulator.kernels import EwConfig, XStageConfig

    rng = np.random.default_rng(4)
    data = nan_rich32(rng, (5, 3, 7)).view(np.float32)
    chain = FloatChain(data)
    if stages == "x":  # ALU + inf, MUL x 0: inf - inf and inf x 0 as well as the NaNs from memory
        chain.x_stage(XStageConfig(alu_enable=True, mul_enable=True), alu=np.float32(-np.inf), mul=np.float32(0))
    elif stages == "ew":
        chain.ew(EwConfig(op_enable=True), nan_rich32(rng, (5, 3, 7)).view(np.float32))
    out = chain.result()
    nan = np.isnan(out)
    assert nan.any() and (out.view(np.uint32)[nan] == CANONICAL32).all()


@pytest.mark.parametrize("method", [0, 1, 2])
def test_fp16_pools_store_canonical_nans(method):
    rng = np.random.default_rng(method)
    feature = rng.normal(size=(2, 6, 6, 8)).astype(np.float16)
    bits, pick = feature.view(np.uint16), rng.random(feature.shape)
    bits[pick < 0.2] = rng.choice(NANS16, int((pick < 0.2).sum()))
    infinite = (pick >= 0.2) & (pick < 0.3)
    bits[infinite] = rng.choice(np.array([0x7C00, 0xFC00], np.uint16), int(infinite.sum()))
    config = PoolConfig(method=method, kernel_h=2, kernel_w=2, stride_y=2, stride_x=2, out_h=3, out_w=3,
                        recip_kernel_w=0x3800, recip_kernel_h=0x3800)
    out = pool_nc1hwc2(feature, config).view(np.uint16)
    nan = (out & 0x7C00 == 0x7C00) & (out & 0x3FF != 0)
    assert nan.any() and (out[nan] == CANONICAL16).all()


# --- fp16 programs compiled end to end ------------------------------------------------------------
C, S = 16, 8


def _graph() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = rng.integers(-2, 3, (C, C, 3, 3)).astype(np.float32) * 0.5  # (zeros: inf x 0 in the CORE)
    bias = rng.normal(size=C).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),  # BS bias on the CORE's sums
             helper.make_node("Sigmoid", ["c"], ["sig"]),  # the LUT
             helper.make_node("HardSwish", ["c"], ["hsw"]),
             helper.make_node("Add", ["c", "y"], ["add"]),  # EW, its operand read from memory
             helper.make_node("Mul", ["x", "y"], ["mul"]),  # both operands from memory
             helper.make_node("Add", ["x", "y"], ["xy"]), helper.make_node("Relu", ["xy"], ["relu"]),
             helper.make_node("MaxPool", ["c"], ["maxp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("AveragePool", ["x"], ["avgp"], kernel_shape=[2, 2], strides=[2, 2])]
    full, half = [1, C, S, S], [1, C, S // 2, S // 2]
    shapes = {"sig": full, "hsw": full, "add": full, "mul": full, "relu": full, "maxp": half, "avgp": half}
    graph = helper.make_graph(nodes, "dnan", [helper.make_tensor_value_info(n, TensorProto.FLOAT, full) for n in "xy"],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def _inputs(seed: int) -> dict[str, np.ndarray]:
    """fp16 values (as float32): ~12% NaNs of NANS16, ~8% infinities of both signs, the rest normal."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name in "xy":
        x = rng.normal(size=(1, C, S, S)).astype(np.float16)
        bits, pick = x.view(np.uint16), rng.random(x.shape)
        bits[pick < 0.12] = rng.choice(NANS16, int((pick < 0.12).sum()))
        infinite = (pick >= 0.12) & (pick < 0.2)
        bits[infinite] = rng.choice(np.array([0x7C00, 0xFC00], np.uint16), int(infinite.sum()))
        inputs[name] = x.astype(np.float32)
    return inputs


def program_outputs(folder: Path, seeds=(1, 2)) -> dict[str, np.ndarray]:
    """Every output of the compiled program (rk3588, rk3568) for each seed, two runs each (the first
    through the units, the second through the task plans)."""
    from npuemu.emulator.runtime import Runtime
    from npuemu.isa.container import ModelFile
    from npuemu.tools.cli import main

    onnx.save(_graph(), folder / "m.onnx")
    outputs = {}
    for chip in ("rk3588", "rk3568"):
        path = folder / f"{chip}.npu"
        if not path.exists():
            assert main(["compile", str(folder / "m.onnx"), "--fp16", "-t", chip, "-o", str(path)]) == 0
        runtime = Runtime(ModelFile.read(path))
        for seed in seeds:
            for run in range(2):
                for name, value in _inputs(seed).items():
                    runtime.set_input(name, value)
                runtime.run()
                for name in runtime.outputs:
                    outputs[f"{chip} {seed} {run} {name}"] = np.array(runtime.output(name), np.float32)
    return outputs


def digests(folder: str) -> dict[str, str]:
    return {name: hashlib.sha256(out.tobytes()).hexdigest()
            for name, out in program_outputs(Path(folder)).items()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dnan")
    return folder, program_outputs(folder)


def test_every_nan_an_fp16_program_stores_is_canonical(built):
    _, outputs = built
    for name, out in outputs.items():
        nan = np.isnan(out)
        assert nan.any(), name
        assert set(np.unique(out.view(np.uint32)[nan]).tolist()) == {CANONICAL32}, name
    # (both runs of a seed alike: the units and the task plans store the same bits)
    for name, out in outputs.items():
        if " 0 " in name:
            assert np.array_equal(out.view(np.uint32), outputs[name.replace(" 0 ", " 1 ")].view(np.uint32)), name


_CHILD = """
import json, sys
from tests.emulator.test_canonical_nan_dpu import digests
print("RESULT " + json.dumps(digests(sys.argv[1])))
"""


@pytest.mark.parametrize("cpu", ["haswell", "generic"])
def test_other_targets_store_the_same_bits(built, cpu, tmp_path):
    folder, outputs = built
    env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CACHE_DIR=str(tmp_path))  # (kernels for that target only)
    done = subprocess.run([sys.executable, "-c", _CHILD, str(folder)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert theirs == {name: hashlib.sha256(out.tobytes()).hexdigest() for name, out in outputs.items()}
