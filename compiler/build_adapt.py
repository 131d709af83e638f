"""IR node (fused, quantized, partitioned) -> lowering layer record (compiler/lower/layers.py).

One function, :func:`layer_from_node`, reads what lowering needs from the quantized graph:
stored int8 weights with their per-channel scale/zero point, the int32 bias in accumulator
units, the int8 input/output quantization and the fused activation/residual. Which builder
makes a node's record is the node's NPU lowering kind in the op table (compiler/op_table.py;
:data:`LAYER_BUILDERS`). Anything the lowering records cannot express raises a
:class:`CompileError` naming the layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.compiler.build_host import (  # noqa: F401 (names build.py imports from here)
    CpuOp, constant_outputs, cpu_from_node, host_tensors, split_outputs,
)
from npuemu.compiler import op_table
from npuemu.compiler.ir import FusedOp, Graph, Node, QuantParams, Tensor
from npuemu.compiler.deconv_crop import cropped_phase_convs, phase_atoms_addressable  # LOWERING.md 40
from npuemu.compiler.deconv_phases import (
    channel_groups, interleave_chunks, interleave_fits, phase_conv, phase_weights, window_shape,
)
from npuemu.compiler.passes.constraints import as_cube
from npuemu.compiler.passes.lower_attention import WEIGHTS_FROM  # a Conv's weights read from a feature map (22.3)
from npuemu.compiler.passes.lower_data_convert import convert_record  # DataConvert on the DPU (LOWERING.md 26)
from npuemu.compiler.passes.transpose_npu import transpose_form  # Transpose perms on the DPU (LOWERING.md 36)
from npuemu.compiler.lower import Activation, ActivationLayer, ConcatLayer, ConvLayer, SliceLayer, EltwiseLayer, PoolLayer, Quant, Residual
from npuemu.compiler.lower.layers import ResizeLayer
from npuemu.compiler.lower.lower_flat_concat import FlatConcatLayer
from npuemu.compiler.lower.lower_transpose import TransposeLayer
from npuemu.compiler.ops.resize import replication_factors
from npuemu.compiler.lower.broadcast_lanes import lane_broadcast
from npuemu.compiler.lower.lut import ONNX_LUT_KINDS  # ONNX op -> LUT function kind (the op table's)
from npuemu.compiler.lower.placement import PLATFORM_DTYPE
from npuemu.compiler.quant import stored_values
from npuemu.compiler.quant.affine import round_half_away
from npuemu.isa.errors import CompileError, UnsupportedOpError
from npuemu.platforms.model import Platform

_ELTWISE = op_table.eltwise_ops()  # ONNX op -> EltwiseLayer op: Add/Sub/Mul/Max/Min
ELTWISE_OPS = frozenset(_ELTWISE)


#: The way out of a fused part the build cannot lower: level 0 runs no fusion pass
#: (compiler/SUPPORT.md), so each fused op becomes a layer of its own.
FUSION_WAY_OUT = "; compile with -O 0 to build it unfused (each part a layer of its own)"


def _fail(node: Node, what: str, kind: type[CompileError] = CompileError) -> CompileError:
    return kind(f"layer {node.layer_name} ({node.display_op}): {what}")


def chw(graph: Graph, name: str, node: Node) -> tuple[int, int, int]:
    """(C, H, W) of a feature map as stored: constraints.as_cube ([1, C, H, W]; [1, C] as C x 1 x 1;
    fewer dimensions padded with leading ones)."""
    shape = graph.tensor(name).shape
    cube = as_cube(shape)
    if cube is None:
        raise _fail(node, f"tensor {name!r} has shape {shape}; the build handles [1, C, H, W] feature maps "
                          "(and tensors of fewer dimensions) only")
    return cube


def stored_dtype(graph: Graph, name: str) -> str:
    """"float16" for a tensor a float16 layer reads or writes, else "int8" (quantize_graph's
    storage decision)."""
    quant = graph.tensor(name).quant
    if quant is not None and quant.dtype in WIDE_STORED:  # a conv's wide output (the Matmul API's C)
        return quant.dtype
    return "float16" if quant is not None and quant.dtype == "float16" else "int8"


#: the wide output dtypes a conv may write (lower.layers.WIDE_OUTPUTS): raw int32 accumulator
#: sums (scale = s_in * s_w) and fp32 results
WIDE_STORED = ("int32", "float32")


def layer_quant(graph: Graph, name: str, node: Node) -> Quant | None:
    """The int8 quantization of a tensor, None for a float16 one."""
    return None if stored_dtype(graph, name) == "float16" else int8_quant(graph, name, node)


def int8_quant(graph: Graph, name: str, node: Node) -> Quant:
    quant = graph.tensor(name).quant
    if quant is None or quant.dtype != "int8" or quant.per_channel:
        got = "none" if quant is None else f"{quant.dtype}{' per-channel' if quant.per_channel else ''}"
        raise _fail(node, f"tensor {name!r} must be per-tensor int8 quantized (got {got}); quantize the graph first")
    return Quant(float(quant.scale), int(quant.zero_point))


def _const_scalar(graph: Graph, name: str | None, default: float | None) -> float | None:
    if not name:
        return default
    tensor = graph.tensor(name)
    if tensor.data is None:
        return None
    return float(np.asarray(tensor.data).reshape(-1)[0])


def _activation(graph: Graph, node: Node, part) -> Activation:
    if part.op_type == "Relu":
        return Activation("relu")
    if part.op_type == "LeakyRelu":
        return Activation("leaky_relu", alpha=float(part.attrs.get("alpha", 0.01)))
    if part.op_type == "Clip":
        operands = [*part.inputs, "", ""]  # Clip(x, min, max): the operands besides the running result
        low = _const_scalar(graph, operands[0], part.attrs.get("min", float("-inf")))
        high = _const_scalar(graph, operands[1], part.attrs.get("max", float("inf")))
        if low is None or high is None:
            raise _fail(node, "a fused Clip needs constant min and max" + FUSION_WAY_OUT)
        low, high = _closed_clip(graph, node.outputs[0], low, high)
        if low == 0.0 and high == 6.0:
            return Activation("relu6")
        return Activation("clip", low=float(low), high=float(high))
    if part.op_type in ONNX_LUT_KINDS:
        return lut_activation(part.op_type, part.attrs)
    raise _fail(node, f"fused {part.op_type} is not lowered yet" + FUSION_WAY_OUT, UnsupportedOpError)


def _closed_clip(graph: Graph, output: str, low: float, high: float) -> tuple[float, float]:
    """Finite Clip bounds with the same effect: an open end becomes the end of what the output
    can hold (its int8 range, or the float16 maximum), so clamping there changes nothing; with
    min > max ONNX Clip gives max everywhere (max(x, min) then min(., max)), a clip to [max, max]."""
    quant = graph.tensor(output).quant
    if quant is not None and quant.dtype == "int8" and not quant.per_channel:
        ends = (float(quant.scale) * (-128 - int(quant.zero_point)), float(quant.scale) * (127 - int(quant.zero_point)))
    else:
        ends = (-65504.0, 65504.0)
    low = low if np.isfinite(low) else min(ends[0], high if np.isfinite(high) else ends[0])
    high = high if np.isfinite(high) else max(ends[1], low)
    return (high, high) if low > high else (low, high)


def lut_activation(op_type: str, attrs) -> Activation:
    """A DPU-LUT activation with the ONNX attributes its function takes (the op table's
    ``lut_attrs``: Elu alpha; HardSigmoid alpha, beta)."""
    taken = op_table.BY_OP[op_type].lut_attrs
    alpha = attrs.get("alpha") if "alpha" in taken else None
    beta = attrs.get("beta") if "beta" in taken else None
    # Gelu's tanh approximation (opset 20 ``approximate="tanh"``) differs from the erf form by
    # < 5e-4 absolute: the erf table serves both.
    return Activation(ONNX_LUT_KINDS[op_type], alpha=None if alpha is None else float(alpha),
                      beta=None if beta is None else float(beta))


def _conv(graph: Graph, node: Node) -> ConvLayer:
    x, w = node.inputs[0], node.inputs[1]
    bias_name = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    weight = graph.tensor(w)
    if weight.quant is not None and weight.quant.dtype == "float16":
        return _conv_fp16(graph, node)
    if weight.quant is None or weight.quant.dtype != "int8":
        raise _fail(node, f"weights {w!r} are not int8 quantized")
    out_channels = weight.shape[0]
    weight_scale = np.broadcast_to(np.asarray(weight.quant.scale, np.float64), (out_channels,)).copy()
    weight_zp = np.broadcast_to(np.asarray(weight.quant.zero_point, np.int64), (out_channels,)).copy()
    input_quant = int8_quant(graph, x, node)
    bias = np.zeros(out_channels, np.int64)
    if bias_name is not None:  # int32 in units of s_in * s_w[c], float64 from the float32 scales (QUANTIZATION.md 4)
        unit = np.float64(np.float32(input_quant.scale)) * weight_scale
        data = np.asarray(graph.tensor(bias_name).data, np.float64).reshape(-1)
        bias = np.clip(round_half_away(data / unit), -(1 << 31), (1 << 31) - 1).astype(np.int64)
    activation, residual = Activation("none"), None
    for part in node.fused:
        if part.op_type == "Add" and part.tag == "bias_add":
            if activation.kind != "none" or residual is not None or len(part.inputs) != 1 \
                    or not graph.tensor(part.inputs[0]).is_const:
                raise _fail(node, "a fused bias Add after an activation or residual is not folded by the build"
                            + FUSION_WAY_OUT)
            constant = graph.tensor(part.inputs[0])
            values = np.asarray(constant.data, np.float64).reshape(-1)
            if constant.quant is not None:  # the values the quantized graph computes with (per channel: axis 0)
                stored = stored_values(constant).astype(np.float64).reshape(-1)
                values = np.asarray(constant.quant.scale, np.float64).reshape(-1) * (
                    stored - np.asarray(constant.quant.zero_point, np.float64).reshape(-1))
            if values.size not in (1, out_channels):
                raise _fail(node, f"a fused bias Add of shape {list(values.shape)} is not per-channel" + FUSION_WAY_OUT)
            unit = np.float64(np.float32(input_quant.scale)) * weight_scale
            extra = np.broadcast_to(values.reshape(-1), (out_channels,))
            bias = np.clip(bias + round_half_away(extra / unit), -(1 << 31), (1 << 31) - 1).astype(np.int64)
            continue
        activation, residual = _fused_part(graph, node, part, activation, residual)
    attrs = node.attrs
    top, left, bottom, right = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])]
    wide = stored_dtype(graph, node.outputs[0]) == "int32"
    return ConvLayer(
        node.layer_name, x, node.outputs[0], window_shape(chw(graph, x, node), tuple(attrs.get("interleave", ()))),
        stored_values(weight), bias=bias, stride=tuple(attrs.get("strides", [1, 1])),
        dilation=tuple(attrs.get("dilations", [1, 1])),
        pads=(top, left, bottom, right), groups=int(attrs.get("group", 1)), weight_scale=weight_scale,
        weight_zero_point=weight_zp, input_quant=input_quant,
        output_quant=None if wide else int8_quant(graph, node.outputs[0], node),
        activation=activation, residual=residual, bias_in_accumulator_units=True,
        output_dtype="int32" if wide else "", interleave=tuple(attrs.get("interleave", ())),
        requant_scale_max=float(attrs.get(SCALE_MAX, 0.0)),
    )


def _fused_part(graph: Graph, node: Node, part, activation: Activation,
                residual: Residual | None) -> tuple[Activation, Residual | None]:
    """A conv's fused residual Add or activation (after the bias Adds are taken)."""
    if part.op_type == "Add":
        if residual is not None or len(part.inputs) != 1:
            raise _fail(node, "only one fused residual Add with one operand is lowered" + FUSION_WAY_OUT)
        return activation, Residual(part.inputs[0], layer_quant(graph, part.inputs[0], node),
                                    after_activation=activation.kind != "none")
    if activation.kind == "none":
        return _activation(graph, node, part), residual
    raise _fail(node, f"a second fused activation ({part.op_type}) is not lowered" + FUSION_WAY_OUT)


