"""Host-side data movement and windowed ops (ONNX semantics): Slice, Pad, Gather, Expand,
Tile, Split, SpaceToDepth, and N-D MaxPool/AveragePool (any rank, batch, dilation, ceil mode).
Parameters are the compiler's canonical attributes (constant configuration inputs folded in:
Slice ``starts``/``ends``/``axes``/``steps`` already clamped, Pad ``pads`` for every axis,
``mode``, ``value``; pools' explicit ``pads`` = begins then ends)."""

from __future__ import annotations

import numpy as np

from npuemu.isa.errors import EmulationError


def _slice(inputs: list, params: dict) -> list[np.ndarray]:
    x = inputs[0]
    picks = [slice(None)] * x.ndim
    for start, end, axis, step in zip(params["starts"], params["ends"], params["axes"], params["steps"]):
        picks[int(axis)] = slice(int(start), None if int(end) < 0 else int(end), int(step))
    return [x[tuple(picks)]]


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad(inputs: list, params: dict) -> list[np.ndarray]:
    """Pad (negative pads crop) with a constant, a reflection, the edge or wrapping around."""
    x = inputs[0]
    rank, pads = x.ndim, [int(v) for v in params["pads"]]
    mode = str(params.get("mode", "constant"))
    if mode not in _PAD_MODES:
        raise EmulationError(f"CPU step 'Pad': mode {mode!r} is not implemented")
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[rank + i], 0)) for i in range(rank))
    x = x[crop]
    widths = [(max(pads[i], 0), max(pads[rank + i], 0)) for i in range(rank)]
    if mode == "constant":
        return [np.pad(x, widths, mode="constant", constant_values=float(params.get("value", 0.0)))]
    return [np.pad(x, widths, mode=_PAD_MODES[mode])]


def _gather(inputs: list, params: dict) -> list[np.ndarray]:
    data, axis = inputs[0], int(params.get("axis", 0))
    indices = np.asarray(inputs[1]).astype(np.int64)
    size = data.shape[axis]
    if indices.size and (indices.min() < -size or indices.max() >= size):
        raise EmulationError(f"CPU step 'Gather': an index is outside [-{size}, {size - 1}]")
    return [np.take(data, np.where(indices < 0, indices + size, indices), axis=axis)]


def _expand(inputs: list, params: dict) -> list[np.ndarray]:
    return [np.broadcast_to(inputs[0], tuple(int(d) for d in params["shape"])).copy()]


def _tile(inputs: list, params: dict) -> list[np.ndarray]:
    return [np.tile(inputs[0], [int(r) for r in params["repeats"]])]


def _split(inputs: list, params: dict) -> list[np.ndarray]:
    x, axis = inputs[0], int(params.get("axis", 0))
    sizes = [int(s) for s in params["split"]]
    bounds = np.cumsum(sizes)[:-1]
    return list(np.split(x, bounds, axis=axis))


