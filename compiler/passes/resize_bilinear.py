"""Resize linear (bilinear) by one whole factor s on H and W -> an edge-padded copy of the input
plus s*s depthwise 3x3 phase convs written interleaved into the output (LOWERING.md 19.1).

Output pixel ``s*i + r`` (per axis) of a linear Resize whose source coordinate is ``i + c_r``
(``c_r`` depends on the phase r only: half_pixel ``(2r + 1 - s) / 2s``, asymmetric ``r / s``, ...)
is ``(1 - f) x[j] + f x[j + 1]`` with ``j = i + floor(c_r)``, ``f = c_r - floor(c_r)``, the taps
clamped to the input as onnxruntime clamps the coordinate. On the input edge-padded by one pixel
(``xp[k] = x[clamp(k - 1)]``) that is a fixed 3-tap filter over ``xp[i .. i + 2]`` per phase, so
phase (ry, rx) is a depthwise 3x3 valid conv of the padded map whose kernel is the outer product
of the two filters (zeros in the unused taps), one conv per phase, each writing its pixels at
``(s*y + ry, s*x + rx)`` with the DPU's interleaved write (``Conv`` attr ``interleave``,
LOWERING.md 13). The weights are multiples of ``1 / D`` (D the filters' common denominator
squared: 16 for half_pixel x2, 9 for x3, 4 for asymmetric x2), stored in int8 as the integers ``w * D`` with scale ``1 / D``: exact, so the int8
result is the exact bilinear sum rounded once by the conv's requantization (input and output share
their quantization, quant/sharing.py).

align_corners maps ``o -> o (n-1) / (S-1)`` (S the output size). Where ``S - 1 = s (n-1)`` (20 ->
39 for s = 2) that is ``o / s``: phase r reads ``x[i]`` and ``x[i+1]`` with weights ``1 - r/s``
and ``r/s``, never past the edge, so the phase convs read the input itself (kernel 1 for phase 0,
2 for the others, per axis; no edge copy) and phase r writes ``ceil((S - r) / s)`` pixels
(``deconv_phases.CROPPED``). That is the vendor's form [V] (rknn-toolkit2 2.5.0, rk3588,
[1,16,20,20] -> 39 x 39: four depthwise convs of kernels 1x1, 2x1, 1x2, 2x2, no edge copy). Other
sizes (20 -> 40: ``o * 19/39``) repeat only every S - 1 pixels: a host step, as the vendor's
(its table runs that Resize on the CPU [V]); LOWERING.md 33.3.

A map wider than one interleaved write (8 surfaces, or W x channels > 8192) runs the phase convs
per channel group (``channel_group``), joined by a channel Concat.

``resize_on_npu`` is the partition's rule for Resize (nearest: the unpooling of lower_resize.py;
linear: this form), ``expand_resize_bilinear`` the build's expansion (layer_records).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..deconv_crop import phase_atoms_addressable  # RK356x atoms (LOWERING.md 40)
from ..deconv_phases import MAX_WDMA_CHANNELS, MAX_WDMA_LINES, MAX_WRITE_SURFACES
from npuemu.isa.errors import CompileError

from ..ir import Graph, Node, QuantParams, Tensor
from ..ops.resize import replication_factors, source_coordinates
from .constraints import Constraint, shape
from .context import PassContext

MAX_FACTOR = 8  # kept to the nearest unpooling's range; the form itself holds for any whole factor
INT8_WEIGHT_MAX = 127
#: channels the depthwise phase conv's DPU cube is allocated in: 32 int8 channels write CHANNEL 64
#: (the vendor's tasks 5-8 too: CHANNEL 63, ORIG_CHANNEL 31 [V]), 48 float16 ones CHANNEL 64
DEPTHWISE_PASS = {"int8": 64, "float16": 32}
#: the node attribute of the edge-padded copy (a ResizeLayer with ``edge_pad``, lower_resize.py)
EDGE_PAD = "edge_pad"


def phase_offset(mode: str, s: int, r: int) -> Fraction | None:
    """``c_r``: output ``s*i + r`` reads source coordinate ``i + c_r``; None where the mode has no
    per-phase offset (align_corners, tf_crop_and_resize)."""
    if mode in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric"):
        return Fraction(2 * r + 1 - s, 2 * s)  # half_pixel_symmetric: offset 0 for whole factors
    if mode == "asymmetric":
        return Fraction(r, s)
    if mode == "tf_half_pixel_for_nn":
        return Fraction(2 * r + 1, 2 * s)
    return None


def phase_filters(mode: str, s: int) -> list[list[Fraction]]:
    """[s][3]: phase r's weights on the edge-padded positions i, i + 1, i + 2 (= x[i-1], x[i], x[i+1])."""
    filters = []
    for r in range(s):
        c = phase_offset(mode, s, r)
        base = int(np.floor(c))
        f = c - base
        taps = [Fraction(0)] * 3
        taps[1 + base] += 1 - f
        if f:
            taps[2 + base] += f
        filters.append(taps)
    return filters


