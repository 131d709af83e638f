"""What each op is to this compiler, declared once: one :class:`OpRow` per op type.

A row says where the op comes from (ONNX import, a fusion, the build), whether it can run on
the NPU and under which partition rules, how the build makes its NPU record, which role it
plays in the conv fusions, whether the runtime has it as a host step, its DPU look-up-table
function, and the independent reference its tests check it against. The scattered lists the
compiler used to keep (element-wise ops, LUT activations, host ops, fusable extras, the
partition's op groups) are derived from :data:`ROWS`; ``compiler/ADDING_AN_OP.md`` is the
recipe for a new op.

This module imports nothing from the compiler, so ``lower``, ``passes`` and the build can all
read it without import cycles. What the words in a row mean:

- ``npu``: the partition's rule group (``passes/partition.py`` ``RULES``: the unit and the
  constraints every such layer must meet); None: always a host step.
- ``lowering``: how the build makes the NPU record (:data:`LOWERINGS`; the builders are
  ``build_adapt.LAYER_BUILDERS``); None: no NPU record of its own.
- ``fusion``: :data:`FUSION_ROLES`.
- ``host``: the runtime has a host-side implementation (``emulator/cpu_ops*.py``), so the op may
  be a ``cpu`` schedule step.
- ``lut``: the ``compiler/lower/lut.py`` function kind, with ``lut_attrs`` the ONNX attributes
  that function takes (Elu's alpha; HardSigmoid's alpha and beta).
- ``reference``: ``module:callable`` of the reference its tests compare with.
"""

from __future__ import annotations

from dataclasses import dataclass

#: where an op type comes from
ORIGINS = {
    "onnx": "an ONNX op the importer registers (compiler/ops)",
    "composite": "made by a fusion, registered by compiler/passes/composite_ops.py",
    "internal": "made by a later stage (quantization's DataConvert, the build's records), never imported",
}

#: NPU lowering kinds: how build_adapt turns an NPU node into a record
LOWERINGS = {
    "conv": "a ConvLayer (CNA -> CORE -> DPU tasks, lower/lower_conv.py)",
    "conv_phases": "a Conv per stride phase writing interleaved (DPU), where the pads crop of the rows kept "
                   "(deconv_crop.py); a cropped phase 1 wide, or RK356x's 8-byte atoms: one phase Conv plus "
                   "host DepthToSpace/crop (build_adapt.split_conv_transpose)",
    "as_conv": "runs as a Conv after the -O3 rewrite fully_connected_as_conv (not built as itself)",
    "eltwise": "an EltwiseLayer (DPU BS/EW stage, lower/lower_eltwise.py; a [1,C,1,1] gate through the ERDMA per channel)",
    "activation": "an ActivationLayer without the LUT (DPU BS stage ReLU/clip), int8 only",
    "lut": "an ActivationLayer through the DPU look-up table (lower/lut.py), int8 and float16",
    "pool": "a PoolLayer (PPU, lower/lower_pool.py)",
    "concat": "a ConcatLayer (by address or DPU copies)",
    "flat_concat": "a FlatConcatLayer: one DPU copy per input into its columns (lower/lower_flat_concat.py)",
    "split": "one ChannelSlice node per output (build_adapt.split_channels)",
    "slice": "a SliceLayer (a DPU copy of a channel range)",
    "alias": "an Alias: the output views the input's bytes (build_adapt.alias_from_node)",
    "resize": "a ResizeLayer (DPU-only unpooling tasks: nearest by whole factors, lower/lower_resize.py); "
              "bilinear: an edge-padded copy + depthwise phase convs (passes/resize_bilinear.py)",
    "convert": "a ConvertLayer: one DPU-only task, int8 <-> fp16 (lower/lower_convert.py; a host step where "
               "passes/lower_data_convert.host_reason names a limit)",
    "transpose": "a TransposeLayer: DPU-only moves - H <-> W one copy per C1 surface, the other perms keeping N "
                 "the vendor's TP_EN / TP_ORG_EN chains with a scratch tensor (lower/lower_transpose.py, "
                 "transpose_perms.py)",
}

