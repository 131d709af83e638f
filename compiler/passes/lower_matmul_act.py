"""The ActMatMul layer (LOWERING.md 37): a MatMul of two activations, its float semantics and its
records (build stage 5, as ``lower_attention`` expands HeadAttention).

``ActMatMul(X, W)`` (a composite op only ``matmul_act_npu`` makes) works on the channel-major
forms of ``Y[h] = A[h] B[h]`` (A ``[H, T, K]``, B ``[H, K, N]``, H heads):

- X ``[1, H K, 1, T]``: channel ``h K + k``, pixel t holds ``A[h, t, k]`` (the feature);
- W ``[1, H K, 1, N]``: channel ``h K + k``, pixel n holds ``B[h, k, n]`` (read as weights);
- the output, by the ``layout`` attribute: "rows" ``[1, N, H, T]`` (channel n, row h, pixel t holds
  ``Y[h, t, n]``: Y in NHWC order, a graph output's readout) or "channels" ``[1, H N, 1, T]``
  (channel h N + n: the heads merged, as a token region reads them after attention's merge).

At build stage 5 it becomes, per head h and 8-channel surface s of K (LOWERING.md 22.3's
run-time weights: a one-surface float16 ``[1, c <= 8, 1, N]`` map's bytes are the weight blob of
N kernels with ``W[n][c] = map[c][n]``):

1. where a head's K channels do not start on a surface (``K % 8`` and H > 1), one 0/1 selection
   conv each for X and W spreads them to heads of ``Kp = 8 ceil(K / 8)`` channels (zero padding
   channels: exact in float16); over 65536 weights, one per head from the surface-aligned
   channel window holding it (a view);
2. the surfaces of X and W as channel Splits (views, LOWERING.md 10.1);
3. per head, ``lower_attention``'s run-time product: one 1x1 conv per surface s, feature the X
   surface, weights the W surface's bytes (N kernels), chained by residual adds -> ``[1, N, 1, T]``;
4. "channels": a Concat of the heads' products (N a multiple of 16: by address);
   "rows", for H > 1: head h's last product conv writes row h of ``[1, N, H, T]`` itself - a plain
   DPU write at + h lines with the whole map's surface stride (Conv attr ``interleave`` =
   ``(1, h, 0, H, T)``, a stride-1 window: lower_conv._row_window), its residual the head's
   running sum in a map of its own; no placement convs (LOWERING.md 41; before it, LOWERING.md 37's
   (H - h) x 1 depthwise convs read and wrote the whole map per head).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from ..ir import Node
from ..ops import REGISTRY
from ..ops.base import TensorInfo, as_float, like, register
from .lower_attention import EXPANSIONS, SURFACE, Builder

ACT_MATMUL = "ActMatMul"
#: output layouts: [1, N, H, T] (heads on the rows), [1, H N, 1, T] (heads merged on the channels)
ROWS, CHANNELS = "rows", "channels"
#: the largest single selection conv spreading all heads (H Kp x H K float16 weights: 128 KB, a third
#: of the CBUF); beyond it one per head (constraints.matmul_activations bounds that one likewise)
SELECTION_WEIGHTS = 65536
CHANNEL_SLICE = "ChannelSlice"  # build_adapt's channel range record (attrs start, size): a view where aligned
CHANNEL_ALIGN = 16  # "channels": each head's N on whole float16 kernel passes (16), so the merge is by address


def geometry(x_shape, w_shape, heads: int) -> tuple[int, int, int, int]:
    """(H, T, K, N) of an ActMatMul's channel-major inputs."""
    return heads, int(x_shape[3]), int(x_shape[1]) // heads, int(w_shape[3])


def _infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    x, w, heads = inputs[0].shape, inputs[1].shape, int(attrs["heads"])
    if len(x) != 4 or len(w) != 4 or x[0] != 1 or w[0] != 1 or x[2] != 1 or w[2] != 1 or x[1] != w[1] \
            or heads < 1 or x[1] % heads or attrs.get("layout", ROWS) not in (ROWS, CHANNELS):
        raise CompileError(f"{ACT_MATMUL}: inputs {list(x)} and {list(w)} are not [1, H K, 1, T] and "
                           f"[1, H K, 1, N] for H = {heads}, or layout {attrs.get('layout')!r} is unknown")
    if attrs.get("layout", ROWS) == CHANNELS:
        return [TensorInfo.of((1, heads * w[3], 1, x[3]), inputs[0].dtype)]
    return [TensorInfo.of((1, w[3], heads, x[3]), inputs[0].dtype)]


