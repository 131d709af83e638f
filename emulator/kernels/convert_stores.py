"""A DPU step's conversion and store as one compiled call (issue 20: silero-vad int8's four int -> fp16
conversions into its float islands and three fp16 -> int8 ones out of them, a run), so that a batch of fp16
steps (kernels/step_batch_fp16.py CONVERT, TO_INT8) takes it as an op of its table - the same kernels on the
same arrays as the step one by one:

- ``convert_store`` (units/dpu_plan_convert.py): the integer stages and conversion into float32 planes
  (kernels/dpu_int_to_fp16_step.py), then their fp16 rounding into the WDMA's atoms (kernels/fp16_atoms.py);
- ``int8_store`` (units/dpu_plan_fp.py, after the fp16 chain's call): ``dpu.float_output``'s fp16 -> int8
  conversion (kernels/dpu_convert.py ``fp_to_int``: OUT_CVT the identity, no MINUS_EXP) and ``dpu._write``'s
  store of the planes into the WDMA's atoms (``memory._scatter_planes``)."""

from __future__ import annotations

from numba import njit

from npuemu.emulator.kernels.dpu_convert import _round_saturate
from npuemu.emulator.kernels.dpu_int_to_fp16_step import int_atoms_to_planes
from npuemu.emulator.kernels.fp16_atoms import planes_to_fp16_atoms
from npuemu.emulator.memory import _scatter_planes

#: int8's range, as fp_to_int saturates to it (floats)
INT8_LOW, INT8_HIGH = -128.0, 127.0


@njit(cache=True)
def convert_store(region, offsets, height, lanes, bs, bs_operands, bn, bn_operands, operand, ew, scale, shift,
                  half_away, factor, lower, out, bits, c2, out_offsets, written) -> None:
    """``int_atoms_to_planes`` into ``out`` (float32 [C][H*W]), then ``planes_to_fp16_atoms`` of ``bits`` - the
    stored planes' fp32 bits, a uint32 [planes][H][W] view of ``out`` - into ``written`` at ``out_offsets``."""
    int_atoms_to_planes(region, offsets, height, lanes, bs, bs_operands, bn, bn_operands, operand, ew, scale, shift,
                        half_away, factor, lower, out)
    planes_to_fp16_atoms(bits, c2, out_offsets, written)


@njit(cache=True)
def int8_store(values, half_even, ints, planes, c2, offsets, data) -> None:
    """``values`` (the chain's float32 results, flat) rounded (``half_even``, else half away) and saturated into
    ``ints`` (int8, flat), then ``planes`` - a uint8 [channels][H][W] view of the stored channels of ``ints`` -
    into ``data`` at the rows ``offsets`` (C2 ``c2``)."""
    _round_saturate(values, half_even, INT8_LOW, INT8_HIGH, ints)
    _scatter_planes(planes, c2, offsets, data)