#: roles in the conv fusions (passes/fusion_rules.py, fuse_activation.py, fuse_add.py, fuse_pad.py)
FUSION_ROLES = {
    "conv": "a main op post-ops fuse into (the CNA convolution family)",
    "activation": "fuses into a conv as Act where the chip's fusion.activations names it",
    "activation_always": "fuses into a conv as Act on every chip (a DPU LUT function the chips' lists leave out)",
    "residual": "fuses into a conv as its residual add (or its bias add)",
    "pad": "folds into a conv's pads",
}

_KIT = "npuemu.tools.testing_reference"
REF_CONV, REF_POOL, REF_ELTWISE = f"{_KIT}:reference_conv", f"{_KIT}:reference_pool", f"{_KIT}:reference_eltwise"
REF_ACTIVATION, REF_COPY, REF_HOST = f"{_KIT}:reference_activation", f"{_KIT}:reference_copy", f"{_KIT}:reference_host"
REF_LUT = "tests.compiler.test_lower_lut:float_function"  # the LUT functions written again from ONNX
REF_ONNXRUNTIME = "tests.emulator.test_cpu_ops_onnx:reference"  # host steps against onnxruntime


@dataclass(frozen=True)
class OpRow:
    """One op type and everything the compiler decides by it (module docstring)."""

    op: str
    origin: str = "onnx"
    npu: str | None = None
    lowering: str | None = None
    fusion: str | None = None
    host: bool = True
    lut: str | None = None
    lut_attrs: tuple[str, ...] = ()
    eltwise: str | None = None  # the EltwiseLayer op ("add", ...)
    reference: str | None = REF_ONNXRUNTIME

    def __post_init__(self) -> None:
        # a typo in the table fails at import, not as a silent miss in a derived list
        checks = ((self.origin, ORIGINS), (self.lowering, LOWERINGS), (self.fusion, FUSION_ROLES))
        for value, allowed in checks:
            if value is not None and value not in allowed:
                raise ValueError(f"op table row {self.op}: {value!r} is not one of {', '.join(allowed)}")
        named = (self.lut is not None, self.eltwise is not None)
        if named != (self.lowering == "lut", self.lowering == "eltwise"):
            raise ValueError(f"op table row {self.op}: lut/eltwise name and lowering {self.lowering!r} disagree")


def _host_only(*ops: str, reference: str = REF_ONNXRUNTIME, origin: str = "onnx") -> tuple[OpRow, ...]:
    return tuple(OpRow(op, origin, reference=reference) for op in ops)


def _lut(op: str, kind: str, fusion: str = "activation", attrs: tuple[str, ...] = (), origin: str = "onnx") -> OpRow:
    return OpRow(op, origin, "lut", "lut", fusion, lut=kind, lut_attrs=attrs, reference=REF_LUT)


def _view(op: str) -> OpRow:
    return OpRow(op, npu="view", lowering="alias", reference=None)  # no bytes move: nothing to compare


