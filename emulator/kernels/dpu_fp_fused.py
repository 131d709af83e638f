"""The fp chain's stages in one loop per element (issue 20; NUMERICS.md, section on the fused fp chain).

``dpu_fp_chain._run_chain`` runs BS, BN, the LUT and EW as passes over pieces of the cube, each
stage's loop general (every ALU algorithm, PReLU), through scratch pieces: on ppocr_cls fp16's
LUT tasks the passes around the LUT cost ~0.35 ns an element of the chain's ~0.87. The forms the
compiled networks run (``takes``: X stages whose ALU adds, no PReLU; an EW ALU of max / min / add /
minus or an EW multiply; an operand of one value, one a channel or one a pixel) go through
:func:`fused_chain` instead: each element through every enabled stage in registers, one loop a
channel (or one across channels for 1x1 maps). The stage code is ``dpu_fp_chain``'s own element
functions (``_x_value``, ``_ew_value``) with the algorithm and PReLU fixed, their ReLU / ReLUX as two
threshold selects (``bounds``: relu_float's result on every value), the LUT ``lut_fp._lut_value``:
every element sees the same fp32 operations on the same operands in the same order, so the bits are
those of the passes (tests/emulator/test_dpu_fp_fused.py, test_fp_chain_selects.py). Each form's
loop is compiled with its operations constant (``F0``..``F8``, session 21).
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels.dpu_fp_elements import (E_ALGO, E_ON, E_OP_ON, E_OP_TYPE, E_PRELU, E_RELU, E_RELUX,
                                                     X_ALGO, X_ALU_ON, X_COUNT, X_MUL_FIRST, X_MUL_ON, X_PRELU,
                                                     X_RELU, X_RELUX, ew_value, x_value)
from npuemu.emulator.kernels.lut_fp import _CHOICE, _CONSTANTS, _K, _THRESHOLDS, PACKED, _fill_table, _lut_value, \
    _stack_table
from npuemu.emulator.kernels.vector_width import wide_vectors

#: the EW operand's forms (``operand_form``): one value, one a channel, one a pixel (the cube's shape)
TENSOR, CHANNEL, PIXEL = 0, 1, 2
#: an X stage's operations (ALU on, MUL on, MUL first): none, add, multiply, multiply then add, add then
#: multiply (ReLU / ReLUX apart: run-time flags)
XK_NONE, XK_ADD, XK_MUL, XK_MUL_ADD, XK_ADD_MUL = range(5)
#: the EW operation: none (ReLU / ReLUX at most), multiply, or the ALU's max, min, add, minus
EK_NONE, EK_MUL, EK_MAX, EK_MIN, EK_ADD, EK_MINUS = range(6)
#: the stage forms ``fused_chain`` runs, each one loop of its own: (BS, BN, LUT, EW) - the forms the
#: compiled networks run (a LUT task's BS bias, BN scale and offset, LUT, EW scale; conv + bias (+ ReLU
#: or ReLU6 in BN); residual adds; flying adds, scales, max and minus)
FORMS = ((XK_ADD, XK_MUL_ADD, True, EK_MUL), (XK_MUL_ADD, XK_NONE, True, EK_MUL),
         (XK_ADD, XK_NONE, False, EK_NONE), (XK_ADD, XK_NONE, False, EK_ADD), (XK_NONE, XK_NONE, False, EK_ADD),
         (XK_NONE, XK_NONE, False, EK_MUL), (XK_NONE, XK_NONE, False, EK_MAX), (XK_NONE, XK_NONE, False, EK_MINUS),
         (XK_MUL, XK_MUL_ADD, False, EK_NONE))
#: the forms one by one: Numba types a global tuple of ints and booleans as its literal values, so that a
#: call passing one compiles its loop with the form's operations constants (``FORMS[k]`` is typed as a
#: plain tuple: one loop for every form, its operations chosen element by element; with ``bounds``,
#: conv + bias + ReLU6 0.30 -> 0.11 ns an element)
F0, F1, F2, F3, F4, F5, F6, F7, F8 = FORMS
#: maps of fewer pixels run the passes
_SMALL_PLANE = 32
#: maps ``_flat`` runs (``form_of``'s ``tiny``)
_FLAT_PLANES = (1, 2, 4)
_EW_KINDS = {nm.ALU_MAX: EK_MAX, nm.ALU_MIN: EK_MIN, nm.ALU_ADD: EK_ADD, nm.ALU_MINUS: EK_MINUS}


def operand_form(shape: tuple, operand_shape: tuple) -> int:
    """The EW operand's form for a cube of ``shape`` (-1: one ``fused_chain`` does not take)."""
    if tuple(operand_shape) == (1, 1, 1):
        return TENSOR
    if tuple(operand_shape) == (shape[0], 1, 1):
        return CHANNEL
    return PIXEL if tuple(operand_shape) == tuple(shape) else -1


