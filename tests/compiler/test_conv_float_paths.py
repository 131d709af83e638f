"""The float evaluator's Conv (compiler/ops/conv.py) gives the same bits as the plain float64
formulation written out here (gathered windows and one einsum, one matmul for 1x1 group-1, a
multiply-add per tap from zero for depthwise; bias added in float64, then cast): calibration
ranges, and so the model files, depend on every bit of these values (issue 20: faster
calibration, byte-identical builds). The comparison is of the bytes (so -0.0 and 0.0 differ)
and of the layout (later reductions sum in memory order). The dense reference is numpy's einsum,
which numpy 2.4 (this project's) contracts with one matmul (bmm_einsum); the evaluator makes that
product itself from a faster window copy."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from npuemu.compiler.ops import get_op


def plain_conv(attrs: dict, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    data, weight = np.asarray(x, np.float64), np.asarray(w, np.float64)
    kernel, strides, dilations, group = attrs["kernel_shape"], attrs["strides"], attrs["dilations"], attrs["group"]
    rank, pads = len(kernel), attrs["pads"]
    padded = np.pad(data, [(0, 0), (0, 0), *zip(pads[:rank], pads[rank:])])
    batch, channels = data.shape[:2]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    sizes = [(padded.shape[2 + i] - e) // s + 1 for i, (e, s) in enumerate(zip(extents, strides))]
    if group == channels == weight.shape[0]:
        taps = weight.reshape(channels, -1)
        result = np.zeros((batch, channels, *sizes))
        for index, tap in enumerate(np.ndindex(*kernel)):
            view = padded[(slice(None), slice(None),
                           *(slice(t * d, t * d + s * (n - 1) + 1, s) for t, d, s, n in zip(tap, dilations, strides, sizes)))]
            result += view * taps[:, index].reshape(-1, *[1] * rank)
    elif group == 1 and all(k == 1 for k in kernel):
        picked = padded[(slice(None), slice(None), *(slice(None, None, s) for s in strides))]
        result = np.matmul(weight.reshape(weight.shape[0], channels), picked.reshape(batch, channels, -1))
        result = result.reshape(batch, -1, *picked.shape[2:])
    else:
        view = sliding_window_view(padded, extents, axis=tuple(range(2, 2 + rank)))
        cols = view[(slice(None), slice(None), *(slice(None, None, s) for s in strides),
                     *(slice(None, None, d) for d in dilations))]
        cols = cols.reshape(batch, group, channels // group, *sizes, -1)
        weight = weight.reshape(group, weight.shape[0] // group, channels // group, -1)
        result = np.einsum("ngc...k,gock->ngo...", cols, weight, optimize=True).reshape(batch, -1, *sizes)
    if b is not None:
        result = result + np.asarray(b, np.float64).reshape(-1, *[1] * rank)
    return result.astype(x.dtype, copy=False)


@st.composite
def cases(draw):
    rank = draw(st.sampled_from([2, 2, 2, 1, 3]))
    kind = draw(st.sampled_from(["depthwise", "pointwise", "dense", "grouped"]))
    group = draw(st.integers(1, 3)) if kind in ("depthwise", "grouped") else 1
    per_group = 1 if kind == "depthwise" else draw(st.integers(1, 4))
    outputs = group if kind == "depthwise" else group * draw(st.integers(1, 4))
    kernel = [1] * rank if kind == "pointwise" else [draw(st.integers(1, 4)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    dilations = [1] * rank if kind == "pointwise" else [draw(st.integers(1, 2)) for _ in range(rank)]
    pads = [draw(st.integers(0, 2)) for _ in range(2 * rank)]
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    sizes = [draw(st.integers(max(1, e - pads[i] - pads[i + rank]), e + 9)) for i, e in enumerate(extents)]
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "group": group}
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float16]))
    return attrs, (draw(st.integers(1, 3)), group * per_group, *sizes), (outputs, per_group, *kernel), dtype, \
        draw(st.booleans()), draw(st.integers(0, 2**16))


def check(attrs, x_shape, w_shape, dtype, with_bias, seed) -> None:
    rng = np.random.default_rng(seed)
    # signed powers of two far apart (float16: 2^8, 1, 2^-8 times 1 or 2^-40; float32: 2^30, 1,
    # 2^-30 times 1 or 2^-30): large terms cancel exactly, so a float64 sum taken in another
    # order keeps or loses the small ones and the cast result shows it (with values of one
    # scale, reordered sums nearly always round to the same float32)
    big, tiny = (8, 40) if dtype == np.float16 else (30, 30)
    x = (rng.choice([-1.0, 1.0], x_shape) * 2.0 ** rng.choice([big, 0, -big], x_shape)).astype(dtype)
    x[..., 0] = -0.0  # zero products of both signs
    w = (rng.choice([-1.0, 1.0], w_shape) * 2.0 ** rng.choice([0, -tiny], w_shape)).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if with_bias else None
    got = get_op("Conv").run(attrs, [x, w] + ([b] if with_bias else []))[0]
    want = plain_conv(attrs, x, w, b)
    assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_conv_paths_give_the_plain_formulations_bits(case) -> None:
    check(*case)


def test_model_sized_layers_give_the_same_bits() -> None:
    """Shapes where BLAS blocks its sums (K > 256) and the depthwise runs in several channel
    blocks: a ResNet 3x3, a strided stem, a MobileNet depthwise and pointwise, a 1-D conv."""
    layers = [({"kernel_shape": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [1] * 4, "group": 1},
               (1, 64, 28, 28), (64, 64, 3, 3)),
              ({"kernel_shape": [7, 7], "strides": [2, 2], "dilations": [1, 1], "pads": [3] * 4, "group": 1},
               (2, 3, 40, 40), (16, 3, 7, 7)),
              ({"kernel_shape": [3, 3], "strides": [2, 2], "dilations": [1, 1], "pads": [1] * 4, "group": 96},
               (1, 96, 56, 56), (96, 1, 3, 3)),
              ({"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1], "pads": [0] * 4, "group": 1},
               (1, 96, 28, 28), (24, 96, 1, 1)),
              ({"kernel_shape": [5], "strides": [1], "dilations": [2], "pads": [4, 4], "group": 1},
               (1, 80, 60), (40, 80, 5))]
    for index, (attrs, x_shape, w_shape) in enumerate(layers):
        check(attrs, x_shape, w_shape, np.float32, True, index)
