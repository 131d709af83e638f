"""Input-channel tiling of a conv too large for the CBUF (vendor-corpus README §3.3: the
vendor's ``tiling_conv_channelin`` makes Split + Conv + ConvAdd... chains).

A Conv (group 1) that ``cbuf_fit`` says does not fit even when split along H is cut along
its input channels into the fewest parts (multiples of the input-channel group, 32) that
each fit: ``Split(x)`` -> ``Conv(x_1, W_1, bias)`` -> ``Conv(x_2, W_2) + previous`` -> ... The
partial sums are added by each part's fused ``add`` (a ConvAdd layer), so the last part
holds the whole result and takes the original layer's name and activation. The sum only
reorders float additions. A residual Add that precedes the activation (Conv+Add+Relu) moves to
the first part, whose partial sum it joins; layers whose fused parts would still break the
platform's fusion patterns after the extra add (e.g. an activation, then a residual) are left
alone, except trailing activations, which then run as layers of their own after the chain
(``_activations_after``).
Level 3 only.
"""

from __future__ import annotations

from ..ir import FusedOp, Graph, Node
from .cbuf_fit import ConvGeometry, cbuf_fit, conv_geometry
from .context import PassContext
from .fusion_rules import may_append
from .match import BIAS_TAG, add_tensor_like, const, new_constant


def _candidate(graph: Graph, node: Node) -> bool:
    if node.op_type != "Conv" or node.attrs["group"] != 1 or len(graph.tensors[node.inputs[0]].shape) != 4:
        return False
    return graph.tensors[node.inputs[0]].shape[0] == 1 and all(const(graph, name) is not None for name in node.inputs[1:])


