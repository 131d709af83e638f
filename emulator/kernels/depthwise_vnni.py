"""int8 depthwise output rows on AVX-512 VNNI (``vpdpbusd``; issue 20, NUMERICS.md 45).

The padded row kernels of ``depthwise`` read, per kernel tap t, one contiguous int8 run x_t of an
output row's ``OW * L`` elements (element i = pixel * L + lane) and form sum_t w_t[lane] * x_t[i].
Here 64 elements at a time: the runs of four taps are interleaved byte-wise (two-source byte and
word shuffles; LLVM emits ``vpermt2b``/``vpunpck*``) so that dword j of a vector holds the four
taps' inputs of element j, and one ``vpdpbusd`` per 16 elements adds four products. ``vpdpbusd``
multiplies unsigned by signed bytes, so the weights are packed as ``w + 128`` (``pack``; taps past
the kernel's as 0) and the inputs stay signed: ``dot = sum w x + 128 * sum x``. A second
``vpdpbusd`` with unsigned 1 (0 for the padding taps) gives the window sum ``S = sum x`` the CORE
needs anyway, and the products are ``dot - 128 * S``.

Exact in int32 (the non-saturating ``vpdpbusd``, no wrap): with |x| <= 128 and 0 <= w + 128 <= 255
every partial sum of ``dot`` has magnitude at most taps * 255 * 128 (< 2**31 for taps < 65793;
``MAX_TAPS`` = 52, a 7x7 kernel, is far below), |128 * S| <= taps * 2**14, and ``dot - 128 * S``
is the exact sum w x (|.| <= taps * 2**14). Integer sums do not depend on their order, so the
values equal ``depthwise._depthwise3x3_rows`` / ``_depthwise_rows`` / ``_depthwise_pixel_rows``
bit for bit. A quad's taps past the kernel's read tap 0's run (weight byte 0, ones byte 0: they
add nothing).

Packed weights repeat with the period of the lanes over 64-element chunks (lcm(L, 64) / 64
chunks: L = 16 -> 1, 24 -> 3, 960 -> 15), so they stay in L1 whatever the row's width. Elements
past the last whole chunk (OW * L mod 64) take a scalar loop. Only where
``gemm_int8.available()`` (AVX-512 VNNI + BW on the host, NPUEMU_INT8_GEMM not 0) and the CPU
has AVX-512 VBMI (the byte shuffles); elsewhere callers keep ``depthwise``'s kernels.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from npuemu.emulator.kernels import gemm_int8, host_cpu

#: kernel taps the packed kernels take (up to 7x7; one intrinsic per quad count: ``_ROWS``)
MAX_TAPS = 52
_VEC = ir.VectorType(ir.IntType(32), 16)
_BYTES = ir.VectorType(ir.IntType(8), 64)
_WORDS = ir.VectorType(ir.IntType(16), 32)
_I32, _I64 = ir.IntType(32), ir.IntType(64)
_vbmi_ok = None


def available() -> bool:
    """``gemm_int8.available()`` (VNNI/BW, host compile, NPUEMU_INT8_GEMM not 0) and AVX-512 VBMI."""
    global _vbmi_ok
    if not gemm_int8.available():
        return False
    if _vbmi_ok is None:
        _vbmi_ok = "+avx512vbmi" in host_cpu.host_features()
    return _vbmi_ok


def _mask(pairs):
    return ir.Constant(ir.VectorType(_I32, len(pairs)), pairs)


def _row_codegen(quads: int):
    """IR: for chunk k < ``chunks``: the tap runs' 64 bytes at ``taps[t] + 64 k`` (t < 4 * quads; a
    missing tap reads the zero vector), interleaved per quad into four dword vectors, ``vpdpbusd``
    against packed weights chunk k mod ``period`` and against the quads' unsigned ones; stores
    ``dot - 128 S`` to ``acc`` and ``S`` to ``total`` (int32, 64 a chunk)."""
    low = _mask([v for j in range(32) for v in (j, 64 + j)])
    high = _mask([v for j in range(32, 64) for v in (j, 64 + j)])
    words = [_mask([v for j in range(16 * h, 16 * h + 16) for v in (j, 32 + j)]) for h in range(2)]

    def codegen(context, builder, signature, args):
        taps_addr, count, chunks, packed, period, acc, total = args
        dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3),
                                             "llvm.x86.avx512.vpdpbusd.512")
        starts = [builder.load(builder.inttoptr(builder.add(taps_addr, ir.Constant(_I64, 8 * t)), _I64.as_pointer()))
                  for t in range(4 * quads)]
        ones = []  # per quad, dword bytes 1 for the taps below ``count`` (0 past: they add nothing)
        for q in range(quads):
            word = ir.Constant(_I32, 0)
            for b in range(4):
                inside = builder.icmp_signed("<", ir.Constant(_I64, 4 * q + b), count)
                word = builder.add(word, builder.select(inside, ir.Constant(_I32, 1 << (8 * b)), ir.Constant(_I32, 0)))
            ones.append(_splat(builder, word))
        slot = cgutils.alloca_once_value(builder, ir.Constant(_I64, 0))
        with cgutils.for_range(builder, chunks) as loop:
            at = builder.mul(loop.index, ir.Constant(_I64, 64))
            weights = builder.add(packed, builder.mul(builder.load(slot), ir.Constant(_I64, 256 * quads)))
            sums = [ir.Constant(_VEC, None)] * 4
            dots = [ir.Constant(_VEC, None)] * 4
            for q in range(quads):
                runs = []
                for b in range(4):  # (taps past ``count`` read tap 0's run: weight 0, ones 0)
                    address = builder.add(starts[4 * q + b], at)
                    runs.append(builder.load(builder.inttoptr(address, _BYTES.as_pointer()), align=1))
                pairs = []
                for first, second in ((runs[0], runs[1]), (runs[2], runs[3])):
                    pairs.append([builder.bitcast(builder.shuffle_vector(first, second, m), _WORDS)
                                  for m in (low, high)])
                for h in range(2):
                    for part in range(2):
                        v = 2 * h + part
                        quad = builder.bitcast(builder.shuffle_vector(pairs[0][h], pairs[1][h], words[part]), _VEC)
                        packed_w = builder.load(builder.inttoptr(
                            builder.add(weights, ir.Constant(_I64, 256 * q + 64 * v)), _VEC.as_pointer()), align=1)
                        dots[v] = builder.call(dot, [dots[v], packed_w, quad])
                        sums[v] = builder.call(dot, [sums[v], ones[q], quad])
            for v in range(4):
                offset = builder.add(builder.mul(at, ir.Constant(_I64, 4)), ir.Constant(_I64, 64 * v))
                value = builder.sub(dots[v], builder.shl(sums[v], ir.Constant(_VEC, [7] * 16)))
                builder.store(value, builder.inttoptr(builder.add(acc, offset), _VEC.as_pointer()), align=4)
                builder.store(sums[v], builder.inttoptr(builder.add(total, offset), _VEC.as_pointer()), align=4)
            following = builder.add(builder.load(slot), ir.Constant(_I64, 1))
            builder.store(builder.select(builder.icmp_signed("<", following, period), following,
                                         ir.Constant(_I64, 0)), slot)
        return context.get_dummy_value()
    return codegen


def _splat(builder, value):
    return builder.shuffle_vector(builder.insert_element(ir.Constant(_VEC, ir.Undefined), value, ir.Constant(_I32, 0)),
                                  ir.Constant(_VEC, ir.Undefined), ir.Constant(_VEC, None))


def _make_row(quads: int):
    @intrinsic
    def row(typingctx, taps_addr, count, chunks, packed, period, acc, total):
        return types.void(*([types.intp] * 7)), _row_codegen(quads)
    return row


_ROWS = tuple(_make_row(q) for q in range(1, 14))
_row1, _row2, _row3, _row4, _row5, _row6, _row7, _row8, _row9, _row10, _row11, _row12, _row13 = _ROWS


@njit(cache=True)
def _chunks(taps, count, chunks, packed, period, acc, total):
    # the intrinsic of as many quads as ``count`` taps need (the packed weights' quads)
    quads = (count + 3) // 4
    if quads == 1:
        _row1(taps, count, chunks, packed, period, acc, total)
    elif quads == 2:
        _row2(taps, count, chunks, packed, period, acc, total)
    elif quads == 3:
        _row3(taps, count, chunks, packed, period, acc, total)
    elif quads == 4:
        _row4(taps, count, chunks, packed, period, acc, total)
    elif quads == 5:
        _row5(taps, count, chunks, packed, period, acc, total)
    elif quads == 6:
        _row6(taps, count, chunks, packed, period, acc, total)
    elif quads == 7:
        _row7(taps, count, chunks, packed, period, acc, total)
    elif quads == 8:
        _row8(taps, count, chunks, packed, period, acc, total)
    elif quads == 9:
        _row9(taps, count, chunks, packed, period, acc, total)
    elif quads == 10:
        _row10(taps, count, chunks, packed, period, acc, total)
    elif quads == 11:
        _row11(taps, count, chunks, packed, period, acc, total)
    elif quads == 12:
        _row12(taps, count, chunks, packed, period, acc, total)
    else:
        _row13(taps, count, chunks, packed, period, acc, total)


@njit(cache=True)
def rows(phased, packed, lane_weights, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts, acc, total):
    """``depthwise._depthwise_rows``' outputs and window sums (int32 [OH * OW][L], rows written
    whole) over the padded input ``phased`` [Hp][stride_x][Wp / stride_x][L] int8 (C-contiguous):
    ``packed`` (``pack`` of ``lane_weights`` int16 [taps][L]) by ``vpdpbusd``, the elements past
    the last whole 64-element chunk of a row by a scalar loop on ``lane_weights``."""
    lanes = phased.shape[3]
    size = out_w * lanes
    count = kernel_h * kernel_w
    chunks = size // 64
    period = packed.shape[0]
    taps = np.empty(4 * ((count + 3) // 4), np.int64)  # the runs' byte offsets in ``phased``
    addresses = np.empty_like(taps)
    base, flat = phased.ctypes.data, phased.reshape(-1)
    row_bytes, phase_bytes = phased.shape[1] * phased.shape[2] * lanes, phased.shape[2] * lanes
    acc_flat, total_flat = acc.reshape(-1), total.reshape(-1)
    for oy in range(out_h):
        for ky in range(kernel_h):
            iy = oy * stride_y + ky * dilation_y
            for kx in range(kernel_w):
                taps[ky * kernel_w + kx] = iy * row_bytes + starts[kx, 0] * phase_bytes + starts[kx, 1] * lanes
        for t in range(count, taps.shape[0]):
            taps[t] = taps[0]
        out_at = oy * size
        if chunks > 0:
            for t in range(taps.shape[0]):
                addresses[t] = base + taps[t]
            _chunks(addresses.ctypes.data, count, chunks, packed.ctypes.data, period,
                    acc.ctypes.data + out_at * 4, total.ctypes.data + out_at * 4)
        for i in range(chunks * 64, size):
            lane = i % lanes
            value, window = np.int32(0), np.int32(0)
            for t in range(count):
                x = np.int32(flat[taps[t] + i])
                value += np.int32(lane_weights[t, lane]) * x
                window += x
            acc_flat[out_at + i] = value
            total_flat[out_at + i] = window


def pack(lane_weights: np.ndarray) -> np.ndarray:
    """int [taps][L] lane weights (int8 range, lanes past the channels 0) -> the 64-byte aligned
    uint8 [period][quads][4][64] ``rows`` reads: chunk k of a row (elements 64 k .. 64 k + 63,
    element i of lane i mod L), quad q, vector v, byte 4 j + b = w[4 q + b][lane of element
    64 k + 16 v + j] + 128 (0 for taps past the kernel's); period = lcm(L, 64) / 64."""
    taps, lanes = lane_weights.shape
    if taps > MAX_TAPS or lanes == 0:
        raise ValueError(f"depthwise VNNI packing: {taps} taps x {lanes} lanes (at most {MAX_TAPS} taps)")
    values = np.asarray(lane_weights, np.int64)
    if values.min(initial=0) < -128 or values.max(initial=0) > 127:
        raise ValueError("depthwise VNNI packing: weights past int8")
    period = math.lcm(lanes, 64) // 64
    quads = -(-taps // 4)
    unsigned = np.zeros((4 * quads, lanes), np.uint8)
    unsigned[:taps] = values + 128
    element_lanes = np.arange(period * 64) % lanes  # [period * 64]
    # [period][64 elements][4 q + b] -> [period][quads][64 elements][4]
    blocks = unsigned[:, element_lanes].T.reshape(period, 64, quads, 4).transpose(0, 2, 1, 3)
    size = blocks.size
    raw = np.empty(size + 64, np.uint8)
    start = -raw.ctypes.data % 64  # aligned vector loads
    packed = raw[start:start + size].reshape(period, quads, 4, 64)
    packed[:] = blocks.reshape(period, quads, 4, 64)
    packed.flags.writeable = False
    return packed
