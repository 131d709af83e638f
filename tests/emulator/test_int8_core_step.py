"""The CORE half of a small int8 step in one compiled call (issue 20, kernels/int8_core_step.py
through units/cna_core.py ``_fused_int8``): the feature rows copied from scattered memory rows,
the lanes past DATAIN_CHANNEL_REAL zeroed and the prepared depthwise or VNNI convolution run, against
numpy references written here (rows gathered by fancy indexing, the real channels masked, int64
convolutions and window sums, the CORE stage of tests/emulator/reference), over several runs of one
step with new memory contents; broken variants (a mask one lane short, rows read one byte off) are
caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import depthwise_plan, gemm_conv_int8, gemm_int8, int8_core_step
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.units import cna_core
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref
from tests.emulator.test_kern_int8_passes import depthwise_case
from tests.emulator.test_kernels_mac import as_dict
from tests.emulator.test_machine_support import ConvSpec

SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
C2 = 16


def _memory(rng, atoms: np.ndarray, gap: int):
    """A byte array holding the atoms' lines [S * H][W * C2] in shuffled order ``gap`` bytes apart,
    and each line's offset (as a step's located rows)."""
    lines = atoms.reshape(atoms.shape[0] * atoms.shape[1], -1).view(np.uint8)
    order = rng.permutation(lines.shape[0])
    pitch = lines.shape[1] + gap
    data = rng.integers(0, 256, pitch * lines.shape[0] + gap, dtype=np.uint8)
    offsets = np.empty(lines.shape[0], np.int64)
    for slot, line in enumerate(order):
        offsets[line] = gap + slot * pitch
        data[offsets[line]:offsets[line] + lines.shape[1]] = lines[line]
    return data, offsets


def _expected_atoms(data: np.ndarray, offsets: np.ndarray, shape: tuple, real: int) -> np.ndarray:
    """The atoms the step must convolve: each line read at its offset, channels from ``real`` on 0."""
    row_bytes = shape[2] * shape[3]
    atoms = data[offsets[:, None] + np.arange(row_bytes)].view(np.int8).reshape(shape).copy()
    channel = np.arange(shape[0])[:, None] * shape[3] + np.arange(shape[3])
    atoms[(channel >= real)[:, None, None, :].repeat(shape[1], 1).repeat(shape[2], 2)] = 0
    return atoms


def _step(data, offsets, shape, real, core, mask=None):
    """The fused step's kernel call on a fresh feature buffer (junk before it runs): its outputs, and the
    buffer (the feature the Cbuf keeps: a later DATA_REUSE task reads it)."""
    buffer = np.full(shape, 55, np.int8)
    target = buffer.view(np.uint8).reshape(shape[0] * shape[1], shape[2] * shape[3])
    fused = cna_core._fused_int8(data, offsets, target, buffer, mask or divmod(real, shape[3]), core)
    assert fused is not None
    call, arguments, (out, sums) = fused
    call(*arguments)
    return out, sums, buffer


def _depthwise_reference(atoms, channels, w, geometry, pad_value, truncate, mode, out_channels):
    x = atoms.transpose(0, 3, 1, 2).reshape(-1, atoms.shape[1], atoms.shape[2])[:channels].astype(np.int64)
    padded = ref.padded_input(x, geometry.pad_top, geometry.pad_left, geometry.padded_h, geometry.padded_w,
                              pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    names = {nm.ROUND_HALF_AWAY: "half_away", nm.ROUND_HALF_EVEN: "half_even"}
    core = np.array([ref_arith.core(int(v), truncate, names[mode]) for v in exact.ravel()]).reshape(exact.shape)
    out = np.zeros((out_channels,) + exact.shape[1:], np.int64)
    out[:channels] = core
    sums = np.zeros_like(out)
    sums[:channels] = ref.window_sums(padded, as_dict(geometry))
    return out, sums


def _depthwise_agrees(out, planes, expected):
    out_channels = expected[0].shape[0]
    return np.array_equal(out.T.reshape(expected[0].shape), expected[0]) \
        and np.array_equal(planes.reshape(out_channels, -1), expected[1].reshape(out_channels, -1))


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from([(3, 3), (1, 1), (5, 5), (2, 3)]), st.integers(1, 2),
       st.integers(1, 2), st.sampled_from([0, 0, 2, 13]), st.sampled_from([-128, 127, 0, -9]), st.integers(1, 40),
       st.integers(1, 20), st.integers(0, 40), st.sampled_from([nm.ROUND_HALF_AWAY, nm.ROUND_HALF_EVEN]))
def test_depthwise_step_matches_the_reference(seed, kernel, stride, dilation, truncate, pad_value, channels, extra,
                                              real_cut, mode):
    """A depthwise layer with more outputs than lanes and buffers of its own: three runs of one
    step over new memory rows (lines shuffled, gaps of junk), real channels cut anywhere."""
    geometry, x, w = depthwise_case(seed, kernel, stride, dilation, channels, max_height=6, max_width=9)
    surfaces = -(-channels // C2)
    shape = (surfaces, x.shape[1], x.shape[2], C2)
    out_channels = surfaces * C2 + extra
    real = max(0, channels - real_cut)
    w.flags.writeable = False
    with pytest.MonkeyPatch.context() as patch:  # (buffers of its own whatever the size)
        patch.setattr(depthwise_plan, "OWN_BUFFER_ELEMENTS", 1 << 30)
        core = depthwise_plan.prepare_depthwise_int8_atoms(shape, w, geometry, pad_value, truncate, mode,
                                                           out_channels)
    rng = np.random.default_rng(seed)
    for gap in (0, 5, 64):
        atoms = rng.integers(-128, 128, shape).astype(np.int8)
        data, offsets = _memory(rng, atoms, gap)
        out, planes, buffer = _step(data, offsets, shape, real, core)
        atoms = _expected_atoms(data, offsets, shape, real)
        expected = _depthwise_reference(atoms, channels, w, geometry, pad_value, truncate, mode, out_channels)
        assert np.array_equal(buffer, atoms) and _depthwise_agrees(out, planes, expected)


def test_depthwise_broken_variants_are_caught():
    """A mask one lane short and rows read one byte off give other values: the check sees them."""
    geometry, x, w = depthwise_case(7, (3, 3), 1, 1, 20)
    w.flags.writeable = False
    shape, real = (2, x.shape[1], x.shape[2], C2), 18
    core = depthwise_plan.prepare_depthwise_int8_atoms(shape, w, geometry, 3, 0, nm.ROUND_HALF_AWAY, 40)
    data, offsets = _memory(np.random.default_rng(3), np.full(shape, 9, np.int8), 8)
    atoms = _expected_atoms(data, offsets, shape, real)
    expected = _depthwise_reference(atoms, 20, w, geometry, 3, 0, nm.ROUND_HALF_AWAY, 40)
    out, planes, buffer = _step(data, offsets, shape, real, core)
    assert np.array_equal(buffer, atoms) and _depthwise_agrees(out, planes, expected)
    for broken in (_step(data, offsets, shape, real, core, mask=(1, 3)), _step(data, offsets + 1, shape, real, core)):
        assert not np.array_equal(broken[2], atoms) and not _depthwise_agrees(*broken[:2], expected)


def _gemm_reference(atoms, channels, weights, geometry, out_channels):
    """int64 sums of the first ``channels`` channels (the windows inside the input) and window sums."""
    planes = atoms.transpose(0, 3, 1, 2).reshape(-1, atoms.shape[1], atoms.shape[2])[:channels].astype(np.int64)
    out = np.zeros((geometry.out_h * geometry.out_w, out_channels), np.int64)
    sums = np.zeros(geometry.out_h * geometry.out_w, np.int64)
    g, w64 = geometry, weights.astype(np.int64)
    for oy in range(g.out_h):
        for ox in range(g.out_w):
            y, x = oy * g.stride_y, ox * g.stride_x
            window = planes[:, y:y + (g.kernel_h - 1) * g.dilation_y + 1:g.dilation_y,
                            x:x + (g.kernel_w - 1) * g.dilation_x + 1:g.dilation_x]
            out[oy * g.out_w + ox, :weights.shape[0]] = np.einsum("chw,mchw->m", window, w64)
            sums[oy * g.out_w + ox] = window.sum()
    return out, sums


@st.composite
def _convolutions(draw):
    channels = draw(st.integers(1, 40))
    surfaces = -(-channels // C2) + draw(st.integers(0, 1))
    real = draw(st.sampled_from([channels, draw(st.integers(1, channels))]))
    kernel_h, kernel_w = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride_y, stride_x, dilation_y, dilation_x = (draw(st.integers(1, 2)) for _ in range(4))
    out_h, out_w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    span_h, span_w = (out_h - 1) * stride_y + (kernel_h - 1) * dilation_y + 1, \
        (out_w - 1) * stride_x + (kernel_w - 1) * dilation_x + 1
    height, width = span_h + draw(st.integers(0, 2)), span_w + draw(st.integers(0, 2))
    geometry = ConvGeometry(kernel_h, kernel_w, out_h, out_w, stride_y, stride_x, dilation_y, dilation_x, 0, 0)
    kernels = draw(st.integers(1, 70))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights = rng.integers(-128, 128, (kernels, channels, kernel_h, kernel_w)).astype(np.int8)
    if draw(st.booleans()):  # the extremes of the reduction
        weights[:] = draw(st.sampled_from([-128, 127]))
    weights.flags.writeable = False
    return (surfaces, height, width, C2), channels, real, weights, geometry, kernels + draw(st.integers(0, 20)), rng


@pytest.mark.skipif(not gemm_int8.available(), reason="no AVX-512 VNNI: the float32 path, no fused step")
@SETTINGS
@given(_convolutions())
def test_gemm_step_matches_the_reference(case):
    """Windows inside the input (the atoms read in place), several surfaces, real channels cut
    anywhere: three runs of one step over new memory rows."""
    shape, channels, real, weights, geometry, out_channels, rng = case
    core = gemm_conv_int8.prepare(shape, channels, real, weights, geometry, 0, 0, 0, out_channels,
                                  lambda name, size, dtype: np.empty(size, dtype))
    assert core is not None and core.gemm_parts is not None
    for gap in (0, 3, 32):
        atoms = rng.integers(-128, 128, shape).astype(np.int8)
        data, offsets = _memory(rng, atoms, gap)
        out, sums, buffer = _step(data, offsets, shape, real, core)
        atoms = _expected_atoms(data, offsets, shape, real)
        expected = _gemm_reference(atoms, channels, weights, geometry, out_channels)
        np.testing.assert_array_equal(buffer, atoms)
        np.testing.assert_array_equal(out, expected[0])
        np.testing.assert_array_equal(sums.reshape(-1), expected[1])


@pytest.mark.skipif(not gemm_int8.available(), reason="no AVX-512 VNNI: the float32 path, no fused step")
def test_gemm_broken_variants_are_caught():
    """A mask one lane short (the kernel reads only the real channels: the feature kept differs) and
    rows read one byte off: the reference comparison fails."""
    shape, real = (2, 3, 4, C2), 21
    geometry = ConvGeometry(1, 1, 3, 4, 1, 1, 1, 1, 0, 0)
    weights = np.random.default_rng(1).integers(-128, 128, (5, 32, 1, 1)).astype(np.int8)
    weights.flags.writeable = False
    core = gemm_conv_int8.prepare(shape, 32, real, weights, geometry, 0, 0, 0, 8,
                                  lambda name, size, dtype: np.empty(size, dtype))
    data, offsets = _memory(np.random.default_rng(2), np.full(shape, 9, np.int8), 8)
    atoms = _expected_atoms(data, offsets, shape, real)
    expected = _gemm_reference(atoms, 32, weights, geometry, 8)
    out, _, buffer = _step(data, offsets, shape, real, core)
    assert np.array_equal(out, expected[0]) and np.array_equal(buffer, atoms)
    assert not np.array_equal(_step(data, offsets, shape, real, core, mask=(1, 6))[2], atoms)
    assert not np.array_equal(_step(data, offsets + 1, shape, real, core)[0], expected[0])


# -- steps too large for buffers of their own: placed in an arena shared with other steps ------------

def _arena_step(data, offsets, shape, real, core, work, junk):
    """``_step`` with the core's buffers placed in ``work`` (an arena) that other steps' junk ``junk`` filled
    first (a byte value): every element the step leaves must be its own run's."""
    work[:] = junk
    buffer = np.full(shape, 55, np.int8)
    target = buffer.view(np.uint8).reshape(shape[0] * shape[1], shape[2] * shape[3])
    fused = cna_core._fused_int8(data, offsets, target, buffer, divmod(real, shape[3]), core, work)
    assert fused is not None
    call, arguments, (out, sums) = fused
    call(*arguments)
    return out, sums, buffer


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.sampled_from([(3, 3), (1, 1), (5, 5), (2, 7)]), st.integers(1, 2),
       st.integers(1, 2), st.sampled_from([0, 2]), st.sampled_from([-128, 127, -9]), st.integers(1, 40),
       st.integers(1, 20), st.integers(0, 40))
