"""The property-testing kit: generate valid single layers for a chip, compile and run them on
the emulated NPU, and compare with independent integer references, bit for bit.

    from hypothesis import given, settings
    from npuemu.tools import testing

    @settings(max_examples=10, deadline=None)
    @given(testing.conv_configs(chip="rk3588"))
    def test_my_conv(config):
        report = testing.check_layer(config, chip="rk3588")
        assert report.ok, report.text()

Three parts:

- **configurations** (:class:`ConvConfig`, :class:`PoolConfig`, :class:`EltwiseConfig`,
  :class:`FcConfig`) and hypothesis **strategies** producing them (``conv_configs``,
  ``depthwise_configs``, ``pool_configs``, ``eltwise_configs``, ``add_configs``,
  ``fc_configs``, ``layer_configs``)
  within the chip's limits (``compiler.passes.hw_limits``: kernel, stride, dilation, pad and
  channel fields of the chip's register map) and a small default size so an example runs in
  well under a second;
- **references** (``testing_reference.py``, re-exported here: :func:`reference_conv` (with
  LUT activations, :class:`LutTables`, :func:`lut_lookup`), :func:`reference_pool`,
  :func:`reference_eltwise`, :func:`reference_copy`, :func:`reference_host` (host steps),
  :func:`reference_graph`): the int8 layer semantics of ``emulator/NUMERICS.md`` (sections 1,
  4, 5, 6, 9) in numpy int64 arrays and Python integers, given the layer's quantization
  (scales, zero points, int8 weights). They use neither the emulator's kernels nor the
  compiler's register code: the requantization factors are derived again from the documented
  formulas (a LUT's table contents are the compiler's data). ``reference_graph(...,
  layer_inputs=...)`` checks a whole compiled model layer by layer (tests/networks);
- :func:`check_layer`: builds the layer as a one-node ONNX model, calibrates it on random
  float inputs, runs the compiler (passes, quantization, lowering, model file), feeds the
  emulator random int8 inputs and compares its int8 output with the reference, returning a
  :class:`LayerReport` that says where and by how much they differ.

What a mismatch means: the quantization parameters are taken from the compiled graph (they
are the layer's definition, chosen by calibration); everything after them - register values,
the command stream, the emulated units - is checked. A failing example is a compiler or
emulator bug, or a documented semantic the reference states differently.

This module lives in ``tools`` (installed as ``npuemu.tools.testing``) because it needs both
the compiler and the emulator, which never import each other (architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math
from typing import Any, Union

import numpy as np

from npuemu.tools.testing_reference import (  # noqa: F401 (the kit's public references, re-exported)
    EW_CVT_SHIFT_MAX, OUT_CVT_SHIFT_MAX, LutTables, Quant, clamp, lut_lookup, pool_average, ppu_pool, reference_add,
    reference_conv, reference_copy, reference_eltwise, reference_graph, reference_host, reference_pool,
    round_half_away, round_shift, round_shift_array, scale_shift,
)

ACTIVATIONS = ("none", "relu", "relu6")


# --- configurations ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ConvConfig:
    """A Conv (``depthwise``: group = channels, one filter per channel) with a fused activation.
    ``pads`` are (top, left, bottom, right) as in ONNX order (top, left) + (bottom, right)."""

    in_channels: int
    out_channels: int
    height: int
    width: int
    kernel: tuple[int, int] = (3, 3)
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (1, 1, 1, 1)
    dilation: tuple[int, int] = (1, 1)
    depthwise: bool = False
    activation: str = "none"
    bias: bool = True
    seed: int = 0
    residual: bool = False  # Conv + Add(second input "y" of the output's shape), then none/relu

    @property
    def groups(self) -> int:
        return self.in_channels if self.depthwise else 1

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        size = [(extent + self.pads[i] + self.pads[i + 2] - (self.kernel[i] - 1) * self.dilation[i] - 1)
                // self.stride[i] + 1 for i, extent in enumerate((self.height, self.width))]
        return (1, self.out_channels, *size)


@dataclass(frozen=True)
class PoolConfig:
    """MaxPool or AveragePool (``method``: "max" / "average"; average without padding)."""

    channels: int
    height: int
    width: int
    method: str = "max"
    kernel: tuple[int, int] = (2, 2)
    stride: tuple[int, int] = (2, 2)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    seed: int = 0


@dataclass(frozen=True)
class EltwiseConfig:
    """An element-wise layer on two feature maps of the same shape: ``op`` add, sub, mul, max
    or min (ONNX Add, Sub, Mul, Max, Min)."""

    channels: int
    height: int
    width: int
    seed: int = 0
    op: str = "add"


@dataclass(frozen=True)
class FcConfig:
    """A fully connected layer: MatMul of x [1, in_features] with weights [in, out] (+ bias)."""

    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "none"
    seed: int = 0


LayerConfig = Union[ConvConfig, PoolConfig, EltwiseConfig, FcConfig]
ELTWISE_ONNX = {"add": "Add", "sub": "Sub", "mul": "Mul", "max": "Max", "min": "Min"}


# --- strategies -------------------------------------------------------------------------------

def chip_limits(chip: str = "rk3588"):
    """The chip's per-layer limits (kernel, stride, dilation, pad, channels; hw_limits.py)."""
    from npuemu.compiler.passes.hw_limits import npu_limits
    from npuemu.platforms import load_platform

    return npu_limits(load_platform(chip))


