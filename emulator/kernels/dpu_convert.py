"""The DPU's precision conversions: integer processing with an fp16 output, fp16 processing with
an int8 output (the vendor's DataConvert tasks; NUMERICS.md 26, REGISTER_SEMANTICS.md 26).

- int -> fp16 [V] layernorm_int8 task 6 (PROC/IN int8, OUT fp16, BN ALU add -zp, OUT_CVT SCALE
  30353 = s_in x 2^20, SHIFT 6, MINUS_EXP 14, FP32TOFP16_EN 1): the integer result goes through
  OUT_CVT's multiplier and shift, is converted to fp32, lowered by 2^-MINUS_EXP (an exponent
  decrement, as on the fp path) and rounded once to fp16 [I]. OUT_CVT_OFFSET is not applied to an
  fp16 output [I]: the vendor writes 1 there, which would make q = zp a non-zero output.
- fp16 -> int8 [V] layernorm_int8 task 23 (PROC fp16, OUT int8, BS MUL fp16 1/s_out, BN ALU add
  zp, OUT_CVT identity): the fp32 result is rounded to an integer by OUT_CVT's CVT_ROUND mode
  and saturated [C]; OUT_CVT scale/shift/offset must be the identity the vendor writes (any other
  value is refused: no stream shows what they would do on this path).
- fp16 cubes the MRDMA / ERDMA read for the fp path (:func:`fp16_blocks_to_cube`): widened to fp32
  exactly (NUMERICS.md 7) while they move from channel blocks to [C][H][W] planes, one pass
  (issue 20: numpy's transpose copy and float16 cast took two, the cast ~4x slower than a lookup);
  :func:`widen_rows` does the same straight from the region's atom rows (a task program's fp16
  step, NUMERICS.md 34).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from npuemu.emulator.kernels.fp16 import fp16_bits_to_fp32_bits_native, fp32_to_fp16, native_halves, widening_table
from npuemu.emulator.kernels.fp16_atoms_ir import widen_pixels, widen_to_planes
from npuemu.emulator.kernels.fp16_small_planes_ir import atoms_to_planes2, atoms_to_planes4, whole_surfaces
from npuemu.emulator.kernels.mac import _widen_atoms8
from npuemu.emulator.numerics import INT32_MAX, INT32_MIN, ROUND_HALF_AWAY, ROUND_HALF_EVEN, out_cvt_round_mode
from npuemu.isa.errors import EmulationError

_RANGES = {np.dtype(np.int8): (-128, 127), np.dtype(np.int16): (-32768, 32767),
           np.dtype(np.int32): (INT32_MIN, INT32_MAX)}
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # (fp_to_int's inputs taken as they are)


def int_to_fp16(data: np.ndarray, scale: int, shift: int, round_bit: int, minus_exp: int) -> np.ndarray:
    """int32 [C][H][W] after BS/BN/EW -> fp16: ``fp16(fp32(sat32(rshift(v x SCALE, SHIFT))) x 2^-MINUS_EXP)``."""
    values = np.ascontiguousarray(data, np.int64)
    floats = np.empty(values.shape, np.float32)
    _int_to_float(values.reshape(-1), np.int64(scale), int(shift), out_cvt_round_mode(round_bit) == ROUND_HALF_AWAY,
                  np.float32(2.0 ** -minus_exp), bool(minus_exp), floats.reshape(-1))
    return fp32_to_fp16(floats)


@njit(cache=True)
def _int_to_float(values, scale, shift, half_away, factor, lower, out):
    # int_to_fp16 up to the fp16 rounding, per element in one pass (issue 20: numpy's six passes took
    # ~0.5 ms on rec int8's 265k-element conversions): value / 2^SHIFT rounded (NUMERICS.md 1) in int64
    # (SHIFT a 6-bit field), the int32 saturation, the exact-then-rounded int -> fp32 conversion, one fp32 multiply
    half = np.int64(1) << np.int64(max(shift - 1, 0))
    for i in range(values.size):
        value = values[i] * scale
        if shift > 0:
            if half_away:
                value = (value + half + (value >> 63)) >> shift
            else:
                quotient = value >> shift
                rest = value - (quotient << shift)
                value = quotient + (1 if rest > half or (rest == half and quotient & 1 == 1) else 0)
        value = min(max(value, INT32_MIN), INT32_MAX)
        out[i] = np.float32(np.float32(value) * factor) if lower else np.float32(value)


def fp_to_int(data: np.ndarray, scale: int, shift: int, offset: int, round_bit: int, out_dtype: np.dtype,
              where: str) -> np.ndarray:
    """fp32 [C][H][W] after BS/BN/EW -> an integer output: rounded by CVT_ROUND, saturated. NaN
    gives 0 [C] (no stream shows it)."""
    if (scale, shift, offset) != (1, 0, 0):
        raise EmulationError(f"{where}: OUT_CVT SCALE={scale} SHIFT={shift} OFFSET={offset} with an fp16 "
                             f"PROC_PRECISION and an integer OUT_PRECISION is not modelled (only the identity "
                             f"1/0/0 the vendor writes)")
    dtype = np.dtype(out_dtype)
    low, high = _RANGES[dtype]
    values = np.ascontiguousarray(data)
    if values.dtype not in _FLOATS:
        values = values.astype(np.float64)
    out = np.empty(values.shape, dtype)
    _round_saturate(values.reshape(-1), out_cvt_round_mode(round_bit) == ROUND_HALF_EVEN, float(low), float(high),
                    out.reshape(-1))
    return out


@njit(cache=True)
def _round_saturate(values, half_even, low, high, out):
    # fp_to_int per element, one pass (issue 20: numpy's six passes over a float64 copy took ~0.4 ms
    # on ppocr_rec's 180k-element conversions): in float64 (exact for fp32), rint (half to even) or
    # sign(v) * floor(|v| + 0.5) (half away), NaN -> 0, clipped, then the integer (exact)
    for i in range(values.size):
        value = np.float64(values[i])
        rounded = np.rint(value) if half_even else np.sign(value) * np.floor(np.abs(value) + 0.5)
        if rounded != rounded:
            rounded = 0.0
        out[i] = min(max(rounded, low), high)


@njit(cache=True)
def _widen_blocks(bits16, table, out):
    surfaces, pixels, lanes = bits16.shape
    channels = out.shape[0]
    for s in range(surfaces):
        for lane in range(min(lanes, channels - s * lanes)):
            target = out[s * lanes + lane]
            for p in range(pixels):
                target[p] = table[bits16[s, p, lane]]


#: runs of at least this many pixels go through ``mac._widen_atoms8`` (one interleaved loop, ~200 ns
#: to set up), shorter ones lane by lane (40 pixels: 115 against 215 ns; 8 pixels: 41 against 204)
_INTERLEAVED_RUN = 128
#: with F16C, runs of fewer pixels go through ``fp16_atoms_ir.widen_to_planes`` (8 atoms transposed in
#: registers: ~0.08 ns an element at 7-1600 pixels, against 0.34-0.6 lane by lane and 0.1 interleaved at
#: 800; at 3136 and more the interleaved loop is ~25% faster, as in fetch_fp16.LONG_RUN)
_TRANSPOSED_RUN = 2048


@njit(cache=True, inline="always")
def _widen_lanes8(source, out, channel, line, count):
    # a run of ``count`` 8-lane atoms into planes channel..channel + 7, one lane a loop (strided reads)
    for lane in range(8):
        target = out[channel + lane, line:line + count]
        for x in range(count):
            target[x] = fp16_bits_to_fp32_bits_native(source[8 * x + lane])


@njit(cache=True)
def _small_surfaces(data, offsets, height, first, step, out, pixels):
    # widen_rows of planes of 2 or 4 pixels, surface by surface in registers (fp16_small_planes_ir: 136 x 1 x 4,
    # 0.34 -> ~0.09 us a read)
    if not native_halves():  # (F16C's IR: never compiled for other targets, which have no half conversions)
        return
    for k in range(offsets.size // height):
        source = data.ctypes.data + offsets[k * height] * 2
        target = out.ctypes.data + (first + k * step) * 8 * out.strides[0]
        if pixels == 4:
            atoms_to_planes4(source, 0, target, 0, 1)
        else:
            atoms_to_planes2(source, 0, target, 0, 1)


@njit(cache=True)
def widen_rows(data, offsets, height, lanes, first, step, table, out):
    """fp16 atom rows read straight from a region and widened into planes (what ``gather_rows``
    then :func:`fp16_blocks_to_cube` give, without the row copy): ``data`` the region as uint16,
    ``offsets`` each row's first element, row r is surface ``first + (r // height) * step`` (a
    split operand's even or odd surfaces: step 2), line r % height; lane l of surface s is channel
    s * lanes + l at element ``x * lanes + l`` of the row; ``out`` uint32 [C][H*W], channels past C
    dropped. A surface of eight whole channels (fp16's atom) goes through ``mac._widen_atoms8``
    (F16C where the CPU has it: 0.54 / 0.21 ns an element on 40 / 160 wide rows against 0.73 / 0.71
    for the table loop), the same exact widening (NUMERICS.md 7). Rows back to back in the region
    and the plane go as one run, runs under ``_INTERLEAVED_RUN`` pixels lane by lane (NUMERICS.md 48);
    with F16C, runs under ``_TRANSPOSED_RUN`` pixels through ``widen_to_planes`` (NUMERICS.md 49's
    transpose in registers, the same widening: session 21, ppocr_rec's 40-pixel rows)."""
    channels, pixels = out.shape
    native = native_halves()
    if native and lanes == 8 and (pixels == 2 or pixels == 4) and data.strides[0] == 2 and out.strides[1] == 4 \
            and out.strides[0] == 4 * pixels \
            and whole_surfaces(offsets, height, first, step, channels, data.size, pixels):
        _small_surfaces(data, offsets, height, first, step, out, pixels)
        return
    width = pixels // height
    row = width * lanes
    r = 0
    while r < offsets.size:
        surface = first + (r // height) * step
        # a run of rows back to back in the region and in the plane (the next line of the same
        # surface): one call for all (7x7 maps: 49 pixels a call instead of 7; a narrow call cost
        # ~250 ns whatever its width, 5 ns an element on 7-wide rows)
        end = r + 1
        while end < offsets.size and end % height != 0 and offsets[end] == offsets[end - 1] + row:
            end += 1
        count, line = (end - r) * width, (r % height) * width
        source = data[offsets[r]:offsets[r] + count * lanes]
        r = end
        if lanes == 8 and surface * 8 + 8 <= channels:
            if native and count < _TRANSPOSED_RUN and source.size == count * 8 and source.strides[0] == 2 \
                    and out.strides[1] == 4:  # (addresses: whole rows of a dense region, dense plane rows)
                widen_to_planes(source.ctypes.data, 0, out.ctypes.data + surface * 8 * out.strides[0] + line * 4,
                                out.strides[0], count)
            elif count >= _INTERLEAVED_RUN:
                _widen_atoms8(source, out[surface * 8:surface * 8 + 8], line, count)
            else:
                _widen_lanes8(source, out, surface * 8, line, count)
            continue
        pixels_lanes = source.reshape(count, lanes)
        for lane in range(min(lanes, channels - surface * lanes)):
            target = out[surface * lanes + lane, line:line + count]  # (a row view: ~1.8x faster than
            for x in range(count):  # indexing the plane and the flat row)
                target[x] = table[pixels_lanes[x, lane]]


@njit(cache=True)
def widen_channels(data, offsets, lanes, first, step, table, out):
    """``widen_rows`` into 1x1 planes (H = W = 1: row r is surface ``first + r * step``, a single atom): ``out``
    uint32 [C] flat, channel s * lanes + l from lane l of surface s, channels past C dropped. Rows back to back
    in the region and in ``out`` go as one loop over their elements (silero-vad's 128-channel LSTM vectors:
    16 atoms in one loop, not 16 calls); the same exact widening (F16C's or the formula for 8 lanes, the table
    otherwise), so the same bits."""
    channels, r = out.size, 0
    while r < offsets.size:
        end = r + 1
        while end < offsets.size and step == 1 and offsets[end] == offsets[end - 1] + lanes:
            end += 1
        base = (first + r * step) * lanes
        count = max(0, min((end - r) * lanes, channels - base))
        source, target = data[offsets[r]:offsets[r] + count], out[base:base + count]
        if lanes == 8 and native_halves() and count % 8 == 0 and source.size == count and source.strides[0] == 2 \
                and target.strides[0] == 4:  # (whole atoms: 8 lanes a vector, fp16_atoms_ir.widen_pixels)
            widen_pixels(source.ctypes.data, 16, 0, target.ctypes.data, 0, count // 8, 1)
        elif lanes == 8:
            for i in range(source.size):
                target[i] = fp16_bits_to_fp32_bits_native(source[i])
        else:
            for i in range(source.size):
                target[i] = table[source[i]]
        r = end


def fp16_blocks_to_cube(blocks: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
    """A float16 channel-block cube [S][H*W][L] (``kernels.dpu_pixel``) -> float32 [C][H][W], each
    value widened exactly (``fp16.widening_table``); channels past ``shape[0]`` are dropped."""
    surfaces, pixels, lanes = blocks.shape
    if blocks.dtype != np.float16 or pixels != shape[1] * shape[2] or shape[0] > surfaces * lanes:
        raise EmulationError(f"fp16 blocks {blocks.dtype} {blocks.shape} do not hold a {shape} cube")
    out = np.empty((shape[0], pixels), np.float32)
    _widen_blocks(np.ascontiguousarray(blocks).view(np.uint16), widening_table(), out.view(np.uint32))
    return out.reshape(shape)
