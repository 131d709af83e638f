"""float32 matrix products summed in one fixed order: k after k from +0 (issue 20, NUMERICS.md 3.3, 47).

``products`` computes ``C[m][n] = (((+0 + p0) + p1) + ...) + p(K-1)``, ``p_k = A[m][k] * B[k][n]``,
one float32 rounding per add, for every element - the order of the vendor simulator's fp16
convolutions (NUMERICS.md 3.3). The outputs are independent, so the work is vectorised across them:
the micro-kernel (``_make_tile``) keeps MR rows x NV vectors of 16 columns of sums in registers and,
per k, loads the NV vectors of B's row k, broadcasts each row's A[m][k] and adds the products
(``llvm.fma``). For fp16-valued operands a product is exact in float32 (11 x 11 significand bits,
exponents within float32's normal range), so ``fma(a, b, s) = round(a * b + s) = round(round(a * b) +
s)``: the fused form gives the bits of multiply-then-add. On a host without FMA (or a Numba build for a
generic CPU) the IR has ``fmul`` then ``fadd`` instead - the same bits. LLVM lowers the 16-lane vectors
to AVX-512, two AVX2 halves or scalars, so the kernel runs on any x86-64 host. A NaN sum is stored as
the canonical NaN (``canonical_nan``: one compare and select a stored vector), so NaN bits too are the
same on every host and path - which NaN x86 keeps where two meet is the instruction form's choice.

A (the weights) is packed once per weight set (``pack``): blocks of MR rows, rows past M zero, in the
order the kernel reads them. B is read in place: row k starts ``offsets[k]`` bytes after B's start and
its N columns are contiguous, so im2col columns (``offsets[k] = k * pitch``), the padded planes of a 1x1
convolution (``offsets[k] = k * plane``) or the taps of a convolution over the planes or their phases
(``offsets[k]`` = the tap's start, ``mac.gemm_layout``) serve without a gather. Blocking: column chunks
of NC, the reduction in blocks of KC, tiles of 16 NV columns; a block after the first loads the partial
sums and keeps adding, so every sum still runs k = 0, 1, ... K - 1 in order. Column tails use masked
loads and stores (never touching memory past the last column). Products of a few columns (the FC
layers' one) vectorise across rows instead (``pack``'s narrow form, ``_narrow``).

``products_loops`` is the same order in plain Numba (no intrinsics): NPUEMU_FP16_GEMM=0, and the
tests' second implementation.
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from npuemu.emulator.kernels import host_cpu
from npuemu.emulator.kernels.canonical_nan import canonical_ir, canonical_rows

#: rows of A per micro-kernel call (the packed blocks' width)
MR = 6
#: vectors of 16 columns per micro-kernel call
NV = 4
#: reduction rows per block: 256 rows of 16 NV float32 columns of B = 64 KiB (L2)
KC = 256
#: products of at most this many columns take ``pack``'s narrow form (``_narrow``)
NARROW = 4
#: columns per chunk: a reduction block's rows of B over the chunk, KC x NC float32 = 512 KiB (L2)
NC = 512
_F32, _I64 = ir.FloatType(), ir.IntType(64)
_VEC, _MASK, _LANES = ir.VectorType(ir.FloatType(), 16), ir.VectorType(ir.IntType(1), 16), ir.VectorType(ir.IntType(64), 16)
_fused = None


def fused() -> bool:
    """Whether the micro-kernel's adds are ``llvm.fma``: the host has FMA and Numba compiles for it."""
    global _fused
    if _fused is None:
        _fused = host_cpu.compiles_for_host("+fma")
    return _fused


#: NPUEMU_FP16_GEMM=0 (read at import): ``products_loops`` instead of the micro-kernel (the same bits)
_PLAIN = os.environ.get("NPUEMU_FP16_GEMM", "1") == "0"


def _address(builder, base, offset, pointee):
    return builder.inttoptr(builder.add(base, offset), pointee.as_pointer())


