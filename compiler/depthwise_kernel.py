"""Depthwise Conv for calibration as one Numba loop (issue 20: compile time).

``ops/conv.py`` computes a depthwise conv as a float64 multiply-add per kernel tap over numpy
arrays: each output is ``+0.0`` plus the products ``x * w`` (float32 input widened to float64,
exact) added tap after tap in ``np.ndindex`` order, then the bias added in float64 and the sum
rounded to the input's dtype (``_finish``). :func:`depthwise_conv` runs the same additions in
the same order in one compiled loop over a float32 copy of the input with its ``+0.0`` pads
(the same values as numpy's float64 padded copy: the widening is exact), writing the rounded
output directly (no float64 padded copy or result, no separate bias pass), so the values are
the same bits (tests/compiler/test_depthwise_kernel.py, against a numpy reference). Loops indexed
from 0 over slices let LLVM vectorize them: 6-10x numpy's per-tap passes on PP-OCRv4 rec's convs.

Only finite weights: with an infinite one a pad's ``0 * inf`` is NaN, and which NaN a sum of
two NaNs keeps (its sign) depends on operand order, which the compiler may swap; NaN inputs
likewise give NaN, perhaps of the other sign (calibration ignores non-finite values).

Importing Numba and loading the compiled kernel from its cache costs ~0.5 s of CPU per process
and ~120 MB of memory, and the first compile on a machine 1-2 s (then cached next to this file,
or in ``NUMBA_CACHE_DIR``), so calibration uses the kernel only when the graph's depthwise work
over all samples is large enough to repay that (:func:`calibration_ops`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .gc_freeze import collector_paused
from .ir import Graph
from .ops import OpDef, get_op

#: depthwise multiply-adds (output elements x taps, all samples) from which loading Numba pays.
#: Measured (development machine, one sample's depthwise convs on random data): PP-OCRv4 rec,
#: 49M multiply-adds, numpy 84 ms, this kernel 15 ms (1.4 ns saved each); MobileNetV2, 21M,
#: 25 -> 8.5 ms (0.8 ns). Numba costs ~0.6 s of CPU per process (import and kernel load ~0.5 s,
#: more work for the cycle collector, which kernel() limits), so the break-even is 0.43e9 to 0.75e9
#: by shape: PP-OCRv4 rec with 20 samples (1.0e9) uses the kernel, MobileNetV2 with 20 (0.42e9) not.
MIN_CALIBRATION_WORK = 700_000_000

_KERNEL: list = []


def _sums(padded, weight, bias, has_bias, strides, dilations, out):
    """``out[n, c] = round(sum over taps of padded[n, c, tap window] * weight[c, tap] (+ bias[c]))``:
    float64 products added to a float64 plane from ``+0.0``, taps in row-major order. With unit
    strides each tap is one run over the flattened padded plane (each output row then spans the
    padded width; the extra columns are not read out), as ``ops/conv.py`` runs it."""
    batch, channels, height, width = padded.shape
    out_h, out_w = out.shape[2], out.shape[3]
    kernel_h, kernel_w = weight.shape[1], weight.shape[2]
    flat = strides[0] == 1 and strides[1] == 1
    pitch = width if flat else out_w  # elements per output row in the sums
    length = (out_h - 1) * pitch + out_w
    sums = np.empty(length, dtype=np.float64)
    for n in range(batch):
        for c in range(channels):
            plane = padded[n, c].reshape(height * width)
            sums[:] = 0.0
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    scale = weight[c, ky, kx]
                    if flat:  # (slices indexed from 0: the loops vectorize)
                        source = plane[ky * dilations[0] * width + kx * dilations[1]:]
                        for i in range(length):
                            sums[i] += np.float64(source[i]) * scale
                        continue
                    for oy in range(out_h):
                        source = plane[(oy * strides[0] + ky * dilations[0]) * width + kx * dilations[1]:]
                        target = sums[oy * pitch:]
                        if strides[1] == 1:
                            for ox in range(out_w):
                                target[ox] += np.float64(source[ox]) * scale
                        else:
                            for ox in range(out_w):
                                target[ox] += np.float64(source[ox * strides[1]]) * scale
            for oy in range(out_h):
                for ox in range(out_w):
                    out[n, c, oy, ox] = sums[oy * pitch + ox] + bias[c] if has_bias else sums[oy * pitch + ox]


def kernel():
    """The compiled ``_sums``: Numba imported and the kernel compiled or loaded from its cache on
    the first call, by running it once on a tiny input of the argument types ``depthwise_conv``
    passes (so a process that forks workers afterwards shares the loaded code)."""
    if not _KERNEL:
        with collector_paused():  # Numba's modules and the loaded kernel stay for the process (gc_freeze.py)
            from numba import njit

            compiled = njit(cache=True, nogil=True)(_sums)
            ints = np.ones(2, dtype=np.int64)
            compiled(np.zeros((1, 1, 1, 1), np.float32), np.zeros((1, 1, 1)), np.zeros(1), False, ints, ints,
                     np.empty((1, 1, 1, 1), np.float32))
        _KERNEL.append(compiled)
    return _KERNEL[0]


def applies(attrs: dict[str, Any], x: list[np.ndarray]) -> bool:
    """The cases the kernel computes: 2-D depthwise, float32 input, finite weights (module doc)."""
    data, weight = x[0], x[1]
    return (len(attrs["kernel_shape"]) == 2 and data.dtype == np.float32 and data.ndim == 4
            and attrs["group"] == data.shape[1] == weight.shape[0] and weight.shape[1] == 1
            and bool(np.isfinite(weight).all()))


def depthwise_conv(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """The Conv op's value for a case :func:`applies` to, from the compiled loop."""
    data, pads = x[0], attrs["pads"]
    weight = np.ascontiguousarray(x[1], dtype=np.float64).reshape(x[1].shape[0], *attrs["kernel_shape"])
    has_bias = len(x) > 2
    bias = np.asarray(x[2], dtype=np.float64).reshape(-1) if has_bias else np.zeros(weight.shape[0])
    padded = np.zeros((*data.shape[:2], data.shape[2] + pads[0] + pads[2], data.shape[3] + pads[1] + pads[3]),
                      dtype=np.float32)  # +0.0 pads, as ops/conv.py pads (in float64: the same values)
    padded[:, :, pads[0]:pads[0] + data.shape[2], pads[1]:pads[1] + data.shape[3]] = data
    sizes = [(padded.shape[2 + i] - ((k - 1) * d + 1)) // s + 1
             for i, (k, s, d) in enumerate(zip(attrs["kernel_shape"], attrs["strides"], attrs["dilations"]))]
    out = np.empty((data.shape[0], data.shape[1], *sizes), dtype=data.dtype)
    kernel()(padded, weight, np.ascontiguousarray(bias), has_bias, np.array(attrs["strides"], dtype=np.int64),
             np.array(attrs["dilations"], dtype=np.int64), out)
    return out


