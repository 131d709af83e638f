"""The vendor's static per-layer DDR estimate (librknnc), reproduced on request
(``npuemu perf --ddr-model vendor``).

Source: vendor-corpus README §4.2. librknnc estimates DDR cycles only for conv-type layers (the
others report 0/0/0, §4.1) as ``ceil(bytes / vendor_estimate.ddr_bytes_per_cycle)`` with
bytes = every input (feature inputs at their native NC1HWC2 sizes, the residual, the stored
weights - or the logical C*kh*kw bytes of depthwise weights where the platform says
``depthwise_weight_bytes: logical`` - and the stored bias) + the output's native size; its
Total is ``max(DDR, NPU)`` with no launch overhead. This is a static model of the vendor's
numbers, not of the board: the board-fitted model is the default (emulator/TIMING.md).

Sparse weights (RK3576, LOWERING.md 43): librknnc counts a sparse conv's weight operand as
**minus one eighth** of the stored (halved, "native") weight shape's counted bytes - not the
streams, not the dense size - so the sparse figure is below the layer's feature traffic and can
be negative (``sparse_weight_bytes``).

Byte sources: a vendor ``.rknn`` file lists every operand of a layer in its tensor table, so
the sizes are read from there. An npuemu ``.npu`` file lists the feature tensors only; the
weight bytes come from the layer's first conv task's CNA weight size (WEIGHT_SIZE0, the whole
layer's weights) and the bias bytes from what its DPU BS stream read in that task.
"""

from __future__ import annotations

import math

from npuemu.isa.errors import ConfigError
from npuemu.isa.sparse_layout import DENSE_PER_KEPT


def vendor_rate(platform) -> float:
    rate = platform.vendor_estimate.ddr_bytes_per_cycle
    if not rate:
        raise ConfigError(f"{platform.name}: the platform YAML has no vendor_estimate.ddr_bytes_per_cycle "
                          "(no vendor-corpus builds for this chip); --ddr-model vendor needs it")
    return rate


def vendor_ddr_cycles(nbytes: int, platform) -> int:
    return math.ceil(nbytes / vendor_rate(platform))


def _depthwise_logical(platform) -> bool:
    return platform.vendor_estimate.depthwise_weight_bytes == "logical"


def first_conv(records):
    return next((r.conv for r in records if r.conv is not None), None)


def _rknn_feature_bytes(tensor) -> int:
    """Native NC1HWC2 bytes of a feature tensor (the product of its 5-D native shape: the
    allocation can be larger, e.g. depthwise outputs padded to 64 channels, README §4.3)."""
    native = tuple(tensor.native_shape or ())
    if len(native) == 5 and tensor.kind_name != "const":
        return int(math.prod(native)) * _ITEMSIZE.get(tensor.dtype_name, 1)
    return int(tensor.size or 0)


_ITEMSIZE = {"int8": 1, "uint8": 1, "int16": 2, "float16": 2, "fp16": 2, "bfloat16": 2, "int32": 4, "float32": 4,
             "fp32": 4}


def estimated_op(op_type: str) -> bool:
    """Whether librknnc's table gives a vendor .rknn layer of this op type cycles: conv-type
    layers (Conv, ConvRelu, ConvExSwish, ...) and exMatMul. [V] the fixtures' and corpus tables:
    every Resize, Transpose, Reshape, exNorm, exSoftmax13, exLSTM, exGRU, exGlu, Mul and Add row
    is 0/0/0, even where its tasks are convs (matmul_rows_fp16's Transposes, the bilinear
    Resize's depthwise convs)."""
    return op_type.startswith("Conv") or op_type == "exMatMul"


