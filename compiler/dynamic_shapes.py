"""Dynamic input shapes (RKNN SDK user guide 5.4): one model file, one chain set per input
shape set, the weights stored once (isa/CONTAINER.md 3.7).

    npuemu compile net.onnx --dynamic-input "x=1,3,224,224;x=1,3,160,160" --quantize --dataset ds.txt
    rknn.config(dynamic_input=[[[1,3,224,224]], [[1,3,160,160]]])

Design (LOWERING.md has no per-shape lowering: every set is an ordinary static build):

1. The graph is imported, optimized and quantized at the first shape set as any build is
   (driver.prepare); int8 calibration runs once, on that set, as the vendor's does (its
   dataset images have the first set's size).
2. Each later set is imported and optimized at its shapes, then annotated with the first set's
   decisions - the same activation ranges, layer types, weight method - so every tensor the
   sets share has the same scale and zero point and every weight the same stored values;
   :func:`_check_shared` refuses the build if any differs (a shape-dependent fusion would).
3. Every set is built by the ordinary stages 5-9 (driver._build_graph) into a static model.
4. :func:`merge` keeps set 0's model as the file and adds each later set's trailer; sections
   are stored by content, so a weights image equal to one already stored is shared (the memory
   plan puts weights first, and model weights do not depend on the feature-map size). Where a
   set's image differs - constants derived from the shapes, e.g. the kernels of a large
   GlobalAveragePool split into convs (one stage fewer at 96x96 than at 224x224) - set 0's image
   is stored in pieces and the set places the pieces before and after its own run
   (:func:`_weight_pieces`), as the vendor's dynamic .rknn keeps its weights in graphs[0] and
   stores each graph's pooling kernels again.

A set whose graph has a layer or tensor set 0's lacks takes int8 (fp16 for an fp16 build) and
must find its activation ranges among set 0's, else the build stops naming the tensor: there is
no calibration at the other shapes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from npuemu.compiler import sparse_weights
from npuemu.compiler.onnx_import import import_onnx
from npuemu.compiler.quant import quantize_from_config, quantize_graph, read_config
from npuemu.compiler.quant.qdq import quantize_prequantized, take_qdq_params
from npuemu.isa.container import MemoryRegion, ModelFile, Section, SectionKind
from npuemu.isa.container_dynamic import KEY, MAX_SHAPE_SETS, describe
from npuemu.isa.errors import CompileError, ConfigError

ShapeSets = tuple[dict[str, tuple[int, ...]], ...]


def parse_dynamic_input(text: str) -> list[dict[str, tuple[int, ...]]]:
    """``"x=1,3,224,224 y=1,4;x=1,3,160,160 y=1,4"``: shape sets separated by ';', the inputs
    of one set by spaces or '&', each NAME=D0,D1,..."""
    sets = []
    for number, part in enumerate((p for p in text.split(";") if p.strip()), 1):
        entry = {}
        for item in re.split(r"[\s&]+", part.strip()):
            name, sep, dims = item.rpartition("=")
            try:
                shape = tuple(int(d) for d in dims.split(","))
            except ValueError:
                shape = ()
            if not sep or not name or not shape or min(shape) < 1 or name in entry:
                raise ConfigError(f"--dynamic-input set {number}: {item!r}: expected NAME=D0,D1,... with positive "
                                  "dimensions, each input once (sets separated by ';', inputs by ' ' or '&')")
            entry[name] = shape
        sets.append(entry)
    return sets


def resolve_sets(sets: Sequence[Any], inputs: Sequence[str]) -> ShapeSets:
    """The shape sets by input name. A set is a mapping NAME -> shape or, as the vendor's
    ``dynamic_input`` gives it, a list of shapes in the model's input order."""
    if not 2 <= len(sets) <= MAX_SHAPE_SETS:
        raise ConfigError(f"dynamic input: {len(sets)} shape set(s); give 2 to {MAX_SHAPE_SETS}")
    resolved = []
    for number, entry in enumerate(sets, 1):
        if not isinstance(entry, Mapping):
            entry = list(entry)
            if len(entry) != len(inputs):
                raise ConfigError(f"dynamic input set {number}: {len(entry)} shape(s); the model has "
                                  f"{len(inputs)} input(s): {', '.join(inputs)} (one shape each, in that order)")
            entry = dict(zip(inputs, entry))
        unknown = sorted(set(entry) - set(inputs))
        missing = [name for name in inputs if name not in entry]
        if unknown or missing:
            raise ConfigError(f"dynamic input set {number}: " + (f"{', '.join(unknown)} not input(s) of the model; "
                              if unknown else "") + (f"no shape for {', '.join(missing)}; " if missing else "")
                              + f"inputs: {', '.join(inputs)}")
        resolved.append({name: tuple(int(d) for d in entry[name]) for name in inputs})
    if len({tuple(s.items()) for s in resolved}) != len(resolved):
        raise ConfigError("dynamic input: two shape sets are the same")
    return tuple(resolved)