def _space_to_depth(inputs: list, params: dict) -> list[np.ndarray]:
    """ONNX SpaceToDepth: output channel (i*b + j)*C + c at (y, x) is input c at (y*b + i, x*b + j)."""
    x, block = inputs[0], int(params.get("blocksize", 1))
    n, c, h, w = x.shape
    if block < 1 or h % block or w % block:
        raise EmulationError(f"CPU step 'SpaceToDepth': {h}x{w} is not a multiple of blocksize {block}")
    y = x.reshape(n, c, h // block, block, w // block, block).transpose(0, 3, 5, 1, 2, 4)
    return [y.reshape(n, c * block * block, h // block, w // block)]


def _windows(x: np.ndarray, params: dict):
    """(values, kind) of every pooling window, shaped (N, C, *out, *kernel): ``kind`` 0 for an
    input cell, 1 for an explicit pad, 2 for a cell ceil mode reads past the end pads."""
    spatial = x.shape[2:]
    rank = len(spatial)
    kernel = [int(k) for k in params["kernel_shape"]]
    strides = [int(s) for s in params.get("strides", [1] * rank)]
    dilations = [int(d) for d in params.get("dilations", [1] * rank)]
    pads = [int(p) for p in params.get("pads", [0] * 2 * rank)]
    ceil_mode = bool(params.get("ceil_mode", 0))
    outs, extras = [], []
    for i in range(rank):
        extent = (kernel[i] - 1) * dilations[i] + 1
        span = spatial[i] + pads[i] + pads[rank + i] - extent
        out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (out - 1) * strides[i] >= spatial[i] + pads[i]:
            out -= 1  # the last window must start inside the input or its leading pad
        outs.append(out)
        extras.append(max(0, (out - 1) * strides[i] + extent - (spatial[i] + pads[i] + pads[rank + i])))
    kind = np.zeros(spatial, np.int8)
    widths = [(pads[i], pads[rank + i]) for i in range(rank)]
    values = np.pad(x, [(0, 0), (0, 0), *widths], mode="constant")
    kind = np.pad(kind, widths, mode="constant", constant_values=1)
    values = np.pad(values, [(0, 0), (0, 0), *[(0, e) for e in extras]], mode="constant")
    kind = np.pad(kind, [(0, e) for e in extras], mode="constant", constant_values=2)
    index = []
    for i in range(rank):
        positions = np.arange(outs[i])[:, None] * strides[i] + np.arange(kernel[i])[None, :] * dilations[i]
        shape = [1] * (2 * rank)
        shape[i], shape[rank + i] = outs[i], kernel[i]
        index.append(positions.reshape(shape))
    return values[(slice(None), slice(None), *index)], kind[tuple(index)][None, None], rank


def _max_pool(inputs: list, params: dict) -> list[np.ndarray]:
    """MaxPool; with ``indices`` also each window's first maximum as a flat input position
    (row-major over N, C and the spatial axes; ``storage_order`` 1: spatial axes column-major)."""
    x = inputs[0]
    values, kind, rank = _windows(x, params)
    lowest = -np.inf if values.dtype.kind == "f" else np.iinfo(values.dtype).min
    values = np.where(kind == 0, values, lowest)
    axes = tuple(range(2 + rank, 2 + 2 * rank))
    if not params.get("indices"):
        return [values.max(axis=axes)]
    spatial = x.shape[2:]
    strides = np.cumprod((1, *spatial[:-1])) if params.get("storage_order") else \
        np.cumprod((1, *spatial[::-1][:-1]))[::-1]
    grid = sum(np.arange(size).reshape([-1 if a == i else 1 for a in range(rank)]) * int(stride)
               for i, (size, stride) in enumerate(zip(spatial, strides)))
    plane = int(np.prod(spatial, dtype=np.int64))
    positions = np.arange(x.shape[0] * x.shape[1]).reshape(*x.shape[:2], *[1] * rank) * plane + grid
    where, _, _ = _windows(positions.astype(np.int64), params)
    flat = values.reshape(*values.shape[:2 + rank], -1)
    first = flat.argmax(axis=-1)[..., None]
    return [flat.max(axis=-1), np.take_along_axis(where.reshape(flat.shape), first, axis=-1)[..., 0]]


def _average_pool(inputs: list, params: dict) -> list[np.ndarray]:
    values, kind, rank = _windows(inputs[0].astype(np.float64), params)
    axes = tuple(range(2 + rank, 2 + 2 * rank))
    counted = (kind == 0) | ((kind == 1) & bool(params.get("count_include_pad", 0)))
    total = np.where(kind == 0, values, 0.0).sum(axis=axes)
    return [total / np.maximum(counted.sum(axis=axes), 1)]


def _global_pool(function):
    def run(inputs: list, params: dict) -> list[np.ndarray]:
        x = inputs[0]
        return [function(x, axis=tuple(range(2, x.ndim)), keepdims=True)]
    return run


MOVE_OPS = {
    "Slice": _slice, "Pad": _pad, "Gather": _gather, "Expand": _expand, "Tile": _tile, "Split": _split,
    "SpaceToDepth": _space_to_depth,
    "MaxPool": _max_pool, "AveragePool": _average_pool,
    "GlobalAveragePool": _global_pool(np.mean), "GlobalMaxPool": _global_pool(np.max),
}