def _splat(builder, value):
    return builder.shuffle_vector(builder.insert_element(ir.Constant(_VEC, ir.Undefined), value, ir.Constant(_I64, 0)),
                                  ir.Constant(_VEC, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), 16), None))


def _splat_int(builder, value):
    return builder.shuffle_vector(builder.insert_element(ir.Constant(_LANES, ir.Undefined), value, ir.Constant(_I64, 0)),
                                  ir.Constant(_LANES, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), 16), None))


def _masks(builder, columns, nv: int):
    """Per vector v, lanes 16 v + i < columns."""
    limit = builder.shuffle_vector(builder.insert_element(ir.Constant(_LANES, ir.Undefined), columns, ir.Constant(_I64, 0)),
                                   ir.Constant(_LANES, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), 16), None))
    return [builder.icmp_signed("<", ir.Constant(_LANES, [16 * v + i for i in range(16)]), limit) for v in range(nv)]


def _load(builder, address, mask):
    if mask is None:
        return builder.load(address, align=4)
    load = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC.as_pointer(), ir.IntType(32), _MASK, _VEC]),
                                          "llvm.masked.load.v16f32.p0v16f32")
    return builder.call(load, [address, ir.Constant(ir.IntType(32), 4), mask, ir.Constant(_VEC, None)])


def _store(builder, value, address, mask):
    if mask is None:
        builder.store(value, address, align=4)
        return
    store = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [_VEC, _VEC.as_pointer(), ir.IntType(32), _MASK]),
                                           "llvm.masked.store.v16f32.p0v16f32")
    builder.call(store, [value, address, ir.Constant(ir.IntType(32), 4), mask])


def _codegen(nv: int, masked: bool, fma: bool):
    """IR of ``_make_tile``: sums loaded (or +0), kc steps of MR x nv vectors of products added in k
    order, the valid rows stored."""
    def codegen(context, builder, signature, args):
        a_addr, offsets, kc, b_addr, c_addr, c_stride, first, rows, columns = args
        fused_add = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3), "llvm.fma.v16f32")
        masks = _masks(builder, columns, nv) if masked else [None] * nv
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VEC, None)) for _ in range(nv)] for _ in range(MR)]
        targets = [builder.add(c_addr, builder.mul(c_stride, ir.Constant(_I64, r))) for r in range(MR)]
        with builder.if_then(builder.icmp_signed("==", first, ir.Constant(_I64, 0))):
            for r in range(MR):  # a later reduction block: the partial sums so far
                with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), rows)):
                    for v in range(nv):
                        address = _address(builder, targets[r], ir.Constant(_I64, 64 * v), _VEC)
                        builder.store(_load(builder, address, masks[v]), accs[r][v])
        with cgutils.for_range(builder, kc) as step:
            k = step.index
            row = builder.add(b_addr, builder.load(_address(builder, offsets, builder.mul(k, ir.Constant(_I64, 8)), _I64)))
            vectors = [_load(builder, _address(builder, row, ir.Constant(_I64, 64 * v), _VEC), masks[v]) for v in range(nv)]
            weights = builder.add(a_addr, builder.mul(k, ir.Constant(_I64, 4 * MR)))
            for r in range(MR):
                weight = _splat(builder, builder.load(_address(builder, weights, ir.Constant(_I64, 4 * r), _F32), align=4))
                for v in range(nv):
                    total = builder.load(accs[r][v])
                    if fma:
                        total = builder.call(fused_add, [weight, vectors[v], total])
                    else:  # the product is exact: the same bits as the fused add
                        total = builder.fadd(total, builder.fmul(weight, vectors[v]))
                    builder.store(total, accs[r][v])
        for r in range(MR):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(_I64, r), rows)):
                for v in range(nv):
                    # + 0 on the first block's sums would change nothing: they start at +0. A NaN sum is
                    # stored as the canonical NaN (which NaN x86 keeps is the instruction form's choice)
                    value = canonical_ir(builder, builder.load(accs[r][v]))
                    _store(builder, value, _address(builder, targets[r], ir.Constant(_I64, 64 * v), _VEC), masks[v])
        return context.get_dummy_value()
    return codegen


