"""The exact int8 prediction (``fake_quant_evaluate(..., exact=True)``, QUANTIZATION.md 7.1):
what the built model computes, from the compiler's own register values.

Plain fake quant (fake_quant.py) rounds each stored tensor with the ideal requantization
factor; the NPU applies the realised fixed-point one (quant_regs: per-channel MUL 2^-14 and a
15-bit OUT_CVT SCALE), rounds inside the DPU pipeline (BS half away, EW converter and OUT_CVT
half even), and runs non-ReLU activations through a 513-entry LUT. Those differences are
each below an output step, but near a rounding boundary they move a value by one LSB, and over
tens of layers the moved values spread. Here every int8 NPU layer is computed in integers from
the :class:`~npuemu.compiler.lower.descriptions.DpuStages` the lowering programs (BS, BN,
LUT, EW, OUT_CVT, with the arithmetic of emulator/NUMERICS.md 4-6), the accumulator exactly,
and every host step as the runtime runs it (inputs dequantized to float32, the op in float64,
the result quantized half even, or stored as float where the build keeps a host-only tensor
unquantized). Which layers run on the host, and how each tensor is stored, is read from the
built model (built here unless given).

Covered: int8 Conv (direct, depthwise, grouped, dilated; fused bias Adds, relu / relu6 /
clip / leaky, LUT activations, residual Add before or after the activation), ConvTranspose
(the conv of its stride phases + DepthToSpace and crop, compiler/deconv_phases.py), element-wise Add/Sub/Mul/Max/Min, max/average
pooling, channel Concat and Split copies, standalone activations, and the host steps. A
float16 NPU layer (hybrid builds) is evaluated in float with fp16 storage, as plain fake quant
does: not exact.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..float_eval import run_node
from ..ir import Graph, Node
from ..ops import get_op

INT8 = (-128, 127)
INT32 = (-(1 << 31), (1 << 31) - 1)
_ALU = {0: np.maximum, 1: np.minimum, 2: np.add, 4: np.subtract}  # *_ALU_ALGO (NUMERICS.md 4.3)


def exact_evaluate(graph: Graph, inputs: Mapping[str, Any], *, model=None, platform: str = "rk3588",
                   return_all: bool = False) -> dict[str, np.ndarray]:
    """Dequantized values (float32, as ``Runtime.output``) of the graph outputs (or of every
    tensor) as the model built from ``graph`` computes them; ``model``: that ModelFile, if
    already built."""
    from npuemu.compiler.build import build_model
    from npuemu.platforms import load_platform

    if model is None:
        model = build_model(graph, platform)
    return _Evaluator(graph, model, load_platform(platform)).run(inputs, return_all)


def _rshift(v: np.ndarray, shift, mode: str) -> np.ndarray:
    """``v / 2^shift`` rounded half away or half even (NUMERICS.md 1); shifts above 62 act as 62
    (every value here is below 2^61, so the result is 0 either way)."""
    v = np.asarray(v, np.int64)
    s = np.clip(np.asarray(shift, np.int64), 0, 62)
    low = v >> s
    twice, one = 2 * (v - (low << s)), np.left_shift(np.int64(1), s)
    tie_up = (low >= 0) if mode == "half_away" else ((low & 1) == 1)
    return low + ((twice > one) | ((twice == one) & tie_up))


def _sat(v, bounds=INT32) -> np.ndarray:
    return np.clip(v, *bounds)


def _x_stage(v: np.ndarray, stage, alu=None, mul=None, bn: bool = False) -> np.ndarray:
    """BS (ALU, then MUL and shift) or BN (MUL, ALU, then shift), NUMERICS.md 4.1-4.2;
    ``alu``/``mul``: per-channel operands from the BRDMA blob, shaped to broadcast."""
    if stage.bypass:
        return v
    alu_value = alu if stage.alu_from_dma else stage.alu_operand
    mul_value = mul if stage.mul_from_dma else stage.mul_operand
    if not bn and not stage.alu_bypass and alu_value is not None:
        v = _sat(_ALU[stage.alu_algo](v, alu_value))
    if not stage.mul_bypass:
        product = v * mul_value
        if bn and not stage.alu_bypass:
            product = _ALU[stage.alu_algo](product, alu_value)
        scaled = _rshift(product, stage.mul_shift, "half_away")
        v = np.where(v >= 0, v, scaled) if stage.mul_prelu else scaled  # MUL_PRELU: negative values only
    elif bn and not stage.alu_bypass:
        v = _ALU[stage.alu_algo](v, alu_value)
    return _relu(_sat(v), stage)


def _relu(v: np.ndarray, stage) -> np.ndarray:
    """A stage's ReLU and RELUX (its upper bound)."""
    if stage.relu:
        v = np.maximum(v, 0)
    if stage.relux:
        v = np.minimum(v, stage.relux_value)
    return v


