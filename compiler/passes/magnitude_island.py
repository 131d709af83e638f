"""int8 builds: a magnitude ``sqrt(x_1^2 + ... + x_n^2)`` computed in a float16 island (LOWERING.md 32).

Why [C], a quantization choice: a square spans the square of its operand's range, so an int8 grid
over ``x^2`` keeps about 16 levels of ``|x|`` (sqrt(255)); silero-vad's STFT power (calibrated
range 0..393, step 1.54) rounds every bin with ``|X| < 0.88`` to 0, most of a quiet spectrum.
That was its int8 loss (stateN cosine 0.71 against onnxruntime, 0.999 in float16). So in int8
builds the magnitude is stored in float16 - as the vendor keeps Softmax in float16 in its int8
builds (quant/islands.py) - with DPU DataConverts where the island meets int8 tensors
(LOWERING.md 26). Measured (tests/compiler/test_silero_ops_npu.py, the real model): stateN
cosine 0.71 -> 0.999.

The island, each node marked with ``quant.islands.ISLAND_ATTR``:

- ``Sqrt(s)`` with ``s`` a square ``Mul(x, x)`` (passes/pow_as_mul.py) or an ``Add`` tree of squares,
  on a 4-D map: the Sqrt becomes ``Mul(s, Rsqrt(s))``, the float16 form (LOWERING.md 24; the
  float16 Rsqrt is expanded into its product of look-up pieces at build stage 5,
  ``lower_rsqrt.expand_rsqrt``), so no int8 Sqrt (a host step) is left;
- the Adds and squares;
- each square's operand back through data movement (Split, Concat, FlatConcat, selection
  convs, reshapes) to the layer that computes it (silero: the STFT's frame convs), since the
  square doubles that layer's relative rounding error too.

Runs after the "1/sqrt as look-up tables" stage (whose int8 branch resets an Rsqrt's attributes).
Float16 builds need none of it (lower_rsqrt turns their Sqrt into the same product).
"""

from __future__ import annotations

from ..ir import Graph, Node
from ..quant.islands import ISLAND_ATTR
from .context import PassContext
from .focus_as_conv import SELECTION_ATTR
from .lower_rsqrt import RSQRT
from .match import add_tensor_like, producer, sole_reader
from .partition import decide

MOVES = ("Split", "Concat", "FlatConcat", "Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _squares(graph: Graph, name: str) -> list[Node] | None:
    """The Mul(x, x) and Add nodes of a sum of squares ending at ``name`` (each read once), else None."""
    node = producer(graph, name)
    if node is None or node.fused or sole_reader(graph, name) is None:
        return None
    if node.op_type == "Mul" and len(node.inputs) == 2 and node.inputs[0] == node.inputs[1]:
        return [node]
    if node.op_type != "Add" or len(node.inputs) != 2:
        return None
    parts = [_squares(graph, operand) for operand in node.inputs]
    return None if None in parts else [node, *parts[0], *parts[1]]


def _computing_layers(graph: Graph, name: str, found: list[Node]) -> None:
    """Append the nodes from ``name`` back through data movement to the layers computing it."""
    node = producer(graph, name)
    if node is None or node in found:
        return
    found.append(node)
    if node.op_type in MOVES or node.op_type == "Conv" and node.attrs.get(SELECTION_ATTR):
        for source in node.inputs[:1] if node.op_type in ("Conv", "Split") else node.inputs:
            if graph.tensors[source].is_const:
                continue
            _computing_layers(graph, source, found)


def _magnitude(graph: Graph, node: Node, ctx: PassContext) -> list[Node] | None:
    """The float16 nodes replacing the Sqrt ``node`` (Rsqrt, Mul), marking its island, else None."""
    s, y = node.inputs[0], node.outputs[0]
    shape = graph.tensors[s].shape
    squares = _squares(graph, s)
    if squares is None or len(shape) != 4 or shape[0] != 1:
        return None
    r = add_tensor_like(graph, f"{s}_rsqrt", shape, graph.tensors[s].dtype)
    island = {ISLAND_ATTR: 1}
    new = [Node(graph.unique_node_name(f"{node.name}_rsqrt"), RSQRT, [s], [r], dict(island)),
           Node(graph.unique_node_name(f"{node.name}_times_input"), "Mul", [s, r], [y], dict(island))]
    if any(decide(graph, item, ctx).target != "NPU" for item in new):
        return None
    marked = list(squares)
    for square in squares:
        if square.op_type == "Mul":
            _computing_layers(graph, square.inputs[0], marked)
    for item in marked:
        item.attrs[ISLAND_ATTR] = 1
    return new


def magnitude_as_float16_island(graph: Graph, ctx: PassContext) -> int:
    """int8 builds: sqrt of a sum of squares, the squares and their operands' layers as a float16 island."""
    if ctx.element_bytes != 1:
        return 0
    changed = 0
    for node in [node for node in graph.nodes if node.op_type == "Sqrt" and not node.fused]:
        new = _magnitude(graph, node, ctx)
        if new is not None:
            index = graph.nodes.index(node)
            graph.nodes[index:index + 1] = new
            changed += 1
    return changed


__all__ = ["magnitude_as_float16_island"]
