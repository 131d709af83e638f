"""A padded int8 depthwise layer with as many outputs as lanes (kernels/depthwise_plan.py
``_prepare_padded``) as one compiled call (issue 20): its ``depthwise_parts`` / ``depthwise_placed`` run by
kernels/int8_core_step.py ``depthwise_step`` through units/cna_core.py ``_fused_int8``, as step_batch
DEPTHWISE ops, and on a machine as chained ROWS / PLANES steps and batches. Checked against numpy
references written in the tests (test_int8_core_step's: rows gathered by fancy indexing, the real channels
masked, the pad value outside the input, int64 convolutions and window sums, the CORE stage of
tests/emulator/reference) and against the separate call (``run_padded``), with the VNNI row kernel and
without it (the three others); broken variants (the dropped lanes' sums not zeroed, a wrong pad value, the
padded copy one row or column off, the DPU chain skipped) are caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise_plan, depthwise_vnni, int8_core_step, step_batch
from npuemu.emulator.units import cna_core
from tests.emulator.test_int8_core_step import _depthwise_agrees, _depthwise_reference, _expected_atoms, _memory
from tests.emulator.test_kern_int8_passes import depthwise_case
from tests.emulator.test_machine_support import ConvSpec

SETTINGS = settings(deadline=None, max_examples=50, suppress_health_check=[HealthCheck.too_slow])
C2 = 16


class _Owner:
    """An arena's owner (a Memory in the emulator: weak-referenceable)."""


def _prepared(shape, w, geometry, pad_value, truncate, mode, own: bool, vnni: bool):
    """The prepared layer (outputs = lanes), with buffers of its own or none (an arena's), its row kernel the
    VNNI one or (``vnni`` False) the one a host without VNNI runs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(depthwise_plan, "OWN_BUFFER_ELEMENTS", 1 << 30 if own else 0)
        if not vnni:
            patch.setattr(depthwise_plan, "_packed", lambda weights, lanes: None)
        core = depthwise_plan.prepare_depthwise_int8_atoms(shape, w, geometry, pad_value, truncate, mode,
                                                           shape[0] * shape[3])
    assert core.__name__ == "run_padded"
    assert (getattr(core, "depthwise_parts", None) is not None) == own
    return core


def _fused(data, offsets, shape, real, core, work=None):
    """``_fused_int8``'s (call, arguments, (outputs, window-sum planes)) on a fresh junk feature buffer."""
    buffer = np.full(shape, 55, np.int8)
    target = buffer.view(np.uint8).reshape(shape[0] * shape[1], shape[2] * shape[3])
    fused = cna_core._fused_int8(data, offsets, target, buffer, divmod(real, shape[3]), core, work)
    assert fused is not None and fused[0] is int8_core_step.depthwise_step
    return fused, buffer


