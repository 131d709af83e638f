"""Ops that pick or join parts of tensors: Concat, Split, Slice, Gather.

Canonical attributes: Concat ``axis``; Split ``axis`` and ``split`` (the size of every
output); Slice ``starts``/``ends``/``axes``/``steps`` clamped by the ONNX rules (an end of -1
with a negative step means "through index 0"); Gather ``axis`` (indices stay an input).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from .base import Canonical, NodeView, TensorInfo, int_list, normalize_axis, register


def _canonical_concat(view: NodeView) -> Canonical:
    axis = normalize_axis(int(view.attr("axis", 0)), view.rank(0))
    return Canonical({"axis": axis}, [name for name in view.input_names if name])


def _infer_concat(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    axis = attrs["axis"]
    first = inputs[0].shape
    for info in inputs[1:]:
        if len(info.shape) != len(first) or any(a != b for i, (a, b) in enumerate(zip(first, info.shape)) if i != axis):
            raise CompileError(f"Concat inputs {[list(i.shape) for i in inputs]} differ off axis {axis}")
    shape = list(first)
    shape[axis] = sum(info.shape[axis] for info in inputs)
    return [TensorInfo.of(shape, inputs[0].dtype)]


def _single_input(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return len(inputs) == 1


@register("Concat", infer=_infer_concat, canonicalize=_canonical_concat, is_noop=_single_input)
def concat(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(x, axis=attrs["axis"])


def _canonical_split(view: NodeView) -> Canonical:
    shape = view.info(0).shape
    axis = normalize_axis(int(view.attr("axis", 0)), len(shape))
    count = len(view.node.output)
    if view.opset >= 13 and view.has_input(1):
        split = int_list(view.require_const(1, "split"))
    elif view.opset < 13 and view.attr("split") is not None:
        split = int_list(view.attr("split"))
    else:
        parts = int(view.attr("num_outputs", count))
        chunk = -(-shape[axis] // parts)  # num_outputs: equal chunks, the last one smaller
        split = [min(chunk, max(0, shape[axis] - i * chunk)) for i in range(parts)]
    if sum(split) != shape[axis] or len(split) != count:
        raise view.fail(f"split {split} does not cut axis {axis} of size {shape[axis]} into {count} outputs")
    return Canonical({"axis": axis, "split": split}, [view.input_names[0]])


def _infer_split(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    shape = list(inputs[0].shape)
    infos = []
    for size in attrs["split"]:
        shape[attrs["axis"]] = size
        infos.append(TensorInfo.of(shape, inputs[0].dtype))
    return infos


@register("Split", infer=_infer_split, canonicalize=_canonical_split)
def split(attrs: dict[str, Any], x: list[np.ndarray]) -> list[np.ndarray]:
    return np.split(x[0], np.cumsum(attrs["split"])[:-1], axis=attrs["axis"])


def _clamp_slice(start: int, end: int, step: int, size: int) -> tuple[int, int]:
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    if step > 0:
        return min(max(start, 0), size), min(max(end, 0), size)
    return min(max(start, 0), size - 1), min(max(end, -1), size - 1)


def _canonical_slice(view: NodeView) -> Canonical:
    shape = view.info(0).shape
    if view.opset < 10:  # Slice-1 has attributes
        starts, ends = int_list(view.attr("starts")), int_list(view.attr("ends"))
        axes = int_list(view.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = int_list(view.require_const(1, "starts")), int_list(view.require_const(2, "ends"))
        axes = int_list(view.require_const(3, "axes")) if view.has_input(3) else list(range(len(starts)))
        steps = int_list(view.require_const(4, "steps")) if view.has_input(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or 0 in steps:
        raise view.fail(f"starts {starts}, ends {ends}, axes {axes}, steps {steps} do not match or a step is 0")
    axes = [normalize_axis(axis, len(shape)) for axis in axes]
    clamped = [_clamp_slice(s, e, st, shape[a]) for s, e, st, a in zip(starts, ends, steps, axes)]
    attrs = {"starts": [c[0] for c in clamped], "ends": [c[1] for c in clamped], "axes": axes, "steps": steps}
    return Canonical(attrs, [view.input_names[0]])


def _slices(attrs: dict[str, Any], rank: int) -> tuple[slice, ...]:
    picks = [slice(None)] * rank
    for start, end, axis, step in zip(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]):
        picks[axis] = slice(start, None if end < 0 else end, step)
    return tuple(picks)


def _infer_slice(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    shape = list(inputs[0].shape)
    for start, end, axis, step in zip(attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"]):
        shape[axis] = len(range(start, end, step))
    return [TensorInfo.of(shape, inputs[0].dtype)]


def _whole_slice(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return inputs[0].shape == outputs[0].shape and all(step > 0 for step in attrs["steps"])


@register("Slice", infer=_infer_slice, canonicalize=_canonical_slice, is_noop=_whole_slice)
def slice_(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0][_slices(attrs, x[0].ndim)]


def _canonical_gather(view: NodeView) -> Canonical:
    return Canonical({"axis": normalize_axis(int(view.attr("axis", 0)), view.rank(0))}, view.input_names[:2])


def _infer_gather(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    data, indices, axis = inputs[0].shape, inputs[1].shape, attrs["axis"]
    return [TensorInfo.of((*data[:axis], *indices, *data[axis + 1:]), inputs[0].dtype)]


@register("Gather", infer=_infer_gather, canonicalize=_canonical_gather)
def gather(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    data, indices, axis = x[0], x[1].astype(np.int64), attrs["axis"]
    indices = np.where(indices < 0, indices + data.shape[axis], indices)
    return np.take(data, indices, axis=axis)
