"""Host-side convolutions (ONNX semantics, any spatial rank and batch): Conv, ConvTranspose
and FullyConnected (the compiler's ``MatMul``/``Gemm`` with constant weights: X flattened at
``axis`` into rows, W [N, K], optional B [N]). Used where the NPU cannot run the layer (batch
N > 1, rank other than 4-D, or a deconvolution form the CNA does not have) - as the vendor
runtime falls back to its CPU kernels. Parameters are the compiler's canonical attributes
(explicit ``pads``: begins then ends; ConvTranspose ``output_padding``, negative end pads
meaning a larger output than the input reaches)."""

from __future__ import annotations

import itertools

import numpy as np


def _spatial(params: dict, rank: int) -> tuple[list[int], list[int], list[int]]:
    strides = [int(s) for s in params.get("strides", [1] * rank)]
    dilations = [int(d) for d in params.get("dilations", [1] * rank)]
    pads = [int(p) for p in params.get("pads", [0] * 2 * rank)]
    return strides, dilations, pads


def _conv(inputs: list, params: dict) -> list[np.ndarray]:
    x, weight = inputs[0], inputs[1]
    rank, group = x.ndim - 2, int(params.get("group", 1))
    strides, dilations, pads = _spatial(params, rank)
    kernel = weight.shape[2:]
    padded = np.pad(x, [(0, 0), (0, 0), *[(pads[i], pads[rank + i]) for i in range(rank)]])
    outs = [(padded.shape[2 + i] - (kernel[i] - 1) * dilations[i] - 1) // strides[i] + 1 for i in range(rank)]
    batch, channels = x.shape[:2]
    out_channels = weight.shape[0]
    grouped = weight.reshape(group, out_channels // group, channels // group, *kernel)
    result = np.zeros((batch, group, out_channels // group, *outs))
    for offset in itertools.product(*[range(k) for k in kernel]):
        picks = tuple(slice(offset[i] * dilations[i], offset[i] * dilations[i] + (outs[i] - 1) * strides[i] + 1,
                            strides[i]) for i in range(rank))
        window = padded[(slice(None), slice(None), *picks)].reshape(batch, group, channels // group, *outs)
        taps = grouped[(slice(None), slice(None), slice(None), *offset)]
        result += np.einsum("ngc...,goc->ngo...", window, taps)
    result = result.reshape(batch, out_channels, *outs)
    if len(inputs) > 2 and inputs[2] is not None:
        result = result + inputs[2].reshape(-1, *[1] * rank)
    return [result]


def _conv_transpose(inputs: list, params: dict) -> list[np.ndarray]:
    """Each input pixel scatters its kernel-weighted copy to ``pixel * stride + tap * dilation``;
    then ``pads`` are cropped (a negative end pad adds zeros) and the bias added."""
    x, weight = inputs[0], inputs[1]
    rank, group = x.ndim - 2, int(params.get("group", 1))
    strides, dilations, pads = _spatial(params, rank)
    extra = [int(p) for p in params.get("output_padding", [0] * rank)]
    kernel, sizes = weight.shape[2:], x.shape[2:]
    batch, channels = x.shape[:2]
    per_group = weight.shape[1]
    full = [strides[i] * (sizes[i] - 1) + (kernel[i] - 1) * dilations[i] + 1 + extra[i] for i in range(rank)]
    result = np.zeros((batch, group, per_group, *full))
    grouped_x = x.reshape(batch, group, channels // group, *sizes)
    grouped_w = weight.reshape(group, channels // group, per_group, *kernel)
    for offset in itertools.product(*[range(k) for k in kernel]):
        picks = tuple(slice(offset[i] * dilations[i], offset[i] * dilations[i] + (sizes[i] - 1) * strides[i] + 1,
                            strides[i]) for i in range(rank))
        taps = grouped_w[(slice(None), slice(None), slice(None), *offset)]
        result[(slice(None), slice(None), slice(None), *picks)] += np.einsum("ngc...,gco->ngo...", grouped_x, taps)
    result = result.reshape(batch, group * per_group, *full)
    result = np.pad(result, [(0, 0), (0, 0), *[(0, max(0, -pads[rank + i])) for i in range(rank)]])
    crop = tuple(slice(pads[i], full[i] - pads[rank + i]) for i in range(rank))
    result = result[(slice(None), slice(None), *crop)]
    if len(inputs) > 2 and inputs[2] is not None:
        result = result + inputs[2].reshape(-1, *[1] * rank)
    return [result]


def _fully_connected(inputs: list, params: dict) -> list[np.ndarray]:
    x, weight = inputs[0], inputs[1]
    axis = int(params.get("axis", 1))
    rows = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    result = rows @ weight.T
    if len(inputs) > 2 and inputs[2] is not None:
        result = result + inputs[2]
    return [result.reshape(*x.shape[:axis], weight.shape[0])]


CONV_OPS = {"Conv": _conv, "ConvTranspose": _conv_transpose, "FullyConnected": _fully_connected}
