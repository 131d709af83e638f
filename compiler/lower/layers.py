"""What lowering takes in: one fused, quantized (or fp16) layer, independent of the graph IR.

These are small frozen records. A thin adapter from the graph IR builds them; tests build them
directly. Tensors are referenced by name; where a tensor lives (address, NC1HWC2 geometry) is
the business of :mod:`npuemu.compiler.lower.placement`.

Conventions:

- Shapes are NCHW with N = 1; ``pads`` are ``(top, left, bottom, right)`` as ONNX orders them
  for 2-D (``[y_begin, x_begin, y_end, x_end]``).
- int8 tensors are per-tensor asymmetric (``real = scale * (q - zero_point)``); weights are
  per-output-channel asymmetric with ``w_q = round(w / s_w[c]) + zp_w[c]`` over the full int8
  range, as the vendor compiler quantizes them (vendor-corpus README 5).
- ``bias`` is real-valued (float) unless ``bias_in_accumulator_units`` says it is already an
  integer in units of ``s_in * s_w[c]`` (ONNX QLinearConv's int32 bias).
- ``dtype`` is ``"int8"`` or ``"float16"`` (the whole layer computes in it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from npuemu.isa.errors import CompileError

from .. import op_table
from .lut import LUT_KINDS

INT8 = "int8"
FLOAT16 = "float16"
DTYPES = (INT8, FLOAT16)
#: the wider output a conv may write instead of its dtype (DPU OUT_PRECISION int32 / fp32)
WIDE_OUTPUTS = {INT8: "int32", FLOAT16: "float32"}

ACTIVATIONS = ("none", "relu", "relu6", "clip", "leaky_relu", *LUT_KINDS)


@dataclass(frozen=True)
class Quant:
    """Per-tensor affine quantization of an int8 tensor."""

    scale: float
    zero_point: int

    def __post_init__(self) -> None:
        if not (self.scale > 0 and np.isfinite(self.scale)):
            raise CompileError(f"quantization scale must be a positive finite number, got {self.scale}")
        if not -128 <= int(self.zero_point) <= 127:
            raise CompileError(f"int8 zero point {self.zero_point} is outside -128..127")


@dataclass(frozen=True)
class Activation:
    """A fused activation. ``clip`` uses ``low``/``high`` (real units); ``relu6`` is clip(0, 6);
    ``leaky_relu`` multiplies negative values by ``alpha``. The look-up-table kinds
    (``lut.LUT_KINDS``) run in the DPU LUT; ``alpha``/``beta`` are their ONNX attributes
    (Elu alpha, HardSigmoid alpha and beta; None = ONNX default)."""

    kind: str = "none"
    low: float | None = None
    high: float | None = None
    alpha: float | None = 0.0
    beta: float | None = None

    @property
    def uses_lut(self) -> bool:
        return self.kind in LUT_KINDS

    def __post_init__(self) -> None:
        if self.kind not in ACTIVATIONS:
            raise CompileError(f"unsupported fused activation {self.kind!r}; expected one of {', '.join(ACTIVATIONS)}")
        if self.kind == "clip" and (self.low is None or self.high is None or self.low > self.high):
            raise CompileError(f"clip activation needs low <= high, got {self.low}, {self.high}")

    @property
    def bounds(self) -> tuple[float | None, float | None]:
        """(low, high) in real units; None where unbounded."""
        if self.kind == "relu":
            return 0.0, None
        if self.kind == "relu6":
            return 0.0, 6.0
        if self.kind == "clip":
            return self.low, self.high
        return None, None


NO_ACTIVATION = Activation()


@dataclass(frozen=True)
class Residual:
    """A tensor added to a convolution's result. The layer's activation follows the add
    (Conv+Add+Relu, vendor ConvAddRelu) unless ``after_activation`` says the add comes after it
    (Conv+Relu+Add, vendor ConvReluAdd)."""

    tensor: str
    quant: Quant | None = None  # None for float16 layers
    after_activation: bool = False


def _pair(value: int | tuple[int, int], what: str, layer: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or any(int(v) < 1 for v in pair):
        raise CompileError(f"layer {layer}: {what} must be one or two positive integers, got {value!r}")
    return int(pair[0]), int(pair[1])


def _pads(value: tuple[int, int, int, int], layer: str) -> tuple[int, int, int, int]:
    pads = tuple(int(v) for v in value)
    if len(pads) != 4 or any(v < 0 for v in pads):
        raise CompileError(f"layer {layer}: pads must be four non-negative integers (top, left, bottom, right), got {value!r}")
    return pads  # type: ignore[return-value]


def _check_dtype(dtype: str, layer: str) -> None:
    if dtype not in DTYPES:
        raise CompileError(f"layer {layer}: dtype {dtype!r} is not lowered; expected one of {', '.join(DTYPES)}")


@dataclass(frozen=True, eq=False)
class ConvLayer:
    """A 2-D convolution (direct, grouped only as depthwise) with bias, requantization, an
    optional residual add and a fused activation.

    ``weights`` is ``[OC][IC/groups][KH][KW]``: int8 quantized values for int8 layers (with
    ``weight_scale``/``weight_zero_point`` per output channel), float16 values for float16
    layers. ``input_shape`` is (C, H, W).
    """

    name: str
    input: str
    output: str
    input_shape: tuple[int, int, int]
    weights: np.ndarray
    bias: np.ndarray | None = None
    stride: int | tuple[int, int] = 1
    dilation: int | tuple[int, int] = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    groups: int = 1
    weight_scale: np.ndarray | None = None
    weight_zero_point: np.ndarray | None = None
    input_quant: Quant | None = None
    output_quant: Quant | None = None
    activation: Activation = NO_ACTIVATION
    residual: Residual | None = None
    dtype: str = INT8
    bias_in_accumulator_units: bool = False
    weight_tensor: str = ""  # name of the packed weight blob (default "<name>:weights")
    bias_tensor: str = ""  # name of the bias/requant blob (default "<name>:bias")
    # the DPU's OUT_PRECISION when it is wider than ``dtype`` (WIDE_OUTPUTS): int8 -> "int32"
    # (accumulator + bias, no requantization), float16 -> "float32" (no fp16 rounding)
    output_dtype: str = ""
    # a feature map whose bytes are the weight blob, written at run time by an earlier task
    # (attention's MatMul of two activations, LOWERING.md 22.3); ``weights`` then only gives
    # the blob's geometry and no constant is stored
    weight_source: str = ""
    # (s, ry, rx): phase (ry, rx) of a stride-s ConvTranspose (compiler/deconv_phases.py). The
    # output tensor is then the whole (C, s*H, s*W) image and the DPU writes this conv's pixels
    # at (s*y + ry, s*x + rx) (the interleaved write, LOWERING.md 13); () writes as usual.
    # (s, ry, rx, first, width, full width): a column chunk of a 1x1 phase conv - ``input_shape``
    # is the chunk's window of the full-width input (deconv_phases.input_window, LOWERING.md 28)
    # (1, ry, 0, out_h, out_w): stride 1, the conv's rows written plainly from row ry of a taller
    # output as wide as the conv (lower_conv._row_window; ActMatMul's heads, LOWERING.md 41)
    interleave: tuple[int, ...] = ()
    # int8: the largest weight scale of the whole layer a channel group belongs to (its BS MUL and
    # OUT_CVT are the whole layer's, quant_regs.conv_requant; LOWERING.md 28); 0: its own
    requant_scale_max: float = 0.0

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, self.name)
        object.__setattr__(self, "output_dtype", self.output_dtype or self.dtype)
        self._check_output_dtype()
        object.__setattr__(self, "stride", _pair(self.stride, "stride", self.name))
        object.__setattr__(self, "dilation", _pair(self.dilation, "dilation", self.name))
        object.__setattr__(self, "pads", _pads(self.pads, self.name))
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        object.__setattr__(self, "weight_tensor", self.weight_tensor or f"{self.name}:weights")
        object.__setattr__(self, "bias_tensor", self.bias_tensor or f"{self.name}:bias")
        weights = np.asarray(self.weights)
        if weights.ndim != 4:
            raise CompileError(f"layer {self.name}: weights must be [OC][IC/groups][KH][KW], got shape {weights.shape}")
        channels = self.input_shape[0]
        if len(self.input_shape) != 3 or min(self.input_shape) < 1:
            raise CompileError(f"layer {self.name}: input shape must be (C, H, W), got {self.input_shape}")
        if self.groups != 1 and (self.groups != channels or weights.shape[0] != channels):
            raise CompileError(
                f"layer {self.name}: only groups=1 and depthwise (groups = channels = output channels) are lowered, "
                f"got groups={self.groups} for {channels} input and {weights.shape[0]} output channels"
            )
        if weights.shape[1] * self.groups != channels:
            raise CompileError(
                f"layer {self.name}: weights have {weights.shape[1]} input channels per group, the input has "
                f"{channels} channels in {self.groups} group(s)"
            )
        if self.dtype == INT8:
            self._check_int8(weights)
        if self.bias is not None and np.asarray(self.bias).shape != (weights.shape[0],):
            raise CompileError(f"layer {self.name}: bias must have {weights.shape[0]} values, got shape {np.shape(self.bias)}")
        if self.output_shape[1] < 1 or self.output_shape[2] < 1:
            raise CompileError(f"layer {self.name}: the kernel does not fit the padded input (output {self.output_shape})")
        if self.weight_source:
            self._check_runtime_weights(weights)

    def _check_runtime_weights(self, weights: np.ndarray) -> None:
        # [I] for these geometries the float16 blob of W[o][c] is the NC1HWC2 bytes of a
        # [c <= 8][1][o] map (isa.weight_layout FP16_CONV: 8 o + c), LOWERING.md 22.3
        out_channels, in_channels, kernel_h, kernel_w = weights.shape
        if self.dtype != FLOAT16 or self.groups != 1 or (kernel_h, kernel_w) != (1, 1) or in_channels > 8 \
                or out_channels % 2:
            raise CompileError(f"layer {self.name}: weights read from feature map {self.weight_source!r} need a "
                               f"float16 1x1 conv of at most 8 input channels and an even number of kernels, got "
                               f"{self.dtype} {list(weights.shape)}")

    def _check_output_dtype(self) -> None:
        if self.output_dtype == self.dtype:
            return
        if WIDE_OUTPUTS.get(self.dtype) != self.output_dtype:
            raise CompileError(f"layer {self.name}: output_dtype {self.output_dtype!r} is not available to "
                               f"{self.dtype} layers (they write {self.dtype} or {WIDE_OUTPUTS.get(self.dtype)})")
        if self.activation.kind != "none" or self.residual is not None:
            raise CompileError(f"layer {self.name}: an {self.output_dtype} output takes no fused activation or "
                               f"residual (lowered for the Matmul API's plain product only)")

    @property
    def wide_output(self) -> bool:
        return self.output_dtype != self.dtype

    def _check_int8(self, weights: np.ndarray) -> None:
        if weights.dtype != np.int8:
            raise CompileError(f"layer {self.name}: int8 layers need int8 weights, got {weights.dtype}")
        if self.input_quant is None or (self.output_quant is None and not self.wide_output):
            raise CompileError(f"layer {self.name}: int8 layers need input and output quantization")
        for what, value in (("weight_scale", self.weight_scale), ("weight_zero_point", self.weight_zero_point)):
            if value is None or np.shape(value) != (weights.shape[0],):
                raise CompileError(f"layer {self.name}: {what} must have one value per output channel ({weights.shape[0]})")
        if not np.all(np.asarray(self.weight_scale) > 0):
            raise CompileError(f"layer {self.name}: weight scales must be positive")
        if self.residual is not None and self.residual.quant is None:
            raise CompileError(f"layer {self.name}: an int8 residual needs its quantization")

    # -- derived geometry -----------------------------------------------------------------
    @property
    def depthwise(self) -> bool:
        """One filter per channel (groups = channels = output channels > 1)."""
        return self.groups > 1

    @property
    def out_channels(self) -> int:
        return int(np.shape(self.weights)[0])

    @property
    def in_channels(self) -> int:
        return self.input_shape[0]

    @property
    def kernel(self) -> tuple[int, int]:
        """(KH, KW)."""
        shape = np.shape(self.weights)
        return int(shape[2]), int(shape[3])

    @property
    def effective_kernel(self) -> tuple[int, int]:
        """Kernel extent with dilation: (KH - 1) * DY + 1, (KW - 1) * DX + 1."""
        (kh, kw), (dy, dx) = self.kernel, self.dilation
        return (kh - 1) * dy + 1, (kw - 1) * dx + 1

    @property
    def output_shape(self) -> tuple[int, int, int]:
        """(OC, OH, OW)."""
        _, height, width = self.input_shape
        (ekh, ekw), (sy, sx) = self.effective_kernel, self.stride
        top, left, bottom, right = self.pads
        return (self.out_channels, (height + top + bottom - ekh) // sy + 1, (width + left + right - ekw) // sx + 1)


@dataclass(frozen=True, eq=False)
class FcLayer:
    """A fully connected layer ``y = W x + b`` on ``x`` of length K, lowered as a 1x1
    convolution on [1, K, 1, 1] (vendor-corpus README 3.3: MatMul/Gemm become a 1x1 Conv).
    ``weights`` is ``[N][K]``."""

    name: str
    input: str
    output: str
    weights: np.ndarray
    bias: np.ndarray | None = None
    weight_scale: np.ndarray | None = None
    weight_zero_point: np.ndarray | None = None
    input_quant: Quant | None = None
    output_quant: Quant | None = None
    activation: Activation = NO_ACTIVATION
    dtype: str = INT8
    bias_in_accumulator_units: bool = False
    weight_tensor: str = ""
    bias_tensor: str = ""

    def as_conv(self) -> ConvLayer:
        weights = np.asarray(self.weights)
        if weights.ndim != 2:
            raise CompileError(f"layer {self.name}: FC weights must be [N][K], got shape {weights.shape}")
        return ConvLayer(
            name=self.name, input=self.input, output=self.output, input_shape=(weights.shape[1], 1, 1),
            weights=weights.reshape(weights.shape + (1, 1)), bias=self.bias, weight_scale=self.weight_scale,
            weight_zero_point=self.weight_zero_point, input_quant=self.input_quant,
            output_quant=self.output_quant, activation=self.activation, dtype=self.dtype,
            bias_in_accumulator_units=self.bias_in_accumulator_units, weight_tensor=self.weight_tensor,
            bias_tensor=self.bias_tensor,
        )


ELTWISE_OPS = tuple(op_table.eltwise_ops().values())  # add, sub, mul, max, min (compiler/op_table.py)


@dataclass(frozen=True)
class LaneBroadcast:
    """An element-wise layer's second input is a (1, H, W) map broadcast over the C channels: it is
    first replicated into every lane of one surface of ``tensor`` ((lanes, H, W), lanes = the
    chip's C2), which the element-wise task reads for every surface (LOWERING.md 16)."""

    tensor: str
    lanes: int


@dataclass(frozen=True)
class EltwiseLayer:
    """``out = a <op> b`` for two tensors of the same (C, H, W) shape, ``b`` of shape (1, H, W)
    broadcast over the channels (``broadcast``), or ``b`` of shape (C, 1, 1) broadcast over H x W
    (``channel_gate``: the SE block's gate, read by the ERDMA's per-channel mode, LOWERING.md 17).
    ``gate_first``: Sub with the gate as the minuend, ``out = b - a`` (a the map, BS negates it,
    LOWERING.md 33.2)."""

    name: str
    op: str
    inputs: tuple[str, str]
    output: str
    shape: tuple[int, int, int]
    input_quants: tuple[Quant, Quant] | None = None
    output_quant: Quant | None = None
    activation: Activation = NO_ACTIVATION
    dtype: str = INT8
    broadcast: LaneBroadcast | None = None
    channel_gate: bool = False
    gate_first: bool = False

    @property
    def shapes(self) -> dict[str, tuple[int, int, int]]:
        """(C, H, W) of every tensor the layer reads or writes (a broadcast's lanes tensor too)."""
        channels, height, width = self.shape
        shapes = {self.inputs[0]: self.shape, self.output: self.shape}
        if self.channel_gate:
            return shapes | {self.inputs[1]: (channels, 1, 1)}
        if self.broadcast is None:
            return shapes | {self.inputs[1]: self.shape}
        return shapes | {self.inputs[1]: (1, height, width), self.broadcast.tensor: (self.broadcast.lanes, height, width)}

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, self.name)
        if self.op not in ELTWISE_OPS:
            raise CompileError(f"layer {self.name}: element-wise op {self.op!r} is not lowered; expected one of {', '.join(ELTWISE_OPS)}")
        object.__setattr__(self, "shape", tuple(int(v) for v in self.shape))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if len(self.inputs) != 2:
            raise CompileError(f"layer {self.name}: element-wise layers take two inputs, got {len(self.inputs)}")
        if self.dtype == INT8 and (self.input_quants is None or self.output_quant is None):
            raise CompileError(f"layer {self.name}: int8 element-wise layers need input and output quantization")
        if self.channel_gate and self.broadcast is not None:
            raise CompileError(f"layer {self.name}: an element-wise operand broadcasts over the channels or over "
                               f"H x W, not both")
        if self.gate_first and not (self.channel_gate and self.op == "sub"):
            raise CompileError(f"layer {self.name}: only a Sub of a [C, 1, 1] gate minus a map takes the gate first")


