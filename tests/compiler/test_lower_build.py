"""A build step in miniature: constants -> memory plan -> placements -> lowering -> one chain.

The rep12 residual block (conv1x1+relu, conv3x3+relu, conv3x3 + add of the first output) and
a plain chain of convolutions, lowered with addresses from ``plan_memory`` and encoded with
``isa.encode_chain``: every address register points into the right allocation, tensors that
are live together never share bytes, and the regcmd area holds the encoded chain exactly.
"""

from __future__ import annotations

import numpy as np

from npuemu.compiler.lower import Activation, ConvLayer, Quant, Residual, layer_constants, lower_layer, output_align
from npuemu.compiler.lower.placement import feature_bytes
from npuemu.compiler.memory_plan import lifetimes_from_steps, plan_memory, regcmd_bytes
from npuemu.isa.chain import decode_chain, encode_chain
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain
from npuemu.platforms import load_platform

PLATFORM = load_platform("rk3588")
REGMAP = load_regmap("rk3588")


def _conv(name, source, target, kernel, *, residual=None, activation="relu", seed=0) -> ConvLayer:
    rng = np.random.default_rng(seed)
    return ConvLayer(name, source, target, (64, 56, 56), rng.integers(-128, 128, (64, 64, kernel, kernel), dtype=np.int8),
                     bias=rng.normal(0, 0.1, 64), pads=(kernel // 2,) * 4, weight_scale=rng.uniform(0.002, 0.01, 64),
                     weight_zero_point=rng.integers(-8, 8, 64), input_quant=Quant(0.04, 4),
                     output_quant=Quant(0.05, -128), activation=Activation(activation), residual=residual)


def build(layers: list[ConvLayer], inputs: list[str], outputs: list[str]):
    constants = {}
    for layer in layers:
        constants.update({name: len(blob) for name, blob in layer_constants(layer, PLATFORM).items()})
    aligns = {layer.output: output_align(layer, PLATFORM) for layer in layers}
    shapes = {layer.input: layer.input_shape for layer in layers} | {layer.output: layer.output_shape for layer in layers}
    sizes = {name: feature_bytes(shape, "int8", PLATFORM, channel_align=aligns.get(name, 1)) for name, shape in shapes.items()}
    steps = [((layer.input,) + ((layer.residual.tensor,) if layer.residual else ()), (layer.output,)) for layer in layers]
    lifetimes = lifetimes_from_steps(steps, sizes, inputs, outputs)

    def lower_all(plan):
        placements = {name: plan.constant(name) for name in constants}
        placements |= {name: plan.feature(name, shapes[name], "int8", PLATFORM, channel_align=aligns.get(name, 1))
                       for name in shapes}
        return [lower_layer(layer, placements, PLATFORM, REGMAP, op_idx=i) for i, layer in enumerate(layers)]

    first = plan_memory(constants, lifetimes)  # regcmd size does not depend on addresses
    tasks = [task for lowered in lower_all(first) for task in lowered.tasks]
    plan = plan_memory(constants, lifetimes, regcmd_bytes(tasks))
    lowered = lower_all(plan)
    return plan, lowered, lifetimes


def _in(plan, name: str, address: int) -> bool:
    allocation = plan[name]
    return allocation.address <= address < allocation.end


def test_resblock_build() -> None:
    layers = [_conv("L1", "in0", "r5", 1, seed=1), _conv("L2", "r5", "r11", 3, seed=2),
              _conv("L3", "r11", "out", 3, residual=Residual("r5", Quant(0.05, -128)), activation="none", seed=3)]
    plan, lowered, lifetimes = build(layers, ["in0"], ["out"])
    tasks = [task for item in lowered for task in item.tasks]
    assert len(tasks) == 3
    for layer, item in zip(layers, lowered):
        writes = {f"{w.block}.{w.register}": w.value for w in item.tasks[0].writes}
        assert _in(plan, layer.input, writes["CNA.FEATURE_DATA_ADDR"])
        assert _in(plan, layer.output, writes["DPU.DST_BASE_ADDR"])
        assert _in(plan, layer.weight_tensor, writes["CNA.DCOMP_ADDR0"])
        assert _in(plan, layer.bias_tensor, writes["DPU_RDMA.BS_BASE_ADDR"])
    assert _in(plan, "r5", {f"{w.block}.{w.register}": w.value for w in tasks[2].writes}["DPU_RDMA.EW_BASE_ADDR"])
    live = [t for t in lifetimes if t.kind == "internal"]
    for i, a in enumerate(live):
        for b in live[i + 1:]:
            if a.overlaps(b):
                assert plan[a.name].end <= plan[b.name].address or plan[b.name].end <= plan[a.name].address
    regcmd = plan["regcmd"]
    encoded = encode_chain(Chain(tasks), REGMAP, base_addr=regcmd.address, scale=PLATFORM.pc.data_amount_scale)
    assert len(encoded.data) == regcmd.size
    decoded = decode_chain(encoded.data, REGMAP, regcmd.address, regcmd.address, encoded.first_amount, 2)
    assert len(decoded.chain.tasks) == 3


def test_chain_of_convs_reuses_internal_memory() -> None:
    names = ["x0", "x1", "x2", "x3", "x4", "x5"]
    layers = [_conv(f"L{i}", names[i], names[i + 1], 3, seed=i) for i in range(5)]
    plan, _, lifetimes = build(layers, ["x0"], ["x5"])
    internal = [t for t in lifetimes if t.kind == "internal"]
    assert len(internal) == 4
    assert plan.area("internal").size <= 2 * max(t.size for t in internal)  # ping-pong between two buffers
    assert plan["x1"].address == plan["x3"].address