def _conv_fp16(graph: Graph, node: Node) -> ConvLayer:
    """A float16 convolution: fp16 weights, fp32 bias (fused bias Adds folded into it)."""
    x, w = node.inputs[0], node.inputs[1]
    weight = graph.tensor(w)
    out_channels = weight.shape[0]
    bias = np.zeros(out_channels, np.float64)
    if len(node.inputs) > 2 and node.inputs[2]:
        bias = bias + np.asarray(graph.tensor(node.inputs[2]).data, np.float64).reshape(-1)
    activation, residual = Activation("none"), None
    for part in node.fused:
        if part.op_type == "Add" and part.tag == "bias_add":
            values = np.asarray(graph.tensor(part.inputs[0]).data, np.float64).reshape(-1)
            if activation.kind != "none" or residual is not None or values.size not in (1, out_channels):
                raise _fail(node, "a fused bias Add after an activation or residual is not folded by the build"
                            + FUSION_WAY_OUT)
            bias = bias + np.broadcast_to(values, (out_channels,))
        else:
            activation, residual = _fused_part(graph, node, part, activation, residual)
    attrs = node.attrs
    top, left, bottom, right = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])]
    return ConvLayer(
        node.layer_name, x, node.outputs[0], window_shape(chw(graph, x, node), tuple(attrs.get("interleave", ()))),
        stored_values(weight), bias=bias, stride=tuple(attrs.get("strides", [1, 1])),
        dilation=tuple(attrs.get("dilations", [1, 1])),
        pads=(top, left, bottom, right), groups=int(attrs.get("group", 1)), activation=activation,
        residual=residual, dtype="float16",
        output_dtype="float32" if stored_dtype(graph, node.outputs[0]) == "float32" else "",
        weight_source=node.attrs.get(WEIGHTS_FROM, ""), interleave=tuple(attrs.get("interleave", ())))


