"""The vendor's multi-task forms of Transpose on a stored (C, H, W) map (LOWERING.md 36):
NHWC - cube perm (1, 2, 0), ONNX (0, 2, 3, 1) of [1, C, H, W] -, its reverse (2, 0, 1), ONNX
(0, 3, 1, 2), HCW (1, 0, 2), ONNX (0, 2, 1, 3), and WHC (2, 1, 0), ONNX (0, 3, 2, 1). Every task is
a DPU-only move (dpu_moves.py); the register forms and their evidence are in
emulator/REGISTER_SEMANTICS.md 31, the builds they were read from (every register equal) in
tests/emulator/vendor_dpu_transpose, tests/compiler/vendor_transpose_perms and rknn-fixtures-ops
transpose_nhwc_*. HCW and WHC are documented at their functions.

A plan names addresses symbolically - ``("x", offset)`` the source, ``("e", offset)`` the scratch
tensor (the vendor's ``x_exSecondary``: two regions of C1 x P atoms), ``("y", offset)`` the output -
so one plan serves the two build layers a Transpose with scratch becomes (passes/transpose_npu.py
``expand_transpose``): the tasks that read x, and the rest.

NHWC [V] nhwc_* builds: (copy x into rows padded to R = 16 / element, surfaces P = Hp x W apart),
TP_EN (C1 > 1: NC1HWC2 -> a [P][C1 atoms] pixel matrix), TP_ORG_EN (rows of W x C1 atoms ->
R-lane atoms; fp16 one task with Hp / 8 blocks, int8 one task per 16-row block), a compacting
copy when C is not a whole number of atoms (else TP_ORG_EN writes y), and in fp16 a copy that
clears the lanes past H of y's last surface.

NWCH [V] nwch_* builds: (copy x into lines padded to Wp, whole atoms), TP_ORG_EN to planar NCHW
(fp16 one task over all surfaces, int8 one task per surface), then TP_EN (Wp > one atom: lines
(c, h) of Wp atoms -> y's surfaces) and a compacting copy when C is not whole atoms, or, when W
is one atom, a plain copy of the planes; in fp16 the lane-clearing copy of y's last surface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import isqrt

from npuemu.isa.errors import CompileError

from .dpu_moves import TransposeTask

NHWC, NWCH = (1, 2, 0), (2, 0, 1)
ATOM = 16
INT8_CODE, INT16_CODE, FP16_CODE = 0, 1, 2


@dataclass(frozen=True)
class Geometry:
    """What a plan needs of the tensors: shape, dtype, the stored surface strides (atoms)."""

    shape: tuple[int, int, int]
    dtype: str
    source_surface: int
    out_surface: int

    @property
    def lanes(self) -> int:      # C2 of the dtype, and R (elements of a TP_ORG_EN tile side)
        return 16 if self.dtype == "int8" else 8

    @property
    def native(self) -> int:     # the DPU precision of a plain copy
        return INT8_CODE if self.dtype == "int8" else FP16_CODE


@dataclass(frozen=True)
class Move:
    source: tuple[str, int]
    dst: tuple[str, int]
    fields: dict = field(hash=False)

    def resolve(self, layer: str, addresses: dict[str, int]) -> TransposeTask:
        return TransposeTask(layer, addresses[self.source[0]] + self.source[1],
                             addresses[self.dst[0]] + self.dst[1], **self.fields)


def _up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _copy(source, dst, width, height, channels, precision, out_surface, *, notch=0, line_notch=0, surf_notch=0):
    """A plain copy: lines W + ``notch`` atoms apart in the output, surfaces ``out_surface`` apart."""
    return Move(source, dst, dict(width=width, height=height, channels=channels, precision=precision,
                                  dst_surface_stride=out_surface, surface_add=out_surface, notch=notch,
                                  wdma=(channels, 1, width, height), line_notch=line_notch,
                                  surf_notch=surf_notch))


def _clear_lanes(surfaces: int, pixels: int, kept: int, lanes: int, out_surface: int) -> Move:
    """The vendor's fp16 lane clearing of y's last surface in place (CHANNEL_WDMA whole atoms,
    SIZE_C_WDMA + 1 the kept lanes; NOTCH and LINE_NOTCH that surface's offset in atoms - 1 line,
    so unused - [V] 240 / 200 / 96 of a second surface, 2560 of the third in transpose_nhwc_fp16;
    the 2-byte int16 code, as every build leaves it: its register group last ran a 2-byte move)."""
    offset = (surfaces - 1) * out_surface
    at = ("y", offset * ATOM)
    return Move(at, at, dict(width=pixels, height=1, channels=kept, precision=INT16_CODE,
                             dst_surface_stride=out_surface, surface_add=out_surface, notch=offset,
                             wdma=(lanes, kept, pixels, 1), line_notch=offset))


def _atom_transpose(source, dst, width, lines, line_stride, dst_stride, surface_add, notch, channels):
    """TP_EN over ``lines`` lines of ``width`` one-atom pixels (int16 elements), surfaces W atoms apart."""
    return Move(source, dst, dict(width=width, height=lines, channels=channels, precision=INT16_CODE,
                                  dst_surface_stride=dst_stride, surface_add=surface_add, notch=notch,
                                  size_e=width - 1, tp_en=True, tp_precision=1,
                                  wdma=(channels, 1, lines, channels // 8),
                                  line_notch=line_stride - width,
                                  surf_notch=width - lines * width - (lines - 1) * (line_stride - width)))


def _wdma_lines(product: int, width: int, height: int, row_form: bool) -> tuple[int, int]:
    """WDMA_SIZE_1 (W, H) of a TP_ORG_EN task: only the product is read by the hardware model
    (REGISTER_SEMANTICS 31); the split is fitted to the vendor builds [I]."""
    if row_form:
        return 1, product
    if height % 2 == 0 and width % 4 == 0 and (height // 2) * (width // 4) == product:
        return height // 2, width // 4
    if width % 2 == 0 and height % 4 == 0 and (width // 2) * (height // 4) == product:
        return width // 2, height // 4
    return (product // 2, 2) if product % 2 == 0 else (product, 1)


def _square_cube(pixels: int) -> tuple[int, int]:
    """The vendor's fp16 planar TP_ORG_EN cube: W x H = the pixels, W the least divisor >= sqrt [I]
    (nwch_fp16 20x6x8: 48 -> 8 x 6; 16x6x12: 96 -> 12 x 8; 20x5x16: 80 -> 10 x 8)."""
    width = next(d for d in range(max(1, isqrt(pixels)), pixels + 1) if pixels % d == 0 and d * d >= pixels)
    return width, pixels // width


def _element_transpose(source, dst, width, height, groups, element, dst_stride, surface_add, notch,
                       line_notch, surf_notch, tiles, split: int = 1) -> Move:
    """TP_ORG_EN over a cube of ``groups`` atoms a pixel; ``tiles`` = SIZE_C_WDMA + 1; ``split``:
    WDMA_SIZE_1's W where the builds give it (whc_fp16 task 2: W C1) [I]."""
    product = groups * width * height // 8 // tiles
    w, h = _wdma_lines(product, width, height, row_form=width == 1 or tiles != groups)
    if split > 1 and product % split == 0:
        w, h = split, product // split
    return Move(source, dst, dict(width=width, height=height, channels=groups * 8, precision=INT16_CODE,
                                  dst_surface_stride=dst_stride, surface_add=surface_add, notch=notch, size_e=7,
                                  tp_org=True, tp_precision=int(element == 2), wdma=(groups * 8, tiles, w, h),
                                  line_notch=line_notch, surf_notch=surf_notch,
                                  surf_len=groups * width * height))