def _make_tile(nv: int, masked: bool):
    """``tile(a, offsets, kc, b, c, c_stride, first, rows, columns)`` (byte addresses and counts, intp):
    C rows ``[0, rows)`` (``c_stride`` bytes apart) x columns ``[0, 16 nv)`` (``[0, columns)`` when
    ``masked``) += the kc steps of packed A at ``a`` ([kc][MR]) times B rows ``b + offsets[k]``; the sums
    start at +0 when ``first`` else from C."""
    fma = fused()

    @intrinsic
    def tile(typingctx, a_addr, offsets, kc, b_addr, c_addr, c_stride, first, rows, columns):
        return types.void(*([types.intp] * 9)), _codegen(nv, masked, fma)
    return tile


_full = _make_tile(NV, False)
_tail1, _tail2, _tail3, _tail4 = (_make_tile(nv, True) for nv in (1, 2, 3, 4))


@njit(cache=True)
def _products(packed, offsets, flat, b_start, columns, out, rows):
    """``products`` after its checks (addresses taken here: ``ndarray.ctypes`` costs microseconds in
    Python). Loops: column chunks of NC (their rows of a reduction block, KC x NC, stay in L2),
    reduction blocks of KC, row blocks of MR (a block's KC x MR weights stay in L1 over the chunk's
    tiles), tiles of 16 NV columns."""
    blocks, reduction = packed.shape[0], packed.shape[1]
    if reduction == 0:  # no products: every sum is its +0 (the loop below would leave ``out`` as it was)
        out[:, :] = 0
        return
    a_addr, o_addr = packed.ctypes.data, offsets.ctypes.data
    b_addr, c_addr, out_stride = flat.ctypes.data + b_start, out.ctypes.data, out.strides[0]
    padded_rows = blocks * MR
    width = 16 * NV
    for c0 in range(0, columns, NC):
        chunk = min(NC, columns - c0)
        for k0 in range(0, reduction, KC):
            kc = min(KC, reduction - k0)
            first = 1 if k0 == 0 else 0
            for block in range(blocks):
                a = a_addr + (k0 * padded_rows + block * kc * MR) * 4  # (pack's order)
                valid = min(MR, rows - block * MR)
                for n0 in range(c0, c0 + chunk, width):
                    count = min(width, c0 + chunk - n0)
                    args = (a, o_addr + k0 * 8, kc, b_addr + n0 * 4, c_addr + block * MR * out_stride + n0 * 4,
                            out_stride, first, valid, count)
                    if count == width:
                        _full(*args)
                    elif count > 48:
                        _tail4(*args)
                    elif count > 32:
                        _tail3(*args)
                    elif count > 16:
                        _tail2(*args)
                    else:
                        _tail1(*args)


def products(packed: np.ndarray, offsets: np.ndarray, b: np.ndarray, b_start: int, columns: int,
             out: np.ndarray, rows: int) -> None:
    """``out`` [rows][columns] (rows any stride, columns contiguous float32) = packed A (``pack`` of
    [rows][K]) times B: row k of B is the ``columns`` float32 at byte ``b_start + offsets[k]`` of the
    C-contiguous float32 array ``b`` (the caller keeps every such row inside ``b``); each sum k after k
    from +0 (the module docstring)."""
    if out.shape != (rows, columns) or out.strides[1] != 4 or out.dtype != np.float32 or b.dtype != np.float32 \
            or not b.flags.c_contiguous or packed.dtype != np.float32 or offsets.dtype != np.int64 \
            or offsets.shape[0] != (packed.shape[1] if packed.ndim == 3 else packed.shape[0]):
        raise ValueError("fp32 sequential GEMM: operands of the wrong shape or layout")
    run(packed, offsets, b.reshape(-1), b_start, out)


