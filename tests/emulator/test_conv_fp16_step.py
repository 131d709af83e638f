"""The fp16 CNA step's compiled half in one call (kernels/conv_fp16_step.py, units/cna_core.py
``_fused_fp16`` / ``_fused_run``; issue 20, fixed cost per task).

Against the vendor order written in the tests (test_review_s17_fetched_fp16's ``sequential_conv``: +0
then one product added a step in (c, ky, kx) order, each add rounded to float32) and against the plain
kernel calls the step made before (``fetch_padded_input`` + ``conv2d_fp16``), bit for bit (NaN as
NaN): the feature copied from rows of a region at their offsets with the lanes past the real channels
zeroed, held weights, weights gathered from the region every run (then widened and packed), the narrow
and tile forms, strides, dilation, padding, the wide result, zero rows past the kernels; new bytes on
every run, NaN sums canonical (0x7FC00000); 1-4 kernels through the pointwise or direct loop
(``few_step``). The Cbuf bookkeeping of the one-call step equals ``_cna_step``'s from five starting states.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import conv_fp16_step, depthwise_fp16_rows, gemm_fp32_seq, mac, pointwise_fp16
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.units import cna_core
from tests.emulator.test_fixed_cost_steps import _key, _state
from tests.emulator.test_review_s17_fetched_fp16 import fp16, same_bits, sequential_conv

pytestmark = pytest.mark.skipif(not depthwise_fp16_rows.available() or gemm_fp32_seq._PLAIN,
                                reason="the one-call step needs F16C in Numba's target and the tile kernel")


@st.composite
def convs(draw, depthwise: bool = False, few: bool = False):
    """A conv case; ``few``: 1-4 kernels (the pointwise or direct loop), half of them 1x1 at stride 1
    without padding (``pointwise_fp16.takes``), strides and dilations drawn apart across and down."""
    kernel = draw(st.sampled_from([(1, 1), (3, 3), (1, 3), (2, 2), (5, 5)]))
    stride, dilation = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pad_top, pad_left = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    stride_x, dilation_x = (draw(st.integers(1, 3)), draw(st.integers(1, 3))) if few else (stride, dilation)
    if few and draw(st.booleans()):
        kernel, stride, stride_x, pad_top, pad_left = (1, 1), 1, 1, 0, 0
    height, width = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    reach_h, reach_w = (kernel[0] - 1) * dilation + 1, (kernel[1] - 1) * dilation_x + 1
    # output sizes up to what the padded input allows (and a little past the input: pad value reads)
    out_h = max(1, min(draw(st.integers(1, 8)), (height + 2 * pad_top - reach_h) // stride + 1))
    out_w = max(1, min(draw(st.integers(1, 10)), (width + 2 * pad_left - reach_w) // stride_x + 1))
    geometry_groups = 1
    channels = draw(st.integers(1, 24))
    if depthwise:
        geometry_groups = channels
    geometry = ConvGeometry(kernel[0], kernel[1], out_h, out_w, stride, stride_x, dilation, dilation_x, pad_top,
                            pad_left, geometry_groups)
    c1 = -(-channels // 8) + draw(st.integers(0, 1))  # (an atom group past the channels: masked, never read)
    real = draw(st.integers(1, c1 * 8))  # (DATAIN_CHANNEL_REAL: lanes from it on read 0, below the channels too)
    kernels = channels if depthwise else draw(st.integers(1, 4) if few else st.integers(5, 24))
    return geometry, channels, real, c1, height, width, kernels, kernels + draw(st.integers(0, 9)), \
        draw(st.integers(0, 2**32 - 1))


def _region(rng, c1: int, height: int, width: int):
    """A region's bytes holding the feature's rows ([C1][H] rows of W atoms) at scattered offsets."""
    row_bytes, count = width * 16, c1 * height
    gaps = rng.integers(0, 3, count) * 2
    offsets = np.cumsum(np.concatenate([[int(rng.integers(0, 5)) * 2], row_bytes + gaps[:-1]])).astype(np.int64)
    data = np.zeros(int(offsets[-1]) + row_bytes + int(rng.integers(0, 9)) * 2, np.uint8)
    return data, offsets, row_bytes


def _fill(rng, data, offsets, row_bytes, shape, channels):
    """New feature bytes in the region's rows; the atoms they hold (lanes past the channels NaN)."""
    atoms = fp16(rng, shape, 0.05)
    for group in range(shape[0]):
        atoms[group, :, :, max(0, channels - group * 8):] = np.nan
    rows = atoms.view(np.uint8).reshape(len(offsets), row_bytes)
    for row, offset in zip(rows, offsets):
        data[offset:offset + row_bytes] = row
    return atoms


