"""The integer DPU's float64 chain (NUMERICS.md 4.9) on NC1HWC2 atoms in, atoms out (issue 20): a
flying DPU task's main cube as the MRDMA reads it ([S][P][C2] atoms) and its EW operand as the
ERDMA reads it ([S][P or 1][C2]), written as the WDMA's atoms of the same C2 - element by element
in place of ``dpu_pixel.planned_to_atoms``'s way there (the atoms made pixel-major int32, the
operand likewise, the chain on pixel rows, a tile, the atoms stored: four passes more).

Each element's value is ``dpu_pixel._chain_value`` on the same inputs (the formula every chain
kernel runs: ``_chain_loop``), with no window sums (flying mode has none: 0, CPEND off), so the
same numbers; lanes past the channels are written 0 as the WDMA writes them. The three flags
``_chain_value`` branches on (EW on, OUT_CVT half-even, BS's clamp from 0) are literals of eight
compiled loops (one loop a function: LLVM vectorises each over the C2 lanes).

Settings without a chain (an EW multiply: the SE gates' per-channel products) run the int64 stages
``dpu_pixel._stages_to_atoms`` runs - the same block functions of ``kernels.dpu`` on the same
values - on each line of atoms (``_stages_atoms``), the per-channel operands tiled over a line.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import dpu_stage_lines
from npuemu.emulator.kernels.dpu import (
    CP_HIGH, CP_LOW, CP_MODE, CP_OFFSET, CP_SCALE, CP_SHIFT, EP_CVT_MODE, EP_CVT_OFFSET, EP_CVT_ON, EP_CVT_SCALE,
    EP_CVT_SHIFT, _bn_block, _bs_block, _ew_block, _out_cvt_flat,
)
from npuemu.emulator.kernels.dpu_pixel import (
    CH_EVEN, CH_EW_ADD, CH_EW_EVEN, CH_EW_HIGH, CH_EW_K, CH_EW_LOW, CH_EW_OFFSET, CH_EW_ON, CH_HIGH, CH_HIGH1, CH_K,
    CH_LOW, CH_LOW1, CH_OFFSET, _chain_value,
)
from npuemu.emulator.kernels.dpu_stage_lines import _uniform  # (one copy: the lines passes use it too)
from npuemu.emulator.memory import rows_back_to_back


@njit(cache=True, inline="always")
def _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, ew_on, even, relu):
    """Surface s, line y: main[s, y * W:(y + 1) * W] (C2 lanes each) -> out[offsets[s * H + y]:]
    (W atoms of C2 elements); ``operand`` [S][P][C2] or [S][1][C2] (read with ``ew_on`` only).
    A line is one flat run of W * C2 elements: the per-channel operands (and a per-channel EW
    operand) are tiled over a line once per surface, so the loop reads every input contiguously."""
    low1, high1, ew_offset, ew_k = chain[CH_LOW1], chain[CH_HIGH1], chain[CH_EW_OFFSET], chain[CH_EW_K]
    ew_even, ew_add, ew_low, ew_high = chain[CH_EW_EVEN] != 0, chain[CH_EW_ADD], chain[CH_EW_LOW], \
        chain[CH_EW_HIGH]
    k, offset, low, high = chain[CH_K], chain[CH_OFFSET], chain[CH_LOW], chain[CH_HIGH]
    surfaces, c2 = offsets.shape[0] // height, main.shape[2]
    if height == 1 and width == 1 and rows_back_to_back(offsets, c2):
        _atoms_flat(main, operand, floats, channels, surfaces * c2, out[offsets[0]:], low1, high1, ew_offset, ew_k,
                    ew_even, ew_add, ew_low, ew_high, k, offset, low, high, ew_on, even, relu)
        return
    if height == 1 and width == 1:  # (an atom a surface: its lanes' operands read in place, no lines tiled)
        for s in range(surfaces):
            used, first = min(max(channels - s * c2, 0), c2), s * c2
            line = out[offsets[s]:offsets[s] + c2]
            for lane in range(used):
                line[lane] = _chain_value(main[s, 0, lane], 0.0, 0.0, floats[0, first + lane], floats[2, first + lane],
                                          operand[s, 0, lane] if ew_on else 0, low1, high1, ew_offset, ew_k, ew_even,
                                          ew_add, ew_low, ew_high, k, offset, low, high, ew_on, even, relu)
            line[used:] = 0
        return
    per_pixel = operand.shape[1] > 1
    run = width * c2
    alu, mul = np.zeros(run, np.float64), np.ones(run, np.float64)
    tiled = np.zeros(run if ew_on and not per_pixel else 1, operand.dtype)
    for s in range(surfaces):
        used = min(max(channels - s * c2, 0), c2)
        first = s * c2
        if used == 0:  # a surface past the channels (and past the main cube's): zeros
            for y in range(height):
                out[offsets[s * height + y]:offsets[s * height + y] + run] = 0
            continue
        for x in range(width):
            for lane in range(used):
                alu[x * c2 + lane] = floats[0, first + lane]
                mul[x * c2 + lane] = floats[2, first + lane]
            if ew_on and not per_pixel:
                for lane in range(c2):
                    tiled[x * c2 + lane] = operand[s, 0, lane]
        flat = main[s].reshape(-1)
        for y in range(height):
            line = out[offsets[s * height + y]:offsets[s * height + y] + run]
            d = flat[y * run:(y + 1) * run]
            e = operand[s].reshape(-1)[y * run:(y + 1) * run] if ew_on and per_pixel else tiled
            for i in range(run):
                line[i] = _chain_value(d[i], 0.0, 0.0, alu[i], mul[i], e[i] if ew_on else 0, low1, high1, ew_offset,
                                       ew_k, ew_even, ew_add, ew_low, ew_high, k, offset, low, high, ew_on, even, relu)
            if used < c2:  # lanes past the channels: 0, as the WDMA writes them
                for x in range(width):
                    for lane in range(used, c2):
                        line[x * c2 + lane] = 0


@njit(cache=True, inline="always")
def _atoms_flat(main, operand, floats, channels, run, line, low1, high1, ew_offset, ew_k, ew_even, ew_add, ew_low,
                ew_high, k, offset, low, high, ew_on, even, relu):
    # ``_atoms_loop`` on 1x1 maps whose atoms follow each other in the output: element i of the surfaces' atoms
    # (main's, the operand's, the output's) is channel i, so one run over the channels with the operands of
    # each, the same ``_chain_value`` on the same values, the lanes past the channels (and the surfaces past
    # them) 0 (silero-vad's 128-576 channel vectors: a surface a loop of 16 cost ~45 ns, ~3 ns an element)
    d, e = main.reshape(-1), operand.reshape(-1)
    count = min(channels, run)
    for i in range(count):
        line[i] = _chain_value(d[i], 0.0, 0.0, floats[0, i], floats[2, i], e[i] if ew_on else 0, low1, high1,
                               ew_offset, ew_k, ew_even, ew_add, ew_low, ew_high, k, offset, low, high, ew_on, even,
                               relu)
    line[count:run] = 0


# contract: as dpu_pixel._chain_flat's (every product and sum exact: fused or not, the same numbers)
@njit(cache=True, fastmath={"contract"})
def _atoms_ew_even_relu(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, True, True, True)


@njit(cache=True, fastmath={"contract"})
def _atoms_ew_even(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, True, True, False)


@njit(cache=True, fastmath={"contract"})
def _atoms_ew_away_relu(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, True, False, True)


@njit(cache=True, fastmath={"contract"})
def _atoms_ew_away(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, True, False, False)


@njit(cache=True, fastmath={"contract"})
def _atoms_even_relu(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, False, True, True)


@njit(cache=True, fastmath={"contract"})
def _atoms_even(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, False, True, False)


@njit(cache=True, fastmath={"contract"})
def _atoms_away_relu(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, False, False, True)


@njit(cache=True, fastmath={"contract"})
def _atoms_away(main, operand, floats, chain, channels, height, width, out, offsets):
    _atoms_loop(main, operand, floats, chain, channels, height, width, out, offsets, False, False, False)


_LOOPS = {(True, True, True): _atoms_ew_even_relu, (True, True, False): _atoms_ew_even,
          (True, False, True): _atoms_ew_away_relu, (True, False, False): _atoms_ew_away,
          (False, True, True): _atoms_even_relu, (False, True, False): _atoms_even,
          (False, False, True): _atoms_away_relu, (False, False, False): _atoms_away}

_NO_OPERAND = np.zeros((1, 1, 1), np.int8)


@njit(cache=True)
def _spread(add, mul, operands, add_row, mul_row, first, used, width, c2):
    """A surface's per-channel operands (rows ``add_row`` / ``mul_row``, channels ``first`` on)
    spread over a line of ``width`` pixels of ``c2`` lanes, ``used`` lanes each."""
    for x in range(width):
        for lane in range(used):
            add[x * c2 + lane] = operands[add_row, first + lane]
            mul[x * c2 + lane] = operands[mul_row, first + lane]


@njit(cache=True)
def _stages_atoms(main, operand, stages, bs, bs_operands, bn, bn_operands, ew, cvt, channels, height, width, out,
                  offsets):
    """``dpu_pixel._stages_to_atoms``' stages (``stages`` [3]: BS, BN, EW on; OUT_CVT always) line by
    line of atoms: main[s, y * W:(y + 1) * W] widened to int64, ``_bs_block`` (no window sums:
    CPEND off, the caller checks), ``_bn_block``, ``_ew_block`` with the raw operand ([S][P][C2],
    or [S][1][C2] tiled), ``_out_cvt_flat`` straight into the line's elements of ``out``; lanes
    past the channels 0. ``bs_operands`` int64 [3][C] (ALU, CPEND, MUL), ``bn_operands`` [2][C].
    Only the operands a stage reads are tiled (CPEND's never: no window sums); an operand per
    channel goes through EW's converter once per lane (``numerics.ew_operand_value``, what
    ``_ew_block`` applies to each element) and ``_ew_block`` then runs with the converter off,
    which hands the converted value on as it is."""
    surfaces, c2 = offsets.shape[0] // height, main.shape[2]
    per_pixel, ew_on = operand.shape[1] > 1, stages[2] != 0
    if ew_on and not per_pixel:
        converted = ew.copy()
        converted[EP_CVT_ON] = 0
    else:
        converted = ew
    cvt_on, ew_offset, ew_scale = ew[EP_CVT_ON] != 0, ew[EP_CVT_OFFSET], ew[EP_CVT_SCALE]
    ew_shift, ew_mode = ew[EP_CVT_SHIFT], ew[EP_CVT_MODE]
    run = width * c2
    # operands one for every channel read (the SE gates' BS: one ALU value for the tensor) go to
    # the block functions as scalars, the value each element's _at() reads: no lines to tile
    limit = min(channels, surfaces * c2)
    bs_uniform = bs_operands.shape[0] == 3 and _uniform(bs_operands, limit)
    bn_uniform = bn_operands.shape[0] == 2 and _uniform(bn_operands, limit)
    block, window = np.empty(run, np.int64), np.zeros(run, np.int64)
    alu, cpend, mul = np.zeros(run, np.int64), np.zeros(run, np.int64), np.zeros(run, np.int64)
    bn_alu, bn_mul = np.zeros(run, np.int64), np.zeros(run, np.int64)
    other = np.zeros(run, np.int64)
    scale, shift, offset = cvt[CP_SCALE], cvt[CP_SHIFT], cvt[CP_OFFSET]
    mode, low, high = cvt[CP_MODE], cvt[CP_LOW], cvt[CP_HIGH]
    for s in range(surfaces):
        used = min(max(channels - s * c2, 0), c2)
        first = s * c2
        if used == 0:  # a surface past the channels (and past the main cube's): zeros
            for y in range(height):
                out[offsets[s * height + y]:offsets[s * height + y] + run] = 0
            continue
        # (lanes past the channels: operands 0, their values overwritten below)
        if stages[0] != 0 and bs_operands.shape[0] == 3 and not bs_uniform:
            _spread(alu, mul, bs_operands, 0, 2, first, used, width, c2)
        if stages[1] != 0 and bn_operands.shape[0] == 2 and not bn_uniform:
            _spread(bn_alu, bn_mul, bn_operands, 0, 1, first, used, width, c2)
        if ew_on and not per_pixel:
            for lane in range(c2):
                other[lane] = nm.ew_operand_value(operand[s, 0, lane], cvt_on, ew_offset, ew_scale, ew_shift,
                                                  ew_mode)
            for x in range(1, width):
                for lane in range(c2):
                    other[x * c2 + lane] = other[lane]
        flat = main[s].reshape(-1)
        for y in range(height):
            line = out[offsets[s * height + y]:offsets[s * height + y] + run]
            source = flat[y * run:(y + 1) * run]
            for i in range(run):
                block[i] = source[i]
            if stages[0] != 0:
                if bs_uniform:
                    _bs_block(block, window, bs, bs_operands[0, 0], 0, bs_operands[2, 0])
                else:
                    _bs_block(block, window, bs, alu, cpend, mul)
            if stages[1] != 0:
                if bn_uniform:
                    _bn_block(block, bn, bn_operands[0, 0], bn_operands[1, 0])
                else:
                    _bn_block(block, bn, bn_alu, bn_mul)
            if ew_on:
                if per_pixel:
                    raw = operand[s].reshape(-1)[y * run:(y + 1) * run]
                    for i in range(run):
                        other[i] = raw[i]
                _ew_block(block, other, converted)
            _out_cvt_flat(block, line, scale, shift, offset, mode, low, high)
            if used < c2:  # lanes past the channels: 0, as the WDMA writes them
                for x in range(width):
                    for lane in range(used, c2):
                        line[x * c2 + lane] = 0


def prepare_stages_atoms(settings: tuple, channels: int, height: int, width: int, c2: int, out: np.ndarray,
                         offsets: np.ndarray) -> Callable[[np.ndarray, np.ndarray | None], bool] | None:
    """``prepare_chain_atoms`` for the int64 stages (``_stages_atoms``): ``settings`` the stage
    flags, BS settings and operands, BN settings and operands, EW and OUT_CVT settings as
    ``dpu_pixel._stages_to_atoms`` takes them (no CPEND: the caller checks)."""
    stages, bs, bs_operands, bn, bn_operands, ew, cvt = settings
    limit = min(channels, -(-channels // c2) * c2)
    if bs_operands.ndim != 2 or bn_operands.ndim != 2 or bs_operands.shape[0] not in (0, 3) \
            or bn_operands.shape[0] not in (0, 2) or bs_operands.shape[0] and bs_operands.shape[1] < limit \
            or bn_operands.shape[0] and bn_operands.shape[1] < limit:
        return None

    lines = dpu_stage_lines.lines_settings(stages, bs, ew, cvt)
    if lines is not None and (stages[0] == 0 or bs_operands.shape[0] == 3):
        # BN off, add / minus ALUs, shifts below 63: the branch-free passes (same integers)
        def loop(main, operand, floats, chain, channels, height, width, out, offsets):
            dpu_stage_lines.stage_lines_atoms(main, operand, stages, lines, bs_operands, ew, channels, height,
                                              width, out, offsets)

        return _checked(loop, stages[2] != 0, None, None, channels, height, width, c2, out, offsets)

    def loop(main, operand, floats, chain, channels, height, width, out, offsets):
        _stages_atoms(main, operand, stages, bs, bs_operands, bn, bn_operands, ew, cvt, channels, height, width,
                      out, offsets)

    return _checked(loop, stages[2] != 0, None, None, channels, height, width, c2, out, offsets)


def prepare_chain_atoms(chain: np.ndarray, floats: np.ndarray, channels: int, height: int, width: int, c2: int,
                        out: np.ndarray, offsets: np.ndarray) -> Callable[[np.ndarray, np.ndarray | None], bool] | None:
    """``run(main, operand)``: the chain ``chain`` (``dpu_pixel.chain_settings``' CH_* array; no
    CPEND: the caller checks) with the BS operands ``floats`` [3][>= C] (``_build_chain_operands``)
    on ``main`` [S][height * width][c2] atoms, the EW operand ``operand`` [S][P or 1][c2] (None
    without the EW stage), into ``out`` (the target viewed as the output's elements) at the
    element offsets ``offsets`` [S_out * height] (each line width * c2 elements, checked by the
    caller); None where the shapes do not fit (then per run: ``run`` returns False, having done
    nothing, for a main cube or operand of other surfaces, pixels or lanes)."""
    ew_on = chain[CH_EW_ON] != 0
    loop = _LOOPS[ew_on, chain[CH_EVEN] != 0, chain[CH_LOW1] == 0.0]
    if floats.shape[0] != 3 or floats.shape[1] < min(channels, -(-channels // c2) * c2):
        return None
    return _checked(loop, ew_on, chain, floats, channels, height, width, c2, out, offsets)


def _checked(loop: Callable, ew_on: bool, chain, floats, channels: int, height: int, width: int, c2: int,
             out: np.ndarray, offsets: np.ndarray) -> Callable[[np.ndarray, np.ndarray | None], bool] | None:
    """``run(main, operand) -> bool``: ``loop`` on inputs of the shapes it takes (False, having done
    nothing, otherwise); None where the lines do not fit ``out``."""
    offsets = np.ascontiguousarray(offsets, np.int64)
    surfaces, pixels = offsets.shape[0] // max(height, 1), height * width
    needed = min(surfaces, -(-channels // c2))  # (surfaces holding a channel: the ones read)
    if height < 1 or width < 1 or offsets.shape != (surfaces * height,) or surfaces < 1 or out.ndim != 1 \
            or offsets.min() < 0 or offsets.max() + width * c2 > out.shape[0]:
        return None

    def run(main: np.ndarray, operand: np.ndarray | None) -> bool:
        if main.ndim != 3 or main.shape[0] < needed or main.shape[1] != pixels or main.shape[2] != c2 \
                or not main.flags.c_contiguous or main.dtype.kind != "i":
            return False
        if ew_on:
            if operand is None or operand.ndim != 3 or operand.shape[0] < needed or operand.shape[2] != c2 \
                    or operand.shape[1] not in (1, pixels) or operand.dtype.kind != "i" \
                    or not operand.flags.c_contiguous:
                return False
        else:
            operand = _NO_OPERAND
        loop(main, operand, floats, chain, channels, height, width, out, offsets)
        return True

    return run
