"""Constraints that explain themselves (the Vela way): each NPU support check is a small
function whose docstring states the rule - with ``{limit}`` fields filled from the target's
:class:`NpuLimits` - and which returns None when the node meets it or a detail saying how
it does not. The partition shows ``rule: detail`` for a layer left on the CPU; the generated
``compiler/SUPPORT.md`` lists the rules per op.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npuemu.isa.container_views import tensor_cube

from ..deconv_phases import phase_conv
from ..ir import Graph, Node
from .cbuf_fit import cbuf_fit, conv_geometry
from .context import PassContext
from .fusion_rules import fusable_activations, part_kind
from .match import BIAS_TAG, const, per_channel

Check = Callable[[Graph, Node, PassContext], "str | None"]


@dataclass(frozen=True)
class Constraint:
    check: Check

    @property
    def name(self) -> str:
        return self.check.__name__

    @property
    def rule(self) -> str:
        """The docstring, on one line, with its ``{limit}`` fields unfilled."""
        return " ".join(inspect.getdoc(self.check).split())

    def describe(self, ctx: PassContext | None = None) -> str:
        return self.rule.format(**ctx.limits.as_dict()) if ctx is not None else self.rule

    def __call__(self, graph: Graph, node: Node, ctx: PassContext) -> str | None:
        return self.check(graph, node, ctx)


def shape(graph: Graph, name: str) -> tuple[int, ...]:
    return graph.tensors[name].shape


# ---- every NPU layer -------------------------------------------------------------------------

@Constraint
def float_tensors(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Every tensor the layer reads or writes is float32 (quantized or fp16 on the NPU)."""
    for name in [*node.all_inputs, *node.outputs]:
        if graph.tensors[name].dtype != "float32":
            return f"'{name}' is {graph.tensors[name].dtype}"
    return None


