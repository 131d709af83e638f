"""A flying int8 DPU task as one compiled call (issue 20, kernels/dpu_flying_lines.py: main cube and
EW operand read at their rows in memory, BS / EW / OUT_CVT per element, the atoms written at theirs)
against reference arithmetic on Python integers written here from NUMERICS.md 1, 2 and 4:

- BS: ALU add / minus / off with one operand for the tensor, MUL on (no shift) / off, ReLU, RELUX;
- EW: off, or the ALU add / minus, or the multiplier (no EW_TRUNCATE), ReLU / RELUX, the operand
  converter on / off in every rounding mode; the operand one a channel or one a pixel;
- OUT_CVT in every rounding mode, offsets and clamps that bind or not;
- multipliers large enough that the int32 saturations and ReLU bounds bite (the loop with the
  clamps) and small ones (the SE gates: the one-line form ``x = v * k + z``);
- rows at scattered offsets, channels not a multiple of the lanes, surfaces past them;
- forms it does not take (BN, PReLU, per-channel BS operands, a multiplier shift) are refused."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_flying_lines as fl
from npuemu.emulator.kernels import dpu_stage_lines as dl
from npuemu.emulator.kernels.dpu import CP_COUNT, EP_COUNT, XP_COUNT

I32 = (-(2**31), 2**31 - 1)
MODES = [nm.ROUND_HALF_AWAY, nm.ROUND_HALF_EVEN, nm.ROUND_HALF_UP, nm.ROUND_FLOOR]


def shifted(v: int, s: int, mode: int) -> int:
    """v / 2^s rounded by ``mode`` (NUMERICS.md 1), exactly, on Python integers."""
    if s <= 0:
        return v
    q, r = divmod(v, 1 << s)
    half = 1 << (s - 1)
    if r != half:
        return q + int(r > half and mode != nm.ROUND_FLOOR)
    return {nm.ROUND_FLOOR: q, nm.ROUND_HALF_UP: q + 1, nm.ROUND_HALF_AWAY: q + int(v >= 0),
            nm.ROUND_HALF_EVEN: q + (q & 1)}[mode]


def within(v: int, low: int, high: int) -> int:
    return min(max(v, low), high)


def relu(v: int, on: bool, x_on: bool, x_value: int) -> int:
    return within(v, 0 if on else -(2**62), x_value if x_on else 2**62)


def element(d: int, e: int, c: dict) -> int:
    """One element through BS, EW and OUT_CVT as NUMERICS.md 4 states them."""
    v = d
    if c["bs_on"]:
        if c["bs_alu"]:
            v = v + c["alu"] if c["bs_algo"] == nm.ALU_ADD else v - c["alu"]
        if c["bs_mul"]:
            v = v * c["mul"]
        v = relu(within(v, *I32), c["bs_relu"], c["bs_relux"], c["bs_relux_value"])
    if c["ew_on"]:
        if c["cvt_on"]:
            e = within(shifted((e + c["cvt_offset"]) * c["cvt_scale"], c["cvt_shift"], c["cvt_mode"]), *I32)
        if c["op_on"]:
            if c["op_mul"]:
                v = v * e
            else:
                v = v + e if c["ew_algo"] == nm.ALU_ADD else v - e
        v = relu(within(v, *I32), c["ew_relu"], c["ew_relux"], c["ew_relux_value"])
    return within(shifted(v * c["out_scale"], c["out_shift"], c["out_mode"]) + c["out_offset"], c["low"], c["high"])


def registers(c: dict):
    """stages, bs, ew, cvt vectors in kernels.dpu's XP_ / EP_ / CP_ layouts."""
    stages = np.array([c["bs_on"], c.get("bn_on", 0), c["ew_on"]], np.int64)
    bs = np.array([c["bs_algo"], c["bs_alu"], 0, c["bs_mul"], c.get("bs_shift", 0), c.get("bs_shift", 0),
                   c.get("bs_prelu", 0), c["bs_relu"], c["bs_relux"], c["bs_relux_value"]], np.int64)
    ew = np.array([c["cvt_on"], c["cvt_offset"], c["cvt_scale"], c["cvt_shift"], c["cvt_mode"], c["op_on"],
                   nm.EW_OP_MUL if c["op_mul"] else nm.EW_OP_ALU, c["ew_algo"], 0, 0, 0, c["ew_relu"],
                   c["ew_relux"], c["ew_relux_value"]], np.int64)
    cvt = np.array([c["out_scale"], c["out_shift"], c["out_offset"], c["out_mode"], c["low"], c["high"]], np.int64)
    assert bs.shape == (XP_COUNT,) and ew.shape == (EP_COUNT,) and cvt.shape == (CP_COUNT,)
    return stages, bs, ew, cvt


