"""Exact int8 x int8 matrix products on AVX-512 VNNI (``vpdpbusd``; issue 20, NUMERICS.md 29).

``products`` computes ``acc[p][n] = sum_k A[p][k] * B[n][k]`` in int32 for int8 activations A and
weights B. A is read in place: row p starts at byte ``bases[p]`` of a flat int8 buffer and its
reduction is ``len(segs)`` runs of ``4 * quads`` bytes, run j at ``bases[p] + segs[j]`` - so the
NC1HWC2 feature atoms (one run per surface and kernel tap) or a padded copy of them serve as the
operand with no im2col gather. B is packed once per weight set (``pack``): unsigned bytes
``w + 128``, 16 columns x 4 bytes per 64-byte vector, the vectors of a column block one after the
other along the reduction.

The micro-kernel (``_make_tile``) keeps MR x NV vectors of 16 int32 sums in registers and, per
4 reduction bytes, broadcasts each row's 4 signed bytes and issues one ``vpdpbusd`` per vector
(64 multiply-adds, all exact). ``vpdpbusd`` multiplies unsigned by signed bytes, hence the
weights' +128: ``acc = A.W + 128 * sum_k A[p][k]``; the caller's weight column of ones (packed as 1)
gives that row sum - the window sum the CORE needs anyway - and ``A.W = acc - 128 * sum``. Where that
column would take a vector of its own (a kernel count a multiple of 16), ``products_core`` blends
the sums instead (``_blend``: one ``vpdpbusd`` per quad for all the tile's rows; NUMERICS.md 51).
Reduction slots past the real channels are packed as 0, so whatever bytes the operand holds
there add nothing. Every partial sum is below 2**31 in magnitude while the reduction is at most
``MAX_REDUCTION`` bytes (255 * 128 per byte), so int32 never wraps.

The intrinsic exists only on CPUs with AVX-512 VNNI and BW: ``available()`` says whether this
process may call it (host features as LLVM reports them, Numba compiling for the host). Elsewhere
callers keep the float32 BLAS path; the kernel is then never compiled (Numba compiles on the first
call), and Numba's on-disk cache is keyed by CPU name and features, so a cache written here is
not loaded on another CPU.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from npuemu.emulator.kernels import host_cpu

#: rows of A per micro-kernel call (bases are padded to a multiple: the extra rows read row 0)
MR = 4
#: the widest micro-kernel: 4 vectors of 16 columns
NV = 4
#: longest reduction (bytes) whose int32 sums cannot wrap: 65793 * 255 * 128 < 2**31
MAX_REDUCTION = 65536
_VEC = ir.VectorType(ir.IntType(32), 16)
_I32, _I64 = ir.IntType(32), ir.IntType(64)
_FEATURES = ("+avx512vnni", "+avx512bw", "+avx512f")
_host_ok = None


def available() -> bool:
    """Whether the VNNI products may run: the host has AVX-512 VNNI/BW, Numba compiles for the
    host (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES unset) and NPUEMU_INT8_GEMM is not 0."""
    global _host_ok
    if os.environ.get("NPUEMU_INT8_GEMM", "1") == "0":
        return False
    if _host_ok is None:
        _host_ok = host_cpu.compiles_for_host(*_FEATURES)
    return _host_ok


def _address(builder, base, offset, pointee):
    return builder.inttoptr(builder.add(base, offset), pointee.as_pointer())


def _accumulate(builder, a_addr, bases, segs, nsegs, quads, b_addr, b_stride, nv: int, mr: int, ones=None):
    """IR: the mr x nv vectors of int32 sums over the whole reduction (entry-block allocas, which
    LLVM keeps in registers); with ``ones`` (the address of ``ones_vectors``) also the window-sum
    vector (``_blend``), else None."""
    dot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3),
                                         "llvm.x86.avx512.vpdpbusd.512")
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VEC, None)) for _ in range(nv)] for _ in range(mr)]
    window = None if ones is None else cgutils.alloca_once_value(builder, ir.Constant(_VEC, None))
    rows = [builder.add(a_addr, builder.load(_address(builder, bases, ir.Constant(_I64, 8 * r), _I64)))
            for r in range(mr)]
    with cgutils.for_range(builder, nsegs) as segment:
        offset = builder.load(_address(builder, segs, builder.mul(segment.index, ir.Constant(_I64, 8)), _I64))
        first = builder.mul(segment.index, quads)
        with cgutils.for_range(builder, quads) as quad:
            slot = builder.mul(builder.add(first, quad.index), ir.Constant(_I64, 64))
            weights = [builder.load(_address(builder, builder.add(b_addr, slot),
                                             builder.mul(b_stride, ir.Constant(_I64, v)), _VEC), align=64)
                       for v in range(nv)]
            at = builder.add(offset, builder.mul(quad.index, ir.Constant(_I64, 4)))
            splats = [_splat(builder, builder.load(_address(builder, rows[r], at, _I32), align=1)) for r in range(mr)]
            for r in range(mr):
                for v in range(nv):
                    # vpdpbusd(sums, unsigned weight bytes, signed activation bytes)
                    builder.store(builder.call(dot, [builder.load(accs[r][v]), weights[v], splats[r]]), accs[r][v])
            if window is not None:
                ones_vector = builder.load(_address(builder, ones, slot, _VEC), align=64)
                builder.store(builder.call(dot, [builder.load(window), ones_vector, _blend(builder, splats)]), window)
    return accs, window


def _blend(builder, splats):
    """IR: one vector of the rows' 4 operand bytes, row r's in lanes [r * g, (r + 1) * g) (g = 16 /
    rows): constant-mask blends (vector ALU ops beside the ``vpdpbusd`` pipes), so one
    ``vpdpbusd`` with the ones adds every row's window sum instead of one per row."""
    group = 16 // len(splats)
    blended = splats[0]
    for r in range(1, len(splats)):
        lanes = ir.Constant(ir.VectorType(ir.IntType(1), 16), [r * group <= j < (r + 1) * group for j in range(16)])
        blended = builder.select(lanes, splats[r], blended)
    return blended