#: Every op the compiler knows. Order matters where a derived list is shown (the partition's
#: groups in SUPPORT.md, the fusable LUT extras): keep a group's rows together.
ROWS: tuple[OpRow, ...] = (
    OpRow("Conv", npu="conv", lowering="conv", fusion="conv", reference=REF_CONV),
    OpRow("ConvTranspose", npu="conv_transpose", lowering="conv_phases", fusion="conv", reference=REF_CONV),
    OpRow("FullyConnected", "composite", "fully_connected", "as_conv", "conv", reference=REF_CONV),
    OpRow("Add", npu="eltwise", lowering="eltwise", fusion="residual", eltwise="add", reference=REF_ELTWISE),
    OpRow("Sub", npu="eltwise", lowering="eltwise", eltwise="sub", reference=REF_ELTWISE),
    OpRow("Mul", npu="eltwise", lowering="eltwise", eltwise="mul", reference=REF_ELTWISE),
    OpRow("Div", npu="eltwise"),  # by a constant only (constraints.eltwise_operands); no record of its own
    # on the NPU as a [1,C,1,1] gate only (constraints.eltwise_operands, LOWERING.md 28)
    OpRow("Max", npu="eltwise", lowering="eltwise", eltwise="max", reference=REF_ELTWISE),
    OpRow("Min", npu="eltwise", lowering="eltwise", eltwise="min", reference=REF_ELTWISE),
    OpRow("Relu", npu="relu", lowering="activation", fusion="activation", reference=REF_ACTIVATION),
    OpRow("Clip", npu="relu", lowering="activation", fusion="activation", reference=REF_ACTIVATION),
    OpRow("LeakyRelu", npu="relu", lowering="activation", fusion="activation", reference=REF_ACTIVATION),
    OpRow("PRelu", npu="prelu", fusion="activation", reference=REF_CONV),  # lowered fused into a conv only
    _lut("Sigmoid", "sigmoid"),
    _lut("Tanh", "tanh"),
    _lut("Elu", "elu", attrs=("alpha",)),
    _lut("Silu", "silu", origin="composite"),
    _lut("HardSwish", "hard_swish", "activation_always"),
    _lut("HardSigmoid", "hard_sigmoid", "activation_always", ("alpha", "beta")),
    _lut("Gelu", "gelu"),
    _lut("Softplus", "softplus"),
    # 1/sqrt and its float16 pieces, made by passes/lower_rsqrt.py (LOWERING.md 24); no fusion
    _lut("Rsqrt", "rsqrt", None, ("alpha", "beta"), "composite"),
    OpRow("MaxPool", npu="pool", lowering="pool", reference=REF_POOL),
    OpRow("AveragePool", npu="pool", lowering="pool", reference=REF_POOL),
    OpRow("GlobalAveragePool", npu="global_pool", lowering="pool", reference=REF_POOL),
    OpRow("GlobalMaxPool", npu="global_pool", lowering="pool", reference=REF_POOL),
    OpRow("Concat", npu="concat_split", lowering="concat", reference=REF_COPY),
    OpRow("Split", npu="concat_split", lowering="split", reference=REF_COPY),
    OpRow("ChannelSlice", "internal", lowering="slice", host=False, reference=REF_COPY),
    _view("Reshape"), _view("Flatten"), _view("Squeeze"), _view("Unsqueeze"),
    OpRow("FlatConcat", "composite", npu="flat_concat", lowering="flat_concat", host=False,  # LOWERING.md 29
          reference="tests.compiler.test_flat_concat_npu:reference_flat_concat"),
    OpRow("Readout", "composite", npu="readout", host=False,  # a graph output the runtime permutes (LOWERING.md 25)
          reference="tests.compiler.test_output_readout:reference_readout"),
    OpRow("Readin", "composite", npu="readin", host=False,  # a graph input the runtime permutes (LOWERING.md 33.4)
          reference="tests.compiler.test_input_readin:reference_readin"),
    # on the NPU only as the layers a graph pass rewrites them into (passes/rewritten_ops.py, LOWERING.md 32)
    OpRow("Pad", npu="rewritten", fusion="pad"),
    OpRow("Slice", npu="rewritten"), OpRow("Pow", npu="rewritten"), OpRow("Sqrt", npu="rewritten"),
    OpRow("ReduceMean", npu="rewritten"), OpRow("Gather", npu="rewritten"),
    OpRow("DataConvert", "internal", lowering="convert",  # int8 <-> float16 at hybrid boundaries (LOWERING.md 26)
          reference="tests.compiler.test_data_convert_npu:reference_convert"),
    OpRow("Constant", "internal"),  # a graph output the import folded to a constant
    OpRow("Resize", npu="resize", lowering="resize",  # nearest / bilinear by whole factors (LOWERING.md 19)
          reference="tests.compiler.test_resize_npu:reference_nearest"),
    OpRow("Softmax", npu="softmax", reference=REF_HOST),  # fp16, channel axis: convs + LUTs (passes/lower_softmax)
    OpRow("HeadAttention", "composite", npu="attention", host=False,  # convs + 22.2 at build stage 5 (lower_attention)
          reference="tests.compiler.test_attention_npu:reference_attention"),
    *_host_only("DepthToSpace", reference=REF_HOST),
    OpRow("SpaceToDepth", npu="space_to_depth"),  # at -O3 a 0/1 stride-b conv (passes/space_to_depth.py, LOWERING.md 33.1)
    OpRow("Glu", "composite", npu="glu",  # Split + Sigmoid + Mul at build stage 5 (passes/lower_glu.py)
          reference="tests.compiler.test_glu_npu:reference_glu"),
    OpRow("Transpose", npu="transpose", lowering="transpose",  # perms keeping N: DPU moves (LOWERING.md 35, 36)
          reference=f"{_KIT}:reference_transpose"),
    # of two activations: an ActMatMul where passes/matmul_act_npu.py finds the layouts (LOWERING.md 37)
    OpRow("MatMul", npu="matmul_act"),
    OpRow("ActMatMul", "composite", npu="matmul_act", host=False,  # run-time-weight convs at build stage 5
          reference="tests.compiler.test_matmul_activations_npu:reference_act_matmul"),
    *_host_only("LayerNormalization", "Gemm", "BatchNormalization", "Exp",
                "Erf", "Abs", "Neg", "Floor", "Ceil", "Round", "Reciprocal", "Log", "Sign", "Not", "Equal", "Less",
                "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where", "Cast"),
    *_host_only("ReduceSum", "ReduceMin", "ReduceMax", "ReduceProd", "ArgMax"),
    *_host_only("Expand", "Tile", "Identity", "Dropout"),
    # unrolled into NPU layers (passes/lstm_npu.py, LOWERING.md 30, 31), else a host step
    OpRow("LSTM", npu="recurrent"),
    OpRow("GRU", npu="recurrent"),  # passes/gru_npu.py, LOWERING.md 31.3
    OpRow("RNN", npu="recurrent"),  # passes/recurrent_rnn.py, LOWERING.md 31.4
)

