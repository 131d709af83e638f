"""The one-call form of an int8 convolution whose windows reach outside the input (issue 20: silero-vad's
encoder, ddddocr's CRNN; kernels/int8_core_step.py ``gemm_padded_step`` through units/cna_core.py
``_fused_int8``): the feature rows gathered, the lanes past DATAIN_CHANNEL_REAL zeroed, the padded copy,
the products and the edge terms of the channels past the real ones, with buffers of its own or in an
arena, as a kernels/step_batch.py op, and chained with the DPU on a machine - against a plain numpy
convolution written here (the pad value outside the input in every channel, the lanes past the real
channels 0 inside it, the CORE stage of tests/emulator/reference) over random shapes, pads on each side,
strides, dilations, pad values and real channels. Broken variants (edges skipped, the pad value or the
padded copy's offset one off) are caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import gemm_conv_int8, gemm_int8, int8_core_step, step_batch
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.units import cna_core
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.test_int8_core_step import _expected_atoms, _memory, _Owner
from tests.emulator.test_machine_support import ConvSpec

SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
C2 = 16
VNNI = pytest.mark.skipif(not gemm_int8.available(), reason="no AVX-512 VNNI: the float32 path, no fused step")
_NAMES = {nm.ROUND_HALF_AWAY: "half_away", nm.ROUND_HALF_EVEN: "half_even"}


def _scratch(name, size, dtype):
    return np.empty(size, dtype)


def _reference(atoms, case):
    """The CORE outputs [P][out channels] and window sums [P] of the first ``channels`` channels of ``atoms``
    (already masked past the real ones), the pad value in every channel outside the input."""
    g, channels, weights = case["geometry"], case["channels"], case["weights"]
    planes = atoms.transpose(0, 3, 1, 2).reshape(-1, atoms.shape[1], atoms.shape[2])[:channels].astype(np.int64)
    padded = np.full((channels, g.padded_h, g.padded_w), case["pad_value"], np.int64)
    rows = max(0, min(atoms.shape[1], g.padded_h - g.pad_top))
    cols = max(0, min(atoms.shape[2], g.padded_w - g.pad_left))
    padded[:, g.pad_top:g.pad_top + rows, g.pad_left:g.pad_left + cols] = planes[:, :rows, :cols]
    out = np.zeros((g.out_h * g.out_w, case["out_channels"]), np.int64)
    sums = np.zeros(g.out_h * g.out_w, np.int64)
    w64 = weights.astype(np.int64)
    for oy in range(g.out_h):
        for ox in range(g.out_w):
            y, x = oy * g.stride_y, ox * g.stride_x
            window = padded[:, y:y + (g.kernel_h - 1) * g.dilation_y + 1:g.dilation_y,
                            x:x + (g.kernel_w - 1) * g.dilation_x + 1:g.dilation_x]
            exact = np.einsum("chw,mchw->m", window, w64)
            out[oy * g.out_w + ox, :weights.shape[0]] = [
                ref_arith.core(int(v), case["truncate"], _NAMES[case["mode"]]) for v in exact]
            sums[oy * g.out_w + ox] = window.sum()
    return out, sums


@st.composite
def _padded_convolutions(draw):
    channels = draw(st.integers(1, 40))
    surfaces = -(-channels // C2) + draw(st.integers(0, 1))
    real = draw(st.sampled_from([channels, draw(st.integers(1, channels))]))
    kernel_h, kernel_w = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride_y, stride_x, dilation_y, dilation_x = (draw(st.integers(1, 2)) for _ in range(4))
    out_h, out_w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    top, left, bottom, right = (draw(st.integers(0, 2)) for _ in range(4))
    span_h, span_w = (out_h - 1) * stride_y + (kernel_h - 1) * dilation_y + 1, \
        (out_w - 1) * stride_x + (kernel_w - 1) * dilation_x + 1
    # (rows and columns past the windows too: a negative bottom / right pad)
    height = max(1, span_h - top - bottom) + draw(st.sampled_from([0, 0, 1]))
    width = max(1, span_w - left - right) + draw(st.sampled_from([0, 0, 2]))
    kernels = draw(st.integers(1, 70))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights = rng.integers(-128, 128, (kernels, channels, kernel_h, kernel_w)).astype(np.int8)
    if draw(st.booleans()):  # the extremes of the reduction
        weights[:] = draw(st.sampled_from([-128, 127]))
    weights.flags.writeable = False
    return {"shape": (surfaces, height, width, C2), "channels": channels, "real": real, "weights": weights,
            "geometry": ConvGeometry(kernel_h, kernel_w, out_h, out_w, stride_y, stride_x, dilation_y, dilation_x,
                                     top, left),
            "pad_value": draw(st.sampled_from([-128, 127, 0, -9, 5])), "truncate": draw(st.sampled_from([0, 0, 2, 13])),
            "mode": draw(st.sampled_from([nm.ROUND_HALF_AWAY, nm.ROUND_HALF_EVEN])),
            "out_channels": kernels + draw(st.integers(0, 20)), "rng": rng}


def _prepared(case, own: bool = True):
    with pytest.MonkeyPatch.context() as patch:  # (buffers of its own whatever the size, or none)
        patch.setattr(gemm_conv_int8, "OWN_BUFFER_ELEMENTS", 1 << 30 if own else 0)
        core = gemm_conv_int8.prepare(case["shape"], case["channels"], case["real"], case["weights"], case["geometry"],
                                      case["pad_value"], case["truncate"], case["mode"], case["out_channels"], _scratch)
    assert core is not None
    return core


def _inside(case) -> bool:
    """Whether the step reads the atoms in place (every window inside the input: the former one-call form;
    the channels past the real ones then add nothing and are left out)."""
    g, shape = case["geometry"], case["shape"]
    return g.pad_top == g.pad_left == 0 and g.padded_h <= shape[1] and g.padded_w <= shape[2]


def _fused(data, offsets, case, core, work=None):
    """``_fused_int8``'s (kernel, arguments, (outputs, window sums)) on a fresh feature buffer (junk in it)."""
    shape = case["shape"]
    buffer = np.full(shape, 55, np.int8)
    target = buffer.view(np.uint8).reshape(shape[0] * shape[1], shape[2] * shape[3])
    fused = cna_core._fused_int8(data, offsets, target, buffer, divmod(case["real"], C2), core, work)
    assert fused is not None
    assert fused[0] is (int8_core_step.gemm_step if _inside(case) else int8_core_step.gemm_padded_step)
    return fused + (buffer,)