def test_depthwise_arena_step_matches_the_reference(seed, kernel, stride, dilation, truncate, pad_value, channels,
                                                    extra, real_cut):
    """A depthwise layer with no buffers of its own (OWN_BUFFER_ELEMENTS 0): the step places them in an
    arena that holds junk before each of three runs (another step's values): outputs, their zero
    columns past the lanes and the window sums as the reference's."""
    geometry, x, w = depthwise_case(seed, kernel, stride, dilation, channels, max_height=6, max_width=9)
    surfaces = -(-channels // C2)
    shape = (surfaces, x.shape[1], x.shape[2], C2)
    out_channels, real = surfaces * C2 + extra, max(0, channels - real_cut)
    w.flags.writeable = False
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(depthwise_plan, "OWN_BUFFER_ELEMENTS", 0)
        core = depthwise_plan.prepare_depthwise_int8_atoms(shape, w, geometry, pad_value, truncate,
                                                           nm.ROUND_HALF_AWAY, out_channels)
    assert getattr(core, "depthwise_parts", None) is None
    rng, work = np.random.default_rng(seed), int8_core_step.arena(_Owner())
    for junk in (0x7F, 0xFF, 0x80):
        atoms = rng.integers(-128, 128, shape).astype(np.int8)
        data, offsets = _memory(rng, atoms, 7)
        out, planes, buffer = _arena_step(data, offsets, shape, real, core, work, junk)
        atoms = _expected_atoms(data, offsets, shape, real)
        expected = _depthwise_reference(atoms, channels, w, geometry, pad_value, truncate, nm.ROUND_HALF_AWAY,
                                        out_channels)
        assert np.array_equal(buffer, atoms) and _depthwise_agrees(out, planes, expected)


class _Owner:
    """An arena's owner (a Memory in the emulator: weak-referenceable)."""


@pytest.mark.skipif(not gemm_int8.available(), reason="no AVX-512 VNNI: the float32 path, no fused step")
@SETTINGS
@given(_convolutions())
def test_gemm_arena_step_matches_the_reference(case):
    """A convolution with no buffers of its own (OWN_BUFFER_ELEMENTS 0), its buffers in a junk-filled arena."""
    shape, channels, real, weights, geometry, out_channels, rng = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemm_conv_int8, "OWN_BUFFER_ELEMENTS", 0)
        core = gemm_conv_int8.prepare(shape, channels, real, weights, geometry, 0, 0, 0, out_channels,
                                      lambda name, size, dtype: np.empty(size, dtype))
    assert core is not None and core.gemm_parts is None and core.gemm_placed is not None
    work = int8_core_step.arena(_Owner())
    for junk in (0x7F, 0x80):
        atoms = rng.integers(-128, 128, shape).astype(np.int8)
        data, offsets = _memory(rng, atoms, 5)
        out, sums, buffer = _arena_step(data, offsets, shape, real, core, work, junk)
        atoms = _expected_atoms(data, offsets, shape, real)
        expected = _gemm_reference(atoms, channels, weights, geometry, out_channels)
        np.testing.assert_array_equal(buffer, atoms)
        np.testing.assert_array_equal(out, expected[0])
        np.testing.assert_array_equal(sums.reshape(-1), expected[1])