def _lut(v: np.ndarray, program) -> np.ndarray:
    """NUMERICS.md 5 with the lowering's registers (lower/lut.py): slopes 0, hybrid and
    overflow priority LO, underflow priority LE."""
    k = program.index_select

    def one(table, start, end):
        table = np.asarray(table, np.int64)
        offset = np.clip(v - start, 0, end - start)
        index = offset >> k
        upper = table[np.minimum(index + 1, table.size - 1)]
        hit = table[index] + _rshift((upper - table[index]) * (offset - (index << k)), k, "half_away")
        return np.where(v < start, table[0], np.where(v > end, table[-1], hit)), v < start, v > end

    le, le_under, le_over = one(program.le, program.le_start, program.le_end)
    lo, lo_under, lo_over = one(program.lo, program.lo_start, program.lo_end)
    le_only = ~(le_under | le_over) & (lo_under | lo_over)
    return np.where(le_only | (le_under & lo_under), le, lo)


def dpu_pipeline(v: np.ndarray, stages, *, alu=None, mul=None, operand=None) -> np.ndarray:
    """int8 output of the DPU stages on int64 ``v`` (the CORE's accumulator with the BS ALU
    operand already added, or a DPU-only task's input); ``operand``: the EW stage's int8 input."""
    v = _x_stage(np.asarray(v, np.int64), stages.bs, alu, mul)
    v = _x_stage(v, stages.bn, bn=True)
    ew = stages.ew
    if not ew.bypass:
        if ew.lut:
            v = _lut(v, stages.lut)
        if not ew.op_bypass:
            e = np.asarray(operand, np.int64)
            if not ew.cvt_bypass:
                e = _sat(_rshift((e + ew.cvt_offset) * ew.cvt_scale, ew.cvt_shift, "half_even"))
            v = _ALU[ew.alu_algo](v, e) if ew.op_type == 0 else _rshift(v * e, ew.truncate, "half_away")
            v = _sat(v)
        v = _relu(v, ew)
    out = stages.out_cvt
    return _sat(_rshift(v * out.scale, out.shift, "half_even") + out.offset, INT8)


