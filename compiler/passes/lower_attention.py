"""The HeadAttention layer (LOWERING.md 22.3): its float semantics and its records.

``HeadAttention(Z)`` (a composite op only ``attention_npu`` makes) works channel-major, on the
``[1, 3 H P, 1, T]`` output of the qkv projection with T tokens as pixels: q, k and v of head h
are the P channels at ``h P``, ``(H + h) P`` and ``(2 H + h) P`` (P a multiple of 8, the
channels past the head's d features zero, q already scaled), and the output
``[1, H P, 1, T]`` holds head h's ``v softmax_j(k^T q)`` at ``h P``.

At build stage 5 (``layer_records._expand``) it becomes existing records, per head and per
8-channel surface s of the head (P = 8 S):

1. ``scores[j, i] = sum_c k[c, j] q[c, i]``: S 1x1 convs of q's surfaces whose weights are k's
   surfaces (``ConvLayer.weight_source``: a [8, 1, T] float16 map's bytes are the weight blob
   of T kernels x 8 channels), chained by residual adds -> ``[1, T, 1, T]``;
2. the channel Softmax of ``lower_softmax`` (over j);
3. v transposed: ``vt[j, p] = sum_s sum_e v_s[e, j] E_s[e, p] = v[p, j]`` over the P pixels p
   of a map E [1, P, R, W] (W = min(P, 16), R = P / W, ``E[e, p] = [e == p]`` with p = h W + w
   in raster order), S convs of E's surfaces with v's surfaces as weights, chained by residual
   adds; E is made once per layer: zero-weight convs with bias 1 narrow a q surface to one
   pixel holding 1, and an R x W conv with R - 1 rows and W - 1 columns of zero padding on each
   side gives output (h, w) the single tap (R - 1 - h, W - 1 - w), set to 1 for e = h W + w;
4. ``out[e, i] = sum_j vt[j, e] P[j, i]``: one conv per 8-channel surface m of P with the
   weights of surface m of vt (P kernels e x 8 channels j: its P pixels in raster order),
   chained by residual adds;
5. the heads concatenated on the channels (by address where the build places them: a head of
   P = 16 channels is one pass of the float16 kernels, so its conv writes nothing past it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_pack import VENDOR_LAYOUT_OF

from ..ir import FusedOp, Node, QuantParams, Tensor
from ..ops import REGISTRY
from ..ops.base import TensorInfo, as_float, like, register
from .lower_softmax import FLOAT16, expand_softmax

HEAD_ATTENTION = "HeadAttention"
SURFACE = 8  # float16 channels per NC1HWC2 surface on rk3588 [V] hardware.md 3
MAX_KERNEL, MAX_STRIDE = 31, 7  # CNA kernel size and stride fields (partition limits max_kernel, max_stride)


def widest_kernel(platform) -> int:
    """The widest conv kernel the chip's builds can write: :data:`MAX_KERNEL`, or less where npuemu's builds for
    the chip are emitted in a vendor layout whose kernel-width field is narrower - rk3576's CNA 0x1024 holds kw - 1 in
    bits 27:24, so 16 [V ORC: rknn-toolkit2 2.5.0 builds a 1x31 fp16 conv as a 16- and a 15-wide conv on rk3576;
    LOWERING.md 56]. ``platform`` None: :data:`MAX_KERNEL`."""
    family = VENDOR_LAYOUT_OF.get(platform.register_map.family) if platform is not None else None
    if family is None:
        return MAX_KERNEL
    field = load_regmap(family).register("CNA", "WEIGHT_KERNELS").field("WEIGHT_WIDTH")
    return min(MAX_KERNEL, field.maximum + 1)


def _infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    shape, heads, width = inputs[0].shape, attrs["heads"], attrs["head_channels"]
    if len(shape) != 4 or shape[0] != 1 or shape[2] != 1 or shape[1] != 3 * heads * width:
        raise CompileError(f"{HEAD_ATTENTION}: input {list(shape)} is not [1, 3 x {heads} x {width}, 1, T]")
    return [TensorInfo.of((1, heads * width, 1, shape[3]), inputs[0].dtype)]


def head_attention(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """The float semantics (module docstring)."""
    heads, width = attrs["heads"], attrs["head_channels"]
    z = as_float(x[0])[0, :, 0, :]
    out = []
    for h in range(heads):
        q, k, v = (z[(part * heads + h) * width:(part * heads + h + 1) * width] for part in range(3))
        scores = k.T @ q  # [j, i]
        scores = np.exp(scores - scores.max(axis=0, keepdims=True))
        out.append(v @ (scores / scores.sum(axis=0, keepdims=True)))
    return like(np.concatenate(out)[None, :, None, :], x[0])


if HEAD_ATTENTION not in REGISTRY:  # a second import (pytest's importlib mode) finds it registered
    register(HEAD_ATTENTION, infer=_infer)(head_attention)


# ---- build stage 5: the records' nodes -----------------------------------------------------

#: a build-internal Conv attribute: the feature map whose bytes are the weights (the weight input
#: is then a zero constant giving their shape; build_adapt makes it ConvLayer.weight_source)
WEIGHTS_FROM = "weights_from"
_ONE_BY_ONE = {"kernel_shape": [1, 1], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1], "group": 1}


class _Builder:
    """Adds the expansion's tensors through ``add`` (layer_records' graph copy) and collects its
    nodes; names start with the attention output's."""

    def __init__(self, target, node: Node, max_kernel: int = MAX_KERNEL) -> None:
        self.target, self.node, self.nodes = target, node, []
        self.max_kernel = max_kernel   # widest_kernel of the build's chip
        self.base = node.outputs[0]
        self.tokens = int(target.graph.tensor(node.inputs[0]).shape[3])

    def feature(self, suffix: str, channels: int, width: int | None = None, height: int = 1) -> str:
        name = self.target.graph.unique_tensor_name(f"{self.base}_{suffix}")
        self.target.add(Tensor(name, (1, channels, height, width or self.tokens), "float32", quant=FLOAT16))
        return name

    def const(self, suffix: str, data: np.ndarray, quant: QuantParams | None = FLOAT16) -> str:
        name = self.target.graph.unique_tensor_name(f"{self.base}_{suffix}")
        self.target.add(Tensor(name, tuple(data.shape), "float32", data=data.astype(np.float32), quant=quant))
        return name

    def conv(self, suffix: str, x: str, weights: np.ndarray, output: str, *, source: str | None = None,
             residual: str | None = None, bias: np.ndarray | None = None, pads=(0, 0, 0, 0), stride: int = 1,
             group: int = 1) -> None:
        """A float16 conv; ``source``: the map whose bytes are its weights (``weights`` zeros of
        their shape)."""
        bias = np.zeros(weights.shape[0], np.float32) if bias is None else bias
        attrs = {**_ONE_BY_ONE, "kernel_shape": list(weights.shape[2:]), "pads": list(pads), "strides": [1, stride],
                 "group": group}
        if source is not None:
            attrs[WEIGHTS_FROM] = source
        fused = [FusedOp("Add", {}, [residual])] if residual else []
        inputs = [x, self.const(f"{suffix}_w", weights), self.const(f"{suffix}_b", bias, None)]
        self.nodes.append(Node(f"{self.node.name}_{suffix}", "Conv", inputs, [output], attrs, fused, "NPU"))

    def split(self, suffix: str, source: str, sizes: list[int], width: int | None = None,
              height: int = 1) -> list[str]:
        outputs = [self.feature(f"{suffix}{index}", size, width, height) for index, size in enumerate(sizes)]
        self.nodes.append(Node(f"{self.node.name}_{suffix}", "Split", [source], outputs, {"axis": 1}, [], "NPU"))
        return outputs

    def runtime_product(self, suffix: str, inputs: list[str], sources: list[str], kernels: int, output: str) -> None:
        """output = sum_m conv(inputs[m], weights = sources[m]'s bytes), chained by residual adds."""
        running = None
        _, _, height, width = self.target.graph.tensor(output).shape
        for index, (x, source) in enumerate(zip(inputs, sources)):
            channels = int(self.target.graph.tensor(x).shape[1])
            result = output if index == len(inputs) - 1 else self.feature(f"{suffix}_part{index}", kernels, width, height)
            zeros = np.zeros((kernels, channels, 1, 1), np.float32)
            self.conv(f"{suffix}_{index}", x, zeros, result, source=source, residual=running)
            running = result


