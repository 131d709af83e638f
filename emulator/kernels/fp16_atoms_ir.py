"""LLVM IR pieces for fp16 atoms of 8 lanes (issue 20; NUMERICS.md 49), shared by the depthwise kernel
(``depthwise_fp16_rows``) and the feature fetch into planes (``fetch_fp16``).

- ``widen8``: an atom's 8 fp16 lanes -> 8 floats (F16C's vcvtph2ps) with the signalling-NaN repair of
  ``fp16.fp16_bits_to_fp32_bits_native`` (NUMERICS.md 7 / 33: vcvtph2ps sets a signalling NaN's quiet
  bit, the exact widening keeps it clear), lane-wise: the exact widening of every pattern;
- ``store_planes``: pixel vectors (8 lanes each) to 8 float32 planes, lane l of pixel p at
  ``base + l plane_bytes + 4 p`` - an 8x8 transpose in registers (three two-source shuffle stages) and
  eight vector stores for 8 pixels, element stores for fewer;
- ``planes_to_atoms``: the reverse, 8 float32 planes -> fp16 atoms (the DPU's store: 8 lane vectors
  transposed, each pixel rounded by vcvtps2ph with every NaN the canonical one; session 21);
- ``halves_native``: whether Numba's target has F16C (the intrinsics need it; callers keep their
  portable loops elsewhere).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from npuemu.emulator.kernels.canonical_nan import canonical_ir
from npuemu.emulator.kernels.fp16 import converts_halves

#: lanes of an fp16 atom (C2)
LANES = 8
F8 = ir.VectorType(ir.FloatType(), LANES)
I64 = ir.IntType(64)
_H8 = ir.VectorType(ir.HalfType(), LANES)
_I16x8 = ir.VectorType(ir.IntType(16), LANES)
_I32x8 = ir.VectorType(ir.IntType(32), LANES)


def _splat16(value: int):
    return ir.Constant(_I16x8, [value] * LANES)


def widen8(builder, address):
    """IR: the 8 fp16 lanes at ``address`` (int64) -> <8 x float>, the exact widening."""
    bits = builder.load(builder.inttoptr(address, _I16x8.as_pointer()), align=2)
    wide = builder.bitcast(builder.fpext(builder.bitcast(bits, _H8), F8), _I32x8)
    nan_head = builder.icmp_unsigned("==", builder.and_(bits, _splat16(0x7E00)), _splat16(0x7C00))
    payload = builder.icmp_unsigned("!=", builder.and_(bits, _splat16(0x1FF)), _splat16(0))
    signalling = builder.zext(builder.and_(nan_head, payload), _I32x8)
    return builder.bitcast(builder.xor(wide, builder.shl(signalling, ir.Constant(_I32x8, [22] * LANES))), F8)


def _shuffle(builder, first, second, mask):
    return builder.shuffle_vector(first, second, ir.Constant(ir.VectorType(ir.IntType(32), len(mask)), mask))


def store_planes(builder, values, base, plane_bytes, start):
    """IR: pixel vectors ``values`` (pixels start, start + 1, ...) to float32 planes: lane l of pixel p at
    ``base + l plane_bytes + 4 p`` (int64 addresses and byte counts)."""
    first = builder.add(base, builder.mul(start, ir.Constant(I64, 4)))
    if len(values) != LANES:
        for j, value in enumerate(values):
            for lane in range(LANES):
                at = builder.add(first, builder.add(builder.mul(plane_bytes, ir.Constant(I64, lane)),
                                                    ir.Constant(I64, 4 * j)))
                builder.store(builder.extract_element(value, ir.Constant(ir.IntType(32), lane)),
                              builder.inttoptr(at, ir.FloatType().as_pointer()), align=4)
        return
    for lane, row in enumerate(_transposed(builder, values)):
        at = builder.add(first, builder.mul(plane_bytes, ir.Constant(I64, lane)))
        builder.store(row, builder.inttoptr(at, F8.as_pointer()), align=4)


def _transposed(builder, values):
    """IR: the 8x8 transpose of 8 vectors of 8 (row i's element j -> row j's element i), in three
    two-source shuffle stages."""
    pairs = []  # pixels (j, j + 1): [lanes 0, 1 | 4, 5] and [lanes 2, 3 | 6, 7], the two pixels alternating
    for j in range(0, LANES, 2):
        pairs.append(_shuffle(builder, values[j], values[j + 1], [0, 8, 1, 9, 4, 12, 5, 13]))
        pairs.append(_shuffle(builder, values[j], values[j + 1], [2, 10, 3, 11, 6, 14, 7, 15]))
    quads = []  # quads[4 h + k]: pixels 4 h .. 4 h + 3 of lane k (low half) and lane k + 4 (high half)
    for h in range(2):
        low, high, second_low, second_high = pairs[4 * h], pairs[4 * h + 1], pairs[4 * h + 2], pairs[4 * h + 3]
        for one, other in ((low, second_low), (high, second_high)):
            quads.append(_shuffle(builder, one, other, [0, 1, 8, 9, 4, 5, 12, 13]))
            quads.append(_shuffle(builder, one, other, [2, 3, 10, 11, 6, 7, 14, 15]))
    rows = [None] * LANES
    for k in range(4):
        for lane, mask in ((k, [0, 1, 2, 3, 8, 9, 10, 11]), (k + 4, [4, 5, 6, 7, 12, 13, 14, 15])):
            rows[lane] = _shuffle(builder, quads[k], quads[4 + k], mask)
    return rows


def _widen_codegen(context, builder, signature, args):
    # row r < rows, atom i < count: src + r src_row + i step -> 8 floats at dst + r dst_row + 32 i
    src, step, src_row, dst, dst_row, count, rows = args
    with cgutils.for_range(builder, rows) as row:
        source = builder.add(src, builder.mul(row.index, src_row))
        target = builder.add(dst, builder.mul(row.index, dst_row))
        with cgutils.for_range(builder, count) as loop:
            value = widen8(builder, builder.add(source, builder.mul(loop.index, step)))
            at = builder.add(target, builder.mul(loop.index, ir.Constant(I64, 4 * LANES)))
            builder.store(value, builder.inttoptr(at, F8.as_pointer()), align=4)
    return context.get_dummy_value()


@intrinsic
def widen_pixels(typingctx, src, step, src_row, dst, dst_row, count, rows):
    """``rows`` rows of ``count`` fp16 atoms (16 bytes) ``step`` bytes apart from address ``src`` (rows
    ``src_row`` bytes apart) -> float32 [count][8] at address ``dst`` (rows ``dst_row`` bytes apart):
    the exact widening (NUMERICS.md 7). F16C targets only."""
    return types.void(*([types.intp] * 7)), _widen_codegen


def _planes_codegen(scaled: bool):
    def codegen(context, builder, signature, args):
        # atoms i < count at src + 16 i -> lane l to dst + l plane_bytes + 4 i (blocks of 8 transposed);
        # ``scaled``: +0 + w x with the 8 lane weights w at ``weights`` (the product is exact, one rounding)
        src, weights, dst, plane_bytes, count = args
        zero = ir.Constant(F8, [0.0] * LANES)
        w = builder.load(builder.inttoptr(weights, F8.as_pointer()), align=4) if scaled else None

        def atom(address):
            value = widen8(builder, address)
            # (a NaN product stored as the canonical NaN: NaN x NaN keeps either operand's payload)
            return canonical_ir(builder, builder.fadd(zero, builder.fmul(w, value))) if scaled else value

        blocks = builder.udiv(count, ir.Constant(I64, LANES))
        with cgutils.for_range(builder, blocks) as block:
            start = builder.mul(block.index, ir.Constant(I64, LANES))
            at = builder.add(src, builder.mul(start, ir.Constant(I64, 2 * LANES)))
            values = [atom(builder.add(at, ir.Constant(I64, 2 * LANES * j))) for j in range(LANES)]
            store_planes(builder, values, dst, plane_bytes, start)
        done = builder.mul(blocks, ir.Constant(I64, LANES))
        with cgutils.for_range(builder, builder.sub(count, done)) as rest:
            pixel = builder.add(done, rest.index)
            value = atom(builder.add(src, builder.mul(pixel, ir.Constant(I64, 2 * LANES))))
            store_planes(builder, [value], dst, plane_bytes, pixel)
        return context.get_dummy_value()
    return codegen


@intrinsic
def widen_to_planes(typingctx, src, weights, dst, plane_bytes, count):
    """``count`` consecutive fp16 atoms at address ``src`` -> 8 float32 planes: lane l of atom i at
    ``dst + l plane_bytes + 4 i`` (the exact widening; ``weights`` unused). F16C targets only."""
    return types.void(*([types.intp] * 5)), _planes_codegen(False)


@intrinsic
def scale_to_planes(typingctx, src, weights, dst, plane_bytes, count):
    """``widen_to_planes`` of +0 + w x, w the 8 float32 lane weights at address ``weights``: a 1x1
    depthwise kernel (one rounding: the product of fp16 values is exact; +0 turns -0 into +0; a NaN
    result stored as the canonical NaN, ``canonical_nan``)."""
    return types.void(*([types.intp] * 5)), _planes_codegen(True)


def _narrow8(builder, value):
    # <8 x float> -> <8 x half> bits: vcvtps2ph (nearest even), every NaN first the canonical one (0x7E00 after)
    return builder.bitcast(builder.fptrunc(canonical_ir(builder, value), _H8), _I16x8)


def _atoms_codegen(context, builder, signature, args):
    # pixels i < count of 8 float32 planes (lane l at src + l plane_bytes + 4 i) -> fp16 atoms at dst + 16 i:
    # blocks of 8 pixels transposed in registers, the rest lane by lane
    src, plane_bytes, dst, count = args
    blocks = builder.udiv(count, ir.Constant(I64, LANES))
    with cgutils.for_range(builder, blocks) as block:
        start = builder.mul(block.index, ir.Constant(I64, LANES))
        first = builder.add(src, builder.mul(start, ir.Constant(I64, 4)))
        lanes = [builder.load(builder.inttoptr(builder.add(first, builder.mul(plane_bytes, ir.Constant(I64, lane))),
                                               F8.as_pointer()), align=4) for lane in range(LANES)]
        at = builder.add(dst, builder.mul(start, ir.Constant(I64, 2 * LANES)))
        for j, pixel in enumerate(_transposed(builder, lanes)):
            builder.store(_narrow8(builder, pixel),
                          builder.inttoptr(builder.add(at, ir.Constant(I64, 2 * LANES * j)), _I16x8.as_pointer()),
                          align=2)
    done = builder.mul(blocks, ir.Constant(I64, LANES))
    with cgutils.for_range(builder, builder.sub(count, done)) as rest:
        pixel = builder.add(done, rest.index)
        first = builder.add(src, builder.mul(pixel, ir.Constant(I64, 4)))
        for lane in range(LANES):
            value = builder.load(builder.inttoptr(builder.add(first, builder.mul(plane_bytes, ir.Constant(I64, lane))),
                                                  ir.FloatType().as_pointer()), align=4)
            half = builder.bitcast(builder.fptrunc(canonical_ir(builder, value), ir.HalfType()), ir.IntType(16))
            at = builder.add(dst, builder.add(builder.mul(pixel, ir.Constant(I64, 2 * LANES)), ir.Constant(I64, 2 * lane)))
            builder.store(half, builder.inttoptr(at, ir.IntType(16).as_pointer()), align=2)
    return context.get_dummy_value()


@intrinsic
def planes_to_atoms(typingctx, src, plane_bytes, dst, count):
    """``count`` pixels of 8 float32 planes (lane l of pixel i at address ``src + l plane_bytes + 4 i``) ->
    ``count`` consecutive fp16 atoms at address ``dst`` (16 bytes each): vcvtps2ph's rounding (nearest even),
    every NaN the canonical 0x7E00 - ``fp16.fp32_bits_to_fp16_bits_canonical`` lane by lane. F16C targets only."""
    return types.void(*([types.intp] * 4)), _atoms_codegen


@intrinsic
def _halves_native(typingctx):
    def codegen(context, builder, signature, args):
        return ir.IntType(1)(int(converts_halves(context)))
    return types.boolean(), codegen


@njit(cache=True)
def _native() -> bool:
    return _halves_native()


def halves_native() -> bool:
    """Whether compiled code widens halves with F16C here (``fp16.converts_halves`` of Numba's target)."""
    return bool(_native())
