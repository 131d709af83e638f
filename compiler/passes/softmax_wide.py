"""Softmax over many channels (C > 512) of a float16 [1, C, H, W] map on the NPU (LOWERING.md 25),
built at build stage 5 from records the build already lowers, as lower_softmax's 22.2 chain is.

22.2's chain spends C x C 1x1 convs per step (C = 6625, PP-OCRv4 rec's classes: 44 M weights
each). This one moves channels only by address (channel slices starting on a C2 surface) and
convs with few kernels or few inputs, and normalizes by a reciprocal instead of log-sum-exps:

1. the maximum, exactly: while the running map has more than 16 channels, the element-wise
   Max of its first h channels and its last h (h the least width >= C/2 with h = C mod 8, so the
   second slice starts on a surface; the two overlap where C is odd, which the maximum does not
   mind); then 22.2's pairwise steps (at most 16 x 16 convs) put it into channel 0;
2. d = x - m: a conv of that small map (weights -1 on channel 0, k -> C kernels) with x as its
   residual: one fp32 difference of two fp16 values, rounded once (d <= 0, the maximum's d = 0);
3. u = 1 + Elu(d / 2) = e^(d/2): a depthwise 1x1 conv (x 0.5) with the Elu LUT fused, then a
   depthwise 1x1 conv adding 1; the Elu table spans [-8, 0], so e^d reaches down to d = -16
   (e^-16 = 1.1e-7; PP-OCRv4 rec keeps up to 11 % of a token's mass between d = -16 and -8, which
   1 + Elu(d) over [-8, 0] alone would drop);
4. e = u * u (element-wise Mul) = e^d;
5. s = sum_c e_c: 1x1 convs with one kernel of ones over channel slices the CBUF holds whole
   (a row of at most 128 KiB), their partial sums added: s in [1, C] ([1, 1, H, W]);
6. r = 1 / s by Newton's iteration r <- r (2 - s r) from r_0 = 2 / (C + 1) (the first step a
   later ones a Mul, a conv 2 - t and a Mul on [1, 1, H, W]): the
   error 1 - s r squares each step from at most 1 - 2 / (C + 1), so ceil(log2(ln(2^-13) /
   ln(1 - 2 / (C + 1)))) steps reach fp16 precision (C = 6625: 15), plus one; the first step
   is two convs of s (2 - r_0 s, then x r_0);
7. y = e * r: a conv broadcasting r to C channels (weights 1), then a Mul.

No exp LUT kind and no element-wise division is needed (the op table has neither); the price is
the Newton steps on a one-channel map. int8 builds keep Softmax on the host (22.2).
"""

from __future__ import annotations

import math

import numpy as np

from ..ir import FusedOp, Graph, Node, Tensor
from .softmax_steps import FLOAT16, step_weights, steps

WIDE_FROM = 513  # channel counts above 22.2's limit (lower_softmax keeps C <= 512 as it was)
MAX_CHANNELS = 32768  # s <= C must stay below fp16's largest value (65504)
TAIL = 16  # the halving stops at this many channels; 22.2's pairwise steps finish
ELU_DOMAIN = 8.0  # lut.FP16_DOMAIN["elu"]: Elu(d / 2) covers d in [-16, 0]
ROW_BYTES = 128 * 1024  # a summed channel slice: at most this many bytes per input row (4 CBUF banks)
SURFACE = 8  # float16 C2: a slice starts on a surface