@Constraint
def feature_maps_4d(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Feature maps are 4-D NCHW with batch N = 1 (the NPU runs one image per task chain)."""
    for name in [*node.inputs, *node.outputs]:
        if const(graph, name) is None and (len(shape(graph, name)) != 4 or shape(graph, name)[0] != 1):
            return f"'{name}' has shape {list(shape(graph, name))}"
    return None


def as_cube(dims: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(C, H, W) as the NPU lays the tensor out (isa.container_views.tensor_cube)."""
    return tensor_cube(dims)


@Constraint
def feature_maps_upto_4d(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Element-wise feature maps are 4-D NCHW with batch N = 1, or have fewer dimensions and are
    laid out as [1, C, H, W] with leading ones ([n] -> 1x1xn, [h, w] -> 1xhxw, [c, h, w] -> cxhxw)."""
    for name in [*node.inputs, *node.outputs]:
        if const(graph, name) is None and as_cube(shape(graph, name)) is None:
            return f"'{name}' has shape {list(shape(graph, name))}"
    return None


@Constraint
def cube_size(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Feature maps have at most {max_cube_channels} channels and are at most {max_cube_width} wide
    (DPU cube fields)."""
    for name in [*node.inputs, *node.outputs]:
        cube = as_cube(shape(graph, name))
        if const(graph, name) is None and cube is not None and (cube[0] > ctx.limits.max_cube_channels
                                                               or cube[2] > ctx.limits.max_cube_width):
            return f"'{name}' is {list(shape(graph, name))}"
    return None


# ---- convolutions ----------------------------------------------------------------------------

@Constraint
def constant_weights(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Weights and bias are constants."""
    variable = [name for name in node.inputs[1:] if const(graph, name) is None]
    return f"'{variable[0]}' is computed at run time" if variable else None


@Constraint
def conv_groups(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """A convolution is direct (group 1) or depthwise (group = input channels = output channels); other
    grouped convs have no NPU lowering."""
    group = node.attrs["group"]
    channels, out = shape(graph, node.inputs[0])[1], shape(graph, node.outputs[0])[1]
    if group == 1 or group == channels == out:
        return None
    return f"group {group} with {channels} input and {out} output channels"


@Constraint
def kernel_size(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Kernel height and width are at most {max_kernel} (CNA WEIGHT_SIZE2 width/height fields)."""
    kernel = node.attrs["kernel_shape"]
    return f"kernel {kernel}" if max(kernel) > ctx.limits.max_kernel else None


@Constraint
def conv_strides(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Strides are at most {max_stride} (CNA CONV_CON3 stride fields)."""
    strides = node.attrs["strides"]
    return f"strides {strides}" if max(strides) > ctx.limits.max_stride else None


@Constraint
def conv_dilations(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Dilations are at most {max_dilation} (CNA CONV_CON3 atrous fields)."""
    dilations = node.attrs["dilations"]
    return f"dilations {dilations}" if max(dilations) > ctx.limits.max_dilation else None


@Constraint
def conv_pads(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Pads are 0 to {max_pad} on every side (CNA PAD_CON0 fields)."""
    pads = node.attrs["pads"]
    return f"pads {pads}" if max(pads) > ctx.limits.max_pad or min(pads) < 0 else None


@Constraint
def conv_widths(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Input rows are at most {max_input_width} and output rows at most {max_output_width} pixels wide
    (CNA DATA_SIZE fields; H is split into tasks)."""
    width_in, width_out = shape(graph, node.inputs[0])[3], shape(graph, node.outputs[0])[3]
    if width_in > ctx.limits.max_input_width or width_out > ctx.limits.max_output_width:
        return f"input width {width_in}, output width {width_out}"
    return None


@Constraint
def conv_kernels(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """At most {max_kernels} output channels (CNA WEIGHT_SIZE2 kernels field)."""
    out = shape(graph, node.outputs[0])[1]
    return f"{out} output channels" if out > ctx.limits.max_kernels else None


@Constraint
def fits_cbuf(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """A direct conv's input and weights fit the CBUF ({cbuf_banks} banks of {cbuf_bank_bytes} bytes),
    split along H if need be; larger ones are split along input channels at optimization level 3."""
    if node.attrs["group"] != 1:
        return None  # depthwise convs are split by channel groups
    fits, detail = cbuf_fit(ctx.platform, conv_geometry(graph, node), ctx.element_bytes)
    return None if fits else detail


@Constraint
def fused_parts(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Fused parts are ones the DPU applies: a per-channel bias, an activation of the platform's fusion
    list (PRelu with a per-channel slope), a residual add of a same-shape tensor."""
    out = shape(graph, node.outputs[0])
    for part in node.fused:
        kind = part_kind(graph, part)
        if part.tag == BIAS_TAG or kind == "Add" and all(shape(graph, name) == out for name in part.inputs):
            continue
        if kind not in fusable_activations(ctx):
            return f"fused {part.op_type}"
        if part.op_type == "PRelu" and per_channel(const(graph, part.inputs[0]), out, 1) is None:
            return "PRelu slope is not per channel"
    return None


@Constraint
def deconv_form(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """A transposed conv runs as one conv of its stride phases (compiler/deconv_phases.py): group 1,
    dilation 1, equal strides (DepthToSpace has one blocksize), pads >= 0."""
    attrs = node.attrs
    if attrs["group"] != 1 or max(attrs["dilations"]) != 1:
        return f"group {attrs['group']}, dilations {attrs['dilations']}"
    if len(set(attrs["strides"])) != 1 or min(attrs["pads"]) < 0:
        return f"strides {attrs['strides']}, pads {attrs['pads']}"
    return None


@Constraint
def pool_values_only(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """The PPU writes the pooled values only; a MaxPool's Indices output (positions of the maxima)
    runs on the host."""
    return "the Indices output is used" if len(node.outputs) > 1 and node.outputs[1] else None


@Constraint
def deconv_lowered(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """The phase conv fits the CNA: kernel ceil(k/s) at most {max_kernel}, pads at most {max_pad},
    s*s*C_out kernels at most {max_kernels} (build_adapt.split_conv_transpose: the phases write
    interleaved into the output, where the pads crop each computing only the rows kept
    (deconv_crop.py); a cropped phase 1 pixel wide, or a chip with 8-byte atoms (RK356x), keeps
    one stacked phase conv plus host DepthToSpace and crop)."""
    attrs = node.attrs
    phases = phase_conv(attrs["kernel_shape"], attrs["strides"], attrs["pads"], attrs["output_padding"],
                        shape(graph, node.inputs[0])[2:])
    if phases is None:
        return f"kernel {attrs['kernel_shape']}, strides {attrs['strides']}, pads {attrs['pads']}: no output"
    kernels = phases.stride ** 2 * shape(graph, node.inputs[1])[1]
    if max(phases.kernel) > ctx.limits.max_kernel or max(phases.pads) > ctx.limits.max_pad \
            or kernels > ctx.limits.max_kernels:
        return f"phase conv kernel {list(phases.kernel)}, pads {list(phases.pads)}, {kernels} kernels"
    return None


@Constraint
def one_row(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """A fully connected layer has one row (M = 1) and runs as a 1x1 conv; over T rows of a [1, T, C]
    tensor it is a 1x1 conv over T pixels inside a token region (passes/tokens_as_channels, not
    formed where its Transpose edges would add host steps or host time, or the rows are not tokens)."""
    rows = int(np.prod(shape(graph, node.inputs[0])[:node.attrs["axis"]]))
    return f"{rows} rows" if rows != 1 else None


@Constraint
def fc_size(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """At most {max_cube_channels} output units and {max_input_channels} input features (the conv's
    channels: DPU cube and CNA DATA_SIZE1 fields)."""
    units, features = shape(graph, node.inputs[1])
    if units > min(ctx.limits.max_kernels, ctx.limits.max_cube_channels) or features > ctx.limits.max_input_channels:
        return f"{units} units, {features} features"
    return None


# ---- element-wise and activations ------------------------------------------------------------

def _operand_kind(graph: Graph, name: str, out: tuple[int, ...]) -> str | None:
    if shape(graph, name) == out:
        return "tensor"
    if len(out) != 4:  # below 4-D only same-shape operands have a layout the DPU reads alike
        return None
    if per_channel(const(graph, name), out, 1) is not None:
        return "constant"
    dims = shape(graph, name)
    if len(dims) == 4 and dims[1] == out[1] and dims[0] == 1 and dims[2] == dims[3] == 1:
        return "per-channel tensor"
    if len(dims) == 4 and dims[0] == dims[1] == 1 and tuple(dims[2:]) == tuple(out[2:]):
        return "spatial map"
    return None


@Constraint
def eltwise_operands(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Both operands have the output's shape, or one is a scalar or per-channel constant, a per-
    channel [1,C,1,1] tensor (read by the ERDMA's per-channel mode, LOWERING.md 17), or a
    [1,1,H,W] map (replicated across the lanes by a 1x1 conv task and read once per surface,
    LOWERING.md 16); a [1,1,H,W] map as Sub's first operand is a CPU step (a [1,C,1,1] gate
    first runs with BS negating the map, LOWERING.md 33.2); Max and Min only
    against a per-channel [1,C,1,1] gate tensor (LOWERING.md 28); Div only by a
    constant (run as a multiply by its reciprocal)."""
    out = shape(graph, node.outputs[0])
    kinds = [_operand_kind(graph, name, out) for name in node.inputs]
    if None in kinds or kinds.count("tensor") == 0:
        return f"operands {[list(shape(graph, name)) for name in node.inputs]} for output {list(out)}"
    if node.op_type in ("Max", "Min") and (len(kinds) != 2 or "per-channel tensor" not in kinds):
        return f"{node.op_type} runs on the NPU only with a [1,C,1,1] gate operand"
    if node.op_type == "Div" and kinds[1] != "constant":
        return "the divisor is not a constant"
    return None


@Constraint
def prelu_slope(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """PRelu's slope is a constant, one value or one per channel."""
    if node.op_type != "PRelu":
        return None
    slope = const(graph, node.inputs[1])
    return None if per_channel(slope, shape(graph, node.outputs[0]), 1) is not None else "slope varies per position or is computed"


# ---- pooling ---------------------------------------------------------------------------------

@Constraint
def pool_window(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """2-D window at most {max_pool_kernel}, strides at most {max_pool_stride}, pads at most
    {max_pool_pad}, dilation 1 (PPU kernel, stride and padding fields)."""
    attrs = node.attrs
    if len(attrs["kernel_shape"]) != 2 or max(attrs["dilations"]) != 1:
        return f"kernel {attrs['kernel_shape']}, dilations {attrs['dilations']}"
    if max(attrs["kernel_shape"]) > ctx.limits.max_pool_kernel or max(attrs["strides"]) > ctx.limits.max_pool_stride:
        return f"kernel {attrs['kernel_shape']}, strides {attrs['strides']}"
    return f"pads {attrs['pads']}" if max(attrs["pads"]) > ctx.limits.max_pool_pad else None


@Constraint
def pool_ceil_mode(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Ceil mode only where it gives the floor-mode output size (no window past the pads)."""
    if not node.attrs["ceil_mode"]:
        return None
    attrs, (height, width) = node.attrs, shape(graph, node.inputs[0])[2:]
    pads = attrs["pads"]
    floor = [(size + pads[i] + pads[i + 2] - attrs["kernel_shape"][i]) // attrs["strides"][i] + 1
             for i, size in enumerate((height, width))]
    actual = list(shape(graph, node.outputs[0])[2:])
    return None if floor == actual else f"ceil mode makes {actual}, not {floor}"


@Constraint
def average_padding(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """An AveragePool with padding counts the pads (count_include_pad = 1): the PPU divides by the
    whole window; ONNX's default count_include_pad = 0 with padding runs on the CPU, as the vendor's
    does (vendor-corpus README §3.2)."""
    if node.op_type == "AveragePool" and any(node.attrs["pads"]) and not node.attrs["count_include_pad"]:
        return f"pads {node.attrs['pads']} with count_include_pad = 0"
    return None


@Constraint
def global_pool_window(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """The whole plane fits one PPU window ({max_pool_kernel} x {max_pool_kernel}); a larger
    GlobalAveragePool becomes depthwise convs at optimization level 3."""
    height, width = shape(graph, node.inputs[0])[2:]
    return f"plane {height}x{width}" if max(height, width) > ctx.limits.max_pool_kernel else None


# ---- data movement ---------------------------------------------------------------------------

@Constraint
def channel_axis_only(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Joins or cuts along the channel axis (whole NC1HWC2 channel planes, by address or DPU copies)."""
    return None if node.attrs["axis"] == 1 else f"axis {node.attrs['axis']}"


@Constraint
def flat_concat_columns(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Every input is a map of the output's channels, at most {max_cube_channels} channels and
    {max_cube_width} wide (each is one DPU copy cube; the output is only written, through
    DST_SURF_STRIDE, so its N columns are not a cube; LOWERING.md 29)."""
    channels = shape(graph, node.outputs[0])[1]
    for name in node.inputs:
        dims = shape(graph, name)
        if dims[1] != channels or channels > ctx.limits.max_cube_channels or dims[3] > ctx.limits.max_cube_width:
            return f"'{name}' is {list(dims)}, the output has {channels} channels"
    return None


@Constraint
def glu_halves(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Each half of a Glu's channels starts on a 16-channel NC1HWC2 surface (C/2 a multiple of
    16), so both halves are read by address (LOWERING.md 22.1)."""
    half = shape(graph, node.inputs[0])[1] // 2
    return None if half % 16 == 0 else f"{half} channels per half"


@Constraint
def resize_nearest_replication(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Resize is nearest-neighbour upsampling of H and W by whole factors 1..8 in which output
    pixel (y, x) copies input pixel (y // fy, x // fx) - asymmetric + floor, half_pixel + round,
    ... (the DPU_RDMA unpooling mode, 3-bit kernel fields; bilinear and fractional scales run on
    the host, LOWERING.md 19)."""
    from ..ops.resize import replication_factors  # the op's own index map decides
    factors, reason = replication_factors(node.attrs, shape(graph, node.inputs[0]))
    return None if factors is not None else reason


@Constraint
def softmax_float16(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Softmax runs on the NPU in float16: in float16 builds, and in int8 builds as a float16
    island between DPU DataConverts, as the vendor keeps it float16 in its int8 builds
    (quant/islands.py, LOWERING.md 26); CBUF sizes of 1 or 2 bytes per element."""
    return None if ctx.element_bytes in (1, 2) else f"{ctx.element_bytes}-byte elements"


@Constraint
def softmax_channel_axis(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Softmax over the channel axis of a [1, C, H, W] map, each pixel on its own (LOWERING.md 22.2)."""
    dims = shape(graph, node.inputs[0])
    axis = int(node.attrs["axis"]) % len(dims)
    if axis != 1:
        return f"axis {node.attrs['axis']} of {list(dims)}"
    if node.attrs.get("flatten_2d") and int(np.prod(dims[2:])) != 1:
        return f"opset < 13 Softmax over the flattened C*H*W of {list(dims)}"
    return None


@Constraint
def softmax_channels(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """At most 32768 channels: 22.2's chain up to 512, LOWERING.md 25's above, whose sum of e^d
    over the channels (up to C) must stay an fp16 value."""
    channels = shape(graph, node.inputs[0])[1]
    return None if channels <= 32768 else f"{channels} channels"


@Constraint
def attention_float16(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Attention runs on the NPU in float16 (its weights are float16 feature maps, its softmax is
    22.2's float16 chain; LOWERING.md 22.3): in float16 builds, and in int8 builds as a float16
    island between DPU DataConverts (quant/islands.py, LOWERING.md 26)."""
    return None if ctx.element_bytes in (1, 2) else f"{ctx.element_bytes}-byte elements"


@Constraint
def attention_heads(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """Heads of P = 8, 16 or a multiple of 16 up to 256 channels (v is transposed through a map E
    of P pixels in rows of 16 made by a conv with 15 pixels of padding on each side, and up to
    15 rows of padding); an even number T of tokens, at most 384 (the scores' conv has T
    kernels read from a map's bytes; the softmax over T channels has T x T step weights,
    which fit the CBUF up to 384: 448 takes 13 of its 12 banks; LOWERING.md 22.3)."""
    tokens, width = shape(graph, node.inputs[0])[3], node.attrs["head_channels"]
    if width not in (8, 16) and (width % 16 or width > 256) or tokens % 2 or not 2 <= tokens <= 384:
        return f"{tokens} tokens, heads of {width} channels"
    return None


@Constraint
def graph_output(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """A Readout writes a graph output, which the runtime permutes as it reads it (LOWERING.md 25)."""
    return None if node.outputs[0] in graph.outputs else f"{node.outputs[0]!r} is not a graph output"


@Constraint
def same_native_bytes(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """The reshape keeps N and C and leaves no spatial extent on either side ([1,C] <-> [1,C,1,1]; a
    rank-3 [1,C,L] is stored 1 x C x L): the NC1HWC2 bytes are the same, so it is done by address."""
    def view(dims: tuple[int, ...]) -> tuple[int, int] | None:
        # rank 3 is laid out c x h x w (as_cube): [1, C, 1] is 1 x C x 1, not C x 1 x 1
        if len(dims) not in (2, 4) or int(np.prod(dims[2:])) != 1:
            return None
        return dims[0], dims[1]
    before, after = view(shape(graph, node.inputs[0])), view(shape(graph, node.outputs[0]))
    if before is None or before != after or before[0] != 1:
        return f"{list(shape(graph, node.inputs[0]))} -> {list(shape(graph, node.outputs[0]))}"
    return None


# ---- MatMul of two activations (passes/matmul_act_npu.py, LOWERING.md 37) ----------------------

ACT_MATMUL_MAX_HEADS = 8192  # heads on the rows, each written by its own conv (LOWERING.md 41): the 13-bit height fields
ACT_MATMUL_MAX_SELECTION = 65536  # elements of a head's Kp x (K + 14) selection weights (128 KB float16)


def matmul_form(graph: Graph, node: Node) -> tuple[int, int, int, int] | str:
    """(H, T, K, N) of a MatMul of two activations A [.., T, K] x B [.., K, N] with the same batch
    axes, at most one of them other than 1 (H heads); else why not."""
    a, b = (shape(graph, name) for name in node.inputs[:2])
    if any(const(graph, name) is not None for name in node.inputs[:2]):
        return "a constant operand (the folding stage makes it a FullyConnected where it fits)"
    if len(a) != len(b) or len(a) not in (2, 3, 4) or a[:-2] != b[:-2] or a[-1] != b[-2] \
            or sum(d != 1 for d in a[:-2]) > 1 or (len(a) == 4 and a[0] != 1):
        return f"{list(a)} x {list(b)} is not [.., T, K] x [.., K, N] over the same single batch axis"
    return int(np.prod(a[:-2])), int(a[-2]), int(a[-1]), int(b[-1])


def _act_matmul_limit(heads: int, depth: int, columns: int, merged: bool = False) -> str | None:
    padded = -(-depth // 8) * 8
    if columns % 2:
        return f"N = {columns} columns (odd)"
    if merged and columns % 16:
        return f"heads merged on the channels with N = {columns}, not whole 16-kernel passes"
    if heads > ACT_MATMUL_MAX_HEADS and not merged:
        return f"{heads} heads"
    if heads > 1 and depth % 8 and padded * (depth + 14) > ACT_MATMUL_MAX_SELECTION:
        return f"heads of K = {depth}: {padded} x {depth + 14} selection weights per head"
    return None


@Constraint
def matmul_activations(graph: Graph, node: Node, ctx: PassContext) -> str | None:
    """A MatMul of two activations A [.., T, K] x B [.., K, N] (one batch axis of H heads at most)
    runs as CNA 1x1 convs whose weights are B's bytes, float16 (an island in int8 builds): N even
    (the conv's kernel count), H <= 8192 (heads on the rows of the result, each head's last conv
    writing its row, LOWERING.md 41; heads merged on the channels for a later tensor that holds them so: N a multiple of 16), heads
    of K off the 8-channel surface re-spread by selection convs of at most 65536 weights; and only
    where the graph pass found its operands' layouts without adding host steps (to [1, H K, 1, T]
    and [1, H K, 1, N], the result from [1, N, H, T]: a token region's maps, the runtime's readin
    and readout of graph inputs and outputs; LOWERING.md 37)."""
    if ctx.element_bytes not in (1, 2):
        return f"{ctx.element_bytes}-byte elements"
    if ctx.platform.c2("float16") * 2 < 16:  # the run-time weights are 16-byte float16 atoms (8 channels)
        return (f"{ctx.platform.name}: its float16 atoms are {ctx.platform.c2('float16') * 2} bytes, and the second "
                "operand's surfaces are read as weights of 8-channel (16-byte) atoms")
    if node.op_type == "MatMul":
        if ctx.level < 1:
            return "the graph passes run from optimization level 1"
        form = matmul_form(graph, node)
        if isinstance(form, str):
            return form
        heads, _, depth, columns = form
        return _act_matmul_limit(heads, depth, columns) or \
            "its operands' or result's layout changes would be host steps (no token-region map, graph input or " \
            "output holds them)"
    heads = int(node.attrs["heads"])
    return _act_matmul_limit(heads, shape(graph, node.inputs[0])[1] // heads, shape(graph, node.inputs[1])[3],
                             node.attrs.get("layout") == "channels")
