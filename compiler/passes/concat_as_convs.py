"""A channel Concat whose inputs do not start on C2 surfaces, as a chain of placement convs.

The NPU's channel Concat is a matter of addresses plus DPU copies, one per input into its
channel slice of the output (LOWERING.md 10.1). The DPU writes whole NC1HWC2 pixel atoms (C2
channels: 16 int8, 8 float16 on rk3588 [V] hardware.md 3), so an input that starts inside an
atom cannot be copied without overwriting its neighbours' channels, and such a Concat ran as a
host step (``layer_records._host_step``). YOLOX's detection head is the case that matters:
``Concat(box[4], objectness[1], classes[k])`` at each of its three scales.

Here each input ``x_k`` (``C_k`` channels at output offset ``o_k``) becomes a 1x1 conv to all
``C`` output channels whose weight is 1 at ``[o_k + i, i]`` and 0 elsewhere (the input placed
at its offset, zeros around it), and the convs are chained through residual adds:
``t_1 = P_1(x_1)``, ``t_k = P_k(x_k) + t_(k-1)``, the last ``t`` being the Concat's output.
The fusion stage after the rewrites turns each ``P_k + t`` into one Conv+Add layer (the DPU's
EW stage reads ``t_(k-1)``), so K inputs are K NPU layers. Every output element is one input
value plus exact zeros: float16 is exact (fp32 accumulation of x*1 and 0s); int8 rounds
once per input: the partial results and the output share one scale and zero point
(``PLACEMENT_ATTR``, quant/sharing.py), so the residual adds move stored values unchanged, as
the aligned Concat's DPU copy requantizes each input once.

[I] chosen over a DPU copy with a channel offset inside the atom: no fixture shows the DPU
writing part of an atom, while convs with residual add are the path the compiler already
lowers and the emulator already checks. Only Concats that would otherwise be a host step are
rewritten (an input other than the last ends off a C2 boundary for the build's element size);
aligned ones stay copies by address, so existing builds do not change.
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .context import PassContext
from .match import add_tensor_like, new_constant


#: Attribute of a placement conv: in int8 its output shares the parameters of the partial
#: concatenation its residual add reads (quant/sharing.py), so each input is rounded once.
PLACEMENT_ATTR = "placement"


def element_c2(ctx: PassContext) -> int:
    """C2 of the build's feature maps (int8 for int8 and hybrid builds: the stricter alignment)."""
    return ctx.platform.c2("fp16" if ctx.element_bytes == 2 else "int8")


def _unaligned_concat(graph: Graph, node: Node, c2: int) -> bool:
    """A 4-D channel Concat of feature maps with an input other than the last ending off a C2 boundary."""
    if node.op_type != "Concat" or node.fused or len(node.inputs) < 2 or len(node.outputs) != 1:
        return False
    shape = graph.tensors[node.outputs[0]].shape
    if len(shape) != 4 or shape[0] != 1 or int(node.attrs.get("axis", 1)) % 4 != 1:
        return False
    tensors = [graph.tensors[name] for name in node.inputs]
    if any(t.is_const or np.dtype(t.dtype).kind != "f" or len(t.shape) != 4 for t in tensors):
        return False
    return any(t.shape[1] % c2 for t in tensors[:-1])


def placement_weights(channels: int, offset: int, total: int) -> np.ndarray:
    """[total, channels, 1, 1]: input channel i lands on output channel offset + i."""
    weights = np.zeros((total, channels, 1, 1), np.float32)
    weights[offset + np.arange(channels), np.arange(channels), 0, 0] = 1.0
    return weights


def _placement_chain(graph: Graph, concat: Node) -> list[Node]:
    output = concat.outputs[0]
    shape, dtype = graph.tensors[output].shape, graph.tensors[output].dtype
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1,
             PLACEMENT_ATTR: 1}
    nodes: list[Node] = []
    offset, partial = 0, None
    for index, name in enumerate(concat.inputs):
        channels = graph.tensors[name].shape[1]
        last = index == len(concat.inputs) - 1
        weight = new_constant(graph, f"{concat.name}_place{index}_weight",
                              placement_weights(channels, offset, shape[1]))
        placed = add_tensor_like(graph, f"{output}_place{index}", shape, dtype)
        nodes.append(Node(graph.unique_node_name(f"{concat.name}_place{index}"), "Conv", [name, weight], [placed],
                          dict(attrs)))
        if partial is not None:
            summed = output if last else add_tensor_like(graph, f"{output}_part{index}", shape, dtype)
            nodes.append(Node(graph.unique_node_name(f"{concat.name}_join{index}"), "Add", [placed, partial],
                              [summed]))
            placed = summed
        partial, offset = placed, offset + channels
    return nodes


def concat_as_placement_convs(graph: Graph, ctx: PassContext) -> int:
    """A channel Concat with an input off a C2 boundary becomes 1x1 placement convs chained by residual Adds."""
    c2 = element_c2(ctx)
    rewritten = 0
    for concat in [node for node in graph.nodes if _unaligned_concat(graph, node, c2)]:
        chain = _placement_chain(graph, concat)
        index = graph.nodes.index(concat)
        graph.nodes[index:index + 1] = chain
        rewritten += 1
    return rewritten


__all__ = ["PLACEMENT_ATTR", "concat_as_placement_convs", "element_c2", "placement_weights"]