def conv(attrs: dict[str, Any], x: list[np.ndarray]) -> np.ndarray:
    """Conv: the kernel where it applies, else the numpy op."""
    if applies(attrs, x):
        return depthwise_conv(attrs, x)
    return get_op("Conv").compute(attrs, x)


def calibration_work(graph: Graph, samples: int) -> int:
    """Multiply-adds of the graph's 2-D depthwise convs over ``samples`` evaluations."""
    work = 0
    for node in graph.nodes:
        if node.op_type != "Conv" or len(node.attrs.get("kernel_shape", ())) != 2:
            continue
        data, out = graph.tensors[node.inputs[0]], graph.tensors[node.outputs[0]]
        if node.attrs.get("group") == data.shape[1] and len(out.shape) == 4:
            work += int(np.prod(out.shape)) * int(np.prod(node.attrs["kernel_shape"]))
    return work * samples


def calibration_ops(graph: Graph, samples: int) -> dict[str, OpDef] | None:
    """The ops for ``float_eval.evaluate`` to calibrate ``graph`` on ``samples`` samples with: the
    Conv of this module, loaded now (before any worker process forks), when the depthwise work
    repays loading Numba (``MIN_CALIBRATION_WORK``) and Numba is installed; else None."""
    if calibration_work(graph, samples) < MIN_CALIBRATION_WORK:
        return None
    try:
        kernel()
    except ImportError:
        return None
    return {"Conv": dataclasses.replace(get_op("Conv"), compute=conv)}
