"""fp16 convolutions reduced over the channels below DATAIN_CHANNEL_REAL (units/cna_core.py
``_real_reduction``) and the fp16 feature copy with its lane masking in one call
(kernels/conv_fp16_step.py ``feature_copier``, ``_mask_group``); issue 20, session 19.

A task that loads its own feature reads 0 in the lanes from DATAIN_CHANNEL_REAL on; with a zero pad value
and finite weights on those channels each of their products is a signed zero, which leaves a sum begun at
+0 as it was. The prepared kernels given the reduced operands must equal, bit for bit (NaN as NaN), the
sequential order over every channel written in the tests (test_review_s17_fetched_fp16's
``sequential_conv``) on the masked atoms - features and weights with -0, infinities, subnormals and NaN;
pads +0 and -0 (reduced), or another value, or an infinite / NaN weight on a masked channel (not reduced).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import conv_fp16_step, depthwise_fp16_rows, gemm_fp32_seq
from npuemu.emulator.kernels.conv_fp16_plan import prepare_conv2d_fp16
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.units import cna_core
from tests.emulator.test_review_s17_fetched_fp16 import fp16, same_bits, sequential_conv

pytestmark = pytest.mark.skipif(not depthwise_fp16_rows.available() or gemm_fp32_seq._PLAIN,
                                reason="the one-call step needs F16C in Numba's target and the tile kernel")


def _masked(atoms: np.ndarray, real: int) -> np.ndarray:
    """The atoms with every lane from ``real`` on 0 (written here: lane index per element)."""
    out = atoms.copy()
    lanes = np.arange(out.shape[0])[:, None, None, None] * out.shape[3] + np.arange(out.shape[3])
    out[np.broadcast_to(lanes >= real, out.shape)] = 0
    return out


def _region(rng, atoms: np.ndarray):
    """A region holding the atoms' rows ([C1][H] rows of W atoms) at scattered offsets."""
    row_bytes, count = atoms.shape[2] * 16, atoms.shape[0] * atoms.shape[1]
    offsets = np.cumsum(np.concatenate([[2 * int(rng.integers(0, 5))], row_bytes + 2 * rng.integers(0, 3, count - 1)]))
    data = np.zeros(int(offsets[-1]) + row_bytes + 6, np.uint8)
    for row, offset in zip(atoms.view(np.uint8).reshape(count, row_bytes), offsets):
        data[offset:offset + row_bytes] = row
    return data, offsets.astype(np.int64), row_bytes


