"""The DPU's two transpose writes, the way the vendor lowers Transpose, Reshape and the layout
changes around MatMul / LayerNorm / Softmax / Conv1d (emulator/REGISTER_SEMANTICS.md 31 has the
evidence and the builds each reading was checked on).

Both are pure data moves: every stage bypassed, OUT_CVT the identity, one precision throughout.
The MRDMA reads the cube as any flying task does, W x H pixels of S = CHANNEL x element / 16
atoms, lines (W + LINE_NOTCH_ADDR) atoms apart; surfaces are
``H x W + (H - 1) x LINE_NOTCH_ADDR + SURF_NOTCH`` atoms apart (the notch counted from the end of
the last line's pixels; SURF_NOTCH is a signed 28-bit field, negative in most of these tasks).

- **TP_EN** (DPU FEATURE_MODE_CFG.TP_EN = 1): pixel x of line y, surface s is written whole at
  ``DST + s * SURFACE_ADD + x * DST_SURF_STRIDE + y * 16``: lines become pixels and pixels become
  surfaces (W <= SIZE_E + 1 in every build). NC1HWC2 -> NHWC with a C2 surface a line and W the
  atom's lanes; NHWC rows of W atoms -> NC1HWC2 with W surfaces.
- **TP_ORG_EN** (DPU BS_OW_CFG.TP_ORG_EN = 1): element-wise, the element being
  WDMA_SIZE_0.TP_PRECISION's (0: 1 byte, 1: 2 bytes; the int8 builds move bytes under a 16-bit
  DATA_FORMAT). With R = 16 / element, G surfaces (column groups) and B = W x H / R pixel blocks,
  tile (g, b) is transposed: column g R + l, pixel b R + r goes to lane r of the atom at
  ``DST + tile(g, b) + l * DST_SURF_STRIDE``; ``tile = g * SURFACE_ADD + b * (NOTCH_ADDR_0 + 1) * 16``
  when SIZE_C_WDMA + 1 = G, ``(g * B + b) * SURFACE_ADD`` when it is G x B. NC1HWC2 -> NCHW
  (DST_SURF_STRIDE one plane, NOTCH_ADDR_0 0) and rows of a matrix -> NC1HWC2 lanes (W 1,
  DST_SURF_STRIDE one atom, NOTCH_ADDR_0 + 1 one output surface) are the common forms.

The plain copies whose WDMA geometry differs from DATA_CUBE (lane clearing, a line notch, other
lines, a smaller cube) are at the end of the module.
"""

from __future__ import annotations

import numpy as np

from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.units.state import PRECISION_DTYPES, DpuRdmaState, DpuState, Transpose
from npuemu.isa.errors import EmulationError

ATOM_TRANSPOSE, ROW_TRANSPOSE = 1, 2   # Transpose.mode: TP_EN, TP_ORG_EN
#: WDMA_SIZE_0.TP_PRECISION -> bytes of the element TP_ORG_EN moves [V] (int8 builds 0, fp16 1)
TP_ELEMENT_BYTES = {0: 1, 1: 2}


def decode_transpose(tp_en: int, tp_org_en: int, wdma_size_0: dict[str, int], wdma_size_1: dict[str, int],
                     notch: int, where: str) -> Transpose | None:
    """None unless TP_EN or TP_ORG_EN; both at once is refused."""
    if not tp_en and not tp_org_en:
        return None
    if tp_en and tp_org_en:
        raise EmulationError(f"{where}: DPU FEATURE_MODE_CFG.TP_EN=1 with BS_OW_CFG.TP_ORG_EN=1 is not modelled "
                             f"(no vendor stream sets both)")
    if wdma_size_0["TP_PRECISION"] not in TP_ELEMENT_BYTES:
        raise EmulationError(f"{where}: DPU WDMA_SIZE_0.TP_PRECISION={wdma_size_0['TP_PRECISION']} is not modelled "
                             f"(0 or 1)")
    return Transpose(
        mode=ATOM_TRANSPOSE if tp_en else ROW_TRANSPOSE,
        element_bytes=TP_ELEMENT_BYTES[wdma_size_0["TP_PRECISION"]],
        wdma_width=wdma_size_1["WIDTH_WDMA"] + 1, wdma_height=wdma_size_1["HEIGHT_WDMA"] + 1,
        wdma_channels=wdma_size_0["CHANNEL_WDMA"] + 1, wdma_atoms=wdma_size_0["SIZE_C_WDMA"] + 1,
        block_atoms=notch + 1)