def _pool(graph: Graph, node: Node) -> PoolLayer:
    x = node.inputs[0]
    shape = chw(graph, x, node)
    attrs = node.attrs
    if node.op_type in ("GlobalAveragePool", "GlobalMaxPool"):
        kernel, stride, pads = (shape[1], shape[2]), 1, (0, 0, 0, 0)
        method = "avg" if node.op_type == "GlobalAveragePool" else "max"
        include_pad = True
    else:
        kernel = tuple(attrs.get("kernel_shape"))
        stride = tuple(attrs.get("strides", [1, 1]))
        top, left, bottom, right = [int(v) for v in attrs.get("pads", [0, 0, 0, 0])]
        pads = (top, left, bottom, right)
        method = "max" if node.op_type == "MaxPool" else "avg"
        include_pad = bool(attrs.get("count_include_pad", 0))
        if attrs.get("ceil_mode", 0):  # the PPU pools in floor mode: fine where ceil mode adds no window
            floor = tuple((size + pads[i] + pads[i + 2] - kernel[i]) // stride[i] + 1
                          for i, size in enumerate(shape[1:]))
            if floor != tuple(graph.tensor(node.outputs[0]).shape[2:]):
                raise _fail(node, "ceil_mode pooling with a window past the pads is not lowered")
    if stored_dtype(graph, x) == "float16":
        return PoolLayer(node.layer_name, method, x, node.outputs[0], shape, kernel, stride, pads, None,
                         count_include_pad=include_pad, dtype="float16")
    in_quant, out_quant = int8_quant(graph, x, node), int8_quant(graph, node.outputs[0], node)
    if in_quant != out_quant:
        raise _fail(node, f"pooling input and output quantization differ ({in_quant} vs {out_quant}); "
                          "the PPU does not requantize")
    return PoolLayer(node.layer_name, method, x, node.outputs[0], shape, kernel, stride, pads, in_quant,
                     count_include_pad=include_pad)


def _eltwise(graph: Graph, node: Node, platform: Platform) -> EltwiseLayer:
    """``platform`` gives a broadcast operand's lanes per atom."""
    a, b = node.inputs[:2]
    shape = chw(graph, node.outputs[0], node)
    operand = lane_broadcast_operand(graph, node)
    gate = channel_gate_operand(graph, node)
    if operand is None and gate is None and (chw(graph, a, node) != shape or chw(graph, b, node) != shape):
        raise _fail(node, "broadcasting element-wise operands are lowered only as a [1, 1, H, W] map or a "
                          "[1, C, 1, 1] gate against [1, C, H, W] (for Sub as the second operand); others run "
                          "as a CPU step")
    if operand == 0 or gate == 0:
        a, b = b, a  # add/mul/max/min commute: the broadcast operand goes second, through the ERDMA
    gate_first = gate == 0 and node.op_type == "Sub"  # gate - map: BS negates the map (LOWERING.md 33.2)
    activation = Activation("none")
    for part in node.fused:
        if activation.kind != "none":
            raise _fail(node, f"a second fused activation ({part.op_type}) is not lowered" + FUSION_WAY_OUT)
        activation = _activation(graph, node, part)
    dtype = stored_dtype(graph, a)
    broadcast = None
    if operand is not None:
        broadcast = lane_broadcast(node.outputs[0], dtype, platform)
    gated = gate is not None
    if dtype == "float16":
        return EltwiseLayer(node.layer_name, _ELTWISE[node.op_type], (a, b), node.outputs[0], shape,
                            activation=activation, dtype="float16", broadcast=broadcast, channel_gate=gated,
                            gate_first=gate_first)
    return EltwiseLayer(node.layer_name, _ELTWISE[node.op_type], (a, b), node.outputs[0], shape,
                        (int8_quant(graph, a, node), int8_quant(graph, b, node)),
                        int8_quant(graph, node.outputs[0], node), activation=activation, broadcast=broadcast,
                        channel_gate=gated, gate_first=gate_first)


def lane_broadcast_operand(graph: Graph, node: Node) -> int | None:
    """Which input (0 or 1) of an element-wise node on two feature maps is a [1, 1, H, W] map
    broadcast over the other's C > 1 channels - the case the NPU runs by lane replication
    (lower/broadcast_lanes.py, LOWERING.md 16) - else None. Not for Sub's first operand: the
    broadcast one must be the ERDMA's, the subtrahend. The SE block's [1, C, 1, 1] gate is
    :func:`channel_gate_operand`."""
    cubes = _feature_operands(graph, node)
    if cubes is None or cubes[2][0] < 2:
        return None
    out = cubes[2]
    return _broadcast_index(node, cubes, (1, *out[1:]))