def _x_kind(row: np.ndarray) -> int:
    if row[X_PRELU] or row[X_ALU_ON] and row[X_ALGO] != nm.ALU_ADD:
        return -1
    if row[X_ALU_ON] and row[X_MUL_ON]:
        return XK_MUL_ADD if row[X_MUL_FIRST] else XK_ADD_MUL
    return XK_ADD if row[X_ALU_ON] else XK_MUL if row[X_MUL_ON] else XK_NONE


def _ew_kind(e_params: np.ndarray) -> int:
    if not e_params[E_ON] or not e_params[E_OP_ON]:
        return EK_NONE
    if e_params[E_OP_TYPE] != nm.EW_OP_ALU:
        return -1 if e_params[E_PRELU] else EK_MUL
    return _EW_KINDS.get(int(e_params[E_ALGO]), -1)


def _relus(x_params: np.ndarray, stages: int, e_params: np.ndarray) -> bool:
    # whether a stage run has ReLU or ReLUX on
    on = any(x_params[s][X_RELU] or x_params[s][X_RELUX] for s in range(stages))
    return bool(on or e_params[E_ON] and (e_params[E_RELU] or e_params[E_RELUX]))


def form_of(x_params: np.ndarray, stages: int, e_params: np.ndarray, lut: bool, operand: int,
            plane: int = 1, tiny: bool = False) -> int:
    """The index in ``FORMS`` of these settings (``dpu_fp_chain.FloatChain.settings``' X settings
    [2][X_COUNT], X stage count, EW settings; the LUT on; the EW operand's form; the cube's H*W), -1
    for settings ``fused_chain`` does not run: maps of under 32 pixels take the passes (whose whole-plane
    pieces cost less there than a loop a channel: 224x1x14, 1.5 against 9 us); the LUT forms run
    without ReLU (their loops hold none: ~10% of a LUT task). ``tiny``: maps of 1, 2 or 4 pixels run fused too,
    the LUT forms apart (``_flat``: one loop over the cube; silero-vad's LSTM vectors, 128 x 1 x 1 and 136 x 1 x 4;
    with the LUT that loop ran ~4x slower than the passes)."""
    kinds = [_x_kind(x_params[s]) if s < stages else XK_NONE for s in range(2)]
    form = (kinds[0], kinds[1], bool(lut), _ew_kind(e_params))
    if operand < 0 or form not in FORMS or lut and (operand == PIXEL or _relus(x_params, stages, e_params)) \
            or plane < _SMALL_PLANE and not (tiny and not lut and plane in _FLAT_PLANES):
        return -1
    return FORMS.index(form)


@njit(cache=True)
def bounds(relu_on, relux_on, relux_value):
    """A stage's ReLU / ReLUX (``numerics.relu_float``'s flags and value) as (below, above, ReLUX value)
    for ``_bounded``: below 0 with ReLU on, else -inf; above the ReLUX value with ReLUX on, else +inf."""
    infinity = np.float32(np.inf)
    return np.float32(0) if relu_on else -infinity, relux_value if relux_on else infinity, relux_value


@njit(cache=True)
def _bounded(value, bound):
    # numerics.relu_float of the flags ``bounds`` took, as two selects with no flag: ``value < -inf`` and
    # ``value > +inf`` hold for no value (NaN and the infinities included), so a stage with ReLU or ReLUX
    # off changes nothing, and with it on the comparison and the value are relu_float's. Why: the flags,
    # loop-invariant booleans, became branches inside the vectorised loops (six a form)
    value = np.float32(0) if value < bound[0] else value
    return bound[2] if value > bound[1] else value


@njit(cache=True)
def _ew_fixed(value, other, kind, bound):
    # ew_value with the operation a constant ``kind``, then ReLU / ReLUX (``bounds``; None: off)
    if kind == EK_MUL:
        value = ew_value(value, other, True, nm.EW_OP_MUL, nm.ALU_ADD, False, False, False, np.float32(0))
    elif kind == EK_NONE:
        value = ew_value(value, other, False, nm.EW_OP_ALU, nm.ALU_ADD, False, False, False, np.float32(0))
    else:
        algo = nm.ALU_MAX if kind == EK_MAX else nm.ALU_MIN if kind == EK_MIN else nm.ALU_ADD if kind == EK_ADD \
            else nm.ALU_MINUS
        value = ew_value(value, other, True, nm.EW_OP_ALU, algo, False, False, False, np.float32(0))
    return value if bound is None else _bounded(value, bound)