def _check(case, data, offsets, out, sums, buffer) -> None:
    atoms = _expected_atoms(data, offsets, case["shape"], case["real"])
    expected = _reference(atoms, case)
    np.testing.assert_array_equal(buffer, atoms)
    np.testing.assert_array_equal(out, expected[0])
    np.testing.assert_array_equal(sums.reshape(-1), expected[1])


@VNNI
@SETTINGS
@given(_padded_convolutions())
def test_padded_step_matches_the_reference(case):
    """Buffers of its own: three runs of one step over new memory rows (lines shuffled, junk between)."""
    core, rng = _prepared(case), case["rng"]
    assert core.gemm_parts is not None and (core.gemm_parts[9] is None) == _inside(case)
    for gap in (0, 3, 32):
        atoms = rng.integers(-128, 128, case["shape"]).astype(np.int8)
        data, offsets = _memory(rng, atoms, gap)
        call, arguments, (out, sums), buffer = _fused(data, offsets, case, core)
        call(*arguments)
        _check(case, data, offsets, out, sums, buffer)


@VNNI
@SETTINGS
@given(_padded_convolutions())
def test_padded_arena_step_matches_the_reference(case):
    """No buffers of its own: the padded copy, outputs and window sums placed in an arena holding another
    step's junk before each run."""
    core, rng = _prepared(case, own=False), case["rng"]
    assert core.gemm_parts is None and core.gemm_placed is not None
    work = int8_core_step.arena(_Owner())
    for junk in (0x7F, 0x80, 0xFF):
        work[:] = junk
        atoms = rng.integers(-128, 128, case["shape"]).astype(np.int8)
        data, offsets = _memory(rng, atoms, 5)
        call, arguments, (out, sums), buffer = _fused(data, offsets, case, core, work)
        call(*arguments)
        _check(case, data, offsets, out, sums, buffer)