def test_arena_too_small_and_broken_zero_columns_are_caught():
    """A step whose buffers do not fit the arena takes the separate calls (no fused form); a step that
    skips its zero columns (the zero-tail flag cleared) leaves the arena's junk in them: caught."""
    geometry, x, w = depthwise_case(11, (3, 3), 1, 1, 20)
    w.flags.writeable = False
    shape, real = (2, x.shape[1], x.shape[2], C2), 18
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(depthwise_plan, "OWN_BUFFER_ELEMENTS", 0)
        core = depthwise_plan.prepare_depthwise_int8_atoms(shape, w, geometry, 3, 0, nm.ROUND_HALF_AWAY, 48)
    target = np.zeros((shape[0] * shape[1], shape[2] * shape[3]), np.uint8)
    data, offsets = _memory(np.random.default_rng(4), np.full(shape, 9, np.int8), 8)
    assert cna_core._fused_int8(data, offsets, target, np.zeros(shape, np.int8), (1, 2), core, np.zeros(64, np.uint8)) \
        is None
    work = int8_core_step.arena(_Owner())
    atoms = _expected_atoms(data, offsets, shape, real)
    expected = _depthwise_reference(atoms, 20, w, geometry, 3, 0, nm.ROUND_HALF_AWAY, 48)
    assert _depthwise_agrees(*_arena_step(data, offsets, shape, real, core, work, 0x11)[:2], expected)
    work[:] = 0x11
    buffer = np.zeros(shape, np.int8)
    call, arguments, (out, sums) = cna_core._fused_int8(
        data, offsets, buffer.view(np.uint8).reshape(target.shape), buffer, divmod(real, C2), core, work)
    arguments[-1][int8_core_step.DW_ZERO_TAIL] = 0  # (broken: the zero columns not written)
    call(*arguments)
    assert not _depthwise_agrees(out, sums, expected)