class SameShape:
    """For a layer whose ``shape`` field (C, H, W) is both its input's and its output's."""

    shape: tuple[int, int, int]  # (a plain base: the dataclass below declares the field)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.shape

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return self.shape


@dataclass(frozen=True)
class ActivationLayer(SameShape):
    """A standalone activation on one int8 tensor: a DPU-only task - LUT kinds as the vendor's
    rep10, ReLU / clip / LeakyRelu in the BN stage."""

    name: str
    input: str
    output: str
    shape: tuple[int, int, int]
    input_quant: Quant | None  # None for float16
    output_quant: Quant | None
    activation: Activation
    dtype: str = "int8"  # "float16": a LUT kind (lower_conv.lut_stages_fp16) or ReLU/clip/leaky (LOWERING.md 28)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(v) for v in self.shape))
        if self.activation.kind == "none":
            raise CompileError(f"layer {self.name}: a standalone activation layer needs an activation")


@dataclass(frozen=True)
class JoinedLayer:
    """The fields and checks shared by layers that join their inputs into one output (ConcatLayer,
    lower_flat_concat.FlatConcatLayer): one shape and quantization per input, and int8
    quantization everywhere in int8 builds. ``WHAT`` names the kind in errors."""

    WHAT: ClassVar[str] = "join"
    name: str
    inputs: tuple[str, ...]
    output: str
    shapes: tuple[tuple[int, int, int], ...]
    input_quants: tuple[Quant | None, ...]
    output_quant: Quant | None
    dtype: str = INT8

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, self.name)
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "shapes", tuple(tuple(int(v) for v in shape) for shape in self.shapes))
        object.__setattr__(self, "input_quants", tuple(self.input_quants))
        if not self.inputs or len(self.inputs) != len(self.shapes) or len(self.inputs) != len(self.input_quants):
            raise CompileError(f"layer {self.name}: a {self.WHAT} needs one shape and quantization per input")
        if self.dtype == INT8 and (self.output_quant is None or None in self.input_quants):
            raise CompileError(f"layer {self.name}: an int8 {self.WHAT} needs the quantization of every input and "
                               f"the output")