def _window_sums(builder, window, mr: int):
    """IR: the mr rows' int32 window sums from ``_blend``'s accumulated vector (every lane of a
    row's group holds its whole sum: lane r * g)."""
    value = builder.load(window)
    return [builder.extract_element(value, ir.Constant(_I32, r * (16 // mr))) for r in range(mr)]


def _splat(builder, value):
    return builder.shuffle_vector(builder.insert_element(ir.Constant(_VEC, ir.Undefined), value, ir.Constant(_I32, 0)),
                                  ir.Constant(_VEC, ir.Undefined), ir.Constant(_VEC, None))


def _raw_codegen(nv: int, mr: int):
    """IR of ``_make_tile``'s raw form: the sums stored as they are."""
    def codegen(context, builder, signature, args):
        out_addr, out_stride = args[7:9]
        accs, _ = _accumulate(builder, *args[:7], nv, mr)
        for r in range(mr):
            row = builder.add(out_addr, builder.mul(out_stride, ir.Constant(_I64, 4 * r)))
            for v in range(nv):
                builder.store(builder.load(accs[r][v]), _address(builder, row, ir.Constant(_I64, 64 * v), _VEC), align=4)
        return context.get_dummy_value()
    return codegen


def _core_codegen(nv: int, mr: int):
    """IR of ``_make_tile``'s CORE form (CLIP_TRUNCATE 0): per valid row its window sum S (read
    from column ``kernels`` of this tile when ``first``, stored to ``sums``; else loaded from
    there), then ``sum - 128 * S`` in the columns below ``kernels`` and 0 past them."""
    def codegen(context, builder, signature, args):
        out_addr, out_stride, sums_addr, valid, kernels, first = args[7:]
        accs, _ = _accumulate(builder, *args[:7], nv, mr)
        spill = cgutils.alloca_once(builder, _VEC, size=nv)
        window = cgutils.alloca_once(builder, _I32)
        for r in range(mr):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), valid)):
                total = _address(builder, sums_addr, ir.Constant(_I64, 8 * r), _I64)
                with builder.if_else(builder.icmp_signed("!=", first, ir.Constant(_I64, 0))) as (column, stored):
                    with column:
                        for v in range(nv):
                            builder.store(builder.load(accs[r][v]), builder.gep(spill, [ir.Constant(_I64, v)]))
                        value = builder.load(builder.gep(builder.bitcast(spill, _I32.as_pointer()), [kernels]))
                        builder.store(builder.sext(value, _I64), total)
                        builder.store(value, window)
                    with stored:
                        builder.store(builder.trunc(builder.load(total), _I32), window)
                _store_core_row(builder, accs[r], builder.load(window), out_addr, out_stride, r, kernels)
        return context.get_dummy_value()
    return codegen


def _blend_codegen(nv: int, mr: int):
    """IR of ``_make_tile``'s CORE form with the window sums blended (``_blend``; weights packed
    without the column of ones): per valid row S stored to ``sums`` and the outputs as
    ``_core_codegen``'s."""
    def codegen(context, builder, signature, args):
        out_addr, out_stride, sums_addr, valid, kernels, ones = args[7:]
        accs, window = _accumulate(builder, *args[:7], nv, mr, ones)
        windows = _window_sums(builder, window, mr)
        for r in range(mr):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), valid)):
                builder.store(builder.sext(windows[r], _I64), _address(builder, sums_addr, ir.Constant(_I64, 8 * r), _I64))
                _store_core_row(builder, accs[r], windows[r], out_addr, out_stride, r, kernels)
        return context.get_dummy_value()
    return codegen