def nhwc_moves(g: Geometry) -> tuple[list[Move], int]:
    """(moves, scratch atoms) of cube perm (1, 2, 0): (C, H, W) -> (H, W, C)."""
    channels, height, width = g.shape
    lanes = g.lanes
    c1, hp = -(-channels // lanes), _up(height, lanes)
    pixels = hp * width
    region = c1 * pixels * ATOM                       # bytes of one scratch region
    moves, src, stride = [], ("x", 0), g.source_surface
    if hp != height or stride != pixels:
        moves.append(_copy(src, ("e", 0), width, height, c1 * lanes, g.native, pixels,
                           surf_notch=stride - height * width))
        src, stride = ("e", 0), pixels
    if c1 > 1:               # [V] nhwc_fp16_16x8x8: straight from x into the first region
        dst = ("e", region) if src == ("e", 0) else ("e", 0)
        moves.append(_atom_transpose(src, dst, 8, c1, stride, c1, 8 * c1, 7 * c1, pixels))
        src = dst
    groups = width * c1                               # atoms of one row of the pixel matrix
    direct = channels == c1 * lanes
    target = ("y", 0) if direct else (("e", region) if src == ("e", 0) else ("e", 0))
    row = dict(width=1, groups=groups, element=2 if g.dtype == "float16" else 1, dst_stride=1,
               surface_add=lanes, line_notch=groups - 1, tiles=groups)
    if g.dtype == "float16":
        moves.append(_element_transpose(src, target, height=hp, notch=8 * groups - 1,
                                        surf_notch=1 - (hp + (hp - 1) * (groups - 1)), **row))
    else:
        for k in range(hp // 16):
            step = k * 16 * groups * ATOM
            moves.append(_element_transpose((src[0], src[1] + step), (target[0], target[1] + step), height=16,
                                            notch=7, surf_notch=1 - (16 + 15 * (groups - 1)), **row))
    out_lanes = _up(height, lanes)
    if not direct:
        pad = c1 * lanes - channels
        moves.append(_copy(target, ("y", 0), channels, width, out_lanes, g.native, g.out_surface,
                           line_notch=pad, surf_notch=pad))
    if g.dtype == "float16" and height % lanes:
        moves.append(_clear_lanes(out_lanes // lanes, width * channels, height % lanes, lanes, g.out_surface))
    return moves, 2 * region // ATOM


def nwch_moves(g: Geometry) -> tuple[list[Move], int]:
    """(moves, scratch atoms) of cube perm (2, 0, 1): (C, H, W) -> (W, C, H)."""
    channels, height, width = g.shape
    lanes = g.lanes
    c1, wp = -(-channels // lanes), _up(width, lanes)
    pixels = height * wp
    region = c1 * pixels * ATOM
    moves, src, stride = [], ("x", 0), g.source_surface
    if wp != width or stride != pixels:
        moves.append(_copy(src, ("e", 0), width, height, c1 * lanes, g.native, pixels, notch=wp - width,
                           surf_notch=stride - height * width))
        src, stride = ("e", 0), pixels
    planes = ("e", region) if src == ("e", 0) else ("e", 0)
    if g.dtype == "float16":     # one task, tiles = the C1 groups, planes P / 8 atoms [V] nwch_fp16
        w, h = _square_cube(pixels)
        moves.append(_element_transpose(src, planes, w, h, c1, 2, pixels // 8, pixels, 0, 0,
                                        stride - pixels, c1))
    else:                        # one task per surface, tiles = the pixel blocks [V] nwch_int8
        for s in range(c1):
            moves.append(_element_transpose((src[0], src[1] + s * stride * ATOM),
                                            (planes[0], planes[1] + s * pixels * ATOM), wp, height, 1, 1,
                                            pixels // 16, 1, pixels // 2 - 1, 0, 0, pixels // 16))
    rows = c1 * lanes * height                        # planar lines (c, h): Wp / lanes atoms each
    blocks = wp // lanes
    out_lanes = _up(width, lanes)
    if blocks == 1:              # one atom a line: the planes are y's surface [V] nwch_fp16_20x6x8
        moves.append(_copy(planes, ("y", 0), height, channels, lanes, g.native, g.out_surface,
                           surf_notch=(c1 * lanes - channels) * height))
    else:
        direct = channels == c1 * lanes
        target = ("y", 0) if direct else (("e", 0) if planes[1] else ("e", region))
        moves.append(_atom_transpose(planes, target, blocks, rows, blocks, rows, blocks * rows, rows, 8))
        if not direct:
            moves.append(_copy(target, ("y", 0), height, channels, out_lanes, g.native, g.out_surface,
                               surf_notch=rows - channels * height))
    if g.dtype == "float16" and width % lanes:
        moves.append(_clear_lanes(out_lanes // lanes, channels * height, width % lanes, lanes, g.out_surface))
    return moves, 2 * region // ATOM


def hcw_moves(g: Geometry) -> tuple[list[Move], int]:
    """(moves, scratch atoms) of cube perm (1, 0, 2): (C, H, W) -> (H, C, W), ONNX (0, 2, 1, 3) [V] hcw_*:
    (copy into rows padded to Hp), TP_ORG_EN per surface with groups x blocks tiles - per channel,
    W lines of Hp / R atoms -, TP_EN over those (c, w) lines into y's surfaces of R rows, (a compacting
    copy when C is not whole atoms), (fp16: the lane clearing). The builds have C1 = 1; a surface a
    task for C1 > 1 is the int8 NWCH form's [C]."""
    channels, height, width = g.shape
    lanes = g.lanes
    c1, hp = -(-channels // lanes), _up(height, lanes)
    pixels = hp * width
    region = c1 * pixels * ATOM
    moves, src, stride = [], ("x", 0), g.source_surface
    if hp != height or stride != pixels:
        moves.append(_copy(src, ("e", 0), width, height, c1 * lanes, g.native, pixels,
                           surf_notch=stride - height * width))
        src, stride = ("e", 0), pixels
    planes = ("e", region) if src == ("e", 0) else ("e", 0)
    blocks = hp // lanes                              # atoms of one (c, w) line: Hp / R
    tiles = width * blocks
    element = 2 if g.dtype == "float16" else 1
    for s in range(c1):
        moves.append(_element_transpose((src[0], src[1] + s * stride * ATOM),
                                        (planes[0], planes[1] + s * lanes * tiles * ATOM), 1, hp, width, element,
                                        tiles, 1, 0 if element == 2 else tiles * 8 - 1, width - 1,
                                        1 - (hp + (hp - 1) * (width - 1)), tiles))
    lines = c1 * lanes * width
    direct = channels == c1 * lanes
    target = ("y", 0) if direct else (("e", 0) if planes[1] else ("e", region))
    move = _atom_transpose(planes, target, blocks, lines, blocks, lines, pixels, (blocks - 1) * lines, 8)
    moves.append(move)
    out_lanes = _up(height, lanes)
    if not direct:
        moves.append(_copy(target, ("y", 0), width, channels, out_lanes, g.native, g.out_surface,
                           surf_notch=lines - channels * width))
    if g.dtype == "float16" and height % lanes:
        moves.append(_clear_lanes(out_lanes // lanes, channels * width, height % lanes, lanes, g.out_surface))
    return moves, 2 * region // ATOM


def _row_transposes(g: Geometry, src, dst, rows: int, groups: int) -> list[Move]:
    """TP_ORG_EN over ``rows`` lines of ``groups`` atoms into R-lane atoms, row blocks 8 x groups /
    16 x groups atoms apart: fp16 one task, int8 one a 16-row block (NHWC's step 3)."""
    lanes, common = g.lanes, dict(width=1, groups=groups, dst_stride=1, surface_add=g.lanes,
                                  line_notch=groups - 1, tiles=groups)
    if g.dtype == "float16":
        return [_element_transpose(src, dst, height=rows, element=2, notch=8 * groups - 1,
                                   surf_notch=1 - (rows + (rows - 1) * (groups - 1)), **common)]
    return [_element_transpose((src[0], src[1] + k * lanes * groups * ATOM), (dst[0], dst[1] + k * lanes * groups * ATOM),
                               height=lanes, element=1, notch=7, surf_notch=1 - (lanes + (lanes - 1) * (groups - 1)),
                               **common) for k in range(rows // lanes)]


def whc_moves(g: Geometry) -> tuple[list[Move], int]:
    """(moves, scratch atoms) of cube perm (2, 1, 0): (C, H, W) -> (W, H, C), ONNX (0, 3, 2, 1) [V] whc_*:
    (copy into Hp x Wp), HCW's per-surface TP_ORG_EN (channel planes of W x Hp / R atoms), TP_ORG_EN
    over the C1 R channel rows (a [W][Hp][C1 atoms] pixel matrix), NHWC's row TP_ORG_EN over the Wp
    rows, then the compacting copy (or straight into y) and, fp16, the lane clearing."""
    channels, height, width = g.shape
    lanes = g.lanes
    c1, hp, wp = -(-channels // lanes), _up(height, lanes), _up(width, lanes)
    pixels = hp * wp
    region = c1 * pixels * ATOM
    element = 2 if g.dtype == "float16" else 1
    moves, src, stride = [], ("x", 0), g.source_surface
    if hp != height or wp != width or stride != pixels:
        moves.append(_copy(src, ("e", 0), width, height, c1 * lanes, g.native, pixels, notch=wp - width,
                           surf_notch=stride - height * width))
        src, stride = ("e", 0), pixels
    planes = ("e", region) if src == ("e", 0) else ("e", 0)
    other = ("e", 0) if planes[1] else ("e", region)
    tiles = wp * (hp // lanes)
    for s in range(c1):
        moves.append(_element_transpose((src[0], src[1] + s * stride * ATOM),
                                        (planes[0], planes[1] + s * lanes * tiles * ATOM), 1, hp, wp, element,
                                        tiles, 1, 0 if element == 2 else tiles * 8 - 1, wp - 1,
                                        1 - (hp + (hp - 1) * (wp - 1)), tiles))
    rows = c1 * lanes                                 # channel rows of the planes
    moves.append(_element_transpose(planes, other, 1, rows, tiles, element, c1, lanes * c1,
                                    7 if element == 1 and c1 == 1 else 0, tiles - 1,
                                    1 - (rows + (rows - 1) * (tiles - 1)), tiles, split=c1))
    direct = channels == c1 * lanes and hp == height
    target = ("y", 0) if direct else planes
    moves += _row_transposes(g, other, target, wp, hp * c1)
    out_lanes = _up(width, lanes)
    if not direct:
        pad = c1 * lanes - channels
        moves.append(_copy(target, ("y", 0), channels, height, out_lanes, g.native, g.out_surface, line_notch=pad,
                           surf_notch=hp * c1 * lanes - (height * channels + (height - 1) * pad)))
    if g.dtype == "float16" and width % lanes:
        moves.append(_clear_lanes(out_lanes // lanes, channels * height, width % lanes, lanes, g.out_surface))
    return moves, 2 * region // ATOM


HCW, WHC = (1, 0, 2), (2, 1, 0)
PLANS = {NHWC: nhwc_moves, NWCH: nwch_moves, HCW: hcw_moves, WHC: whc_moves}


def plan_moves(perm: tuple[int, int, int], g: Geometry) -> tuple[list[Move], int]:
    if perm not in PLANS:
        raise CompileError(f"cube perm {perm} has no DPU plan")
    return PLANS[perm](g)


__all__ = ["Geometry", "HCW", "Move", "NHWC", "NWCH", "PLANS", "WHC", "plan_moves"]
