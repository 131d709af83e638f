"""RK3576 sparse inference (guide 5.11, `npuemu compile --sparse`): which int8 convolutions
store their weights as the vendor's sparse streams (4:2 or 16:4, isa/sparse_vendor.py), and why
the others stay dense.

A layer goes sparse when the build asked for it (``platform.sparse.enabled``), the chip lists
the mode (``platform.sparse.modes``, platforms/rk3576.yaml), and the guide's limits hold
(table 5-12: a 2-D conv with group 1, int8, input and output channels 32-aligned) - plus our
own: symmetric weights (a pruned weight must be the stored value 0). Every mode stores the
vendor's two streams whatever the size (LOWERING.md 27, 43). The choice follows librknnc 2.5.0's
[V: its "sparse type, method N" log line over chosen-weight builds, LOWERING.md 43]: 16:4 (method
3, 75 %) when every 4 x 4 tile's non-zero values lie in 2 kernels x 2 channels, else 4:2 along
input channels (method 2), else along output channels (method 1). Weights pruned 16:4 otherwise
(the guide's in->out / out->in order, table 5-10, need not give such tiles) are 4:2 along their
first axis, and get 50 % as in the vendor's build.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from npuemu.isa import sparse_layout, sparse_vendor
from npuemu.isa.errors import ConfigError
from npuemu.isa.sparse_layout import GROUP, KEPT, SparseStreams

#: What the vendor's layer table prints in its SparseRatio column per mode (guide 5.11.3).
RATIO_TEXT = {"in_4_2": "50%(IC)", "out_4_2": "50%(OC)", "in_out_16_4": "75%"}


@dataclass(frozen=True)
class SparseDecision:
    """One convolution's weight storage: ``mode`` None keeps it dense, for ``reason``."""

    layer: str
    mode: str | None
    reason: str

    @property
    def ratio(self) -> str:
        return RATIO_TEXT[self.mode] if self.mode else "0%"

    def line(self) -> str:
        return f"{self.layer}: {self.ratio} - {self.reason}"


def _crowded(weights: np.ndarray, axis: int) -> int:
    """Groups of 4 along ``axis`` (0: output, 1: input channels) with more than 2 non-zeros."""
    moved = np.moveaxis(weights != 0, axis, -1)
    groups = moved.reshape(moved.shape[:-1] + (-1, GROUP))
    return int(np.count_nonzero(groups.sum(axis=-1) > KEPT))


