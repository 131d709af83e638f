"""RK3566/RK3568 run on the emulator: 8-byte NC1HWC2 atoms (C2 int8 8, fp16 4; hardware.md 2).

The documented choice (emulator/REGISTER_SEMANTICS.md 9): every line/surface stride register
counts the chip's atom, C2 int8 bytes, so a tensor shape gets the same register values on every
chip while the bytes they stand for halve on RK356x. The references here are independent of
the emulator's code: the testing kit's integer reference (layer by layer, and walked from the
input on the built model), the integer DPU model of tests/compiler/test_lower_machine.py, and
RK3588's output.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import tests.compiler.test_lower_machine as lowered
from npuemu.compiler.build import build_model
from npuemu.compiler.lower.placement import feature_placement
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.quant import calibrate, float16_graph, quantize_graph
from npuemu.emulator.machine import Machine
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import EmulationError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform
from npuemu.tools import testing
from npuemu.tools.demo_network import demo_images, demo_network
from npuemu.tools.testing_reference import reference_graph, reference_model
from tests.networks.builders import NETWORKS

CHIP = "rk3568"


def _first_task(config, chip):
    graph, model = testing.compile_layer(config, chip)
    runtime = Runtime(model)
    for name in graph.inputs:
        runtime.set_input(name, np.zeros(graph.tensors[name].shape, np.int8))
    runtime.run()
    return runtime.runs[0].tasks[0]


def test_stride_registers_count_the_chips_atom_so_they_match_rk3588():
    config = testing.ConvConfig(in_channels=8, out_channels=8, height=5, width=6)
    small, big = _first_task(config, CHIP), _first_task(config, "rk3588")
    for block, register, field in (("CNA", "DMA_CON1", "LINE_STRIDE"), ("CNA", "DMA_CON2", "SURF_STRIDE"),
                                   ("DPU", "DST_SURF_STRIDE", "DST_SURF_STRIDE")):
        assert small.registers[block].field(register, field) == big.registers[block].field(register, field)
    # the same values stand for 8-byte atoms: rows of 6 pixels are 48 bytes, not 96
    assert (small.conv.c2, small.conv.line_stride, small.dpu.dst_surface_stride * 2) == \
        (8, 48, big.dpu.dst_surface_stride)
    assert big.conv.line_stride == 96


def test_the_machine_takes_its_atom_from_the_platform_and_refuses_an_inconsistent_table():
    assert Machine.for_platform(CHIP, ddr_size=1 << 16).atom_bytes == 8
    assert Machine.for_platform("rk3588", ddr_size=1 << 16).atom_bytes == 16
    odd = load_platform(CHIP, overrides=["nc1hwc2.fp16=8"])  # 16-byte fp16 pixels with 8-byte int8 atoms
    with pytest.raises(EmulationError, match=r"nc1hwc2.fp16 = 8 .* 8-byte int8 atoms"):
        Machine.for_platform(odd, ddr_size=1 << 16)


def test_placements_of_8_byte_atoms():
    chip = load_platform(CHIP)
    image = feature_placement("x", 0, (3, 4, 5), "int8", chip)  # not a packed ARGB image
    assert (image.c2, image.pixel_bytes, image.packed, image.line_stride_atoms) == (8, 8, False, 5)
    assert feature_placement("x", 0, (3, 4, 5), "int8", chip, packed=True).packed
    # a 1 x 1 surface is 2 atoms, so the next C1 group starts on a 16-byte address
    assert feature_placement("x", 0, (16, 1, 1), "int8", chip).surface_bytes == 16
    # 32-bit elements keep 16-byte pixels: their surface is twice its pixels in atoms
    wide = feature_placement("c", 0, (8, 3, 4), "int32", chip)
    assert (wide.c2, wide.surface_stride, wide.surface_stride_atoms) == (4, 12, 24)


def _lowered_on(monkeypatch, name: str) -> None:
    """test_lower_machine's runner and DPU model with this chip's platform, register map and machine."""
    chip = load_platform(name)
    monkeypatch.setattr(lowered, "PLATFORM", chip)
    monkeypatch.setattr(lowered, "REGMAP", load_regmap(chip.register_map.family))

    class _ChipMachine:
        @staticmethod
        def for_platform(_name, **sizes):
            return Machine.for_platform(chip, **sizes)

    monkeypatch.setattr(lowered, "Machine", _ChipMachine)


@pytest.fixture
def on_rk3568(monkeypatch):
    _lowered_on(monkeypatch, CHIP)


@pytest.mark.parametrize("case", sorted(lowered.CONV_CASES))
def test_lowered_convolutions_are_exact(on_rk3568, case):
    # packed ARGB first layer (DATAIN_CHANNEL = one 8-channel atom), depthwise channel groups
    # and row splits, residual Adds, activations
    lowered.test_conv_on_machine(case)


def test_depthwise_channel_groups_start_on_weight_blocks_on_rk3562(monkeypatch):
    # RK3562 also aligns depthwise channels to 32; its groups split at 64-channel weight blocks
    _lowered_on(monkeypatch, "rk3562")
    lowered.test_conv_on_machine("depthwise_groups_and_rows")


def test_lowered_eltwise_and_pooling_are_exact(on_rk3568):
    lowered.test_eltwise_on_machine("add")
    for method in ("max", "avg"):
        lowered.test_pool_on_machine(method)


def _run(graph, model, inputs):
    runtime = Runtime(model)
    for name, value in inputs.items():
        runtime.set_input(name, value)
    runtime.run()
    return runtime


def test_demo_network_runs_in_int8_and_float16():
    graph = import_onnx(demo_network(), None)
    optimize(graph, PassContext.for_chip(CHIP, 3))
    half = copy.deepcopy(graph)
    samples = [{"image": image} for image in demo_images(2, seed=100)]
    quantize_graph(graph, calibrate(graph, samples, progress=False).ranges)
    model = build_model(graph, CHIP)
    runtime = _run(graph, model, samples[0])
    stored = runtime.output(graph.outputs[0], dequantize=False)
    exact = reference_model(graph, model, samples[0])[graph.outputs[0]]  # the kit's reference of the build
    assert np.array_equal(exact.reshape(-1), stored.reshape(-1))
    # float16: the same arithmetic as RK3588 in another layout, so the same bits
    float16_graph(half)
    got = _run(half, build_model(copy.deepcopy(half), CHIP), samples[1]).output(half.outputs[0])
    want = _run(half, build_model(half, "rk3588"), samples[1]).output(half.outputs[0])
    assert np.array_equal(got, want)


def test_mobilenet_v2_every_layer_is_bit_exact_and_the_output_is_the_reference_of_the_build():
    size = 64
    graph = import_onnx(NETWORKS["mobilenet_v2"](size), None)
    optimize(graph, PassContext.for_chip(CHIP, 3))
    rng = np.random.default_rng(0)
    samples = [{"x": rng.normal(size=(1, 3, size, size)).astype(np.float32)} for _ in range(3)]
    quantize_graph(graph, calibrate(graph, samples[:2], progress=False).ranges)
    probe = copy.deepcopy(graph)
    layers = [node.outputs[0] for node in graph.nodes]
    probe.outputs = list(dict.fromkeys([*probe.outputs, *layers]))
    runtime = _run(probe, build_model(probe, CHIP), samples[2])
    reference = reference_graph(graph, {"x": runtime.output("x", dequantize=False)})
    assert len(layers) == 55
    for name in layers:
        got = runtime.output(name, dequantize=False).reshape(-1)
        assert np.array_equal(got, reference[name].reshape(-1)), f"layer output {name} differs"
    output = graph.outputs[0]
    exact = reference_model(graph, runtime.model, samples[2])[output]  # from the float input, no layer inputs
    assert np.array_equal(exact.reshape(-1), runtime.output(output, dequantize=False).reshape(-1))
