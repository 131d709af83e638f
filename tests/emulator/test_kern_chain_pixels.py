"""The float64 chain's pixel-major variant (``kernels.dpu_pixel._chain_pixels_to_atoms``,
NUMERICS.md 4.10): pixel-major inputs with window sums per pixel or per pixel and channel and
an EW operand per pixel, per channel or per tensor, against the per-element reference chain
(tests/emulator/reference) - each case checked to have run that variant - with wide channel
counts (several surfaces, atoms narrower than the channels), operands at their extremes and
the bytes around the atoms untouched."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import dpu_pixel
from tests.emulator.test_dpu_pixel import (
    SENTINEL, as_atoms, chain_stages, channel_blocks, expected_cube, run, vendor_settings,
)


def count_calls(monkeypatch, module, name, argument):
    """Replaces ``module.name`` (looked up by its callers at each call) by a wrapper that
    records each call's positional ``argument``; returns the list of records."""
    calls = []
    kernel = getattr(module, name)

    def counted(*args):
        calls.append(args[argument])
        return kernel(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


@pytest.fixture
def variant_calls(monkeypatch):
    return count_calls(monkeypatch, dpu_pixel, "_chain_pixels_to_atoms", 2)


def check(data, sums, operands, stages, operand, operand_kind, out_dtype, surfaces, calls):
    """Runs the pass with pixel-major data and compares with the reference chain."""
    alu, cpend, mul = operands
    channels = data.shape[0]
    c2 = 16 // np.dtype(out_dtype).itemsize
    bn_operands = (0, 1)  # the chain takes BN without ALU and MUL
    if operand_kind == "pixel":
        passed = channel_blocks(operand, "hwc", channels)
    elif operand_kind == "channel":
        operand = np.broadcast_to(operand[:, :1, :1], data.shape)
        passed = np.ascontiguousarray(operand[:, 0, 0])[None, None, :]
    else:
        operand = np.broadcast_to(operand[:1, :1, :1], data.shape)
        passed = np.array(operand[0, 0, 0], np.int32).reshape(1, 1, 1)
    before = len(calls)
    atoms, rest = run(data, "hwc", channels, out_dtype, c2, surfaces, bs=stages["bs"], bs_alu=alu,
                      bs_cpend=cpend, bs_mul=mul, window_sum=sums, bn=stages["bn"], bn_alu=bn_operands[0],
                      bn_mul=bn_operands[1], ew=stages["ew"], ew_operand=passed, cvt=stages["cvt"])
    expected = expected_cube(data, sums, alu, cpend, mul, bn_operands, operand, stages, out_dtype)
    assert np.array_equal(atoms, as_atoms(expected, c2, surfaces, out_dtype))
    assert np.all(rest.view(np.uint8) == SENTINEL)
    return len(calls) > before


# the fixture only counts calls; each example compares the count before and after
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1), st.sampled_from([16, 32, 48]) | st.integers(1, 40), st.integers(1, 3), st.integers(1, 5),
       st.sampled_from([2**7, 2**15, 2**31]), st.sampled_from(["shared", "pixel"]),
       st.sampled_from([2**10, 2**10, 2**16, 2**22, 2**30]), st.sampled_from(["pixel", "channel", "tensor"]),
       st.sampled_from([np.int8, np.int16, np.int32]), st.data())
def test_pixel_major_chain_matches_the_reference(variant_calls, seed, channels, height, width, magnitude,
                                                 sums_kind, window_magnitude, operand_kind, out_dtype, data):
    rng = np.random.default_rng(seed)
    cube = np.clip(rng.integers(-magnitude, magnitude + 1, (channels, height, width)),
                   -(2**31), 2**31 - 1).astype(np.int32)
    cube.flat[rng.integers(0, cube.size)] = data.draw(st.sampled_from([-(2**31), 2**31 - 1, 0]))
    groups = 1 if sums_kind == "shared" else channels
    sums = rng.integers(-window_magnitude, window_magnitude + 1, (height, width, groups))
    sums = np.ascontiguousarray(sums, np.int32).transpose(2, 0, 1)  # a pixel-major buffer as [G][H][W]
    limit = 2**15
    operands = [rng.integers(-(2**31), 2**31, channels), rng.integers(-limit, limit, channels),
                rng.integers(-limit, limit, channels)]
    for row in operands[1:]:
        row[rng.integers(0, channels)] = data.draw(st.sampled_from([-limit, limit - 1, 0]))
    operand = rng.integers(-(2**31), 2**31, cube.shape).astype(np.int32)
    c2 = 16 // np.dtype(out_dtype).itemsize
    # atoms narrower than the channels (only the first lanes computed) too
    surfaces = data.draw(st.integers(1, -(-channels // c2)))
    stages = data.draw(chain_stages())
    if data.draw(st.integers(0, 3)):  # mostly with CPEND on: the window sums' layouts
        stages["bs"] = dataclasses.replace(stages["bs"] or vendor_settings()[0], cpend_enable=True)
    ran = check(cube, sums, operands, stages, operand, operand_kind, out_dtype, surfaces, variant_calls)
    chain = dpu_pixel.chain_settings(
        stages["bs"], stages["bn"], stages["ew"], stages["cvt"], np.dtype(out_dtype),
        tuple(int(np.abs(row).max()) for row in operands), np.dtype(np.int32), np.dtype(np.int32))
    window_max = int(np.abs(sums).max()) if stages["bs"] is not None and stages["bs"].cpend_enable else 0
    # the variant takes atoms with no lane past the channels; the others run _chain_to_atoms
    assert ran == (chain is not None and window_max <= chain[1] and surfaces * c2 <= channels)
    if ran:  # with the window sums as laid out
        cpend = stages["bs"] is not None and stages["bs"].cpend_enable
        layout = dpu_pixel.SUMS_SHARED if groups == 1 else dpu_pixel.SUMS_PIXEL_MAJOR
        assert variant_calls[-1] == (layout if cpend else dpu_pixel.SUMS_NONE)


@pytest.mark.parametrize("sums_kind", ["shared", "pixel"])
@pytest.mark.parametrize("mul_top", [1, 2**15])
def test_pixel_major_chain_at_its_bound(variant_calls, sums_kind, mul_top):
    """MobileNetV2's task with the operands at their extremes: at the largest window sum the
    bound allows the variant runs, one past it the int64 stages do; both exact."""
    bs, bn, cvt = vendor_settings()
    channels = 48
    operands = [np.full(channels, 2**31 - 1), np.full(channels, -(2**15)), np.full(channels, mul_top)]
    _, limit = dpu_pixel.chain_settings(bs, bn, None, cvt, np.dtype(np.int8), (2**31 - 1, 2**15, mul_top),
                                        np.dtype(np.int32), np.dtype(np.int32))
    cube = np.array([[[-(2**31), 2**31 - 1, 1]]] * channels, np.int32)
    groups = 1 if sums_kind == "shared" else channels
    stages = {"bs": bs, "bn": bn, "ew": None, "cvt": cvt}
    for window, variant in ((limit, True), (limit + 1, False)):
        sums = np.ascontiguousarray(np.broadcast_to(np.array([window, -window, 1])[:, None], (3, groups)))
        sums = sums.T.reshape(groups, 1, 3)
        assert check(cube, sums, operands, stages, cube, "tensor", np.int8, 3, variant_calls) == variant