def _is_16_4(weights: np.ndarray) -> bool:
    """Every 4 x 4 (output x input channel) tile's non-zero values lie in 2 kernels x 2 channels:
    what librknnc 2.5.0 detects as 16:4 ("sparse type, method 3") [V: 9 chosen-weight builds; 4 of
    16 values in other arrangements - the guide's in->out pruning, a diagonal - get 4:2]."""
    oc, ic = weights.shape[:2]
    tiles = (weights != 0).reshape(oc // GROUP, GROUP, ic // GROUP, GROUP, -1)
    return bool((tiles.any(axis=3).sum(axis=1) <= KEPT).all() and (tiles.any(axis=1).sum(axis=2) <= KEPT).all())


def _limit(weights: np.ndarray, groups: int, dtype: str, zero_point, platform) -> str | None:
    """Why the layer cannot be sparse whatever its values (None: it can)."""
    sparse = platform.sparse
    if dtype not in sparse.dtypes:
        return (f"{dtype} weights: {platform.name} sparse inference takes {', '.join(sparse.dtypes)} only "
                "(guide table 5-12)")
    if groups != 1:
        return f"group {groups}: sparse inference takes 2-D convs with group 1 only (guide 5.11.4)"
    oc, ic = weights.shape[:2]
    align = sparse.channel_align
    if oc % align or ic % align:
        return f"{oc} output / {ic} input channels: both must be multiples of {align} (guide table 5-12)"
    if np.any(np.asarray(zero_point) != 0):
        return "asymmetric weights (non-zero weight zero point): a pruned weight is not stored as 0"
    return None


def decide(layer: str, weights: np.ndarray, groups: int, dtype: str, zero_point, platform) -> SparseDecision:
    """The storage of one convolution's weights [OC][IC/groups][KH][KW] (stored int8 values)."""
    limit = _limit(np.asarray(weights), groups, dtype, zero_point, platform)
    if limit:
        return SparseDecision(layer, None, limit)
    weights = np.asarray(weights)
    along_in, along_out = _crowded(weights, 1), _crowded(weights, 0)
    modes = platform.sparse.modes
    sixteen = _is_16_4(weights)
    if sixteen and "in_out_16_4" in modes:
        return SparseDecision(layer, "in_out_16_4", "16:4 (each 4 x 4 tile within 2 kernels x 2 channels)")
    sixteen = " (16:4 weights: stored 4:2)" if sixteen else ""
    if along_in == 0 and "in_4_2" in modes:
        return SparseDecision(layer, "in_4_2", "4:2 along input channels" + sixteen)
    if along_out == 0 and "out_4_2" in modes:
        return SparseDecision(layer, "out_4_2", "4:2 along output channels" + sixteen)
    total = weights.size // GROUP
    return SparseDecision(layer, None, f"not 4:2 sparse: {along_in} of {total} groups of 4 input channels and "
                                       f"{along_out} of {total} groups of 4 output channels hold more than 2 "
                                       "non-zero values")


def conv_decision(layer, platform) -> SparseDecision | None:
    """A lowered ConvLayer's decision; None when the build did not ask for sparse weights."""
    if not platform.sparse.enabled:
        return None
    return decide(layer.name, layer.weights, layer.groups, layer.dtype, layer.weight_zero_point, platform)


def graph_decisions(graph, platform) -> list[SparseDecision]:
    """The decision of every quantized Conv node, as the lowering takes it from the same stored
    weights (build_adapt makes each ConvLayer from ``stored_values`` of its weight)."""
    from npuemu.compiler.quant.quantize import stored_values

    decisions = []
    for node in graph.nodes:
        if node.op_type != "Conv" or len(node.inputs) < 2:
            continue
        weight = graph.tensors.get(node.inputs[1])
        if weight is None or weight.data is None or weight.quant is None:
            continue
        dtype = str(weight.quant.dtype)
        values = stored_values(weight)
        decisions.append(decide(node.layer_name, values, int(node.attrs.get("group", 1)), dtype,
                                weight.quant.zero_point, platform))
    return decisions


def symmetric_weights(graph, platform) -> list[str]:
    """Requantize the int8 weights of the Conv nodes whose float weights are 4:2 sparse to zero
    point 0 (scale max|w| / 127 per channel), so a pruned weight stays the stored 0 the
    decompressor writes back; names the weight tensors changed. The vendor does the same: its
    sparse build's OUT_CVT differs from the dense build's for the same output scale [V]
    (sparse_rk3576_int8/regcmd_diff_vs_off.txt)."""
    from npuemu.compiler.ir import QuantParams
    from npuemu.compiler.quant.quantize import MIN_WEIGHT_SCALE_RATIO

    changed = []
    for node in graph.nodes:
        weight = graph.tensors.get(node.inputs[1]) if node.op_type == "Conv" and len(node.inputs) > 1 else None
        if weight is None or weight.data is None or weight.quant is None or str(weight.quant.dtype) != "int8":
            continue
        data = np.asarray(weight.data, np.float64)
        if decide(node.layer_name, data, int(node.attrs.get("group", 1)), "int8", 0, platform).mode is None:
            continue
        axis = weight.quant.axis
        reduce = tuple(i for i in range(data.ndim) if i != axis) if axis is not None else None
        scale = np.asarray(np.abs(data).max(axis=reduce) / 127.0, np.float64)
        live = scale > 0
        scale = np.where(live, scale, scale.max() if live.any() else 1.0)  # any scale stores 0 exactly
        scale = np.maximum(scale, scale.max() * MIN_WEIGHT_SCALE_RATIO)  # quantize.weight_params' floor
        weight.quant = QuantParams("int8", scale.astype(np.float32), np.zeros(scale.shape, np.int32), axis)
        changed.append(weight.name)
    return changed


def build_platform(platform, precision: str):
    """The platform a ``--sparse`` build lowers with (``sparse.enabled`` set), and the log line
    (None, or why the option does nothing). ConfigError on a chip without sparse inference."""
    if not platform.sparse.modes:
        raise ConfigError(f"--sparse: {platform.name} has no sparse inference; it is on {', '.join(sparse_chips())} "
                          "(platforms/*.yaml sparse.modes, guide 5.11)")
    if precision == "fp16":
        return platform, ("--sparse ignored: an fp16 build has no sparse weights (the vendor's sparse_infer applies "
                          "to int8 layers only, guide table 5-12; its fp16 build of the same conv is dense)")
    sparse = dataclasses.replace(platform.sparse, enabled=True)
    return dataclasses.replace(platform, sparse=sparse), None


def sparse_chips() -> list[str]:
    """The shipped platforms whose YAML lists sparse modes."""
    from npuemu.platforms import list_platforms, load_platform

    return [name for name in list_platforms() if load_platform(name).sparse.modes]


def sparse_streams(dense_blob: bytes, out_channels: int, mode: str, weights: np.ndarray) -> SparseStreams:
    """The layer's streams: the vendor's two streams of the stored int8 weights [OC][IC][KH][KW]
    along the mode's axis (isa/sparse_vendor.py, LOWERING.md 27 and 43), with DCOMP_REGNUM 5 and
    DCOMP_AMOUNT2..4 = 0 as the vendor writes them. (``out_channels`` is the shape's first axis:
    kept for lower_conv's call, one stream per 32 kernels was npuemu's earlier format.)"""
    if np.shape(weights)[0] != out_channels:
        raise ValueError(f"{np.shape(weights)} weights for {out_channels} output channels")
    packed = sparse_vendor.encode(np.asarray(weights), sparse_layout.ALONG[mode])
    amounts = packed.amounts + (0,) * (sparse_vendor.REGNUM - sparse_vendor.STREAMS)
    return SparseStreams(mode, packed.data, amounts, len(dense_blob))


__all__ = ["RATIO_TEXT", "SparseDecision", "SparseStreams", "build_platform", "conv_decision", "decide",
           "graph_decisions", "sparse_chips", "sparse_streams", "symmetric_weights"]