def model_inputs(source: Any, options) -> list[str]:
    """The graph input names of the ONNX model (path or ModelProto), after --inputs cutting."""
    if options.inputs:
        return list(options.inputs)
    import onnx

    model = source if isinstance(source, onnx.ModelProto) else onnx.load(str(source), load_external_data=False)
    constants = {init.name for init in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in constants and value.name not in
            (options.freeze or {})]


def first_set_options(source: Any, options):
    """``options`` with the shape sets resolved (by input name) and the first as the input shapes."""
    if options.batch_size != 1:
        raise ConfigError("--batch-size and --dynamic-input cannot be combined: a shape set fixes the batch "
                          "dimension of its inputs (a [N, ...] graph), not the batch contexts of --batch-size")
    if options.input_shapes:
        raise ConfigError("--input-shape and --dynamic-input both fix input shapes: give every input's shape in "
                          "each --dynamic-input set instead")
    sets = resolve_sets(options.dynamic_input, model_inputs(source, options))
    return dataclasses.replace(options, input_shapes=dict(sets[0]), dynamic_input=sets)


def build_dynamic(front, source: Any, sets: ShapeSets, run_passes: Callable, build_graph: Callable) -> ModelFile:
    """The dynamic-shape model file: ``front`` is set 0, prepared; ``run_passes`` and
    ``build_graph`` are the driver's stage 2-3 and 5-9 functions."""
    sets = resolve_sets(sets, list(front.graph.inputs))  # options a caller replaced after prepare (the API)
    if sets[0] != {name: front.graph.tensors[name].shape for name in sets[0]}:
        raise CompileError(f"dynamic input: the prepared graph's inputs are not the first shape set "
                           f"({describe(sets[:1])})")
    models = [build_graph(front.graph, front.platform, front.options, front.preprocess)]
    for index, shapes in enumerate(sets[1:], 1):
        other = _front_at(front, source, shapes, run_passes, index)
        models.append(build_graph(other.graph, other.platform, other.options, front.preprocess))
    return merge(models, sets)


def _front_at(front, source: Any, shapes: Mapping[str, Sequence[int]], run_passes: Callable, index: int):
    options = dataclasses.replace(front.options, input_shapes=dict(shapes))
    graph = import_onnx(source, options.input_shapes, options.custom_ops, inputs=options.inputs,
                        outputs=options.outputs, freeze=options.freeze)
    other = dataclasses.replace(front, graph=graph, options=options, pass_log=None, partition=None,
                                quantization=None, model=None)
    run_passes(other)
    other.quantization = _share_quantization(front, other.graph, index)
    if other.platform.sparse.enabled:
        sparse_weights.symmetric_weights(other.graph, other.platform)
    _check_shared(front.graph, other.graph, index)
    return other