def counted_weight_bytes(shape, itemsize: int) -> int:
    """The direct-conv weight bytes librknnc's estimate counts: Cout * kh * kw kernels rows of
    Cin rounded up to 8 channels and to at least one 16-byte atom; neither the stored blob (its
    input groups rounded to 1, 2 or 4 atoms, LOWERING.md 34) nor the logical size. [V] every
    row where the three differ: matmul_rows int8/fp16 (Cin 120: 120 counted, 128 stored),
    mobilenet_v2 rows 7 and 10 (int8 Cin 24: 24 counted, 32 stored), focus_slice int8 (Cin 3
    and 12: 16 counted) and fp16 (Cin 3: 8, Cin 12: 16)."""
    cout, cin, kh, kw = (int(v) for v in shape)
    return cout * kh * kw * max(16, -(-cin // 8) * 8 * itemsize)


def sparse_weight_bytes(native_bytes: int) -> int:
    """What librknnc's DDR estimate counts for a sparse conv's weights: -1/8 of the counted bytes
    of the stored shape ((OC, IC/2, kh, kw) along input channels, (OC/2, IC, kh, kw) along output
    channels, (OC/2, IC/2, kh, kw) at 75 %). [V: 20 rknn-toolkit2 2.5.0 builds, 4:2 along either
    axis and the 75 % mode, 32..128 x 32..96 channels, 1x1 / 3x3 / 5x5, 8..56 pixels square: every
    DDR figure is ceil((features + bias - native / 8) / 7.465) to the cycle; the RW column agrees
    (-4 KB for a 96 x 64 5 x 5 conv on 8 x 8); the fixture sparse_rk3576_int8: 53532.] An
    artefact of the estimate, not traffic: the DMA reads the streams (TIMING.md)."""
    return -(native_bytes // 8)


#: the vendor's scratch copies of an operand (``q_exSecondary``): a layer input in its tensor table
#: that librknnc's estimate leaves out [V: matmul_act_int8/fp16, exMatMul DDR = both operands + output]
_SECONDARY = "_exSecondary"


def rknn_layer_bytes(model, layer, records, platform) -> int:
    """Bytes of a vendor .rknn layer as librknnc counts them: its inputs and output (native
    feature sizes, direct-conv weights as ``counted_weight_bytes``, stored bias) without the
    vendor's ``_exSecondary`` scratch tensors."""
    conv = first_conv(records)
    total = 0
    for index in layer.inputs:
        tensor = model.tensors[index]
        if tensor.name.endswith(_SECONDARY):
            continue
        size = _rknn_feature_bytes(tensor)
        shape = tuple(tensor.shape or ())
        if conv is not None and tensor.kind_name == "const" and len(shape) == 4 and \
                shape[2:] == (conv.kernel_h, conv.kernel_w):
            if not conv.depthwise:
                if layer.op_type == "ConvTranspose":  # ONNX's [Cin, Cout, kh, kw] [V: tests/data/vendor_deconv]
                    shape = (shape[1], shape[0], *shape[2:])
                size = counted_weight_bytes(shape, _ITEMSIZE.get(tensor.dtype_name, 1))
                if conv.decompress is not None:  # the table lists the stored (halved) shape
                    size = sparse_weight_bytes(size)
            elif _depthwise_logical(platform) and tensor.dtype_name == "int8":
                size = int(math.prod(shape))  # logical C*kh*kw depthwise weights
        total += size
    return total + sum(_rknn_feature_bytes(model.tensors[i]) for i in layer.outputs)


def npu_layer_bytes(feature_sizes: list[int], records, platform) -> int:
    """Bytes of an npuemu .npu layer: its feature tensors + weights (CNA) + bias (DPU BS stream)."""
    conv = first_conv(records)
    total = sum(feature_sizes)
    if conv is None:
        return total
    first = next(r for r in records if r.conv is not None)
    weights = conv.weight_bytes
    if conv.decompress is not None:  # RK3576 sparse: the stored shape's bytes (weight_bytes: dense)
        weights = sparse_weight_bytes(conv.weight_bytes // DENSE_PER_KEPT[conv.decompress.mode])
    if conv.depthwise and _depthwise_logical(platform):
        weights = (conv.real_channels or conv.out_channels) * conv.kernel_h * conv.kernel_w
    return total + weights + first.traffic.bias_read


def _h1_shape_key(conv) -> tuple:
    """Everything model H1 reads from a conv task except its output height."""
    return (conv.depthwise, conv.precision, conv.out_width, conv.kernel_h, conv.kernel_w, conv.kernels,
            conv.out_channels, conv.real_channels, conv.in_channels)


def _plane(convs: list):
    """The tasks of one plane (same H1 key) merged back into one: their output heights summed."""
    from dataclasses import replace

    return replace(convs[0], out_height=sum(c.out_height for c in convs))


def _merge_depthwise_groups(planes: list) -> list:
    """Depthwise channel groups of one layer merged into one conv over all their channels.

    A depthwise layer too big for the CBUF is split into channel groups (README §4.4); each
    group's tasks read their own weights, so the groups are told apart by CNA WEIGHT_ADDR. H1
    rounds C up to the depthwise group G once per layer (README §4.1; the fp16 tables of
    ../shared/docs/vendor-fp16/ give MobileNetV2's dw 144 at 56x56 3 groups of 64, 84672 cycles),
    while npuemu's fp16 build splits at its 32-channel weight blocks, each task paying a whole G
    (5 x 28224 = 141120). Planes of different weight addresses whose merged heights, widths,
    kernels and precision agree are one layer's channel groups: their channels add up. int8
    groups are whole multiples of G but the last, so the sum is unchanged there."""
    from dataclasses import replace

    groups: dict[tuple, list] = {}
    rest = []
    for conv in planes:
        if conv.depthwise:
            key = (conv.precision, conv.out_width, conv.out_height, conv.kernel_h, conv.kernel_w)
            groups.setdefault(key, []).append(conv)
        else:
            rest.append(conv)
    merged = [replace(g[0], out_channels=sum(c.out_channels for c in g),
                      real_channels=sum(c.real_channels or c.out_channels for c in g))
              if len(g) > 1 else g[0] for g in groups.values()]
    return rest + merged


def vendor_layer_npu_cycles(records, platform) -> int:
    """librknnc's NPU cycles of one layer: model H1 over the layer's whole output.

    The per-task model (npu_cycles.py) rounds each task's OH*OW up to the pixel granule and each
    depthwise task's channels up to the depthwise group, as the register state of each task gives
    it; the vendor's estimate (README §4.1) rounds the layer's plane and channels once. For a layer
    split along H into tasks the two differ (rep05 / mobilenet_v2 L5, 56x56 as 25+24+7 rows: 56736
    per task vs 56448 per layer), and for a depthwise layer split into channel groups that are not
    whole depthwise groups (fp16, ``_merge_depthwise_groups``). Tasks that differ only in their
    output height are merged back into one plane here, then a depthwise layer's channel groups
    into one conv; which one the silicon does, only a board can say (TIMING.md).
    """
    from npuemu.emulator.timing.npu_cycles import conv_npu_cycles

    planes: dict[tuple, list] = {}
    for record in records:
        if record.conv is not None:
            conv = record.conv
            # a depthwise channel group, and a kernel group of a conv split by output channels
            # across cores (resnet18's 2-core program, layer 12: 128 + 128 kernels), read their
            # own weights: the address keeps them apart; the row blocks of one plane share it
            key = _h1_shape_key(conv) + (conv.weight_address,)
            planes.setdefault(key, []).append(conv)
    merged = _merge_depthwise_groups([_plane(convs) for convs in planes.values()])
    return sum(conv_npu_cycles(conv, platform) for conv in merged)
