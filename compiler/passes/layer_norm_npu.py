"""LayerNormalization over the channel axis of a ``[1, C, 1, T]`` map as layers the NPU runs
(LOWERING.md section 21): the token regions of ``tokens_as_channels`` normalize each token
(pixel) over its C channels.

    m = Conv(x, 1/C)              one output channel: the mean of every pixel   (CNA + DPU)
    d = Sub(x, m)                 m broadcast over the channels (LOWERING.md 16) (DPU, 2 tasks)
    q = Mul(d, d)                                                              (DPU)
    v = Conv(q, 1/C) + eps        the variance plus eps, one channel           (CNA + DPU)
    r = Rsqrt(v, floor eps)       1 / sqrt: look-up tables (LOWERING.md 24)     (DPU, passes/lower_rsqrt)
    n = Mul(d, r)                 r broadcast over the channels                (DPU, 2 tasks)
    y = depthwise 1x1 Conv(n, gamma) + beta                                    (CNA + DPU)

The vendor's exNorm has the same skeleton [V] (rknn-fixtures-ops layernorm_fp16 regcmd.txt):
task 6 is a 1x1 conv of the 120 channels to ONE kernel whose BS and BN multipliers are
+-sqrt(1/120) (0x2dd8 / 0xadd8 = -mean), task 7 a conv from that channel back to 120 kernels
with the DPU's EW stage adding x (d = x - m), task 9 the variance conv (BS ALU adds 0.0012 =
120 eps). Its reciprocal square root (tasks 10-19) is the fp32 bit trick: an int16 pass
``0x5f37 - (bits >> 1)`` and three Newton steps ``y (1.5 - 0.5 v y^2)`` in DPU-only tasks -
integer reinterpretation of fp32 bits that the emulator does not model (NUMERICS.md), so
``r`` is the composite ``Rsqrt`` here (v >= eps, so the floor changes nothing): one int8 LUT
layer, or in float16 a product of LUT pieces (passes/lower_rsqrt.py, LOWERING.md 24), on T
values rather than the C x T map. Gamma and beta are the scale+bias depthwise conv every
unfolded affine map becomes (LOWERING.md 18).

fp16 choices [C]: the mean weights are fp16(1/C) (relative error <= 2^-12 on the mean); the
square is formed in fp16, so |x - mean| must stay below 255 (fp16's 65504 = 255.9^2).
"""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from .lower_rsqrt import RSQRT
from .match import add_tensor_like, new_constant

#: the 1/sqrt of the statistics (a DPU look-up table op, passes/lower_rsqrt.py)
RSQRT_OP = RSQRT


def channel_layer_norm(graph: Graph, index: int, x: str, y: str, gamma: np.ndarray, beta: np.ndarray | None,
                       eps: float, name: str) -> int:
    """Insert at ``index`` the layers normalizing ``x`` ([1, C, 1, T]) per pixel over the
    channels into ``y``; returns the number of nodes inserted."""
    channels, tokens = graph.tensors[x].shape[1], graph.tensors[x].shape[3]
    dtype = graph.tensors[x].dtype
    stat_shape = (1, 1, 1, tokens)

    def tensor(suffix: str, shape: tuple[int, ...]) -> str:
        return add_tensor_like(graph, f"{name}_{suffix}", shape, dtype)

    mean_w = new_constant(graph, f"{name}_mean_weight", np.full((1, channels, 1, 1), 1.0 / channels))
    eps_bias = new_constant(graph, f"{name}_eps", np.full((1,), eps))
    zero_bias = new_constant(graph, f"{name}_zero", np.zeros((1,)))
    m, d, q = tensor("mean", stat_shape), tensor("centered", (1, channels, 1, tokens)), tensor("square", (1, channels, 1, tokens))
    v, r = tensor("variance", stat_shape), tensor("rstd", stat_shape)
    n = tensor("normalized", (1, channels, 1, tokens))
    nodes = [
        _conv(graph, f"{name}_mean", [x, mean_w, zero_bias], m, 1),
        Node(graph.unique_node_name(f"{name}_sub"), "Sub", [x, m], [d], {}),
        Node(graph.unique_node_name(f"{name}_square"), "Mul", [d, d], [q], {}),
        _conv(graph, f"{name}_variance", [q, mean_w, eps_bias], v, 1),
        Node(graph.unique_node_name(f"{name}_rsqrt"), RSQRT_OP, [v], [r], {"alpha": float(eps)} if eps > 0 else {}),
        Node(graph.unique_node_name(f"{name}_scale"), "Mul", [d, r], [n], {}),
    ]
    gamma_w = new_constant(graph, f"{name}_gamma", np.asarray(gamma, dtype=np.float32).reshape(channels, 1, 1, 1))
    shift = np.zeros(channels, dtype=np.float32) if beta is None else np.asarray(beta, dtype=np.float32).reshape(channels)
    nodes.append(_conv(graph, f"{name}_affine", [n, gamma_w, new_constant(graph, f"{name}_beta", shift)], y, channels))
    graph.nodes[index:index] = nodes
    return len(nodes)


def _conv(graph: Graph, name: str, inputs: list[str], output: str, group: int) -> Node:
    attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": group}
    return Node(graph.unique_node_name(name), "Conv", inputs, [output], attrs)


__all__ = ["channel_layer_norm", "RSQRT_OP"]