def weight_denominator(filters: list[list[Fraction]]) -> int:
    """D: every 2-D weight (a product of two taps) is a multiple of 1 / D."""
    d = 1
    for taps in filters:
        for tap in taps:
            d = np.lcm(d, tap.denominator)
    return int(d * d)


def phase_kernel(filters: list[list[Fraction]], ry: int, rx: int) -> list[list[Fraction]]:
    return [[a * b for b in filters[rx]] for a in filters[ry]]


def align_corners_factor(in_shape: tuple[int, ...], sizes: list[int]) -> tuple[int | None, str]:
    """(s, "") when align_corners output S - 1 = s (n - 1) on H and W with one s in 2..MAX_FACTOR."""
    (_, _, h, w) = in_shape
    if h < 2 or w < 2 or (sizes[2] - 1) % (h - 1) or (sizes[3] - 1) % (w - 1) \
            or (sizes[2] - 1) // (h - 1) != (sizes[3] - 1) // (w - 1):
        return None, (f"coordinate_transformation_mode align_corners: output {sizes[2:]} is not s x (n - 1) + 1 "
                      f"of input {[h, w]} with one whole s (source positions o (n-1)/(S-1) do not repeat)")
    s = (sizes[2] - 1) // (h - 1)
    if not 2 <= s <= MAX_FACTOR:
        return None, f"align_corners factor {s} is not 2..{MAX_FACTOR}"
    return s, ""


def align_corners_filters(s: int) -> list[list[Fraction]]:
    """[s] taps on x[i], x[i + 1] of align_corners phase r (source i + r/s): [1] for r = 0."""
    return [[Fraction(1)]] + [[1 - Fraction(r, s), Fraction(r, s)] for r in range(1, s)]


def bilinear_factor(attrs: dict, in_shape: tuple[int, ...]) -> tuple[int | None, str]:
    """(s, "") when this Resize is linear upsampling of H and W by one whole factor 2..MAX_FACTOR
    with a per-phase source offset that matches onnxruntime's float32 coordinates; else (None, why)."""
    if attrs["mode"] != "linear":
        return None, f"mode {attrs['mode']}"
    if attrs.get("antialias") or attrs.get("exclude_outside"):
        return None, "antialias / exclude_outside"
    sizes = list(attrs["sizes"])
    if len(in_shape) != 4 or sizes[:2] != list(in_shape[:2]):
        return None, f"resizes axes other than H and W ({list(in_shape)} -> {sizes})"
    (_, _, h, w), mode = in_shape, attrs["coordinate_transformation_mode"]
    if mode == "align_corners":
        s, reason = align_corners_factor(in_shape, sizes)
        return (s, reason) if s is None else _checked_coordinates(attrs, in_shape, s)
    if sizes[2] % h or sizes[3] % w or sizes[2] // h != sizes[3] // w:
        return None, f"output {sizes[2:]} is not one whole factor x input {[h, w]} on both axes"
    s = sizes[2] // h
    if not 2 <= s <= MAX_FACTOR:
        return None, f"factor {s} is not 2..{MAX_FACTOR}"
    if phase_offset(mode, s, 0) is None:
        return None, f"coordinate_transformation_mode {mode}: source positions do not repeat every {s} pixels"
    return _checked_coordinates(attrs, in_shape, s)