def channel_gate_operand(graph: Graph, node: Node) -> int | None:
    """Which input (0 or 1) of an element-wise node on two feature maps is a 4-D [1, C, 1, 1]
    gate broadcast over the other's [1, C, H, W] (H x W > 1) - the SE block's Mul, which the
    ERDMA reads in its per-channel mode (ERDMA_DATA_MODE 0, as the vendor's se_gate Mul;
    LOWERING.md 17) - else None. Sub's first operand too: the gate still goes through the ERDMA
    and BS negates the map (gate - map, LOWERING.md 33.2). 4-D only: a [C] or [1, C] operand of a
    lower-rank layer is another broadcast."""
    cubes = _feature_operands(graph, node)
    if cubes is None or cubes[2][1] * cubes[2][2] < 2:
        return None
    dims = [tuple(graph.tensor(name).shape) for name in node.inputs[:2]]
    if any(len(d) != 4 for d in dims):
        return None
    return _broadcast_index(node, cubes, (cubes[2][0], 1, 1), either=True)


def _feature_operands(graph: Graph, node: Node) -> tuple | None:
    """(C, H, W) of both operands and the output of an element-wise node on two feature maps."""
    if node.op_type not in ELTWISE_OPS or len(node.inputs) < 2 or len(node.outputs) != 1:
        return None
    operands = [graph.tensor(name) for name in node.inputs[:2]]
    if any(t.is_const for t in operands):
        return None
    cubes = (*(as_cube(t.shape) for t in operands), as_cube(graph.tensor(node.outputs[0]).shape))
    return None if None in cubes else cubes


def _broadcast_index(node: Node, cubes: tuple, narrow: tuple[int, int, int], either: bool = False) -> int | None:
    """The operand of shape ``narrow`` next to one of the output's shape (Sub: the second only,
    unless ``either``)."""
    out = cubes[2]
    for index in (1, 0) if node.op_type != "Sub" or either else (1,):
        if cubes[index] == narrow and cubes[1 - index] == out:
            return index
    return None


def lanes_tensor(graph: Graph, node: Node, platform: Platform) -> Tensor | None:
    """The graph tensor (its lanes, H, W) that an NPU element-wise node with a broadcast operand
    writes the replicated operand into (same element type and quantization), else None."""
    operand = lane_broadcast_operand(graph, node) if node.target == "NPU" else None
    if operand is None:
        return None
    source = graph.tensor(node.inputs[operand])
    broadcast = lane_broadcast(node.outputs[0], stored_dtype(graph, source.name), platform)
    _, height, width = as_cube(source.shape)
    return Tensor(broadcast.tensor, (1, broadcast.lanes, height, width), source.dtype, quant=source.quant)


def _concat(graph: Graph, node: Node) -> ConcatLayer:
    rank = len(graph.tensor(node.outputs[0]).shape)
    axis = int(node.attrs.get("axis", 1))
    if node.fused or (axis % rank if rank else axis) != 1:
        raise _fail(node, f"only a channel (axis 1) concat without fused parts is lowered, got axis {axis}")
    inputs = tuple(node.inputs)
    if any(graph.tensor(name).is_const for name in inputs):
        raise _fail(node, "a concat with a constant input is not lowered")
    return _joined_record(ConcatLayer, graph, node, "a float16 concat with int8 inputs is not lowered (a DataConvert "
                                                       "goes first)")


def _joined_record(kind, graph: Graph, node: Node, mixed: str):
    """A ConcatLayer / FlatConcatLayer of ``node``'s inputs: float16 throughout (``mixed`` names the
    refusal otherwise) or int8 with each input's and the output's quantization."""
    inputs, output = tuple(node.inputs), node.outputs[0]
    shapes = tuple(chw(graph, name, node) for name in inputs)
    dtype = stored_dtype(graph, output)
    if dtype == "float16":
        if any(stored_dtype(graph, name) != dtype for name in inputs):
            raise _fail(node, mixed)
        return kind(node.layer_name, inputs, output, shapes, (None,) * len(inputs), None, dtype)
    return kind(node.layer_name, inputs, output, shapes, tuple(int8_quant(graph, name, node) for name in inputs),
                int8_quant(graph, output, node))


def concat_fits_surfaces(graph: Graph, node: Node, platform) -> bool:
    """A channel concat whose inputs (all but the last) fill whole C2 groups of its dtype and are
    stored in that dtype: the DPU copies each one to a surface boundary of the output. Others
    run as a CPU step."""
    dtype = stored_dtype(graph, node.outputs[0])
    c2 = platform.c2(PLATFORM_DTYPE[dtype])
    return all(stored_dtype(graph, name) == dtype for name in node.inputs) \
        and all(chw(graph, name, node)[0] % c2 == 0 for name in node.inputs[:-1])


@dataclass(frozen=True)
class Alias:
    """A reshape that moves no bytes: a [1, C, 1, 1] feature map viewed as [1, C] (or back).
    The output tensor shares the input's placement."""

    name: str
    input: str
    output: str


def alias_from_node(graph: Graph, node: Node) -> Alias | None:
    """An Alias for a Reshape/Flatten/Squeeze/Unsqueeze of a 1x1 feature map that keeps the
    channels in place, else None."""
    if op_table.lowering(node.op_type) != "alias" or node.fused or len(node.outputs) != 1:
        return None
    source, target = graph.tensor(node.inputs[0]).shape, graph.tensor(node.outputs[0]).shape

    def channels_only(shape):
        return len(shape) >= 2 and shape[0] == 1 and all(d == 1 for d in shape[2:])

    if not (channels_only(source) and channels_only(target) and source[1] == target[1]):
        return None
    if len(source) not in (2, 4) or len(target) not in (2, 4):
        return None
    a, b = graph.tensor(node.inputs[0]).quant, graph.tensor(node.outputs[0]).quant
    if a is None or b is None or a.dtype != b.dtype or float(a.scale) != float(b.scale) \
            or int(a.zero_point) != int(b.zero_point):
        raise _fail(node, "a reshape that changes the quantization is not built")
    return Alias(node.layer_name, node.inputs[0], node.outputs[0])