flags = st.booleans()


@st.composite
def configs(draw):
    big = draw(flags)  # multipliers that push past int32 and the ReLU bounds, or the SE gates' small ones
    factor = st.integers(-(2**30), 2**30) if big else st.integers(-4, 300)
    c = {"bs_on": draw(flags), "bs_alu": draw(flags), "bs_algo": draw(st.sampled_from([nm.ALU_ADD, nm.ALU_MINUS])),
         "alu": draw(st.integers(-(2**31) + 1, 2**31 - 1) if big else st.integers(-200, 200)),
         "bs_mul": draw(flags), "mul": draw(factor), "bs_relu": draw(flags), "bs_relux": draw(flags),
         "bs_relux_value": draw(st.integers(*I32) if big else st.integers(-50, 2**20)),
         "ew_on": draw(flags), "cvt_on": draw(flags), "cvt_offset": draw(st.integers(-300, 300)),
         "cvt_scale": draw(factor), "cvt_shift": draw(st.integers(0, 40)), "cvt_mode": draw(st.sampled_from(MODES)),
         "op_on": draw(flags), "op_mul": draw(flags), "ew_algo": draw(st.sampled_from([nm.ALU_ADD, nm.ALU_MINUS])),
         "ew_relu": draw(flags), "ew_relux": draw(flags),
         "ew_relux_value": draw(st.integers(*I32) if big else st.integers(-50, 2**20)),
         "out_scale": draw(st.integers(-(2**30), 2**30) if big else st.integers(-(2**12), 2**12)),
         "out_shift": draw(st.integers(0, 62) if big else st.integers(0, 14)),  # (small: outputs not all clamped)
         "out_mode": draw(st.sampled_from(MODES)), "out_offset": draw(st.integers(-300, 300))}
    c["low"], c["high"] = sorted(draw(st.sampled_from([(-128, 127), (-5, 9), (-100, 60)])))
    if draw(flags):  # ties: a small shift and scale (the output not clamped)
        c["out_shift"], c["out_scale"] = draw(st.integers(0, 3)), draw(st.integers(-3, 3))
    return c