def act_matmul(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """The float semantics (module docstring)."""
    heads, tokens, depth, columns = geometry(x[0].shape, x[1].shape, int(attrs["heads"]))
    a = as_float(x[0])[0, :, 0, :].reshape(heads, depth, tokens)
    b = as_float(x[1])[0, :, 0, :].reshape(heads, depth, columns)
    if attrs.get("layout", ROWS) == CHANNELS:
        return like(np.einsum("hkt,hkn->hnt", a, b).reshape(1, heads * columns, 1, tokens), x[0])
    return like(np.einsum("hkt,hkn->nht", a, b)[None], x[0])


if ACT_MATMUL not in REGISTRY:  # a second import (pytest's importlib mode) finds it registered
    register(ACT_MATMUL, infer=_infer)(act_matmul)


def _selection(heads: int, depth: int, padded: int) -> np.ndarray:
    """1x1 weights moving channel h K + k to h Kp + k (the rest of each padded head zero)."""
    weights = np.zeros((heads * padded, heads * depth, 1, 1), np.float32)
    for h in range(heads):
        weights[h * padded + np.arange(depth), h * depth + np.arange(depth), 0, 0] = 1.0
    return weights


def _surfaces(b: Builder, part: str, source: str, heads: int, depth: int, width: int) -> list[str]:
    """The 8-channel surfaces of each head of ``source`` [1, H K, 1, width], head-major: views of
    it where the heads start on surfaces; else heads spread to Kp = 8 ceil(K / 8) channels by one
    0/1 selection conv (zero padding channels, exact), or, where its H Kp x H K weights would pass
    SELECTION_WEIGHTS, one per head from the surface-aligned channel window holding the head."""
    padded = depth if heads == 1 else -(-depth // SURFACE) * SURFACE
    sizes = [SURFACE] * (padded // SURFACE) + ([padded % SURFACE] if padded % SURFACE else [])
    if padded == depth:
        return b.split(f"{part}_surface", source, sizes * heads, width)
    if heads * padded * heads * depth <= SELECTION_WEIGHTS:
        spread = b.feature(f"{part}_heads", heads * padded, width)
        b.conv(f"{part}_heads", source, _selection(heads, depth, padded), spread)
        return b.split(f"{part}_surface", spread, sizes * heads, width)
    pieces = []
    for h in range(heads):
        start, end = h * depth // SURFACE * SURFACE, min(-(-(h + 1) * depth // SURFACE) * SURFACE, heads * depth)
        window = b.feature(f"{part}_h{h}_window", end - start, width)
        b.nodes.append(Node(f"{b.node.name}_{part}_h{h}_window", CHANNEL_SLICE, [source], [window],
                            {"start": start, "size": end - start}, [], "NPU"))
        weights = np.zeros((padded, end - start, 1, 1), np.float32)
        weights[np.arange(depth), h * depth - start + np.arange(depth), 0, 0] = 1.0
        spread = b.feature(f"{part}_h{h}", padded, width)
        b.conv(f"{part}_h{h}", window, weights, spread)
        pieces += b.split(f"{part}_h{h}_surface", spread, sizes, width)
    return pieces


#: a Conv's ``interleave`` attr for a stride-1 window (1, first row, 0, out_h, out_w): its rows written
#: plainly from row ``first row`` of a taller output of its width (lower_conv._row_window, LOWERING.md 41)
ROW_WINDOW = 1


def _row_product(b: Builder, h: int, inputs: list[str], sources: list[str], shape: tuple[int, int, int],
                 output: str) -> None:
    """Head h's run-time product (lower_attention's ``runtime_product``: one 1x1 conv per surface,
    chained by residual adds) whose last conv writes row h of ``output`` [1, N, H, T] directly:
    a plain DPU write at + h lines with the whole map's surface stride (LOWERING.md 41)."""
    columns, heads, tokens = shape
    running = None
    for index, (x, source) in enumerate(zip(inputs, sources)):
        channels = int(b.target.graph.tensor(x).shape[1])
        last = index == len(inputs) - 1
        result = output if last else b.feature(f"h{h}_part{index}", columns, tokens)
        b.conv(f"h{h}_{index}", x, np.zeros((columns, channels, 1, 1), np.float32), result, source=source,
               residual=running)
        if last:
            b.nodes[-1].attrs["interleave"] = [ROW_WINDOW, h, 0, heads, tokens]
        running = result


def expand_act_matmul(target, node: Node) -> list[Node] | None:
    """The nodes of an NPU ActMatMul (module docstring); None for any other node."""
    if node.op_type != ACT_MATMUL:
        return None
    graph = target.graph
    stored = [graph.tensor(name).quant for name in (*node.inputs, *node.outputs)]
    if node.target != "NPU" or any(quant is None or quant.dtype != "float16" for quant in stored):
        raise CompileError(f"{node.name}: {ACT_MATMUL} is built on the NPU in float16 only (in int8 builds a "
                           f"float16 island, LOWERING.md 37)")
    heads, tokens, depth, columns = geometry(graph.tensor(node.inputs[0]).shape, graph.tensor(node.inputs[1]).shape,
                                             int(node.attrs["heads"]))
    b = Builder(target, node)
    padded = depth if heads == 1 else -(-depth // SURFACE) * SURFACE
    sizes = [SURFACE] * (padded // SURFACE) + ([padded % SURFACE] if padded % SURFACE else [])
    xs = _surfaces(b, "x", node.inputs[0], heads, depth, tokens)
    ws = _surfaces(b, "w", node.inputs[1], heads, depth, columns)
    rows = heads > 1 and node.attrs.get("layout", ROWS) == ROWS
    merged = []
    for h in range(heads):
        mine = slice(h * len(sizes), (h + 1) * len(sizes))
        if rows:  # the product's last conv writes row h of [1, N, H, T] itself (a stride-1 window, below)
            _row_product(b, h, xs[mine], ws[mine], (columns, heads, tokens), node.outputs[0])
            continue
        product = node.outputs[0] if heads == 1 else b.feature(f"h{h}", columns)
        b.runtime_product(f"h{h}", xs[mine], ws[mine], columns, product)
        merged.append(product)
    if heads > 1 and node.attrs.get("layout", ROWS) == CHANNELS:  # by address: N whole kernel passes
        b.nodes.append(Node(f"{node.name}_merge", "Concat", merged, list(node.outputs), {"axis": 1}, [], "NPU"))
    return b.nodes


EXPANSIONS[ACT_MATMUL] = expand_act_matmul

__all__ = ["ACT_MATMUL", "CHANNELS", "CHANNEL_ALIGN", "ROWS", "act_matmul", "expand_act_matmul", "geometry"]
