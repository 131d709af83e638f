"""Build stage 6: every tensor's shape, element type, alignment and size, its lifetime, and
where it lives - DDR, SRAM, or inside another tensor (a no-copy Concat input or Split output).

Feature maps NPU layers touch are int8 or float16 NC1HWC2 (a 1-4 channel int8 graph input read
only by direct convs packed, C2 = C); tensors only host steps touch are row-major ND records
(build_host). The address plan itself is memory_plan's; this module gathers what it needs and
answers "where is tensor t" for the lowering.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from npuemu.compiler.build_adapt import chw, host_tensors, layer_quant, stored_dtype
from npuemu.compiler.build_host import host_constants
from npuemu.compiler.layer_records import Records, reads, writes
from npuemu.compiler.lower import ConvLayer, EltwiseLayer, ConcatLayer, feature_bytes, feature_placement
from npuemu.compiler.lower import layer_constants, output_align
from npuemu.compiler.lower.broadcast_lanes import lanes_aligns
from npuemu.compiler.deconv_phases import input_window, read_shape, written_shape
from npuemu.compiler.lower.driver import copy_views
from npuemu.compiler.lower.lower_flat_concat import FlatConcatLayer
from npuemu.compiler.memory_plan import TensorView, fold_views, lifetimes_from_steps, plan_sram, view_roots
from npuemu.compiler.shared_weights import share_constants
from npuemu.isa.errors import CompileError


@dataclass
class TensorPlan:
    """What the memory plan and the lowering need to know of every tensor."""

    constants: dict[str, bytes]  # weight blobs, biases, LUTs by tensor name
    shapes: dict[str, tuple[int, int, int]]  # NC1HWC2 tensors: (C, H, W)
    dtypes: dict[str, str]
    aligns: dict[str, int]  # channel alignment a reader or writer asks for
    packed: set[str]  # graph inputs stored packed (C2 = C)
    host: dict[str, dict]  # ND tensors: their trailer records (without address)
    sizes: dict[str, int]
    lifetimes: list
    roots: dict[str, tuple[str, int]]  # a view -> (its root tensor, byte offset)
    sram_plan: object = None
    shared: dict[str, str] = field(default_factory=dict)  # a conv's blob -> the equal one stored (shared_weights)

    @property
    def constant_sizes(self) -> dict[str, int]:
        return {name: len(blob) for name, blob in self.constants.items()}

    def in_sram(self, tensor: str) -> bool:
        """Whether ``tensor`` (or the root it is stored in) lives in the SRAM area."""
        root = self.roots.get(tensor, (tensor,))[0]
        return self.sram_plan is not None and root in self.sram_plan.addresses

    def feature(self, plan, name: str, spec):
        """A feature map's placement: its own allocation, or (a view) inside its root's, in DDR or SRAM."""
        root, offset = self.roots.get(name, (name, 0))
        align = self.aligns.get(name, 1)
        in_sram = self.sram_plan is not None and root in self.sram_plan.addresses
        if not in_sram and name not in self.roots:
            return plan.feature(name, self.shapes[name], self.dtypes[name], spec, channel_align=align,
                                packed=name in self.packed)
        base = self.sram_plan.addresses[root] if in_sram else plan.address(root)
        return feature_placement(name, base + offset, self.shapes[name], self.dtypes[name], spec, channel_align=align)

    def placements(self, plan, spec) -> dict:
        """Every constant's and feature map's placement under the address plan ``plan``."""
        placements = {name: plan.constant(name) for name in self.constants}
        placements |= {name: replace(placements[kept], name=name) for name, kept in self.shared.items()}
        return placements | {name: self.feature(plan, name, spec) for name in self.shapes}


def plan_tensors(records: Records, spec, *, elide_copies: bool, pack_inputs: bool, sram: bool) -> TensorPlan:
    """The tensor plan of ``records``; no-copy records are marked in ``records.elided``."""
    layers, graph = records.layers, records.graph
    constants: dict[str, bytes] = {}
    for layer in layers:
        constants.update(layer_constants(layer, spec))
    shared = share_constants(records, constants)  # one stored blob per shared weight tensor
    aligns = {layer.output: output_align(layer, spec) for layer in layers} | lanes_aligns(layers, spec)
    shapes = _layer_shapes(layers)
    # tensors only host steps touch: ND records (build_host); the others NC1HWC2 like NPU feature maps
    host = host_tensors(graph, records.cpu_ops, set(shapes) | set(records.aliases.values()))
    constants.update(host_constants(graph, host))  # large constant operands of host steps, in the weights area
    _add_host_step_shapes(records, host, shapes)
    for storage in set(records.aliases.values()) - set(shapes) - set(host):
        # a by-address reshape no layer reads or writes around (a graph of reshapes only):
        # its storage is a [1, C(, 1, 1)] graph tensor (build_adapt.alias_from_node)
        _set_shape(shapes, storage, (int(graph.tensor(storage).shape[1]), 1, 1))
    for layer in layers:  # a residual read by a conv's EW unit uses the conv output geometry
        if isinstance(layer, ConvLayer) and layer.residual is not None:
            aligns[layer.residual.tensor] = max(output_align(layer, spec), aligns.get(layer.residual.tensor, 1))
    dtypes = {name: stored_dtype(graph, name) for name in shapes}
    packed = _packed_inputs(graph.inputs, records.work, shapes, dtypes) if pack_inputs else set()
    sizes = {name: feature_bytes(shape, dtypes[name], spec, channel_align=aligns.get(name, 1), packed=name in packed)
             for name, shape in shapes.items()}
    sizes |= {name: record["size"] for name, record in host.items() if name not in constants}
    steps = [(reads(layer), writes(layer)) for layer in records.work]
    touched = {name for step in steps for names in step for name in names}
    steps += [((storage,), ()) for storage in sorted(set(records.aliases.values()) - touched) if storage in sizes]
    outputs = [records.aliases.get(o, o) for o in graph.outputs]
    lifetimes = lifetimes_from_steps(steps, sizes, graph.inputs, outputs)
    tensors = TensorPlan(constants, shapes, dtypes, aligns, packed, host, sizes, lifetimes, {}, shared=shared)
    _fold_copies(tensors, records, spec, elide_copies)
    if sram:
        _plan_sram(tensors, spec)
    return tensors


def _layer_shapes(layers) -> dict[str, tuple[int, int, int]]:
    shapes: dict[str, tuple[int, int, int]] = {}
    for layer in layers:
        for tensor, shape in _shapes(layer).items():
            _set_shape(shapes, tensor, shape)
    return shapes


def _set_shape(shapes: dict, tensor: str, shape) -> None:
    if shapes.setdefault(tensor, shape) != shape:
        raise CompileError(f"tensor {tensor!r} is used with shapes {shapes[tensor]} and {shape}")


def _add_host_step_shapes(records: Records, host: dict, shapes: dict) -> None:
    """The NC1HWC2 tensors host steps read or write (checked quantized, as the runtime converts them)."""
    for op in records.cpu_ops:
        node = next(n for n in records.nodes if n.layer_name == op.name)
        for tensor in (*op.inputs, op.output):
            if tensor in host:
                continue
            layer_quant(records.graph, tensor, node)
            _set_shape(shapes, tensor, chw(records.graph, tensor, node))


def _fold_copies(tensors: TensorPlan, records: Records, spec, elide_copies: bool) -> None:
    """No-copy Concat/Split (LOWERING.md 10.1): the copies' tensors become views of their
    neighbour; a root lives and extends over its views."""
    views: dict = {}  # tensor -> (tensor holding it, byte offset)
    if elide_copies:
        internal = {t.name for t in tensors.lifetimes if t.kind == "internal"}
        views, skipped = copy_views(records.layers, tensors.shapes, tensors.dtypes, tensors.aligns, internal, spec)
        records.elided = {id(layer) for layer in skipped}
    tensor_views = [TensorView(n, parent, offset, tensors.sizes[n]) for n, (parent, offset) in views.items()]
    tensors.lifetimes = fold_views(tensors.lifetimes, tensor_views)
    tensors.roots = view_roots(tensor_views)


def _plan_sram(tensors: TensorPlan, spec) -> None:
    if spec.sram.kind == "none" or not spec.sram.size_bytes:
        raise CompileError(f"--sram: {spec.name} has no NPU-usable SRAM (platform sram.kind {spec.sram.kind!r})")
    tensors.sram_plan = plan_sram(tensors.lifetimes, spec.sram.size_bytes, spec.sram.granule_bytes)
    tensors.lifetimes = [t for t in tensors.lifetimes if t.name not in tensors.sram_plan.addresses]


def _packed_inputs(inputs, work, shapes, dtypes) -> set[str]:
    """Graph inputs stored as a packed image (C2 = C, 1 to 4 int8 channels, the vendor's
    first-layer format, rknpu-isa.md 4): those read only as the feature input of int8 direct
    convolutions, which fetch them in ARGB mode (lower_conv.packed_image). Any other reader
    (depthwise, element-wise, pooling, a host step, a residual) keeps NC1HWC2."""
    packed = set()
    for name in inputs:
        if name not in shapes or dtypes[name] != "int8" or not 1 <= shapes[name][0] <= 4:
            continue
        readers = [record for record in work if name in reads(record)]
        if readers and all(isinstance(r, ConvLayer) and r.input == name and not r.depthwise and r.dtype == "int8"
                           and (r.residual is None or r.residual.tensor != name)
                           and input_window(r.interleave) is None for r in readers):  # a chunk reads atoms
            packed.add(name)
    return packed


def _shapes(layer) -> dict[str, tuple[int, int, int]]:
    if isinstance(layer, ConvLayer):
        # a ConvTranspose phase writes the whole interleaved image (deconv_phases.interleaved_write)
        shapes = {layer.input: read_shape(layer.input_shape, layer.interleave),
                  layer.output: written_shape(layer.output_shape, layer.interleave)}
        if layer.residual:
            shapes[layer.residual.tensor] = layer.output_shape
        return shapes
    if isinstance(layer, EltwiseLayer):
        return layer.shapes
    if isinstance(layer, (ConcatLayer, FlatConcatLayer)):
        return dict(zip(layer.inputs, layer.shapes)) | {layer.output: layer.output_shape}
    return {layer.input: layer.input_shape, layer.output: layer.output_shape}


__all__ = ["TensorPlan", "plan_tensors"]
