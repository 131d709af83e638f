"""The fp16 MAC kernels bit for bit against the summation order NUMERICS.md 3.3 documents: each output
starts at +0 and adds its products in (input channel, ky, kx) order, one fp32 rounding per add (every
fp16 x fp16 product is exact in fp32) - the vendor simulator's order - on both paths:

- direct path (few kernels per group: depthwise), reference: window by window;
- gemm path (``gemm_fp32_seq``'s products), reference: the im2col matrix times the weights one
  reduction row k at a time, however long the reduction (no chunks).

The references below gather the windows themselves with numpy slicing (tests/emulator/reference) and
never call the emulator's kernels.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import ConvGeometry, conv2d_fp16
from tests.emulator.reference import convolution as ref
from tests.emulator.test_kernels_mac import as_dict, conv_cases

def padded_planes(x: np.ndarray, geometry: ConvGeometry, pad_value: float) -> np.ndarray:
    return ref.padded_input(x.astype(np.float32), geometry.pad_top, geometry.pad_left, geometry.padded_h,
                            geometry.padded_w, np.float32(pad_value), np.float32)


def direct_reference(padded: np.ndarray, w: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
    kernels, group_inputs, kh, kw = w.shape
    per_group = kernels // geometry.groups
    acc = np.zeros((kernels, geometry.out_h, geometry.out_w), np.float32)
    for o in range(kernels):
        for ci in range(group_inputs):
            c = (o // per_group) * group_inputs + ci
            for ky in range(kh):
                for kx in range(kw):
                    window = ref.window(padded[c:c + 1], ky, kx, as_dict(geometry))[0]
                    with np.errstate(invalid="ignore"):  # inf x 0, inf - inf: NaN as the kernel gives
                        acc[o] = acc[o] + np.float32(w[o, ci, ky, kx]) * window  # product exact, one rounding
    return acc


def columns(padded: np.ndarray, channel0: int, group_inputs: int, kh: int, kw: int,
            geometry: ConvGeometry) -> np.ndarray:
    """[group_inputs * kh * kw][OH * OW]: the windows in (c, ky, kx) order."""
    rows = [ref.window(padded[channel0 + ci:channel0 + ci + 1], ky, kx, as_dict(geometry))[0].reshape(-1)
            for ci in range(group_inputs) for ky in range(kh) for kx in range(kw)]
    return np.ascontiguousarray(np.stack(rows))


def gemm_reference(padded: np.ndarray, w: np.ndarray, geometry: ConvGeometry) -> np.ndarray:
    kernels, group_inputs, kh, kw = w.shape
    per_group = kernels // geometry.groups
    out = []
    for g in range(geometry.groups):
        matrix = w[g * per_group:(g + 1) * per_group].reshape(per_group, -1).astype(np.float32)
        gathered = columns(padded, g * group_inputs, group_inputs, kh, kw, geometry)
        acc = np.zeros((per_group, gathered.shape[1]), np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            for k in range(matrix.shape[1]):  # each product exact in float32, one rounding an add
                acc = acc + matrix[:, k:k + 1] * gathered[k]
        out.append(acc)
    return np.concatenate(out).reshape(kernels, geometry.out_h, geometry.out_w)


def same_bits_or_both_nan(ours: np.ndarray, theirs: np.ndarray) -> bool:
    nan = np.isnan(theirs)
    return bool(np.array_equal(np.isnan(ours), nan)
                and np.array_equal(ours[~nan].view(np.uint32), theirs[~nan].view(np.uint32)))


def with_special_values(x: np.ndarray, seed: int) -> np.ndarray:
    """Some inputs replaced by -0, +-inf, NaN and subnormals (the bits must still agree)."""
    rng = np.random.default_rng(seed)
    special = np.array([-0.0, 0.0, np.inf, -np.inf, np.nan, 2.0**-24, -(2.0**-20), 65504], np.float16)
    flat = x.copy().reshape(-1)
    where = rng.random(flat.size) < 0.1
    flat[where] = rng.choice(special, int(where.sum()))
    return flat.reshape(x.shape)


@settings(max_examples=60, deadline=None)
@given(conv_cases(values="fp16"), st.sampled_from(["gemm", "direct"]), st.booleans(), st.integers(0, 2**31))
def test_fp16_convolution_bits_follow_the_documented_order(case, method, special, seed):
    x, w, geometry, _, pad_value = case
    if special:
        x = with_special_values(x, seed)
    padded = padded_planes(x, geometry, pad_value)
    with np.errstate(invalid="ignore"):  # inf x 0 in the products
        got = conv2d_fp16(padded, w, geometry, method)
    expected = direct_reference(padded, w, geometry) if method == "direct" else gemm_reference(padded, w, geometry)
    assert same_bits_or_both_nan(got, expected)


@settings(max_examples=6, deadline=None)
@given(st.integers(1025, 2100), st.integers(1, 3), st.integers(0, 2**31), st.booleans())
def test_long_reductions_add_in_order(channels, kernel, seed, read_only):
    # reductions past the 1024 of the earlier chunked order and past the kernel's reduction blocks:
    # still k after k (values spread over many binades so that the order shows in the bits)
    rng = np.random.default_rng(seed)
    channels = channels // (kernel * kernel) + 1
    x = (rng.standard_normal((channels, 5, 4)) * np.exp2(rng.integers(-8, 8, (channels, 1, 1)))).astype(np.float16)
    w = (rng.standard_normal((9, channels, kernel, kernel)) * 4).astype(np.float16)
    w.flags.writeable = not read_only  # read-only weights take the memoised packed weights
    geometry = ConvGeometry(kernel, kernel, 6 - kernel, 5 - kernel, pad_top=1, pad_left=1)
    padded = padded_planes(x, geometry, 0.25)
    for _ in range(2):  # the second run reads the memoised packed weights
        got = conv2d_fp16(padded, w, geometry, "gemm")
        assert np.array_equal(got.view(np.uint32), gemm_reference(padded, w, geometry).view(np.uint32))


def test_all_negative_zero_products_sum_to_positive_zero():
    # 0 + (-0) = +0: an output whose products are all -0 is +0 on both paths (NUMERICS.md 3.3's
    # accumulators start at +0), also past a reduction block of the gemm kernel
    geometry = ConvGeometry(3, 3, 4, 4, pad_top=1, pad_left=1)
    for channels, kernels in ((2, 2), (2, 40), (130, 3)):
        padded = padded_planes(np.zeros((channels, 4, 4), np.float16), geometry, 0.0)
        w = -np.ones((kernels, channels, 3, 3), np.float16)
        for method in ("gemm", "direct"):
            got = conv2d_fp16(padded, w, geometry, method)
            assert not np.signbit(got).any()
