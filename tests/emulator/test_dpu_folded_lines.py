"""The folded chain written straight into the atom lines (issue 20, kernels/dpu_folded_lines.py,
NUMERICS.md 50) against per-element reference arithmetic written here on Python integers (BS,
BN's ReLU / RELUX, OUT_CVT: tests/emulator/reference), through the prepared DPU stage kernel's
``direct`` form as units/dpu_plan.py runs it (kernels/dpu_pixel_plan.py ``_window_chain`` /
``_rows_chain``):

- int8 atoms of 16 lanes, one to all of the channels' surfaces stored, lines with gaps between
  them (the words in between must stay as they were), several lines per surface;
- window sums none, one per pixel (a convolution's int64 [1][OH][OW]) and one per pixel and channel
  (a depthwise CORE's int32 [C][OH][OW] view of a [P][C] buffer), up to the chain's bound and past
  it (the general run then writes the same atoms);
- BS ALU / CPEND / MUL with shifts up to 24, BS and BN ReLU / RELUX, OUT_CVT scale >= 0 in both
  roundings, inputs up to 2**24;
- a kernel writing one surface's atoms into another's lines is caught."""

import dataclasses

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_folded_lines
from npuemu.emulator.kernels import dpu_pixel as dp
from npuemu.emulator.kernels.dpu import OutCvtConfig, XStageConfig
from npuemu.emulator.kernels.dpu_pixel import plan_stages
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from tests.emulator.reference import arithmetic as ref

GAP = 3  # words between two lines of the test layout
SENTINEL = np.uint64(0xA5A5A5A5A5A5A5A5)
_MODES = {nm.ROUND_HALF_EVEN: "half_even", nm.ROUND_HALF_AWAY: "half_away"}