# -- whole steps: the CORE call with the DPU's stage chain after it (``int8_core_step.CHAINED``) -----

_CHAINED_SPECS = ["depthwise_5x5_s2_80ch", "depthwise_3x3_40ch", "depthwise_3x3_s2_40ch", "pointwise_70_kernels",
                  "depthwise_3x3_1px_40ch", "pointwise_1px_24_kernels"]
#: one-pixel layers (a squeeze-excite block's): a depthwise one's window sums reach the DPU as planes
_ONE_PIXEL = {"depthwise_3x3_1px_40ch": ConvSpec(in_c=40, in_h=1, in_w=1, kernels=40, kernel=3, pad_top=1, pad_left=1,
                                                 out_h=1, out_w=1, depthwise=True, pad_value=-2),
              "pointwise_1px_24_kernels": ConvSpec(in_c=40, in_h=1, in_w=1, kernels=24, out_h=1, out_w=1)}


def _chained_runs(monkeypatch, name, broken=False):
    """Ten runs of a two-task chain of layer ``name`` on a replaying machine and a full-path one
    (tests/emulator/test_task_plans.py), new inputs each run: how many chained calls ran, and whether
    every output equals the independent reference (test_machine_conv) and the full path's, with equal
    task records and register states. ``broken``: the chained calls skip the DPU's chain (no output
    written, reported done)."""
    from tests.emulator import test_task_plans as plans

    calls = [0]

    def counted(kernel):
        def run(*arguments):
            calls[0] += 1
            if broken:  # (the CORE part only: the chain's output rows left as they were)
                core = int8_core_step.depthwise_step if kernel.__name__.startswith("depthwise") \
                    else int8_core_step.gemm_step
                core(*arguments[:15 if core is int8_core_step.depthwise_step else 12])
                return True
            return kernel(*arguments)
        return run

    monkeypatch.setattr(int8_core_step, "CHAINED", {key: counted(kernel)
                                                    for key, kernel in int8_core_step.CHAINED.items()})
    monkeypatch.setattr(plans, "EXTRA", {**plans.EXTRA, **_ONE_PIXEL})
    spec = plans._spec(name)
    layer = plans.random_layer(spec, 0)
    fast, amount = plans._machine([(plans.conv_task(spec), plans.MASK_CONV)] * 2, False, layer, spec)
    slow, _ = plans._machine([(plans.conv_task(spec), plans.MASK_CONV)] * 2, True, layer, spec)
    rng, agree = np.random.default_rng(5), True
    for _ in range(plans.RUNS):
        x = rng.integers(-128, 128, (spec.in_c, spec.in_h, spec.in_w)).astype(np.int8)
        runs = []
        for machine in (fast, slow):
            plans.load_cube(machine, spec.feature, x)
            runs.append((machine.run_chain(plans.ADDRESS, amount).tasks, plans._output(machine, spec)))
        expected = plans._expected(spec, x, layer[1], layer[3])
        agree &= np.array_equal(runs[0][1], expected) and np.array_equal(runs[1][1], expected) \
            and runs[0][0] == runs[1][0] and plans._state(fast) == plans._state(slow)
    return calls[0], agree


@pytest.mark.parametrize("name", _CHAINED_SPECS)
def test_chained_steps_equal_the_reference_and_the_full_path(monkeypatch, name):
    calls, agree = _chained_runs(monkeypatch, name)
    assert agree
    if name.startswith("depthwise") or gemm_int8.available():  # (the VNNI convolution's steps only)
        assert calls > 0


def test_a_chained_step_skipping_its_dpu_chain_is_caught(monkeypatch):
    calls, agree = _chained_runs(monkeypatch, "depthwise_3x3_40ch", broken=True)
    assert calls > 0 and not agree
