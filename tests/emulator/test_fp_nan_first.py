"""Two NaN operands in the fp DPU's element operations give the first one's NaN (issue 20, numerics.py
``nan_first``, NUMERICS.md 89): the EW stage's ALU add / minus / div and multiply and the X stages'
multiply, in loops long enough to vectorise and in the scalar tail, on the first operand's NaN of either
sign and the second's of the other. Found by hypothesis in test_dpu_fp_fused: the fused loop (512-bit
vectors) gave the EW operand's NaN where the passes gave the data's, LLVM being free to commute an fadd."""

import numpy as np
import pytest
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.dpu_fp_elements import ew_value, x_value

_NEGATIVE, _POSITIVE = np.uint32(0xFFC00000), np.uint32(0x7FC01234)


@njit(cache=False)
def _ew_loop(values, others, op_type, algo, out):
    for i in range(values.shape[0]):
        out[i] = ew_value(values[i], others[i], True, op_type, algo, False, False, False, np.float32(0))


@njit(cache=False)
def _x_loop(values, alu, mul, mul_first, out):
    for i in range(values.shape[0]):
        out[i] = x_value(values[i], nm.ALU_ADD, True, True, False, mul_first, False, False, np.float32(0), alu, mul)


def _nans(bits, count):
    return np.full(count, bits, np.uint32).view(np.float32)


@pytest.mark.parametrize("first, second", [(_NEGATIVE, _POSITIVE), (_POSITIVE, _NEGATIVE)])
@pytest.mark.parametrize("count", [7, 64, 67])
def test_the_first_operands_nan(first, second, count):
    quiet = first | np.uint32(0x00400000)
    for op_type, algo in ((nm.EW_OP_ALU, nm.ALU_ADD), (nm.EW_OP_ALU, nm.ALU_MINUS), (nm.EW_OP_ALU, nm.ALU_DIV),
                          (nm.EW_OP_MUL, nm.ALU_ADD)):
        out = np.empty(count, np.float32)
        _ew_loop(_nans(first, count), _nans(second, count), op_type, algo, out)
        assert (out.view(np.uint32) == quiet).all(), (op_type, algo)
    for mul_first in (False, True):
        out = np.empty(count, np.float32)
        _x_loop(_nans(first, count), np.float32(1), _nans(second, 1)[0], mul_first, out)
        assert (out.view(np.uint32) == quiet).all(), mul_first


def test_one_nan_operand_gives_it_as_before():
    """The second operand's NaN where the first is a number, as the plain operation gives it."""
    out = np.empty(64, np.float32)
    _ew_loop(np.ones(64, np.float32), _nans(_POSITIVE, 64), nm.EW_OP_ALU, nm.ALU_ADD, out)
    assert (out.view(np.uint32) == _POSITIVE).all()
    _ew_loop(np.full(64, np.inf, np.float32), np.full(64, -np.inf, np.float32), nm.EW_OP_ALU, nm.ALU_ADD, out)
    assert np.isnan(out).all()
