"""A ConvTranspose whose pads crop, as one conv per stride phase of the *cropped* output.

Per axis (stride s, kernel k, pads p_begin / p_end, output padding op, input n): the cropped output
is ``L = s*(n-1) + op + k - p_begin - p_end`` long and its pixel ``o = s*q + r`` is pixel ``o + p_begin``
of the uncropped one. With ``u = r + p_begin``, ``a = u mod s`` (the uncropped phase) and ``b = u div s``
(its row shift), ``y[s*q + r] = sum_m x[q + b - m] * W[a + s*m]`` over the ``ka = ceil((k - a) / s)``
taps of phase a. As a correlation that is a stride-1 conv with kernel ``Kr[j] = W[a + s*(P + b - j)]``
(zero outside 0..ka-1) and ``P = ka - 1 - b`` pads before; it computes exactly the
``ceil((L - r) / s)`` rows of phase r that the crop keeps, so no row is computed and thrown away.
A negative P (a crop of more than a phase's taps) becomes leading zero taps, a negative pad after
trailing ones; a phase with no taps at all (a < k fails: output padding beyond the kernel) is a
1-tap zero kernel, its bias only.

Phase (ry, rx) writes its pixels at ``(s*q + ry, s*q' + rx)`` of the cropped output with the DPU's
interleaved write in the form whose phases need not be equal (``deconv_phases.CROPPED``: width
``ceil((W - rx) / s)``, REGISTER_SEMANTICS 3.3.1), in 32-channel groups (``CROPPED_GROUP``) where
C_out > 32 and in column chunks reading their own input windows (``CROPPED_CHUNK``) where a phase
is wider than the WDMA's line count (deconv_phases.MAX_WDMA_LINES). The k=4 s=2 p=1 form of U-Net/FPN decoders is four 2x2 convs (pads 1/0 before per
phase), k=3 s=2 p=1 op=1 a 1x1, two 1x2/2x1 and a 2x2 conv: the MACs of the ConvTranspose itself.

The vendor (rknn-toolkit2 2.5.0, rk3588, int8, [1,16,16,16] -> 8 channels, k4s2p1 and k3s2p1op1)
runs both as one task in the CNA's own deconvolution mode [V]: CONV_CON1.DECONV 1, CONV_CON3
DECONV_X/Y_STRIDE 1 (s - 1), PAD_CON0 k - 1 - p (2 and 1), the whole kernel (WEIGHT_SIZE2 4x4 /
3x3), the 32 x 32 output written plainly. The emulator refuses DECONV (REGISTER_SEMANTICS 2,
its zero insertion and tap order are not documented or derived), so this form stays on the
modelled interleaved write, whose numerics are those of an ordinary conv (LOWERING.md 40).

Used by the build (build_adapt.split_conv_transpose) for the NPU ConvTransposes whose phases crop.
"""

from __future__ import annotations

import numpy as np

from .deconv_phases import GROUP_CHANNELS, MAX_WDMA_CHANNELS, MAX_WDMA_LINES, PhaseConv, channel_groups
from .ir import FusedOp, Graph, Node, QuantParams, Tensor

#: attr of a channel-group phase Conv (build_adapt.SCALE_MAX): the layer's largest weight scale
SCALE_MAX = "requant_scale_max"