def _checked_coordinates(attrs: dict, in_shape: tuple[int, ...], s: int) -> tuple[int | None, str]:
    """(s, "") when onnxruntime's float32 source coordinates are the phase offsets of factor s."""
    mode = attrs["coordinate_transformation_mode"]
    for axis in (2, 3):
        size, out = in_shape[axis], int(attrs["sizes"][axis])
        got = source_coordinates(mode, size, out, attrs["scales"][axis]).astype(np.float64)
        o = np.arange(out)
        if mode == "align_corners":
            want = o / s
        else:
            want = o // s + np.array([float(phase_offset(mode, s, r)) for r in range(s)])[o % s]
        if np.max(np.abs(np.clip(got, 0, size - 1) - np.clip(want, 0, size - 1))) > 1e-5:
            return None, f"scale {attrs['scales'][axis]} on axis {axis} does not give the phase offsets of factor {s}"
    return s, ""


def channel_group(channels: int, width: int, c2: int, float16: bool) -> int:
    """Channels a phase conv writes (all of them, or whole groups that start on a C2 surface, each
    group its own convs: LOWERING.md 19.1); 0 where not even one pass of kernels fits. The
    interleaved write (section 13) writes at most MAX_WRITE_SURFACES surfaces (one SIZE_E group)
    and, in the vendor's WDMA split (LOWERING.md 54), ``width`` lines (at most MAX_WDMA_LINES) of
    rows x the channels the depthwise conv's DPU cube holds (whole passes of DEPTHWISE_PASS
    channels) within WDMA_SIZE_0.CHANNEL_WDMA: the lowering's row bands keep rows to that."""
    pass_kernels = DEPTHWISE_PASS["float16" if float16 else "int8"]
    if width > MAX_WDMA_LINES:
        return 0
    if -(-channels // c2) <= MAX_WRITE_SURFACES and -(-channels // pass_kernels) * pass_kernels <= MAX_WDMA_CHANNELS:
        return channels
    step = int(np.lcm(c2, pass_kernels))
    group = min(MAX_WRITE_SURFACES * c2, MAX_WDMA_CHANNELS) // step * step
    return group if group >= step else 0


def _bilinear_fits(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    s, reason = bilinear_factor(node.attrs, shape(graph, node.inputs[0]))
    if s is None:
        return reason
    channels, width = shape(graph, node.inputs[0])[1], shape(graph, node.inputs[0])[3]
    dtype = "float16" if ctx.element_bytes == 2 else "int8"
    if not phase_atoms_addressable(ctx.platform, dtype == "float16"):
        return (f"{ctx.platform.name}: its {dtype} atoms are {ctx.platform.c2(dtype) * ctx.element_bytes} bytes, and the "
                "edge copy and phase writes start at odd atoms while DST_BASE_ADDR must be 16-byte aligned "
                "(rknpu-isa.md 4)")
    if width < 2 or not channel_group(channels, width, ctx.platform.c2(dtype), dtype == "float16"):
        return (f"input width {width}: the interleaved phase write needs 2 <= width <= {MAX_WDMA_LINES} (WDMA lines)")
    filters = _filters(node.attrs["coordinate_transformation_mode"], s)
    biggest = _largest_int8_weight(filters)
    if ctx.element_bytes == 1 and biggest > INT8_WEIGHT_MAX:
        return f"factor {s}: the int8 phase weights (w x {weight_denominator(filters)}) reach {biggest} > 127"
    return None


def _filters(mode: str, s: int) -> list[list[Fraction]]:
    return align_corners_filters(s) if mode == "align_corners" else phase_filters(mode, s)


def _largest_int8_weight(filters: list[list[Fraction]]) -> int:
    """The largest stored int8 weight ``w * D`` (the largest tap squared)."""
    return int(max(tap for taps in filters for tap in taps) ** 2 * weight_denominator(filters))


@Constraint
def resize_on_npu(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Resize is nearest-neighbour upsampling of H and W by whole factors 1..8 in which output
    pixel (y, x) copies input pixel (y // fy, x // fx) - asymmetric + floor, half_pixel + round,
    ... (DPU unpooling) - or linear upsampling by one whole factor 2..8 on both axes whose source
    positions repeat every factor pixels (half_pixel, pytorch_half_pixel, asymmetric): an
    edge-padded copy and depthwise 3x3 phase convs written interleaved (LOWERING.md 19); or
    align_corners to s x (n - 1) + 1 on both axes: depthwise 1/2-tap phase convs (LOWERING.md 33.3)."""
    if node.attrs["mode"] == "linear":
        reason = _bilinear_fits(graph, node, ctx)
        return None if reason is None else f"linear: {reason}"
    factors, reason = replication_factors(node.attrs, shape(graph, node.inputs[0]))
    return None if factors is not None else reason


def expand_resize_bilinear(graph: Graph, node: Node, platform) -> tuple[list[Tensor], list[Node]] | None:
    """(new tensors, nodes) of an NPU linear Resize: the edge-padded copy (a Resize node with attr
    ``edge_pad``, built as a ResizeLayer), then per channel group (``channel_group``) the s*s
    phase Conv nodes - more than one group: each reads a ChannelSlice of the padded map and writes
    its own tensor, a channel Concat joins them (both by address where the build can, LOWERING.md
    10.1); None for any other node."""
    if node.op_type != "Resize" or node.target != "NPU" or node.attrs.get("mode") != "linear" or node.fused:
        return None
    x, y = node.inputs[0], node.outputs[0]
    source = graph.tensor(x)
    s, _ = bilinear_factor(node.attrs, source.shape)
    if s is None:
        return None
    _, channels, h, w = source.shape
    int8 = source.quant is not None and source.quant.dtype == "int8"
    group = channel_group(channels, w, platform.c2("int8" if int8 else "float16"), not int8)
    if node.attrs["coordinate_transformation_mode"] == "align_corners":
        return _expand_align_corners(graph, node, s, group, int8)
    padded = Tensor(f"{y}_edge", (1, channels, h + 2, w + 2), source.dtype, quant=source.quant)
    tensors, nodes = [padded], [Node(f"{node.name}_edge", "Resize", [x], [padded.name], {EDGE_PAD: 1}, [], "NPU")]
    parts = []
    for start in range(0, channels, group or channels):
        size = min(group or channels, channels - start)
        suffix = "" if size == channels else f"_g{start // group}"
        source_part, out_part = padded.name, y
        if suffix:
            source_part, out_part = f"{padded.name}{suffix}", f"{y}{suffix}"
            tensors += [Tensor(source_part, (1, size, h + 2, w + 2), source.dtype, quant=source.quant),
                        Tensor(out_part, (1, size, s * h, s * w), source.dtype, quant=graph.tensor(y).quant)]
            nodes.append(Node(f"{node.name}_edge{suffix}", "ChannelSlice", [padded.name], [source_part],
                              {"start": start, "size": size}, [], "NPU"))  # build_adapt.CHANNEL_SLICE
        _phase_convs(node, s, size, int8, source_part, out_part, suffix, tensors, nodes)
        parts.append(out_part)
    if len(parts) > 1:
        nodes.append(Node(f"{node.name}_concat", "Concat", parts, [y], {"axis": 1}, [], "NPU"))
    return tensors, nodes


def _expand_align_corners(graph: Graph, node: Node, s: int, group: int,
                          int8: bool) -> tuple[list[Tensor], list[Node]]:
    """align_corners to s (n - 1) + 1: per channel group the s*s phase convs read the input (a
    ChannelSlice of it where grouped) and write their pixels into the output; a Concat joins groups."""
    x, y = node.inputs[0], node.outputs[0]
    source, out_shape = graph.tensor(x), graph.tensor(y).shape
    _, channels, h, w = source.shape
    tensors, nodes, parts = [], [], []
    for start in range(0, channels, group or channels):
        size = min(group or channels, channels - start)
        suffix = "" if size == channels else f"_g{start // group}"
        source_part, out_part = x, y
        if suffix:
            source_part, out_part = f"{x}_{node.name}{suffix}", f"{y}{suffix}"
            tensors += [Tensor(source_part, (1, size, h, w), source.dtype, quant=source.quant),
                        Tensor(out_part, (1, size, *out_shape[2:]), source.dtype, quant=graph.tensor(y).quant)]
            nodes.append(Node(f"{node.name}_in{suffix}", "ChannelSlice", [x], [source_part],
                              {"start": start, "size": size}, [], "NPU"))  # build_adapt.CHANNEL_SLICE
        _corner_phase_convs(node, s, size, int8, source_part, out_part, suffix, tuple(out_shape[2:]), tensors, nodes)
        parts.append(out_part)
    if len(parts) > 1:
        nodes.append(Node(f"{node.name}_concat", "Concat", parts, [y], {"axis": 1}, [], "NPU"))
    return tensors, nodes


def _corner_phase_convs(node: Node, s: int, channels: int, int8: bool, source: str, out: str, suffix: str,
                        out_hw: tuple[int, int], tensors: list[Tensor], nodes: list[Node]) -> None:
    """Phase (ry, rx): a depthwise conv of kernel (1 or 2) x (1 or 2), the outer product of the two
    axes' taps, valid on the input, writing ceil((S - r) / s) pixels per axis (deconv_phases.CROPPED)."""
    filters = align_corners_filters(s)
    denominator = weight_denominator(filters)
    for ry in range(s):
        for rx in range(s):
            kernel = np.array([[float(a * b) for b in filters[rx]] for a in filters[ry]])
            data = np.broadcast_to(kernel, (channels, 1, *kernel.shape)).astype(np.float32)
            quant = QuantParams("int8", np.full(channels, 1.0 / denominator, np.float32),
                                np.zeros(channels, np.int32), 0) if int8 else QuantParams("float16", 1.0, 0)
            tensors.append(Tensor(f"{out}_phase{ry}{rx}_w", data.shape, "float32", data, quant))
            nodes.append(Node(f"{node.name}_phase{ry}{rx}{suffix}", "Conv", [source, tensors[-1].name], [out],
                              {"kernel_shape": list(kernel.shape), "strides": [1, 1], "pads": [0, 0, 0, 0],
                               "dilations": [1, 1], "group": channels, "interleave": [s, ry, rx, *out_hw]},
                              [], "NPU"))


def _phase_convs(node: Node, s: int, channels: int, int8: bool, source: str, out: str, suffix: str,
                 tensors: list[Tensor], nodes: list[Node]) -> None:
    """The s*s depthwise 3x3 phase convs of ``channels`` channels from ``source`` into ``out``."""
    filters = phase_filters(node.attrs["coordinate_transformation_mode"], s)
    denominator = weight_denominator(filters)
    if int8 and _largest_int8_weight(filters) > INT8_WEIGHT_MAX:  # a float16 build's int8 node (hybrid)
        raise CompileError(f"layer {node.name}: int8 bilinear x{s} needs phase weights up to "
                           f"{_largest_int8_weight(filters)} (w x {denominator}) > 127; build it in float16")
    for ry in range(s):
        for rx in range(s):
            kernel = np.array([[float(k) for k in row] for row in phase_kernel(filters, ry, rx)])
            data = np.broadcast_to(kernel, (channels, 1, 3, 3)).astype(np.float32)
            quant = QuantParams("int8", np.full(channels, 1.0 / denominator, np.float32),
                                np.zeros(channels, np.int32), 0) if int8 else QuantParams("float16", 1.0, 0)
            tensors.append(Tensor(f"{out}_phase{ry}{rx}_w", data.shape, "float32", data, quant))
            nodes.append(Node(f"{node.name}_phase{ry}{rx}{suffix}", "Conv", [source, tensors[-1].name], [out],
                              {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1],
                               "group": channels, "interleave": [s, ry, rx]}, [], "NPU"))


__all__ = ["EDGE_PAD", "bilinear_factor", "channel_group", "expand_resize_bilinear", "phase_filters", "phase_kernel",
           "resize_on_npu", "weight_denominator"]
