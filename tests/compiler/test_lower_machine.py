"""Lowered layers run on the emulator's machine (npuemu.emulator.machine) and compared with an
integer model of the DPU arithmetic written here from emulator/NUMERICS.md.

This joins the two halves that are built apart: the compiler never imports the emulator, the
emulator never sees the compiler's objects - only the bytes of the memory image and the
regcmd chain. Convolutions must match the integer model exactly (it applies the same register
values with the documented roundings); element-wise layers are compared with the float result
requantized (within 1 LSB: fixed-point operand scaling); pooling exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler import quant_regs as qr
from npuemu.compiler.lower import (
    Activation, ConvLayer, EltwiseLayer, PoolLayer, Quant, Residual, feature_bytes, layer_constants, lower_layer,
    output_align,
)
from npuemu.compiler.lower.lower_conv import conv_constants
from npuemu.compiler.memory_plan import TensorLifetime, plan_memory, regcmd_bytes
from npuemu.emulator.machine import Machine
from npuemu.isa.chain import encode_chain
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain
from npuemu.platforms import load_platform

PLATFORM = load_platform("rk3588")
REGMAP = load_regmap("rk3588")


def to_native(x: np.ndarray, placement) -> np.ndarray:
    """[C][H][W] int8 -> the placement's bytes (NC1HWC2 with its surface stride, or packed HWC)."""
    if placement.packed:
        return np.ascontiguousarray(x.transpose(1, 2, 0)).reshape(-1)
    buf = np.zeros(placement.size, np.int8)
    channels, height, width = x.shape
    pixels = (np.arange(height)[:, None] * width + np.arange(width)[None, :]) * placement.c2
    for c in range(channels):
        group, lane = divmod(c, placement.c2)
        buf[group * placement.surface_bytes + pixels + lane] = x[c]
    return buf


def from_native(buf: np.ndarray, placement) -> np.ndarray:
    channels, height, width = placement.shape
    pixels = (np.arange(height)[:, None] * width + np.arange(width)[None, :]) * placement.c2
    out = np.zeros((channels, height, width), np.int64)
    for c in range(channels):
        group, lane = divmod(c, placement.c2)
        out[c] = buf[group * placement.surface_bytes + pixels + lane]
    return out


def _half_away(v, s):
    return np.sign(v) * ((np.abs(v) + (1 << (s - 1))) >> s) if s else v


def _half_even(v, s):
    if s == 0:
        return v
    floor = v >> s
    rest = v - (floor << s)
    return floor + ((rest > 1 << (s - 1)) | ((rest == 1 << (s - 1)) & (floor & 1 == 1)))


def conv_model(layer: ConvLayer, x: np.ndarray, residual: np.ndarray | None) -> np.ndarray:
    """BS (CPEND x window sum + ALU, x MUL >> 14), BN activation, EW residual, OUT_CVT (NUMERICS 4)."""
    regs = conv_constants(layer, PLATFORM).requant
    (kh, kw), (sy, sx), (top, left, bottom, right) = layer.kernel, layer.stride, layer.pads
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right)), constant_values=layer.input_quant.zero_point)
    out_channels, out_h, out_w = layer.output_shape
    windows = np.stack([padded[:, y * sy:y * sy + kh, c * sx:c * sx + kw] for y in range(out_h) for c in range(out_w)])
    windows = windows.reshape(out_h, out_w, *windows.shape[1:])
    weights = layer.weights.astype(np.int64)
    if layer.depthwise:
        acc = np.einsum("yxckl,ckl->cyx", windows, weights[:, 0])
        window_sum = windows.sum(axis=(3, 4)).transpose(2, 0, 1)
    else:
        acc = np.einsum("yxckl,ockl->oyx", windows, weights)
        window_sum = windows.sum(axis=(2, 3, 4))[None]
    column = (slice(None), None, None)
    v = acc + regs.cpend.astype(np.int64)[column] * window_sum + regs.alu.astype(np.int64)[column]
    v = _half_away(v * regs.mul.astype(np.int64)[column], regs.mul_shift)
    low, high = layer.activation.bounds

    def activate(v):
        if layer.activation.kind == "leaky_relu":  # BN MUL_PRELU: only negative values are scaled
            slope = qr.leaky_multiplier(layer.activation.alpha)
            return np.where(v < 0, _half_away(v * slope.scale, slope.shift), v)
        if low is not None:
            v = np.maximum(v, 0 if low == 0 else qr.clamp_threshold(low, regs.acc_scale))
        return v if high is None else np.minimum(v, qr.clamp_threshold(high, regs.acc_scale))

    after = layer.residual is not None and layer.residual.after_activation
    v = activate(v) if after or residual is None else v
    if residual is not None:
        convert = qr.residual_convert(layer.residual.quant.scale, layer.residual.quant.zero_point, regs.acc_scale)
        v = v + _half_even((residual + convert.offset) * convert.scale, convert.shift)
        v = v if after else activate(v)
    return np.clip(_half_even(v * regs.out_cvt.scale, regs.out_cvt.shift) + regs.out_offset, -128, 127)


