"""Convs whose output channels are not a multiple of the 32 int8 kernels of a MAC pass (RK3588).

The vendor (rknn-toolkit2 2.5.0) writes such an output as whole passes: every one of the 265
corpus conv tasks with Cout % 32 != 0 (Cout 1-48) has DPU CHANNEL = Cout rounded up to 32,
ORIG_CHANNEL = Cout, SIZE_E = 1 and SURF_ADD = 2 surfaces (tasks.csv), and the mobilenet_v2
fixture's 32 -> 16 1x1 conv at 112x112 (conv_18: the layer of calibration.md row A5) writes two
surfaces' worth of channels (CHANNEL 31, ORIG_CHANNEL 15) into a 401408-byte allocation that its
16-channel consumer reads as one surface (DATAIN_CHANNEL 16). npuemu builds the same
(compiler/LOWERING.md 15); these tests pin that against the vendor's own stream, and that the
emulated DPU writes nothing outside the tensor. The WDMA writes only the surfaces that hold
real channels (REGISTER_SEMANTICS 3.3): row A5's board DDR cycles fit one surface within 1%.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, compile_model
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.emulator.runtime import Runtime
from npuemu.isa.rknn import load_rknn

FIXTURE = Path(__file__).resolve().parents[3] / "shared" / "rknn-fixtures" / "mobilenet_v2" / "model.rknn"

# register fields that say how many channels the DPU computes and writes, and how it is read back
PRODUCER_FIELDS = (("DPU", "DATA_CUBE_CHANNEL", "CHANNEL"), ("DPU", "DATA_CUBE_CHANNEL", "ORIG_CHANNEL"),
                   ("DPU", "BS_OW_CFG", "SIZE_E_0"), ("DPU", "SURFACE_ADD", "SURF_ADD"),
                   ("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE"), ("DPU", "WDMA_SIZE_0", "CHANNEL_WDMA"),
                   ("CNA", "WEIGHT_SIZE2", "WEIGHT_KERNELS"))
CONSUMER_FIELDS = (("CNA", "DATA_SIZE1", "DATAIN_CHANNEL"), ("CNA", "DATA_SIZE1", "DATAIN_CHANNEL_REAL"),
                   ("CNA", "FC_DATA_SIZE1", "DMA_CHANNEL"))


def conv_chain(shape: tuple[int, int, int], layers: list[tuple[int, int, int]], seed: int = 0) -> onnx.ModelProto:
    """x [1, C, H, W] -> Conv -> ... (each (out channels, kernel, stride), "same" pads, bias)."""
    rng = np.random.default_rng(seed)
    channels, nodes, inits, source = shape[0], [], [], "x"
    for i, (out, kernel, stride) in enumerate(layers):
        w = rng.normal(0, (2.0 / (channels * kernel * kernel)) ** 0.5, (out, channels, kernel, kernel))
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.normal(0, 0.1, out).astype(np.float32), f"b{i}")]
        target = "y" if i == len(layers) - 1 else f"t{i}"
        nodes.append(helper.make_node("Conv", [source, f"w{i}", f"b{i}"], [target], pads=[kernel // 2] * 4,
                                      strides=[stride, stride]))
        channels, source = out, target
    graph = helper.make_graph(nodes, "narrow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, *shape])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def build(model: onnx.ModelProto, shape: tuple[int, int, int], seed: int = 0):
    rng = np.random.default_rng(seed)
    samples = [{"x": rng.normal(size=(1, *shape)).astype(np.float32)} for _ in range(2)]
    return compile_model(model, "rk3588", CompileOptions(dataset=samples))


def fields(record, names) -> dict[str, int]:
    return {f"{block}.{field}": record.registers[block].field(register, field) for block, register, field in names}


def kernels_of(record) -> int:
    return record.registers["CNA"].field("WEIGHT_SIZE2", "WEIGHT_KERNELS")


@pytest.mark.skipif(not FIXTURE.exists(), reason="rknn fixtures not present")
def test_a5_layer_is_programmed_and_stored_as_the_vendor_does():
    """mobilenet_v2 layer 3 (conv_18, 32 -> 16, 1x1, 112x112) and its consumer layer 4 (16 -> 96)
    against npuemu's build of the same two convs: the register fields above, the bytes the
    producer's DPU writes and the bytes allocated for the 16-channel tensor."""
    vendor_model = load_rknn(FIXTURE)
    runner = RknnRunner(vendor_model)
    vendor = runner.run([np.zeros(t.shape, np.float32) for t in runner.input_tensors]).tasks
    vendor_producer = [r for r in vendor if r.conv is not None and kernels_of(r) == 16
                       and r.registers["CNA"].field("DATA_SIZE1", "DATAIN_CHANNEL") == 32]
    vendor_consumer = [r for r in vendor if r.conv is not None and kernels_of(r) == 96
                       and r.registers["CNA"].field("DATA_SIZE1", "DATAIN_CHANNEL") == 16]
    assert vendor_producer and vendor_consumer

    shape = (32, 112, 112)
    model = build(conv_chain(shape, [(16, 1, 1), (96, 1, 1)]), shape)
    runtime = Runtime(model)
    runtime.set_input("x", np.zeros((1, *shape), np.float32))
    runtime.run()
    ours = [record for run in runtime.runs for record in run.tasks]
    producer = [r for r in ours if kernels_of(r) == 16]
    consumer = [r for r in ours if kernels_of(r) == 96]

    assert fields(producer[0], PRODUCER_FIELDS) == fields(vendor_producer[0], PRODUCER_FIELDS)
    assert fields(consumer[0], CONSUMER_FIELDS) == fields(vendor_consumer[0], CONSUMER_FIELDS)
    written = sum(r.traffic.write_bytes for r in producer)
    # the allocation holds both surfaces; the WDMA writes the one with real channels (A5's board DDR)
    assert written == sum(r.traffic.write_bytes for r in vendor_producer) == 16 * 112 * 112
    narrow = runtime.tensor_info("t0")
    assert int(narrow["size"]) == vendor_model.tensor("bn_23").size == 2 * written