@st.composite
def cases(draw):
    channels = draw(st.sampled_from([16, 24, 32, 40, 48, 64, 80]))
    surfaces = draw(st.integers(1, channels // 16))
    height, width = draw(st.integers(1, 4)), draw(st.integers(1, 9))
    window = draw(st.sampled_from(["none", "shared", "per-channel"]))
    shift = draw(st.integers(0, 24))
    bs = XStageConfig(alu_enable=draw(st.booleans()), mul_enable=True, shift_positive=shift, shift_negative=shift,
                      relu=draw(st.booleans()), relux=draw(st.booleans()),
                      relux_value=draw(st.integers(-3000, 2**31 - 1)), cpend_enable=window != "none")
    bn = draw(st.sampled_from([None, XStageConfig(relu=True), XStageConfig(relux=True, relux_value=90000),
                               XStageConfig(relu=True, relux=True, relux_value=draw(st.integers(0, 5000)))]))
    cvt = OutCvtConfig(draw(st.integers(0, 32767)), draw(st.integers(0, 24)), draw(st.integers(-128, 127)),
                       draw(st.sampled_from(sorted(_MODES))))
    top = draw(st.sampled_from([2**8, 2**16, 2**24]))
    past = window != "none" and draw(st.integers(0, 4)) == 0  # (sums past the chain's bound: the general run)
    return channels, surfaces, height, width, window, bs, bn, cvt, top, past, draw(st.integers(0, 2**32 - 1))


def _inputs(case):
    channels, surfaces, height, width, window, bs, bn, cvt, top, past, seed = case
    rng = np.random.default_rng(seed)
    pixels = height * width
    operands = dict(bs_alu=rng.integers(-5000, 5000, channels).astype(np.int32),
                    bs_cpend=rng.integers(-20, 20, channels).astype(np.int32),
                    bs_mul=rng.integers(-9000, 9000, channels).astype(np.int32))
    data = rng.integers(-top, top, (1, pixels, channels)).astype(np.int32)
    if window == "shared":
        sums = rng.integers(-(2**40) if past else -4000, 2**40 if past else 4000, (1, height, width))
    elif window == "per-channel":
        limit = 2**31 - 1 if past else 4000
        buffer = rng.integers(-limit, limit, (pixels, channels)).astype(np.int32)
        sums = buffer.T.reshape(channels, height, width)  # (the view the depthwise kernels hand over)
    else:
        sums = None
    return operands, data, sums


def _reference(case, operands, data, sums) -> np.ndarray:
    """[S * 16][P] int8 values of the reference chain for the stored channels."""
    channels, surfaces, height, width, window, bs, bn, cvt, _, _, _ = case
    bs_cfg = dataclasses.asdict(bs)
    bn_cfg = None if bn is None else dataclasses.asdict(bn)
    out = np.empty((surfaces * 16, height * width), np.int64)
    for c in range(surfaces * 16):
        for p in range(height * width):
            w = 0 if sums is None else int(sums[0 if window == "shared" else c].reshape(-1)[p])
            value = ref.bs(int(data[0, p, c]), w, int(operands["bs_alu"][c]), int(operands["bs_cpend"][c]),
                           int(operands["bs_mul"][c]), bs_cfg)
            if bn_cfg is not None:
                value = ref.bn(value, 0, 0, bn_cfg)
            out[c, p] = ref.out_cvt(value, cvt.scale, cvt.shift, cvt.offset, _MODES[cvt.round_mode], ref.INT8)
    return out


def _layout(surfaces, height, width):
    """Line offsets (words) with GAP words between lines, and the buffer."""
    line = width * 2 + GAP
    offsets = np.arange(surfaces * height, dtype=np.int64) * line + GAP
    return offsets, np.full(surfaces * height * line + GAP, SENTINEL, np.uint64)


def _read_atoms(words, offsets, surfaces, height, width) -> np.ndarray:
    """[S * 16][P] int8 read back from the lines."""
    out = np.empty((surfaces * 16, height * width), np.int64)
    for s in range(surfaces):
        for y in range(height):
            line = words[offsets[s * height + y]:offsets[s * height + y] + width * 2].view(np.int8).reshape(width, 16)
            out[s * 16:(s + 1) * 16, y * width:(y + 1) * width] = line.T
    return out


def _untouched(words, offsets, width) -> bool:
    mask = np.ones(words.shape[0], bool)
    for start in offsets:
        mask[start:start + width * 2] = False
    return bool(np.all(words[mask] == SENTINEL))


@settings(max_examples=80, deadline=None)
@given(cases())
def test_direct_store_equals_the_reference(case):
    channels, surfaces, height, width, window, bs, bn, cvt, _, past, _ = case
    operands, data, sums = _inputs(case)
    plan = plan_stages(channels, np.int8, np.int32, None, bs=bs, bn=bn, cvt=cvt, **operands)
    assume(plan.chain is not None)
    assert dpu_folded_lines.takes(plan.chain[0], 1, surfaces * 16, surfaces)  # (the lines kernel's form)
    offsets, words = _layout(surfaces, height, width)
    store = prepare_planned_to_atoms(plan, height * width, width, words, offsets, 16, surfaces)
    assert store is not None and store.direct is not None
    for _ in range(2):  # (a prepared store runs again on the same inputs: the same atoms)
        store.direct(data, sums, None)
        np.testing.assert_array_equal(_read_atoms(words, offsets, surfaces, height, width),
                                      _reference(case, operands, data, sums))
        assert _untouched(words, offsets, width)


def test_atoms_written_one_surface_off_are_caught():
    """The broken variant: the lines kernel handed the surfaces' line offsets rotated by one surface
    (each surface's atoms in the next one's lines) - the reference comparison fails; the right
    offsets pass."""
    case = (48, 3, 2, 5, "per-channel", XStageConfig(alu_enable=True, mul_enable=True, shift_positive=12,
                                                     shift_negative=12, relu=True, cpend_enable=True),
            None, OutCvtConfig(20000, 15, -3, nm.ROUND_HALF_EVEN), 2**16, False, 7)
    operands, data, sums = _inputs(case)
    plan = plan_stages(48, np.int8, np.int32, None, bs=case[5], cvt=case[7], **operands)
    want = _reference(case, operands, data, sums)
    flat_sums = np.ascontiguousarray(sums.reshape(48, -1).T).reshape(-1)
    for rotate, equal in ((0, True), (2, False)):
        offsets, words = _layout(3, 2, 5)
        dpu_folded_lines.folded_lines(data, flat_sums, dp.SUMS_PIXEL_MAJOR, plan.floats, plan.chain[0], 3, 5,
                                      np.roll(offsets, rotate), words)
        assert np.array_equal(_read_atoms(words, offsets, 3, 2, 5), want) == equal