def _masked(atoms, real):
    out = atoms.copy()
    flat = out.reshape(out.shape[0], -1, 8)
    for group in range(out.shape[0]):
        flat[group, :, max(0, min(8, real - group * 8)):] = 0
    return out


def _plain(atoms, channels, weights, geometry, pad, out_channels):
    padded = mac.fetch_padded_input(atoms, channels, geometry, pad)
    return cna_core._pad_channels(mac.conv2d_fp16(padded, weights, geometry), out_channels)


def _step_buffers(c1, height, width, data, offsets, row_bytes, real):
    buffer = np.empty((c1, height, width, 8), np.float16)
    group, lane = divmod(real, 8) if real < c1 * 8 else (c1, 0)
    return buffer, (data, offsets, buffer.view(np.uint8).reshape(c1 * height, row_bytes), buffer.view(np.uint16),
                    group, lane)


def _check_runs(rng, run, case, weights_for_run, pad):
    geometry, channels, real, c1, height, width, kernels, out_channels, _ = case
    data, offsets, row_bytes = run.region
    results = []
    for _ in range(3):  # new feature bytes (and weights) every run: nothing kept from the last one
        atoms = _masked(_fill(rng, data, offsets, row_bytes, (c1, height, width, 8), channels), real)
        weights = weights_for_run()
        with np.errstate(invalid="ignore", over="ignore"):
            got = run().copy()
            want = sequential_conv(atoms, channels, weights, geometry, pad, out_channels)
            plain = _plain(atoms, channels, weights, geometry, pad, out_channels)
        assert got.shape == (out_channels, geometry.out_h, geometry.out_w)
        assert same_bits(got, want) and same_bits(got, plain)
        assert (got.view(np.uint32)[np.isnan(got)] == 0x7FC00000).all()  # (NaN sums canonical: NUMERICS 3.3)
        assert (got[kernels:].view(np.uint32) == 0).all()
        results.append(run())
    assert all(result is results[0] for result in results)  # (the step's own array, refilled)


def _held_setup(case, weight_channels: int):
    """(rng, the region (data, offsets, row bytes), the step's rows, read-only held weights of
    ``weight_channels`` channels, the pad value) of a case whose step holds its weights."""
    geometry, _, real, c1, height, width, kernels, _, seed = case
    rng = np.random.default_rng(seed)
    data, offsets, row_bytes = _region(rng, c1, height, width)
    _, rows = _step_buffers(c1, height, width, data, offsets, row_bytes, real)
    weights = fp16(rng, (kernels, weight_channels, geometry.kernel_h, geometry.kernel_w), 0.05)
    weights.flags.writeable = False
    pad = float(fp16(rng, (1,), 0.2)[0])
    return rng, (data, offsets, row_bytes), rows, weights, pad


@settings(max_examples=120, deadline=None)
@given(convs())
def test_held_weights_equal_the_sequential_order_and_the_plain_calls(case):
    geometry, channels, _, c1, height, width, _, out_channels, _ = case
    rng, (data, offsets, row_bytes), rows, weights, pad = _held_setup(case, channels)
    run = conv_fp16_step.prepare_gemm_step((c1, height, width, 8), channels, weights, geometry, pad, out_channels, rows)
    assume(run is not None)  # (1x1 kernels at a stride: the im2col form, not taken)
    run.region = (data, offsets, row_bytes)
    _check_runs(rng, run, case, lambda: weights, pad)