#: ops the importer accepts that never reach the compiler's graph as themselves
IMPORT_ONLY = {
    "ConstantOfShape": "fold-only: accepted where it folds to a constant",
    "Range": "fold-only: accepted where it folds to a constant",
    "Shape": "fold-only: accepted where it folds to a constant",
    "Size": "fold-only: accepted where it folds to a constant",
    "QuantizeLinear": "QDQ: folded into int8 parameters (passes/fold_qdq.py); a lone one is unsupported",
    "DequantizeLinear": "QDQ: folded into int8 parameters (passes/fold_qdq.py); a lone one is unsupported",
    "Upsample": "imported as Resize",
}

BY_OP: dict[str, OpRow] = {row.op: row for row in ROWS}


def row(op_type: str) -> OpRow | None:
    """The row of ``op_type``, None for an op the compiler does not know."""
    return BY_OP.get(op_type)


def lowering(op_type: str) -> str | None:
    """The NPU lowering kind of ``op_type`` (:data:`LOWERINGS`), None if it has none."""
    entry = BY_OP.get(op_type)
    return None if entry is None else entry.lowering


def ops_lowered_as(kind: str) -> tuple[str, ...]:
    """Ops whose NPU lowering is ``kind``, in table order."""
    return tuple(entry.op for entry in ROWS if entry.lowering == kind)


def npu_group(group: str) -> tuple[str, ...]:
    """Ops of the partition's rule group ``group``, in table order."""
    return tuple(entry.op for entry in ROWS if entry.npu == group)


def npu_groups() -> tuple[str, ...]:
    """The partition rule groups the table uses, in order of first use."""
    return tuple(dict.fromkeys(entry.npu for entry in ROWS if entry.npu is not None))


def fusion_role(role: str) -> tuple[str, ...]:
    """Ops with fusion role ``role`` (:data:`FUSION_ROLES`), in table order."""
    return tuple(entry.op for entry in ROWS if entry.fusion == role)


def onnx_lut_kinds() -> dict[str, str]:
    """ONNX op type (or composite op) -> its LUT function kind (lower/lut.py)."""
    return {entry.op: entry.lut for entry in ROWS if entry.lut is not None}


def eltwise_ops() -> dict[str, str]:
    """ONNX op type -> the EltwiseLayer op of each element-wise op the build lowers."""
    return {entry.op: entry.eltwise for entry in ROWS if entry.eltwise is not None}


def host_ops() -> frozenset[str]:
    """Ops a ``cpu`` schedule step may name (the runtime's host-side operators)."""
    return frozenset(entry.op for entry in ROWS if entry.host)


__all__ = ["BY_OP", "FUSION_ROLES", "IMPORT_ONLY", "LOWERINGS", "ORIGINS", "OpRow", "ROWS", "eltwise_ops",
           "fusion_role", "host_ops", "lowering", "npu_group", "npu_groups", "onnx_lut_kinds", "ops_lowered_as", "row"]