def channel_split(ctx: PassContext, geometry: ConvGeometry) -> list[int] | None:
    """Sizes of the fewest input-channel parts that each fit (at the build's element size,
    ctx.element_bytes), or None (fits whole / never)."""
    group = ctx.platform.cycle_model.input_channel_group
    size_of = ctx.element_bytes
    if cbuf_fit(ctx.platform, geometry, size_of)[0]:
        return None
    blocks = -(-geometry.channels // group)
    for parts in range(2, blocks + 1):
        per_part = -(-blocks // parts) * group
        sizes = [min(per_part, geometry.channels - start) for start in range(0, geometry.channels, per_part)]
        if all(cbuf_fit(ctx.platform, ConvGeometry(**{**geometry.__dict__, "channels": size}), size_of)[0]
               for size in sizes):
            return sizes
    return None


def _leading_residual(node: Node) -> FusedOp | None:
    """A residual Add that comes first after the bias (Conv+Add(+Relu), ResNet's bottleneck
    exit): it may move to the first part of the chain, since the partial sums and the residual
    are all added before the activation."""
    rest = [part for part in node.fused if part.tag != BIAS_TAG]
    if rest and rest[0].op_type == "Add" and len(rest[0].inputs) == 1:
        return rest[0]
    return None


def _chain_allowed(ctx: PassContext, graph: Graph, node: Node) -> bool:
    probe = Node(node.name, node.op_type, node.inputs, node.outputs, node.attrs,
                 [FusedOp("Add", inputs=[node.inputs[0]])])
    early = _leading_residual(node)
    for part in node.fused:
        if part.tag == BIAS_TAG or part is early:
            continue
        kind = "Add" if part.op_type == "Add" else part.op_type
        if not may_append(ctx, graph, probe, kind):
            return False
        probe.fused.append(part)
    return True


def _activations_after(ctx: PassContext, graph: Graph, node: Node) -> list[FusedOp] | None:
    """The activations to run as layers of their own after the chain, when they cannot follow its
    partial-sum add in one layer (rk3588: Conv+Add+Act only with Relu, so Conv+HardSwish is left a
    chain then a HardSwish; LOWERING.md 49): every fused part past the bias and a leading residual,
    if all of them are activations (no operands) and the chain without them is allowed; else None."""
    early = _leading_residual(node)
    tail = [part for part in node.fused if part.tag != BIAS_TAG and part is not early]
    if not tail or any(part.inputs or part.op_type == "Add" for part in tail):
        return None
    kept = [part for part in node.fused if part.tag == BIAS_TAG or part is early]
    if not _chain_allowed(ctx, graph, Node(node.name, node.op_type, node.inputs, node.outputs, node.attrs, kept)):
        return None
    return tail


def _split_off(graph: Graph, node: Node, tail: list[FusedOp]) -> None:
    """``node``'s fused ``tail`` as layers of their own after it, in order (the node keeps its name
    and writes a new tensor; the last of them writes the node's output)."""
    out = node.outputs[0]
    shape, dtype = graph.tensors[out].shape, graph.tensors[out].dtype
    source = add_tensor_like(graph, f"{out}_pre_{tail[0].op_type.lower()}", shape, dtype)
    node.outputs, node.fused = [source], [part for part in node.fused if all(part is not t for t in tail)]
    index = graph.nodes.index(node)
    for i, part in enumerate(tail):
        target = out if i == len(tail) - 1 else add_tensor_like(graph, f"{out}_{part.op_type.lower()}", shape, dtype)
        graph.nodes.insert(index + 1 + i, Node(graph.unique_node_name(f"{node.name}_{part.op_type.lower()}"),
                                               part.op_type, [source], [target], dict(part.attrs)))
        source = target


def tile_input_channels(graph: Graph, ctx: PassContext) -> int:
    """A conv too large for the CBUF is split along its input channels (Split + Conv + ConvAdd chain)."""
    tiled = 0
    for node in [node for node in graph.nodes if _candidate(graph, node)]:
        sizes = channel_split(ctx, conv_geometry(graph, node))
        if sizes is None:
            continue
        if not _chain_allowed(ctx, graph, node):
            tail = _activations_after(ctx, graph, node)
            if tail is None:
                continue
            _split_off(graph, node, tail)
        _build_chain(graph, node, sizes)
        tiled += 1
    return tiled


def _build_chain(graph: Graph, node: Node, sizes: list[int]) -> None:
    x, weight = node.inputs[0], const(graph, node.inputs[1])
    dtype = graph.tensors[x].dtype
    _, _, height, width = graph.tensors[x].shape
    out_shape = graph.tensors[node.outputs[0]].shape
    pieces = [add_tensor_like(graph, f"{x}_ic{i}", (1, size, height, width), dtype) for i, size in enumerate(sizes)]
    index = graph.nodes.index(node)
    chain = [Node(graph.unique_node_name(f"{node.name}_split"), "Split", [x], pieces, {"axis": 1, "split": sizes})]
    start, previous = 0, None
    early = _leading_residual(node)
    for i, size in enumerate(sizes):
        last = i == len(sizes) - 1
        part_weight = new_constant(graph, f"{node.name}_ic{i}_weight", weight[:, start:start + size])
        inputs = [pieces[i], part_weight] + (node.inputs[2:] if i == 0 else [])
        fused = [part for part in node.fused if part.tag == BIAS_TAG] if i == 0 else []
        if i == 0 and early is not None:  # the residual joins the first partial sum (_leading_residual)
            fused.append(early)
        if previous is not None:
            fused = [FusedOp("Add", inputs=[previous], carry_index=0, source=node.name)]
        if last:
            fused += [part for part in node.fused if part.tag != BIAS_TAG and part is not early]
        out = node.outputs[0] if last else add_tensor_like(graph, f"{node.outputs[0]}_ic{i}", out_shape, dtype)
        name = node.name if last else graph.unique_node_name(f"{node.name}_ic{i}")
        chain.append(Node(name, "Conv", inputs, [out], dict(node.attrs), fused))
        start, previous = start + size, out
    graph.nodes[index:index + 1] = chain
