"""Pad: constant, reflect, edge (and wrap, opset 19).

Canonical attributes: ``pads`` ([begins..., ends...] over every axis; negative values crop),
``mode`` and ``value`` (the constant fill).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Canonical, NodeView, TensorInfo, Unsupported, int_list, normalize_axis, register

_NUMPY_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _canonical_pad(view: NodeView) -> Canonical:
    rank = view.rank(0)
    mode = view.attr("mode", "constant")
    if mode not in _NUMPY_MODES:
        raise Unsupported(f"Pad mode '{mode}'")
    if view.opset < 11:  # Pad-2: pads and value are attributes
        pads, value = int_list(view.attr("pads")), float(view.attr("value", 0.0))
    else:
        pads = int_list(view.require_const(1, "pads"))
        fill = view.const(2) if view.has_input(2) else None
        if view.has_input(2) and fill is None:
            view.require_const(2, "constant_value")
        value = float(fill.reshape(-1)[0]) if fill is not None and fill.size else 0.0
        if view.has_input(3):  # opset 18: pads only for the listed axes
            axes = [normalize_axis(axis, rank) for axis in int_list(view.require_const(3, "axes"))]  # keep order
            full = [0] * (2 * rank)
            for i, axis in enumerate(axes):
                full[axis], full[rank + axis] = pads[i], pads[len(axes) + i]
            pads = full
    if len(pads) != 2 * rank:
        raise view.fail(f"pads {pads} need {2 * rank} values for rank {rank}")
    return Canonical({"pads": pads, "mode": mode, "value": value}, [view.input_names[0]])


def _infer_pad(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    pads, rank = attrs["pads"], len(inputs[0].shape)
    return [TensorInfo.of([d + pads[i] + pads[rank + i] for i, d in enumerate(inputs[0].shape)], inputs[0].dtype)]


def _no_pads(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return not any(attrs["pads"])


@register("Pad", infer=_infer_pad, canonicalize=_canonical_pad, is_noop=_no_pads)
def pad(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data, pads = x[0], attrs["pads"]
    rank = data.ndim
    # negative pads crop; crop first so reflect/edge see the cropped tensor, as onnxruntime does
    crop = tuple(slice(max(0, -pads[i]), data.shape[i] - max(0, -pads[rank + i])) for i in range(rank))
    data = data[crop]
    widths = [(max(0, pads[i]), max(0, pads[rank + i])) for i in range(rank)]
    mode = _NUMPY_MODES[attrs["mode"]]
    if mode == "constant":
        return np.pad(data, widths, mode="constant", constant_values=data.dtype.type(attrs["value"]))
    return np.pad(data, widths, mode=mode)