@dataclass(frozen=True)
class ConcatLayer(JoinedLayer):
    """Channel concatenation: one DPU-only copy task per input that writes it (int8: requantized)
    into its channel slice of the output (every input but the last must fill whole C2 groups,
    so the slices start on surface boundaries). float16 concats copy without quantization
    (``input_quants`` all None, ``output_quant`` None)."""

    WHAT: ClassVar[str] = "concat"

    def __post_init__(self) -> None:
        super().__post_init__()
        if len({shape[1:] for shape in self.shapes}) != 1:
            raise CompileError(f"layer {self.name}: concat inputs differ in height/width: {list(self.shapes)}")

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return sum(shape[0] for shape in self.shapes), self.shapes[0][1], self.shapes[0][2]


@dataclass(frozen=True)
class SliceLayer:
    """Channels [start, start + size) of an int8 tensor copied (and requantized) into their own
    tensor: one output of a channel Split, a DPU-only task (the mirror of ConcatLayer)."""

    name: str
    input: str
    output: str
    input_shape: tuple[int, int, int]
    start: int
    size: int
    input_quant: Quant | None  # None for float16
    output_quant: Quant | None
    dtype: str = INT8

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, self.name)
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        if not (0 <= self.start and self.size > 0 and self.start + self.size <= self.input_shape[0]):
            raise CompileError(f"layer {self.name}: channels [{self.start}, {self.start + self.size}) are not "
                               f"inside the input's {self.input_shape[0]}")

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return self.size, self.input_shape[1], self.input_shape[2]


