"""Fixed cost per task (issue 20, session 17): what a step works out once must never outlive what
it was worked out from.

- fp16 CNA steps whose weights the chain writes every run (units/cna_fetched_fp16.py): the products'
  layout and buffers are prepared once, the weights gathered and widened each run; the result
  equals ``fetch_padded_input`` + ``conv2d_fp16`` (+ zero rows) bit for bit, for new weights and
  features on every call, and a whole model equals the full path with new inputs every run.
- the derived cache's pending entries join its index after enough writes were checked against
  them (emulator/memory.py ``_PENDING_SCANS_MAX``): the entries kept stay exactly a plain list's.
- an int8 CNA + CORE -> DPU step in one frame (units/cna_core.py ``_direct_rows``): the Cbuf's
  slots and older weight sets after each step are those of the two-call form, whatever they held.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.emulator import memory
from npuemu.emulator.kernels import cbuf_reuse
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.units import cna_core, cna_fetched_fp16
from tests.emulator.test_derived_cache_index import OPS, _check
from tests.emulator.test_task_plans_fp16 import _compare, _mismatches, _weights_dropped_at_build


# ---------------------------------------------------------------------------------------------
# fetched fp16 products
# ---------------------------------------------------------------------------------------------
def _reference(atoms: np.ndarray, channels: int, weights: np.ndarray, geometry: ConvGeometry,
               pad: float, out_channels: int) -> np.ndarray:
    """The convolution in float64 from the atoms (written here, not through the kernels): exact for
    these small operands up to the float32 rounding of the sums (checked with a tolerance)."""
    c1, height, width, c2 = atoms.shape
    planes = atoms.transpose(0, 3, 1, 2).reshape(c1 * c2, height, width)[:channels].astype(np.float64)
    padded = np.full((channels, geometry.padded_h, geometry.padded_w), np.float64(np.float32(pad)))
    rows, cols = min(height, geometry.padded_h - geometry.pad_top), min(width, geometry.padded_w - geometry.pad_left)
    padded[:, geometry.pad_top:geometry.pad_top + rows, geometry.pad_left:geometry.pad_left + cols] = \
        planes[:, :rows, :cols]
    kernels, _, kh, kw = weights.shape
    out = np.zeros((out_channels, geometry.out_h, geometry.out_w))
    w = weights.astype(np.float64)
    for oy in range(geometry.out_h):
        for ox in range(geometry.out_w):
            y, x = oy * geometry.stride_y, ox * geometry.stride_x
            window = padded[:, y:y + kh, x:x + kw]
            out[:kernels, oy, ox] = np.tensordot(w, window, axes=([1, 2, 3], [0, 1, 2]))
    return out


def _plain(atoms, channels, weights, geometry, pad, out_channels):
    """What the step ran before: the plain kernel calls (units/cna_core.py ``_fp16_kernel``)."""
    padded = cna_core.kernels.fetch_padded_input(atoms, channels, geometry, pad)
    return cna_core._pad_channels(cna_core.kernels.conv2d_fp16(padded, weights, geometry), out_channels)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(1, 9), st.sampled_from([1, 3]), st.integers(1, 2),
       st.integers(0, 1), st.integers(5, 40), st.integers(0, 8), st.integers(0, 2**31 - 1))
def test_fetched_products_equal_the_plain_calls(c1, height, width, kernel, stride, pad, kernels, extra, seed):
    c2, rng = 8, np.random.default_rng(seed)
    channels = int(rng.integers(1, c1 * c2 + 1))
    pad_top = pad_left = pad if kernel > 1 else 0
    out_h = (height + 2 * pad_top - kernel) // stride + 1
    out_w = (width + 2 * pad_left - kernel) // stride + 1
    if out_h < 1 or out_w < 1:
        return
    geometry = ConvGeometry(kernel, kernel, out_h, out_w, stride, stride, pad_top=pad_top, pad_left=pad_left)
    shape, weight_shape, out_channels = (c1, height, width, c2), (kernels, channels, kernel, kernel), kernels + extra
    run = cna_fetched_fp16.prepare_fetched_fp16(shape, channels, weight_shape, geometry, -0.5, out_channels)
    assert run is not None  # (more than 4 kernels: the GEMM form)
    for _ in range(3):  # new weights and features on every call: nothing kept from the last one
        atoms = rng.normal(0, 1, shape).astype(np.float16)
        weights = rng.normal(0, 0.5, weight_shape).astype(np.float16)
        got = run(atoms, weights).copy()
        want = _plain(atoms, channels, weights, geometry, -0.5, out_channels)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
        np.testing.assert_allclose(got, _reference(atoms, channels, weights, geometry, -0.5, out_channels),
                                   rtol=1e-5, atol=1e-4)


def test_long_reductions_and_odd_operands_equal_the_plain_calls():
    """A reduction over several of the sequential GEMM's reduction blocks (the partial sums carried
    on), and NaN / inf / -0 weights, through the same calls."""
    rng = np.random.default_rng(4)
    channels = 1024 + 24
    c1 = -(-channels // 8)
    geometry = ConvGeometry(1, 1, 3, 5)
    run = cna_fetched_fp16.prepare_fetched_fp16((c1, 3, 5, 8), channels, (12, channels, 1, 1), geometry, 0.0, 16)
    atoms = rng.normal(0, 1, (c1, 3, 5, 8)).astype(np.float16)
    weights = rng.normal(0, 1, (12, channels, 1, 1)).astype(np.float16)
    weights.reshape(-1)[:3] = [np.nan, np.inf, -0.0]
    want = _plain(atoms, channels, weights, geometry, 0.0, 16)
    assert np.array_equal(run(atoms, weights).view(np.uint32), want.view(np.uint32))


def test_operands_of_other_shapes_take_the_plain_calls():
    geometry = ConvGeometry(1, 1, 2, 2)
    run = cna_fetched_fp16.prepare_fetched_fp16((1, 2, 2, 8), 8, (8, 8, 1, 1), geometry, 0.0, 8)
    atoms = np.ones((1, 2, 2, 8), np.float16)
    assert run(atoms, np.ones((8, 8, 1, 1), np.float16)) is not None
    assert run(atoms, np.ones((9, 8, 1, 1), np.float16)) is None
    assert run(atoms, np.ones((8, 8, 1, 1), np.float32)) is None
    assert run(np.ones((1, 2, 3, 8), np.float16), np.ones((8, 8, 1, 1), np.float16)) is None
    # the direct loop's few kernels, or weights that do not fit the feature: not prepared
    assert cna_fetched_fp16.prepare_fetched_fp16((1, 2, 2, 8), 8, (4, 8, 1, 1), geometry, 0.0, 8) is None
    assert cna_fetched_fp16.prepare_fetched_fp16((1, 2, 2, 8), 8, (8, 6, 1, 1), geometry, 0.0, 8) is None


def _counted_convolve(monkeypatch, stale: bool = False) -> list:
    """Count the prepared products' runs; ``stale``: a broken variant that hands out its first result
    again (what a step would do if it kept its output from the inputs of an earlier run)."""
    runs, inner = [], cna_fetched_fp16.prepare_fetched_fp16

    def prepare(*args):
        run = inner(*args)
        if run is None:
            return None
        first = []

        def counted(feature, weights):
            out = run(feature, weights)
            runs.append(out is not None)
            if stale and out is not None:
                first[:] = first or [out.copy()]
                return first[0]
            return out
        return counted

    monkeypatch.setattr(cna_core, "prepare_fetched_fp16", prepare)
    # (the one-call form, kernels/conv_fp16_step.py, takes these steps where it applies: off here,
    # tests/emulator/test_conv_fp16_step.py has its own model test)
    monkeypatch.setattr(cna_core, "_fused_fp16", lambda *args: None)
    return runs


def test_a_model_whose_weights_change_every_run_equals_the_full_path(monkeypatch, tmp_path):
    """The MatMul of two activations (test_task_plans_fp16's): new inputs every run, the prepared
    products run from the second run on and every run equals the full path's."""
    _weights_dropped_at_build(monkeypatch)
    runs = _counted_convolve(monkeypatch)
    outputs, _ = _compare(tmp_path, "matmul", seed=11)
    assert _mismatches(outputs) == 0
    assert sum(runs) >= 3


def test_the_checks_catch_products_kept_from_an_earlier_run(monkeypatch, tmp_path):
    _weights_dropped_at_build(monkeypatch)
    runs = _counted_convolve(monkeypatch, stale=True)
    outputs, _ = _compare(tmp_path, "matmul", seed=11)
    assert sum(runs) >= 3 and _mismatches(outputs) > 0


# ---------------------------------------------------------------------------------------------
# the derived cache's pending entries
# ---------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(OPS, max_size=200), st.sampled_from([0, 1, 3, memory._PENDING_SCANS_MAX]))
def test_kept_values_exact_whatever_the_pending_scans_threshold(ops, scans):
    memory._PENDING_SCANS_MAX, kept = scans, memory._PENDING_SCANS_MAX
    try:
        _check(ops)
    finally:
        memory._PENDING_SCANS_MAX = kept


def test_pending_entries_join_the_index_and_are_still_dropped():
    cache = memory.DerivedCache()
    for key in range(100):
        cache.put(key, key * 100, key * 100 + 50, key)
    cache.invalidate(0, 1)  # builds the index (drops key 0)
    cache.put("late", 20_000, 20_040, "v")  # pending: put after the build
    epoch = cache.epoch
    for _ in range(memory._PENDING_SCANS_MAX + 1):
        cache.invalidate_rows(np.array([19_990, 20_100]), 8)  # near it, overlapping nothing
    assert not cache._pending and cache.get("late") == "v" and cache.epoch == epoch
    cache.invalidate_rows(np.array([20_030]), 4)
    assert cache.get("late") is None and cache.epoch == epoch + 1
    cache.invalidate_rows(np.array([140, 9_920]), 4)  # keys 1 and 99, through the index
    assert cache.get(1) is None and cache.get(99) is None and cache.get(2) == 2 and len(cache) == 97


# ---------------------------------------------------------------------------------------------
# the int8 step in one frame: the Cbuf's bookkeeping
# ---------------------------------------------------------------------------------------------
def _key(address: int, banks: str) -> tuple:
    return (("address", address), ("bytes", 4096), ("banks", banks))


def _step_pair(weight_key: tuple, weights: np.ndarray):
    """A step's two forms around a fake kernel: ``direct`` + ``dpu`` (two calls) and ``then_into(dpu)``."""
    feature = np.zeros((1, 2, 2, 16), np.int8)
    plan = SimpleNamespace(weight_key=weight_key, feature_key=_key(0x100, "1/11"))
    rows = (np.arange(64, dtype=np.uint8), np.array([0, 32]), feature.view(np.uint8).reshape(2, 32), (),
            cna_core._Resident(plan.feature_key, feature, "t"), cna_core._feature_keeper(plan.feature_key, "t"))
    load = lambda cbuf: (rows[5](cbuf, rows[4]), feature)[1]  # noqa: E731 (the loader's keep, then the array)
    load.buffer, load.rows = feature, rows
    kernel = lambda f, w: None  # noqa: E731
    kernel.prepare = lambda w: (lambda f: (f, None))
    run = cna_core._cna_step(plan, "t", load, kernel, weights, None)
    seen = []
    return run, (lambda cbuf: seen.append(run.direct(cbuf))), run.then_into(lambda d, s: seen.append((d, s))), seen


def _state(cbuf, names: dict) -> tuple:
    """The Cbuf's slots and older sets, arrays by name (each form has its own arrays)."""
    name = lambda array: names.get(id(array), "?")  # noqa: E731
    older = tuple((k, name(a), b) for k, a, b in cbuf._older_weights)
    return (cbuf.feature and (cbuf.feature.key, name(cbuf.feature.array)),
            cbuf.weights and (cbuf.weights.key, name(cbuf.weights.array), cbuf.weights.banks), older)


@pytest.mark.parametrize("before", ["empty", "same", "covered", "beside", "older"])
def test_the_one_frame_step_keeps_the_cbuf_as_the_two_calls_do(before):
    key, states = _key(0x1000, "1/11"), {1: [], 2: []}
    for form in (1, 2):
        weights, other, third = np.zeros(4096, np.int8), np.zeros(4096, np.int8), np.zeros(4096, np.int8)
        weights.flags.writeable = False
        run, two_calls, one_frame, seen = _step_pair(key, weights)
        names = {id(weights): "w", id(other): "o", id(third): "t", id(run.direct.__closure__): "?"}
        step = two_calls if form == 1 else one_frame
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
            held = cbuf_reuse.still_held(cbuf, "weights", key, weights, _key(0x2000, "4/8"))
            states[form].append((_state(cbuf, names), names.get(id(held))))
        assert len(seen) >= 3
    assert states[1] == states[2]
    assert states[1][-1][0][1][:2] == (key, "w")  # (the step's weights in the slot)


# ---------------------------------------------------------------------------------------------
# fetched weights gathered into the step's own array
# ---------------------------------------------------------------------------------------------
def _stable_fetches(monkeypatch, refill: bool = True) -> list:
    """Record what each fetch returns; ``refill`` False: a broken variant that gathers only once (the
    step's array then keeps the first run's weights)."""
    got, inner = [], cna_core._weights_fetcher

    def fetcher(*args):
        fetch = inner(*args)
        if fetch is None:
            return None
        first = []

        def recorded():
            if refill or not first:
                first[:] = [fetch()]
            got.append((first[0], first[0].copy()))
            return first[0]
        recorded.array = fetch.array
        return recorded

    monkeypatch.setattr(cna_core, "_weights_fetcher", fetcher)
    return got


def test_fetched_weights_are_one_array_refilled_every_run(monkeypatch, tmp_path):
    """The MatMul's second operand, new every run: each step hands out its one array, its contents
    those of the bytes at that run, and every run equals the full path's."""
    _weights_dropped_at_build(monkeypatch)
    got = _stable_fetches(monkeypatch)
    outputs, _ = _compare(tmp_path, "matmul", seed=12)
    assert _mismatches(outputs) == 0
    arrays = {id(array) for array, _ in got}
    assert len(got) >= 4 and len(arrays) < len(got)  # (the same array again)
    by_array = {}
    for array, values in got:
        by_array.setdefault(id(array), []).append(values.tobytes())
    assert any(len(set(values)) > 1 for values in by_array.values())  # (refilled with new weights)


def test_the_checks_catch_a_fetch_that_is_not_refilled(monkeypatch, tmp_path):
    _weights_dropped_at_build(monkeypatch)
    got = _stable_fetches(monkeypatch, refill=False)
    outputs, _ = _compare(tmp_path, "matmul", seed=12)
    assert len(got) >= 4 and _mismatches(outputs) > 0
