"""fp16 depthwise convolution with its accumulators in registers, 8 lanes a vector (issue 20; NUMERICS.md 49).

``depthwise_fp16`` widens a channel group's whole map into phase planes and makes one pass over a
map-long line per kernel row (or per kernel), then unzips the line: on 56x56 maps those lines leave
L1, on 7x7 ones the fixed costs of its passes dominate (MobileNetV2 fp16: ~5 multiply-adds a ns).
Here, per group of 8 channels (one fp16 atom a pixel, one 8-float vector):

- input rows are widened once each (F16C and the signalling-NaN repair: ``fp16_atoms_ir.widen8``)
  into padded rows, a row split by column phase at a stride (phase px holds padded columns q SX + px)
  so that a tap reads consecutive pixels; rows above or below the input read a row of the pad value,
  the columns left and right of the input hold it too (written once a call). Small maps (at most
  ``MAP_BYTES`` widened) are widened whole (``_depthwise_map``), larger ones a row at a time into a
  ring of ``(KH - 1) DY + 1`` rows (``_depthwise_rows``, which stays in L1);
- output pixels go in blocks of 8 (then 4, then 1) whose accumulators stay in registers (``_emit_blocks``'
  LLVM IR; in a small map a block may span output rows: each pixel has its own input offset): one
  vector load of 8 inputs and one multiply-add a tap and pixel, the tap's 8 lane weights one vector.
  Where two neighbouring pixels are adjacent in every run (a row's pixels; a map's if OW is even), a
  block of 16 pixels keeps two pixels a 16-float vector (AVX-512: half the instructions);
- a block of 8 goes straight into the [K][OH][OW] result's 8 channel planes (an 8x8 transpose in
  registers, ``fp16_atoms_ir.store_planes``); no unzip pass;
- a 1x1 kernel at stride 1 without padding scales the atoms straight into the planes
  (``_scaled_planes``: ``fp16_atoms_ir.scale_to_planes``, long runs ``depthwise_fp16._scale_unzip8``).

``prepare`` makes these choices once for a task's plan (``conv_fp16_plan``): the per-call checks and a
Numba call's per-argument type checks cost ~8 us a call, a small layer's whole work.

Bits: each output is +0, then + w x for its taps in (ky, kx) order, one fp32 rounding per add - the
direct loop's order (NUMERICS.md 3.3, 36). The products of fp16 values are exact in fp32 (11-bit
significands: 22 bits), so a fused multiply-add (one rounding of acc + w x) gives the bits of the
multiply then add: FMA is used where the target has it, the two instructions elsewhere. +0 + p is
not folded (no fast-math flags): it turns a -0 product into +0 as the direct loop does. The inputs
are the exact widenings of their fp16 bits and the pad value wherever the padded planes hold it. A NaN
sum is stored as the canonical NaN (``canonical_nan``, NUMERICS.md 3.3), as on every fp16 CORE path.

Only where Numba's target converts halves itself (``fp16.converts_halves``: F16C); elsewhere the
caller keeps ``depthwise_fp16``'s kernel (``available``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from npuemu.emulator.kernels.canonical_nan import canonical, canonical_ir
from npuemu.emulator.kernels.depthwise_fp16 import _scale_unzip8
from npuemu.emulator.kernels.fp16 import fp16_bits_to_float32_native
from npuemu.emulator.kernels.fp16_atoms_ir import (F8, I64, LANES, halves_native, scale_to_planes, store_planes,
                                                   widen_pixels)

#: (output pixels, pixels a vector) of the blocks whose accumulators stay in registers: 8 accumulators
#: hide the multiply-add's latency; then blocks of 4 and single pixels for the rest
_BLOCKS = ((8, 1), (4, 1), (1, 1))


def _multiply_add(context, builder, vector):
    """``f(acc, w, x)`` = acc + w x on float vectors of type ``vector``, one rounding of the sum (the
    product is exact: fp16 operands): a fused multiply-add where the target has FMA."""
    features = getattr(context.codegen(), "_tm_features", "") or ""
    if "+fma" in features.split(","):
        name = f"llvm.fma.v{vector.count}f32"
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vector, [vector] * 3), name)
        return lambda acc, w, x: builder.call(fma, [w, x, acc])
    return lambda acc, w, x: builder.fadd(acc, builder.fmul(w, x))


def _emit_blocks(context, builder, pixels, width, first, count, args, planes):
    """IR: output pixels first .. first + count - 1 in blocks of ``pixels``, their accumulators in
    registers, ``width`` pixels a vector (2: pixel pairs o, o + 1 adjacent in every run); returns the
    first pixel past the whole blocks. Pixel o of tap t reads 8 floats at taps[t] + offsets[o] and goes
    to 8 floats at acc + 32 o, or with ``planes`` (base, plane bytes) to float32 planes (``store_planes``)."""
    taps, tap_count, weights, weight_step, offsets, acc = args
    vector = ir.VectorType(ir.FloatType(), LANES * width)
    add = _multiply_add(context, builder, vector)
    spread = ir.Constant(ir.VectorType(ir.IntType(32), LANES * width), list(range(LANES)) * width)
    blocks = builder.udiv(count, ir.Constant(I64, pixels))
    with cgutils.for_range(builder, blocks) as block:
        start = builder.add(first, builder.mul(block.index, ir.Constant(I64, pixels)))
        slots = [cgutils.alloca_once(builder, vector) for _ in range(pixels // width)]
        for slot in slots:  # +0: the first add turns a -0 product into +0
            builder.store(ir.Constant(vector, [0.0] * (LANES * width)), slot)
        sources = [builder.load(builder.inttoptr(builder.add(offsets, builder.mul(
            builder.add(start, ir.Constant(I64, j)), ir.Constant(I64, 8))), I64.as_pointer()))
            for j in range(0, pixels, width)]
        with cgutils.for_range(builder, tap_count) as tap:
            run = builder.load(builder.inttoptr(builder.add(taps, builder.mul(tap.index, ir.Constant(I64, 8))),
                                                I64.as_pointer()))
            w = builder.load(builder.inttoptr(builder.add(weights, builder.mul(tap.index, weight_step)),
                                              F8.as_pointer()), align=4)
            if width > 1:  # the lane weights once a pixel of the vector
                w = builder.shuffle_vector(w, w, spread)
            for slot, source in zip(slots, sources):
                x = builder.load(builder.inttoptr(builder.add(run, source), vector.as_pointer()), align=4)
                builder.store(add(builder.load(slot), w, x), slot)
        values = []
        for slot in slots:
            value = canonical_ir(builder, builder.load(slot))  # a NaN sum stored as the canonical NaN
            for half in range(width):
                values.append(value if width == 1 else builder.shuffle_vector(value, value, ir.Constant(
                    ir.VectorType(ir.IntType(32), LANES), list(range(LANES * half, LANES * half + LANES)))))
        for part in range(0, pixels, LANES):  # (store_planes transposes 8 pixels at a time)
            chunk, at = values[part:part + LANES], builder.add(start, ir.Constant(I64, part))
            if planes is not None:  # straight into the [lane][pixel] planes
                store_planes(builder, chunk, planes[0], planes[1], at)
                continue
            for j, value in enumerate(chunk):
                target = builder.add(acc, builder.mul(builder.add(at, ir.Constant(I64, j)), ir.Constant(I64, 32)))
                builder.store(value, builder.inttoptr(target, F8.as_pointer()), align=4)
    return builder.add(first, builder.mul(blocks, ir.Constant(I64, pixels)))


def _pixels_codegen(planar: bool, pairs: bool):
    def codegen(context, builder, signature, args):
        # pixel o < count: +0, then + w_t * (8 floats at taps[t] + offsets[o]) for t < tap_count in order;
        # to acc[o] (8 floats at acc + 32 o) or (planar) lane l to out + l plane_bytes + 4 o
        taps, tap_count, weights, weight_step, offsets, acc, plane_bytes, count = args
        first = ir.Constant(I64, 0)
        for pixels, width in ((16, 2),) * pairs + _BLOCKS:
            first = _emit_blocks(context, builder, pixels, width, first, builder.sub(count, first),
                                 (taps, tap_count, weights, weight_step, offsets, acc),
                                 (acc, plane_bytes) if planar else None)
        return context.get_dummy_value()
    return codegen


def _make_pixels(planar: bool, pairs: bool):
    @intrinsic
    def pixels_kernel(typingctx, taps, tap_count, weights, weight_step, offsets, acc, plane_bytes, count):
        return types.void(*([types.intp] * 8)), _pixels_codegen(planar, pairs)
    return pixels_kernel


#: ``count`` output pixels of a channel group (arguments are addresses): ``taps`` holds ``tap_count``
#: int64 addresses (tap t's input run), ``offsets`` ``count`` int64 byte offsets (pixel o's input in
#: every run), ``weights`` tap t's 8 lane weights at ``weights + t weight_step``; the sums go to ``acc``
#: float32 [count][8] (``_pixels_kernel``, ``plane_bytes`` unused) or, lane l of pixel o, to float32 at
#: ``acc + l plane_bytes + 4 o`` (``_planes_kernel``: the result's 8 channel planes, no unzip pass).
#: ``_pairs_kernel``: ``_planes_kernel`` whose blocks of 16 hold two pixels a 16-float vector (AVX-512:
#: half the multiply-adds), for pixel runs where pixels 2 i and 2 i + 1 are adjacent in every run
_pixels_kernel, _planes_kernel, _pairs_kernel = _make_pixels(False, False), _make_pixels(True, False), \
    _make_pixels(True, True)


def available() -> bool:
    """Whether this module's kernel runs here (F16C in Numba's target)."""
    return halves_native()


def row_layout(geometry) -> tuple[int, int]:
    """(ring rows, pitch in pixels of a column phase) of ``geometry``."""
    pitch = -(-((geometry.out_w - 1) * geometry.stride_x + (geometry.kernel_w - 1) * geometry.dilation_x + 1)
              // geometry.stride_x)
    return (geometry.kernel_h - 1) * geometry.dilation_y + 1, pitch


def scratch_sizes(geometry) -> tuple[int, int]:
    """float32 elements of the widened rows and of the accumulators (``_uses_map``: the whole padded
    map and all output rows, else the row ring with its pad row and one output row)."""
    ring, pitch = row_layout(geometry)
    if _uses_map(geometry):
        return _map_rows(geometry) * geometry.stride_x * pitch * LANES, geometry.out_h * geometry.out_w * LANES
    return (ring + 1) * geometry.stride_x * pitch * LANES, geometry.out_w * LANES


def _map_rows(geometry) -> int:
    return (geometry.out_h - 1) * geometry.stride_y + (geometry.kernel_h - 1) * geometry.dilation_y + 1


#: a 1x1 kernel's run of at least this many atoms takes ``depthwise_fp16._scale_unzip8``
_LONG_SCALING = 2048
#: a padded map of at most this many bytes is widened whole (``_depthwise_map``)
MAP_BYTES = 1 << 15


def _uses_map(geometry) -> bool:
    return _map_rows(geometry) * geometry.stride_x * row_layout(geometry)[1] * LANES * 4 <= MAP_BYTES


def lane_weights(matrices: np.ndarray) -> np.ndarray:
    """float32 [C1][KH * KW][8] of depthwise float32 weights [K][1][KH][KW]: tap t of kernel 8 g + lane
    at [g][t][lane] (lanes past K hold 0)."""
    kernels, taps = matrices.shape[0], matrices.shape[2] * matrices.shape[3]
    groups = -(-kernels // LANES)
    lanes = np.zeros((groups * LANES, taps), np.float32)
    lanes[:kernels] = matrices.reshape(kernels, taps)
    return np.ascontiguousarray(lanes.reshape(groups, LANES, taps).transpose(0, 2, 1))


@njit(cache=True)
def _phase_runs(width, stride_x, pad_left, pitch):
    # per column phase px: [first position q, positions, input column of q] of the positions q whose
    # padded column q SX + px - pad_left is in the input (0 <= it < W); the others keep the pad value
    runs = np.zeros((stride_x, 3), np.int64)
    for px in range(stride_x):
        lo = min(pitch, max(0, -((px - pad_left) // stride_x)))
        hi = min(pitch, max(lo, -((px - pad_left - width) // stride_x)))
        runs[px, 0], runs[px, 1], runs[px, 2] = lo, hi - lo, lo * stride_x + px - pad_left
    return runs


@njit(cache=True, inline="always")
def _widen_rows(bits16, g, y, rows, runs, target, target_row, pitch):
    # input rows y .. y + rows - 1 of group g -> the slots at address ``target`` (``target_row`` bytes
    # apart): phase px's position q holds padded column q SX + px (``_phase_runs``)
    width = bits16.shape[2]
    stride_x = runs.shape[0]
    source = bits16.ctypes.data + (g * bits16.shape[1] + y) * width * LANES * 2
    for px in range(stride_x):
        if runs[px, 1] > 0:
            widen_pixels(source + runs[px, 2] * LANES * 2, 2 * LANES * stride_x, width * LANES * 2,
                          target + (px * pitch + runs[px, 0]) * LANES * 4, target_row, runs[px, 1], rows)


@njit(cache=True)
def _depthwise_rows(bits16, weights, params, pad, scratch, line, out):
    # bits16 [C1][H][W][8] uint16 (C-contiguous); weights float32 [C1][taps][8]; params ``_params``;
    # scratch: rows float32 [ring + 1][SX][pitch][8] (slot ``ring``: the pad row); line: acc float32
    # [OW][8]; out float32 [K][OH][OW] (C-contiguous): an output row at a time, input rows widened once
    # into the ring
    kernel_h, kernel_w, stride_y, stride_x, dilation_y, dilation_x, pad_top, pad_left, pitch, ring, size = params
    kernels, out_h, out_w = out.shape
    rows, acc = scratch[:size], line[:out_w * LANES].reshape(out_w, LANES)
    height = bits16.shape[1]
    rows[:] = pad  # the pad row and every slot's columns outside the input (widening rewrites the rest)
    slot_bytes = stride_x * pitch * LANES * 4
    base = rows.ctypes.data
    count = kernel_h * kernel_w
    taps = np.empty(count, np.int64)
    tags = np.empty(ring, np.int64)  # the input row a slot holds
    columns = np.empty(kernel_w, np.int64)  # tap kx's byte offset in a slot
    for kx in range(kernel_w):
        column, px = divmod(kx * dilation_x, stride_x)
        columns[kx] = (px * pitch + column) * LANES * 4
    offsets = np.arange(out_w) * (LANES * 4)  # pixel ox's in a run
    runs = _phase_runs(bits16.shape[2], stride_x, pad_left, pitch)
    plane = out_h * out_w * 4
    for g in range(min(bits16.shape[0], -(-kernels // LANES))):
        tags[:] = -1
        lane_weight = weights[g].ctypes.data
        whole = kernels - g * LANES >= LANES
        for oy in range(out_h):
            for ky in range(kernel_h):
                y = oy * stride_y + ky * dilation_y - pad_top
                address = base + ring * slot_bytes
                if 0 <= y < height:
                    slot = y % ring
                    address = base + slot * slot_bytes
                    if tags[slot] != y:
                        _widen_rows(bits16, g, y, 1, runs, address, 0, pitch)
                        tags[slot] = y
                for kx in range(kernel_w):
                    taps[ky * kernel_w + kx] = address + columns[kx]
            if whole:  # (a row's pixels are adjacent in every run: pairs)
                _pairs_kernel(taps.ctypes.data, count, lane_weight, LANES * 4, offsets.ctypes.data,
                              out[g * LANES, oy].ctypes.data, plane, out_w)
                continue
            _pixels_kernel(taps.ctypes.data, count, lane_weight, LANES * 4, offsets.ctypes.data, acc.ctypes.data,
                           0, out_w)
            _store_row(acc, g, oy, out)


@njit(cache=True)
def _depthwise_map(bits16, weights, params, pad, scratch, line, out):
    # _depthwise_rows with the group's whole padded map widened first (rows float32 [Hn][SX][pitch][8],
    # Hn = (OH - 1) SY + (KH - 1) DY + 1 padded rows) and all its output pixels in one kernel call
    # (acc float32 [OH OW][8]): for small maps, where a row's fixed costs dominate
    kernel_h, kernel_w, stride_y, stride_x, dilation_y, dilation_x, pad_top, pad_left, pitch, _, size = params
    kernels, out_h, out_w = out.shape
    rows, acc = scratch[:size], line[:out_h * out_w * LANES].reshape(out_h * out_w, LANES)
    height = bits16.shape[1]
    padded_rows = rows.shape[0] // (stride_x * pitch * LANES)
    rows[:] = pad
    slot_bytes = stride_x * pitch * LANES * 4
    base = rows.ctypes.data
    count = kernel_h * kernel_w
    taps = np.empty(count, np.int64)
    for ky in range(kernel_h):
        for kx in range(kernel_w):
            column, px = divmod(kx * dilation_x, stride_x)
            taps[ky * kernel_w + kx] = base + ky * dilation_y * slot_bytes + (px * pitch + column) * LANES * 4
    offsets = np.empty(out_h * out_w, np.int64)  # pixel (oy, ox)'s in a run: rows back to back
    for oy in range(out_h):
        for ox in range(out_w):
            offsets[oy * out_w + ox] = oy * stride_y * slot_bytes + ox * LANES * 4
    first, last = max(0, -pad_top), min(height, padded_rows - pad_top)
    runs = _phase_runs(bits16.shape[2], stride_x, pad_left, pitch)
    plane = out_h * out_w * 4
    pairs = out_w % 2 == 0 or out_h == 1  # pixels 2 i, 2 i + 1 in one output row: adjacent in every run
    for g in range(min(bits16.shape[0], -(-kernels // LANES))):
        if last > first:
            _widen_rows(bits16, g, first, last - first, runs, base + (first + pad_top) * slot_bytes, slot_bytes,
                        pitch)
        if kernels - g * LANES >= LANES and pairs:
            _pairs_kernel(taps.ctypes.data, count, weights[g].ctypes.data, LANES * 4, offsets.ctypes.data,
                          out[g * LANES].ctypes.data, plane, out_h * out_w)
            continue
        if kernels - g * LANES >= LANES:
            _planes_kernel(taps.ctypes.data, count, weights[g].ctypes.data, LANES * 4, offsets.ctypes.data,
                           out[g * LANES].ctypes.data, plane, out_h * out_w)
            continue
        _pixels_kernel(taps.ctypes.data, count, weights[g].ctypes.data, LANES * 4, offsets.ctypes.data,
                       acc.ctypes.data, 0, out_h * out_w)
        for oy in range(out_h):
            _store_row(acc[oy * out_w:(oy + 1) * out_w], g, oy, out)


@njit(cache=True, inline="always")
def _store_row(acc, g, oy, out):
    # acc [OW][8] -> out[8 g + lane, oy] for the lanes below the kernels' count (a last, partial group)
    source = acc.reshape(-1)
    for lane in range(min(LANES, out.shape[0] - g * LANES)):
        target = out[g * LANES + lane, oy]
        for ox in range(out.shape[2]):
            target[ox] = source[ox * LANES + lane]


@njit(cache=True)
def _scaled_planes(bits16, weights, out, long_run):
    # a 1x1 kernel at stride 1 without padding: out[8 g + lane] = +0 + w x, x widened from the atoms,
    # 8 atoms at a time into the planes (scale_to_planes); a last group of fewer lanes element by element
    # (depthwise_fp16._scaled_atoms' values; its vector loop has ~0.3 us of fixed costs a group and row,
    # and is faster on runs of ``long_run`` (_LONG_SCALING) atoms and more: 5440 atoms 13 us against 18)
    kernels, out_h, out_w = out.shape
    width = bits16.shape[2]
    plane = out_h * out_w * 4
    for g in range(min(bits16.shape[0], -(-kernels // LANES))):
        if kernels - g * LANES >= LANES:
            target, source = out[g * LANES].ctypes.data, bits16[g].ctypes.data
            if out_w == width and out_h * out_w >= long_run:  # the vector loop's fixed costs paid off
                _scale_unzip8(bits16[g, :out_h].reshape(-1), weights[g, 0], out[g * LANES:(g + 1) * LANES]
                              .reshape(LANES, -1))
                continue
            if out_w == width:  # whole rows back to back: one run
                scale_to_planes(source, weights[g].ctypes.data, target, plane, out_h * out_w)
                continue
            for y in range(out_h):
                scale_to_planes(source + y * width * LANES * 2, weights[g].ctypes.data, target + y * out_w * 4,
                                plane, out_w)
            continue
        zero = np.float32(0)
        for lane in range(kernels - g * LANES):
            weight = weights[g, 0, lane]
            for y in range(out_h):
                for x in range(out_w):
                    value = zero + weight * fp16_bits_to_float32_native(bits16[g, y, x, lane])
                    out[g * LANES + lane, y, x] = canonical(value)


def _params(geometry) -> tuple:
    """The kernels' integers: (KH, KW, SY, SX, DY, DX, pad top, pad left, pitch, ring, widened floats).
    One tuple argument: each argument of a Numba call costs its type check (~0.3 us)."""
    ring, pitch = row_layout(geometry)
    g = geometry
    return (g.kernel_h, g.kernel_w, g.stride_y, g.stride_x, g.dilation_y, g.dilation_x, g.pad_top, g.pad_left,
            pitch, ring, scratch_sizes(g)[0])


def kernel_mode(geometry, height: int, width: int) -> int:
    """``prepare``'s choice of kernel for atoms of ``height`` x ``width`` pixels: 0 a 1x1 scaling on the
    atoms themselves (one pass, ``_scaled_planes``), 1 the whole map (``_depthwise_map``), 2 the row ring
    (``_depthwise_rows``)."""
    g = geometry
    if g.kernel_h == g.kernel_w == g.stride_y == g.stride_x == 1 and g.pad_top == g.pad_left == 0 \
            and g.out_h <= height and g.out_w <= width:
        return 0
    return 1 if _uses_map(g) else 2


def prepare(geometry, pad_value: float, height: int, width: int):
    """``run(bits16, weights, out, rows, acc)``: ``depthwise_fp16_rows`` for atoms of ``height`` x ``width``
    pixels and a C-contiguous ``out``, the choices made once (a task's plan calls it every run)."""
    g, mode = geometry, kernel_mode(geometry, height, width)
    if mode == 0:
        long_run = _LONG_SCALING
        return lambda bits16, weights, out, rows, acc: _scaled_planes(bits16, weights, out, long_run)
    params, pad = _params(g), np.float32(pad_value)
    kernel = _depthwise_map if mode == 1 else _depthwise_rows
    return lambda bits16, weights, out, rows, acc: kernel(bits16, weights, params, pad, rows, acc, out)


def depthwise_fp16_rows(bits16: np.ndarray, weights: np.ndarray, geometry, pad_value: float, out: np.ndarray,
                        rows: np.ndarray, acc: np.ndarray) -> None:
    """``out`` [K][OH][OW] = the depthwise convolution (kernel k on channel k) of float16 atoms ``bits16``
    [C1][H][W][8] (uint16 bits, C-contiguous) with ``lane_weights`` ``weights``: the bits of
    ``depthwise_fp16.depthwise_fp16_atoms``. Scratch (``scratch_sizes``): ``rows`` and ``acc`` float32
    of at least those many elements. Needs ``available()``."""
    if not out.flags.c_contiguous:  # (the kernels store into its planes by address)
        whole = np.empty(out.shape, np.float32)
        depthwise_fp16_rows(bits16, weights, geometry, pad_value, whole, rows, acc)
        out[...] = whole
        return
    prepare(geometry, pad_value, bits16.shape[1], bits16.shape[2])(bits16, weights, out, rows, acc)
