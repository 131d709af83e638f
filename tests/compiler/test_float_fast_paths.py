"""The float evaluator's faster formulations (issue 20: calibration time) give the bits of the
plain ones, written out here: MaxPool as one np.maximum per kernel tap against numpy's
reduction over the window view; Sigmoid and HardSwish in one buffer against their textbook
float64 expressions. Values include -0.0 / +0.0 ties (MaxPool's compared sign-blind: see its test), NaN and infinities, where the order of
the comparisons or of the operands would show."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from npuemu.compiler.ops import activation, pool

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, np.nan, -np.inf, np.inf, 2.5, -2.5])


def plain_max_pool(x: np.ndarray, kernel, strides, dilations, pads, ceil_mode) -> np.ndarray:
    """MaxPool by its definition: pad with the lowest value (ceil mode's extra cells too), take
    every window with numpy's sliding windows and reduce it with ``max``."""
    rank = len(kernel)
    lowest = np.iinfo(x.dtype).min if np.issubdtype(x.dtype, np.integer) else -np.inf
    outs, extra = [], []
    for i in range(rank):
        extent = (kernel[i] - 1) * dilations[i] + 1
        span = x.shape[2 + i] + pads[i] + pads[rank + i] - extent
        out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
        if ceil_mode and (out - 1) * strides[i] >= x.shape[2 + i] + pads[i]:
            out -= 1
        outs.append(out)
        extra.append(max(0, (out - 1) * strides[i] + extent - (x.shape[2 + i] + pads[i] + pads[rank + i])))
    padded = np.pad(x, [(0, 0), (0, 0), *((pads[i], pads[rank + i] + extra[i]) for i in range(rank))],
                    constant_values=lowest)
    extents = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    view = sliding_window_view(padded, extents, axis=tuple(range(2, 2 + rank)))
    view = view[(slice(None), slice(None), *(slice(None, None, s) for s in strides),
                 *(slice(None, None, d) for d in dilations))]
    view = view[(slice(None), slice(None), *(slice(0, o) for o in outs))]
    return view.max(axis=tuple(range(-rank, 0)))


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rank=st.integers(1, 2), dtype=st.sampled_from(["float32", "float64", "float16",
                                                                                       "int8", "int32"]))
def test_max_pool_taps_are_the_window_reduction(seed, rank, dtype) -> None:
    rng = np.random.default_rng(seed)
    kernel = [int(k) for k in rng.integers(1, 6, rank)]
    strides = [int(s) for s in rng.integers(1, 4, rank)]
    dilations = [int(d) for d in rng.integers(1, 3, rank)]
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 5)),
             *[int(rng.integers((k - 1) * d + 1, 18)) for k, d in zip(kernel, dilations)])
    if dtype.startswith("float"):
        x = rng.choice(SPECIALS, size=shape).astype(dtype)
    else:
        x = rng.integers(-3, 3, size=shape).astype(dtype)
    pads = [int(rng.integers(0, k)) for k in kernel] * 2
    ceil_mode = int(rng.integers(0, 2))
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "ceil_mode": ceil_mode}
    got = pool.max_pool(attrs, [x])
    want = plain_max_pool(x, kernel, strides, dilations, pads, ceil_mode)
    assert got.dtype == want.dtype and got.shape == want.shape
    # bit for bit, NaNs included; zero signs of -0.0 / +0.0 ties are numpy's own (its max reduction and
    # np.maximum break them by vector lane, differently per dtype), so both sides are compared with -0.0
    # as +0.0 (x + 0.0): calibration's ranges do not see a zero's sign
    if got.dtype.kind == "f":
        got, want = got + got.dtype.type(0), want + want.dtype.type(0)
    assert got.tobytes() == want.tobytes()


def test_max_pool_ties_go_to_the_later_tap_as_in_numpys_reduction() -> None:
    x = np.array([[[[-0.0, 0.0, 0.0, -0.0]]]], dtype=np.float32)
    attrs = {"kernel_shape": [1, 2], "strides": [1, 2], "dilations": [1, 1], "pads": [0, 0, 0, 0], "ceil_mode": 0}
    assert np.signbit(pool.max_pool(attrs, [x])).tolist() == [[[[False, True]]]]
    assert np.signbit(plain_max_pool(x, [1, 2], [1, 2], [1, 1], [0, 0, 0, 0], 0)).tolist() == [[[[False, True]]]]


def textbook_sigmoid(x: np.ndarray) -> np.ndarray:
    value = x.astype(np.float64)
    positive = 1.0 / (1.0 + np.exp(-np.abs(value)))
    return np.where(value >= 0, positive, 1.0 - positive).astype(x.dtype)


def textbook_hard_swish(x: np.ndarray) -> np.ndarray:
    value = x.astype(np.float64)
    return (value * np.clip(value / 6.0 + 0.5, 0.0, 1.0)).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_sigmoid_and_hard_swish_in_one_buffer(dtype) -> None:
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(50_000) * rng.choice([0.01, 1.0, 8.0, 700.0], 50_000)).astype(dtype)
    x[:SPECIALS.size] = SPECIALS
    kept = x.copy()
    for fast, plain in ((activation.sigmoid, textbook_sigmoid), (activation.hard_swish, textbook_hard_swish)):
        got, want = fast({}, [x]), plain(x)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), fast.__name__
    assert x.tobytes() == kept.tobytes()  # the input is not written (float64 inputs are used in place)
    wide = x.astype(np.float64)
    activation.sigmoid({}, [wide])
    activation.hard_swish({}, [wide])
    assert wide.tobytes() == x.astype(np.float64).tobytes()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(["float32", "float64", "float16"]))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # 1e39 overflows float16/float32 on purpose