def run(packed: np.ndarray, offsets: np.ndarray, flat: np.ndarray, b_start: int, out: np.ndarray) -> None:
    """``products`` without its checks (``flat``: B's buffer, 1-D): for callers whose operands are
    right by construction (``mac.gemm_products``: ~1-2 us a call less, ppocr_rec runs ~300 small ones)."""
    if packed.ndim == 2:  # (pack's narrow form)
        _narrow(packed, offsets, flat, b_start // 4, out, out.shape[0])
    elif _PLAIN:
        products_loops(packed, offsets, flat, b_start // 4, out.shape[1], out, out.shape[0])
    else:
        _products(packed, offsets, flat, b_start, out.shape[1], out, out.shape[0])


#: a narrow block's most vectors of 16 rows and most sums (plain constants: a compiled helper called at import
#: would load Numba's cache then)
_MOST_VECTORS, _MOST_SUMS = 8, 16
#: the narrow form's blocks, (vectors of 16 rows, columns): the columns of a block (up to 8) share each k's
#: loads of A^T's row, and up to 16 sums stay in registers - enough to keep both FMA pipes busy where a column's
#: 4 sums waited on the add's latency each k (issue 20: silero-vad's 129 x 256 x 4 product 6.5 -> ~1.8 us)
_BLOCKS = tuple((nv, nc) for nc in range(1, 9) for nv in range(1, min(_MOST_VECTORS, _MOST_SUMS // nc) + 1))


def _narrow_block(builder, args, nv: int, nc: int, fma: bool, halves: bool) -> None:
    """IR of one of ``_columns``' blocks: nv x nc sums in registers, +0 then k after k, stored (``halves``:
    A^T's rows are binary16 bits, widened exactly as loaded)."""
    a_addr, a_row, offsets, kc, b_addr, c_addr, c_stride, rows, c_step = args[:9]
    fused_add = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VEC, [_VEC] * 3), "llvm.fma.v16f32")
    accs = [[cgutils.alloca_once_value(builder, ir.Constant(_VEC, None)) for _ in range(nv)] for _ in range(nc)]
    with cgutils.for_range(builder, kc) as step:
        k = step.index
        offset = builder.load(_address(builder, offsets, builder.mul(k, ir.Constant(_I64, 8)), _I64))
        row = builder.add(a_addr, builder.mul(k, a_row))
        weights = [_weights(builder, row, v, halves) for v in range(nv)]
        for n in range(nc):
            value = _splat(builder, builder.load(_address(builder, b_addr, builder.add(offset, ir.Constant(_I64, 4 * n)),
                                                          _F32), align=4))
            for v in range(nv):
                total = builder.load(accs[n][v])
                if fma:
                    total = builder.call(fused_add, [weights[v], value, total])
                else:  # the product is exact: the same bits as the fused add
                    total = builder.fadd(total, builder.fmul(weights[v], value))
                builder.store(total, accs[n][v])
    scatter = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [
        _VEC, ir.VectorType(_F32.as_pointer(), 16), ir.IntType(32), _MASK]), "llvm.masked.scatter.v16f32.v16p0f32")
    masks, strides = _masks(builder, rows, nv), _splat_int(builder, c_stride)
    for n in range(nc):
        column = _splat_int(builder, builder.add(c_addr, builder.mul(c_step, ir.Constant(_I64, n))))
        for v in range(nv):
            value = canonical_ir(builder, builder.load(accs[n][v]))  # (a NaN sum stored as the canonical NaN)
            rows_at = builder.mul(strides, ir.Constant(_LANES, [16 * v + i for i in range(16)]))
            targets = builder.inttoptr(builder.add(column, rows_at), ir.VectorType(_F32.as_pointer(), 16))
            builder.call(scatter, [value, targets, ir.Constant(ir.IntType(32), 4), masks[v]])


def _weights(builder, row, v: int, halves: bool):
    """Vector ``v`` (16 rows) of A^T's row at address ``row``: float32, or binary16 bits widened (``fpext``: F16C's
    exact conversion; a NaN quieted, which the sum's canonical NaN hides)."""
    if not halves:
        return builder.load(_address(builder, row, ir.Constant(_I64, 64 * v), _VEC), align=4)
    bits = builder.load(_address(builder, row, ir.Constant(_I64, 32 * v), ir.VectorType(ir.IntType(16), 16)), align=2)
    return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 16)), _VEC)


