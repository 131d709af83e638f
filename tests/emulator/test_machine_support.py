"""Shared helpers for the machine tests (this module holds no tests).

- Independent numpy references of the arithmetic (written from emulator/NUMERICS.md and the
  hardware docs, never from the emulator's kernels): rounding shifts, convolution with window
  sums, the DPU stages, the LUT, pooling.
- Memory layouts written from their descriptions: NC1HWC2 cubes, the int8 weight blocks
  (rknpu-isa.md 4, vendor-corpus 5, NUMERICS.md 8.2), the BRDMA bias blob (vendor-corpus 5).
- Command-stream builders for hand-made tasks (full register sets, as the vendor writes a
  layer's first task) and a parser of the vendor listings' chain 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npuemu.emulator.machine import Machine
from npuemu.isa.chain import encode_chain
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain, RegisterWrite, Task
from npuemu.isa.words import WordKind, decode_word

REGMAP = load_regmap("rk3588")
CORPUS = Path(__file__).parents[2] / ".." / "shared" / "docs" / "vendor-corpus"
ATOM = 16
MASK_CONV, MASK_CONV_NO_RDMA, MASK_FLYING, MASK_POOL = 0x1D, 0x0D, 0x18, 0x60


# ---------------------------------------------------------------------------------------------
# Rounding and saturation (NUMERICS.md 1-2), exact on int64 / Python ints
# ---------------------------------------------------------------------------------------------
def shift_half_away(value, shift):
    value = np.asarray(value, dtype=object)
    if np.all(np.asarray(shift) == 0):
        return value
    half = 1 << (shift - 1)
    magnitude = (abs(value) + half) >> shift
    return np.where(value < 0, -magnitude, magnitude)


def shift_half_even(value, shift):
    value = np.asarray(value, dtype=object)
    if shift == 0:
        return value
    floor = value >> shift
    rest = value - (floor << shift)
    half = 1 << (shift - 1)
    up = (rest > half) | ((rest == half) & (floor % 2 == 1))
    return floor + up.astype(object)


def saturate(value, low, high):
    return np.clip(np.asarray(value, dtype=object), low, high)


def sat32(value):
    return saturate(value, -(2**31), 2**31 - 1)


def as_int(array) -> np.ndarray:
    return np.asarray(array, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# Convolution reference
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    out_h: int
    out_w: int
    kernel_h: int = 1
    kernel_w: int = 1
    stride: int = 1
    dilation: int = 1
    pad_top: int = 0
    pad_left: int = 0


def padded_input(x: np.ndarray, geometry: Geometry, pad_value: int) -> np.ndarray:
    """[C][Hp][Wp] int64: pad value above/left and wherever the output reaches past the input."""
    channels, height, width = x.shape
    g = geometry
    need_h = (g.out_h - 1) * g.stride + (g.kernel_h - 1) * g.dilation + 1
    need_w = (g.out_w - 1) * g.stride + (g.kernel_w - 1) * g.dilation + 1
    out = np.full((channels, max(need_h, g.pad_top + height), max(need_w, g.pad_left + width)),
                  pad_value, np.int64)
    out[:, g.pad_top:g.pad_top + height, g.pad_left:g.pad_left + width] = x
    return out[:, :need_h, :need_w]


def windows(xp: np.ndarray, geometry: Geometry) -> np.ndarray:
    """[C][KH][KW][OH][OW] view of every tap of every output position."""
    g = geometry
    taps = np.empty((xp.shape[0], g.kernel_h, g.kernel_w, g.out_h, g.out_w), np.int64)
    for ky in range(g.kernel_h):
        for kx in range(g.kernel_w):
            y0, x0 = ky * g.dilation, kx * g.dilation
            taps[:, ky, kx] = xp[:, y0:y0 + (g.out_h - 1) * g.stride + 1:g.stride,
                                 x0:x0 + (g.out_w - 1) * g.stride + 1:g.stride]
    return taps


def conv_reference(x: np.ndarray, w: np.ndarray, geometry: Geometry, pad_value: int):
    """Direct convolution: exact int64 sums [K][OH][OW] and the window sum [OH][OW] of all
    input channels (padding included at the pad value)."""
    taps = windows(padded_input(as_int(x), geometry, pad_value), geometry)
    flat = taps.reshape(-1, geometry.out_h * geometry.out_w).astype(np.float64)
    # float64 is exact here: |sum| < 2**53 for int8 x int8 over < 2**36 products
    acc = (as_int(w).reshape(w.shape[0], -1).astype(np.float64) @ flat).astype(np.int64)
    sums = taps.sum(axis=(0, 1, 2))
    return acc.reshape(w.shape[0], geometry.out_h, geometry.out_w), sums


def depthwise_reference(x: np.ndarray, w: np.ndarray, geometry: Geometry, pad_value: int):
    """Depthwise: sums [C][OH][OW] and per-channel window sums [C][OH][OW]; ``w`` is [C][KH][KW]."""
    taps = windows(padded_input(as_int(x), geometry, pad_value), geometry)
    acc = np.einsum("cyxhw,cyx->chw", taps, as_int(w))
    return acc, taps.sum(axis=(1, 2))


# ---------------------------------------------------------------------------------------------
# DPU reference (NUMERICS.md 4-5), driven by plain parameters
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BsParams:
    alu: np.ndarray | int = 0  # per channel or scalar
    mul: np.ndarray | int = 1
    cpend: np.ndarray | int = 0
    shift: int = 0
    shift_neg: int | None = None
    alu_on: bool = True
    mul_on: bool = True
    cpend_on: bool = False
    relu: bool = False


def bs_reference(acc, params: BsParams, window_sums=None):
    v = np.asarray(acc, dtype=object)
    channels = v.shape[0]

    def per_channel(values):
        array = np.asarray(values, dtype=object)
        return array.reshape(channels, 1, 1) if array.ndim else array

    if params.cpend_on:
        v = v + per_channel(params.cpend) * np.asarray(window_sums, dtype=object)
    if params.alu_on:
        v = v + per_channel(params.alu)
    if params.mul_on:
        product = v * per_channel(params.mul)
        negative = params.shift if params.shift_neg is None else params.shift_neg
        v = np.where(product >= 0, shift_half_away(product, params.shift),
                     shift_half_away(product, negative))
    v = sat32(v)
    return np.maximum(v, 0) if params.relu else v


def bn_reference(v, mul: int, alu: int, shift: int, relu: bool = False, mul_on=True, alu_on=True):
    v = np.asarray(v, dtype=object)
    if mul_on:
        v = v * mul
    if alu_on:
        v = v + alu
    if mul_on:
        v = shift_half_away(v, shift)
    v = sat32(v)
    return np.maximum(v, 0) if relu else v


def ew_convert_reference(operand, offset: int, scale: int, shift: int, round_away: bool = False):
    value = (np.asarray(operand, dtype=object) + offset) * scale
    return sat32(shift_half_away(value, shift) if round_away else shift_half_even(value, shift))


def out_cvt_reference(v, scale: int, shift: int, offset: int, low=-128, high=127, round_away=False):
    product = np.asarray(v, dtype=object) * scale
    rounded = shift_half_away(product, shift) if round_away else shift_half_even(product, shift)
    return saturate(rounded + offset, low, high).astype(np.int64)


def lut_reference(x, table_le, table_lo, le, lo, priorities):
    """Two-table LUT of NUMERICS.md 5; ``le``/``lo`` = (start, end, index_select,
    uflow_scale, uflow_shift, oflow_scale, oflow_shift); priorities = (hybrid, uflow, oflow)."""
    hybrid, uflow, oflow = priorities

    def table(value, entries, cfg):
        start, end, k, us, ush, os_, osh = cfg
        if value < start:
            return "under", entries[0] + int(shift_half_away((value - start) * us, ush))
        if value > end:
            return "over", entries[512] + int(shift_half_away((value - end) * os_, osh))
        index = (value - start) >> k
        frac = (value - start) - (index << k)
        if index >= 512:
            return "hit", entries[512]
        step = int(entries[index + 1]) - int(entries[index])
        return "hit", int(entries[index]) + int(shift_half_away(step * frac, k))

    out = np.empty(np.shape(x), np.int64)
    for i, value in np.ndenumerate(np.asarray(x, dtype=np.int64)):
        a, ya = table(int(value), table_le, le)
        b, yb = table(int(value), table_lo, lo)
        if a == "hit" and b != "hit":
            y = ya
        elif b == "hit" and a != "hit":
            y = yb
        elif a == b == "under":
            y = yb if uflow else ya
        elif a == b == "over":
            y = yb if oflow else ya
        else:
            y = yb if hybrid else ya
        out[i] = min(max(y, -(2**31)), 2**31 - 1)
    return out


# ---------------------------------------------------------------------------------------------
# Pooling reference (NUMERICS.md 6)
# ---------------------------------------------------------------------------------------------
def pool_reference(x, method: str, kernel: int, stride: int, out_h: int, out_w: int,
                   pad_top: int = 0, pad_left: int = 0, pad_value: int = 0):
    """max skips padded positions; average counts them at the pad value and divides by k*k
    with round-half-away (RECIP = 2**16 / k, k a power of two)."""
    channels, height, width = x.shape
    out = np.empty((channels, out_h, out_w), np.int64)
    for oy in range(out_h):
        for ox in range(out_w):
            ys = [oy * stride + k - pad_top for k in range(kernel)]
            xs = [ox * stride + k - pad_left for k in range(kernel)]
            inside = [(y, xx) for y in ys for xx in xs if 0 <= y < height and 0 <= xx < width]
            values = np.array([x[:, y, xx] for y, xx in inside], np.int64)
            if method == "max":
                out[:, oy, ox] = values.max(axis=0)
            else:
                total = values.sum(axis=0) + pad_value * (kernel * kernel - len(inside))
                recip = 2**16 // kernel  # RECIP_KERNEL_WIDTH/HEIGHT (rep08: 32768 for k = 2)
                out[:, oy, ox] = [int(shift_half_away(int(t) * recip * recip, 32)) for t in total]
    return out


# ---------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------
def to_nc1hwc2(x: np.ndarray, c2: int = 16, c1: int | None = None) -> np.ndarray:
    """[C][H][W] -> [C1][H][W][C2], padding lanes 0 (rknpu-isa.md 4)."""
    channels, height, width = x.shape
    groups = -(-channels // c2) if c1 is None else c1
    out = np.zeros((groups * c2, height, width), x.dtype)
    out[:channels] = x
    return np.ascontiguousarray(out.reshape(groups, c2, height, width).transpose(0, 2, 3, 1))


def from_nc1hwc2(atoms: np.ndarray, channels: int) -> np.ndarray:
    groups, height, width, c2 = atoms.shape
    return atoms.transpose(0, 3, 1, 2).reshape(groups * c2, height, width)[:channels]


def read_cube(machine: Machine, address: int, channels: int, height: int, width: int,
              surface_stride: int | None = None, dtype=np.int8) -> np.ndarray:
    """Read an NC1HWC2 tensor back from memory as [C][H][W]."""
    c2 = ATOM // np.dtype(dtype).itemsize
    groups = -(-channels // c2)
    surface = surface_stride or height * width * ATOM
    planes = [machine.memory.dump(address + g * surface, height * width * ATOM) for g in range(groups)]
    atoms = np.stack(planes).view(dtype).reshape(groups, height, width, c2)
    return from_nc1hwc2(atoms, channels)


def pack_conv_weights(w: np.ndarray, fill: np.ndarray | int = 0) -> np.ndarray:
    """int8 [K][C][KH][KW] -> the CNA blob: per output group of 32 kernels (the last holds the
    rest rounded up to even) the input groups of 32 channels after C is rounded up to 16, each
    [KH][KW][kernels][channels]; padded channels hold ``fill`` (per kernel), padded kernels 0."""
    kernels, channels, kh, kw = w.shape
    stored_c = -(-channels // 16) * 16
    full = np.zeros((-(-kernels // 2) * 2, stored_c, kh, kw), np.int8)
    full[:kernels, channels:] = np.broadcast_to(np.asarray(fill, np.int8).reshape(-1, 1, 1, 1)
                                                if np.ndim(fill) else np.int8(fill),
                                                (kernels, stored_c - channels, kh, kw))
    full[:kernels, :channels] = w
    parts = []
    for k0 in range(0, full.shape[0], 32):
        group = full[k0:k0 + 32]
        for c0 in range(0, stored_c, 32):
            block = group[:, c0:c0 + 32]  # [k][c][kh][kw]
            parts.append(block.transpose(2, 3, 0, 1).reshape(-1))
    return np.concatenate(parts)


def pack_depthwise_weights(w: np.ndarray) -> np.ndarray:
    """int8 [C][KH][KW] -> groups of 64 channels (tail rounded up to 16), each [KH][KW][channels]."""
    channels, kh, kw = w.shape
    parts = []
    for c0 in range(0, channels, 64):
        count = min(64, channels - c0)
        stored = 64 if count == 64 else -(-count // 16) * 16
        block = np.zeros((stored, kh, kw), np.int8)
        block[:count] = w[c0:c0 + count]
        parts.append(block.transpose(1, 2, 0).reshape(-1))
    return np.concatenate(parts)


def bias_blob(alu, cpend, mul) -> bytes:
    """The BRDMA blob of vendor-corpus 5: per 8 channels int32 ALU[8], int16 CPEND[8], int16 MUL[8]."""
    channels = len(alu)
    groups = -(-channels // 8)
    out = bytearray()
    for g in range(groups):
        chunk = slice(8 * g, 8 * g + 8)

        def lane(values, dtype):
            part = np.zeros(8, dtype)
            taken = np.asarray(values[chunk])
            part[:taken.size] = taken
            return part.astype(dtype).tobytes()

        out += lane(alu, "<i4") + lane(cpend, "<i2") + lane(mul, "<i2")
    return bytes(out)


# ---------------------------------------------------------------------------------------------
# Command streams
# ---------------------------------------------------------------------------------------------
class TaskWriter:
    """Ordered register writes of one task, fields packed through the register map."""

    def __init__(self) -> None:
        self.writes: list[RegisterWrite] = []

    def set(self, block: str, register: str, value: int | None = None, /, **fields: int) -> TaskWriter:
        reg = REGMAP.register(block, register)
        raw = reg.pack(fields, base=0 if value is None else value & 0xFFFFFFFF)
        self.writes.append(RegisterWrite(block, register, raw))
        return self

    def task(self, mask: int) -> Task:
        return Task(tuple(self.writes), mask)


def run_tasks(machine: Machine, tasks: list[Task], address: int = 0x00F0_0000, core: int = 0):
    encoded = encode_chain(Chain(tuple(tasks)), REGMAP, base_addr=address)
    machine.memory.load(address, encoded.data)
    return machine.run_chain(address, encoded.first_amount, core)


def load_cube(machine: Machine, address: int, x: np.ndarray, c2: int = 16) -> None:
    machine.memory.load(address, to_nc1hwc2(x, c2).tobytes())


@dataclass
class ConvSpec:
    """Everything a hand-built convolution task needs (sizes real, not minus one)."""

    in_c: int
    in_h: int
    in_w: int
    kernels: int
    kernel: int = 1
    stride: int = 1
    dilation: int = 1
    pad_top: int = 0
    pad_left: int = 0
    out_h: int | None = None
    out_w: int | None = None
    depthwise: bool = False
    pad_value: int = 0
    feature: int = 0x10000
    weights: int = 0x200000
    bias: int = 0x280000
    output: int = 0x300000
    banks: tuple[int, int] = (6, 6)
    out_scale: int = 1
    out_shift: int = 0
    out_offset: int = 0
    bs_shift: int = 0
    relu: bool = False  # BN ReLU like rep01
    weight_reuse: bool = False
    full_in_h: int | None = None  # rows of the whole input / output tensor when a task covers a band
    full_out_h: int | None = None
    real_channels: int | None = None
    clip_truncate: int = 0

    def __post_init__(self) -> None:
        g = self.geometry()
        object.__setattr__(self, "out_h", g.out_h)
        object.__setattr__(self, "out_w", g.out_w)

    def geometry(self) -> Geometry:
        span = (self.kernel - 1) * self.dilation + 1
        out_h = self.out_h or (self.pad_top + self.in_h - span) // self.stride + 1
        out_w = self.out_w or (self.pad_left + self.in_w - span) // self.stride + 1
        return Geometry(out_h, out_w, self.kernel, self.kernel, self.stride, self.dilation,
                        self.pad_top, self.pad_left)

    @property
    def in_c_aligned(self) -> int:
        return -(-self.in_c // 16) * 16

    @property
    def core_channels(self) -> int:
        produced = self.in_c_aligned if self.depthwise else self.kernels
        return -(-produced // 32) * 32

    def weight_bytes(self) -> tuple[int, int]:
        taps = self.kernel * self.kernel
        if self.depthwise:
            zeros = np.zeros((self.in_c_aligned, self.kernel, self.kernel), np.int8)
            total = len(pack_depthwise_weights(zeros))
            return total, total
        stored_k = -(-self.kernels // 2) * 2  # the last group rounds up to even (NUMERICS 8.2)
        return taps * self.in_c_aligned * stored_k, taps * self.in_c_aligned


def conv_task(spec: ConvSpec) -> TaskWriter:
    """A full conv task in the vendor's register order (rep01's first task as the model)."""
    s = spec
    t = TaskWriter()
    full_in_h = s.full_in_h or s.in_h
    full_out_h = s.full_out_h or s.out_h
    mode = 3 if s.depthwise else 0
    total, per_kernel = s.weight_bytes()
    line = s.in_w * ATOM // 4
    real = (s.real_channels or s.in_c) - 1
    t.set("CNA", "CBUF_CON0", WEIGHT_BANK=s.banks[1], DATA_BANK=s.banks[0], WEIGHT_REUSE=int(s.weight_reuse))
    t.set("CNA", "CONV_CON1", CONV_MODE=mode)
    t.set("DPU", "S_POINTER", 0xE).set("DPU_RDMA", "S_POINTER", 0xE)
    t.set("CNA", "CONV_CON2", FEATURE_GRAINS=s.kernel + 1)
    t.set("CNA", "CONV_CON3", CONV_X_STRIDE=s.stride, CONV_Y_STRIDE=s.stride,
          ATROUS_X_DILATION=s.dilation - 1, ATROUS_Y_DILATION=s.dilation - 1)
    t.set("CNA", "DATA_SIZE0", DATAIN_WIDTH=s.in_w, DATAIN_HEIGHT=s.in_h)
    t.set("CNA", "DATA_SIZE1", DATAIN_CHANNEL_REAL=real, DATAIN_CHANNEL=s.in_c_aligned)
    t.set("CNA", "DATA_SIZE2", DATAOUT_WIDTH=s.out_w)
    t.set("CNA", "DATA_SIZE3", DATAOUT_ATOMICS=s.out_w * s.out_h)
    t.set("CNA", "WEIGHT_SIZE0", WEIGHT_BYTES=total)
    t.set("CNA", "WEIGHT_SIZE1", WEIGHT_BYTES_PER_KERNEL=per_kernel)
    t.set("CNA", "WEIGHT_SIZE2", WEIGHT_WIDTH=s.kernel, WEIGHT_HEIGHT=s.kernel,
          WEIGHT_KERNELS=1 if s.depthwise else s.kernels)
    t.set("CNA", "CBUF_CON1", DATA_ENTRIES=-(-s.in_w * (s.in_c_aligned // 16) // 4))
    t.set("CNA", "CVT_CON0", DATA_SIGN=1, CVT_TYPE=1, CVT_BYPASS=1)
    t.set("CNA", "PAD_CON0", PAD_TOP=s.pad_top, PAD_LEFT=s.pad_left)
    t.set("CNA", "FEATURE_DATA_ADDR", s.feature)
    t.set("CNA", "DMA_CON0", WEIGHT_BURST_LEN=15, DATA_BURST_LEN=15)
    t.set("CNA", "DMA_CON1", LINE_STRIDE=line)
    t.set("CNA", "DMA_CON2", SURF_STRIDE=(s.in_w * full_in_h - line) % (1 << 28))
    t.set("CNA", "FC_DATA_SIZE0", DMA_WIDTH=s.in_w, DMA_HEIGHT=s.in_h)
    t.set("CNA", "FC_DATA_SIZE1", DMA_CHANNEL=s.in_c_aligned)
    t.set("CNA", "DCOMP_ADDR0", s.weights)
    t.set("CNA", "PAD_CON1", s.pad_value & 0xFFFFFFFF)
    t.set("CORE", "MISC_CFG", QD_EN=1, DW_EN=int(s.depthwise))
    t.set("CORE", "DATAOUT_SIZE_0", DATAOUT_HEIGHT=s.out_h - 1, DATAOUT_WIDTH=s.out_w - 1)
    t.set("CORE", "DATAOUT_SIZE_1", DATAOUT_CHANNEL=s.core_channels - 1)
    t.set("CORE", "CLIP_TRUNCATE", CLIP_TRUNCATE=s.clip_truncate)
    dpu_writes(t, s.out_w, s.out_h, s.core_channels, (s.kernels if not s.depthwise else s.in_c),
               dst=s.output, surface=s.out_w * full_out_h, size_e=3 if s.depthwise else 1,
               conv_mode=mode, flying=False)
    t.set("DPU", "BS_CFG", BS_ALU_ALGO=2, BS_ALU_SRC=1, BS_RELU_BYPASS=1)
    t.set("DPU", "BS_MUL_CFG", BS_MUL_SHIFT_VALUE=s.bs_shift, BS_MUL_SRC=1)
    t.set("DPU", "DATA_FORMAT", BS_MUL_SHIFT_VALUE_NEG=s.bs_shift)
    t.set("DPU", "BS_OW_CFG", SIZE_E_0=3 if s.depthwise else 1, SIZE_E_1=3 if s.depthwise else 1,
          SIZE_E_2=3 if s.depthwise else 1, OW_SRC=1)
    t.set("DPU", "BN_CFG", BN_MUL_BYPASS=1, BN_ALU_BYPASS=1, BN_RELU_BYPASS=int(not s.relu))
    t.set("DPU", "OUT_CVT_OFFSET", s.out_offset & 0xFFFFFFFF)
    t.set("DPU", "OUT_CVT_SCALE", OUT_CVT_SCALE=s.out_scale)
    t.set("DPU", "OUT_CVT_SHIFT", OUT_CVT_SHIFT=s.out_shift)
    t.set("DPU_RDMA", "BRDMA_CFG", BRDMA_DATA_USE=7)
    t.set("DPU_RDMA", "BS_BASE_ADDR", s.bias)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", BURST_LEN=15, MRDMA_DISABLE=1, CONV_MODE=mode)
    return t


def dpu_writes(t: TaskWriter, width: int, height: int, channels: int, orig: int, *, dst: int,
               surface: int, size_e: int, conv_mode: int = 0, flying: bool) -> None:
    """DPU/DPU_RDMA cube, writer and bypassed stages (callers override what they use)."""
    t.set("DPU", "FEATURE_MODE_CFG", BURST_LEN=15, CONV_MODE=conv_mode, OUTPUT_MODE=2,
          FLYING_MODE=int(flying))
    t.set("DPU", "DST_BASE_ADDR", dst)
    t.set("DPU", "DST_SURF_STRIDE", DST_SURF_STRIDE=surface)
    t.set("DPU", "DATA_CUBE_WIDTH", WIDTH=width - 1).set("DPU", "DATA_CUBE_HEIGHT", HEIGHT=height - 1)
    t.set("DPU", "DATA_CUBE_CHANNEL", ORIG_CHANNEL=orig - 1, CHANNEL=channels - 1)
    t.set("DPU", "BS_CFG", BS_RELU_BYPASS=1, BS_MUL_BYPASS=1, BS_ALU_BYPASS=1, BS_BYPASS=1)
    t.set("DPU", "BS_OW_CFG", SIZE_E_0=size_e, SIZE_E_1=size_e, SIZE_E_2=size_e, OD_BYPASS=1)
    t.set("DPU", "WDMA_SIZE_0", CHANNEL_WDMA=channels - 1)
    t.set("DPU", "WDMA_SIZE_1", HEIGHT_WDMA=height - 1, WIDTH_WDMA=width - 1)
    t.set("DPU", "BN_CFG", BN_RELU_BYPASS=1, BN_MUL_BYPASS=1, BN_ALU_BYPASS=1, BN_BYPASS=1)
    t.set("DPU", "EW_CFG", EW_RELU_BYPASS=1, EW_OP_CVT_BYPASS=1, EW_LUT_BYPASS=1, EW_OP_BYPASS=1, EW_BYPASS=1)
    t.set("DPU", "EW_CVT_SCALE_VALUE", EW_OP_CVT_SCALE=1)
    t.set("DPU", "OUT_CVT_SCALE", OUT_CVT_SCALE=1)
    t.set("DPU", "SURFACE_ADD", SURF_ADD=surface * (size_e + 1))
    t.set("DPU_RDMA", "DATA_CUBE_WIDTH", WIDTH=width - 1)
    t.set("DPU_RDMA", "DATA_CUBE_HEIGHT", HEIGHT=height - 1)
    t.set("DPU_RDMA", "DATA_CUBE_CHANNEL", CHANNEL=channels - 1)
    t.set("DPU_RDMA", "ERDMA_CFG", ERDMA_DISABLE=1)
    t.set("DPU_RDMA", "FEATURE_MODE_CFG", BURST_LEN=15, MRDMA_DISABLE=int(not flying),
          FLYING_MODE=int(flying))


def flying_task(width: int, height: int, channels: int, *, src: int, dst: int) -> TaskWriter:
    """A DPU-only (0x18) task reading its main cube from the MRDMA, stages bypassed."""
    t = TaskWriter()
    t.set("DPU", "S_POINTER", 0xE).set("DPU_RDMA", "S_POINTER", 0xE)
    dpu_writes(t, width, height, channels, channels, dst=dst, surface=width * height, size_e=0, flying=True)
    t.set("DPU_RDMA", "SRC_BASE_ADDR", src)
    return t


def pool_task(width: int, height: int, channels: int, *, method: int, kernel: int, stride: int,
              out_w: int, out_h: int, src: int, dst: int, pads=(0, 0, 0, 0),
              pad_value: int = 0) -> TaskWriter:
    """A PPU (0x60) task as rep07/rep08 program it; pads = (top, bottom, left, right)."""
    t = TaskWriter()
    t.set("PPU", "S_POINTER", 0xE).set("PPU_RDMA", "S_POINTER", 0xE)
    t.set("PPU", "DATA_CUBE_IN_WIDTH", CUBE_IN_WIDTH=width - 1)
    t.set("PPU", "DATA_CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=height - 1)
    t.set("PPU", "DATA_CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=channels - 1)
    t.set("PPU", "DATA_CUBE_OUT_WIDTH", CUBE_OUT_WIDTH=out_w - 1)
    t.set("PPU", "DATA_CUBE_OUT_HEIGHT", CUBE_OUT_HEIGHT=out_h - 1)
    t.set("PPU", "DATA_CUBE_OUT_CHANNEL", CUBE_OUT_CHANNEL=channels - 1)
    t.set("PPU", "OPERATION_MODE_CFG", FLYING_MODE=1, POOLING_METHOD=method)
    t.set("PPU", "POOLING_KERNEL_CFG", KERNEL_STRIDE_HEIGHT=stride - 1, KERNEL_STRIDE_WIDTH=stride - 1,
          KERNEL_HEIGHT=kernel - 1, KERNEL_WIDTH=kernel - 1)
    t.set("PPU", "RECIP_KERNEL_WIDTH", RECIP_KERNEL_WIDTH=2**16 // kernel if method == 0 else 0)
    t.set("PPU", "RECIP_KERNEL_HEIGHT", RECIP_KERNEL_HEIGHT=2**16 // kernel if method == 0 else 0)
    t.set("PPU", "POOLING_PADDING_CFG", PAD_TOP=pads[0], PAD_BOTTOM=pads[1], PAD_LEFT=pads[2],
          PAD_RIGHT=pads[3])
    t.set("PPU", "PADDING_VALUE_1_CFG", pad_value & 0xFFFFFFFF)
    t.set("PPU", "DST_BASE_ADDR", dst)
    t.set("PPU", "DST_SURF_STRIDE", DST_SURF_STRIDE=out_w * out_h)
    t.set("PPU", "DATA_FORMAT", INDEX_ADD=out_w * out_h)
    t.set("PPU_RDMA", "CUBE_IN_WIDTH", CUBE_IN_WIDTH=width - 1)
    t.set("PPU_RDMA", "CUBE_IN_HEIGHT", CUBE_IN_HEIGHT=height - 1)
    t.set("PPU_RDMA", "CUBE_IN_CHANNEL", CUBE_IN_CHANNEL=channels - 1)
    t.set("PPU_RDMA", "SRC_BASE_ADDR", src)
    t.set("PPU_RDMA", "SRC_LINE_STRIDE", SRC_LINE_STRIDE=width)
    t.set("PPU_RDMA", "SRC_SURF_STRIDE", SRC_SURF_STRIDE=width * height)
    t.set("PPU_RDMA", "DATA_FORMAT", IN_PRECISION=1)
    return t


# ---------------------------------------------------------------------------------------------
# Vendor listings
# ---------------------------------------------------------------------------------------------
@dataclass
class Listing:
    """Chain 0 of one vendor listing: tasks (body writes + enable mask), tensors, case params."""

    name: str
    tasks: list[Task]
    tensors: dict[str, dict]
    case: dict
    lut_data: list[int] = field(default_factory=list)

    def field(self, task: int, block: str, register: str, name: str) -> int:
        """A field as written in ``task`` (the last write in that task)."""
        for write in reversed(self.tasks[task].writes):
            if (write.block, write.register) == (block, register):
                return REGMAP.unpack(block, register, write.value)[name]
        raise KeyError(f"task {task} does not write {block}.{register}")


def corpus_dir() -> Path:
    directory = CORPUS / "regcmd"
    if not directory.is_dir():
        raise FileNotFoundError(
            f"vendor corpus not found at {directory.resolve()}: the vendor-stream tests need "
            f"shared/docs/vendor-corpus/regcmd next to the repository (tests/shared_data.py)")
    return directory


def load_listing(case: str) -> Listing:
    import json

    path = next(corpus_dir().glob(f"{case}*.txt"))
    text = path.read_text()
    tasks: list[dict] = []
    current = None
    for line in text.splitlines():
        header = re.match(r"=== TASK (\d+) \(chain (\d+)\)", line)
        if header:
            current = {"chain": int(header.group(2)), "writes": [], "mask": None}
            tasks.append(current)
            continue
        word = re.match(r"\s*(\d+) ([0-9a-f]{16}) ", line)
        if word and current is not None:
            decoded = decode_word(int(word.group(2), 16), REGMAP)
            if decoded.kind is WordKind.OP_ENABLE:
                current["mask"] = decoded.value
            elif decoded.kind is WordKind.WRITE and "TAIL" not in line:
                current["writes"].append(RegisterWrite(decoded.block, decoded.register, decoded.value))
    chain0 = [Task(tuple(t["writes"]), t["mask"]) for t in tasks if t["chain"] == 0]
    tensors = {}
    for match in re.finditer(r"^#  T\d+\s+\S.*?\s(\S+)\s+shape=(\S+) native=(\S+) size=(\S+)", text, re.M):
        tensors[match.group(1)] = {"native": match.group(3), "size": match.group(4)}
    case_json = json.loads(re.search(r"^# case parameters: (\{.*\})$", text, re.M).group(1))
    lut = [int(v) for v in re.findall(r"LUT_ACCESS_DATA=(-?\d+)", text)]
    return Listing(path.stem, chain0, tensors, case_json, lut)


def relocate(tasks: list[Task], bases: list[dict[tuple[str, str], int]]) -> list[Task]:
    """Add a base address to the address registers each task writes (stored values are
    offsets relative to their tensor: vendor-corpus 4.4, rknn-relocation.md R1)."""
    out = []
    for task, table in zip(tasks, bases):
        writes = tuple(RegisterWrite(w.block, w.register,
                                     (w.value + table[(w.block, w.register)]) & 0xFFFFFFFF)
                       if (w.block, w.register) in table else w for w in task.writes)
        out.append(Task(writes, task.enable_mask))
    return out