def test_range_observer_takes_finite_extremes_in_two_passes(seed, dtype) -> None:
    """RangeObserver.update skips the finite filter when the extremes are finite; what it records
    is the plain definition's: min / max / count of the finite float32 values, non-finite counted."""
    from npuemu.compiler.quant.observers import RangeObserver

    rng = np.random.default_rng(seed)
    observer, lo, hi, count, bad = RangeObserver(), np.inf, -np.inf, 0, 0
    for at in range(4):
        size = int(rng.integers(0, 40))
        values = rng.choice(SPECIALS, size) if rng.random() < 0.5 else rng.standard_normal(size) * 1e39
        values = values.astype(dtype)
        observer.update(values, at)
        as32 = values.astype(np.float32)
        finite = as32[np.isfinite(as32)]
        bad += int(as32.size - finite.size)
        if finite.size:
            lo, hi, count = min(lo, float(finite.min())), max(hi, float(finite.max())), count + finite.size
    assert (observer.count, observer.non_finite) == (count, bad)
    if count:
        assert (observer.lo, observer.hi) == (lo, hi)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
@pytest.mark.parametrize("bounds", [(0.0, 6.0), (3.0, 1.0), (-np.inf, np.inf)])
def test_clip_in_one_buffer_is_min_of_max(dtype, bounds) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(5_000) * 10).astype(dtype)
    if dtype.startswith("float"):
        x[:SPECIALS.size] = SPECIALS
    low, high = bounds
    if dtype == "int8":  # the op clamps its bounds to the integer type first
        low, high = max(low, -128), min(high, 127)
    want = np.minimum(np.maximum(x, x.dtype.type(low)), x.dtype.type(high))  # ONNX: max wins if min > max
    got = activation.clip({"min": bounds[0], "max": bounds[1]}, [x])
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def plain_depthwise(x: np.ndarray, w: np.ndarray, kernel, dilations, pads) -> np.ndarray:
    """Depthwise conv (unit strides) by its definition: float64 products of each kernel tap's
    window added to a zero start in row-major tap order, then cast to the input's dtype."""
    rank = len(kernel)
    padded = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *((pads[i], pads[rank + i]) for i in range(rank))])
    sizes = [padded.shape[2 + i] - (kernel[i] - 1) * dilations[i] for i in range(rank)]
    acc = np.zeros((x.shape[0], x.shape[1], *sizes))
    for tap in np.ndindex(*kernel):
        window = padded[(slice(None), slice(None), *(slice(t * d, t * d + n) for t, d, n in zip(tap, dilations, sizes)))]
        acc = acc + window * w[(slice(None), 0, *tap)].astype(np.float64).reshape(-1, *[1] * rank)
    return acc.astype(x.dtype)


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rank=st.integers(1, 3), channels_last=st.booleans())
def test_depthwise_tap_sums_both_layouts_give_the_definitions_bits(seed, rank, channels_last):
    """Unit-stride depthwise convs through the channels-last tap sums and through the per-channel
    ones (conv._CHANNELS_LAST_RATIO forced either way) against the definition, bit for bit."""
    from npuemu.compiler.ops import conv

    rng = np.random.default_rng(seed)
    kernel = [int(k) for k in rng.integers(1, 4 if rank == 3 else 6, rank)]
    dilations = [int(d) for d in rng.integers(1, 3, rank)]
    channels = int(rng.integers(1, 70))
    shape = (int(rng.integers(1, 3)), channels,
             *[int(rng.integers((k - 1) * d + 1, (k - 1) * d + (6 if rank == 3 else 14))) for k, d in zip(kernel, dilations)])
    # signed powers of two far apart (as tests/compiler/test_conv_float_paths.py): large products
    # cancel exactly, so a sum in another tap order keeps or loses the small ones and the float32
    # result shows it; zeros of both signs
    x = (rng.choice([-1.0, 1.0], shape) * 2.0 ** rng.choice([30, 0, -30], shape)).astype(np.float32)
    x[..., 0] = -0.0
    w = (rng.choice([-1.0, 1.0], (channels, 1, *kernel)) * 2.0 ** rng.choice([0, -30], (channels, 1, *kernel)))
    w = w.astype(np.float32)
    pads = [int(rng.integers(0, k)) for k in kernel] * 2
    attrs = {"kernel_shape": kernel, "strides": [1] * rank, "dilations": dilations, "pads": pads, "group": channels}
    saved = conv._CHANNELS_LAST_RATIO
    conv._CHANNELS_LAST_RATIO = 10**9 if channels_last else -1
    try:
        got = conv.conv(attrs, [x, w])
    finally:
        conv._CHANNELS_LAST_RATIO = saved
    want = plain_depthwise(x, w, kernel, dilations, pads)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