def _narrow_codegen(fma: bool, halves: bool):
    """IR of ``_columns``: a switch on (vectors, columns) to the ``_BLOCKS`` block's code."""
    def codegen(context, builder, signature, args):
        key = builder.add(builder.mul(args[10], ir.Constant(_I64, 16)), args[9])
        done = builder.append_basic_block("narrow.done")
        switch = builder.switch(key, done)
        for nv, nc in _BLOCKS:
            block = builder.append_basic_block(f"narrow.{nv}x{nc}")
            switch.add_case(ir.Constant(_I64, 16 * nc + nv), block)
            builder.position_at_end(block)
            _narrow_block(builder, args, nv, nc, fma, halves)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()
    return codegen


def _make_columns(halves: bool = False):
    """``columns(a, a_row, offsets, kc, b, c, c_stride, rows, c_step, nv, nc)`` (byte addresses and counts,
    intp; (nv, nc) one of ``_BLOCKS``, rows at most 16 nv): for rows m < ``rows`` of A^T's columns from address
    ``a`` (row k of A^T at ``a + k a_row``) and columns n < nc, the float32 at ``c + n c_step + m c_stride`` =
    +0, then + A^T[k][m] B_k,n for k < kc in order, B_k,n the float32 at ``b + offsets[k] + 4 n``. ``halves``:
    A^T's elements are binary16 bits (only where compiled code widens halves with F16C: ``_narrow_halves``)."""
    fma = fused()

    @intrinsic
    def columns(typingctx, a_addr, a_row, offsets, kc, b_addr, c_addr, c_stride, rows, c_step, nv, nc):
        return types.void(*([types.intp] * 11)), _narrow_codegen(fma, halves)
    return columns


_columns, _columns_halves = _make_columns(), _make_columns(halves=True)