def _store_core_row(builder, accs, window, out_addr, out_stride, r: int, kernels) -> None:
    """IR: row r's ``sum - 128 * window`` in the columns below ``kernels``, 0 past them."""
    shift = _splat(builder, builder.mul(window, ir.Constant(_I32, 128)))
    limit = _splat(builder, builder.trunc(kernels, _I32))
    lanes = ir.Constant(_VEC, list(range(16)))
    row = builder.add(out_addr, builder.mul(out_stride, ir.Constant(_I64, 4 * r)))
    for v, acc in enumerate(accs):
        column = builder.add(lanes, ir.Constant(_VEC, [16 * v] * 16))
        value = builder.select(builder.icmp_signed("<", column, limit), builder.sub(builder.load(acc), shift),
                               ir.Constant(_VEC, None))
        builder.store(value, _address(builder, row, ir.Constant(_I64, 64 * v), _VEC), align=4)


def _make_tile(nv: int, mr: int = MR, core: bool = False, blend: bool = False):
    """``tile(a, bases, segs, nsegs, quads, b, b_stride, out, out_stride[, sums, valid, kernels,
    first | ones])``, all byte addresses or counts (intp): rows ``bases[0..mr)`` of A times ``nv``
    packed weight vectors (``b``, the next one ``b_stride`` bytes on) -> int32 ``out``
    [mr][16 * nv], rows ``out_stride`` elements apart: the raw sums, or with ``core`` the CORE
    outputs of the first ``valid`` rows (``_core_codegen``; ``kernels`` counted from the tile's
    first column), with ``blend`` their window sums from ``ones`` (``_blend_codegen``)."""
    if blend:
        @intrinsic
        def tile(typingctx, a_addr, bases, segs, nsegs, quads, b_addr, b_stride, out_addr, out_stride,
                 sums_addr, valid, kernels, ones_addr):
            return types.void(*([types.intp] * 13)), _blend_codegen(nv, mr)
    elif core:
        @intrinsic
        def tile(typingctx, a_addr, bases, segs, nsegs, quads, b_addr, b_stride, out_addr, out_stride,
                 sums_addr, valid, kernels, first):
            return types.void(*([types.intp] * 13)), _core_codegen(nv, mr)
    else:
        @intrinsic
        def tile(typingctx, a_addr, bases, segs, nsegs, quads, b_addr, b_stride, out_addr, out_stride):
            return types.void(*([types.intp] * 9)), _raw_codegen(nv, mr)
    return tile