def conv_configs(chip: str = "rk3588", *, max_channels: int = 24, max_size: int = 12, max_kernel: int = 5,
                 depthwise: bool | None = False, residual: bool = True):
    """Conv layers valid for ``chip``: sizes up to the given caps and never above the chip's
    field limits. ``depthwise``: False plain convs, True depthwise only, None both;
    ``residual``: also Conv+Add layers (a second input added before the activation)."""
    from hypothesis import strategies as st

    limits = chip_limits(chip)
    # small default caps keep an example fast; the chip's field limits bound every value
    kernel_cap = min(max_kernel, limits.max_kernel)
    stride_cap = min(3, limits.max_stride)
    dilation_cap = min(2, limits.max_dilation)
    pad_cap = min(2, limits.max_pad)
    channel_cap = min(max_channels, limits.max_kernels, limits.max_input_channels)

    @st.composite
    def build(draw):
        is_depthwise = draw(st.booleans()) if depthwise is None else depthwise
        kh, kw = draw(st.integers(1, kernel_cap)), draw(st.integers(1, kernel_cap))
        dy, dx = draw(st.integers(1, dilation_cap)), draw(st.integers(1, dilation_cap))
        pads = tuple(draw(st.integers(0, min(pad_cap, k - 1))) for k in (kh, kw, kh, kw))
        # the input must hold one dilated kernel window
        height = draw(st.integers(max(1, (kh - 1) * dy + 1 - pads[0] - pads[2]), max_size))
        width = draw(st.integers(max(1, (kw - 1) * dx + 1 - pads[1] - pads[3]), max_size))
        in_channels = draw(st.integers(1, channel_cap))
        out_channels = in_channels if is_depthwise else draw(st.integers(1, channel_cap))
        with_residual = draw(st.booleans()) if residual else False
        # the hardware fuses Conv+Add+Relu, not Conv+Add+Clip (platform fusion patterns, hardware.md 4)
        activation = draw(st.sampled_from(("none", "relu") if with_residual else ACTIVATIONS))
        return ConvConfig(in_channels, out_channels, height, width, (kh, kw),
                          (draw(st.integers(1, stride_cap)), draw(st.integers(1, stride_cap))), pads, (dy, dx),
                          is_depthwise, activation, draw(st.booleans()), draw(st.integers(0, 2**16)), with_residual)

    return build()


def depthwise_configs(chip: str = "rk3588", **caps):
    return conv_configs(chip, depthwise=True, **caps)


def pool_configs(chip: str = "rk3588", *, max_channels: int = 24, max_size: int = 12):
    """Max pools (with padding smaller than the kernel) and average pools (no padding)."""
    from hypothesis import strategies as st

    limits = chip_limits(chip)
    kernel_cap = min(4, limits.max_pool_kernel, max_size)
    stride_cap = min(3, limits.max_pool_stride)
    channel_cap = min(max_channels, limits.max_cube_channels)

    @st.composite
    def build(draw):
        method = draw(st.sampled_from(("max", "average")))
        kh, kw = draw(st.integers(1, kernel_cap)), draw(st.integers(1, kernel_cap))
        if method == "max":
            pad_cap = min(limits.max_pool_pad, 1)
            pads = tuple(draw(st.integers(0, min(pad_cap, k - 1))) for k in (kh, kw, kh, kw))
        else:
            pads = (0, 0, 0, 0)
        height = draw(st.integers(max(1, kh - pads[0] - pads[2]), max_size))
        width = draw(st.integers(max(1, kw - pads[1] - pads[3]), max_size))
        return PoolConfig(draw(st.integers(1, channel_cap)), height, width, method, (kh, kw),
                          (draw(st.integers(1, stride_cap)), draw(st.integers(1, stride_cap))), pads,
                          draw(st.integers(0, 2**16)))

    return build()


