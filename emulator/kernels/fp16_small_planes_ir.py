"""fp16 atoms of small planes <-> float32 planes, a surface at a time in registers (issue 20, session 22).

A surface of a cube whose planes hold P = H x W = 2 or 4 pixels (silero-vad's LSTM and convolution
vectors: 136 x 1 x 4, 64 x 1 x 2) is P atoms of 8 lanes back to back in the region and 8 planes of P
floats back to back in the planes: the read (``dpu_convert.widen_rows``) and the store
(``fp16_atoms.planes_to_fp16_atoms``) are each a [P][8] <-> [8][P] transpose of 8P contiguous values.
Row by row they took ~5 ns an atom (a row's loop, then 8 element stores or loads a pixel: 136 x 1 x 4,
0.34 us a read, 0.44 a store); here a surface is P vector loads, one shuffle and one vector store (or
the reverse), with the same conversions as ``fp16_atoms_ir``: ``widen8`` (the exact widening) and
``_narrow8`` (vcvtps2ph, every NaN the canonical one), so the same bits. F16C targets only
(``fp16_atoms_ir.halves_native``; callers keep their portable loops elsewhere).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from npuemu.emulator.kernels.fp16_atoms_ir import I64, LANES, _narrow8, _shuffle, widen8

_I16x8 = ir.VectorType(ir.IntType(16), LANES)


def _joined(builder, vectors):
    # IR: vectors of 8 floats (2 or 4) as one vector of 8 x their count, in order
    while len(vectors) > 1:
        width = vectors[0].type.count
        vectors = [_shuffle(builder, vectors[j], vectors[j + 1], list(range(2 * width)))
                   for j in range(0, len(vectors), 2)]
    return vectors[0]


def _widen_codegen(pixels: int):
    def codegen(context, builder, signature, args):
        # surface k < count: the P atoms at src + k src_step -> the 8 x P floats (lane-major) at dst + k dst_step
        src, src_step, dst, dst_step, count = args
        lane_major = [(j % pixels) * LANES + j // pixels for j in range(LANES * pixels)]
        with cgutils.for_range(builder, count) as loop:
            source = builder.add(src, builder.mul(loop.index, src_step))
            atoms = [widen8(builder, builder.add(source, ir.Constant(I64, 2 * LANES * p))) for p in range(pixels)]
            joined = _joined(builder, atoms)
            planes = _shuffle(builder, joined, joined, lane_major)
            target = builder.add(dst, builder.mul(loop.index, dst_step))
            builder.store(planes, builder.inttoptr(target, planes.type.as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


def _narrow_codegen(pixels: int):
    def codegen(context, builder, signature, args):
        # surface k < count: the 8 x P floats (lane-major) at src + k src_step -> P atoms at dst + k dst_step
        src, src_step, dst, dst_step, count = args
        kind = ir.VectorType(ir.FloatType(), LANES * pixels)
        pixel_major = [(j % LANES) * pixels + j // LANES for j in range(LANES * pixels)]
        with cgutils.for_range(builder, count) as loop:
            source = builder.add(src, builder.mul(loop.index, src_step))
            planes = builder.load(builder.inttoptr(source, kind.as_pointer()), align=4)
            atoms = _shuffle(builder, planes, planes, pixel_major)
            target = builder.add(dst, builder.mul(loop.index, dst_step))
            for p in range(pixels):
                atom = _shuffle(builder, atoms, atoms, list(range(LANES * p, LANES * (p + 1))))
                at = builder.add(target, ir.Constant(I64, 2 * LANES * p))
                builder.store(_narrow8(builder, atom), builder.inttoptr(at, _I16x8.as_pointer()), align=2)
        return context.get_dummy_value()
    return codegen


_SIGNATURE = types.void(*([types.intp] * 5))


@intrinsic
def atoms_to_planes2(typingctx, src, src_step, dst, dst_step, count):
    """``count`` surfaces of 2 fp16 atoms (32 bytes at ``src + k src_step``) -> 8 planes of 2 float32 each
    (64 bytes at ``dst + k dst_step``, lane l pixel p at 8 l + 4 p): the exact widening. F16C targets only."""
    return _SIGNATURE, _widen_codegen(2)


@intrinsic
def atoms_to_planes4(typingctx, src, src_step, dst, dst_step, count):
    """``atoms_to_planes2`` of surfaces of 4 atoms (64 bytes) into 8 planes of 4 float32 (128 bytes)."""
    return _SIGNATURE, _widen_codegen(4)


@intrinsic
def planes_to_atoms2(typingctx, src, src_step, dst, dst_step, count):
    """The reverse of ``atoms_to_planes2``: vcvtps2ph's rounding (nearest even), every NaN the canonical
    0x7E00 (``fp16.fp32_bits_to_fp16_bits_canonical``). F16C targets only."""
    return _SIGNATURE, _narrow_codegen(2)


@intrinsic
def planes_to_atoms4(typingctx, src, src_step, dst, dst_step, count):
    """``planes_to_atoms2`` of surfaces of 4 pixels."""
    return _SIGNATURE, _narrow_codegen(4)


@njit(cache=True)
def whole_surfaces(offsets, height, first, step, channels, size, pixels):
    """Whether the atom rows at ``offsets`` (row r: surface ``first + (r // height) * step``; rows of
    ``pixels // height`` atoms of 8 lanes) make whole surfaces of these kernels: every surface's rows back to
    back, its 8 channels inside ``channels``, its atoms inside the region's ``size`` elements."""
    surfaces, row = offsets.size // height, pixels // height * LANES
    if surfaces == 0 or offsets.size != surfaces * height or (first + (surfaces - 1) * step) * LANES + LANES > channels:
        return False
    for r in range(offsets.size):
        if r % height != 0:
            if offsets[r] != offsets[r - 1] + row:
                return False
        elif offsets[r] < 0 or offsets[r] + pixels * LANES > size:
            return False
    return True