def halvings(channels: int) -> list[int]:
    """The widths h of the halving steps from ``channels`` down to TAIL or fewer."""
    widths, current = [], channels
    while current > TAIL:
        half = -(-current // 2)
        half += (current - half) % SURFACE  # h = C (mod 8): the second slice starts on a surface
        widths.append(half)
        current = half
    return widths


def newton_steps(channels: int) -> int:
    """Newton steps for 1/s, s in [1, C], from 2 / (C + 1) to fp16 precision, plus one."""
    error = 1.0 - 2.0 / (channels + 1)
    return max(1, math.ceil(math.log2(math.log(2.0 ** -13) / math.log(error)))) + 1 if error > 0 else 1


def sum_slices(channels: int, width: int) -> list[tuple[int, int]]:
    """(start, size) of the channel slices step 5 sums: starts on surfaces, rows within ROW_BYTES."""
    per = max(SURFACE, ROW_BYTES // (2 * max(1, width)) // SURFACE * SURFACE)
    return [(start, min(per, channels - start)) for start in range(0, channels, per)]


class _Chain:
    """Collects the tensors and nodes of one expansion."""

    def __init__(self, graph: Graph, node: Node) -> None:
        self.graph, self.node = graph, node
        self.base = node.outputs[0]
        self.quant = graph.tensor(node.outputs[0]).quant
        self.dtype = graph.tensor(node.inputs[0]).dtype
        self.tensors: list[Tensor] = []
        self.nodes: list[Node] = []

    def feature(self, suffix: str, channels: int, plane: tuple[int, int]) -> str:
        tensor = Tensor(f"{self.base}_{suffix}", (1, channels, *plane), self.dtype, quant=self.quant)
        self.tensors.append(tensor)
        return tensor.name

    def const(self, suffix: str, data: np.ndarray, quant=FLOAT16) -> str:
        name = self.graph.unique_tensor_name(f"{self.base}_{suffix}")
        while any(t.name == name for t in self.tensors):
            name += "_"
        self.tensors.append(Tensor(name, tuple(data.shape), "float32", data=np.asarray(data, np.float32), quant=quant))
        return name

    def add(self, suffix: str, op: str, inputs: list[str], output: str, attrs=None, fused=()) -> None:
        name = self.node.name if output == self.base else f"{self.node.name}_{suffix}"
        self.nodes.append(Node(name, op, inputs, [output], dict(attrs or {}), list(fused), "NPU"))

    def conv(self, suffix: str, x: str, weights: np.ndarray, bias: np.ndarray, output: str, fused=(),
             group: int = 1) -> None:
        attrs = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": group}
        w, b = self.const(f"{suffix}_w", weights), self.const(f"{suffix}_b", bias, None)
        self.add(suffix, "Conv", [x, w, b], output, attrs, fused)


def expand_wide_softmax(graph: Graph, node: Node) -> tuple[list[Tensor], list[Node]]:
    """(new tensors, nodes) of an NPU float16 Softmax over C > 512 channels (module docstring)."""
    chain = _Chain(graph, node)
    x = node.inputs[0]
    channels, plane = int(graph.tensor(x).shape[1]), tuple(int(d) for d in graph.tensor(x).shape[2:])
    running, width = _maximum(chain, x, channels, plane)
    spread = np.zeros((channels, width, 1, 1), np.float32)
    spread[:, 0] = -1.0
    centred = chain.feature("centred", channels, plane)  # 2. d = x - m
    chain.conv("centred", running, spread, np.zeros(channels, np.float32), centred, [FusedOp("Add", {}, [x])])
    ones = np.ones((channels, 1, 1, 1), np.float32)
    gated = chain.feature("elu_half", channels, plane)  # 3. Elu(d / 2), then + 1
    chain.conv("elu_half", centred, ones * 0.5, np.zeros(channels, np.float32), gated,
               [FusedOp("Elu", {"alpha": 1.0})], group=channels)
    root = chain.feature("exp_half", channels, plane)
    chain.conv("exp_half", gated, ones, np.ones(channels, np.float32), root, group=channels)
    exp = chain.feature("exp", channels, plane)  # 4. e^d
    chain.add("exp", "Mul", [root, root], exp)
    total = _sum(chain, exp, channels, plane)  # 5.
    reciprocal = _reciprocal(chain, total, channels, plane)  # 6.
    spread_r = chain.feature("reciprocal_channels", channels, plane)  # 7.
    chain.conv("reciprocal_channels", reciprocal, np.ones((channels, 1, 1, 1), np.float32),
               np.zeros(channels, np.float32), spread_r)
    chain.add("normalize", "Mul", [exp, spread_r], chain.base)
    return chain.tensors, chain.nodes


def _maximum(chain: _Chain, x: str, channels: int, plane) -> tuple[str, int]:
    """1.: a map of at most TAIL channels whose channel 0 is the maximum over x's channels, and
    its channel count."""
    running, current = x, channels
    for index, half in enumerate(halvings(channels)):
        low, high = chain.feature(f"max_half{index}_low", half, plane), chain.feature(f"max_half{index}_high", half, plane)
        chain.add(f"max_half{index}_low", "ChannelSlice", [running], low, {"start": 0, "size": half})
        chain.add(f"max_half{index}_high", "ChannelSlice", [running], high, {"start": current - half, "size": half})
        merged = chain.feature(f"max_half{index}", half, plane)
        chain.add(f"max_half{index}", "Max", [low, high], merged)
        running, current = merged, half
    for k in range(steps(current)):
        weights, bias = step_weights(current, 1 << k)
        result = chain.feature(f"max_pair{k}", current, plane)
        chain.conv(f"max_pair{k}", running, weights, bias, result, [FusedOp("Relu"), FusedOp("Add", {}, [running])])
        running = result
    return running, current


def _sum(chain: _Chain, exp: str, channels: int, plane) -> str:
    """5.: sum_c e_c as a [1, 1, H, W] map."""
    partial = []
    for index, (start, size) in enumerate(sum_slices(channels, plane[1])):
        source = exp
        if size != channels:
            source = chain.feature(f"sum_slice{index}", size, plane)
            chain.add(f"sum_slice{index}", "ChannelSlice", [exp], source, {"start": start, "size": size})
        result = chain.feature(f"sum{index}", 1, plane)
        chain.conv(f"sum{index}", source, np.ones((1, size, 1, 1), np.float32), np.zeros(1, np.float32), result)
        partial.append(result)
    total = partial[0]
    for index, other in enumerate(partial[1:]):
        added = chain.feature(f"sum_total{index}", 1, plane)
        chain.add(f"sum_total{index}", "Add", [total, other], added)
        total = added
    return total


def _reciprocal(chain: _Chain, total: str, channels: int, plane) -> str:
    """6.: 1 / s by Newton's iteration (module docstring)."""
    start = float(np.float16(2.0 / (channels + 1)))  # r_0, as the fp16 weights hold it
    gap = chain.feature("reciprocal0_gap", 1, plane)  # 2 - s r_0
    chain.conv("reciprocal0_gap", total, np.full((1, 1, 1, 1), -start, np.float32), np.full(1, 2.0, np.float32), gap)
    first = chain.feature("reciprocal0", 1, plane)  # r_1 = r_0 (2 - s r_0)
    chain.conv("reciprocal0", gap, np.full((1, 1, 1, 1), start, np.float32), np.zeros(1, np.float32), first)
    running = first
    for k in range(1, newton_steps(channels)):
        product = chain.feature(f"reciprocal{k}_product", 1, plane)
        chain.add(f"reciprocal{k}_product", "Mul", [total, running], product)
        gap = chain.feature(f"reciprocal{k}_gap", 1, plane)  # 2 - s r
        chain.conv(f"reciprocal{k}_gap", product, np.full((1, 1, 1, 1), -1.0, np.float32), np.full(1, 2.0, np.float32),
                   gap)
        result = chain.feature(f"reciprocal{k}", 1, plane)
        chain.add(f"reciprocal{k}", "Mul", [running, gap], result)
        running = result
    return running


__all__ = ["MAX_CHANNELS", "WIDE_FROM", "expand_wide_softmax", "halvings", "newton_steps", "sum_slices"]