def crop_axis(k: int, s: int, pad_begin: int, pad_end: int, out_pad: int, n: int, r: int):
    """(tap indices of W per conv tap, -1 a zero tap; pad before; pad after; rows) of output phase r
    along one axis, or None where the phase has no row."""
    length = s * (n - 1) + out_pad + k - pad_begin - pad_end
    rows = -(-(length - r) // s)
    if rows < 1:
        return None
    a, b = (r + pad_begin) % s, (r + pad_begin) // s
    taps = max(0, -(-(k - a) // s))
    before = taps - 1 - b
    index = [a + s * (before + b - j) if 0 <= before + b - j < taps else -1 for j in range(max(taps, 1))]
    if before < 0:  # the phase starts past its first taps' input rows: leading zero taps
        index, before = [-1] * -before + index, 0
    after = rows - 1 - n + len(index) - before
    if after < 0:  # the last input rows are not needed: trailing zero taps
        index, after = index + [-1] * -after, 0
    return index, before, after, rows


def crop_phases(kernel, s: int, pads, output_padding, in_hw):
    """{(ry, rx): (tap index rows, tap index columns, pads t/l/b/r, (rows, columns))} of every
    phase, or None where a phase has no pixel."""
    axes = [[crop_axis(int(kernel[i]), s, int(pads[i]), int(pads[i + 2]), int(output_padding[i]), int(in_hw[i]), r)
             for r in range(s)] for i in range(2)]
    if any(part is None for axis in axes for part in axis):
        return None
    return {(ry, rx): (ya[0], xa[0], (ya[1], xa[1], ya[2], xa[2]), (ya[3], xa[3]))
            for ry, ya in enumerate(axes[0]) for rx, xa in enumerate(axes[1])}


def crop_limit(phases: dict, c_out: int, pass_kernels: int, max_kernel: int, max_pad: int) -> str | None:
    """Why the cropped phases cannot all write interleaved (None: they can). ``max_kernel`` and
    ``max_pad``: the stacked phase conv's kernel and largest pad, which the partition checked
    against the chip's CNA fields (constraints.deconv_lowered); a phase conv also pads less than
    its kernel (no row of padding only)."""
    for (ry, rx), (ty, tx, pads, (rows, cols)) in phases.items():
        if cols < 2:
            return f"phase ({ry}, {rx}) is {cols} pixel wide (the interleaved write needs 2)"
        if column_chunks(cols, c_out, pass_kernels) is None:
            return f"phase ({ry}, {rx}): {c_out} channels exceed the WDMA channel field in one row"
        if max(len(ty), len(tx)) > max_kernel or max(pads) > max_pad \
                or pads[0] >= len(ty) or pads[2] >= len(ty) or pads[1] >= len(tx) or pads[3] >= len(tx):
            return f"phase ({ry}, {rx}) conv kernel {len(ty)}x{len(tx)} with pads {list(pads)}"
    return None


#: DPU DST_BASE_ADDR holds bytes [31:4]: 16-byte aligned (REGISTER_SEMANTICS 3.3 [S], the
#: emulator's DPU refuses other addresses)
DST_ALIGN = 16


def phase_atoms_addressable(platform, float16: bool) -> bool:
    """Whether every phase's first atom (``ry*W + rx`` atoms on) is a DST_BASE_ADDR: the chip's
    atom is 16 bytes or more. RK356x (8-byte atoms: C2 8 int8 / 4 fp16) cannot start a phase at an
    odd atom, so its cropping ConvTransposes keep the stacked conv and host moves; None (a caller
    that does not say the chip): not addressable."""
    if platform is None:
        return False
    dtype = "float16" if float16 else "int8"
    return platform.c2(dtype) * (2 if float16 else 1) >= DST_ALIGN


def column_chunks(cols: int, c_out: int, pass_kernels: int) -> tuple[tuple[int, int], ...] | None:
    """(first column, width) of the chunks a phase ``cols`` wide is written in: one where its
    columns fit the WDMA's line count (the vendor's split, deconv_phases.MAX_WDMA_LINES), else as
    few and as even as can be, each at least 2 wide (deconv_phases.interleave_chunks' rule), or None."""
    allocated = -(-min(c_out, GROUP_CHANNELS) // pass_kernels) * pass_kernels
    if cols < 2 or allocated > MAX_WDMA_CHANNELS:
        return None
    count = -(-cols // MAX_WDMA_LINES)
    bounds = [cols * i // count for i in range(count + 1)]
    return tuple((start, end - start) for start, end in zip(bounds, bounds[1:]))


def chunk_window(first: int, width: int, taps: int, pad_left: int, n: int) -> tuple[int, int, int, int]:
    """(first input column, input width, pad left, pad right) of the chunk writing phase columns
    [first, first + width) of a conv of ``taps`` columns padded ``pad_left`` on an input ``n`` wide:
    its own window with the halo columns its taps reach, padded only where it meets the edge."""
    start, end = first - pad_left, first + width - 1 - pad_left + taps - 1  # input columns read
    in_first, in_last = max(0, start), min(n - 1, end)
    return in_first, in_last - in_first + 1, in_first - start, end - in_last


def tap_weights(weights: np.ndarray, taps_y: list[int], taps_x: list[int]) -> np.ndarray:
    """ConvTranspose weights [C_in, C_out, kh, kw] as the phase conv's [C_out, C_in, len(ty), len(tx)]."""
    c_in, c_out = weights.shape[:2]
    out = np.zeros((c_out, c_in, len(taps_y), len(taps_x)), weights.dtype)
    for j, y in enumerate(taps_y):
        for i, x in enumerate(taps_x):
            if y >= 0 and x >= 0:
                out[:, :, j, i] = weights[:, :, y, x].T
    return out


def _channels(tensor: Tensor, name: str, pick: slice, data: np.ndarray | None = None) -> Tensor:
    """``tensor``'s output channels ``pick`` (axis 0 of ``data``; a per-channel quantization cut too)."""
    quant = tensor.quant
    if quant is not None and quant.per_channel:
        quant = QuantParams(quant.dtype, np.asarray(quant.scale).reshape(-1)[pick],
                            np.asarray(quant.zero_point).reshape(-1)[pick], 0)
    if data is None:
        data = np.asarray(tensor.data)
        data = data.reshape(-1)[pick].reshape((-1,) + tuple(data.shape[1:])) if data.size > 1 else data
    else:
        data = data[pick]
    return Tensor(name, tuple(data.shape), tensor.dtype, np.asarray(data), quant)


def cropped_phase_convs(graph: Graph, node: Node, stacked: PhaseConv,
                        platform) -> tuple[list[Tensor], list[Node]] | None:
    """(new constants, the phase Conv nodes writing the cropped output interleaved) of an NPU
    ConvTranspose whose pads crop (its fused parts: activations and per-channel bias Adds only,
    as build_adapt.split_conv_transpose admits; so no LUT split applies), else None (a form
    ``crop_limit`` refuses, or a chip whose atoms the phase write cannot address: the stacked
    conv ``stacked`` and the host moves stay)."""
    attrs, weight = node.attrs, graph.tensor(node.inputs[1])
    s = int(attrs["strides"][0])
    kernel = [int(v) for v in attrs.get("kernel_shape", weight.shape[2:])]
    in_shape = graph.tensor(node.inputs[0]).shape
    phases = crop_phases(kernel, s, attrs.get("pads", [0] * 4), attrs.get("output_padding", [0, 0]), in_shape[2:])
    c_out, quant = int(weight.shape[1]), graph.tensor(node.outputs[0]).quant
    # surfaces counted in the smallest atom lanes of any chip, as build_adapt._interleaved_phases
    pass_kernels = 16 if quant is not None and quant.dtype == "float16" else 32
    if not phase_atoms_addressable(platform, pass_kernels == 16):
        return None
    if phases is None or crop_limit(phases, c_out if s > 1 else 1, pass_kernels, max(stacked.kernel),
                                    max(stacked.pads)) is not None:
        return None
    groups = channel_groups(c_out) if s > 1 else ((0, c_out),)  # stride 1: one plain conv
    tensors, nodes = [], []
    for (ry, rx), (taps_y, taps_x, pads, (_, cols)) in phases.items():
        data = tap_weights(np.asarray(weight.data), taps_y, taps_x)
        chunks = column_chunks(cols, c_out, pass_kernels) if s > 1 else ((0, cols),)
        for g, (start, count) in enumerate(groups):
            suffix = f"_p{ry}{rx}" + (f"g{g}" if len(groups) > 1 else "")
            inputs, parts = _group_operands(graph, node, data, slice(start, start + count), suffix, tensors)
            name = node.name if s == 1 else f"{node.name}_phase{ry}{rx}" + (f"_g{g}" if len(groups) > 1 else "")
            for index, (first, width) in enumerate(chunks):
                conv_attrs = {"kernel_shape": [len(taps_y), len(taps_x)], "strides": [1, 1], "pads": list(pads),
                              "dilations": [1, 1], "group": 1}
                if s > 1:
                    conv_attrs["interleave"] = _interleave(graph, node, (s, ry, rx), (start, c_out, len(groups)),
                                                           (first, width, len(chunks)), len(taps_x), conv_attrs)
                if len(groups) > 1 and weight.quant is not None and weight.quant.dtype == "int8":
                    conv_attrs[SCALE_MAX] = float(np.max(np.asarray(weight.quant.scale, np.float64)))
                nodes.append(Node(name + (f"_c{index}" if len(chunks) > 1 else ""), "Conv", inputs,
                                  [node.outputs[0]], conv_attrs, list(parts), "NPU"))
    return tensors, nodes


def _group_operands(graph: Graph, node: Node, data: np.ndarray, pick: slice, suffix: str,
                    tensors: list[Tensor]) -> tuple[list[str], list[FusedOp]]:
    """A phase group's inputs (weights ``data`` cut to ``pick``, the bias) and fused parts (bias Adds cut)."""
    out = node.outputs[0]
    tensors.append(_channels(graph.tensor(node.inputs[1]), f"{out}_crop_w{suffix}", pick, data))
    inputs = [node.inputs[0], tensors[-1].name]
    if len(node.inputs) > 2 and node.inputs[2]:
        tensors.append(_channels(graph.tensor(node.inputs[2]), f"{out}_crop_b{suffix}", pick))
        inputs.append(tensors[-1].name)
    parts = []
    for part in node.fused:
        if part.inputs:  # a bias Add (split_conv_transpose admits no other operand)
            tensors.append(_channels(graph.tensor(part.inputs[0]), f"{part.inputs[0]}_crop{suffix}", pick))
            part = FusedOp(part.op_type, dict(part.attrs), [tensors[-1].name], part.carry_index, part.source, part.tag)
        parts.append(part)
    return inputs, parts


def _interleave(graph: Graph, node: Node, phase: tuple[int, int, int], group: tuple[int, int, int],
                chunk: tuple[int, int, int], taps: int, conv_attrs: dict) -> list[int]:
    """The ``interleave`` attr of one phase conv (deconv_phases CROPPED, CROPPED_GROUP or
    CROPPED_CHUNK); a chunk also gets its own left/right pads in ``conv_attrs``."""
    start, c_out, groups = group
    first, width, chunks = chunk
    out_hw = [int(v) for v in graph.tensor(node.outputs[0]).shape[2:]]
    if chunks == 1:
        return [*phase, *out_hw] + ([start, c_out] if groups > 1 else [])
    n = int(graph.tensor(node.inputs[0]).shape[3])
    pads = conv_attrs["pads"]
    in_first, in_width, pads[1], pads[3] = chunk_window(first, width, taps, pads[1], n)
    return [*phase, *out_hw, start, c_out, first, width, in_first, in_width, n]


__all__ = ["DST_ALIGN", "chunk_window", "column_chunks", "crop_axis", "crop_limit", "crop_phases", "cropped_phase_convs", "phase_atoms_addressable", "tap_weights"]