def _share_quantization(front, graph, index: int):
    """Set 0's quantization decisions applied to another set's graph (no calibration)."""
    options, first = front.options, front.quantization
    qdq = take_qdq_params(graph)
    try:
        if qdq and options.precision == "int8":  # a QDQ model's own parameters, as for set 0
            return quantize_prequantized(graph, qdq)
        if options.precision == "hybrid":
            return quantize_from_config(graph, read_config(options.quant_config, graph))
        layers = {node.name for node in graph.nodes}  # a set may lack a layer (fewer GAP stages at 96x96)
        dtypes = {name: dtype for name, dtype in first.layer_dtypes.items()
                  if name not in first.conversions and name in layers}
        default = "float16" if options.precision == "fp16" else "int8"
        return quantize_graph(graph, first.ranges, layer_dtypes=dtypes, per_channel=first.per_channel,
                              weight_clipping=first.weight_clipping, default_dtype=default)
    except CompileError as error:
        raise CompileError(f"dynamic input set {index + 1}: the graph at these shapes cannot take the first set's "
                           f"quantization ({error}); calibration runs at the first set only, so list first the set "
                           "whose graph has every layer (e.g. the largest, where GlobalAveragePool takes more "
                           "stages)") from None


def _check_shared(first, other, index: int) -> None:
    """Every activation both graphs have: the same parameters, so the sets compute with one
    quantization; every constant of the same values: the same parameters. Constants whose values
    differ are derived from the shapes (e.g. the kernels of a large GlobalAveragePool split into
    convs) and are the set's own."""
    for name, tensor in other.tensors.items():
        mine = first.tensors.get(name)
        if tensor.quant is None or mine is None or mine.quant is None:
            continue
        if tensor.data is not None and (mine.data is None or mine.data.shape != tensor.data.shape
                                        or not np.array_equal(mine.data, tensor.data)):
            continue  # a shape-derived constant
        same = (mine.quant.dtype == tensor.quant.dtype and np.array_equal(mine.quant.scale, tensor.quant.scale)
                and np.array_equal(mine.quant.zero_point, tensor.quant.zero_point))
        if not same:
            raise CompileError(f"dynamic input set {index + 1}: tensor {name!r} would be quantized differently "
                               "from the first set; the sets must share one quantization")


#: granule of the weight image pieces sets share (memory_plan aligns constants to 64 bytes)
GRANULE = 64


def merge(models: Sequence[ModelFile], sets: ShapeSets) -> ModelFile:
    """One file: set 0's model with each later set's trailer and sections. A section whose bytes
    and kind equal a stored one's is not stored again, only placed by the set; a weights image
    that differs from set 0's only in a middle run (shape-derived constants) shares set 0's
    bytes before and after it (:func:`_weight_pieces`)."""
    first = models[0]
    shared = {key: first.trailer.get(key) for key in ("platform", "compiler", "batch")}
    for index, model in enumerate(models[1:], 1):
        different = [key for key in shared if model.trailer.get(key) != shared[key]]
        if different:
            raise CompileError(f"dynamic input set {index + 1}: {', '.join(different)} differ from the first set's")
    pieces, cuts = _weight_pieces(models)
    sections = [s for s in first.sections if s.kind is not SectionKind.WEIGHTS or not pieces] + pieces
    entries: list[dict[str, Any]] = [{"shapes": [list(shape) for shape in sets[0].values()]}]
    for index, model in enumerate(models[1:], 1):
        taken, placements = set(), []
        for section in model.sections:  # "as": its name in the set, which the set's schedule uses
            if pieces and section.kind is SectionKind.WEIGHTS:
                placements += _place_weights(sections, pieces, cuts[index], section, index)
                continue
            stored = _stored(sections, section, taken) or _add(sections, section, index)
            taken.add(stored.name)
            placements.append(_placement(stored.name, section.name, section, section.load_address))
        entries.append({"shapes": [list(shape) for shape in sets[index].values()], "sections": placements,
                        "graph": model.trailer["graph"], "tensors": model.trailer.get("tensors", []),
                        "memory_map": model.trailer.get("memory_map", {}),
                        "schedule": model.trailer.get("schedule", [])})
    trailer = {key: value for key, value in first.trailer.items() if key != "format"}
    trailer[KEY] = {"inputs": list(sets[0]), "sets": entries}
    return ModelFile(tuple(sections), trailer)