POOL_METHODS = ("max", "avg")


@dataclass(frozen=True)
class PoolLayer:
    """Max or average pooling on the PPU. Average pooling counts padded positions (ONNX
    ``count_include_pad=1``); the vendor runs ``count_include_pad=0`` with padding on the CPU
    (vendor-corpus README 3.2), and so do we (CompileError here)."""

    name: str
    method: str
    input: str
    output: str
    input_shape: tuple[int, int, int]
    kernel: int | tuple[int, int]
    stride: int | tuple[int, int] = 1
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    quant: Quant | None = None  # shared by input and output: the PPU does not requantize
    count_include_pad: bool = True
    dtype: str = INT8

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, self.name)
        if self.method not in POOL_METHODS:
            raise CompileError(f"layer {self.name}: pooling method {self.method!r} is not lowered; expected max or avg")
        object.__setattr__(self, "kernel", _pair(self.kernel, "kernel", self.name))
        object.__setattr__(self, "stride", _pair(self.stride, "stride", self.name))
        object.__setattr__(self, "pads", _pads(self.pads, self.name))
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        if self.method == "avg" and any(self.pads) and not self.count_include_pad:
            raise CompileError(
                f"layer {self.name}: average pooling with padding and count_include_pad=0 has no PPU mode "
                "(the vendor runs it on the CPU)"
            )
        if self.dtype == INT8 and self.quant is None:
            raise CompileError(f"layer {self.name}: int8 pooling needs the tensor quantization")
        if min(self.output_shape[1:]) < 1:
            raise CompileError(f"layer {self.name}: the window does not fit the padded input")

    @property
    def output_shape(self) -> tuple[int, int, int]:
        channels, height, width = self.input_shape
        (kh, kw), (sy, sx) = self.kernel, self.stride
        top, left, bottom, right = self.pads
        return channels, (height + top + bottom - kh) // sy + 1, (width + left + right - kw) // sx + 1