def eltwise_configs(chip: str = "rk3588", *, ops=("add", "sub", "mul"), max_channels: int = 24, max_size: int = 12):
    """Element-wise layers of the given ``ops``. Default add, sub, mul: ONNX Max/Min are
    imported only where they fold to a constant (compiler/onnx_import.py), so max/min layers
    are refused before they reach the NPU lowering (pass them to see that)."""
    from hypothesis import strategies as st

    channel_cap = min(max_channels, chip_limits(chip).max_cube_channels)
    return st.builds(EltwiseConfig, st.integers(1, channel_cap), st.integers(1, max_size), st.integers(1, max_size),
                     st.integers(0, 2**16), st.sampled_from(tuple(ops)))


def add_configs(chip: str = "rk3588", **caps):
    return eltwise_configs(chip, ops=("add",), **caps)


def fc_configs(chip: str = "rk3588", *, max_features: int = 64):
    """FC layers; output features within the chip's matmul N limit and the CNA kernels field."""
    from hypothesis import strategies as st

    from npuemu.platforms import load_platform

    limits = chip_limits(chip)
    int8 = load_platform(chip).matmul.limits.int8  # hardware.md 2 (guide table 3-7); None: not given
    out_cap = min(max_features, limits.max_kernels, int8.n_max if int8 is not None and int8.n_max else max_features)
    return st.builds(FcConfig, st.integers(1, min(max_features, limits.max_input_channels)), st.integers(1, out_cap),
                     st.booleans(), st.sampled_from(ACTIVATIONS), st.integers(0, 2**16))


def layer_configs(chip: str = "rk3588"):
    """Any of the layer kinds above."""
    from hypothesis import strategies as st

    return st.one_of(conv_configs(chip, depthwise=None), pool_configs(chip), eltwise_configs(chip), fc_configs(chip))


# --- building and checking one layer -----------------------------------------------------------

@dataclass
class LayerReport:
    """The outcome of :func:`check_layer`: ``ok`` when the emulator's int8 output equals the
    reference everywhere; otherwise the first differing positions."""

    config: Any
    chip: str
    ok: bool
    shape: tuple[int, ...] = ()
    mismatches: int = 0
    max_difference: int = 0
    first: list[tuple[tuple[int, ...], int, int]] = field(default_factory=list)  # (index, emulator, reference)
    error: str = ""  # the compile or run error, when there is one

    def text(self) -> str:
        head = f"{type(self.config).__name__} on {self.chip}: {self.config}"
        if self.error:
            return f"{head}\n  error: {self.error}"
        if self.ok:
            return f"{head}\n  bit-exact over {int(np.prod(self.shape))} values"
        lines = [f"{head}", f"  {self.mismatches} of {int(np.prod(self.shape))} int8 values differ "
                 f"(max |difference| {self.max_difference}); first ones (NCHW index: emulator vs reference):"]
        lines += [f"    {list(index)}: {got} vs {want}" for index, got, want in self.first]
        return "\n".join(lines)