def _placement(name: str, view_name: str, section: Section, address: int) -> dict[str, Any]:
    return {"name": name, "as": view_name, "region": section.region.name.lower(), "load_address": address}


def _weight_pieces(models: Sequence[ModelFile]) -> tuple[list[Section], dict[int, tuple[int, int]]]:
    """Set 0's weights image cut into pieces where a later set's image departs from it: for set k
    the common prefix and suffix (whole granules) as (prefix, suffix) bytes. No pieces (the whole
    section is shared or stored as it is) unless some set's image differs and every model has one
    weights section."""
    images = [model.sections_of_kind(SectionKind.WEIGHTS) for model in models]
    if any(len(found) != 1 for found in images) or all(found[0].data == images[0][0].data for found in images):
        return [], {}
    base, cuts, points = images[0][0], {}, set()
    for index, (image,) in enumerate(images[1:], 1):
        a, b = base.data, image.data
        prefix = 0
        while prefix + GRANULE <= min(len(a), len(b)) and a[prefix:prefix + GRANULE] == b[prefix:prefix + GRANULE]:
            prefix += GRANULE
        suffix = 0
        while (suffix + GRANULE <= min(len(a), len(b)) - prefix
               and a[len(a) - suffix - GRANULE:len(a) - suffix] == b[len(b) - suffix - GRANULE:len(b) - suffix]):
            suffix += GRANULE
        if (len(a) - suffix) % GRANULE or (len(b) - suffix) % GRANULE:
            suffix = 0  # pieces start on granules in both images
        cuts[index] = (prefix, suffix)
        points |= {prefix, len(a) - suffix}
    bounds = sorted({0, len(base.data)} | {p for p in points if 0 < p < len(base.data)})
    pieces = [Section(base.kind, base.name if start == 0 else f"{base.name}+{start:#x}", base.data[start:end],
                      base.region, base.load_address + start, base.alignment)
              for start, end in zip(bounds, bounds[1:])]
    return pieces, cuts


def _place_weights(sections: list[Section], pieces: list[Section], cut: tuple[int, int], image: Section,
                   index: int) -> list[dict[str, Any]]:
    """Set ``index``'s weights: set 0's pieces inside the common prefix and suffix, at the set's
    addresses, and its own middle run stored unplaced."""
    prefix, suffix = cut
    total = sum(piece.size for piece in pieces)
    base = pieces[0].load_address
    placements = []
    for piece in pieces:
        start = piece.load_address - base
        if start + piece.size <= prefix:
            placements.append(_placement(piece.name, piece.name, image, image.load_address + start))
        elif start >= total - suffix:
            placements.append(_placement(piece.name, piece.name, image,
                                         image.load_address + start - total + image.size))
    middle = image.data[prefix:image.size - suffix]
    if middle:
        own = Section(image.kind, f"{image.name}@{index}", middle, MemoryRegion.NONE, 0, image.alignment)
        sections.append(own)
        placements.append(_placement(own.name, own.name, image, image.load_address + prefix))
    return placements


def _stored(sections: list[Section], section: Section, taken: set[str]) -> Section | None:
    for candidate in sections:
        if candidate.name not in taken and candidate.kind is section.kind and candidate.data == section.data:
            return candidate
    return None


def _add(sections: list[Section], section: Section, index: int) -> Section:
    if section.region is MemoryRegion.NONE:
        raise CompileError(f"dynamic input set {index + 1}: section {section.name!r} is not placed; only placed "
                           "sections can belong to a shape set")
    added = Section(section.kind, f"{section.name}@{index}", section.data, MemoryRegion.NONE, 0, section.alignment)
    sections.append(added)
    return added


__all__ = ["build_dynamic", "first_set_options", "merge", "model_inputs", "parse_dynamic_input", "resolve_sets"]