def layer_from_node(graph: Graph, node: Node, platform: Platform):
    """The lowering record of one NPU node for ``platform``, or a CompileError naming it."""
    if node.target != "NPU":
        raise _fail(node, f"the partition sent it to the {node.target or 'unpartitioned'} side; only NPU layers "
                          "are lowered to tasks (a CPU layer is a CPU step: cpu_from_node)", UnsupportedOpError)
    if len(node.outputs) != 1:
        raise _fail(node, f"{len(node.outputs)} outputs; the build handles single-output layers")
    builder = LAYER_BUILDERS.get(op_table.lowering(node.op_type))
    layer = None if builder is None else builder(graph, node, platform)
    if layer is None:
        raise _fail(node, f"op {node.op_type} is not lowered to NPU tasks yet", UnsupportedOpError)
    return layer


# --- the record builders of the NPU lowering kinds (op_table.LOWERINGS) ---------------------------
#
# Each takes (graph, node, platform) and returns the record, or None where the node is not of
# the form its kind lowers (layer_from_node then says the op is not lowered).

def _conv_record(graph: Graph, node: Node, platform: Platform) -> ConvLayer:
    return _conv(graph, node)


def _pool_record(graph: Graph, node: Node, platform: Platform) -> PoolLayer:
    if node.fused:
        raise _fail(node, "fused parts after pooling are not lowered")
    return _pool(graph, node)


def _eltwise_record(graph: Graph, node: Node, platform: Platform) -> EltwiseLayer | None:
    if any(graph.tensor(name).is_const for name in node.inputs[:2]):
        return None  # a constant operand no fusion folded: a host step (layer_records._host_step)
    return _eltwise(graph, node, platform)


def _concat_record(graph: Graph, node: Node, platform: Platform) -> ConcatLayer:
    return _concat(graph, node)


def _slice_record(graph: Graph, node: Node, platform: Platform) -> SliceLayer:
    x = node.inputs[0]
    return SliceLayer(node.layer_name, x, node.outputs[0], chw(graph, x, node), int(node.attrs["start"]),
                      int(node.attrs["size"]), layer_quant(graph, x, node), layer_quant(graph, node.outputs[0], node),
                      dtype=stored_dtype(graph, x))


def _relu_record(graph: Graph, node: Node, platform: Platform) -> ActivationLayer | None:
    """A standalone ReLU/Clip/LeakyRelu on int8 or float16 (a DPU-only task, LOWERING.md 28)."""
    dtype = stored_dtype(graph, node.inputs[0])
    if dtype not in ("int8", "float16") or stored_dtype(graph, node.outputs[0]) != dtype:
        return None
    if node.fused:
        raise _fail(node, "fused parts after a standalone activation are not lowered")
    x = node.inputs[0]
    part = FusedOp(node.op_type, dict(node.attrs), list(node.inputs[1:]))
    if dtype == "float16":
        return ActivationLayer(node.layer_name, x, node.outputs[0], chw(graph, x, node), None, None,
                               _activation(graph, node, part), dtype="float16")
    return ActivationLayer(node.layer_name, x, node.outputs[0], chw(graph, x, node), int8_quant(graph, x, node),
                           int8_quant(graph, node.outputs[0], node), _activation(graph, node, part))


def _lut_record(graph: Graph, node: Node, platform: Platform) -> ActivationLayer | None:
    if len(node.inputs) != 1:
        return None
    if node.fused:
        raise _fail(node, "fused parts after a LUT activation are not lowered")
    x = node.inputs[0]
    dtype = stored_dtype(graph, node.outputs[0])  # float16: the fp16 DPU LUT (lower_conv.lut_stages_fp16)
    return ActivationLayer(node.layer_name, x, node.outputs[0], chw(graph, x, node), layer_quant(graph, x, node),
                           layer_quant(graph, node.outputs[0], node), lut_activation(node.op_type, node.attrs),
                           dtype=dtype)


def _resize_record(graph: Graph, node: Node, platform: Platform) -> ResizeLayer | None:
    """Nearest upsampling by whole factors (lower/lower_resize.py); the bytes move unchanged, so
    the quantization must be shared (quant/sharing.py passes it through a Resize)."""
    x, y = node.inputs[0], node.outputs[0]
    edge = int(node.attrs.get("edge_pad", 0))  # a bilinear Resize's edge-padded copy (passes/resize_bilinear.py)
    factors = (1, 1) if edge else replication_factors(node.attrs, graph.tensor(x).shape)[0]
    if factors is None or node.fused or stored_dtype(graph, x) != stored_dtype(graph, y):
        return None
    quant = layer_quant(graph, x, node)
    if quant != layer_quant(graph, y, node):
        raise _fail(node, "a nearest resize copies bytes, so input and output must share their quantization")
    return ResizeLayer(node.layer_name, x, y, chw(graph, x, node), factors, quant, dtype=stored_dtype(graph, x),
                       edge_pad=edge)


#: NPU lowering kind (op_table.LOWERINGS) -> the builder of its record. Kinds not here make no
#: record of their own: conv_phases and split expand into conv/slice nodes first (layer_records),
#: alias is build_adapt.alias_from_node, as_conv exists after a rewrite only, host is a host step.
def _flat_concat_record(graph: Graph, node: Node, platform: Platform) -> FlatConcatLayer:
    """Maps flattened along the pixels and joined (LOWERING.md 29): DPU copies like a Concat's."""
    return _joined_record(FlatConcatLayer, graph, node, "a float16 flat concat with int8 inputs is not lowered")