@st.composite
def cases(draw):
    kernel = draw(st.sampled_from([(1, 1), (3, 3), (2, 2), (1, 3)]))
    stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, 1))
    height, width = draw(st.integers(1, 9)), draw(st.integers(1, 11))
    out_h = max(1, min(draw(st.integers(1, 6)), (height + 2 * pad - kernel[0]) // stride + 1))
    out_w = max(1, min(draw(st.integers(1, 8)), (width + 2 * pad - kernel[1]) // stride + 1))
    geometry = ConvGeometry(kernel[0], kernel[1], out_h, out_w, stride, stride, pad_top=pad, pad_left=pad)
    c1 = draw(st.integers(1, 2))
    channels = draw(st.integers(2, c1 * 8))
    real = draw(st.integers(1, channels - 1))
    kernels = draw(st.sampled_from([draw(st.integers(1, 4)), draw(st.integers(5, 20))]))
    pad_value = draw(st.sampled_from([0.0, -0.0, 0.0, 1.5]))
    poison = draw(st.sampled_from([None, None, np.inf, -np.inf, np.nan]))  # a masked channel's weight
    return geometry, (c1, height, width, 8), channels, real, kernels, kernels + draw(st.integers(0, 5)), pad_value, \
        poison, draw(st.integers(0, 2**32 - 1))


def _state(channels, real, pad_value, data_reuse=False, depthwise=False, argb=0):
    state = SimpleNamespace(real_channels=real, in_channels=channels, data_reuse=data_reuse, depthwise=depthwise,
                            argb_channels=argb, pad_value=pad_value)
    return state, SimpleNamespace(mask_channels=True)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_the_reduced_products_equal_the_order_over_every_channel(case):
    geometry, shape, channels, real, kernels, out_channels, pad_value, poison, seed = case
    rng = np.random.default_rng(seed)
    atoms = fp16(rng, shape, 0.05)
    atoms[np.broadcast_to(np.arange(shape[0])[:, None, None, None] * 8 + np.arange(8) >= real, shape)] = np.nan  # (junk)
    weights = fp16(rng, (kernels, channels, geometry.kernel_h, geometry.kernel_w), 0.05)
    masked_weights = weights[:, real:]
    masked_weights[np.isnan(masked_weights) | np.isinf(masked_weights)] = -0.0  # (finite unless poisoned)
    if poison is not None:
        weights[tuple(int(rng.integers(low, high)) for low, high in zip((0, real, 0, 0), weights.shape))] = poison
    weights.flags.writeable = False
    reduce = cna_core._real_reduction(*_state(channels, real, pad_value))
    reduced, kept = reduce(weights)
    assert reduced == (real if pad_value == 0 and poison is None else channels)
    assert not kept.flags.writeable and (kept is weights or np.array_equal(kept.view(np.uint16),
                                                                           weights[:, :real].view(np.uint16)))
    masked = _masked(atoms, real)
    with np.errstate(invalid="ignore", over="ignore"):
        want = sequential_conv(masked, channels, weights.astype(np.float16), geometry, pad_value, out_channels)
        plan = prepare_conv2d_fp16(shape, reduced, kept, geometry, pad_value, out_channels)
        assert same_bits(plan(masked), want)
        data, offsets, row_bytes = _region(rng, atoms)  # (the one-call step: its own copy and masking)
        buffer = np.empty(shape, np.float16)
        rows = (data, offsets, buffer.view(np.uint8).reshape(-1, row_bytes), buffer.view(np.uint16), *divmod(real, 8))
        step = conv_fp16_step.prepare_gemm_step(shape, reduced, kept, geometry, pad_value, out_channels, rows) or \
            conv_fp16_step.prepare_few_step(shape, reduced, kept, geometry, pad_value, out_channels, rows)
        assume(step is not None)  # (a 1x1 kernel at a stride: the im2col form, not taken)
        assert same_bits(step(), want)


def test_steps_that_do_not_load_their_own_masked_feature_keep_every_channel():
    weights = np.ones((8, 8, 3, 3), np.float16)
    weights.flags.writeable = False
    for state in (_state(8, 3, 0.0, data_reuse=True), _state(8, 3, 0.0, depthwise=True), _state(8, 3, 0.0, argb=3),
                  _state(8, 8, 0.0), _state(8, 3, np.nan)):
        assert cna_core._real_reduction(*state)(weights) == (8, weights)
    assert cna_core._real_reduction(*_state(8, 3, 0.0))(weights.copy())[0] == 8  # (writeable: may change)
    assert cna_core._real_reduction(*_state(8, 3, 0.0))(weights)[0] == 3


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 9), st.integers(0, 24), st.integers(0, 2**32 - 1))
def test_the_feature_copy_masks_the_lanes_from_the_real_channels_on(c1, height, width, real, seed):
    rng = np.random.default_rng(seed)
    real = min(real, c1 * 8)
    atoms = rng.integers(0, 1 << 16, (c1, height, width, 8)).astype(np.uint16).view(np.float16)
    data, offsets, row_bytes = _region(rng, atoms)
    buffer = np.full(atoms.shape, np.nan, np.float16)
    group, lane = divmod(real, 8) if real < c1 * 8 else (c1, 0)
    copy = conv_fp16_step.feature_copier(data, offsets, buffer.view(np.uint8).reshape(-1, row_bytes),
                                         buffer.view(np.uint16), group, lane)
    fresh = conv_fp16_step.fresh_feature_copier(data, offsets, atoms.shape, row_bytes, group, lane)
    for _ in range(2):  # (the same buffer refilled; a new array each call)
        copy()
        assert np.array_equal(buffer.view(np.uint16), _masked(atoms, real).view(np.uint16))
        first, second = fresh(), fresh()
        assert first is not second and np.array_equal(first.view(np.uint16), _masked(atoms, real).view(np.uint16))
        data[offsets[0]:offsets[0] + 2] ^= 0xFF  # (new bytes in memory: the next copy reads them)
        atoms.view(np.uint8).reshape(-1)[:2] ^= 0xFF


class _Owner:
    """A memory's stand-in (the arenas are held by weak references to their owners)."""


def test_steps_sharing_an_arena_each_equal_their_own_order_when_run_in_turn():
    """The one-call steps of one memory place their arrays in one arena (``conv_fp16_step.arena``): a step's
    result is read before the next step runs, so steps run in turn - products with phase planes and a wide
    result, depthwise, a few kernels - each equal the sequential order, and one step's run leaves another's
    result rows to it (nothing held from run to run)."""
    rng = np.random.default_rng(7)
    owner = _Owner()
    work = conv_fp16_step.arena(owner)
    assert conv_fp16_step.arena(owner) is work and conv_fp16_step.arena(_Owner()) is not work
    cases = [(ConvGeometry(3, 3, 5, 6, 2, 2, pad_top=1, pad_left=1), (2, 9, 11, 8), 12, 9, 20, 24),
             (ConvGeometry(3, 3, 4, 7, groups=16), (2, 6, 9, 8), 16, 16, 16, 16),
             (ConvGeometry(1, 3, 6, 5, pad_left=1), (1, 6, 5, 8), 5, 5, 3, 8)]
    steps = []
    for geometry, shape, channels, real, kernels, out_channels in cases:
        atoms = fp16(rng, shape, 0.05)
        depthwise = geometry.groups > 1
        weights = fp16(rng, (kernels, 1 if depthwise else channels, geometry.kernel_h, geometry.kernel_w), 0.05)
        weights.flags.writeable = False
        data, offsets, row_bytes = _region(rng, atoms)
        buffer = np.empty(shape, np.float16)
        rows = (data, offsets, buffer.view(np.uint8).reshape(-1, row_bytes), buffer.view(np.uint16),
                *(divmod(real, 8) if real < shape[0] * 8 else (shape[0], 0)))
        arguments = (shape, channels, weights, geometry, 0.5, out_channels, rows)
        step = conv_fp16_step.prepare_depthwise_step(*arguments, work) if depthwise else \
            conv_fp16_step.prepare_gemm_step(*arguments, work=work) or conv_fp16_step.prepare_few_step(*arguments, work)
        assert step is not None and np.shares_memory(step.result, work)
        with np.errstate(invalid="ignore", over="ignore"):
            want = sequential_conv(_masked(atoms, real), channels, weights, geometry, 0.5, out_channels)
        steps.append((step, want))
    for _ in range(2):
        for step, want in steps:
            step.result[...] = np.nan  # (what another step's run may have left there)
            assert same_bits(step(), want)