@njit(cache=True)
def _narrow(transposed, offsets, flat, start, out, rows):
    """``products`` of a few columns from ``pack``'s narrow form A^T [K][M']: vectorised across the rows
    instead (a tile of 16 columns would compute mostly nothing), each sum k after k from +0 (multiply
    then add: the product is exact, the bits of the fused add). Blocks of up to 8 columns and 16 sums
    (``_BLOCKS``) keep their sums in registers (``_columns``; issue 20: a loop over a memory row of
    sums paid its alias checks and store-to-load latency at every k, ~1.5 us for 64 x 200)."""
    reduction, width = transposed.shape
    a_addr, o_addr, b_addr, c_addr = transposed.ctypes.data, offsets.ctypes.data, flat.ctypes.data, out.ctypes.data
    row_stride, column_stride = out.strides[0], out.strides[1]
    columns = out.shape[1]
    for n0 in range(0, columns, 8):
        nc = min(8, columns - n0)
        tall = 16 * min(_MOST_VECTORS, _MOST_SUMS // nc)  # (``_BLOCKS``)
        for m0 in range(0, rows, tall):
            valid = min(tall, rows - m0)
            _columns(a_addr + m0 * 4, width * 4, o_addr, reduction, b_addr + (start + n0) * 4,
                     c_addr + m0 * row_stride + n0 * column_stride, row_stride, valid, column_stride,
                     (valid + 15) // 16, nc)


@njit(cache=True)
def _narrow_halves(transposed, offsets, flat, start, out, rows):
    """``_narrow`` from A^T's binary16 bits (uint16 [K][M']: ``pack_halves``), widened as they are loaded: the same
    products and sums, half the bytes of weights to read (issue 20: silero-vad's ~0.8 MB of fp32 weights a run came
    from L3). Only where compiled code widens halves with F16C (``fp16_atoms_ir.halves_native``): without it LLVM
    has no inline widening to lower ``fpext`` to - so a loop of its own, not a flag of ``_narrow``'s, which every
    host compiles."""
    reduction, width = transposed.shape
    a_addr, o_addr, b_addr, c_addr = transposed.ctypes.data, offsets.ctypes.data, flat.ctypes.data, out.ctypes.data
    row_stride, column_stride = out.strides[0], out.strides[1]
    columns = out.shape[1]
    for n0 in range(0, columns, 8):
        nc = min(8, columns - n0)
        tall = 16 * min(_MOST_VECTORS, _MOST_SUMS // nc)  # (``_BLOCKS``)
        for m0 in range(0, rows, tall):
            valid = min(tall, rows - m0)
            _columns_halves(a_addr + m0 * 2, width * 2, o_addr, reduction, b_addr + (start + n0) * 4,
                            c_addr + m0 * row_stride + n0 * column_stride, row_stride, valid, column_stride,
                            (valid + 15) // 16, nc)


@njit(cache=True)
def products_loops(packed, offsets, flat, start, columns, out, rows):
    """``products`` in plain Numba loops: +0, then each k's product added, one rounding per add."""
    blocks, reduction = packed.shape[0], packed.shape[1]
    weights = packed.reshape(-1)
    for m in range(rows):
        block, lane = divmod(m, MR)
        target = out[m]
        target[:] = 0
        for k in range(reduction):
            k0 = k // KC * KC
            weight = weights[k0 * blocks * MR + (block * min(KC, reduction - k0) + k - k0) * MR + lane]
            first = start + offsets[k] // 4
            source = flat[first:first + columns]
            for n in range(columns):
                target[n] = target[n] + weight * source[n]
    canonical_rows(out[:rows])


def pack_halves(matrix: np.ndarray) -> np.ndarray:
    """float16 [M][K] -> ``_narrow_halves``' read-only weights: the bits of A^T [K][M rounded up to 16], rows past M
    zero (+0) - ``pack``'s narrow form before the widening."""
    rows, reduction = matrix.shape
    transposed = np.zeros((reduction, -(-rows // 16) * 16), np.uint16)
    transposed[:, :rows] = matrix.view(np.uint16).T
    transposed.flags.writeable = False
    return transposed


def pack(matrix: np.ndarray, narrow: bool = False) -> np.ndarray:
    """float32 [M][K] -> the read-only weights ``products`` reads, rows past M zero. With ``narrow``
    (products of at most NARROW columns): A^T [K][M rounded up to 16]. Else an array of shape
    [ceil(M / MR)][K][MR] whose memory holds the reduction blocks of KC one after the other, each
    [ceil(M / MR)][KC][MR] (the last one shorter): the order ``_products`` reads them in, one
    sequential stream per chunk of B's columns (shape[...] indexing does not address it past one
    block: only the kernels read it; their scalar loads need no alignment)."""
    rows, reduction = matrix.shape
    if narrow:
        transposed = np.zeros((reduction, -(-rows // 16) * 16), np.float32)
        transposed[:, :rows] = matrix.T
        transposed.flags.writeable = False
        return transposed
    blocks = -(-rows // MR)
    full = np.zeros((blocks, MR, reduction), np.float32)
    full.reshape(blocks * MR, reduction)[:rows] = matrix
    if reduction <= KC:  # one reduction block: [blocks][K][MR] as it is
        packed = np.ascontiguousarray(full.transpose(0, 2, 1))
    else:
        packed = np.empty((blocks, reduction, MR), np.float32)
        flat = packed.reshape(-1)
        for k0 in range(0, reduction, KC):
            kc = min(KC, reduction - k0)
            flat[k0 * blocks * MR:(k0 + kc) * blocks * MR] = full[:, :, k0:k0 + kc].transpose(0, 2, 1).reshape(-1)
    packed.flags.writeable = False
    return packed


def row_offsets(count: int, pitch: int) -> np.ndarray:
    """Byte offsets of B's rows ``pitch`` float32 apart (im2col columns, planes)."""
    return np.arange(count, dtype=np.int64) * (4 * pitch)