@dataclass(frozen=True)
class ResizeLayer:
    """Nearest-neighbour upsampling by whole factors (fy, fx): every input pixel copied into an
    fy x fx block, one DPU-only unpooling task per C2 surface (lower_resize.py, LOWERING.md 19).
    The bytes move unchanged, so input and output share their quantization (``quant``; None for
    float16)."""

    name: str
    input: str
    output: str
    input_shape: tuple[int, int, int]
    factors: tuple[int, int]  # (fy, fx)
    quant: Quant | None = None
    dtype: str = INT8
    # > 0: not an upsampling but the input edge-padded by this many pixels on every side (factors
    # 1 x 1), the first part of a bilinear Resize (passes/resize_bilinear.py, LOWERING.md 19.1)
    edge_pad: int = 0

    def __post_init__(self) -> None:
        _check_dtype(self.dtype, self.name)
        object.__setattr__(self, "input_shape", tuple(int(v) for v in self.input_shape))
        object.__setattr__(self, "factors", tuple(int(v) for v in self.factors))
        if self.dtype == INT8 and self.quant is None:
            raise CompileError(f"layer {self.name}: an int8 resize needs the tensor quantization")
        if self.edge_pad and self.factors != (1, 1):
            raise CompileError(f"layer {self.name}: an edge-padded copy has factors 1 x 1")

    @property
    def output_shape(self) -> tuple[int, int, int]:
        channels, height, width = self.input_shape
        pad = 2 * self.edge_pad
        return channels, height * self.factors[0] + pad, width * self.factors[1] + pad


Layer = ConvLayer | FcLayer | EltwiseLayer | PoolLayer | ActivationLayer | ConcatLayer | SliceLayer | ResizeLayer
