"""Does a convolution fit the CBUF at all? The test the channel-tiling rewrite and the
partition share.

It mirrors the lowering's CBUF planner (``compiler/lower/tiling.py``, vendor-corpus README
§4.4) without importing it: the input is counted in 64-byte CBUF entries per row
(``ceil(W * A / 4)``, A = 16-byte atoms per pixel, 1 or an even count), the weights in the
vendor's packed int8 layout (output channels padded to ATOM_K, input channels to the
input-channel group). A conv fits when (1) input and weights fit side by side, or (2) the
input fits and the weights, at least as big, stream through the rest, or (3) the weights
leave enough banks for the kernel's rows of input (the layer is then split along H).
Otherwise nothing but a split of the input channels makes it fit. Depthwise convs are split
by channel groups instead and always fit.

Sizes assume int8 (the default build): the passes run before quantization.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.platforms import Platform

from ..ir import Graph, Node

_ENTRY_BYTES = 64


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _entries_per_row(width: int, channel_bytes: int) -> int:
    atoms = _ceil_div(channel_bytes, 16)
    atoms = 1 if atoms <= 1 else _ceil_div(atoms, 2) * 2
    return _ceil_div(width * atoms, 4)


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


def conv_geometry(graph: Graph, node: Node) -> ConvGeometry:
    """The geometry of a 4-D Conv node."""
    _, channels, height, width = graph.tensors[node.inputs[0]].shape
    kernel, dilations = node.attrs["kernel_shape"], node.attrs["dilations"]
    return ConvGeometry(channels, height, width, graph.tensors[node.outputs[0]].shape[1],
                        (kernel[0] - 1) * dilations[0] + 1, node.attrs["strides"][0], node.attrs["pads"][0],
                        kernel[0] * kernel[1])


def weight_bytes(platform: Platform, geometry: ConvGeometry, element_bytes: int = 1) -> int:
    out = _ceil_div(geometry.out_channels, platform.cycle_model.atom_k_int8) * platform.cycle_model.atom_k_int8
    group = platform.cycle_model.input_channel_group
    return out * _ceil_div(geometry.channels, group) * group * geometry.taps * element_bytes


def cbuf_fit(platform: Platform, geometry: ConvGeometry, element_bytes: int = 1) -> tuple[bool, str]:
    """(fits, how or why not) for one non-depthwise convolution."""
    banks, bank_bytes = platform.cbuf.banks, platform.cbuf.bank_bytes
    bank_entries = bank_bytes // _ENTRY_BYTES
    row = _entries_per_row(geometry.width, geometry.channels * element_bytes)
    data_banks = _ceil_div(geometry.height * row, bank_entries)
    weight_banks = max(1, _ceil_div(weight_bytes(platform, geometry, element_bytes), bank_bytes))
    if data_banks + weight_banks <= banks:
        return True, f"input {data_banks} and weights {weight_banks} of {banks} CBUF banks"
    if data_banks < banks and weight_banks >= data_banks:
        return True, f"input in {data_banks} CBUF banks, weights streamed"
    if weight_banks < banks:
        rows = (banks - weight_banks) * bank_entries // row
        if (rows + geometry.pad_top - geometry.kernel_h) // geometry.stride_y + 1 >= 1 and rows >= 1:
            return True, f"weights in {weight_banks} CBUF banks, input split along H ({rows} rows per task)"
    return False, (f"input ({data_banks} banks of {bank_bytes} B) and weights ({weight_banks} banks) do not fit "
                   f"the {banks}-bank CBUF even when split along H")
