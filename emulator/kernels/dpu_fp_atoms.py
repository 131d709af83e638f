"""A flying fp16 DPU task's EW from its MRDMA atoms straight into its WDMA atoms (issue 20; NUMERICS.md,
section on the fp chain from atoms to atoms).

``dpu_fp_chain.fp16_step`` runs a flying task (its main cube read by the MRDMA) in three passes: the
atom rows widened into float32 [C][H][W] planes (``dpu_convert.widen_rows``), the chain over the planes
(``dpu_fp_fused.fused_chain``), the planes rounded into the WDMA's atom rows (``fp16_atoms``). When the
chain is EW alone (no BS / BN operation, no LUT) with an operand of one value or one a channel, each
element's result depends on its own value and its channel's operand only, and the source and target
atoms share their layout (C2 lanes a pixel, a row of W pixels a line): :func:`ew_atoms` runs each atom
row through the same three steps in pieces that stay in the L1 cache - the exact widening
(``fp16.fp16_bits_to_fp32_bits_native``, ``widen_rows``' F16C widening), ``dpu_fp_fused._element`` of the
task's form (the fused loop's own element code) and the canonical rounding
(``fp16.fp32_bits_to_fp16_bits_canonical``, ``fp16_atoms``' store) - lanes past the task's channels
stored as 0, as ``fp16_atoms`` stores them. Every element sees the same operations on the same
operands, so the same bits (tests/emulator/test_dpu_fp_atoms.py). The caller (``dpu_fp_chain.pack_step``'s
``atoms`` flag, units/dpu_plan_fp.py ``_atoms_form``) takes it only where no target row overlaps a source
row other than its own (a row read after a write to it would see the new bytes: the passes read all first).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from npuemu.emulator.kernels.dpu_fp_fused import F4, F5, F6, F7, _element, bounds
from npuemu.emulator.kernels.fp16 import fp16_bits_to_float32_native, fp32_bits_to_fp16_bits_canonical
from npuemu.emulator.kernels.lut_fp import _stack_table

#: elements of an atom row a piece takes (two float32 pieces of the caller's ``work``)
PIECE = 2048


@intrinsic
def _float_bits(typingctx, value):
    """The bits of float32 ``value`` as a uint32 (a register bitcast)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@njit(cache=True, inline="always")
def _piece(source, target, values, others, form, e, tables):
    # one piece, each element widened, through ``_element`` with the operand ``others[i]`` and rounded
    # into ``target`` in one loop (session 21: three loops through ``values`` took ~0.3 ns an element)
    no = None  # (no X stage)
    for i in range(source.size):
        value = _element(fp16_bits_to_float32_native(source[i]), others[i], form, no, np.float32(0), np.float32(1),
                         no, np.float32(0), np.float32(1), 0, tables, e)
        target[i] = fp32_bits_to_fp16_bits_canonical(_float_bits(value))


@njit(cache=True)
def _rows(main, sources, written, targets, height, line, c2, channels, operand, form, e, work):
    # every atom row through _piece (row r: surface r // height), the operand laid out a lane per element
    values, others = work[:PIECE], work[PIECE:2 * PIECE]
    # (``_element``'s LUT tables, unread with the LUT off: of their type)
    zero, off = np.float32(0), (False, False)
    k = (zero, zero, zero, zero, zero, zero, zero)
    tables = (_stack_table(), k, k, off, off, False, (zero, zero, zero, zero, zero, zero, zero, zero))
    lanes = np.empty(c2, np.float32)
    surface = -1
    for r in range(sources.size):
        if r // height != surface:  # (a new surface: its lanes' operands, 0 past the channels, a pixel apart)
            surface = r // height
            for lane in range(c2):
                channel = surface * c2 + lane
                lanes[lane] = operand[0] if operand.size == 1 else operand[channel] if channel < channels else 0
            for x in range(min(PIECE, line) // c2):
                for lane in range(c2):
                    others[x * c2 + lane] = lanes[lane]
        source, target = main[sources[r]:sources[r] + line], written[targets[r]:targets[r] + line]
        for start in range(0, line, PIECE):
            stop = min(start + PIECE, line)
            _piece(source[start:stop], target[start:stop], values, others, form, e, tables)
        real = channels - surface * c2
        if real < c2:  # (lanes past the channels: 0)
            for x in range(line // c2):
                target[x * c2 + max(real, 0):(x + 1) * c2] = 0


@njit(cache=True)
def ew_atoms(main, sources, written, targets, height, line, c2, channels, operand, form, e, work):
    """``main`` / ``written``: the source / target regions as uint16; ``sources`` / ``targets``: each atom
    row's first element (the same rows: surface r // ``height``), ``line`` elements a row (W x ``c2``,
    a multiple of ``c2`` dividing ``PIECE``); ``channels`` the task's; ``operand`` float32, one value or one
    a channel; ``form``: the index in ``dpu_fp_fused.FORMS`` (4 to 7: EW alone); ``e``: EW's (ReLU on,
    ReLUX on, ReLUX value); ``work``: float32, at least 2 x ``PIECE``."""
    bound = bounds(e[0], e[1], e[2])  # (EW's ReLU / ReLUX as ``_element`` takes them)
    if form == 4:
        _rows(main, sources, written, targets, height, line, c2, channels, operand, F4, bound, work)
    elif form == 5:
        _rows(main, sources, written, targets, height, line, c2, channels, operand, F5, bound, work)
    elif form == 6:
        _rows(main, sources, written, targets, height, line, c2, channels, operand, F6, bound, work)
    else:
        _rows(main, sources, written, targets, height, line, c2, channels, operand, F7, bound, work)