def layer_model(config: LayerConfig):
    """The one-layer float ONNX model of ``config`` (weights drawn from ``config.seed``)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(config.seed)
    initializers, nodes = [], []
    inputs = [("x", _input_shape(config))]

    def constant(name, values):
        initializers.append(numpy_helper.from_array(np.asarray(values, np.float32), name))
        return name

    if isinstance(config, ConvConfig):
        shape = (config.out_channels, config.in_channels // config.groups, *config.kernel)
        names = ["x", constant("w", rng.normal(0, 1 / math.sqrt(max(1, np.prod(shape[1:]))), shape))]
        if config.bias:
            names.append(constant("b", rng.normal(0, 0.2, config.out_channels)))
        last = "out" if config.activation == "none" else "sum" if config.residual else "conv"
        conv_out = "conv" if config.residual else last
        nodes.append(helper.make_node("Conv", names, [conv_out], name="conv", kernel_shape=list(config.kernel),
                                      strides=list(config.stride), pads=_onnx_pads(config.pads),
                                      dilations=list(config.dilation), group=config.groups))
        if config.residual:
            inputs.append(("y", config.output_shape))
            nodes.append(helper.make_node("Add", [conv_out, "y"], [last], name="residual"))
        nodes += _activation_nodes(config.activation, last, constant)
    elif isinstance(config, FcConfig):
        weights = rng.normal(0, 1 / math.sqrt(config.in_features), (config.in_features, config.out_features))
        names = ["x", constant("w", weights)]
        if config.bias:
            names += [constant("b", rng.normal(0, 0.2, config.out_features))]
        fc_out = "out" if config.activation == "none" else "fc"
        nodes.append(helper.make_node("Gemm", names, [fc_out], name="fc"))
        nodes += _activation_nodes(config.activation, fc_out, constant)
    elif isinstance(config, PoolConfig):
        op = "MaxPool" if config.method == "max" else "AveragePool"
        nodes.append(helper.make_node(op, ["x"], ["out"], name="pool", kernel_shape=list(config.kernel),
                                      strides=list(config.stride), pads=_onnx_pads(config.pads)))
    elif isinstance(config, EltwiseConfig):
        inputs.append(("y", _input_shape(config)))
        nodes.append(helper.make_node(ELTWISE_ONNX[config.op], ["x", "y"], ["out"], name=config.op))
    else:
        raise TypeError(f"not a layer configuration: {config!r}")
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name, shape in inputs],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _onnx_pads(pads) -> list[int]:
    top, left, bottom, right = pads
    return [top, left, bottom, right]


def _activation_nodes(kind: str, source: str, constant) -> list:
    from onnx import helper

    if kind == "relu":
        return [helper.make_node("Relu", [source], ["out"], name="relu")]
    if kind == "relu6":
        return [helper.make_node("Clip", [source, constant("lo", 0.0), constant("hi", 6.0)], ["out"], name="relu6")]
    return []


def _input_shape(config: LayerConfig) -> tuple[int, ...]:
    if isinstance(config, ConvConfig):
        return (1, config.in_channels, config.height, config.width)
    if isinstance(config, FcConfig):
        return (1, config.in_features)
    return (1, config.channels, config.height, config.width)


CALIBRATION_SAMPLES = 3
#: The passes run as `npuemu compile` runs them by default, vendor rewrites included, so the
#: kit checks what users build (an FC becomes a 1x1 conv, a small Add gets identity convs).
OPTIMIZATION_LEVEL = 3


def compile_layer(config: LayerConfig, chip: str = "rk3588"):
    """(quantized graph, model file) of ``config``: :func:`quantize_layer`'s graph, then built."""
    from npuemu.compiler.driver import build

    front = _prepare_layer(config, chip)
    return front.graph, build(front)


def quantize_layer(config: LayerConfig, chip: str = "rk3588"):
    """The fused, int8-quantized graph of ``config``, calibrated on random float inputs (so
    the ranges, and with them the scales and zero points, vary with the seed)."""
    return _prepare_layer(config, chip).graph


def _prepare_layer(config: LayerConfig, chip: str):
    """The compiler driver's front half on ``config``'s one-node model."""
    from npuemu.compiler.driver import CompileOptions, prepare

    model = layer_model(config)
    shapes = {value.name: tuple(d.dim_value for d in value.type.tensor_type.shape.dim) for value in model.graph.input}
    rng = np.random.default_rng([config.seed, 1])
    samples = []
    for _ in range(CALIBRATION_SAMPLES):
        offset = rng.uniform(-1.0, 1.0)  # an off-centre range: non-zero input zero points
        samples.append({name: (rng.normal(offset, rng.uniform(0.3, 2.0), shape)).astype(np.float32)
                        for name, shape in shapes.items()})
    options = CompileOptions(dataset=samples, optimization_level=OPTIMIZATION_LEVEL, name="layer")
    return prepare(model, chip, options)