def _transpose_record(graph: Graph, node: Node, platform: Platform) -> TransposeLayer:
    """H <-> W of a stored map (passes/transpose_npu.py, LOWERING.md 35): bytes move unchanged, so
    the quantization is shared (quant/sharing.py passes it through a Transpose)."""
    x, y = node.inputs[0], node.outputs[0]
    dtype = stored_dtype(graph, x)
    if node.fused or dtype != stored_dtype(graph, y):
        raise _fail(node, "a transpose moves bytes: no fused parts, one dtype in and out")
    quant = None if dtype == "float16" else layer_quant(graph, x, node)
    if dtype != "float16" and quant != layer_quant(graph, y, node):
        raise _fail(node, "a transpose moves bytes, so input and output must share their quantization")
    return TransposeLayer(node.layer_name, x, y, chw(graph, x, node), quant, dtype,
                          **transpose_form(graph, node))  # the cube perm; a split node's stage (LOWERING.md 36)


LAYER_BUILDERS = {"conv": _conv_record, "pool": _pool_record, "eltwise": _eltwise_record, "concat": _concat_record,
                  "slice": _slice_record, "activation": _relu_record, "lut": _lut_record,
                  "resize": _resize_record, "convert": convert_record, "flat_concat": _flat_concat_record,
                  "transpose": _transpose_record}


# --- interim: LUT activations after a residual add (broadcasting element-wise ops: layer_records)
#
# The DPU LUT runs before the EW stage's add (NUMERICS.md 4.4), so a conv whose fused residual
# Add is followed by Sigmoid/HardSigmoid/HardSwish/Tanh cannot run it in the same task. As a
# documented interim, such a fused activation is split off: the
# conv writes its pre-activation result to a new int8 tensor ``<output>_preact`` and a CPU step
# applies the activation. The pre-activation quantization is derived from the output's range
# by inverting the (monotonic or saturating) activation, so the split adds one int8 rounding
# of the pre-activation that the fake-quant evaluation (which keeps fused values in float)
# does not model. (A second DPU-only LUT task would keep it on the NPU; not lowered yet.)

LUT_ACTIVATIONS = ONNX_LUT_KINDS.keys()  # the LUT activations' op types (a view, not a copy)


def _preactivation_range(part, low: float, high: float) -> tuple[float, float]:
    eps = 1e-4
    if part.op_type == "Sigmoid":
        low, high = min(max(low, eps), 0.5), max(min(high, 1 - eps), 0.5)
        return float(np.log(low / (1 - low))), float(np.log(high / (1 - high)))
    if part.op_type == "Tanh":
        low, high = min(max(low, -1 + eps), 0.0), max(min(high, 1 - eps), 0.0)
        return float(np.arctanh(low)), float(np.arctanh(high))
    if part.op_type == "HardSigmoid":
        alpha, beta = float(part.attrs.get("alpha", 0.2)), float(part.attrs.get("beta", 0.5))
        low, high = max(low, 0.0), min(high, 1.0)
        ends = sorted(((low - beta) / alpha, (high - beta) / alpha))
        return ends[0], ends[1]
    if part.op_type != "HardSwish":  # no fusion rule puts another LUT kind after a residual Add today
        raise CompileError(f"a fused {part.op_type} after a residual Add: its pre-activation range is not derived")
    # HardSwish: x (x + 3) / 6 on [-3, 3], x above; everything below -3 gives 0
    high = max(high, 0.0)
    top = high if high >= 3.0 else (-3.0 + float(np.sqrt(9.0 + 24.0 * high))) / 2.0
    return -3.0, top


def _residual(part) -> bool:
    return part.op_type == "Add" and part.tag != "bias_add"


def _split_fp16_residual(graph: Graph, node: Node) -> tuple[Node, Node, QuantParams] | None:
    """float16 conv + LUT activation + residual Add: (the conv with its activation writing
    ``<output>_act``, the Add as an NPU layer of its own, the fp16 quantization), as the vendor's
    conv_silu_add_fp16 (ConvExSwish, then an Add layer): the fp16 EW stage multiplies the LUT's
    result back to values (lower_conv.lut_stages_fp16), so it cannot add the residual too."""
    if len(node.fused) < 2 or not _residual(node.fused[-1]) or node.fused[-2].op_type not in LUT_ACTIVATIONS:
        return None
    part, output = node.fused[-1], node.outputs[0]
    activated = f"{output}_act"
    conv = Node(node.name, node.op_type, list(node.inputs), [activated], dict(node.attrs), list(node.fused[:-1]), "NPU")
    add = Node(part.source or f"{node.name}_add", "Add", [activated, *part.inputs], [output], {}, [], "NPU")
    return conv, add, graph.tensor(output).quant


def split_lut_activation(graph: Graph, node: Node) -> tuple[Node, Node, QuantParams] | None:
    """(conv node writing a new tensor, the node after it, that tensor's quantization) for an
    NPU conv whose LUT activation cannot run in its task, else None: int8 with a residual Add
    before the activation (the activation on the CPU), float16 with a residual Add after it (the
    Add a DPU layer)."""
    if node.target != "NPU" or node.op_type != "Conv" or not node.fused or len(node.outputs) != 1:
        return None
    if stored_dtype(graph, node.outputs[0]) == "float16":
        return _split_fp16_residual(graph, node)
    if node.fused[-1].op_type not in LUT_ACTIVATIONS or not any(_residual(part) for part in node.fused[:-1]):
        return None  # int8 without a residual: the DPU LUT runs the activation (lower/lut.py)
    part, output = node.fused[-1], node.outputs[0]
    preact = f"{output}_preact"
    conv = Node(node.name, node.op_type, list(node.inputs), [preact], dict(node.attrs), list(node.fused[:-1]), "NPU")
    activation = Node(part.source or f"{node.name}_{part.op_type.lower()}", part.op_type, [preact], [output],
                      dict(part.attrs), [], "CPU")
    quant = int8_quant(graph, output, node)
    low, high = quant.scale * (-128 - quant.zero_point), quant.scale * (127 - quant.zero_point)
    low, high = _preactivation_range(part, low, high)
    low, high = min(low, 0.0), max(high, 0.0)
    if high - low <= 0:
        raise _fail(node, f"cannot derive a pre-activation range for the fused {part.op_type}")
    scale = (high - low) / 255.0
    zero_point = int(np.clip(round_half_away(-128.0 - low / scale), -128, 127))
    return conv, activation, QuantParams("int8", np.asarray(scale), np.asarray(zero_point))