def _pure_move(state: DpuState) -> bool:
    """Every stage bypassed, OUT_CVT the identity, one precision: the task moves bytes."""
    cvt = state.out_cvt
    stages = state.bs.bypass and state.bn.bypass and state.ew.bypass
    return stages and (cvt.scale, cvt.shift, cvt.offset) == (1, 0, 0) \
        and state.in_precision == state.proc_precision == state.out_precision


def _fail(where: str, what: str) -> EmulationError:
    return EmulationError(f"{where}: DPU transpose write ({what}) is not modelled")


def check_transpose(state: DpuState, where: str) -> None:
    """The forms every vendor build shows (REGISTER_SEMANTICS.md 31); anything else is refused."""
    tp = state.transpose
    if not _pure_move(state) or state.in_precision not in PRECISION_DTYPES:
        raise _fail(where, "a DPU stage enabled, OUT_CVT other than the identity or IN/PROC/OUT_PRECISION differing")
    item = PRECISION_DTYPES[state.in_precision].itemsize
    atom = state.atom_bytes
    if state.channels * item % atom:
        raise _fail(where, f"{state.channels} channels of {item} bytes: only whole {atom}-byte atoms are")
    groups = state.channels * item // atom   # the cube's surfaces = TP_ORG_EN's column groups
    if tp.mode == ATOM_TRANSPOSE:
        if state.width > state.size_e + 1:
            raise _fail(where, f"TP_EN on a cube {state.width} wide with SIZE_E={state.size_e}: W <= SIZE_E + 1 is")
        expected = (state.height, groups, state.channels)
        got = (tp.wdma_width, tp.wdma_height, tp.wdma_channels)
    else:
        lanes = atom // tp.element_bytes
        if state.width * state.height % lanes:
            raise _fail(where, f"TP_ORG_EN on {state.width}x{state.height} pixels: a multiple of {lanes} is")
        # SIZE_C_WDMA + 1 times WDMA_SIZE_1's W and H counts the 8-pixel steps of every column group [V]
        expected = (state.channels, groups * state.width * state.height // 8)
        got = (tp.wdma_channels, tp.wdma_atoms * tp.wdma_width * tp.wdma_height)
        blocks = state.width * state.height // lanes
        if tp.wdma_atoms not in (groups, groups * blocks):
            raise _fail(where, f"SIZE_C_WDMA={tp.wdma_atoms - 1} with {groups} column groups of {blocks} "
                               f"pixel blocks: the vendor's forms count the groups or groups x blocks")
    if got != expected:
        raise _fail(where, f"WDMA_SIZE_0/1 give {got}, the vendor's form is {expected}")


def check_transpose_source(state: DpuState, rdma: DpuRdmaState | None, where: str) -> None:
    """A flying MRDMA read of the DPU's cube, nothing else fetched."""
    if rdma is None or not state.flying or not rdma.main_enabled or rdma.comb_use or rdma.erdma_enabled \
            or rdma.brdma_use or rdma.nrdma_use or rdma.unpool is not None:
        raise _fail(where, "the source is not a plain flying MRDMA read")
    if rdma.in_precision != state.in_precision:
        raise _fail(where, "DPU_RDMA IN_PRECISION differs from the DPU's")
    if state.transpose.mode == ATOM_TRANSPOSE and source_surface_stride(rdma) != state.width * rdma.atom_bytes:
        # every TP_EN build reads a line as its surfaces' W pixels back to back
        raise _fail(where, f"TP_EN reading surfaces {source_surface_stride(rdma)} bytes apart (LINE_NOTCH_ADDR, "
                           f"SURF_NOTCH), not W atoms")


def source_surface_stride(rdma: DpuRdmaState) -> int:
    """Bytes between the MRDMA's surfaces: H x W + (H - 1) x LINE_NOTCH + SURF_NOTCH atoms as decoded
    (``decode_dpu_rdma``), modulo the 32-bit address (the notch is negative in these tasks)."""
    return rdma.surface_stride % (1 << 32)


def read_cube(state: DpuState, rdma: DpuRdmaState, dma: TaskDma) -> np.ndarray:
    """The MRDMA cube as ``uint8 [S][H][W][16]``."""
    atom = state.atom_bytes
    surfaces = state.channels * PRECISION_DTYPES[state.in_precision].itemsize // atom
    s = np.arange(surfaces, dtype=np.int64)[:, None] * source_surface_stride(rdma)
    y = np.arange(state.height, dtype=np.int64)[None, :] * rdma.line_stride
    starts = ((rdma.src_address + s + y) % (1 << 32)).reshape(-1)
    rows = dma.read_rows(Traffic.MAIN_READ, starts, state.width * atom,
                         f"DPU_RDMA transpose source (SRC_BASE_ADDR={rdma.src_address:#x})")
    return rows.reshape(surfaces, state.height, state.width, atom)


def run_transpose(state: DpuState, rdma: DpuRdmaState, dma: TaskDma, where: str) -> None:
    check_transpose_source(state, rdma, where)
    cube = read_cube(state, rdma, dma)
    if state.transpose.mode == ATOM_TRANSPOSE:
        starts, data = atom_transpose(state, cube)
    else:
        starts, data = element_transpose(state, cube)
    dma.write_rows(Traffic.DPU_WRITE, starts, data, f"DPU transpose output (DST_BASE_ADDR={state.dst_address:#x})")


def atom_transpose(state: DpuState, cube: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TP_EN: ``[S][H][W][16]`` -> (start of each (surface, pixel) column, ``[S * W][H * 16]``)."""
    surfaces, height, width, atom = cube.shape
    s = np.arange(surfaces, dtype=np.int64)[:, None] * state.surface_add
    x = np.arange(width, dtype=np.int64)[None, :] * state.dst_surface_stride
    starts = (state.dst_address + s + x).reshape(-1)
    return starts, cube.transpose(0, 2, 1, 3).reshape(surfaces * width, height * atom)


def element_transpose(state: DpuState, cube: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TP_ORG_EN: ``[S][H][W][16]`` -> (start of each written atom, ``[atoms][16]``)."""
    surfaces, height, width, atom = cube.shape
    size = state.transpose.element_bytes
    lanes = atom // size                                   # R: elements an atom holds
    pixels = height * width
    blocks = pixels // lanes
    elements = cube.reshape(surfaces, blocks, lanes, lanes, size)          # [s][block][q % R][c % R][byte]
    g = np.arange(surfaces, dtype=np.int64)[:, None, None]          # column group (source surface)
    lane = np.arange(lanes, dtype=np.int64)[None, :, None]          # column within the group
    k = np.arange(blocks, dtype=np.int64)[None, None, :]            # R-pixel block
    tp = state.transpose
    if tp.wdma_atoms == surfaces:   # SIZE_C_WDMA counts the groups: blocks (NOTCH_ADDR_0 + 1) atoms apart
        tile = g * state.surface_add + k * tp.block_atoms * atom
    else:                           # groups x blocks: group-major tiles, SURFACE_ADD apart (check_transpose)
        tile = (g * blocks + k) * state.surface_add
    starts = state.dst_address + tile + lane * state.dst_surface_stride
    data = elements.transpose(0, 3, 1, 2, 4).reshape(-1, atom)            # [s][c % R][block][q % R][byte]
    return starts.reshape(-1), data


def pads_lanes(state: DpuState, wdma: tuple[int, int, int], size_c_wdma: int) -> bool:
    """The vendor's lane-clearing copy after a transpose: WDMA_SIZE_0 CHANNEL_WDMA rounds the cube's
    channels up to whole atoms and SIZE_C_WDMA + 1 is the cube's channels [V] (rknn-fixtures-ops
    transpose_nhwc_fp16 task 3: 4 channels, CHANNEL_WDMA 7, SIZE_C_WDMA 3; matmul_act_fp16 task 3:
    7 channels, lines W + NOTCH_ADDR_0 atoms apart). Run by ``run_pad_lanes``."""
    if state.out_precision not in PRECISION_DTYPES:
        return False
    c2 = state.atom_bytes // PRECISION_DTYPES[state.out_precision].itemsize
    whole = -(-state.channels // c2) * c2
    return wdma == (state.width, state.height, whole) and whole > state.channels and size_c_wdma + 1 == state.channels


def is_notched_copy(state: DpuState, rdma: DpuRdmaState | None) -> bool:
    """A flying plain copy (stages bypassed, OUT_CVT the identity) whose written lines are
    (W + NOTCH_ADDR_0) atoms apart: the vendor's copy into a wider tensor (matmul_act_fp16 task 4,
    15 -> 16 atoms a line, NOTCH_ADDR_0 1) [V]. Run by ``run_pad_lanes`` too."""
    return state.line_notch != 0 and state.flying and rdma is not None and rdma.unpool is None \
        and state.pixel_step == 0 and state.transpose is None and _pure_move(state)


def run_pad_lanes(state: DpuState, rdma: DpuRdmaState | None, dma: TaskDma, where: str) -> None:
    """The lane-clearing copy: the MRDMA cube's atoms written whole, lanes past CHANNEL as 0, lines
    (W + NOTCH_ADDR_0) atoms apart (the line notch the vendor's edge copies use, kernels/dpu_unpool.py)
    [I]: the vendor clears the padding lanes a transpose left behind before a consumer reads them."""
    if not _pure_move(state):
        raise _fail(where, "a lane-clearing copy (CHANNEL_WDMA past CHANNEL) with a stage enabled or a conversion")
    if rdma is None or not state.flying or rdma.comb_use or rdma.erdma_enabled or rdma.brdma_use or rdma.nrdma_use:
        raise _fail(where, "a lane-clearing copy whose source is not a plain flying MRDMA read")
    atom = state.atom_bytes
    item = PRECISION_DTYPES[state.in_precision].itemsize
    surfaces = -(-state.channels * item // atom)
    s = np.arange(surfaces, dtype=np.int64)[:, None]
    y = np.arange(state.height, dtype=np.int64)[None, :]
    source = (rdma.src_address + s * source_surface_stride(rdma) + y * rdma.line_stride) % (1 << 32)
    rows = dma.read_rows(Traffic.MAIN_READ, source.reshape(-1), state.width * atom,
                         f"DPU_RDMA source (SRC_BASE_ADDR={rdma.src_address:#x})")
    lanes = rows.reshape(surfaces, state.height, state.width, atom // item, item)
    lanes[-1, :, :, state.channels - (surfaces - 1) * (atom // item):] = 0
    group = state.size_e + 1
    out = state.dst_address + (s // group) * state.surface_add + (s % group) * state.dst_surface_stride \
        + y * (state.width + state.line_notch) * atom
    dma.write_rows(Traffic.DPU_WRITE, out.reshape(-1), lanes.reshape(surfaces * state.height, -1),
                   f"DPU output (DST_BASE_ADDR={state.dst_address:#x})")


def relines(state: DpuState, wdma: tuple[int, int, int]) -> bool:
    """WDMA_SIZE_1 splits the cube's W x H pixels into other lines, channels unchanged: the same
    contiguous pixel stream, so the plain write's addresses [I] (own vendor builds of Transpose perm
    (0,1,3,2): DATA_CUBE 1 x 6 x 80, WDMA 6 x 1 x 80, each line's atoms written as a 6-atom column
    of the output; REGISTER_SEMANTICS.md 31)."""
    return wdma[2] == state.channels and wdma[0] * wdma[1] == state.width * state.height and state.line_notch == 0


def _plain_copy(state: DpuState) -> bool:
    return state.flying and state.transpose is None and state.pixel_step == 0 and _pure_move(state)


def wdma_sub_cube(state: DpuState, wdma: tuple[int, int, int]) -> tuple[int, int] | None:
    """(W, H) the copy really moves when a flying plain copy's WDMA sizes give a smaller W x H than
    DATA_CUBE (channels equal); else None. The vendor's Resize bilinear edge copies (rknn-fixtures-ops
    resize_bilinear_2x_int8/_fp16 tasks 1-4) leave DATA_CUBE at the 42 x 42 of the task before and
    give the one row / column they copy in WDMA_SIZE_1 and the MRDMA cube alike (the MRDMA feeds the
    DPU in flying mode); check_rdma_matches then holds the MRDMA to the same W x H [I]."""
    if not _plain_copy(state) or wdma[2] != state.channels or (wdma[0], wdma[1]) == (state.width, state.height):
        return None
    if wdma[0] > state.width or wdma[1] > state.height:
        return None
    return wdma[0], wdma[1]
