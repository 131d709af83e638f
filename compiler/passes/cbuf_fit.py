"""Does a convolution fit the CBUF at all? The test the channel-tiling rewrite and the
partition share.

It asks the lowering's own CBUF planner (``compiler/lower/tiling.py``, vendor-corpus README
§4.4): a conv fits when the planner finds a bank split (input and weights side by side,
weights streamed, or the input split along H); when it cannot, only a split of the input
channels makes it fit. Weights are sized in the vendor's packed int8 layout (output channels
padded to ATOM_K, input channels to the input-channel group). Depthwise convs are split by
channel groups instead and always fit.

Sizes assume int8 (the default build): the passes run before quantization.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.platforms import Platform

from npuemu.isa.errors import CompileError

from ..ir import Graph, Node
from ..lower.tiling import CbufRequest, plan_cbuf


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ConvGeometry:
    channels: int
    height: int
    width: int
    out_channels: int
    kernel_h: int  # dilated extent: the input rows one output row needs
    stride_y: int
    pad_top: int
    taps: int  # kernel height x width: the weights per input channel
    out_height: int


def conv_geometry(graph: Graph, node: Node) -> ConvGeometry:
    """The geometry of a 4-D Conv node."""
    _, channels, height, width = graph.tensors[node.inputs[0]].shape
    _, out_channels, out_height, _ = graph.tensors[node.outputs[0]].shape
    kernel, dilations = node.attrs["kernel_shape"], node.attrs["dilations"]
    return ConvGeometry(channels, height, width, out_channels, (kernel[0] - 1) * dilations[0] + 1,
                        node.attrs["strides"][0], node.attrs["pads"][0], kernel[0] * kernel[1], out_height)


def weight_bytes(platform: Platform, geometry: ConvGeometry, element_bytes: int = 1) -> int:
    out = _ceil_div(geometry.out_channels, platform.cycle_model.atom_k_int8) * platform.cycle_model.atom_k_int8
    group = platform.cycle_model.input_channel_group
    return out * _ceil_div(geometry.channels, group) * group * geometry.taps * element_bytes


def cbuf_fit(platform: Platform, geometry: ConvGeometry, element_bytes: int = 1) -> tuple[bool, str]:
    """(fits, how or why not) for one non-depthwise convolution."""
    request = CbufRequest(
        layer="", height=geometry.height, width=geometry.width, channels=geometry.channels,
        element_bytes=element_bytes, kernel_h=geometry.kernel_h, stride_y=geometry.stride_y,
        pad_top=geometry.pad_top, out_height=geometry.out_height,
        weight_bytes=weight_bytes(platform, geometry, element_bytes),
        banks=platform.cbuf.banks, bank_bytes=platform.cbuf.bank_bytes)
    banks, bank_entries = request.banks, request.bank_entries
    data_banks = _ceil_div(request.height * request.row_entries(), bank_entries)
    weight_banks = max(1, _ceil_div(request.weight_bytes, request.bank_bytes))
    try:
        plan = plan_cbuf(request)
    except CompileError:
        return False, (f"input ({data_banks} banks of {request.bank_bytes} B) and weights ({weight_banks} "
                       f"banks) do not fit the {banks}-bank CBUF even when split along H")
    if plan.weights_streamed:
        return True, f"input in {data_banks} CBUF banks, weights streamed"
    if len(plan.row_tiles) > 1:
        rows = (banks - weight_banks) * bank_entries // request.row_entries()
        return True, f"weights in {weight_banks} CBUF banks, input split along H ({rows} rows per task)"
    return True, f"input {data_banks} and weights {weight_banks} of {banks} CBUF banks"
