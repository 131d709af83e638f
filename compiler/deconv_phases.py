"""A transposed convolution as one ordinary convolution of its stride phases.

Output pixel ``s*q + r`` (per axis; stride s, phase r < s) of the uncropped ConvTranspose output
only sees the kernel taps ``r, r + s, r + 2s, ...``: it is ``sum_m x[q - m] * W[r + s*m]``, a
correlation of the input with the phase's sub-kernel reversed. So all s*s phases are one conv
with ``s*s*C_out`` output channels, kernel ``kp = ceil(k / s)``, stride 1, padded ``kp - 1``
before (less the whole phase rows the pads crop) and after as far as the crop needs, followed by
DepthToSpace (blocksize s, mode CRD:
channel ``(co*s + ry)*s + rx`` goes to output pixel ``(s*qy + ry, s*qx + rx)`` of channel co) and
a crop of the ConvTranspose's pads. The conv runs on the NPU with the layer's bias, activation and
quantization; DepthToSpace and the crop move bytes only (host steps, build_adapt). With kernel =
stride this is the 1x1 conv of the DBNet upsampling heads and nothing is cropped. Where nothing is
cropped the DepthToSpace is not needed: the s*s phases run as separate convs that write their
pixels interleaved (``interleaved_write`` below, LOWERING.md 13), a 1x1 phase conv wider than the
WDMA's line count in column chunks (``interleave_chunks``, LOWERING.md 28 and 54).

Used by the partition (passes/constraints.py: does the phase conv fit the CNA?) and by the build
(build_adapt.split_conv_transpose); the arithmetic is the ONNX definition (compiler/ops/conv.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError


@dataclass(frozen=True)
class PhaseConv:
    stride: int                           # s (both axes)
    kernel: tuple[int, int]               # kp per axis
    pads: tuple[int, int, int, int]       # top, left, bottom, right of the phase conv
    out_hw: tuple[int, int]               # the phase conv's output (per phase)
    crop: tuple[int, int, int, int]       # start y, start x, height, width in the s*out_hw image

    @property
    def cropped(self) -> bool:
        s = self.stride
        return self.crop != (0, 0, s * self.out_hw[0], s * self.out_hw[1])


def phase_conv(kernel, strides, pads, output_padding, in_hw) -> PhaseConv | None:
    """The phase conv of a 2-D ConvTranspose (canonical attributes: pads top, left, bottom,
    right), or None where the form has none: unequal strides (DepthToSpace has one blocksize),
    negative pads."""
    if len(kernel) != 2 or strides[0] != strides[1] or min(pads) < 0:
        return None
    s = int(strides[0])
    taps, before, after, size, crop = [], [], [], [], []
    for axis in range(2):
        k, n, pad_begin, pad_end = int(kernel[axis]), int(in_hw[axis]), int(pads[axis]), int(pads[axis + 2])
        kp = -(-k // s)
        end = s * (n - 1) + int(output_padding[axis]) + k - pad_end  # crop end in the uncropped output
        if end <= pad_begin:
            return None
        # whole phase rows the crop drops at the start are not computed: fewer pads before
        drop = min(pad_begin // s, kp - 1)
        # phase-conv output rows: what the crop needs, at least n - drop (no negative pad after)
        rows = max(n, -(-end // s)) - drop
        taps.append(kp)
        before.append(kp - 1 - drop)
        after.append(rows - n + drop)
        size.append(rows)
        crop.append((pad_begin - s * drop, end - pad_begin))
    return PhaseConv(s, (taps[0], taps[1]), (before[0], before[1], after[0], after[1]), (size[0], size[1]),
                     (crop[0][0], crop[1][0], crop[0][1], crop[1][1]))


def phase_weights(weights: np.ndarray, phases: PhaseConv) -> np.ndarray:
    """ConvTranspose weights [C_in, C_out, kh, kw] as the phase conv's [s*s*C_out, C_in, kph, kpw]:
    channel (co*s + ry)*s + rx, tap (ty, tx) = W[ci, co, ry + s*(kph-1-ty), rx + s*(kpw-1-tx)],
    zero where that index passes the kernel."""
    c_in, c_out, kh, kw = weights.shape
    s, (kph, kpw) = phases.stride, phases.kernel
    out = np.zeros((c_out, s, s, c_in, kph, kpw), weights.dtype)
    for ry in range(s):
        for rx in range(s):
            for ty in range(kph):
                for tx in range(kpw):
                    y, x = ry + s * (kph - 1 - ty), rx + s * (kpw - 1 - tx)
                    if y < kh and x < kw:
                        out[:, ry, rx, :, ty, tx] = weights[:, :, y, x].T
    return out.reshape(c_out * s * s, c_in, kph, kpw)


# --- the interleaved write: each phase conv straight into the ConvTranspose's output -------------
#
# Instead of one conv of s*s*C_out channels and a host DepthToSpace, s*s convs of C_out channels
# (phase (ry, rx): the channels (co*s + ry)*s + rx of phase_weights) each write their pixels at
# (s*y + ry, s*x + rx) of the output with the DPU's interleaved write (emulator/REGISTER_SEMANTICS
# 3.3.1, the vendor's Resize bilinear phase convs): DST_BASE_ADDR + (ry*s*W + rx) atoms, pixel step
# s atoms (NOTCH_ADDR_0 = s - 1), line step s output rows (SURFACE_ADD). The conv and its
# arithmetic are unchanged; only the addresses move (LOWERING.md 13).

MAX_WRITE_SURFACES = 8  # BS_OW_CFG SIZE_E is 3 bits: SURFACE_ADD is the line step, so one group only
#: The interleaved write's WDMA sizes are the vendor's split (REGISTER_SEMANTICS.md 52, 53 [V]): W "lines"
#: (WDMA_SIZE_1.HEIGHT_WDMA, 13 bits) of H x the allocated channels (WDMA_SIZE_0.CHANNEL_WDMA, 13 bits).
#: So a phase is at most MAX_WDMA_LINES wide (wider: column chunks) and a task writes at most
#: MAX_WDMA_CHANNELS // allocated rows (``interleave_rows``: the lowering's row bands shorten to it).
MAX_WDMA_CHANNELS = 8192
MAX_WDMA_LINES = 8192


def interleave_rows(allocated: int) -> int:
    """The most output rows one interleaved task of ``allocated`` channels (the DPU cube's) writes:
    CHANNEL_WDMA + 1 = rows x allocated channels fits its 13 bits."""
    return MAX_WDMA_CHANNELS // allocated


def interleave_fits(width: int, channels: int, pass_kernels: int) -> bool:
    """Whether a phase conv ``width`` pixels wide with ``channels`` outputs, allocated in passes
    of ``pass_kernels`` (32 int8, 16 float16 on rk3588; the largest of the chips), can write
    interleaved: one SIZE_E group of surfaces, at most MAX_WDMA_LINES columns, and one row of
    allocated channels within CHANNEL_WDMA (taller tasks are cut into row bands at lowering)."""
    allocated = -(-channels // pass_kernels) * pass_kernels
    return -(-channels // 4) <= MAX_WRITE_SURFACES and width <= MAX_WDMA_LINES and allocated <= MAX_WDMA_CHANNELS


def interleave_chunks(width: int, channels: int, pass_kernels: int) -> tuple[tuple[int, int], ...] | None:
    """The (first column, width) chunks a 1x1 phase conv ``width`` pixels wide is written in, each
    at most MAX_WDMA_LINES columns (the vendor's split: a column is a WDMA line), as few and as even
    as can be and each at least 2 pixels wide; None where it cannot write interleaved (more
    surfaces than one group, or a phase 1 pixel wide). One chunk is the whole phase (LOWERING.md
    13, 28 and 54)."""
    allocated = -(-channels // pass_kernels) * pass_kernels
    if -(-channels // 4) > MAX_WRITE_SURFACES or width < 2 or allocated > MAX_WDMA_CHANNELS:
        return None
    count = -(-width // MAX_WDMA_LINES)
    bounds = [width * i // count for i in range(count + 1)]
    return tuple((start, end - start) for start, end in zip(bounds, bounds[1:]))


#: ``interleave`` of a phase conv written as a part of its phase: (s, ry, rx, first column, width,
#: full width, first channel, full channels). A column chunk (width < full width, 1x1 phase convs)
#: reads columns [first, first + width) of its input; a channel group writes its output channels
#: from ``first channel`` on, a whole number of 32-channel groups into the output (LOWERING.md 28)
EXTENDED = 8
#: ``interleave`` = (s, ry, rx, out_h, out_w): a phase of an output that is not s x the phase
#: (bilinear align_corners to s*(n-1)+1, LOWERING.md 33.3): phase rx is ceil((out_w - rx) / s) wide
CROPPED = 5
#: ``interleave`` = (s, ry, rx, out_h, out_w, first channel, full channels): a channel group of such
#: a phase (a cropping ConvTranspose of more than 32 output channels, deconv_crop.py, LOWERING.md 40)
CROPPED_GROUP = 7
#: (s, ry, rx, out_h, out_w, first channel, full channels, first column, width, input first column,
#: input width, input full width): a column chunk of such a phase (its line past the WDMA channel
#: field): it writes phase columns [first, first + width) and reads its own input window, halo
#: columns included (deconv_crop.py, LOWERING.md 40)
CROPPED_CHUNK = 12
#: output channels of one channel group: 8 surfaces of the smallest C2 (RK356x fp16: 4), and a
#: whole number of passes and surfaces on every chip
GROUP_CHANNELS = MAX_WRITE_SURFACES * 4


def channel_groups(channels: int) -> tuple[tuple[int, int], ...]:
    """(first channel, count) of the channel groups a phase conv of ``channels`` outputs is written in."""
    return tuple((start, min(GROUP_CHANNELS, channels - start)) for start in range(0, channels, GROUP_CHANNELS))


def written_shape(shape: tuple[int, int, int], interleave: tuple[int, ...]) -> tuple[int, int, int]:
    """The output tensor's (C, H, W) for a conv of output ``shape`` written as phase ``interleave``."""
    if not interleave:
        return shape
    s = interleave[0]
    if len(interleave) == EXTENDED:
        return interleave[7], s * shape[1], s * interleave[5]
    if len(interleave) == CROPPED:
        return shape[0], interleave[3], interleave[4]
    if len(interleave) in (CROPPED_GROUP, CROPPED_CHUNK):
        return interleave[6], interleave[3], interleave[4]
    return shape[0], s * shape[1], s * shape[2]


def first_channel(interleave: tuple[int, ...]) -> int:
    """The output channel a phase conv's channel 0 is written to (0 unless a channel group)."""
    if len(interleave) in (CROPPED_GROUP, CROPPED_CHUNK):
        return interleave[5]
    return interleave[6] if len(interleave) == EXTENDED else 0


def input_window(interleave: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(first column, chunk width, full input width) of a column-chunk phase conv's input, else None."""
    if len(interleave) == CROPPED_CHUNK:
        return None if interleave[10] == interleave[11] else tuple(interleave[9:12])
    if len(interleave) != EXTENDED or interleave[4] == interleave[5]:
        return None
    return tuple(interleave[3:6])


def window_shape(shape: tuple[int, int, int], interleave: tuple[int, ...]) -> tuple[int, int, int]:
    """The conv's own input (C, H, W) given its input tensor's ``shape``: the chunk's columns."""
    window = input_window(interleave)
    return shape if window is None else (shape[0], shape[1], window[1])


def read_shape(shape: tuple[int, int, int], interleave: tuple[int, ...]) -> tuple[int, int, int]:
    """The input tensor's (C, H, W) for a conv whose own input (a chunk's window) is ``shape``."""
    window = input_window(interleave)
    return shape if window is None else (shape[0], shape[1], window[2])


def interleaved_write(interleave: tuple[int, ...], out_width: int, c2: int, channels: int, per_pass: int,
                      layer: str, residual: bool = False) -> tuple[int, int, int, tuple[int, int]]:
    """(phase width, SIZE_E + 1, the phase's first atom, (pixel step, line step) in atoms) for phase
    ``interleave`` = (s, ry, rx) written into an output ``out_width`` pixels wide; ``channels`` the
    surfaces' channels the DPU writes. A part (s, ry, rx, first, width, ...: EXTENDED) writes its
    width from phase column ``first``."""
    s, ry, rx = interleave[:3]
    width = out_width // s
    if len(interleave) in (CROPPED, CROPPED_GROUP):  # the phase's own columns of an output not s x the phase wide
        width = -(-(out_width - rx) // s)
    if len(interleave) == EXTENDED:  # a part of the phase: its own width, from its first column
        width = interleave[4]
        rx += s * interleave[3]
    if len(interleave) == CROPPED_CHUNK:  # a column chunk of a cropped phase
        width = interleave[8]
        rx += s * interleave[7]
    surfaces = -(-channels // c2)
    if width < 2 or residual or surfaces > MAX_WRITE_SURFACES:
        # width 1: the WDMA sizes would read as a plain write (REGISTER_SEMANTICS 3.3.1)
        raise CompileError(f"layer {layer}: interleaved phase write needs a phase at least 2 pixels wide, no "
                           f"residual and at most {MAX_WRITE_SURFACES} surfaces (got width {width}, "
                           f"{surfaces} surfaces{', a residual' if residual else ''})")
    return width, max(per_pass, surfaces), ry * out_width + rx, (s, s * out_width)