@VNNI
@settings(deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_padded_convolutions(), min_size=1, max_size=3), st.booleans())
def test_padded_ops_in_one_run_ops_call_match_the_reference(cases, own):
    """Such steps as step_batch ops (GEMM_PADDED; GEMM where the windows lie inside) in one table, run by
    one ``run_ops`` call, buffers of their own or all in one arena (each op's consumed before the next
    writes: checked after each call of a one-op range, then all at once for own buffers)."""
    work = None if own else int8_core_step.arena(_Owner())
    made, held = [], []
    for case in cases:
        core, rng = _prepared(case, own), case["rng"]
        data, offsets = _memory(rng, rng.integers(-128, 128, case["shape"]).astype(np.int8), 3)
        call, arguments, (out, sums), buffer = _fused(data, offsets, case, core, work)
        kind = step_batch.kind_of(call, arguments)
        assert kind == (step_batch.GEMM if _inside(case) else step_batch.GEMM_PADDED)
        held.append(arguments)  # (the table holds addresses only)
        made.append((case, data, offsets, out, sums, buffer, step_batch.encoded(kind, arguments)))
    table = np.array([row for *_, row in made])
    for at, (case, data, offsets, out, sums, buffer, _) in enumerate(made):
        assert step_batch.run_ops(table, at, at + 1) == at + 1
        _check(case, data, offsets, out, sums, buffer)
    if own:
        for _, _, _, out, sums, buffer, _ in made:
            out[:], sums[:], buffer[:] = 77, -5, 3
        assert step_batch.run_ops(table, 0, len(made)) == len(made)
        for case, data, offsets, out, sums, buffer, _ in made:
            _check(case, data, offsets, out, sums, buffer)


# -- broken variants -------------------------------------------------------------------------------------

_BROKEN_CASE = {"shape": (3, 5, 6, C2), "channels": 40, "real": 29,
                "geometry": ConvGeometry(3, 3, 5, 6, 1, 1, 1, 1, 1, 1), "pad_value": -9, "truncate": 0,
                "mode": nm.ROUND_HALF_AWAY, "out_channels": 24}


def _broken_runs(variant: str, batched: bool) -> bool:
    """Whether a run of the step (or its op) with ``variant`` broken in its arguments equals the reference."""
    case = dict(_BROKEN_CASE, rng=np.random.default_rng(9))
    case["weights"] = case["rng"].integers(-128, 128, (20, 40, 3, 3)).astype(np.int8)
    core = _prepared(case)
    data, offsets = _memory(case["rng"], case["rng"].integers(-128, 128, case["shape"]).astype(np.int8), 4)
    call, arguments, (out, sums), buffer = _fused(data, offsets, case, core)
    arguments = list(arguments)
    ints = arguments[-1] = arguments[-1].copy()
    if variant == "edges skipped":
        assert arguments[13].size > 0  # (the real channels cut and the sums fused: edge terms)
        arguments[13] = arguments[13][:0]
    elif variant == "pad value":
        ints[int8_core_step.PAD_VALUE] += 1
    elif variant == "copy one row off":
        ints[int8_core_step.PAD_TOP] += 1
    elif variant == "copy one column off":
        ints[int8_core_step.PAD_LEFT] -= 1
    if batched:
        step_batch.run_ops(np.array([step_batch.encoded(step_batch.GEMM_PADDED, tuple(arguments))]), 0, 1)
    else:
        call(*arguments)
    try:
        _check(case, data, offsets, out, sums, buffer)
    except AssertionError:
        return False
    return True