def _one_pixel_of_ones(b: _Builder, any_map: str) -> str:
    """A [1, 1, 1, 1] map holding 1: zero-weight convs with bias 1 narrowing ``any_map`` (T
    pixels) by kernels of up to ``b.max_kernel`` (31; 16 on rk3576) and strides of up to 7 (CNA limits) until one
    pixel is left."""
    width, source = b.tokens, any_map
    channels = int(b.target.graph.tensor(any_map).shape[1])
    step = 0
    while True:
        kernel = min(width, b.max_kernel)
        stride = MAX_STRIDE if width > kernel else 1
        width = (width - kernel) // stride + 1
        ones = b.feature(f"ones{step}", 1, width)
        b.conv(f"ones{step}", source, np.zeros((1, channels, 1, kernel), np.float32), ones,
               bias=np.ones(1, np.float32), stride=stride)
        if width == 1:
            return ones
        source, channels, step = ones, 1, step + 1


def _identity_map(b: _Builder, any_map: str, width: int) -> list[str]:
    """E [1, P, R, W] (W = min(P, 16), R = P / W) with E[e, h, w] = [e == h W + w], as its
    8-channel surfaces (step 3 of the module docstring)."""
    one = _one_pixel_of_ones(b, any_map)
    columns = min(width, 2 * SURFACE)
    rows = width // columns
    taps = np.zeros((width, 1, rows, columns), np.float32)
    for e in range(width):  # out[e, h, w] = the tap the one pixel meets: (R - 1 - h, W - 1 - w)
        taps[e, 0, rows - 1 - e // columns, columns - 1 - e % columns] = 1.0
    identity = b.feature("identity", width, columns, rows)
    b.conv("identity", one, taps, identity, pads=(rows - 1, columns - 1, rows - 1, columns - 1))
    if width == SURFACE:
        return [identity]
    return b.split("identity_surface", identity, [SURFACE] * (width // SURFACE), columns, rows)


#: other composite ops expanded into run-time-weight convs, by op type (lower_matmul_act.py's
#: ActMatMul, LOWERING.md 37, registers itself: it builds on this module, so it cannot be imported here)
EXPANSIONS: dict[str, Callable[[Any, Node], list[Node] | None]] = {}
Builder = _Builder


def expand_attention(target, node: Node, platform=None) -> list[Node] | None:
    """The nodes of an NPU HeadAttention (module docstring), or of an op in :data:`EXPANSIONS`;
    None for any other node. ``target`` is layer_records' graph copy (``graph``, ``add``); ``platform``
    the chip (its widest kernel, :func:`widest_kernel`)."""
    if node.op_type in EXPANSIONS:
        return EXPANSIONS[node.op_type](target, node)
    if node.op_type != HEAD_ATTENTION:
        return None
    if node.target != "NPU":
        raise CompileError(f"{node.name}: {HEAD_ATTENTION} has no host step; the pass makes it only where the "
                           f"partition runs it on the NPU")
    stored = [target.graph.tensor(name).quant for name in (*node.inputs, *node.outputs)]
    if any(quant is None or quant.dtype != "float16" for quant in stored):
        raise CompileError(f"{node.name}: {HEAD_ATTENTION} is built in float16 only; its input or output was "
                           f"quantized otherwise (a hybrid build: keep the attention block in float16)")
    b = _Builder(target, node, widest_kernel(platform))
    heads, surfaces = int(node.attrs["heads"]), int(node.attrs["head_channels"]) // SURFACE
    tokens = b.tokens
    pieces = b.split("qkv", node.inputs[0], [SURFACE] * (3 * heads * surfaces))
    q, k, v = (pieces[part * heads * surfaces:(part + 1) * heads * surfaces] for part in range(3))
    identity = _identity_map(b, pieces[0], surfaces * SURFACE)
    chunks = [min(SURFACE, tokens - start) for start in range(0, tokens, SURFACE)]
    merged = []
    for h in range(heads):
        mine = slice(h * surfaces, (h + 1) * surfaces)
        scores = b.feature(f"h{h}_scores", tokens)
        b.runtime_product(f"h{h}_scores", q[mine], k[mine], tokens, scores)
        probs = b.feature(f"h{h}_probs", tokens)
        softmax = Node(f"{node.name}_h{h}_softmax", "Softmax", [scores], [probs], {"axis": 1}, [], "NPU")
        tensors, softmax_nodes = expand_softmax(target.graph, softmax)
        for tensor in tensors:
            target.add(tensor)
        b.nodes += softmax_nodes
        prob_chunks = b.split(f"h{h}_probs_chunk", probs, chunks)
        # vt[j, p] = v[p, j] for the P pixels p of E's shape: T kernels per v surface
        moved = b.feature(f"h{h}_vt", tokens, *b.target.graph.tensor(identity[0]).shape[:1:-1])
        b.runtime_product(f"h{h}_vt", identity, v[mine], tokens, moved)
        out = b.feature(f"h{h}_out", surfaces * SURFACE)  # P kernels: whole passes of 16 for P = 16
        vt_shape = b.target.graph.tensor(moved).shape
        vt_chunks = b.split(f"h{h}_vt_chunk", moved, chunks, vt_shape[3], vt_shape[2])
        b.runtime_product(f"h{h}_out", prob_chunks, vt_chunks, surfaces * SURFACE, out)
        merged.append(out)
    b.nodes.append(Node(f"{node.name}_merge", "Concat", merged, list(node.outputs), {"axis": 1}, [], "NPU"))
    return b.nodes


__all__ = ["EXPANSIONS", "HEAD_ATTENTION", "SURFACE", "WEIGHTS_FROM", "Builder", "expand_attention", "head_attention"]
