"""Build stage 5: the fused graph's nodes -> lowering records, in schedule order.

Every node becomes one record: an NPU layer for ``lower`` (build_adapt.layer_from_node), a host
step (``CpuOp``) or an ``Alias`` (a Reshape-like view of another tensor's bytes, no work). Some
nodes become several: a channel Split per output, a ConvTranspose as the conv of its stride
phases plus host moves (deconv_phases.py), an NPU Glu or Softmax as the nodes of
passes/lower_glu.py or lower_softmax.py, a float16 Rsqrt in an int8 build as lower_rsqrt.py's pieces, a conv whose fused parts split
(build_adapt.split_lut_activation) as the conv plus the node after it. New tensors those need go into a copy of the graph, never into the
caller's.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from npuemu.compiler import op_table
from npuemu.compiler.build_adapt import (
    Alias, CpuOp, alias_from_node, channel_gate_operand, concat_fits_surfaces, constant_outputs, cpu_from_node,
    lane_broadcast_operand, lanes_tensor, layer_from_node, split_channels, split_conv_transpose,
    split_lut_activation,
)
from npuemu.compiler.ir import Graph, Tensor
from npuemu.compiler.lower import ConcatLayer, ConvLayer, EltwiseLayer
from npuemu.compiler.lower.lower_flat_concat import FlatConcatLayer
from npuemu.compiler.passes.lower_attention import expand_attention
from npuemu.compiler.passes.lower_data_convert import host_reason as data_convert_host_reason
from npuemu.compiler.passes.lower_glu import expand_glu
from npuemu.compiler.passes.lower_rsqrt import expand_rsqrt
from npuemu.compiler.passes.lower_softmax import expand_softmax
from npuemu.compiler.passes.transpose_npu import expand_transpose
from npuemu.compiler.passes.resize_bilinear import expand_resize_bilinear
from npuemu.isa.errors import CompileError


def reads(layer) -> tuple[str, ...]:
    """The tensors a record reads."""
    if isinstance(layer, CpuOp):
        return tuple(layer.inputs)
    if isinstance(layer, ConvLayer):
        return (layer.input,) + ((layer.residual.tensor,) if layer.residual else ()) \
            + ((layer.weight_source,) if layer.weight_source else ())
    if isinstance(layer, (EltwiseLayer, ConcatLayer, FlatConcatLayer)):
        return tuple(layer.inputs)
    return (layer.input,)


def writes(layer) -> tuple[str, ...]:
    """The output, and the lanes tensor a broadcasting element-wise layer writes and reads."""
    broadcast = getattr(layer, "broadcast", None)
    return (layer.output,) + ((broadcast.tensor,) if broadcast is not None else ())


@dataclass
class Records:
    """The built graph's records: ``records[i]`` is built from ``nodes[i]``."""

    graph: Graph  # the caller's graph, or a copy holding the tensors the records added
    nodes: list
    records: list
    aliases: dict[str, str]  # alias tensor -> the tensor whose bytes it views
    elided: set[int] = field(default_factory=set)  # id() of no-copy records (tensor_plan)

    @property
    def work(self) -> list:
        """NPU layers and host steps, in order (aliases and elided copies left out)."""
        return [r for r in self.records if not isinstance(r, Alias) and id(r) not in self.elided]

    @property
    def layers(self) -> list:
        return [r for r in self.work if not isinstance(r, CpuOp)]

    @property
    def cpu_ops(self) -> list:
        return [r for r in self.work if isinstance(r, CpuOp)]

    @property
    def produced(self) -> set[str]:
        return {r.output for r in self.records if not isinstance(r, Alias)} | set(self.aliases)


def layer_records(graph: Graph, spec) -> Records:
    """The records of ``graph`` (fused and quantized) for chip ``spec``."""
    graph, nodes = _expand(graph, spec)
    if not nodes:
        raise CompileError("the graph has no layers to build")
    aliases: dict[str, str] = {}
    records = []
    for node in nodes:
        record = alias_from_node(graph, node) if node.target == "NPU" else None
        if record is not None:
            aliases[record.output] = aliases.get(record.input, record.input)
            records.append(record)
        elif node.target == "CPU" or _broadcasting_eltwise(graph, node) or _host_step(graph, node, spec):
            records.append(_resolve(cpu_from_node(graph, node), aliases))
        else:
            records.append(_resolve(layer_from_node(graph, node, spec), aliases))
    result = Records(graph, nodes, records, aliases)
    produced = result.produced
    for tensor in graph.inputs:
        if tensor in produced:
            raise CompileError(f"graph input {tensor!r} is also produced by a layer")
    for output in graph.outputs:
        if output not in produced:
            raise CompileError(f"graph output {output!r} is not produced by a layer")
    return result


class _GraphCopy:
    """The graph new tensors go into: copied on the first addition only."""

    def __init__(self, graph: Graph) -> None:
        self.graph, self.copied = graph, False

    def add(self, tensor: Tensor) -> None:
        if not self.copied:
            self.graph, self.copied = copy.deepcopy(self.graph), True
        self.graph.add_tensor(tensor)


