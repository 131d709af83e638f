"""ONNX -> graph IR: load and check the model, fix dynamic input dims, fold constants,
canonicalize every node (ops/), drop inference no-ops, check the result.

Pipeline (each step one function below):

1. ``_load`` / ``_check_model``: path or ModelProto; onnx.checker (reading the file itself when
   it holds the whole model); opset in range.
2. ``_unsupported_by_type``: every node whose op/domain has no definition, all listed at once.
3. ``_fix_input_dims``: dynamic input dims from user-given shapes (or an error naming them).
4. ``_onnx_shapes``: ONNX shape inference (large weights' values left out), used to cross-check
   the shapes npuemu infers.
5. ``_Builder``: walk the nodes in order; ``Constant`` nodes and initializers are constants;
   a node whose tensor inputs are all constant (or a Shape of a known shape) is evaluated
   with its numpy semantics and becomes a constant; the others become IR nodes.
6. ``passes.fold_qdq``: the QuantizeLinear/DequantizeLinear of a pre-quantized (QDQ) model
   folded into int8 parameters (``Tensor.quant``; weights noted when their DequantizeLinear
   folds in step 5); any other left over is refused.
7. ``_remove_noops`` / ``Graph.remove_dead`` / ``Graph.check``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google.protobuf.message
import numpy as np
import onnx
import onnx.external_data_helper
import onnx.inliner
from onnx import numpy_helper

from npuemu.isa.errors import CompileError, ModelFileError, NpuemuError, UnsupportedOpError

from .ir import UNUSED_OUTPUT, Graph, Node, Tensor
from .ops import REGISTRY, Canonical, NodeView, TensorInfo, Unsupported, supported_ops
from .ops.base import decode_attr_value
from .ops.custom import accepts as custom_accepts, register_custom_ops
from .ops.tensor_info import numpy_dtype
from .passes.fold_qdq import DEQUANTIZE, fold_qdq_pairs, refuse_leftover_qdq, weight_params
from .passes.surgery import cut_model, freeze_inputs, node_reads

log = logging.getLogger(__name__)

#: ONNX default-domain opsets the importer accepts. 11..21 is the supported range; 9 and 10
#: are accepted too for the older attribute forms (Clip, Pad, Slice, Upsample, Resize-10).
MIN_OPSET, MAX_OPSET = 9, 21
_DEFAULT_DOMAINS = ("", "ai.onnx")
#: the largest constant the importer folds (bytes of one output): a few ONNX nodes (Expand,
#: Tile, ConstantOfShape) can ask for any size; real models' folded constants are far smaller
MAX_FOLD_BYTES = 1 << 30


def import_onnx(model: str | Path | onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None,
                custom_ops: Sequence[str] = (), *, inputs: Sequence[str] | None = None,
                outputs: Sequence[str] | None = None, freeze: Mapping[str, Any] | None = None) -> Graph:
    """Import an ONNX model (file path or ModelProto) into a checked, constant-folded IR graph.

    ``input_shapes`` fixes the shapes of graph inputs by name; it is required for every input
    with a dynamic dimension. ``custom_ops`` ("module:Class" texts, ops/custom.py) registers
    the user's Python ops first. ``freeze`` fixes inputs to constant values, ``inputs`` /
    ``outputs`` cut the graph at those tensors (passes/surgery.py). Raises ModelFileError for
    unreadable/invalid files, UnsupportedOpError listing every unsupported node, CompileError
    for other problems.
    """
    register_custom_ops(custom_ops)
    model, source, as_file = _load(model)
    opset = _check_model(model, source, as_file)
    if model.functions:
        model = onnx.inliner.inline_local_functions(model)
    if freeze:
        freeze_inputs(model, freeze, source)
        input_shapes = {name: shape for name, shape in (input_shapes or {}).items() if name not in freeze}
    if inputs is not None or outputs is not None:
        before = set(onnx_input_names(model))
        cut_model(model, inputs, outputs, source)
        cut_away = before - set(onnx_input_names(model))  # their given shapes no longer apply
        input_shapes = {name: shape for name, shape in (input_shapes or {}).items() if name not in cut_away}
    unsupported = _unsupported_by_type(model, opset, tuple(custom_ops))
    if unsupported:
        raise UnsupportedOpError(_unsupported_message(source, unsupported))
    _fix_input_dims(model, dict(input_shapes or {}), source)
    onnx_shapes = _onnx_shapes(model, source)
    graph = _Builder(model, opset, source).build()
    _cross_check(graph, onnx_shapes)
    fold_qdq_pairs(graph)
    refuse_leftover_qdq(graph)
    removed = _remove_noops(graph) + graph.remove_dead()
    graph.check()
    log.info("%s: imported %d nodes (%d no-op or dead nodes removed), %d constants", source, len(graph.nodes),
             removed, len(graph.constants()))
    return graph


def parse_shape_spec(spec: str) -> tuple[str | None, list[int]]:
    """``"x=1,3,224,224"`` -> ("x", [1, 3, 224, 224]); a spec without a name gives None."""
    name, _, dims = spec.rpartition("=")
    try:
        shape = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise CompileError(f"input shape '{spec}': expected NAME=D0,D1,... with integer dims") from None
    if not shape or any(d < 0 for d in shape):
        raise CompileError(f"input shape '{spec}': expected NAME=D0,D1,... with non-negative dims")
    return (name or None), shape


def onnx_input_names(model: str | Path | onnx.ModelProto) -> list[str]:
    """Names of the real graph inputs of a model (initializers listed as inputs left out)."""
    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as error:
            raise ModelFileError(f"{path}: not a readable ONNX model ({type(error).__name__}: {error})") from None
    return [value.name for value in _graph_inputs(model.graph)]


# ---- 1. load and check -------------------------------------------------------------------

def _load(model: str | Path | onnx.ModelProto) -> tuple[onnx.ModelProto, str, str | None]:
    """The model, its name for messages, and its file when that holds the whole model (no
    external data): the checker then reads the file itself (_check_model)."""
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # fixing input dims edits the model: never touch the caller's
        return copy, f"model '{model.graph.name or '<unnamed>'}'", None
    path = Path(model)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such ONNX file")
    try:
        loaded = onnx.load(str(path), load_external_data=False)
        tensors = getattr(onnx.external_data_helper, "_get_all_tensors", None)  # none: assume external data
        external = tensors is None or any(onnx.external_data_helper.uses_external_data(t) for t in tensors(loaded))
        if external:  # what onnx.load does (it passes the file's folder)
            onnx.external_data_helper.load_external_data_for_model(loaded, os.path.dirname(os.path.abspath(path)))
        return loaded, str(path), None if external else str(path)
    except Exception as error:  # protobuf DecodeError, external data errors...
        raise ModelFileError(f"{path}: not a readable ONNX model ({type(error).__name__}: {error})") from None


def _check_model(model: onnx.ModelProto, source: str, as_file: str | None = None) -> int:
    """The default-domain opset after onnx.checker's verdict. ``as_file``: a file holding exactly
    ``model``, which the checker reads itself rather than taking the model serialized again
    (0.27 -> 0.10 s for ResNet-50's 100 MB; the same checks, issue 20)."""
    for value in model.graph.output:
        # the checker insists on a shape field that many exporters leave out when the output
        # shape is dynamic; output shapes are inferred again after the input dims are fixed
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.SetInParent()
            as_file = None  # the model no longer equals the file
    try:
        onnx.checker.check_model(model if as_file is None else as_file)
    except (onnx.checker.ValidationError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelFileError(f"{source}: not a valid ONNX model: {first}") from None
    versions = [entry.version for entry in model.opset_import if entry.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise ModelFileError(f"{source}: the model imports no opset of the default ONNX domain")
    opset = versions[0]
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise CompileError(f"{source}: ONNX opset {opset} is not supported (supported: {MIN_OPSET} to {MAX_OPSET}); "
                           "convert the model with onnx.version_converter.convert_version")
    return opset


# ---- 2. unsupported op types ---------------------------------------------------------------

@dataclass(frozen=True)
class _UnsupportedNode:
    name: str
    op_type: str
    domain: str
    opset: int
    reason: str = ""
    reads: tuple[str, ...] = ()  # the computed tensors it reads: where `--outputs` ends the model before it

    def line(self) -> str:
        domain = self.domain or "ai.onnx"
        reason = f": {self.reason}" if self.reason else ""
        return f"  node '{self.name}': {self.op_type} (domain {domain}, opset {self.opset}){reason}"


def _node_names(graph: onnx.GraphProto) -> list[str]:
    """Stable unique node names: the ONNX name, else ``<op_type>_<position>``; repeats get
    a ``_<k>`` suffix."""
    names: list[str] = []
    taken: set[str] = set()
    for position, node in enumerate(graph.node):
        base = node.name or f"{node.op_type}_{position}"
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        names.append(name)
    return names


def _unsupported_by_type(model: onnx.ModelProto, opset: int,
                         custom_ops: Sequence[str] = ()) -> list[_UnsupportedNode]:
    opsets = {entry.domain: entry.version for entry in model.opset_import}
    fixed = {init.name for init in model.graph.initializer} | {value.name for value in model.graph.input}
    fixed |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    found = []
    for name, node in zip(_node_names(model.graph), model.graph.node):
        if custom_accepts(node.op_type, node.domain, custom_ops):
            continue
        if node.domain not in _DEFAULT_DOMAINS or custom_accepts(node.op_type, node.domain):  # not this compile's
            found.append(_UnsupportedNode(name, node.op_type, node.domain, opsets.get(node.domain, 0),
                                          "custom domain: register its Python op class with --custom-op module:Class "
                                          "(CompileOptions(custom_ops=...))",
                                          tuple(i for i in node_reads(node) if i and i not in fixed)))
        elif node.op_type not in REGISTRY and node.op_type not in ("Constant", "If"):  # If: its branch, when inlined
            found.append(_UnsupportedNode(name, node.op_type, node.domain, opset,
                                          reads=tuple(i for i in node_reads(node) if i and i not in fixed)))
    return found


def _unsupported_message(source: str, nodes: list[_UnsupportedNode]) -> str:
    lines = [f"{source}: {len(nodes)} unsupported node{'s' if len(nodes) != 1 else ''}:"]
    lines += [node.line() for node in nodes]
    lines.append(f"supported ops: {', '.join(supported_ops())}; try: {_way_out(nodes)}")
    return "\n".join(lines)


def _way_out(nodes: list[_UnsupportedNode]) -> str:
    """What gets such a model through: a custom op for an op type npuemu lacks (a host step; a
    built-in type cannot be replaced, ops/custom.py), --freeze for an If on an input, and a cut
    before the nodes (--outputs), the rest left to the user's code."""
    hints = []
    missing = sorted({node.op_type for node in nodes if not node.reason or node.reason.startswith("custom domain")})
    if missing:
        hints.append(f"--custom-op MODULE:CLASS to run {', '.join(missing)} as a host step (compiler/ops/custom.py)")
    if any(node.op_type == "If" for node in nodes):
        hints.append("--freeze NAME=VALUE for the inputs an If condition depends on (its taken branch is inlined)")
    cuts = list(dict.fromkeys(read for node in nodes if node.op_type != "If" for read in node.reads))
    if cuts:
        hints.append(f"--outputs {','.join(cuts[:5])} to end the model before the unsupported node(s)")
    return "; or ".join(hints) or "--inputs / --outputs NAME,... to cut the unsupported node(s) out of the model"


# ---- 3. dynamic input dims -------------------------------------------------------------------

def _graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Inputs that are real inputs (not initializers listed as inputs, as IR < 4 models do)."""
    initializers = {init.name for init in graph.initializer}
    return [value for value in graph.input if value.name not in initializers]


def _fix_input_dims(model: onnx.ModelProto, shapes: dict[str, Sequence[int]], source: str) -> None:
    inputs = _graph_inputs(model.graph)
    names = [value.name for value in inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise CompileError(f"{source}: no graph input named {', '.join(map(repr, unknown))}; inputs are {names}")
    missing = []
    for value in inputs:
        if not value.type.HasField("tensor_type"):
            raise CompileError(f"{source}: input '{value.name}' is not a tensor")
        tensor_type = value.type.tensor_type
        dims = tensor_type.shape.dim
        given = shapes.get(value.name)
        if given is None:
            if not tensor_type.HasField("shape"):
                missing.append(f"input '{value.name}' has no shape (rank unknown)")
            missing += [f"input '{value.name}' dim {i} ('{dim.dim_param or '?'}') is dynamic"
                        for i, dim in enumerate(dims) if not _is_static(dim)]
            continue
        _set_dims(value, list(given), source)
    if missing:
        examples = " ".join(f"--input-shape {value.name}={_shape_template(value)}" for value in inputs)
        raise CompileError(f"{source}: " + "; ".join(missing) + f". Give the input shapes: {examples}")
    # shapes stored for other tensors may contradict the new input dims: let inference redo them
    del model.graph.value_info[:]
    for value in model.graph.output:
        value.type.tensor_type.ClearField("shape")


def _shape_template(value: onnx.ValueInfoProto) -> str:
    """``1,3,<dim2>,<dim3>``: the fixed dims, and a placeholder for each dynamic one."""
    dims = value.type.tensor_type.shape.dim
    return ",".join(str(dim.dim_value) if _is_static(dim) else f"<dim{i}>" for i, dim in enumerate(dims)) or "..."


def _is_static(dim: Any) -> bool:
    """A fixed dim; some exporters (Paddle) write dynamic dims as dim_value -1 (or 0)."""
    return dim.HasField("dim_value") and dim.dim_value > 0


def _set_dims(value: onnx.ValueInfoProto, given: list[int], source: str) -> None:
    tensor_type = value.type.tensor_type
    dims = tensor_type.shape.dim
    if tensor_type.HasField("shape") and len(dims) != len(given):
        raise CompileError(f"{source}: input '{value.name}' has rank {len(dims)}, the given shape {given} has rank {len(given)}")
    for i, dim in enumerate(dims):
        if _is_static(dim) and dim.dim_value != given[i]:
            batch = i == 0 and dim.dim_value == 1 and given[0] > 1  # the vendor's way to batch a fixed model
            raise CompileError(f"{source}: input '{value.name}' dim {i} is fixed at {dim.dim_value}, "
                               f"the given shape {given} says {given[i]}"
                               + (f"; try: dim 0 at 1 with --batch-size {given[0]} (a build of {given[0]} batch "
                                  "slices, guide 5.6)" if batch else ""))
    tensor_type.shape.ClearField("dim")
    for size in given:
        tensor_type.shape.dim.add().dim_value = size


# ---- 4. ONNX shape inference ---------------------------------------------------------------

def _onnx_shapes(model: onnx.ModelProto, source: str) -> dict[str, tuple[int, ...]]:
    """Static shapes ONNX infers, by tensor name (tensors with unknown dims left out)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_without_weights(model), strict_mode=True, data_prop=True)
    except Exception as error:  # the cross-check is only a safety net: go on without it
        log.warning("%s: ONNX shape inference failed, shapes are not cross-checked: %s", source, error)
        return {}
    shapes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        tensor_type = value.type.tensor_type
        if tensor_type.HasField("shape") and all(dim.HasField("dim_value") for dim in tensor_type.shape.dim):
            shapes[value.name] = tuple(dim.dim_value for dim in tensor_type.shape.dim)
    return shapes


#: initializers of at least this many elements reach shape inference without their values
WITHHELD_ELEMENTS = 1 << 14


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its large initializers' values left out (marked as external data), for
    shape inference: it reads an initializer's values only where they give a shape (a Reshape's
    target, a Slice's bounds: a few numbers), and ``infer_shapes`` serializes the model it is
    given and parses the result back, 0.3 s for ResNet-50's 100 MB of weights (issue 20)."""
    if not any(_withheld(init) for init in model.graph.initializer):
        return model
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    _copy_fields(model.graph, light.graph, skip="initializer")  # the weights are not copied either
    for init in model.graph.initializer:
        if not _withheld(init):
            light.graph.initializer.add().CopyFrom(init)
            continue
        stand_in = light.graph.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims,
                                               data_location=onnx.TensorProto.EXTERNAL)
        stand_in.external_data.add(key="location", value="withheld")
    return light


def _copy_fields(source, target, skip: str) -> None:
    """Every set field of protobuf message ``source`` but ``skip`` into the empty ``target``."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, google.protobuf.message.Message):
            getattr(target, field.name).CopyFrom(value)
        elif isinstance(value, (str, bytes)) or not hasattr(value, "extend"):
            setattr(target, field.name, value)
        else:  # a repeated field
            getattr(target, field.name).extend(value)


def _withheld(init: onnx.TensorProto) -> bool:
    return init.HasField("raw_data") and math.prod(init.dims) >= WITHHELD_ELEMENTS


def _cross_check(graph: Graph, onnx_shapes: dict[str, tuple[int, ...]]) -> int:
    """Warn where ONNX shape inference disagrees with npuemu's shapes; returns the count.

    Only a warning: npuemu's shapes are the ones checked against onnxruntime, and ONNX shape
    inference has known slips (e.g. ConvTranspose with a spatial-only output_shape)."""
    disagreements = 0
    for node in graph.nodes:
        for name in node.outputs:
            theirs, mine = onnx_shapes.get(name), graph.tensors[name].shape
            if theirs is not None and theirs != mine:
                disagreements += 1
                log.warning("%s: node '%s' (%s) output '%s': npuemu infers shape %s, ONNX shape inference %s",
                            graph.source, node.name, node.op_type, name, list(mine), list(theirs))
    return disagreements


# ---- 5. the walk: fold constants, canonicalize nodes -----------------------------------------

def _constant_value(node: onnx.NodeProto) -> np.ndarray:
    attribute = node.attribute[0] if len(node.attribute) == 1 else None
    if attribute is None:
        raise CompileError("a Constant node needs exactly one value attribute")
    value = onnx.helper.get_attribute_value(attribute)
    if attribute.name == "value":
        return numpy_helper.to_array(value)
    if attribute.name in ("value_float", "value_floats"):
        return np.asarray(value, dtype=np.float32)
    if attribute.name in ("value_int", "value_ints"):
        return np.asarray(value, dtype=np.int64)
    raise Unsupported(f"Constant with {attribute.name}")


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {attr.name: decode_attr_value(onnx.helper.get_attribute_value(attr)) for attr in node.attribute}


def _info_of(value: onnx.ValueInfoProto, source: str) -> TensorInfo:
    tensor_type = value.type.tensor_type
    try:
        dtype = numpy_dtype(tensor_type.elem_type)
    except Unsupported as error:
        raise CompileError(f"{source}: input '{value.name}': {error}") from None
    return TensorInfo.of([dim.dim_value for dim in tensor_type.shape.dim], dtype)


class _Builder:
    def __init__(self, model: onnx.ModelProto, opset: int, source: str):
        self.model, self.opset, self.source = model, opset, source
        graph = model.graph
        self.constants: dict[str, np.ndarray] = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        self.infos: dict[str, TensorInfo] = {name: TensorInfo.of(v.shape, v.dtype) for name, v in self.constants.items()}
        self.inputs = [value.name for value in _graph_inputs(graph)]
        for value in _graph_inputs(graph):
            self.infos[value.name] = _info_of(value, source)
        self.used = {name for node in graph.node for name in node_reads(node)} | {value.name for value in graph.output}
        self.taken = set(_node_names(graph))  # node names; an inlined If branch's nodes must not repeat them
        self.nodes: list[Node] = []
        self.unsupported: list[_UnsupportedNode] = []
        self.leftover_fold_only: list[tuple[str, onnx.NodeProto]] = []
        self.weight_quant: dict[str, Any] = {}  # folded DequantizeLinear of an int8 constant -> its QuantParams

    def build(self) -> Graph:
        self._visit_all(_node_names(self.model.graph), self.model.graph.node)
        for name, node in self.leftover_fold_only:
            self.unsupported.append(_UnsupportedNode(name, node.op_type, node.domain, self.opset,
                                                     "only supported where it folds to a constant",
                                                     self._computed_reads(node)))
        if self.unsupported:
            raise UnsupportedOpError(_unsupported_message(self.source, self.unsupported))
        return self._graph()

    def _visit_all(self, names: Sequence[str], nodes: Sequence[onnx.NodeProto]) -> None:
        for name, node in zip(names, nodes):
            if all(not i or i in self.infos for i in node_reads(node)):  # else downstream of an unsupported node
                self._visit(name, node)

    def _visit(self, name: str, node: onnx.NodeProto) -> None:
        try:
            self._visit_node(name, node)
        except Unsupported as reason:
            self.unsupported.append(_UnsupportedNode(name, node.op_type, node.domain, self.opset, str(reason),
                                                     self._computed_reads(node)))
        except UnsupportedOpError:
            raise
        except NpuemuError as error:
            raise CompileError(f"{self.source}: node '{name}' ({node.op_type}): {error}") from None
        except Exception as error:  # a numpy/attribute error on a malformed node: name the node
            log.debug("node %s failed", name, exc_info=True)
            raise CompileError(f"{self.source}: node '{name}' ({node.op_type}): {type(error).__name__}: {error}") from None

    def _computed_reads(self, node: onnx.NodeProto) -> tuple[str, ...]:
        return tuple(i for i in node_reads(node) if i and i not in self.constants and i not in self.inputs)

    def _visit_node(self, name: str, node: onnx.NodeProto) -> None:
        if node.op_type == "Constant":
            self._set_constant(node.output[0], _constant_value(node))
            return
        if node.op_type == "If":
            self._inline_if(name, node)
            return
        if node.op_type not in REGISTRY:  # inside an inlined If branch (the others were checked up front)
            raise Unsupported("")
        op = REGISTRY[node.op_type]
        view = NodeView(node, name, self.opset, _attributes(node), self.constants, self.infos, self.used)
        canonical = op.canonicalize(view)
        out_infos = op.infer(canonical.attrs, [self.infos[i] for i in canonical.inputs])
        outputs = _named_outputs(name, list(node.output[:len(out_infos)]), self.infos)
        if self._foldable(op, canonical):
            for output, value in zip(outputs, self._fold(op, canonical, out_infos)):
                if output:
                    self._set_constant(output, value)
            if node.op_type == DEQUANTIZE:  # a quantized weight keeps its own parameters
                params = weight_params(canonical.attrs, [self.constants[i] for i in canonical.inputs])
                if params is not None:
                    self.weight_quant[outputs[0]] = params
            return
        if op.fold_only:
            self.leftover_fold_only.append((name, node))
        for output, info in zip(outputs, out_infos):
            if output:
                self.infos[output] = info
        self.nodes.append(Node(name, canonical.op_type or node.op_type, canonical.inputs, outputs, canonical.attrs))

    def _inline_if(self, name: str, node: onnx.NodeProto) -> None:
        """An If whose condition folded to a constant: its taken branch's nodes, visited in its
        place (nested Ifs in turn), then its outputs named as the If's."""
        condition = self.constants.get(node.input[0])
        if condition is None:
            raise Unsupported(f"its condition '{node.input[0]}' is not a constant once the input shapes are fixed; "
                              "fix the inputs it depends on with --freeze NAME=VALUE (CompileOptions(freeze=...))")
        taken = "then_branch" if bool(np.asarray(condition).reshape(-1)[0]) else "else_branch"
        branch = next(onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == taken)
        for init in branch.initializer:
            self._set_constant(init.name, numpy_helper.to_array(init))
        self.used |= {read for sub in branch.node for read in node_reads(sub)} | {v.name for v in branch.output}
        names = []
        for sub_name in _node_names(branch):
            unique, k = sub_name, 1
            while unique in self.taken:
                unique, k = f"{name}/{sub_name}_{k}" if k > 1 else f"{name}/{sub_name}", k + 1
            self.taken.add(unique)
            names.append(unique)
        self._visit_all(names, branch.node)
        for inner, outer in zip(branch.output, node.output):
            if inner.name in self.constants:
                self._set_constant(outer, self.constants[inner.name])
            elif inner.name in self.infos and outer:  # an Identity the clean-up bypasses
                self._visit(f"{name}/{outer}", onnx.helper.make_node("Identity", [inner.name], [outer]))

    def _foldable(self, op: Any, canonical: Canonical) -> bool:
        return op.folds_from_shape or all(i in self.constants for i in canonical.inputs)

    def _fold(self, op: Any, canonical: Canonical, out_infos: list[TensorInfo]) -> list[np.ndarray]:
        for info in out_infos:  # before computing: a folded constant is held in memory, then stored
            size = math.prod(info.shape) * np.dtype(info.dtype).itemsize
            if size > MAX_FOLD_BYTES:
                raise CompileError(f"constant folding would make a {list(info.shape)} {np.dtype(info.dtype)} "
                                   f"constant of {size} bytes, more than the limit of {MAX_FOLD_BYTES} bytes (1 GiB)")
        arrays = [self.constants[i] if i in self.constants
                  else np.broadcast_to(np.zeros((), self.infos[i].dtype), self.infos[i].shape)  # shape-only stand-in
                  for i in canonical.inputs]
        values = op.run(canonical.attrs, arrays)
        for value, info in zip(values, out_infos):
            if value.shape != info.shape:
                raise CompileError(f"folded shape {list(value.shape)} differs from the inferred {list(info.shape)}")
        return [value.astype(info.dtype, copy=False) for value, info in zip(values, out_infos)]

    def _set_constant(self, name: str, value: np.ndarray) -> None:
        self.constants[name] = value
        self.infos[name] = TensorInfo.of(value.shape, value.dtype)

    def _graph(self) -> Graph:
        graph = Graph(self.model.graph.name or "main", inputs=list(self.inputs),
                      outputs=[value.name for value in self.model.graph.output], opset=self.opset, source=self.source)
        referenced = set(graph.inputs) | set(graph.outputs)
        for node in self.nodes:
            referenced.update(node.inputs)
            referenced.update(node.outputs)
        order = {name: position for position, name in enumerate(self.infos)}
        for name in sorted(referenced, key=order.__getitem__):
            info = self.infos[name]
            graph.add_tensor(Tensor(name, info.shape, info.dtype, self.constants.get(name),
                                    self.weight_quant.get(name)))
        graph.nodes = self.nodes
        return graph


def _named_outputs(node: str, outputs: list[str], taken) -> list[str]:
    """A node's outputs with the optional ones left out ("") dropped at the end and named in the
    middle (LSTM's Y when only Y_h is wanted): the IR has no unnamed tensors. A named stand-in
    is computed and never read (build_host.split_outputs makes no step for it)."""
    while outputs and not outputs[-1]:
        outputs.pop()
    named = []
    for index, output in enumerate(outputs):
        if not output:
            output, suffix = f"{node}{UNUSED_OUTPUT}{index}", 0
            while output in taken:
                suffix += 1
                output = f"{node}{UNUSED_OUTPUT}{index}_{suffix}"
        named.append(output)
    return named


# ---- 6. clean-up -----------------------------------------------------------------------------

def _remove_noops(graph: Graph) -> int:
    """Bypass nodes that pass their input through (Identity, Dropout, Reshape to the same
    shape, Cast to the same type, a whole Slice, zero Pad...)."""
    removed = 0
    for node in list(graph.nodes):
        op = REGISTRY.get(node.op_type)
        if op is None or op.is_noop is None or node.fused:
            continue
        inputs = [_as_info(graph.tensors[name]) for name in node.inputs]
        outputs = [_as_info(graph.tensors[name]) for name in node.outputs]
        if len(outputs) == 1 and inputs[0] == outputs[0] and op.is_noop(node.attrs, inputs, outputs):
            removed += graph.bypass(node)
    return removed


def _as_info(tensor: Tensor) -> TensorInfo:
    return TensorInfo(tensor.shape, tensor.dtype)
