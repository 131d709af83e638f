"""The int8 DPU's branch-free stage passes on atom lines (issue 20, kernels/dpu_stage_lines.py: BS,
EW, OUT_CVT with the rounding modes and flags worked out before the element loops) against
reference arithmetic on Python integers written here from NUMERICS.md 1, 2 and 4:

- every rounding mode (half-away, half-even, half-up, floor) at shifts -3..62, values up to
  +-2^61 (the callers keep |v| < 2^62), extreme int32 data, ALU and OUT_CVT operands;
- BS: ALU add / minus / off, MUL on / off with separate shifts for each sign, PReLU, ReLU, RELUX;
  operands one for the tensor or one a channel;
- EW: the operand converter on / off in each mode, the ALU add / minus or the multiplier with
  EW_TRUNCATE, PReLU, ReLU / RELUX; operands one a pixel ([S][P][C2]) or one a channel ([S][1][C2]);
- atom lines at offsets with gaps, channels not a multiple of the lanes, surfaces past them;
- settings the passes do not take (BN on, other ALU operations, shifts >= 63) are refused, and
  the prepared DPU kernel (dpu_atoms.prepare_stages_atoms) gives the same words either way."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_atoms, dpu_stage_lines as dl
from npuemu.emulator.kernels.dpu import CP_COUNT, EP_COUNT, XP_COUNT

I32 = (-(2**31), 2**31 - 1)
MODES = [nm.ROUND_HALF_AWAY, nm.ROUND_HALF_EVEN, nm.ROUND_HALF_UP, nm.ROUND_FLOOR]


def ref_shift(v: int, s: int, mode: int) -> int:
    """v / 2^s rounded by ``mode`` (NUMERICS.md 1) on Python integers."""
    if s <= 0:
        return v
    q, r = divmod(v, 1 << s)  # floor quotient, 0 <= r < 2^s
    half = 1 << (s - 1)
    if mode == nm.ROUND_FLOOR or r < half:
        return q
    if r > half:
        return q + 1
    if mode == nm.ROUND_HALF_AWAY:
        return q + 1 if v >= 0 else q
    if mode == nm.ROUND_HALF_UP:
        return q + 1
    return q + (q & 1)  # half-even


def clamp(v: int, low: int, high: int) -> int:
    return min(max(v, low), high)


def ref_relu(v: int, relu: bool, relux: bool, relux_value: int) -> int:
    return clamp(v, 0 if relu else -(2**62), relux_value if relux else 2**62)


def ref_element(d: int, alu: int, mul: int, e: int, c: dict) -> int:
    """One element through BS, EW and OUT_CVT as NUMERICS.md 4 states them."""
    v = d
    if c["bs_on"]:
        if c["bs_alu"]:
            v = v + alu if c["bs_algo"] == nm.ALU_ADD else v - alu
        if c["bs_mul"]:
            p = v * mul
            scaled = ref_shift(p, c["bs_pos"] if p >= 0 else c["bs_neg"], nm.ROUND_HALF_AWAY)
            v = v if (c["bs_prelu"] and v >= 0) else scaled
        v = ref_relu(clamp(v, *I32), c["bs_relu"], c["bs_relux"], c["bs_relux_value"])
    if c["ew_on"]:
        other = e
        if c["cvt_on"]:
            other = clamp(ref_shift((e + c["cvt_offset"]) * c["cvt_scale"], c["cvt_shift"], c["cvt_mode"]), *I32)
        if c["op_on"]:
            if c["op_mul"]:
                p = v * other
                scaled = ref_shift(p, c["ew_pos"] if p >= 0 else c["ew_neg"], nm.ROUND_HALF_AWAY)
                v = v if (c["ew_prelu"] and v >= 0) else scaled
            else:
                v = v + other if c["ew_algo"] == nm.ALU_ADD else v - other
        v = ref_relu(clamp(v, *I32), c["ew_relu"], c["ew_relux"], c["ew_relux_value"])
    return clamp(ref_shift(v * c["out_scale"], c["out_shift"], c["out_mode"]) + c["out_offset"],
                 c["out_low"], c["out_high"])


def registers(c: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """stages, bs, bn, ew, cvt vectors in kernels.dpu's XP_ / EP_ / CP_ layouts."""
    stages = np.array([c["bs_on"], c.get("bn_on", 0), c["ew_on"]], np.int64)
    bs = np.array([c["bs_algo"], c["bs_alu"], 0, c["bs_mul"], c["bs_pos"], c["bs_neg"], c["bs_prelu"],
                   c["bs_relu"], c["bs_relux"], c["bs_relux_value"]], np.int64)
    bn = np.zeros(XP_COUNT, np.int64)
    ew = np.array([c["cvt_on"], c["cvt_offset"], c["cvt_scale"], c["cvt_shift"], c["cvt_mode"], c["op_on"],
                   nm.EW_OP_MUL if c["op_mul"] else nm.EW_OP_ALU, c["ew_algo"], c["ew_pos"], c["ew_neg"],
                   c["ew_prelu"], c["ew_relu"], c["ew_relux"], c["ew_relux_value"]], np.int64)
    cvt = np.array([c["out_scale"], c["out_shift"], c["out_offset"], c["out_mode"], c["out_low"], c["out_high"]],
                   np.int64)
    assert bs.shape == (XP_COUNT,) and ew.shape == (EP_COUNT,) and cvt.shape == (CP_COUNT,)
    return stages, bs, bn, ew, cvt


