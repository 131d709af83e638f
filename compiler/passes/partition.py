"""NPU/CPU partition: which unit runs each layer, and why.

Every op the NPU can run is listed in :data:`NPU_OPS` with the unit that runs it and its
constraints (``constraints.py``): the ops of each rule group of :data:`RULES` are the op table's
rows with that ``npu`` group (``compiler/op_table.py``). A layer runs on the NPU when its op is listed and every
constraint holds; otherwise on the CPU, with the first failed rule and its detail as the
reason (``rule: detail``) (what ``npuemu compile --dump-ir``/``--dump-json``/``--partition-report`` show).
Everything not listed or failing its rules (Softmax off the channel axis or in int8,
LayerNormalization, align_corners bilinear Resize other than to s(n-1)+1, Transpose other than H <-> W, ReduceMax, ArgMax, Slice, Gather, ...) runs on the CPU: there is no NPU lowering for it. The list is the
plan of what the NPU lowering handles: CNA convolutions (direct, depthwise, dilated,
transposed in deconv mode, fully connected as 1x1), DPU element-wise ops and activations
(the ReLU family in the BS stage, the others by look-up table), PPU pooling, and
channel-axis concat/split and no-op reshapes by address.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .. import op_table
from ..ir import Graph, Node
from . import constraints as c
from .context import PassContext
from .recurrent_constraint import recurrent_unrolled
from .input_readin import graph_input
from .resize_bilinear import resize_on_npu
from .space_to_depth import space_to_depth_rewritten
from .rewritten_ops import rewritten_by_a_pass
from .transpose_npu import transpose_swaps_height_width

NPU, CPU = "NPU", "CPU"
_COMMON = (c.float_tensors, c.feature_maps_4d, c.cube_size)
_ELEMENTWISE = (c.float_tensors, c.feature_maps_upto_4d, c.cube_size)  # any rank <= 4, laid out as NCHW
_CONV = (c.constant_weights, c.conv_groups, c.kernel_size, c.conv_strides, c.conv_dilations, c.conv_pads,
         c.conv_widths, c.conv_kernels, c.fits_cbuf, c.fused_parts)


@dataclass(frozen=True)
class NpuOp:
    """Op types the NPU runs, on which unit, under which constraints."""

    ops: tuple[str, ...]
    unit: str
    constraints: tuple[c.Constraint, ...]


#: The rule group of each op's ``npu`` field (compiler/op_table.py): the unit that runs it and
#: the constraints a layer must meet, in the order SUPPORT.md lists them.
RULES: dict[str, tuple[str, tuple[c.Constraint, ...]]] = {
    "conv": ("CNA convolution, DPU bias/activation/residual", (*_COMMON, *_CONV)),
    "conv_transpose": ("CNA convs of its stride phases written interleaved by the DPU, also where the pads crop "
                       "(one conv per phase of the kept rows, LOWERING.md 40); a stacked conv plus host DepthToSpace "
                       "and crop where the phase writes cannot (RK356x atoms, 1-pixel phases)",
                       (*_COMMON, c.constant_weights, c.deconv_form, c.deconv_lowered, c.kernel_size, c.conv_widths,
                        c.conv_kernels, c.fused_parts)),
    "fully_connected": ("CNA 1x1 convolution on [1,K,1,1]",
                        (c.float_tensors, c.constant_weights, c.one_row, c.fc_size, c.fused_parts)),
    "eltwise": ("DPU element-wise (BS/EW stage)", (*_ELEMENTWISE, c.eltwise_operands)),
    "relu": ("DPU BS stage (ReLU/clip)", _ELEMENTWISE),
    "prelu": ("DPU BS stage (PReLU)", (*_COMMON, c.prelu_slope)),
    "lut": ("DPU look-up table", _ELEMENTWISE),
    "pool": ("PPU pooling", (*_COMMON, c.pool_values_only, c.pool_window, c.pool_ceil_mode, c.average_padding)),
    "global_pool": ("PPU pooling over the plane", (*_COMMON, c.global_pool_window)),
    "concat_split": ("by address / DPU copy", (*_COMMON, c.channel_axis_only)),
    "glu": ("DPU look-up table (sigmoid) + DPU element-wise Mul, halves by address",
            (*_COMMON, c.channel_axis_only, c.glu_halves)),
    "softmax": ("CNA 1x1 convs + DPU look-up tables (pairwise log-sum-exp over the channels; over 512 channels "
                "max, e^d, sum and 1/sum, LOWERING.md 25)",
                (*_COMMON, c.softmax_float16, c.softmax_channel_axis, c.softmax_channels)),
    "attention": ("CNA 1x1 convs with run-time weights + the softmax chain, per head",
                  (*_COMMON, c.attention_float16, c.attention_heads)),
    "resize": ("DPU unpooling (nearest, whole factors); bilinear: DPU edge copies + depthwise phase convs",
               (*_COMMON, resize_on_npu)),
    "view": ("by address (no data moved)", (c.float_tensors, c.same_native_bytes)),
    "readout": ("the runtime's readout of a graph output (host, with its NC1HWC2 -> NCHW; no layer)",
                (c.float_tensors, c.graph_output)),
    "space_to_depth": ("CNA conv of 0/1 weights, kernel = stride = blocksize (LOWERING.md 33.1)",
                       (space_to_depth_rewritten,)),
    "readin": ("the runtime's readin of a graph input (host, with its NCHW -> NC1HWC2; no layer)",
               (c.float_tensors, graph_input)),  # LOWERING.md 33.4
    "recurrent": ("unrolled into 1x1 convs, DPU look-up tables and element-wise layers (LOWERING.md 30, 31)",
                  (recurrent_unrolled,)),
    "flat_concat": ("DPU copies, one per input, into its columns of the output (LOWERING.md 29)",
                    (c.float_tensors, c.feature_maps_4d, c.flat_concat_columns)),
    "rewritten": ("the layers a graph pass rewrites it into (LOWERING.md 20.3, 24, 32)", (rewritten_by_a_pass,)),
    "transpose": ("DPU-only copies in the vendor's forms: H<->W one per C1 surface, the other perms with TP_EN, "
                  "TP_ORG_EN tiles and a compacting copy (LOWERING.md 35, 36)",
                  (c.float_tensors, transpose_swaps_height_width)),
    "matmul_act": ("CNA 1x1 convs with run-time weights (the second operand's bytes), per head and surface "
                   "(LOWERING.md 37)", (c.float_tensors, c.matmul_activations)),
}

NPU_OPS: tuple[NpuOp, ...] = tuple(NpuOp(op_table.npu_group(group), unit, rules)
                                   for group, (unit, rules) in RULES.items() if op_table.npu_group(group))
_BY_OP = {op: entry for entry in NPU_OPS for op in entry.ops}


@dataclass(frozen=True)
class Decision:
    node: str
    layer: str
    op: str
    target: str
    reason: str


def decide(graph: Graph, node: Node, ctx: PassContext) -> Decision:
    """NPU or CPU for one node, with the unit or the reason."""
    entry = _BY_OP.get(node.op_type)
    if entry is None:
        return Decision(node.name, node.layer_name, node.display_op, CPU, f"no NPU lowering for {node.op_type}")
    for constraint in entry.constraints:
        detail = constraint(graph, node, ctx)
        if detail is not None:
            rule = constraint.describe(ctx).rstrip(".")
            return Decision(node.name, node.layer_name, node.display_op, CPU, f"{rule}: {detail}")
    return Decision(node.name, node.layer_name, node.display_op, NPU, entry.unit)


@dataclass(frozen=True)
class Partition:
    chip: str
    decisions: tuple[Decision, ...]

    def by_node(self) -> dict[str, Decision]:
        return {decision.node: decision for decision in self.decisions}

    def count(self, target: str) -> int:
        return sum(decision.target == target for decision in self.decisions)

    def cpu_ops(self) -> Counter[str]:
        return Counter(decision.op for decision in self.decisions if decision.target == CPU)

    def report(self) -> str:
        """A table: one line per layer (index, target, op, layer name, unit or reason)."""
        lines = [f"partition for {self.chip}: {self.count(NPU)} layers on the NPU, {self.count(CPU)} on the CPU"]
        width = len(str(max(len(self.decisions) - 1, 0)))
        for index, decision in enumerate(self.decisions):
            lines.append(f"{index:>{width}} {decision.target}  {decision.op}  {decision.layer}  - {decision.reason}")
        return "\n".join(lines) + "\n"


def partition(graph: Graph, ctx: PassContext) -> Partition:
    """Decide every node's target (sets ``node.target``) and return the decisions."""
    decisions = []
    for node in graph.nodes:
        decision = decide(graph, node, ctx)
        node.target = decision.target
        decisions.append(decision)
    return Partition(ctx.platform.name, tuple(decisions))


def annotate_ir_text(text: str, graph: Graph, split: Partition) -> str:
    """The IR text (``ir_text.format_graph``: header lines, then one line per node) with each
    CPU layer's reason appended to its line."""
    lines = text.rstrip("\n").split("\n")
    start = len(lines) - len(graph.nodes)
    decisions = split.by_node()
    for offset, node in enumerate(graph.nodes):
        decision = decisions.get(node.name)
        if decision is not None and decision.target == CPU:
            lines[start + offset] += f": {decision.reason}"
    return "\n".join(lines) + "\n"


def annotate_layers(document: dict, graph: Graph, split: Partition) -> dict:
    """Add ``target`` and ``target_reason`` (the unit, or why the CPU) to each layer of a
    per-layer JSON document (``perf_json.perf_json``, one layer per node in order)."""
    decisions = split.by_node()
    for layer, node in zip(document["layers"], graph.nodes):
        decision = decisions.get(node.name)
        if decision is not None:
            layer["target"], layer["target_reason"] = decision.target, decision.reason
    return document
