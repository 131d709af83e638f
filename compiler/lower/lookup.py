"""Finding and checking a layer's placements (shared by the lowering modules)."""

from __future__ import annotations

from collections.abc import Mapping

from npuemu.isa.errors import CompileError

from .placement import ConstPlacement, Placement, TensorPlacement


def tensor(placements: Mapping[str, Placement], name: str, layer: str) -> TensorPlacement:
    placement = placements.get(name)
    if not isinstance(placement, TensorPlacement):
        raise CompileError(f"layer {layer}: no feature-map placement for tensor {name!r}")
    return placement


def constant(placements: Mapping[str, Placement], name: str, size: int, layer: str) -> ConstPlacement:
    placement = placements.get(name)
    if not isinstance(placement, ConstPlacement):
        raise CompileError(f"layer {layer}: no constant placement for {name!r}")
    if placement.size < size:
        raise CompileError(f"layer {layer}: constant {name!r} needs {size} bytes, its placement has {placement.size}")
    return placement


def check_feature(placement: TensorPlacement, shape: tuple[int, int, int], dtype: str, what: str, layer: str) -> None:
    if placement.shape != tuple(shape):
        raise CompileError(f"layer {layer}: {what} {placement.name} is placed as {placement.shape}, the layer needs {tuple(shape)}")
    if placement.dtype != dtype:
        raise CompileError(f"layer {layer}: {what} {placement.name} is {placement.dtype}, the layer computes in {dtype}")


def unpacked_pair(layer, placements: Mapping[str, Placement], what: str,
                  dtypes: tuple[str, str] | None = None) -> tuple[TensorPlacement, TensorPlacement]:
    """The checked input and output placements of a one-input layer (``input``/``output`` names
    and ``input_shape``/``output_shape``/``dtype``, or ``dtypes`` = (input's, output's) where they
    differ), both NC1HWC2 (``what`` names the layer kind in the refusal of a packed image)."""
    source = tensor(placements, layer.input, layer.name)
    out = tensor(placements, layer.output, layer.name)
    in_dtype, out_dtype = dtypes or (layer.dtype, layer.dtype)
    check_feature(source, layer.input_shape, in_dtype, "input", layer.name)
    check_feature(out, layer.output_shape, out_dtype, "output", layer.name)
    if source.packed or out.packed:
        raise CompileError(f"layer {layer.name}: {what} needs NC1HWC2 tensors, not packed images")
    return source, out


def joined_placements(layer, placements: Mapping[str, Placement], what: str):
    """The checked output placement of a layer joining its inputs (layers.JoinedLayer) and, per
    input, (placement, shape, quantization), all NC1HWC2 (``what`` names the kind in the refusal
    of a packed image)."""
    out = tensor(placements, layer.output, layer.name)
    check_feature(out, layer.output_shape, layer.dtype, "output", layer.name)
    sources = []
    for index, (name, shape, quant) in enumerate(zip(layer.inputs, layer.shapes, layer.input_quants)):
        source = tensor(placements, name, layer.name)
        check_feature(source, shape, layer.dtype, f"input {index}", layer.name)
        if source.packed or out.packed:
            raise CompileError(f"layer {layer.name}: {what} needs NC1HWC2 tensors, not packed images")
        sources.append((source, shape, quant))
    return out, sources