@settings(max_examples=120, deadline=None)
@given(convs())
def test_weights_fetched_every_run_equal_the_sequential_order(case):
    geometry, channels, real, c1, height, width, kernels, out_channels, seed = case
    rng = np.random.default_rng(seed)
    data, offsets, row_bytes = _region(rng, c1, height, width)
    _, rows = _step_buffers(c1, height, width, data, offsets, row_bytes, real)
    weight_shape = (kernels, channels, geometry.kernel_h, geometry.kernel_w)
    words = np.zeros(int(np.prod(weight_shape)) + int(rng.integers(0, 40)), np.uint16)
    index = rng.permutation(words.size)[:int(np.prod(weight_shape))].reshape(weight_shape).astype(np.int64)
    gathered = np.empty(weight_shape, np.uint16)
    pad = float(fp16(rng, (1,), 0.2)[0])
    run = conv_fp16_step.prepare_gemm_step((c1, height, width, 8), channels, gathered.view(np.float16), geometry, pad,
                                           out_channels, rows, (words, index, gathered))
    assume(run is not None)
    run.region = (data, offsets, row_bytes)

    def new_weights():  # (the chain writes the operand's bytes before each run)
        words[:] = fp16(rng, words.shape, 0.05).view(np.uint16)
        return words[index].view(np.float16)

    _check_runs(rng, run, case, new_weights, pad)
    assert np.array_equal(gathered, words[index])  # (the step's array: what the Cbuf holds)


@settings(max_examples=80, deadline=None)
@given(convs(depthwise=True))
def test_depthwise_equals_the_sequential_order_and_the_plain_calls(case):
    geometry, channels, _, c1, height, width, _, out_channels, _ = case
    rng, (data, offsets, row_bytes), rows, weights, pad = _held_setup(case, 1)
    run = conv_fp16_step.prepare_depthwise_step((c1, height, width, 8), channels, weights, geometry, pad,
                                                out_channels, rows)
    assert run is not None
    run.region = (data, offsets, row_bytes)
    _check_runs(rng, run, case, lambda: weights, pad)


@settings(max_examples=120, deadline=None)
@given(convs(few=True))
def test_a_few_kernels_equal_the_sequential_order_and_the_plain_calls(case):
    geometry, channels, _, c1, height, width, _, out_channels, _ = case
    rng, (data, offsets, row_bytes), rows, weights, pad = _held_setup(case, channels)
    shape = (c1, height, width, 8)
    assert conv_fp16_step.prepare_gemm_step(shape, channels, weights, geometry, pad, out_channels, rows) is None
    run = conv_fp16_step.prepare_few_step(shape, channels, weights, geometry, pad, out_channels, rows)
    assert run is not None
    pointwise = pointwise_fp16.takes(shape, channels, weights.shape, geometry)
    assert run.arguments[4][conv_fp16_step.POINTWISE] == pointwise  # (the plan's choice of form)
    run.region = (data, offsets, row_bytes)
    _check_runs(rng, run, case, lambda: weights, pad)