@st.composite
def cases(draw):
    c = draw(configs())
    c2 = 16
    channels = draw(st.integers(1, 3 * c2))
    needed = -(-channels // c2)
    surfaces = needed + draw(st.integers(0, 1))  # the WDMA's surfaces: at times one past the channels
    height, width = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    per_pixel = c["ew_on"] and draw(flags)
    run = width * c2
    main = np.array(draw(st.lists(st.integers(-128, 127), min_size=needed * height * run,
                                  max_size=needed * height * run)), np.int8)
    operand = np.array(draw(st.lists(st.integers(-128, 127), min_size=needed * (height * run if per_pixel else c2),
                                     max_size=needed * (height * run if per_pixel else c2))), np.int8)
    # rows in reversed order with gaps between them (the offsets place them, not their order)
    gap = draw(st.integers(0, 5))
    rows = (np.arange(surfaces * height)[::-1] * (run + gap) + gap).astype(np.int64)
    return c, c2, channels, height, width, main, operand, per_pixel, rows


def expected(c, c2, channels, height, width, main, operand, per_pixel, rows, size):
    out = [None] * size
    run = width * c2
    for s in range(rows.shape[0] // height):
        for y in range(height):
            for i in range(run):
                at, lane = rows[s * height + y] + i, i % c2
                if s * c2 + lane >= channels:
                    out[at] = 0
                    continue
                e = int(operand[(s * height + y) * run + i] if per_pixel else operand[s * c2 + lane]) \
                    if c["ew_on"] else 0
                out[at] = element(int(main[(s * height + y) * run + i]), e, c)
    return out


def _run(kernel, case):
    c, c2, channels, height, width, main, operand, per_pixel, rows = case
    stages, bs, ew, cvt = registers(c)
    lines = dl.lines_settings(stages, bs, ew, cvt)
    bs_operands = np.array([[c["alu"]] * 64, [0] * 64, [c["mul"]] * 64], np.int64)
    form = fl.flying_form(stages, lines, bs_operands, channels, rows.shape[0] // height, c2, np.dtype(np.int8))
    assert form is not None
    size = int(rows.max()) + width * c2 + 3
    out = np.full(size, 99, np.int8)
    main_rows = np.arange(main.size // (width * c2), dtype=np.int64) * width * c2
    operand_rows = np.arange(operand.size // (width * c2 if per_pixel else c2), dtype=np.int64) * (
        width * c2 if per_pixel else c2)
    kernel(main, main_rows, operand if c["ew_on"] else np.zeros(1, np.int8), operand_rows, per_pixel, form,
           channels, height, width, c2, out, rows)
    want = expected(c, c2, channels, height, width, main, operand, per_pixel, rows, size)
    return [int(v) for v in out], [99 if w is None else w for w in want]


@settings(max_examples=400, deadline=None)
@given(cases())
def test_flying_lines_match_reference(case):
    got, want = _run(fl.flying_lines, case)
    assert got == want


@st.composite
def gate_cases(draw):
    """The SE gates' form around EW's clamp: a per-channel operand converted to values of either
    sign, ReLU / RELUX on or off - lanes whose line of values stays inside the clamp (one-line
    form) or crosses it (the clamped loop) in one surface."""
    c, c2, channels, height, width, main, operand, _, rows = draw(cases())
    c.update({"bs_on": 1, "bs_alu": 1, "bs_mul": 1, "bs_relu": 0, "bs_relux": 0, "alu": draw(st.integers(-150, 150)),
              "mul": draw(st.integers(-3, 3)), "ew_on": 1, "cvt_on": 1, "cvt_offset": draw(st.integers(-200, 200)),
              "cvt_scale": draw(st.integers(1, 3)), "cvt_shift": 0, "op_on": 1, "op_mul": draw(flags),
              "ew_relux_value": draw(st.integers(-5, 3000)), "out_scale": draw(st.integers(-300, 300)),
              "out_shift": draw(st.integers(0, 8))})
    lanes = -(-channels // c2) * c2  # (one operand a channel: the cases' per-pixel ones are not used)
    operand = np.array(draw(st.lists(st.integers(-128, 127), min_size=lanes, max_size=lanes)), np.int8)
    return c, c2, channels, height, width, main, operand, False, rows


@settings(max_examples=300, deadline=None)
@given(gate_cases())
def test_gate_form_at_ews_clamp(case):
    got, want = _run(fl.flying_lines, case)
    assert got == want


@njit
def _rounded(values, shift, add, away, odd):
    return [fl._round(v, shift, add, away, odd) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**61), 2**61), min_size=1, max_size=8), st.integers(0, 62), st.sampled_from(MODES))
def test_rounding_every_mode(values, shift, mode):
    """``_round`` on ``_round_form``'s numbers: NUMERICS.md 1's rounding, ties among the values."""
    if shift:
        values += [(v >> shift << shift) + (1 << (shift - 1)) for v in values]  # (their ties)
    form = fl._round_form(dl._rounding(shift, mode))
    got = _rounded(np.array(values, np.int64), *form)
    assert [int(v) for v in got] == [shifted(v, shift, mode) for v in values]


def test_both_loops_run():
    """The SE gates' settings take the one-line form; a multiplier past int32 keeps the clamps."""
    c = {"alu": 100, "mul": 1, "bs_on": 1, "bs_alu": 1, "bs_algo": nm.ALU_ADD, "bs_mul": 1, "bs_relu": 0,
         "bs_relux": 0, "bs_relux_value": 0}
    lines = dl.lines_settings(*registers({**c, "ew_on": 1, "cvt_on": 1, "cvt_offset": 128, "cvt_scale": 1,
                                          "cvt_shift": 0, "cvt_mode": 1, "op_on": 1, "op_mul": 1, "ew_algo": 2,
                                          "ew_relu": 0, "ew_relux": 0, "ew_relux_value": 0, "out_scale": 20000,
                                          "out_shift": 21, "out_mode": 1, "out_offset": -90, "low": -128,
                                          "high": 127}))
    bs_operands = np.array([[100] * 16, [0] * 16, [1] * 16], np.int64)
    form = fl.flying_form(np.array([1, 0, 1]), lines, bs_operands, 16, 1, 16, np.dtype(np.int8))
    f, g, k, z = (np.zeros(16, np.int64) for _ in range(4))
    fl._lane_factors(f, g, np.arange(16, dtype=np.int8), 0, form, 16, 16)
    assert fl._linear(k, z, f, g, form, 16)
    f[3] = 2**25  # (an operand the converter could not make from int8: EW's int32 clamp bites)
    assert not fl._linear(k, z, f, g, form, 16)


def test_forms_not_taken():
    base = {"alu": 3, "mul": 5, "bs_on": 1, "bs_alu": 1, "bs_algo": nm.ALU_ADD, "bs_mul": 1, "bs_relu": 0,
            "bs_relux": 0, "bs_relux_value": 0, "ew_on": 1, "cvt_on": 0, "cvt_offset": 0, "cvt_scale": 1,
            "cvt_shift": 0, "cvt_mode": 1, "op_on": 1, "op_mul": 1, "ew_algo": 2, "ew_relu": 0, "ew_relux": 0,
            "ew_relux_value": 0, "out_scale": 1, "out_shift": 4, "out_mode": 1, "out_offset": 0, "low": -128,
            "high": 127}
    uniform = np.array([[3] * 16, [0] * 16, [5] * 16], np.int64)

    def form(c, operands=uniform):
        stages, bs, ew, cvt = registers(c)
        lines = dl.lines_settings(stages, bs, ew, cvt)
        return None if lines is None else fl.flying_form(stages, lines, operands, 16, 1, 16, np.dtype(np.int8))

    assert form(base) is not None
    per_channel = uniform.copy()
    per_channel[0, 5] = 4
    assert form(base, per_channel) is None
    for change in ({"bn_on": 1}, {"bs_shift": 2}, {"bs_prelu": 1}, {"out_scale": 2**31}):
        assert form({**base, **change}) is None, change


def test_the_int32_line_takes_lanes_to_the_bound_and_no_further():
    """``_narrow``: the SE gates' small lines take the int32-factor loop (the cases above go through them), a line
    whose largest |x| + addend + 1 + |offset| reaches 2^31 keeps the int64 loop; a shift past 30 too."""
    form = np.zeros(fl.F_COUNT, np.int64)
    form[fl.F_SHIFT], form[fl.F_ROUND_ADD], form[fl.F_OFFSET], form[fl.F_LOW], form[fl.F_HIGH] = 8, 127, -90, -128, 127
    k32, z32 = np.zeros(16, np.int32), np.zeros(16, np.int32)
    k, z = np.full(16, 3, np.int64), np.full(16, -7, np.int64)
    assert fl._narrow(k32, z32, k, z, form, 16) and list(k32) == [3] * 16 and list(z32) == [-7] * 16
    room = 2**31 - 1 - 127 - 1 - 90
    k[5], z[5] = 1, room - 127  # (127 * k + z at the room exactly)
    assert fl._narrow(k32, z32, k, z, form, 16)
    z[5] += 1
    assert not fl._narrow(k32, z32, k, z, form, 16)
    z[5] = -(room - 128)  # (-128 * k + z at -room)
    assert fl._narrow(k32, z32, k, z, form, 16)
    z[5] -= 1
    assert not fl._narrow(k32, z32, k, z, form, 16)
    z[5], form[fl.F_SHIFT] = 0, 31
    assert not fl._narrow(k32, z32, k, z, form, 16)


@settings(max_examples=200, deadline=None)
@given(st.integers(-2**23, 2**23), st.integers(-2**30, 2**30), st.integers(0, 30), st.sampled_from(MODES),
       st.integers(-300, 300))
def test_the_int32_line_equals_the_int64_one_near_its_bound(k, z, shift, mode, offset):
    """Lines whose |x| comes near 2^31: where ``_narrow`` takes them, the int32 loop's elements are the int64
    loop's (``_round`` on int64), element for element over every int8 input."""
    form = np.zeros(fl.F_COUNT, np.int64)
    shift_, add, away, odd = fl._round_form(dl._rounding(shift, mode))
    form[fl.F_SHIFT], form[fl.F_ROUND_ADD], form[fl.F_AWAY], form[fl.F_ODD] = shift_, add, away, odd
    form[fl.F_OFFSET], form[fl.F_LOW], form[fl.F_HIGH] = offset, -128, 127
    ks, zs = np.full(16, k, np.int64), np.full(16, z, np.int64)
    k32, z32 = np.zeros(16, np.int32), np.zeros(16, np.int32)
    if not fl._narrow(k32, z32, ks, zs, form, 16):
        return
    source = np.repeat(np.arange(-128, 128, dtype=np.int8), 16)  # (every input in every lane)
    line = np.zeros(source.size, np.int8)
    _narrow_line(line, source, 256, 16, k32, z32, np.int32(shift_), np.int32(add), np.int32(away), np.int32(odd),
                 np.int32(offset), np.int32(-128), np.int32(127))
    wide = [min(max(int(fl._round(np.int64(v) * k + z, shift_, add, away, odd)) + offset, -128), 127)
            for v in source.tolist()]
    assert [int(v) for v in line] == wide


@njit
def _narrow_line(line, source, width, c2, k32, z32, shift, add, away, odd, offset, low, high):
    fl._line32(line, source, width, c2, k32, z32, shift, add, away, odd, offset, low, high)