@njit(cache=True)
def _x_fixed(value, kind, bound, alu, mul):
    # x_value with the operations a constant ``kind``, then ReLU / ReLUX (``bounds``; None: off)
    value = x_value(value, nm.ALU_ADD, kind == XK_ADD or kind == XK_MUL_ADD or kind == XK_ADD_MUL,
                    kind == XK_MUL or kind == XK_MUL_ADD or kind == XK_ADD_MUL, False, kind == XK_MUL_ADD, False,
                    False, np.float32(0), alu, mul)
    return value if bound is None else _bounded(value, bound)


@njit(cache=True)
def _table_choice(x, below, c, multi):
    # lut_fp._lut_values' table choice: the LO flag below the thresholds, flipped at each one x reaches
    # (one threshold unless ``multi``; ``c``: the 8 thresholds as scalars - an array here costs a
    # reference count an element)
    if not multi:
        return below ^ (x >= c[0])
    return below ^ (x >= c[0]) ^ (x >= c[1]) ^ (x >= c[2]) ^ (x >= c[3]) ^ (x >= c[4]) ^ (x >= c[5]) ^ (x >= c[6]) \
        ^ (x >= c[7])


@njit(cache=True)
def _element(value, other, form, x1, alu1, mul1, x2, alu2, mul2, lut, tables, e):
    # one element through BS, BN (``x1``, ``x2``: their ReLU / ReLUX, ``bounds``), the LUT (``lut``: 0 off,
    # 1 one threshold, 2 more; ``tables``: lut_fp._lut_values' table values unpacked) and EW (``e``: its
    # ``bounds``), the operations those of the constant ``form``
    value = _x_fixed(value, form[0], x1, alu1, mul1)
    value = _x_fixed(value, form[1], x2, alu2, mul2)
    if lut != 0:
        pointer, le_k, lo_k, under_on, over_on, below, c = tables
        lo = _table_choice(value, below, c, lut == 2)
        value = _lut_value(value, lo, pointer, le_k, lo_k, under_on, over_on)
    return _ew_fixed(value, other, form[3], e)


@njit(cache=True)
def _loops(data, out, channels, plane, form, x1, x2, alu, mul, operand, lut, pixel, tables, e):
    # every element of the [C][H*W] cube (flat) through _element, a loop a channel with its X operands
    # and its EW operand as scalars (``pixel``, a constant: the operand one an element). 512-bit vectors
    # (vector_width; conv + bias + ReLU 0.29 -> 0.17 ns an element, a residual add 0.28 -> 0.19, the LUT
    # forms unchanged): no operation here reassociates, so only how many elements an instruction takes changes
    wide_vectors()
    for c in range(channels):
        alu1, mul1, alu2, mul2, base = alu[c], mul[c], alu[channels + c], mul[channels + c], c * plane
        source, target = data[base:base + plane], out[base:base + plane]
        if pixel:
            others = operand[base:base + plane]
            for i in range(plane):
                target[i] = _element(source[i], others[i], form, x1, alu1, mul1, x2, alu2, mul2, lut, tables, e)
        else:
            other = operand[c if operand.size > 1 else 0]
            for i in range(plane):
                target[i] = _element(source[i], other, form, x1, alu1, mul1, x2, alu2, mul2, lut, tables, e)


@njit(cache=True)
def _flat(data, out, channels, pixels, form, x1, x2, alu, mul, operand, lut, pixel, tables, e):
    # _loops of maps of ``pixels`` (a constant: 1, 2 or 4) as one loop over the cube's elements, element i of
    # channel i // pixels; the operand one an element (``pixel``), else one a channel (or one value: its step
    # 0). Why: a loop a channel of 1-4 elements cost more than its elements (the passes ran instead, their
    # stages generic: 128 x 1 x 1, ~0.35 us a stage). 512-bit vectors as _loops
    wide_vectors()
    step = 1 if operand.size > 1 else 0
    for i in range(channels * pixels):
        c = i // pixels
        other = operand[i] if pixel else operand[c * step]
        out[i] = _element(data[i], other, form, x1, alu[c], mul[c], x2, alu[channels + c], mul[channels + c], lut,
                          tables, e)


@njit(cache=True)
def _shaped(data, out, channels, plane, form, x1, x2, alu, mul, operand, lut, pixel, tables, e):
    # _loops, or _flat for maps of 1, 2 or 4 pixels (``form_of``'s ``tiny``), the map's size a constant in each
    if plane == 1:
        _flat(data, out, channels, 1, form, x1, x2, alu, mul, operand, lut, pixel, tables, e)
    elif plane == 2:
        _flat(data, out, channels, 2, form, x1, x2, alu, mul, operand, lut, pixel, tables, e)
    elif plane == 4:
        _flat(data, out, channels, 4, form, x1, x2, alu, mul, operand, lut, pixel, tables, e)
    else:
        _loops(data, out, channels, plane, form, x1, x2, alu, mul, operand, lut, pixel, tables, e)


