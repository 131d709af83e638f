"""Ops that only rearrange data: Reshape, Flatten, Squeeze, Unsqueeze, Transpose, DepthToSpace,
SpaceToDepth.

Canonical attributes: Reshape ``shape`` (resolved: no 0 or -1 left), Flatten ``axis``,
Squeeze/Unsqueeze ``axes`` (non-negative, sorted), Transpose ``perm``, DepthToSpace
``blocksize`` and ``mode`` (DCR or CRD), SpaceToDepth ``blocksize``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Canonical, NodeView, TensorInfo, int_list, normalize_axes, normalize_axis, register


def _same_shape(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return inputs[0].shape == outputs[0].shape


def resolve_reshape(view: NodeView, in_shape: tuple[int, ...], requested: list[int], allowzero: bool) -> list[int]:
    shape = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(requested)]
    known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
    total = int(np.prod(in_shape, dtype=np.int64))
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise view.fail(f"shape {requested} may hold at most one -1 and no other negative value")
    if -1 in shape:
        if known == 0 or total % known:
            raise view.fail(f"cannot reshape {list(in_shape)} to {requested}")
        shape[shape.index(-1)] = total // known
    if int(np.prod(shape, dtype=np.int64)) != total:
        raise view.fail(f"cannot reshape {list(in_shape)} ({total} elements) to {requested}")
    return shape


def _canonical_reshape(view: NodeView) -> Canonical:
    requested = int_list(view.require_const(1, "shape"))
    shape = resolve_reshape(view, view.info(0).shape, requested, bool(view.attr("allowzero", 0)))
    return Canonical({"shape": shape}, [view.input_names[0]])


def _infer_reshape(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(attrs["shape"], inputs[0].dtype)]


@register("Reshape", infer=_infer_reshape, canonicalize=_canonical_reshape, is_noop=_same_shape)
def reshape(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0].reshape(attrs["shape"])


def _canonical_flatten(view: NodeView) -> Canonical:
    rank = view.rank(0)
    axis = int(view.attr("axis", 1))
    if not -rank <= axis <= rank:
        raise view.fail(f"axis {axis} is out of range for rank {rank}")
    return Canonical({"axis": axis + rank if axis < 0 else axis}, [view.input_names[0]])


def _flatten_shape(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    return int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))


def _infer_flatten(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of(_flatten_shape(inputs[0].shape, attrs["axis"]), inputs[0].dtype)]


@register("Flatten", infer=_infer_flatten, canonicalize=_canonical_flatten, is_noop=_same_shape)
def flatten(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return x[0].reshape(_flatten_shape(x[0].shape, attrs["axis"]))


def _axes_from(view: NodeView) -> list[int] | None:
    """Squeeze/Unsqueeze axes: an attribute before opset 13, an input since."""
    if view.opset < 13:
        axes = view.attr("axes")
        return None if axes is None else int_list(axes)
    return int_list(view.require_const(1, "axes")) if view.has_input(1) else None


def _canonical_squeeze(view: NodeView) -> Canonical:
    shape = view.info(0).shape
    axes = _axes_from(view)
    axes = [i for i, d in enumerate(shape) if d == 1] if axes is None else normalize_axes(axes, len(shape))
    if any(shape[axis] != 1 for axis in axes):
        raise view.fail(f"cannot squeeze axes {axes} of shape {list(shape)}: not all of size 1")
    return Canonical({"axes": axes}, [view.input_names[0]])


def _infer_squeeze(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(d for i, d in enumerate(inputs[0].shape) if i not in attrs["axes"])
    return [TensorInfo.of(shape, inputs[0].dtype)]


@register("Squeeze", infer=_infer_squeeze, canonicalize=_canonical_squeeze, is_noop=_same_shape)
def squeeze(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.squeeze(x[0], axis=tuple(attrs["axes"]))


def _canonical_unsqueeze(view: NodeView) -> Canonical:
    axes = _axes_from(view)
    if axes is None:
        raise view.fail("axes are required")
    normalized = normalize_axes(axes, view.rank(0) + len(axes))
    if len(set(normalized)) != len(normalized):
        raise view.fail(f"axes {axes} repeat an axis")
    return Canonical({"axes": normalized}, [view.input_names[0]])


def _infer_unsqueeze(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    shape = list(inputs[0].shape)
    for axis in attrs["axes"]:
        shape.insert(axis, 1)
    return [TensorInfo.of(shape, inputs[0].dtype)]


@register("Unsqueeze", infer=_infer_unsqueeze, canonicalize=_canonical_unsqueeze)
def unsqueeze(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.expand_dims(x[0], axis=tuple(attrs["axes"]))


def _canonical_transpose(view: NodeView) -> Canonical:
    rank = view.rank(0)
    perm = view.attr("perm")
    perm = list(range(rank))[::-1] if perm is None else [normalize_axis(int(p), rank) for p in perm]
    if sorted(perm) != list(range(rank)):
        raise view.fail(f"perm {perm} is not a permutation of {rank} axes")
    return Canonical({"perm": perm}, [view.input_names[0]])


def _infer_transpose(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    return [TensorInfo.of([inputs[0].shape[p] for p in attrs["perm"]], inputs[0].dtype)]


def _identity_perm(attrs: dict[str, Any], inputs: list[TensorInfo], outputs: list[TensorInfo]) -> bool:
    return attrs["perm"] == sorted(attrs["perm"])


@register("Transpose", infer=_infer_transpose, canonicalize=_canonical_transpose, is_noop=_identity_perm)
def transpose(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    return np.transpose(x[0], attrs["perm"])


def _canonical_depth_to_space(view: NodeView) -> Canonical:
    block, mode = int(view.attr("blocksize", 0)), view.attr("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if view.rank(0) != 4:
        raise view.fail(f"DepthToSpace needs a 4-D input, not rank {view.rank(0)}")
    if block < 1 or view.info(0).shape[1] % (block * block):
        raise view.fail(f"blocksize {block}: {view.info(0).shape[1]} channels are not a multiple of blocksize^2")
    if mode not in ("DCR", "CRD"):
        raise view.fail(f"mode {mode!r} is neither DCR nor CRD")
    return Canonical({"blocksize": block, "mode": mode}, [view.input_names[0]])


def _infer_depth_to_space(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    n, c, h, w = inputs[0].shape
    block = attrs["blocksize"]
    return [TensorInfo.of([n, c // (block * block), h * block, w * block], inputs[0].dtype)]


@register("DepthToSpace", infer=_infer_depth_to_space, canonicalize=_canonical_depth_to_space)
def depth_to_space(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """Output pixel (y*b + i, x*b + j) of channel d takes input channel (i*b + j)*D + d (DCR) or
    d*b*b + i*b + j (CRD), D the output depth."""
    n, c, h, w = x[0].shape
    b = attrs["blocksize"]
    depth = c // (b * b)
    if attrs["mode"] == "CRD":
        blocks = x[0].reshape(n, depth, b, b, h, w)  # [n][d][i][j][y][x]
        return blocks.transpose(0, 1, 4, 2, 5, 3).reshape(n, depth, h * b, w * b)
    blocks = x[0].reshape(n, b, b, depth, h, w)  # [n][i][j][d][y][x]
    return blocks.transpose(0, 3, 4, 1, 5, 2).reshape(n, depth, h * b, w * b)


def _canonical_space_to_depth(view: NodeView) -> Canonical:
    block = int(view.attr("blocksize", 0))
    if view.rank(0) != 4:
        raise view.fail(f"SpaceToDepth needs a 4-D input, not rank {view.rank(0)}")
    height, width = view.info(0).shape[2:]
    if block < 1 or height % block or width % block:
        raise view.fail(f"blocksize {block}: height {height} and width {width} are not multiples of it")
    return Canonical({"blocksize": block}, [view.input_names[0]])


def _infer_space_to_depth(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
    n, c, h, w = inputs[0].shape
    block = attrs["blocksize"]
    return [TensorInfo.of([n, c * block * block, h // block, w // block], inputs[0].dtype)]


@register("SpaceToDepth", infer=_infer_space_to_depth, canonicalize=_canonical_space_to_depth)
def space_to_depth(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """Output channel (i*b + j)*C + c at (y, x) takes input channel c at (y*b + i, x*b + j) (the
    inverse of DepthToSpace DCR)."""
    n, c, h, w = x[0].shape
    b = attrs["blocksize"]
    blocks = x[0].reshape(n, c, h // b, b, w // b, b)  # [n][c][y][i][x][j]
    return blocks.transpose(0, 3, 5, 1, 2, 4).reshape(n, c * b * b, h // b, w // b)
