"""The DPU stage kernel's direct form with window sums per channel as int32 planes [C][OH][OW]
(issue 20, kernels/dpu_pixel_plan.py ``_planes_chain``: a depthwise CORE's group-major sums moved
into pixel rows a block at a time) against the per-element reference chain (tests/emulator/reference,
``expected_cube``): the folded and the EW row kernels, either rounding, ReLU or not, atoms holding
all the channels or the first ones, odd sizes, blocks of PLANE_PIXELS and a ragged last one,
sums past the chain's bound (the general run) - and a broken variant (the planes read one pixel
off) is caught."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels import dpu_pixel_plan
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from tests.emulator.test_dpu_pixel import as_atoms, expected_cube
from tests.emulator.test_kern_int8_passes import row_cases


def _planes_case(case, height_extra: int, big_sums: bool):
    """``row_cases``' case with per-channel window sums as C-contiguous planes, CPEND on, atoms
    holding no lane past the channels; None where it is not one ``_planes_chain`` takes."""
    data, _, (alu, cpend, mul), stages, operand, out_dtype, c2, surfaces = case
    bs = stages["bs"]
    channels, height, width = data.shape
    if bs is None or not bs.cpend_enable or surfaces * c2 > channels or channels < 2:
        return None
    rng = np.random.default_rng(channels * 31 + height_extra)
    height += height_extra  # (more pixels than a block: a ragged last block)
    data = np.resize(data, (channels, height, width)).astype(np.int32)
    operand = np.resize(operand, (channels, height, width)).astype(np.int32)
    top = 2**31 - 1 if big_sums else 2**10
    planes = rng.integers(-top, top + 1, (channels, height, width)).astype(np.int32)
    return data, planes, (alu, cpend, mul), stages, operand, out_dtype, c2, surfaces


def _run_direct(case):
    """``direct`` on the planes case: the atoms [S][H][W][C2] and the reference's, or None where
    the plan has no chain (no direct form)."""
    data, planes, (alu, cpend, mul), stages, operand, out_dtype, c2, surfaces = case
    channels, height, width = data.shape
    pixels, ew = height * width, stages["ew"]
    plan = dp.plan_stages(channels, out_dtype, np.int32, None if ew is None else np.int32, bs=stages["bs"],
                          bs_alu=alu, bs_cpend=cpend, bs_mul=mul, bn=stages["bn"], bn_alu=0, bn_mul=1, ew=ew,
                          cvt=stages["cvt"])
    atom_words = c2 * np.dtype(out_dtype).itemsize // 8
    words = np.full(surfaces * pixels * atom_words + 3, 0x5A5A5A5A5A5A5A5A, np.uint64)
    offsets = (1 + np.arange(surfaces * height) * width * atom_words).astype(np.int64)
    store = prepare_planned_to_atoms(plan, pixels, width, words, offsets, c2, surfaces)
    if store is None or store.direct is None:
        return None
    rows = np.ascontiguousarray(data.reshape(channels, pixels).T)[None]
    passed = None
    if ew is not None:
        if (operand == operand[:, :1, :1]).all():  # one per channel: [1][1][C]
            passed = np.ascontiguousarray(operand[:, 0, 0])[None, None, :]
        else:
            passed = np.ascontiguousarray(operand.reshape(channels, pixels).T)[None]
    store.direct(rows, planes, passed)
    got = words[1:1 + surfaces * pixels * atom_words].view(out_dtype).reshape(surfaces, height, width, c2)
    assert words[0] == words[-1] == words[-2] == 0x5A5A5A5A5A5A5A5A  # nothing written outside the rows
    expected = expected_cube(data, planes, alu, cpend, mul, (0, 1), operand, stages, out_dtype)
    return got, as_atoms(expected, c2, surfaces, out_dtype)


@settings(max_examples=120, deadline=None)
@given(row_cases(), st.sampled_from([0, 0, 1, 40]), st.booleans())
def test_planes_direct_matches_the_reference_chain(case, height_extra, big_sums):
    case = _planes_case(case, height_extra, big_sums)
    if case is None:
        return
    result = _run_direct(case)
    if result is None:
        return
    got, expected = result
    assert np.array_equal(got, expected)


def _mobilenet_planes_case():
    """A depthwise layer's task: 48 channels, 3 surfaces, 9 x 23 pixels (ragged blocks), BS
    CPEND + ALU + MUL, BN ReLU6, OUT_CVT to int8, sums per channel."""
    from tests.emulator.test_kern_int8_passes import relu_case
    data, _, operands, stages, operand, out_dtype, c2, surfaces = relu_case()
    rng = np.random.default_rng(11)
    channels, height, width = 48, 9, 23
    data = rng.integers(-(2**14), 2**14, (channels, height, width)).astype(np.int32)
    operands = [np.resize(row, channels) for row in operands]
    planes = rng.integers(-900, 900, (channels, height, width)).astype(np.int32)
    return data, planes, operands, stages, np.zeros_like(data), out_dtype, c2, 3


def test_planes_direct_takes_the_planes_kernel(monkeypatch):
    taken = []
    original = dpu_pixel_plan._planes_chain

    def counted(*args):
        taken.append(original(*args))
        return taken[-1]

    monkeypatch.setattr(dpu_pixel_plan, "_planes_chain", counted)
    got, expected = _run_direct(_mobilenet_planes_case())
    assert taken == [True]
    assert np.array_equal(got, expected)
    assert len(np.unique(expected)) > 20


def test_the_checks_catch_planes_read_one_pixel_off(monkeypatch):
    # broken on purpose: each plane read from the next pixel on
    original = dpu_pixel_plan._planes_chain

    def shifted(data, planes, *args):
        return original(data, np.ascontiguousarray(np.roll(planes, -1, axis=1)), *args)

    monkeypatch.setattr(dpu_pixel_plan, "_planes_chain", shifted)
    got, expected = _run_direct(_mobilenet_planes_case())
    assert not np.array_equal(got, expected)