def conv_accumulator(x: np.ndarray, weights: np.ndarray, zp_in: int, zp_w: np.ndarray, layer) -> np.ndarray:
    """``sum((x - zp_in)(w - zp_w))`` per output [O, OH, OW] (padding at zp_in), as float64
    matrix products per group: exact while partial sums stay below 2^53."""
    centred = np.asarray(x, np.float64) - zp_in
    taps = np.asarray(weights, np.float64) - np.asarray(zp_w, np.float64).reshape(-1, 1, 1, 1)
    channels, height, width = centred.shape
    outputs, group_inputs, kh, kw = taps.shape
    top, left, bottom, right = layer.pads
    (sy, sx), (dy, dx) = layer.stride, layer.dilation
    padded = np.zeros((channels, height + top + bottom, width + left + right))
    padded[:, top:top + height, left:left + width] = centred
    out_h = (padded.shape[1] - (kh - 1) * dy - 1) // sy + 1
    out_w = (padded.shape[2] - (kw - 1) * dx - 1) // sx + 1
    columns = np.empty((channels, kh, kw, out_h, out_w))
    for ky in range(kh):
        for kx in range(kw):
            columns[:, ky, kx] = padded[:, ky * dy:ky * dy + (out_h - 1) * sy + 1:sy,
                                        kx * dx:kx * dx + (out_w - 1) * sx + 1:sx]
    groups = layer.groups
    product = np.matmul(taps.reshape(groups, outputs // groups, -1), columns.reshape(groups, -1, out_h * out_w))
    return np.rint(product).astype(np.int64).reshape(outputs, out_h, out_w)


class _Evaluator:
    def __init__(self, graph: Graph, model, platform) -> None:
        self.graph, self.platform = graph, platform
        self.records = {record["name"]: record for record in model.trailer.get("tensors", ())}
        self.host = {output for step in model.schedule() if step.kind == "cpu" for output in step.outputs}
        self.values: dict[str, np.ndarray] = {}  # int8 tensors as int64 stored values, others as floats

    # storage --------------------------------------------------------------------------------
    def quant(self, name: str) -> tuple[float, int] | None:
        quant = self.records.get(name, {}).get("quantization")
        if quant is None:
            tensor = self.graph.tensors.get(name)
            if name not in self.records and tensor is not None and tensor.quant is not None \
                    and tensor.quant.dtype == "int8":
                return float(np.asarray(tensor.quant.scale).reshape(-1)[0]), int(
                    np.asarray(tensor.quant.zero_point).reshape(-1)[0])
            return None
        return float(quant["scale"]), int(quant["zero_point"])

    def real(self, name: str) -> np.ndarray:
        """The value as the runtime reads it: int8 dequantized to float32, floats as stored."""
        quant = self.quant(name)
        value = self.values[name]
        if quant is None:
            return np.asarray(value)
        return (quant[0] * (np.asarray(value, np.float64) - quant[1])).astype(np.float32)

    def store(self, name: str, value: np.ndarray) -> None:
        """A host result stored as the runtime stores it (cpu_ops run_step)."""
        quant = self.quant(name)
        if quant is not None:
            quantized = np.rint(np.asarray(value, np.float64) / quant[0]) + quant[1]
            self.values[name] = _sat(quantized, INT8).astype(np.int64)
            return
        dtype = self.records.get(name, {}).get("dtype") or self.graph.tensors[name].dtype
        self.values[name] = np.asarray(value).astype(dtype)

    # walking ----------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any], return_all: bool) -> dict[str, np.ndarray]:
        for name in self.graph.inputs:
            self.store(name, np.asarray(inputs[name], np.float64).reshape(self.graph.tensors[name].shape))
        for node in self.graph.nodes:
            self.node(node)
        names = [name for name in self.values if name in self.graph.tensors] if return_all else list(self.graph.outputs)
        return {name: self.real(name).reshape(self.graph.tensors[name].shape) for name in names}

    def node(self, node: Node) -> None:
        from npuemu.compiler.build_adapt import alias_from_node, split_channels, split_conv_transpose

        if len(node.outputs) == 1 and node.target == "NPU" and alias_from_node(self.graph, node) is not None:
            self.values[node.outputs[0]] = self.values[node.inputs[0]]  # a view: same bytes
            return
        slices = split_channels(self.graph, node) if node.target == "NPU" else None
        if slices is not None:
            for part in slices:
                self.npu(self.graph, part)
            return
        transposed = split_conv_transpose(self.graph, node)
        if transposed is not None:
            graph = copy.copy(self.graph)
            graph.tensors = dict(self.graph.tensors)
            tensors, conv, moves = transposed
            for tensor in tensors:
                graph.tensors[tensor.name] = tensor
            self.conv_with_split(graph, conv)
            for move in moves:  # DepthToSpace and the crop move values; the quantization stays
                source = self.real(move.inputs[0]).reshape(graph.tensors[move.inputs[0]].shape)
                moved = get_op(move.op_type).compute(move.attrs, [source])
                self.store(move.outputs[0], np.asarray(moved, np.float64).reshape(graph.tensors[move.outputs[0]].shape))
            return
        if node.outputs[0] in self.host and node.op_type == "Conv":
            self.conv_with_split(self.graph, node)
            return
        if node.outputs[0] in self.host or node.target != "NPU":
            self.host_node(self.graph, node)
            return
        self.npu(self.graph, node)

    def conv_with_split(self, graph: Graph, conv: Node) -> None:
        """A conv whose LUT activation the build runs on the host (build_adapt.split_lut_activation)."""
        from npuemu.compiler.build_adapt import split_lut_activation
        from npuemu.compiler.ir import Tensor

        split = split_lut_activation(graph, conv)
        if split is None:
            self.npu(graph, conv)
            return
        first, activation, quant = split
        source = graph.tensors[activation.outputs[0]]
        graph = copy.copy(graph)
        graph.tensors = dict(graph.tensors)
        graph.tensors[first.outputs[0]] = Tensor(first.outputs[0], tuple(source.shape), source.dtype, quant=quant)
        self.npu(graph, first)
        self.host_node(graph, activation)

    def host_node(self, graph: Graph, node: Node) -> None:
        def fetch(name: str) -> np.ndarray:
            tensor = graph.tensors[name]
            if tensor.is_const:
                return np.asarray(tensor.data)
            value = self.real(name)
            value = value.astype(np.float64) if value.dtype.kind == "f" else value
            return value.reshape(tensor.shape)

        results = run_node(node, fetch)
        self.store(node.outputs[0], np.asarray(results[0]).reshape(graph.tensors[node.outputs[0]].shape))

    def npu(self, graph: Graph, node: Node) -> None:
        from npuemu.compiler.build_adapt import layer_from_node
        from npuemu.compiler.lower.layers import ActivationLayer, ConcatLayer, ConvLayer, EltwiseLayer, PoolLayer, \
            SliceLayer

        layer = layer_from_node(graph, node, self.platform)
        output = node.outputs[0]
        if getattr(layer, "dtype", "int8") != "int8":  # fp16 layers: float with fp16 storage (not exact)
            self.host_node(graph, node)
            return
        shape = graph.tensors[output].shape
        if isinstance(layer, ConvLayer):
            result = self.conv(layer)
        elif isinstance(layer, EltwiseLayer):
            from npuemu.compiler.lower.lower_eltwise import eltwise_stages

            # a broadcast [1, 1, H, W] operand: its lanes copy is exact (LOWERING.md 16)
            a, b = (np.broadcast_to(self.values[name].reshape(layer.shapes[name]), layer.shape) for name in layer.inputs)
            result = dpu_pipeline(a, eltwise_stages(layer), operand=b)
        elif isinstance(layer, ConcatLayer):
            from npuemu.compiler.lower.lower_eltwise import concat_stages

            parts = [dpu_pipeline(self.values[name].reshape(s), concat_stages(q, layer.output_quant, layer.name))
                     for name, s, q in zip(layer.inputs, layer.shapes, layer.input_quants)]
            result = np.concatenate(parts, axis=0)
        elif isinstance(layer, SliceLayer):
            from npuemu.compiler.lower.lower_eltwise import concat_stages

            x = self.values[layer.input].reshape(layer.input_shape)[layer.start:layer.start + layer.size]
            result = dpu_pipeline(x, concat_stages(layer.input_quant, layer.output_quant, layer.name))
        elif isinstance(layer, ActivationLayer):
            from npuemu.compiler.lower.lower_eltwise import activation_stages

            result = dpu_pipeline(self.values[layer.input].reshape(layer.shape), activation_stages(layer))
        elif isinstance(layer, PoolLayer):
            result = _pool(self.values[layer.input].reshape(layer.input_shape), layer)
        else:  # pragma: no cover - layer_from_node knows these kinds
            raise TypeError(type(layer).__name__)
        self.values[output] = np.asarray(result, np.int64).reshape(shape)

    def conv(self, layer) -> np.ndarray:
        from npuemu.compiler.lower.lower_conv import conv_constants, conv_stages

        constants = conv_constants(layer, self.platform)
        requant = constants.requant
        x = self.values[layer.input].reshape(layer.input_shape)
        zp_w = np.asarray(layer.weight_zero_point, np.int64)
        acc = conv_accumulator(x, layer.weights, layer.input_quant.zero_point, zp_w, layer)
        # the CPEND window sum and the ALU operand together are the input zero point's and the
        # bias's share: acc above is centred, so only the bias is left to add (quant_regs)
        v = acc + np.asarray(layer.bias, np.int64).reshape(-1, 1, 1)
        stages = conv_stages(layer, constants)
        residual = None
        if layer.residual is not None:
            residual = self.values[layer.residual.tensor].reshape(acc.shape)
        mul = np.asarray(requant.mul, np.int64).reshape(-1, 1, 1)
        return dpu_pipeline(v, stages, alu=0, mul=mul, operand=residual)




def _pool(x: np.ndarray, layer) -> np.ndarray:
    """PPU pooling (NUMERICS.md 6): max skips padding; average sums the window (padding at the
    zero point) times RECIP_W * RECIP_H, rounded half away by 2^32."""
    from npuemu.compiler.quant_regs import pool_reciprocal

    channels, height, width = x.shape
    (kh, kw), (sy, sx) = layer.kernel, layer.stride
    top, left, bottom, right = layer.pads
    out_h, out_w = (height + top + bottom - kh) // sy + 1, (width + left + right - kw) // sx + 1
    average = layer.method == "avg"
    pad = layer.quant.zero_point if average else np.iinfo(np.int64).min
    padded = np.full((channels, height + top + bottom, width + left + right), pad, np.int64)
    padded[:, top:top + height, left:left + width] = x
    windows = [padded[:, ky:ky + (out_h - 1) * sy + 1:sy, kx:kx + (out_w - 1) * sx + 1:sx]
               for ky in range(kh) for kx in range(kw)]
    if not average:
        return np.max(windows, axis=0)
    total = np.sum(windows, axis=0)
    return _sat(_rshift(total * pool_reciprocal(kw) * pool_reciprocal(kh), 32, "half_away"), INT8)
