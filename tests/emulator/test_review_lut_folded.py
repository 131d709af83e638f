"""Review (session 16) of kernels/lut_folded.py's clamp: for any after-LUT table and base, BN MUL of
any int32 value, BN shifts 1..62 alike or not per sign, BN ReLU / RELUX with any int32 compare
value, and a BS range from ReLU / RELUX (int32 ends included), every BS result in the range reads,
clamped into the folded span, the value of an independent Python reference: BN rounding half away
by the product's sign, int32 saturation, ReLU / RELUX, the int32 store, the table index clamped."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import lut_folded
from npuemu.emulator.kernels.dpu import _OPERAND_MATRICES, XStageConfig, _x_params

INT32 = st.integers(-(2**31), 2**31 - 1)


def _bn_reference(y: int, mul: int, pos: int, neg: int, relu: bool, relux: bool, relux_value: int) -> int:
    product = y * mul
    shift = pos if product >= 0 else neg
    magnitude = (abs(product) + (1 << (shift - 1))) >> shift  # half away from zero
    value = magnitude if product >= 0 else -magnitude
    value = min(max(value, -(2**31)), 2**31 - 1)
    if relu:
        value = max(value, 0)
    if relux:
        value = min(value, relux_value)
    return value


@settings(max_examples=400, deadline=None)
@given(INT32, st.integers(1, 62), st.integers(1, 62), st.booleans(), st.booleans(), INT32,
       st.booleans(), st.booleans(), INT32, st.integers(2, 40), st.integers(-(2**31), 2**31 - 1),
       st.integers(0, 2**32 - 1), st.data())
def test_a_clamped_bs_result_reads_the_reference_value(mul, pos, neg, relu, relux, relux_value, bs_relu, bs_relux,
                                                     bs_relux_value, size, base, seed, data):
    rng = np.random.default_rng(seed)
    alphabet = int(rng.integers(1, 4))  # (few values: runs of equal entries, equal ends)
    table = rng.integers(-alphabet, alphabet + 1, size).astype(np.int8)
    bn = XStageConfig(mul_enable=True, shift_positive=pos, shift_negative=neg, relu=relu, relux=relux,
                      relux_value=relux_value)
    bs = XStageConfig(alu_enable=True, mul_enable=True, shift_positive=8, shift_negative=8, relu=bs_relu,
                      relux=bs_relux, relux_value=bs_relux_value)
    matrix = _OPERAND_MATRICES.get(4, ((0, "ALU"), (mul, "MUL")), 2)
    folded = lut_folded.fold_tables.get(_x_params(bs), _x_params(bn), matrix, 4, table, base)
    bounds = lut_folded.bs_bounds(_x_params(bs))
    if folded is None:
        return
    low, high = bounds
    first, values = folded
    last = first + values.shape[0] - 1
    assert low <= first <= last <= high

    def want(y: int) -> int:
        stored = _bn_reference(y, mul, pos, neg, relu, relux, relux_value)
        stored = (stored + 2**31) % 2**32 - 2**31  # the int32 store
        return int(table[min(max(stored - base, 0), size - 1)])

    ys = {low, high, first, last, max(low, first - 1), min(high, last + 1)}
    ys |= {int(y) for y in rng.integers(low, high, 60, endpoint=True)}
    ys |= set(data.draw(st.lists(st.integers(low, high), max_size=20)))
    for y in ys:
        assert int(values[min(max(y, first), last) - first]) == want(y), y