def test_a_few_kernels_take_both_forms_and_leave_the_rest():
    rows = (np.zeros(64, np.uint8), np.array([0, 32]), np.zeros((2, 32), np.uint8), np.zeros((1, 2, 2, 8), np.uint16),
            1, 0)
    weights = np.ones((3, 8, 1, 1), np.float16)
    weights.flags.writeable = False
    shape, plain = (1, 2, 2, 8), ConvGeometry(1, 1, 2, 2)
    run = conv_fp16_step.prepare_few_step(shape, 8, weights, plain, 0.0, 16, rows)
    assert run.arguments[4][conv_fp16_step.POINTWISE] == 1
    padded = ConvGeometry(1, 1, 2, 2, pad_top=1)  # (padding: the direct loop over padded planes)
    assert conv_fp16_step.prepare_few_step(shape, 8, weights, padded, 0.0, 16, rows).arguments[4][
        conv_fp16_step.POINTWISE] == 0
    many = np.ones((5, 8, 1, 1), np.float16)
    many.flags.writeable = False
    assert conv_fp16_step.prepare_few_step(shape, 8, many, plain, 0.0, 16, rows) is None  # (the products)
    assert conv_fp16_step.prepare_few_step(shape, 8, weights, plain, 0.0, 2, rows) is None  # (> out channels)
    big = ConvGeometry(3, 3, 200, 200, pad_top=1, pad_left=1)
    wide = np.ones((3, 8, 3, 3), np.float16)
    wide.flags.writeable = False
    assert conv_fp16_step.prepare_few_step((1, 200, 200, 8), 8, wide, big, 0.0, 16, rows) is None  # (OWN_BYTES)
    writeable = np.ones((3, 8, 1, 1), np.float16)
    assert conv_fp16_step.prepare_few_step(shape, 8, writeable, plain, 0.0, 16, rows) is None


def test_pack_index_places_every_element_where_pack_does():
    rng = np.random.default_rng(5)
    for rows, reduction, narrow in [(7, 3, False), (13, 300, False), (40, 600, False), (5, 9, True), (33, 20, True)]:
        matrix = rng.standard_normal((rows, reduction)).astype(np.float32)
        order = conv_fp16_step.pack_index(rows, reduction, narrow)
        packed = gemm_fp32_seq.pack(matrix, narrow).reshape(-1)
        flat = np.append(matrix.reshape(-1), np.float32(0))  # (-1: a zero of the packing)
        assert np.array_equal(flat[order], packed)


def test_forms_not_taken():
    geometry = ConvGeometry(1, 1, 2, 2)
    weights = np.ones((8, 8, 1, 1), np.float16)
    rows = (np.zeros(64, np.uint8), np.array([0, 32]), np.zeros((2, 32), np.uint8), np.zeros((1, 2, 2, 8), np.uint16),
            1, 0)
    assert conv_fp16_step.prepare_gemm_step((1, 2, 2, 8), 8, weights, geometry, 0.0, 8, rows) is None  # writeable
    weights.flags.writeable = False
    assert conv_fp16_step.prepare_gemm_step((1, 2, 2, 8), 8, weights, geometry, 0.0, 8, rows) is not None
    assert conv_fp16_step.prepare_gemm_step((1, 2, 2, 8), 8, weights[:4], geometry, 0.0, 8, rows) is None  # direct
    assert conv_fp16_step.prepare_gemm_step((1, 2, 2, 8), 8, weights, geometry, 0.0, 6, rows) is None  # > out
    strided = ConvGeometry(1, 1, 1, 1, 2, 2)  # (1x1 at a stride: im2col columns)
    assert conv_fp16_step.prepare_gemm_step((1, 2, 2, 8), 8, weights, strided, 0.0, 8, rows) is None
    big = ConvGeometry(1, 1, 200, 200)
    assert conv_fp16_step.prepare_gemm_step((1, 200, 200, 8), 8, weights, big, 0.0, 8, rows) is None  # OWN_BYTES


# ---------------------------------------------------------------------------------------------
# the Cbuf's bookkeeping of the one-call step
# ---------------------------------------------------------------------------------------------
def _forms(weight_key: tuple, weights: np.ndarray):
    """A step's two forms around fake kernels: ``_cna_step``'s load + keep_weights + kernel, and
    ``_fused_run`` (the bookkeeping inline, one call)."""
    feature = np.zeros((1, 2, 2, 8), np.float16)
    plan = SimpleNamespace(weight_key=weight_key, feature_key=_key(0x100, "1/11"))
    rows = (np.arange(64, dtype=np.uint8), np.array([0, 32]), feature.view(np.uint8).reshape(2, 32), (),
            cna_core._Resident(plan.feature_key, feature, "t"), cna_core._feature_keeper(plan.feature_key, "t"))
    load = lambda cbuf: (rows[5](cbuf, rows[4]), feature)[1]  # noqa: E731 (the loader's keep, then the array)
    load.buffer, load.rows = feature, rows
    seen = []
    kernel = lambda f, w: seen.append(1) or cna_core.CoreResult(f, None)  # noqa: E731
    kernel.prepare = lambda w: None
    fused = SimpleNamespace(kernel=lambda *a: seen.append(2), arguments=(), result=feature)
    two = cna_core._cna_step(plan, "t", load, kernel, weights, None)
    one = cna_core._cna_step(plan, "t", load, kernel, weights, None, fused)
    return two, one, seen