def run_on_machine(layer, inputs: dict[str, np.ndarray], shapes: dict[str, tuple], output: str,
                   aligns: dict[str, int], packed: frozenset[str] = frozenset()) -> np.ndarray:
    constants = layer_constants(layer, PLATFORM)
    lifetimes = [TensorLifetime(name, feature_bytes(shape, "int8", PLATFORM, channel_align=aligns.get(name, 1),
                                                    packed=name in packed),
                                kind="output" if name == output else "input") for name, shape in shapes.items()]

    def lower(plan):
        placements = {name: plan.constant(name) for name in constants}
        placements |= {name: plan.feature(name, shape, "int8", PLATFORM, channel_align=aligns.get(name, 1),
                                          packed=name in packed) for name, shape in shapes.items()}
        return placements, lower_layer(layer, placements, PLATFORM, REGMAP)

    _, first = lower(plan_memory({n: len(b) for n, b in constants.items()}, lifetimes))
    plan = plan_memory({n: len(b) for n, b in constants.items()}, lifetimes, regcmd_bytes(first.tasks))
    placements, lowered = lower(plan)
    regcmd = plan["regcmd"]
    chain = encode_chain(Chain(lowered.tasks), REGMAP, base_addr=regcmd.address, scale=PLATFORM.pc.data_amount_scale)
    machine = Machine.for_platform("rk3588", ddr_size=plan.end + (1 << 16))
    for name, blob in constants.items():
        machine.memory.load(placements[name].address, blob)
    for name, value in inputs.items():
        machine.memory.load(placements[name].address, to_native(value, placements[name]))
    machine.memory.load(regcmd.address, chain.data)
    machine.run_chain(regcmd.address, chain.first_amount)
    out = placements[output]
    return from_native(machine.memory.dump(out.address, out.size).view(np.int8), out)


def _conv(shape, out_channels, kernel, stride=1, pad=1, *, depthwise=False, activation="relu", residual=None):
    rng = np.random.default_rng(out_channels + kernel)
    weights = rng.integers(-128, 128, (out_channels, 1 if depthwise else shape[0], kernel, kernel), dtype=np.int8)
    special = {"clip": dict(low=-0.4, high=0.6), "leaky_relu": dict(alpha=0.1)}
    act = Activation(activation, **special.get(activation, {}))
    return ConvLayer("c", "in", "out", shape, weights, bias=rng.normal(0, 0.5, out_channels), stride=stride,
                     pads=(pad,) * 4, groups=shape[0] if depthwise else 1,
                     weight_scale=rng.uniform(0.001, 0.004, out_channels),
                     weight_zero_point=rng.integers(-20, 20, out_channels), input_quant=Quant(0.03, -2),
                     output_quant=Quant(0.08, -5), activation=act, residual=residual)


