"""Softmax over the channel axis of a float16 [1, C, H, W] feature map on the NPU (LOWERING.md
22.2), built from records the build already lowers - fp16 1x1 convs (CNA), the fp16 DPU LUT
and DPU element-wise Add - at build stage 5 (``layer_records``), as Glu is (lower_glu.py).

softmax(x)_i = exp(d_i - L) with d = x - m for any m (here about the maximum, so that the
dominant terms of d are small and exactly stored in fp16) and L = log sum_j exp(d_j), built as
a tree of pairwise log-sum-exps lse(a, b) = a + softplus(b - a). s = ceil(log2 C) steps each;
at step k (w = 2^k) channel i combines itself with channel i + w, so after the last step
channel 0 holds the whole reduction; a channel without partner (i + w >= C) gets zero weights
and a large negative bias, which the stage maps to "no change".

1. maximum, s tasks: a 1x1 conv with weights ``W[i, i + w] = 1, W[i, i] = -1``, Relu, and the
   running map as its residual Add after the activation: m_i + relu(m_{i+w} - m_i). Exact
   unless fp32 rounds the difference (values of very different magnitude); softmax is
   shift-invariant, so only
   "about the maximum, the same for every channel" matters (channel 0 is broadcast below);
2. a 1x1 conv with weights ``W[i, 0] = -1`` and x as its residual: d_i = x_i - m;
3. log-sum-exp, 2s tasks: the same conv with the Softplus LUT fused, then an element-wise Add:
   L_i + softplus(L_{i+w} - L_i) (a partner-less row reads softplus's end entry, 3.4e-4, the
   LUT's floor for any partner more than 8 below); L is in [0, log C];
4. the conv of 2. on L with d as the residual: d_i - L;
5. the Elu LUT (alpha 1): e^(d - L) - 1 (d - L <= 0 up to rounding);
6. a 1x1 identity conv with bias 1: y = e^(d - L).

3s + 4 tasks (C = 40: 22; the vendor's exSoftmax13 runs 13 on a transposed copy, with a DPU
reduction mode the emulator does not model and an EW division the element-wise layer does not
lower; exp and division are what the log-sum-exp form avoids, LOWERING.md 22.2).
int8 builds keep Softmax on the host (the vendor runs it in float16 even in int8 builds).
Over 512 channels the C x C steps no longer pay: softmax_wide.py's chain (LOWERING.md 25).
"""

from __future__ import annotations

import numpy as np

from ..ir import FusedOp, Graph, Node, QuantParams, Tensor
from .softmax_steps import FLOAT16, NO_PARTNER_BIAS, step_weights, steps
from .softmax_wide import WIDE_FROM, expand_wide_softmax


def _const(graph: Graph, base: str, data: np.ndarray, quant: QuantParams | None) -> Tensor:
    return Tensor(graph.unique_tensor_name(base), tuple(data.shape), "float32", data=data, quant=quant)


def _conv(name: str, x: str, weight: Tensor, bias: Tensor, output: str, fused=()) -> Node:
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}
    return Node(name, "Conv", [x, weight.name, bias.name], [output], attrs, list(fused), "NPU")


def expand_softmax(graph: Graph, node: Node) -> tuple[list[Tensor], list[Node]] | None:
    """(new tensors, nodes) of an NPU Softmax over channels; None for any other node. A Softmax
    not stored in float16 (an int8 build) stays one host step."""
    if node.op_type != "Softmax" or node.target != "NPU":
        return None
    source, output = graph.tensor(node.inputs[0]), graph.tensor(node.outputs[0])
    if any(t.quant is None or t.quant.dtype != "float16" for t in (source, output)):
        return [], [Node(node.name, node.op_type, list(node.inputs), list(node.outputs), dict(node.attrs),
                         list(node.fused), "CPU")]
    channels, shape, base = int(source.shape[1]), tuple(source.shape), node.outputs[0]
    if channels >= WIDE_FROM:  # C x C step convs no longer pay: LOWERING.md 25
        return expand_wide_softmax(graph, node)
    tensors: list[Tensor] = []
    nodes: list[Node] = []

    def feature(suffix: str) -> str:
        tensor = Tensor(f"{base}_{suffix}", shape, source.dtype, quant=output.quant)
        tensors.append(tensor)
        return tensor.name

    def const(suffix: str, data: np.ndarray, quant=FLOAT16) -> Tensor:
        tensor = _const(graph, f"{base}_{suffix}", data, quant)
        tensors.append(tensor)
        return tensor

    def step_conv(k: int, running: str, result: str, fused) -> None:
        weights, bias = step_weights(channels, 1 << k)
        w, b = const(f"{result}_w", weights), const(f"{result}_b", bias, None)
        nodes.append(_conv(f"{node.name}_{result[len(base) + 1:]}", running, w, b, result, fused))

    def shift(running: str, residual: str, suffix: str) -> str:
        spread = np.zeros((channels, channels, 1, 1), np.float32)
        spread[:, 0, 0, 0] = -1.0  # every channel minus channel 0
        w, b = const(f"{suffix}_w", spread), const(f"{suffix}_b", np.zeros(channels, np.float32), None)
        result = feature(suffix)
        nodes.append(_conv(f"{node.name}_{suffix}", running, w, b, result, [FusedOp("Add", {}, [residual])]))
        return result

    running = source.name
    for k in range(steps(channels)):  # 1. the maximum into channel 0
        maximum = feature(f"max{k}")
        step_conv(k, running, maximum, [FusedOp("Relu"), FusedOp("Add", {}, [running])])
        running = maximum
    centred = shift(running, source.name, "centred")  # 2.
    running = centred
    for k in range(steps(channels)):  # 3. log-sum-exp into channel 0
        gap, total = feature(f"lse{k}_softplus"), feature(f"lse{k}")
        step_conv(k, running, gap, [FusedOp("Softplus")])
        nodes.append(Node(f"{node.name}_lse{k}_add", "Add", [running, gap], [total], {}, [], "NPU"))
        running = total
    shifted = shift(running, centred, "shifted")  # 4.
    gated = feature("exp_minus_one")
    nodes.append(Node(f"{node.name}_exp", "Elu", [shifted], [gated], {"alpha": 1.0}, [], "NPU"))  # 5.
    identity = np.eye(channels, dtype=np.float32).reshape(channels, channels, 1, 1)
    w, b = const("plus_one_w", identity), const("plus_one_b", np.ones(channels, np.float32), None)
    nodes.append(_conv(node.name, gated, w, b, output.name))  # 6.
    return tensors, nodes


__all__ = ["FLOAT16", "NO_PARTNER_BIAS", "expand_softmax", "step_weights", "steps"]