# --- ConvTranspose: a conv of its stride phases on the NPU, then DepthToSpace (and a crop) --------
#
# compiler/deconv_phases.py: the s*s phases of a transposed conv (group 1, dilation 1, equal
# strides) are one ordinary conv with s*s*C_out output channels ordered (co, ry, rx), kernel
# ceil(k/s), stride 1; ONNX DepthToSpace (mode CRD) interleaves them and a Slice crops the pads.
# Both move bytes only and keep the quantization. The conv (with its fused bias/activation) runs
# on the NPU, the moves as CPU steps. Kernel = stride (the 2x2/s2 upsampling of DBNet heads) is
# the 1x1 case with nothing to crop.

def _repeated(tensor: Tensor, name: str, repeat: int, data: np.ndarray | None = None) -> Tensor:
    """A copy of a per-output-channel constant with every channel repeated ``repeat`` times."""
    quant = tensor.quant
    if quant is not None and quant.per_channel:
        quant = QuantParams(quant.dtype, np.repeat(quant.scale, repeat), np.repeat(quant.zero_point, repeat), 0)
    if data is None:
        flat = np.asarray(tensor.data).reshape(-1)
        data = np.repeat(flat, repeat) if flat.size > 1 else flat
        shape = (data.size,) if len(tensor.shape) <= 1 else (data.size,) + (1,) * (len(tensor.shape) - 1)
        data = data.reshape(shape)
    return Tensor(name, tuple(data.shape), tensor.dtype, np.asarray(data), quant)


def conv_transpose_phases(graph: Graph, node: Node):
    """The phase conv of a ConvTranspose the NPU can run (deconv_phases.PhaseConv), else None."""
    attrs = node.attrs
    weight = graph.tensor(node.inputs[1])
    if weight.data is None or len(weight.shape) != 4 or int(attrs.get("group", 1)) != 1 \
            or any(int(v) != 1 for v in attrs.get("dilations", [1, 1])):
        return None
    kernel = [int(v) for v in attrs.get("kernel_shape", weight.shape[2:])]
    in_hw = graph.tensor(node.inputs[0]).shape[2:]
    return phase_conv(kernel, [int(v) for v in attrs.get("strides", [1, 1])],
                      [int(v) for v in attrs.get("pads", [0] * 4)], [int(v) for v in attrs.get("output_padding", [0, 0])],
                      in_hw)


def split_conv_transpose(graph: Graph, node: Node, platform: Platform | None = None
                         ) -> tuple[list[Tensor], Node, list[Node]] | None:
    """(new tensors, the phase conv node, the CPU nodes after it: DepthToSpace and, where the
    pads crop, a Slice) for an NPU ConvTranspose, else None."""
    if node.op_type != "ConvTranspose" or node.target != "NPU" or len(node.outputs) != 1:
        return None
    phases = conv_transpose_phases(graph, node)
    weight = graph.tensor(node.inputs[1])
    if phases is None or (weight.quant is not None and weight.quant.per_channel and weight.quant.axis != 1):
        return None
    s = phases.stride
    repeat = s * s
    c_out = weight.shape[1]
    base = node.outputs[0]
    tensors = [_repeated(weight, f"{base}_d2s_weight", repeat, phase_weights(np.asarray(weight.data), phases))]
    inputs = [node.inputs[0], tensors[0].name]
    if len(node.inputs) > 2 and node.inputs[2]:
        tensors.append(_repeated(graph.tensor(node.inputs[2]), f"{base}_d2s_bias", repeat))
        inputs.append(tensors[-1].name)
    fused = []
    for part in node.fused:
        if part.op_type == "Add" and part.tag == "bias_add" and len(part.inputs) == 1:
            constant = graph.tensor(part.inputs[0])
            tensors.append(_repeated(constant, f"{base}_d2s_{part.inputs[0]}", repeat))
            part = FusedOp(part.op_type, dict(part.attrs), [tensors[-1].name], part.carry_index, part.source, part.tag)
        elif part.inputs:  # a residual or a per-channel operand would need the same reordering
            return None
        fused.append(part)
    cropped = cropped_phase_convs(graph, node, phases, platform) if phases.cropped else None
    if cropped is not None:  # one conv per phase of the rows the crop keeps (deconv_crop.py, LOWERING.md 40)
        return cropped[0], cropped[1][0], cropped[1][1:]
    out = graph.tensor(base)
    (height, width), (y0, x0, crop_h, crop_w) = phases.out_hw, phases.crop
    direct = s == 1 and not phases.cropped  # the conv writes the layer's output itself
    source = base if direct else f"{base}_d2s"
    if not direct:
        tensors.append(Tensor(source, (1, c_out * repeat, height, width), out.dtype, quant=out.quant))
    conv = Node(node.name, "Conv", inputs, [source],
                {"kernel_shape": list(phases.kernel), "strides": [1, 1], "pads": list(phases.pads),
                 "dilations": [1, 1], "group": 1}, fused, "NPU")
    float16 = out.quant is not None and out.quant.dtype == "float16"
    interleaved = _interleaved_phases(graph, node, conv, tensors, phases, c_out) \
        if platform is None or phase_atoms_addressable(platform, float16) else None  # RK356x: odd atoms
    if interleaved is not None:  # no DepthToSpace: each phase conv writes its pixels (LOWERING.md 13)
        return interleaved[0], interleaved[1][0], interleaved[1][1:]
    moves = []
    if s > 1:  # stride 1: the phase conv's output is the uncropped image already
        spread = base if not phases.cropped else f"{base}_uncropped"
        if phases.cropped:
            tensors.append(Tensor(spread, (1, c_out, s * height, s * width), out.dtype, quant=out.quant))
        moves.append(Node(f"{node.name}_depth_to_space", "DepthToSpace", [source], [spread],
                          {"blocksize": s, "mode": "CRD"}, [], "CPU"))
        source = spread
    if phases.cropped:
        moves.append(Node(f"{node.name}_crop", "Slice", [source], [base],
                          {"starts": [y0, x0], "ends": [y0 + crop_h, x0 + crop_w], "axes": [2, 3], "steps": [1, 1]},
                          [], "CPU"))
    return tensors, conv, moves


