"""Review of the fetched-weight fp16 step (``units/cna_fetched_fp16.py``, NUMERICS.md 3.3 / 52): bit for
bit against the vendor order written here, and weights whose shape changes between runs.

The reference: the padded float32 planes (pad value beyond the input), then per output +0 and one
product added a step in (c, ky, kx) order, each add rounded to float32 (the product of two fp16 values
is exact) - NaN compared as NaN, every other bit exactly. Features carry NaN in the unused lanes of
their last atom and special values (-0, inf, subnormals) elsewhere.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.units import cna_fetched_fp16

SPECIAL = np.array([-0.0, np.inf, -np.inf, 2.0**-24, -(2.0**-20), 65504, np.nan], np.float16)


def fp16(rng, shape, special_share):
    values = (rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))).astype(np.float16)
    where = rng.random(shape) < special_share
    values[where] = rng.choice(SPECIAL, int(where.sum()))
    return values


def sequential_conv(atoms, channels, weights, g: ConvGeometry, pad, out_channels):
    c1, height, width, lanes = atoms.shape
    planes = atoms.transpose(0, 3, 1, 2).reshape(c1 * lanes, height, width)[:channels].astype(np.float32)
    padded = np.full((channels, g.padded_h, g.padded_w), np.float32(pad))
    rows, cols = max(0, min(height, g.padded_h - g.pad_top)), max(0, min(width, g.padded_w - g.pad_left))
    padded[:, g.pad_top:g.pad_top + rows, g.pad_left:g.pad_left + cols] = planes[:, :rows, :cols]
    kernels, per_group, kh, kw = weights.shape
    w = weights.astype(np.float32)
    out = np.zeros((out_channels, g.out_h, g.out_w), np.float32)
    per_kernel_group = kernels // g.groups
    with np.errstate(invalid="ignore", over="ignore"):
        for group in range(g.groups):
            ks = slice(group * per_kernel_group, (group + 1) * per_kernel_group)
            acc = np.zeros((per_kernel_group, g.out_h, g.out_w), np.float32)
            for c in range(per_group):
                for ky in range(kh):
                    for kx in range(kw):
                        y0, x0 = ky * g.dilation_y, kx * g.dilation_x
                        window = padded[group * per_group + c, y0:y0 + (g.out_h - 1) * g.stride_y + 1:g.stride_y,
                                        x0:x0 + (g.out_w - 1) * g.stride_x + 1:g.stride_x]
                        acc = acc + w[ks, c, ky, kx][:, None, None] * window[None]
            out[ks] = acc
    return out


def same_bits(ours, want):
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(ours), nan) and np.array_equal(ours[~nan].view(np.uint32),
                                                                        want[~nan].view(np.uint32)))


@st.composite
def steps(draw):
    groups = draw(st.sampled_from([1, 1, 2]))
    per_group = draw(st.integers(1, 12))
    channels = groups * per_group
    kernel = draw(st.sampled_from([(1, 1), (3, 3), (1, 3), (2, 2)]))
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    geometry = ConvGeometry(kernel[0], kernel[1], draw(st.integers(1, 7)), draw(st.integers(1, 9)), stride, stride,
                            dilation, dilation, draw(st.integers(0, 2)), draw(st.integers(0, 2)), groups)
    kernels = groups * draw(st.integers(3, 24))
    out_channels = kernels + draw(st.integers(0, 9))
    height, width = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    return geometry, channels, kernels, out_channels, height, width, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=60, deadline=None)
@given(steps())
def test_every_run_equals_the_sequential_order_and_other_shapes_do_not_run(case):
    geometry, channels, kernels, out_channels, height, width, seed = case
    rng = np.random.default_rng(seed)
    per_group = channels // geometry.groups
    weight_shape = (kernels, per_group, geometry.kernel_h, geometry.kernel_w)
    feature_shape = (-(-channels // 8), height, width, 8)
    pad = float(fp16(rng, (1,), 0.1)[0])
    run = cna_fetched_fp16.prepare_fetched_fp16(feature_shape, channels, weight_shape, geometry, pad, out_channels)
    assume(run is not None)
    results = []
    for step in range(3):  # new weights and features every run, as the chain writes them
        atoms, weights = fp16(rng, feature_shape, 0.05), fp16(rng, weight_shape, 0.05)
        atoms.reshape(-1, 8)[:, channels % 8 or 8:] = np.nan  # lanes past the channels: never read
        with np.errstate(invalid="ignore", over="ignore"):
            out = run(atoms, weights)
        assert out is not None and out.shape == (out_channels, geometry.out_h, geometry.out_w)
        want = sequential_conv(atoms, channels, weights, geometry, pad, out_channels)
        assert same_bits(out, want)
        assert (out[kernels:].view(np.uint32) == 0).all()
        results.append(out)
        # weights of another shape between runs: not run (the caller's plain path), nothing changed
        other = fp16(rng, (kernels + geometry.groups,) + weight_shape[1:], 0.0)
        before = out.copy()
        assert run(atoms, other) is None and run(atoms, weights[:, :, ::-1]) is not None
        run(atoms, weights)  # (back to this run's operands)
        assert np.array_equal(out.view(np.uint32), before.view(np.uint32))
    assert all(result is results[0] for result in results)  # one array refilled (the DPU reads it at once)


def test_a_consumer_writing_into_the_result_does_not_reach_the_next_run():
    # rows past the weights' kernels are zeroed once; a consumer that wrote into them would leave its
    # values for the next run - the step's contract is that nobody does. This pins what a run rewrites.
    geometry = ConvGeometry(1, 1, 3, 3)
    run = cna_fetched_fp16.prepare_fetched_fp16((1, 3, 3, 8), 8, (8, 8, 1, 1), geometry, 0.0, 12)
    atoms, weights = np.ones((1, 3, 3, 8), np.float16), np.ones((8, 8, 1, 1), np.float16)
    out = run(atoms, weights)
    out[:8] = 5.0  # the products' rows: rewritten by the next run
    again = run(atoms, weights)
    assert again is out and (again[:8] == 8.0).all() and (again[8:] == 0).all()