@settings(max_examples=8, deadline=None)
@given(out=st.integers(1, 48).filter(lambda c: c % 32), width=st.integers(3, 9), height=st.integers(2, 6),
       kernel=st.sampled_from([1, 3]), stride=st.sampled_from([1, 2]), seed=st.integers(0, 99))
def test_dpu_writes_stay_inside_a_narrow_output(out, width, height, kernel, stride, seed):
    """The allocation has room for whole 32-channel passes: the only bytes of the machine's memory
    a run changes lie inside the output tensor (a second surface the allocation did not have
    would change the weights, the input or the register commands that follow it), and the DPU
    writes the 16-channel surfaces that hold real channels (ORIG_CHANNEL), not a padding-only one."""
    shape = (8, height, width)
    model = build(conv_chain(shape, [(out, kernel, stride)], seed), shape, seed)
    runtime = Runtime(model)
    runtime.set_input("x", np.random.default_rng(seed).normal(size=(1, *shape)).astype(np.float32))
    info = runtime.tensor_info("y")
    start, size = int(info["address"]), int(info["size"])
    memory = runtime.machine.memory
    memory.load(start, np.full(size, 0xA5, np.uint8))  # so that every byte the DPU writes can show
    before = {region.base: region.data.copy() for region in memory.regions}
    runtime.run()
    for region in memory.regions:
        changed = np.flatnonzero(region.data != before[region.base]) + region.base
        outside = changed[(changed < start) | (changed >= start + size)]
        assert outside.size == 0, f"the run changed {outside.size} bytes outside y, first at {outside[0]:#x}"
    records = [record for run in runtime.runs for record in run.tasks]
    _, _, out_height, out_width = runtime.output("y").shape
    written = sum(r.traffic.write_bytes for r in records)
    assert written == -(-out // 16) * 16 * out_height * out_width <= size