def _interleaved_phases(graph: Graph, node: Node, conv: Node, tensors: list[Tensor], phases,
                        c_out: int) -> tuple[list[Tensor], list[Node]] | None:
    """(per-phase constants, the s*s phase Conv nodes) writing the ConvTranspose's output
    interleaved (deconv_phases.interleaved_write, attr ``interleave`` = [s, ry, rx]), else None
    (stride 1, a crop, a fused part the split would move (split_lut_activation), a phase 1 wide,
    a line wider than the WDMA's channel field of a phase kernel wider than 1, or constants not
    per channel). More than 32 output channels are written in channel groups and a 1x1 phase's
    too-long line in column chunks, one Conv each (attr ``interleave`` the EXTENDED form,
    LOWERING.md 28)."""
    s = phases.stride
    # surfaces counted in the smallest atom lanes of any chip (RK356x fp16: 4) so the lowering,
    # which knows the chip, never refuses what is chosen here
    quant = graph.tensor(node.outputs[0]).quant
    pass_kernels = 16 if quant is not None and quant.dtype == "float16" else 32
    groups = channel_groups(c_out)
    chunks = _phase_chunks(phases, max(count for _, count in groups), pass_kernels)
    if s == 1 or phases.cropped or chunks is None \
            or split_lut_activation(graph, Node(conv.name, "Conv", conv.inputs, [node.outputs[0]], dict(conv.attrs),
                                                list(conv.fused), "NPU")) is not None:
        return None
    new, nodes = [], []
    stacked = {t.name: t for t in tensors}  # the stacked phase conv's own constants
    for ry in range(s):
        for rx in range(s):
            for group, (start, count) in enumerate(groups):
                # the phase's (group's) channels of the stacked conv
                pick = (np.arange(start, start + count) * s + ry) * s + rx
                suffix = f"_p{ry}{rx}" + (f"g{group}" if len(groups) > 1 else "")
                inputs, fused = _phase_operands(graph, conv, stacked, pick, suffix, new)
                name = f"{node.name}_phase{ry}{rx}" + (f"_g{group}" if len(groups) > 1 else "")
                for index, (first, width) in enumerate(chunks):
                    interleave = [s, ry, rx]
                    if len(chunks) > 1 or len(groups) > 1:  # a part of the phase (LOWERING.md 28)
                        interleave += [first, width, phases.out_hw[1], start, c_out]
                    attrs = dict(conv.attrs, interleave=interleave)
                    if len(groups) > 1 and quant is not None and quant.dtype == "int8":
                        attrs[SCALE_MAX] = _scale_max(stacked[conv.inputs[1]])
                    nodes.append(Node(name + (f"_c{index}" if len(chunks) > 1 else ""), "Conv", inputs,
                                      [node.outputs[0]], attrs, list(fused), "NPU"))
    return new, nodes


#: attr of a channel-group phase Conv: the whole layer's largest weight scale (ConvLayer.requant_scale_max)
SCALE_MAX = "requant_scale_max"


def _scale_max(weight: Tensor) -> float:
    return float(np.max(np.asarray(weight.quant.scale, np.float64))) if weight.quant is not None else 0.0


def _phase_operands(graph: Graph, conv: Node, stacked: dict, pick: np.ndarray, suffix: str,
                    new: list[Tensor]) -> tuple[list[str], list[FusedOp]]:
    """A phase conv's inputs and fused parts: the stacked conv's constants cut to channels ``pick``."""
    inputs = []
    for name in conv.inputs:
        tensor = stacked.get(name) or graph.tensor(name)
        inputs.append(name if not tensor.is_const else _phase_constant(tensor, pick, suffix, new))
    fused = [FusedOp(p.op_type, dict(p.attrs), [_phase_constant(stacked[p.inputs[0]], pick, suffix, new)],
                     p.carry_index, p.source, p.tag) if p.inputs else p for p in conv.fused]
    return inputs, fused


def _phase_chunks(phases, c_out: int, pass_kernels: int) -> tuple[tuple[int, int], ...] | None:
    """The column chunks each phase conv is written in (one: the whole phase), else None. A 1x1
    phase conv (kernel = stride) with a line wider than the WDMA channel field is split into
    column chunks that each read their own input columns; a wider kernel writes one chunk only."""
    width = phases.out_hw[1]
    if phases.kernel[1] == 1 and phases.pads[1] == phases.pads[3] == 0:
        return interleave_chunks(width, c_out, pass_kernels)
    return ((0, width),) if width >= 2 and interleave_fits(width, c_out, pass_kernels) else None


def _phase_constant(tensor: Tensor, pick: np.ndarray, suffix: str, new: list[Tensor]) -> str:
    """``tensor``'s channels ``pick`` (axis 0, with per-channel quantization) as a new constant."""
    data = np.asarray(tensor.data)
    quant = tensor.quant
    if data.size > 1:
        data = data[pick]
    if quant is not None and quant.per_channel:
        quant = QuantParams(quant.dtype, np.asarray(quant.scale)[pick], np.asarray(quant.zero_point)[pick], 0)
    new.append(Tensor(tensor.name + suffix, tuple(data.shape), tensor.dtype, data, quant))
    return new[-1].name


# --- channel Split as one slice layer per output ---------------------------------------------

CHANNEL_SLICE = "ChannelSlice"  # build-internal op: one output of a channel Split (attrs start, size)


def split_channels(graph: Graph, node: Node) -> list[Node] | None:
    """An NPU Split along channels as one ChannelSlice node per output (each a single-output
    layer: a DPU copy, lower_eltwise.lower_slice); a multi-output CPU node as one host node per
    output (build_host.split_outputs); else None."""
    if node.target == "CPU":
        return split_outputs(node)
    if node.op_type != "Split" or node.target != "NPU" or node.fused:
        return None
    shape = graph.tensor(node.inputs[0]).shape
    axis = int(node.attrs.get("axis", 0))
    if len(shape) != 4 or axis % 4 != 1:
        return None
    slices, start = [], 0
    for index, output in enumerate(node.outputs):
        size = int(graph.tensor(output).shape[1])
        slices.append(Node(f"{node.name}_{index}" if len(node.outputs) > 1 else node.name, CHANNEL_SLICE,
                           [node.inputs[0]], [output], {"start": start, "size": size}, [], "NPU"))
        start += size
    return slices