def _expand(graph: Graph, spec) -> tuple[Graph, list]:
    """The nodes to build, with splits expanded; the graph holding every tensor they use."""
    target = _GraphCopy(graph)
    nodes = constant_outputs(graph)  # graph outputs the import folded to constants: host steps writing them
    for node in graph.nodes:
        attention = expand_attention(target, node, spec)  # LOWERING.md 22.3: adds its tensors through ``target``
        if attention is not None:
            nodes += [piece for part in attention for piece in split_channels(target.graph, part) or [part]]
            continue
        glu = expand_glu(target.graph, node) or expand_softmax(target.graph, node) \
            or expand_resize_bilinear(target.graph, node, spec) \
            or expand_rsqrt(target.graph, node) \
            or expand_transpose(target.graph, node)  # LOWERING.md 22.1, 22.2, 19.1, 24 (a hybrid's fp16 1/sqrt), 36
        if glu is not None:
            for tensor in glu[0]:
                target.add(tensor)
            nodes += [piece for part in glu[1] for piece in split_channels(target.graph, part) or [part]]
            continue
        slices = split_channels(target.graph, node)
        if slices is not None:
            nodes += slices
            continue
        transposed = split_conv_transpose(target.graph, node, spec)  # spec: the cropped phases' atom (LOWERING.md 40)
        if transposed is not None:
            tensors, conv, moves = transposed
            for tensor in tensors:
                target.add(tensor)
            nodes += [*_with_host_activation(target, conv), *moves]  # an fp16 sigmoid head goes to the host too
            continue
        lanes = lanes_tensor(target.graph, node, spec)  # a broadcast operand's replicated copy (build_adapt)
        if lanes is not None:
            target.add(lanes)
        nodes += _with_host_activation(target, node)
    return target.graph, nodes


def _with_host_activation(target: _GraphCopy, node) -> list:
    """[conv, next node] for a conv whose fused parts split (build_adapt.split_lut_activation:
    an int8 LUT activation after a residual to the host, a float16 residual Add after a LUT
    activation to a DPU layer), with the tensor between them added; else [node]."""
    split = split_lut_activation(target.graph, node)
    if split is None:
        return [node]
    conv, activation, quant = split
    source = target.graph.tensor(activation.outputs[0])
    target.add(Tensor(conv.outputs[0], tuple(source.shape), source.dtype, quant=quant))
    return [conv, activation]


def _resolve(layer, aliases: Mapping[str, str]):
    """The layer reading the stored tensors of any alias it reads."""
    if not aliases:
        return layer
    if isinstance(layer, ConvLayer):
        residual = layer.residual
        if residual is not None and residual.tensor in aliases:
            residual = dataclasses.replace(residual, tensor=aliases[residual.tensor])
        return dataclasses.replace(layer, input=aliases.get(layer.input, layer.input), residual=residual,
                                   weight_source=aliases.get(layer.weight_source, layer.weight_source))
    if isinstance(layer, (EltwiseLayer, ConcatLayer, FlatConcatLayer, CpuOp)):
        return dataclasses.replace(layer, inputs=tuple(aliases.get(name, name) for name in layer.inputs))
    return dataclasses.replace(layer, input=aliases.get(layer.input, layer.input))


def _host_step(graph: Graph, node, spec) -> bool:
    """NPU-partitioned nodes the build runs as CPU steps: int8 <-> float16 conversions the DPU
    cannot do (DataConvert, passes/lower_data_convert.host_reason), element-wise ops with a constant operand,
    and channel Concats whose slices do not start on C2 surfaces (float16 standalone
    ReLU/Clip/LeakyRelu and LUT activations are lowered, LOWERING.md 28)."""
    kind = op_table.lowering(node.op_type)
    if kind == "convert":  # a DPU task unless lower_data_convert names a limit (LOWERING.md 26)
        return data_convert_host_reason(graph, node) is not None
    if kind == "eltwise" and any(graph.tensor(name).is_const for name in node.inputs[:2]):
        return True  # a constant operand that no fusion folded: not lowered (layer_from_node)
    if kind == "concat":
        return not concat_fits_surfaces(graph, node, spec)
    return False


def _broadcasting_eltwise(graph: Graph, node) -> bool:
    """An element-wise NPU node with broadcasting feature-map operands that the NPU does not run
    (e.g. a [1, 1, H, W] map as Sub's first operand): a CPU step. A [1, 1, H, W] operand is
    replicated across lanes (build_adapt.lane_broadcast_operand), a [1, C, 1, 1] gate read by the
    ERDMA's per-channel mode (build_adapt.channel_gate_operand), both on the NPU."""
    if op_table.lowering(node.op_type) != "eltwise" or node.fused or len(node.inputs) < 2:
        return False
    operands = [graph.tensor(name) for name in node.inputs[:2]]
    if any(t.is_const for t in operands):
        return False
    on_npu = lane_broadcast_operand(graph, node) is not None or channel_gate_operand(graph, node) is not None
    return tuple(operands[0].shape) != tuple(operands[1].shape) and not on_npu


__all__ = ["Records", "layer_records", "reads", "writes"]