_tile1, _tile2, _tile3, _tile4 = (_make_tile(nv) for nv in (1, 2, 3, 4))
#: narrow products (one or two vectors of columns): twice the rows per call, so each weight
#: vector loaded serves 8 rows
_wide1, _wide2 = _make_tile(1, 2 * MR), _make_tile(2, 2 * MR)
_core1, _core2, _core3, _core4 = (_make_tile(nv, core=True) for nv in (1, 2, 3, 4))
_core_wide1, _core_wide2 = _make_tile(1, 2 * MR, True), _make_tile(2, 2 * MR, True)
_blend1, _blend2, _blend3, _blend4 = (_make_tile(nv, blend=True) for nv in (1, 2, 3, 4))
_blend_wide1, _blend_wide2 = _make_tile(1, 2 * MR, blend=True), _make_tile(2, 2 * MR, blend=True)


@njit(cache=True)
def products(source, bases, segs, quads, packed, acc):
    """int32 ``acc`` [len(bases)][16 * nvec] (C-contiguous) = the rows of int8 ``source`` (flat,
    C-contiguous) at ``bases`` (int64 byte offsets, a multiple of MR of them) with the runs ``segs``
    of ``4 * quads`` bytes, times ``packed`` uint8 [nvec][len(segs) * quads][64] (``pack``)."""
    nvec = packed.shape[0]
    stride = packed.shape[1] * 64
    pitch = acc.shape[1]
    a_addr, b_addr, out_addr = source.ctypes.data, packed.ctypes.data, acc.ctypes.data
    segs_addr, nsegs, bases_addr = segs.ctypes.data, segs.shape[0], bases.ctypes.data
    for v0 in range(0, nvec, NV):  # a column block's weights stay near the core over all rows
        width = min(NV, nvec - v0)
        weights = b_addr + v0 * stride
        first = 0
        if width <= 2:  # 2 * MR rows a call while they last
            for p0 in range(0, bases.shape[0] - 2 * MR + 1, 2 * MR):
                rows = bases_addr + p0 * 8
                out = out_addr + (p0 * pitch + v0 * 16) * 4
                if width == 2:
                    _wide2(a_addr, rows, segs_addr, nsegs, quads, weights, stride, out, pitch)
                else:
                    _wide1(a_addr, rows, segs_addr, nsegs, quads, weights, stride, out, pitch)
            first = bases.shape[0] // (2 * MR) * (2 * MR)
        for p0 in range(first, bases.shape[0], MR):
            rows = bases_addr + p0 * 8
            out = out_addr + (p0 * pitch + v0 * 16) * 4
            if width == 4:
                _tile4(a_addr, rows, segs_addr, nsegs, quads, weights, stride, out, pitch)
            elif width == 3:
                _tile3(a_addr, rows, segs_addr, nsegs, quads, weights, stride, out, pitch)
            elif width == 2:
                _tile2(a_addr, rows, segs_addr, nsegs, quads, weights, stride, out, pitch)
            else:
                _tile1(a_addr, rows, segs_addr, nsegs, quads, weights, stride, out, pitch)