def set_register_field(model, block: str, register: str, field_name: str, value: int):
    """A copy of ``model`` whose every write of ``block.register`` in its register-command
    sections has ``field_name`` set to ``value`` (the other fields kept): for checking what
    a changed register field does. ValueError when the stream never writes that register."""
    import dataclasses

    from npuemu.isa.container import ModelFile, SectionKind
    from npuemu.isa.regmap_loader import load_regmap
    from npuemu.isa.words import encode_word, split_word, words_from_bytes, words_to_bytes
    from npuemu.platforms import load_platform

    regmap = load_regmap(load_platform(model.platform().chip).register_map.family)
    reg = regmap.register(block, register)
    bits = reg.field(field_name)
    target = regmap.block(block).target
    sections, count = [], 0
    for section in model.sections:
        if section.kind is SectionKind.REGCMD:
            words = words_from_bytes(section.data)
            for index, word in enumerate(words):
                word_target, word_value, offset = split_word(word)
                if word_target == target and offset == reg.offset:
                    word_value = (word_value & ~bits.mask) | bits.place(value, f"{block}.{register}")
                    words[index] = encode_word(word_target, word_value, offset)
                    count += 1
            section = dataclasses.replace(section, data=words_to_bytes(words))
        sections.append(section)
    if not count:
        raise ValueError(f"the model's register commands never write {block}.{register}")
    return ModelFile(tuple(sections), model.trailer)


def check_layer(config: LayerConfig, chip: str = "rk3588", *, inputs: dict[str, np.ndarray] | None = None,
                patch=None) -> LayerReport:
    """Compile ``config`` for ``chip``, run it on the emulator with int8 ``inputs`` (default:
    uniform random int8 from the seed) and compare with the reference, bit for bit.
    ``patch``: a function (ModelFile) -> ModelFile applied before the run, e.g. a changed
    register field with :func:`set_register_field`.

    Compile and run errors (an unsupported layer, a chip without a lowering) come back in
    ``report.error`` rather than raising, so a property test can show them with the config."""
    from npuemu.emulator.runtime import Runtime
    from npuemu.isa.errors import NpuemuError

    try:
        graph, model = compile_layer(config, chip)
        rng = np.random.default_rng([config.seed, 2])
        stored = dict(inputs or {})
        for name in graph.inputs:
            stored.setdefault(name, rng.integers(-128, 128, graph.tensors[name].shape).astype(np.int8))
        runtime = Runtime(patch(model) if patch is not None else model)
        for name, value in stored.items():
            runtime.set_input(name, np.asarray(value, np.int8))
        runtime.run()
        got = np.asarray(runtime.output(graph.outputs[0], dequantize=False))
    except NpuemuError as error:
        return LayerReport(config, chip, False, error=f"{type(error).__name__}: {error}")
    try:
        want = reference_for(config, graph, stored)
    except (NotImplementedError, ValueError) as error:  # no reference, or registers cannot hold the layer
        return LayerReport(config, chip, False, error=f"reference: {error}")
    return compare(config, chip, got.reshape(want.shape), want)


def compare(config: Any, chip: str, got: np.ndarray, want: np.ndarray, *, show: int = 8) -> LayerReport:
    """The report of two int8 arrays of the same shape."""
    difference = np.abs(got.astype(np.int64) - want.astype(np.int64))
    wrong = np.argwhere(difference != 0)
    first = [(tuple(int(i) for i in index), int(got[tuple(index)]), int(want[tuple(index)])) for index in wrong[:show]]
    return LayerReport(config, chip, not len(wrong), tuple(want.shape), int(len(wrong)),
                       int(difference.max()) if difference.size else 0, first)


def reference_for(config: LayerConfig, graph, stored: dict[str, np.ndarray]) -> np.ndarray:
    """The reference output of the compiled ``graph`` ([C, H, W], or the output's shape)."""
    return reference_graph(graph, stored)[graph.outputs[0]]


__all__ = [
    "ConvConfig", "EltwiseConfig", "FcConfig", "LayerReport", "LutTables", "PoolConfig", "Quant", "add_configs",
    "check_layer", "chip_limits", "clamp", "compare", "compile_layer", "conv_configs", "depthwise_configs",
    "eltwise_configs", "fc_configs", "layer_configs", "layer_model", "lut_lookup", "pool_average", "pool_configs",
    "ppu_pool", "quantize_layer", "reference_add", "reference_conv", "reference_copy", "reference_eltwise",
    "reference_for", "reference_graph", "reference_host", "reference_pool", "round_half_away", "round_shift",
    "round_shift_array", "scale_shift", "set_register_field",
]