@VNNI
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("variant", ["edges skipped", "pad value", "copy one row off", "copy one column off"])
def test_broken_variants_are_caught(variant, batched):
    assert _broken_runs("none", batched)
    assert not _broken_runs(variant, batched)


# -- on a machine: the chained form (the DPU's window chain in the same call) and batches of such steps ---

#: padded convolutions (test_machine_conv's, and real channels cut: edge terms)
PADDED = {"direct_3x3_pad1": None, "direct_odd_channels_strided": None, "direct_dilated": None,
          "padded_real_cut": ConvSpec(in_c=40, in_h=6, in_w=7, kernels=24, kernel=3, pad_top=1, pad_left=1, out_h=6,
                                      out_w=7, pad_value=-7, real_channels=29)}


def _with_padded_layers(monkeypatch) -> None:
    """test_task_plans' layers with ``PADDED``'s added, its reference reading the channels past the real ones
    as 0 inside the input (the pad value outside it, as every channel)."""
    from tests.emulator import test_task_plans as plans

    monkeypatch.setattr(plans, "EXTRA", {**plans.EXTRA, **{k: v for k, v in PADDED.items() if v is not None}})
    inner = plans._expected

    def expected(spec, x, w, bs):
        x = x.copy()
        x[spec.real_channels or spec.in_c:] = 0
        return inner(spec, x, w, bs)

    monkeypatch.setattr(plans, "_expected", expected)


def _padded_machines(monkeypatch, broken: bool = False) -> list:
    """``_with_padded_layers``, and the padded chained calls counted: the count. ``broken``: those calls run the
    CORE part only (the DPU chain's output rows left as they were), reporting the chain done."""
    _with_padded_layers(monkeypatch)
    calls = [0]
    inner = int8_core_step.CHAINED[(int8_core_step.gemm_padded_step, "window")]

    def counted(*arguments):
        calls[0] += 1
        if broken:
            int8_core_step.gemm_padded_step(*arguments[:17])
            return True
        return inner(*arguments)

    monkeypatch.setitem(int8_core_step.CHAINED, (int8_core_step.gemm_padded_step, "window"), counted)
    return calls


@VNNI
@pytest.mark.parametrize("name", list(PADDED))
def test_chained_padded_steps_equal_the_reference_and_the_full_path(monkeypatch, name):
    """A two-task chain of the layer (steps one by one: the counted chained call is no batch op), new inputs
    each run: outputs as the independent reference and the full path, equal records and states."""
    from tests.emulator.test_int8_core_step import _chained_runs

    calls = _padded_machines(monkeypatch)  # (the padded chained calls counted, inside _chained_runs' count)
    _, agree = _chained_runs(monkeypatch, name)
    assert agree and calls[0] > 0


@VNNI
def test_a_padded_chained_step_skipping_its_dpu_chain_is_caught(monkeypatch):
    from tests.emulator.test_int8_core_step import _chained_runs

    calls = _padded_machines(monkeypatch, broken=True)
    _, agree = _chained_runs(monkeypatch, "direct_3x3_pad1")
    assert calls[0] > 0 and not agree


@VNNI
@pytest.mark.parametrize("name", list(PADDED))
@pytest.mark.parametrize("tasks", [2, 3])
def test_padded_batches_equal_steps_one_by_one_and_the_full_path(monkeypatch, name, tasks):
    from tests.emulator import test_step_batch as batches

    _with_padded_layers(monkeypatch)
    calls = batches._batches_run(monkeypatch)
    batches._compare(name, tasks)
    assert any(stop - start == tasks for start, stop in calls)  # (the whole chain as one call)