@njit(cache=True)
def products_core(source, bases, segs, quads, packed, kernels, out, sums, ones):
    """``products`` with the CORE stage of CLIP_TRUNCATE 0 fused (``_core_codegen``): int32
    ``out`` [P][C] (C-contiguous; its buffer at least 16 elements longer: a row's last vector may
    spill into the next row, rewritten later, and past the last one) receives ``A.W`` in columns
    below ``kernels`` and 0 past them, int64 ``sums`` [P] the window sums: column ``kernels`` of
    the packed weights (which cover C columns), or where ``ones`` has rows (``ones_vectors``; the
    weights then without that column) blended by the first column block (``_blend_codegen``).
    The column blocks run from the one holding column ``kernels`` (the window sums first; with
    ``ones`` the last block at most), then down to column 0 (whose stores come last)."""
    nvec = packed.shape[0]
    stride = packed.shape[1] * 64
    pixels, pitch = out.shape
    a_addr, b_addr, out_addr, sums_addr = source.ctypes.data, packed.ctypes.data, out.ctypes.data, sums.ctypes.data
    segs_addr, nsegs, bases_addr, ones_addr = segs.ctypes.data, segs.shape[0], bases.ctypes.data, ones.ctypes.data
    blocks = -(-nvec // NV)
    top = min(kernels // 16 // NV, blocks - 1) * NV
    for block in range(-1, blocks):
        v0 = top if block < 0 else (blocks - 1 - block) * NV
        if block >= 0 and v0 == top:
            continue
        width, weights, first = min(NV, nvec - v0), b_addr + v0 * stride, 1 if block < 0 else 0
        blend = first == 1 and ones.shape[0] > 0
        start = 0
        if width <= 2:
            for p0 in range(0, bases.shape[0] - 2 * MR + 1, 2 * MR):
                args = (a_addr, bases_addr + p0 * 8, segs_addr, nsegs, quads, weights, stride,
                        out_addr + (p0 * pitch + v0 * 16) * 4, pitch, sums_addr + p0 * 8,
                        min(2 * MR, pixels - p0), kernels - v0 * 16)
                if blend:
                    if width == 2:
                        _blend_wide2(*args, ones_addr)
                    else:
                        _blend_wide1(*args, ones_addr)
                elif width == 2:
                    _core_wide2(*args, first)
                else:
                    _core_wide1(*args, first)
            start = bases.shape[0] // (2 * MR) * (2 * MR)
        for p0 in range(start, bases.shape[0], MR):
            args = (a_addr, bases_addr + p0 * 8, segs_addr, nsegs, quads, weights, stride,
                    out_addr + (p0 * pitch + v0 * 16) * 4, pitch, sums_addr + p0 * 8,
                    min(MR, pixels - p0), kernels - v0 * 16)
            if blend:
                _blend_tile(width, args, ones_addr)
            elif width == 4:
                _core4(*args, first)
            elif width == 3:
                _core3(*args, first)
            elif width == 2:
                _core2(*args, first)
            else:
                _core1(*args, first)


@njit(cache=True, inline="always")
def _blend_tile(width, args, ones_addr):
    # (products_core's MR-row tile of ``width`` vectors, window sums blended)
    if width == 4:
        _blend4(*args, ones_addr)
    elif width == 3:
        _blend3(*args, ones_addr)
    elif width == 2:
        _blend2(*args, ones_addr)
    else:
        _blend1(*args, ones_addr)


#: ``products_core``'s ``ones`` where the packed weights hold the column of ones
NO_ONES = np.zeros((0, 64), np.uint8)


def ones_vectors(ones: np.ndarray) -> np.ndarray:
    """uint8 [K] (1 for the reduction slots a window sum counts, 0 elsewhere; K a multiple of 4)
    -> the 64-byte aligned uint8 [K / 4][64] ``products_core`` blends against: quad q's 4 bytes in
    each of the 16 lanes."""
    quads = ones.reshape(-1, 4)
    raw = np.empty(quads.shape[0] * 64 + 64, np.uint8)
    start = -raw.ctypes.data % 64
    vectors = raw[start:start + quads.shape[0] * 64].reshape(-1, 16, 4)
    vectors[:] = quads[:, None, :]
    vectors = vectors.reshape(-1, 64)
    vectors.flags.writeable = False
    return vectors


def pack(columns: np.ndarray) -> np.ndarray:
    """uint8 [N][K] (K a multiple of 4; the weights + 128, 0 in unused slots) -> the 64-byte
    aligned uint8 [ceil(N / 16)][K / 4][64] that ``products`` reads (columns past N are 0)."""
    count, reduction = columns.shape
    if reduction % 4:
        raise ValueError(f"int8 GEMM packing: reduction {reduction} is not a multiple of 4")
    vectors = -(-count // 16)
    full = np.zeros((vectors * 16, reduction), np.uint8)
    full[:count] = columns
    blocks = full.reshape(vectors, 16, reduction // 4, 4).transpose(0, 2, 1, 3)
    size = blocks.size
    raw = np.empty(size + 64, np.uint8)
    start = -raw.ctypes.data % 64  # the micro-kernel's weight loads assume 64-byte alignment
    packed = raw[start:start + size].reshape(vectors, reduction // 4, 64)
    packed[:] = blocks.reshape(vectors, reduction // 4, 64)
    packed.flags.writeable = False
    return packed