i32 = st.integers(*I32)
shifts = st.integers(-3, 62)
flags = st.booleans()


@st.composite
def configs(draw):
    c = {"bs_on": draw(flags), "bs_alu": draw(flags), "bs_algo": draw(st.sampled_from([nm.ALU_ADD, nm.ALU_MINUS])),
         "bs_mul": draw(flags), "bs_pos": draw(st.integers(-3, 40)), "bs_neg": draw(st.integers(-3, 40)),
         "bs_prelu": draw(flags), "bs_relu": draw(flags), "bs_relux": draw(flags), "bs_relux_value": draw(i32),
         "ew_on": draw(flags), "cvt_on": draw(flags), "cvt_offset": draw(i32),
         "cvt_scale": draw(st.integers(-(2**15), 2**15)), "cvt_shift": draw(shifts),
         "cvt_mode": draw(st.sampled_from(MODES)), "op_on": draw(flags), "op_mul": draw(flags),
         "ew_algo": draw(st.sampled_from([nm.ALU_ADD, nm.ALU_MINUS])), "ew_pos": draw(st.integers(-3, 62)),
         "ew_neg": draw(st.integers(-3, 62)), "ew_prelu": draw(flags), "ew_relu": draw(flags),
         "ew_relux": draw(flags), "ew_relux_value": draw(i32),
         "out_scale": draw(st.integers(-(2**30), 2**30)), "out_shift": draw(shifts),
         "out_mode": draw(st.sampled_from(MODES)), "out_offset": draw(i32)}
    low, high = sorted([draw(i32), draw(i32)])
    c["out_low"], c["out_high"] = low, high
    if draw(flags):  # small multiplier shifts and ties often: the SE gates' no-shift case too
        c["bs_pos"] = c["bs_neg"] = c["ew_pos"] = c["ew_neg"] = draw(st.integers(0, 2))
    return c


def values(draw, shape, dtype, extreme):
    low, high = (np.iinfo(dtype).min, np.iinfo(dtype).max)
    pick = st.sampled_from([low, high, 0, -1, 1]) if extreme else st.integers(low, high)
    flat = draw(st.lists(st.one_of(pick, st.integers(low, high)), min_size=int(np.prod(shape)),
                         max_size=int(np.prod(shape))))
    return np.array(flat, dtype).reshape(shape)