@pytest.mark.parametrize("before", ["empty", "same", "covered", "beside", "older"])
def test_the_one_call_step_keeps_the_cbuf_as_the_plain_step_does(before):
    key, states = _key(0x1000, "1/11"), {1: [], 2: []}
    for form in (1, 2):
        weights, other, third = np.zeros(4096, np.int8), np.zeros(4096, np.int8), np.zeros(4096, np.int8)
        weights.flags.writeable = False
        two, one, seen = _forms(key, weights)
        step = two if form == 1 else one
        names = {id(weights): "w", id(other): "o", id(third): "t"}
        cbuf = cna_core.Cbuf()
        if before == "same":
            step(cbuf)
        elif before == "covered":  # weights in the banks this step's fill
            cbuf.keep("weights", _key(0x2000, "1/11"), other, "x")
        elif before == "beside":  # weights in other banks: kept beside as an older set
            cbuf.keep("weights", _key(0x2000, "4/8"), other, "x")
        elif before == "older":
            cbuf.keep("weights", _key(0x2000, "4/8"), other, "x")
            cbuf.keep("weights", _key(0x3000, "1/11"), third, "x")
        for _ in range(3):
            step(cbuf)
            names[id(cbuf.feature.array)] = "f"
            states[form].append(_state(cbuf, names))
        assert set(seen) == {form}  # (each form ran its own kernel)
    assert states[1] == states[2]
    assert states[1][-1][1][:2] == (key, "w")


# ---------------------------------------------------------------------------------------------
# in a model: the MatMul of two activations (test_task_plans_fp16's), new inputs every run
# ---------------------------------------------------------------------------------------------
def _counted_fused(monkeypatch, stale: bool = False) -> list:
    """Count the one-call steps' runs; ``stale``: a broken variant that runs each step's call only
    once (its feature, weights and products then stay the first run's)."""
    calls, inner = [], cna_core.prepare_gemm_step

    def prepare(*args):
        run = inner(*args)
        if run is None:
            return None
        kernel, mine = run.kernel, []

        def counted(*arguments):
            calls.append(args[-1] is not None if len(args) > 7 else False)  # (fetched weights?)
            if stale and mine:
                return
            mine.append(1)
            kernel(*arguments)
        run.kernel = counted
        return run

    monkeypatch.setattr(cna_core, "prepare_gemm_step", prepare)
    return calls


def test_a_model_whose_weights_change_every_run_equals_the_full_path(monkeypatch, tmp_path):
    from tests.emulator.test_task_plans_fp16 import _compare, _mismatches, _weights_dropped_at_build

    _weights_dropped_at_build(monkeypatch)
    calls = _counted_fused(monkeypatch)
    outputs, _ = _compare(tmp_path, "matmul", seed=11)
    assert _mismatches(outputs) == 0
    assert sum(calls) >= 3  # (the fetched weights' steps ran in one call)


def test_the_checks_catch_a_step_that_runs_its_call_once(monkeypatch, tmp_path):
    from tests.emulator.test_task_plans_fp16 import _compare, _mismatches, _weights_dropped_at_build

    _weights_dropped_at_build(monkeypatch)
    calls = _counted_fused(monkeypatch, stale=True)
    outputs, _ = _compare(tmp_path, "matmul", seed=11)
    assert sum(calls) >= 3 and _mismatches(outputs) > 0