@njit(cache=True)
def _plain(data, out, channels, plane, form, x1, x2, alu, mul, operand, pixel, tables, e):
    # _loops of a form without the LUT, the operand's stepping a constant in each
    if pixel:
        _shaped(data, out, channels, plane, form, x1, x2, alu, mul, operand, 0, True, tables, e)
    else:
        _shaped(data, out, channels, plane, form, x1, x2, alu, mul, operand, 0, False, tables, e)


@njit(cache=True)
def _flags(p, relu, relux, relux_value):
    return bounds(p[relu] != 0, p[relux] != 0, relux_value)


@njit(cache=True)
def fused_chain(data, out, channels, plane, x_params, x_relux, alu, mul, e_params, e_relux, form, pixel, packed,
                lut_params, operand):
    """``dpu_fp_chain._run_chain``'s result for the settings of ``FORMS[form]`` (``form_of``), every
    element through every stage in one loop: ``data``, ``out`` the float32 [C][H*W] cubes flat
    (``channels``, ``plane``); ``x_params`` the [2][X_COUNT] X settings flat (ReLU, ReLUX read
    here), ``x_relux`` their ReLUX values, ``alu`` / ``mul`` the [2][C] operands flat; ``e_params`` /
    ``e_relux`` EW's; ``operand`` the EW operand flat (``pixel``: one a pixel, else one value or one a
    channel); ``packed`` / ``lut_params``: ``lut_fp.prepared``'s (empty: no LUT). False (nothing
    written) for a LUT whose table choice has more than one threshold: the caller runs the passes."""
    pointer = _stack_table()  # (the LUT's tables on this kernel's own stack: lut_fp._stack_table)
    table = carray(pointer, (PACKED,))
    lut = 0
    if packed.size != 0:
        _fill_table(table, packed)
        lut = 1 if table[_CHOICE + 2] != table[_CHOICE + 2] else 2  # (lut_fp._lut_values: NaN unused)
    x1 = _flags(x_params, X_RELU, X_RELUX, x_relux[0])
    x2 = _flags(x_params[X_COUNT:], X_RELU, X_RELUX, x_relux[1])
    on = e_params[E_ON] != 0
    e = bounds(on and e_params[E_RELU] != 0, on and e_params[E_RELUX] != 0, e_relux)
    p = lut_params
    k, c = table[_K:_K + 2 * _CONSTANTS], table[_CHOICE + 1:_CHOICE + 1 + _THRESHOLDS]
    tables = (pointer, (k[0], k[1], k[2], k[3], k[4], k[5], k[6]), (k[8], k[9], k[10], k[11], k[12], k[13], k[14]),
              (p[nm.LUTP_LE_UFLOW_SCALE] != 0, p[nm.LUTP_LO_UFLOW_SCALE] != 0),
              (p[nm.LUTP_LE_OFLOW_SCALE] != 0, p[nm.LUTP_LO_OFLOW_SCALE] != 0), table[_CHOICE] != 0,
              (c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]))
    # (each form its own loop, the operations constants in it; the LUT forms without ReLU, their operand
    # one value or one a channel, their table choice one threshold - the compiler's: the passes run
    # more, ``False``: a loop for each would add compile time). The helpers are plain @njit functions
    # that LLVM inlines: Numba's IR inlining (inline="always") made this kernel's cold compile 240 s, not 15
    # (``no``: a stage without ReLU / ReLUX, its selects left out; the forms without EW operation read no operand:
    # one loop)
    no = None
    if form == 0 or form == 1:
        if lut != 1:
            return False
        if form == 0:
            _loops(data, out, channels, plane, F0, no, no, alu, mul, operand, 1, False, tables, no)
        else:
            _loops(data, out, channels, plane, F1, no, no, alu, mul, operand, 1, False, tables, no)
    elif form == 2:
        _shaped(data, out, channels, plane, F2, x1, x2, alu, mul, operand, 0, False, tables, e)
    elif form == 3:
        _plain(data, out, channels, plane, F3, x1, x2, alu, mul, operand, pixel, tables, e)
    elif form == 4:
        _plain(data, out, channels, plane, F4, x1, x2, alu, mul, operand, pixel, tables, e)
    elif form == 5:
        _plain(data, out, channels, plane, F5, x1, x2, alu, mul, operand, pixel, tables, e)
    elif form == 6:
        _plain(data, out, channels, plane, F6, x1, x2, alu, mul, operand, pixel, tables, e)
    elif form == 7:
        _plain(data, out, channels, plane, F7, x1, x2, alu, mul, operand, pixel, tables, e)
    else:
        _shaped(data, out, channels, plane, F8, x1, x2, alu, mul, operand, 0, False, tables, e)
    return True