CONV_CASES = {
    "conv3x3": dict(shape=(16, 10, 10), out_channels=24, kernel=3),
    "depthwise_groups_and_rows": dict(shape=(96, 112, 112), out_channels=96, kernel=3, stride=2, depthwise=True),
    "height_split": dict(shape=(64, 70, 150), out_channels=40, kernel=3, activation="relu6"),
    "first_layer_packed": dict(shape=(3, 30, 40), out_channels=32, kernel=3, stride=2),
    "clip": dict(shape=(16, 9, 9), out_channels=20, kernel=3, activation="clip"),
    "leaky": dict(shape=(16, 9, 9), out_channels=20, kernel=3, activation="leaky_relu"),
    "add_relu_odd_size": dict(shape=(48, 9, 11), out_channels=48, kernel=3,
                              residual=Residual("res", Quant(0.05, -7))),
    "relu_then_add_split": dict(shape=(64, 70, 150), out_channels=64, kernel=3,
                                residual=Residual("res", Quant(0.05, -7), after_activation=True)),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_on_machine(case: str) -> None:
    layer = _conv(**CONV_CASES[case])
    rng = np.random.default_rng(7)
    x = rng.integers(-128, 128, layer.input_shape).astype(np.int8)
    inputs, shapes = {"in": x}, {"in": layer.input_shape, "out": layer.output_shape}
    aligns = {"out": output_align(layer, PLATFORM), "res": output_align(layer, PLATFORM)}
    residual = None
    if layer.residual is not None:
        residual = rng.integers(-128, 128, layer.output_shape).astype(np.int8)
        inputs["res"], shapes["res"] = residual, layer.output_shape
    packed = frozenset({"in"}) if case == "first_layer_packed" else frozenset()
    got = run_on_machine(layer, inputs, shapes, "out", aligns, packed)
    expected = conv_model(layer, x.astype(np.int64), None if residual is None else residual.astype(np.int64))
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("op", ["add", "sub", "max", "min", "mul"])
def test_eltwise_on_machine(op: str) -> None:
    shape = (32, 9, 11)  # two surfaces of 99 pixels: surface padding (MRDMA SURF_NOTCH) matters
    qa, qb, qo = Quant(0.04, 3), Quant(0.03, -7), Quant(0.2 if op == "mul" else 0.06, 1)
    layer = EltwiseLayer("e", op, ("a", "b"), "o", shape, (qa, qb), qo)
    rng = np.random.default_rng(3)
    a, b = (rng.integers(-128, 128, shape).astype(np.int8) for _ in range(2))
    got = run_on_machine(layer, {"a": a, "b": b}, {"a": shape, "b": shape, "o": shape}, "o", {})
    fn = {"add": np.add, "sub": np.subtract, "max": np.maximum, "min": np.minimum, "mul": np.multiply}[op]
    real = fn(qa.scale * (a.astype(float) - qa.zero_point), qb.scale * (b.astype(float) - qb.zero_point))
    expected = np.clip(np.round(real / qo.scale) + qo.zero_point, -128, 127)
    assert np.max(np.abs(got - expected)) <= 1 and np.mean(got == expected) > 0.85


@pytest.mark.parametrize("method", ["max", "avg"])
def test_pool_on_machine(method: str) -> None:
    shape, kernel, stride, pads = ((16, 56, 56), 3, 1, (1, 1, 1, 1)) if method == "max" else ((32, 20, 20), 2, 2, (0,) * 4)
    layer = PoolLayer("p", method, "a", "o", shape, kernel, stride, pads, Quant(0.02, 3))
    x = np.random.default_rng(4).integers(-128, 128, shape).astype(np.int64)
    got = run_on_machine(layer, {"a": x.astype(np.int8)}, {"a": shape, "o": layer.output_shape}, "o", {})
    _, out_h, out_w = layer.output_shape
    fill = -(1 << 20) if method == "max" else 3
    padded = np.pad(x, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=fill)
    windows = np.stack([padded[:, dy:dy + stride * out_h:stride, dx:dx + stride * out_w:stride]
                        for dy in range(kernel) for dx in range(kernel)])
    if method == "max":
        expected = windows.max(axis=0)
    else:
        total = windows.sum(axis=0)
        expected = np.sign(total) * ((np.abs(total) + 2) // 4)  # k 2x2: exact mean, half away
    assert np.array_equal(got, expected)