@st.composite
def _layers(draw):
    """(shape, channels, real, w, geometry, pad value, truncate, mode, rng): outputs = lanes = surfaces x C2."""
    seed = draw(st.integers(0, 2**32 - 1))
    kernel = draw(st.sampled_from([(3, 3), (1, 1), (5, 5), (2, 3), (7, 7), (3, 1)]))
    channels = draw(st.integers(1, 64))
    geometry, x, w = depthwise_case(seed, kernel, draw(st.integers(1, 2)), draw(st.integers(1, 2)), channels,
                                    max_height=6, max_width=9)
    w.flags.writeable = False
    shape = (-(-channels // C2), x.shape[1], x.shape[2], C2)
    real = max(0, channels - draw(st.integers(0, 40)))
    return (shape, channels, real, w, geometry, draw(st.sampled_from([-128, 127, 0, -9, 5])),
            draw(st.sampled_from([0, 0, 2, 13])), draw(st.sampled_from([nm.ROUND_HALF_AWAY, nm.ROUND_HALF_EVEN])),
            np.random.default_rng(seed))


def _expected(data, offsets, layer):
    shape, channels, real, w, geometry, pad_value, truncate, mode, _ = layer
    atoms = _expected_atoms(data, offsets, shape, real)
    return atoms, _depthwise_reference(atoms, channels, w, geometry, pad_value, truncate, mode, shape[0] * C2)


@SETTINGS
@given(_layers(), st.booleans(), st.booleans())
def test_padded_depthwise_step_matches_the_reference_and_the_separate_call(layer, own, vnni):
    """Three runs of one step over new memory rows (own buffers, or an arena refilled with junk first): the
    feature, outputs and window sums as the reference's, and as ``run_padded``'s on that feature."""
    shape, channels, real, w, geometry, pad_value, truncate, mode, rng = layer
    core = _prepared(shape, w, geometry, pad_value, truncate, mode, own, vnni and depthwise_vnni.available())
    work = None if own else int8_core_step.arena(_Owner())
    for junk in (0x7F, 0x80, 0xFF):
        if work is not None:
            work[:] = junk
        atoms = rng.integers(-128, 128, shape).astype(np.int8)
        data, offsets = _memory(rng, atoms, int(rng.integers(0, 40)))
        (call, arguments, (out, planes)), buffer = _fused(data, offsets, shape, real, core, work)
        assert arguments[-1][int8_core_step.DW_WHOLE] == 1  # (run_padded's kernels on the whole layer)
        call(*arguments)
        atoms, expected = _expected(data, offsets, layer)
        assert np.array_equal(buffer, atoms) and _depthwise_agrees(out, planes, expected)
        out, planes = out.copy(), planes.copy()
        separate = core(atoms)  # (the separate call: depthwise.run_padded on the same atoms)
        assert np.array_equal(separate[0], out) and np.array_equal(separate[1], planes)


@SETTINGS
@given(st.lists(_layers(), min_size=1, max_size=3), st.booleans())
def test_padded_depthwise_ops_in_one_run_ops_call_match_the_reference(layers, arena_last):
    """1-3 DEPTHWISE ops (their own buffers; with ``arena_last`` the last one's in an arena of junk) in one
    table run by one ``run_ops`` call: every op's outputs as the reference's."""
    work = int8_core_step.arena(_Owner())
    work[:] = 0xA5
    rows, checks = [], []
    for at, layer in enumerate(layers):
        shape, channels, real, w, geometry, pad_value, truncate, mode, rng = layer
        placed = arena_last and at == len(layers) - 1
        core = _prepared(shape, w, geometry, pad_value, truncate, mode, not placed, depthwise_vnni.available())
        data, offsets = _memory(rng, rng.integers(-128, 128, shape).astype(np.int8), 3)
        (_, arguments, results), buffer = _fused(data, offsets, shape, real, core, work if placed else None)
        row = step_batch.encoded(step_batch.kind_of(int8_core_step.depthwise_step, arguments), arguments)
        assert row is not None and row[0] == step_batch.DEPTHWISE
        rows.append(row)
        checks.append((data, offsets, layer, buffer, results, arguments))
    table = np.array(rows)
    assert step_batch.run_ops(table, 0, len(rows)) == len(rows)
    for data, offsets, layer, buffer, (out, planes), _ in checks:
        atoms, expected = _expected(data, offsets, layer)
        assert np.array_equal(buffer, atoms) and _depthwise_agrees(out, planes, expected)


# -- broken variants ---------------------------------------------------------------------------------------

def _broken_agrees(variant: str, batched: bool, own: bool) -> bool:
    """One run of a fixed layer (2 surfaces, 20 channels, real 17, pads 1, pad value -9) with ``variant``
    broken in its call's scalars: whether the outputs still equal the reference's."""
    geometry, x, w = depthwise_case(21, (3, 3), 1, 1, 20, max_height=6, max_width=9)
    w.flags.writeable = False
    shape, real = (2, x.shape[1], x.shape[2], C2), 17
    layer = (shape, 20, real, w, geometry, -9, 0, nm.ROUND_HALF_AWAY, None)
    assert geometry.pad_top > 0 and geometry.pad_left > 0
    core = _prepared(shape, w, geometry, -9, 0, nm.ROUND_HALF_AWAY, own, depthwise_vnni.available())
    work = None if own else int8_core_step.arena(_Owner())
    if work is not None:
        work[:] = 0x33
    data, offsets = _memory(np.random.default_rng(2), np.full(shape, 7, np.int8), 4)
    (call, arguments, (out, planes)), _ = _fused(data, offsets, shape, real, core, work)
    arguments = list(arguments)
    ints = arguments[-1] = arguments[-1].copy()
    assert ints[int8_core_step.DW_WHOLE] == 1
    if variant == "dropped sums kept":  # (the sums of the lanes past the channels not zeroed)
        ints[int8_core_step.DW_SUMMED] = shape[0] * C2
    elif variant == "pad value":
        ints[int8_core_step.DW_PAD_BYTE] = (ints[int8_core_step.DW_PAD_BYTE] + 1) & 0xFF
    elif variant == "copy one row off":
        ints[int8_core_step.DW_TOP] -= 1
    elif variant == "copy one column off":
        ints[int8_core_step.DW_LEFT] -= 1
    if batched:
        step_batch.run_ops(np.array([step_batch.encoded(step_batch.DEPTHWISE, tuple(arguments))]), 0, 1)
    else:
        call(*arguments)
    return _depthwise_agrees(out, planes, _expected(data, offsets, layer)[1])


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("variant, own", [("dropped sums kept", True), ("dropped sums kept", False),
                                          ("pad value", True), ("pad value", False), ("copy one row off", True),
                                          ("copy one column off", False)])
def test_broken_variants_are_caught(variant, own, batched):
    assert _broken_agrees("none", batched, own)
    assert not _broken_agrees(variant, batched, own)


# -- on a machine: the chained forms (ROWS; PLANES for a one-pixel layer) and batches of such steps --------

#: depthwise layers whose outputs (kernels rounded up to 32) equal the lanes (channels up to 32 or 64)
PADDED = {"depthwise_3x3_24ch": None,
          "dw_5x5_s2_64ch": ConvSpec(in_c=64, in_h=9, in_w=10, kernels=64, kernel=5, stride=2, pad_top=2, pad_left=2,
                                     out_h=5, out_w=5, depthwise=True, pad_value=-7),
          "dw_3x3_dilated_30ch": ConvSpec(in_c=30, in_h=7, in_w=8, kernels=30, kernel=3, dilation=2, pad_top=2,
                                          pad_left=2, out_h=7, out_w=8, depthwise=True, pad_value=5),
          "dw_3x3_1px_32ch": ConvSpec(in_c=32, in_h=1, in_w=1, kernels=32, kernel=3, pad_top=1, pad_left=1, out_h=1,
                                      out_w=1, depthwise=True, pad_value=-2)}


def _with_padded_layers(monkeypatch) -> None:
    from tests.emulator import test_task_plans as plans

    monkeypatch.setattr(plans, "EXTRA", {**plans.EXTRA, **{k: v for k, v in PADDED.items() if v is not None}})


def _padded_machines(monkeypatch, broken: bool = False) -> dict:
    """``PADDED``'s layers added to test_task_plans', and the depthwise chained calls counted (the count, by
    chain kind). ``broken``: those calls run the CORE part only (the DPU chain's output rows left as they
    were), reporting the chain done."""
    _with_padded_layers(monkeypatch)
    calls = {"rows": 0, "planes": 0}
    for kind in calls:
        inner = int8_core_step.CHAINED[(int8_core_step.depthwise_step, kind)]

        def counted(*arguments, inner=inner, kind=kind):
            calls[kind] += 1
            if broken:
                int8_core_step.depthwise_step(*arguments[:15])
                return True
            return inner(*arguments)

        monkeypatch.setitem(int8_core_step.CHAINED, (int8_core_step.depthwise_step, kind), counted)
    return calls


def _counted_padded(monkeypatch) -> list:
    """The prepared padded layers' (outputs = lanes) count (made through ``_prepare_padded``)."""
    made, inner = [], depthwise_plan._prepare_padded

    def counting(*arguments):
        made.append(inner(*arguments))
        return made[-1]

    monkeypatch.setattr(depthwise_plan, "_prepare_padded", counting)
    return made


@pytest.mark.parametrize("name", list(PADDED))
def test_chained_padded_depthwise_steps_equal_the_reference_and_the_full_path(monkeypatch, name):
    """A two-task chain of the layer (steps one by one), new inputs each run: outputs as the independent
    reference (test_machine_conv's) and the full path, equal records and states; the chained call ran."""
    from tests.emulator.test_int8_core_step import _chained_runs

    made, calls = _counted_padded(monkeypatch), _padded_machines(monkeypatch)
    _, agree = _chained_runs(monkeypatch, name)
    assert agree and made and calls["planes" if "1px" in name else "rows"] > 0


def test_a_padded_depthwise_chained_step_skipping_its_dpu_chain_is_caught(monkeypatch):
    from tests.emulator.test_int8_core_step import _chained_runs

    calls = _padded_machines(monkeypatch, broken=True)
    _, agree = _chained_runs(monkeypatch, "dw_5x5_s2_64ch")
    assert calls["rows"] > 0 and not agree


@pytest.mark.parametrize("name", list(PADDED))
@pytest.mark.parametrize("tasks", [2, 3])
def test_padded_depthwise_batches_equal_steps_one_by_one_and_the_full_path(monkeypatch, name, tasks):
    from tests.emulator import test_step_batch as batches

    made = _counted_padded(monkeypatch)
    _with_padded_layers(monkeypatch)
    calls = batches._batches_run(monkeypatch)
    batches._compare(name, tasks)
    assert made and any(stop - start == tasks for start, stop in calls)  # (the whole chain as one call)