@st.composite
def cases(draw):
    c = draw(configs())
    c2 = draw(st.sampled_from([8, 16]))
    channels = draw(st.integers(1, 3 * c2))
    surfaces = -(-channels // c2) + draw(st.integers(0, 1))  # one surface past the channels at times
    height, width = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    dtype = draw(st.sampled_from([np.int8, np.int32]))
    extreme = draw(flags)
    main = values(draw, (surfaces, height * width, c2), dtype, extreme)
    per_pixel = draw(flags)
    operand = values(draw, (surfaces, height * width if per_pixel else 1, c2), dtype, extreme)
    columns = surfaces * c2
    if draw(flags):  # one BS operand for the tensor (the SE gates) or one a channel
        row = [draw(i32), 0, draw(st.integers(-(2**29), 2**29))]
        bs_operands = np.array([[v] * columns for v in row], np.int64)
    else:
        bs_operands = np.stack([values(draw, (columns,), np.int32, extreme).astype(np.int64),
                                np.zeros(columns, np.int64),
                                np.array(draw(st.lists(st.integers(-(2**29), 2**29), min_size=columns,
                                                       max_size=columns)), np.int64)])
    gap = draw(st.integers(0, 5))
    offsets = np.array([(s * height + y) * (width * c2 + gap) + gap for s in range(surfaces) for y in range(height)],
                       np.int64)
    return c, c2, channels, height, width, main, operand, bs_operands, offsets


def expected(c, c2, channels, height, width, main, operand, bs_operands, offsets, size):
    out = [None] * size
    for s in range(offsets.shape[0] // height):
        for y in range(height):
            for x in range(width):
                for lane in range(c2):
                    channel, pixel = s * c2 + lane, y * width + x
                    at = offsets[s * height + y] + x * c2 + lane
                    if channel >= channels:
                        out[at] = 0
                        continue
                    e = int(operand[s, pixel if operand.shape[1] > 1 else 0, lane])
                    out[at] = ref_element(int(main[s, pixel, lane]), int(bs_operands[0, channel]),
                                          int(bs_operands[2, channel]), e, c)
    return out


@settings(max_examples=300, deadline=None)
@given(cases())
def test_stage_lines_match_reference(case):
    c, c2, channels, height, width, main, operand, bs_operands, offsets = case
    stages, bs, bn, ew, cvt = registers(c)
    lines = dl.lines_settings(stages, bs, ew, cvt)
    assert lines is not None
    size = int(offsets.max()) + width * c2 + 3
    out = np.full(size, 7, np.int64)
    dl.stage_lines_atoms(main, operand, stages, lines, bs_operands, ew, channels, height, width, out, offsets)
    want = expected(c, c2, channels, height, width, main, operand, bs_operands, offsets, size)
    got = [int(v) for v in out]
    assert got == [7 if w is None else w for w in want]


@settings(max_examples=150, deadline=None)
@given(st.integers(-(2**61), 2**61), st.integers(-3, 62), st.sampled_from(MODES), st.integers(-5, 5))
def test_out_cvt_rounding_every_mode(value, shift, mode, offset):
    c = {"bs_on": 0, "bs_alu": 0, "bs_algo": 2, "bs_mul": 0, "bs_pos": 0, "bs_neg": 0, "bs_prelu": 0,
         "bs_relu": 0, "bs_relux": 0, "bs_relux_value": 0, "ew_on": 0, "cvt_on": 0, "cvt_offset": 0,
         "cvt_scale": 1, "cvt_shift": 0, "cvt_mode": 0, "op_on": 0, "op_mul": 0, "ew_algo": 2, "ew_pos": 0,
         "ew_neg": 0, "ew_prelu": 0, "ew_relu": 0, "ew_relux": 0, "ew_relux_value": 0, "out_scale": 1,
         "out_shift": shift, "out_mode": mode, "out_offset": offset, "out_low": -(2**62), "out_high": 2**62}
    stages, bs, bn, ew, cvt = registers(c)
    lines = dl.lines_settings(stages, bs, ew, cvt)
    out = np.zeros(3, np.int64)
    block = np.array([value, -value, value | 1], np.int64)
    dl.cvt_line(block, out, lines)
    assert [int(v) for v in out] == [ref_shift(int(v), shift, mode) + offset for v in block]


def test_settings_not_taken():
    base = {"bs_on": 1, "bs_alu": 1, "bs_algo": nm.ALU_ADD, "bs_mul": 1, "bs_pos": 0, "bs_neg": 0, "bs_prelu": 0,
            "bs_relu": 0, "bs_relux": 0, "bs_relux_value": 0, "ew_on": 1, "cvt_on": 1, "cvt_offset": 0,
            "cvt_scale": 1, "cvt_shift": 3, "cvt_mode": 1, "op_on": 1, "op_mul": 1, "ew_algo": 2, "ew_pos": 0,
            "ew_neg": 0, "ew_prelu": 0, "ew_relu": 0, "ew_relux": 0, "ew_relux_value": 0, "out_scale": 1,
            "out_shift": 21, "out_mode": 1, "out_offset": 0, "out_low": -128, "out_high": 127}
    assert dl.lines_settings(*_no_bn(registers(base))) is not None
    for change in ({"bn_on": 1}, {"bs_algo": nm.ALU_MAX}, {"bs_algo": nm.ALU_DIV}, {"bs_pos": 63},
                   {"out_shift": 63}, {"cvt_shift": 70}, {"op_mul": 0, "ew_algo": nm.ALU_MIN}):
        assert dl.lines_settings(*_no_bn(registers({**base, **change}))) is None, change
    # settings a stage does not read do not matter
    assert dl.lines_settings(*_no_bn(registers({**base, "bs_alu": 0, "bs_algo": nm.ALU_DIV}))) is not None


def _no_bn(regs):
    stages, bs, bn, ew, cvt = regs
    return stages, bs, ew, cvt


@settings(max_examples=60, deadline=None)
@given(cases())
def test_prepared_kernel_same_words_as_general_passes(case):
    c, c2, channels, height, width, main, operand, bs_operands, offsets = case
    stages, bs, bn, ew, cvt = registers(c)
    bn_operands = np.zeros((0, bs_operands.shape[1]), np.int64)
    size = int(offsets.max()) + width * c2
    out, general = np.zeros(size, np.int64), np.zeros(size, np.int64)
    run = dpu_atoms.prepare_stages_atoms((stages, bs, bs_operands, bn, bn_operands, ew, cvt), channels, height,
                                         width, c2, out, offsets)
    assert run(main, operand if c["ew_on"] else None)
    dpu_atoms._stages_atoms(main, operand if c["ew_on"] else dpu_atoms._NO_OPERAND, stages, bs, bs_operands, bn,
                            bn_operands, ew, cvt, channels, height, width, general, offsets)
    assert np.array_equal(out, general)
