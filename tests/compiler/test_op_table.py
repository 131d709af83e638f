"""The op table (compiler/op_table.py): every op the importer knows has a row, every LUT kind a
program and an emulator path, every reference resolves, and the lists derived from the table are
exactly the ones they replaced (compiler/ADDING_AN_OP.md)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import npuemu.compiler.passes  # noqa: F401 (registers the composite ops)
import npuemu.compiler.quant.convert_op  # noqa: F401 (registers DataConvert)
from npuemu.compiler import build_adapt, build_host, layer_records, op_table
from npuemu.compiler.ir import Node
from npuemu.compiler.lower import layers, lut
from npuemu.compiler.ops import REGISTRY
from npuemu.compiler.passes import fusion_rules, match
from npuemu.emulator.cpu_ops import OPS as HOST_RUNTIME
from npuemu.isa.errors import UnsupportedOpError
from npuemu.platforms import list_platforms, load_platform

partition = importlib.import_module("npuemu.compiler.passes.partition")  # the package exports a function of that name

OLD_LUT_KINDS = {"Sigmoid": "sigmoid", "Tanh": "tanh", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish",
                 "Silu": "silu", "Elu": "elu", "Gelu": "gelu", "Softplus": "softplus"}
OLD_ELTWISE = {"Add": "add", "Sub": "sub", "Mul": "mul", "Max": "max", "Min": "min"}
OLD_CPU_OPS = {
    "Softmax", "Sigmoid", "Relu", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "DepthToSpace",
    "DataConvert", "Elu", "Gelu", "Softplus", "Silu", "Glu", "LayerNormalization", "MatMul", "Gemm", "Div", "Pow",
    "Sqrt", "Exp", "Erf", "ReduceSum", "ReduceMin", "Resize", "Concat", "ReduceMean", "ReduceMax", "ArgMax",
    "HardSigmoid", "HardSwish", "Tanh", "Add", "Sub", "Mul", "Max", "Min", "Abs", "Neg", "Floor", "Ceil", "Round",
    "Reciprocal", "Log", "Sign", "Not", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
    "Xor", "Where", "Cast", "Clip", "LeakyRelu", "PRelu", "ReduceProd", "BatchNormalization", "Slice", "Pad",
    "Gather", "Expand", "Tile", "Split", "Identity", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "Dropout", "Conv", "ConvTranspose", "FullyConnected", "Constant"}
OLD_NPU_OPS = (
    (("Conv",), "CNA convolution, DPU bias/activation/residual"),
    (("ConvTranspose",), "CNA convs of its stride phases written interleaved by the DPU, also where the pads crop "
                        "(one conv per phase of the kept rows, LOWERING.md 40); a stacked conv plus host DepthToSpace "
                        "and crop where the phase writes cannot (RK356x atoms, 1-pixel phases)"),
    (("FullyConnected",), "CNA 1x1 convolution on [1,K,1,1]"),
    (("Add", "Sub", "Mul", "Div", "Max", "Min"), "DPU element-wise (BS/EW stage)"),  # Max/Min: gates (LOWERING.md 28)
    (("Relu", "Clip", "LeakyRelu"), "DPU BS stage (ReLU/clip)"),
    (("PRelu",), "DPU BS stage (PReLU)"),
    (("Sigmoid", "Tanh", "Elu", "Silu", "HardSwish", "HardSigmoid", "Gelu", "Softplus", "Rsqrt"),  # + 1/sqrt (LOWERING 24)
     "DPU look-up table"),
    (("MaxPool", "AveragePool"), "PPU pooling"),
    (("GlobalAveragePool", "GlobalMaxPool"), "PPU pooling over the plane"),
    (("Concat", "Split"), "by address / DPU copy"),
    (("Glu",), "DPU look-up table (sigmoid) + DPU element-wise Mul, halves by address"),
    (("Softmax",), "CNA 1x1 convs + DPU look-up tables (pairwise log-sum-exp over the channels; over 512 channels "
                   "max, e^d, sum and 1/sum, LOWERING.md 25)"),
    (("HeadAttention",), "CNA 1x1 convs with run-time weights + the softmax chain, per head"),  # LOWERING.md 22.3
    (("Resize",), "DPU unpooling (nearest, whole factors); bilinear: DPU edge copies + depthwise phase convs"),  # issue 18 item 3 (LOWERING.md 19)
    (("Reshape", "Flatten", "Squeeze", "Unsqueeze"), "by address (no data moved)"),
    (("Readout",), "the runtime's readout of a graph output (host, with its NC1HWC2 -> NCHW; no layer)"),  # LOWERING.md 25
    (("SpaceToDepth",), "CNA conv of 0/1 weights, kernel = stride = blocksize (LOWERING.md 33.1)"),  # LOWERING 33.1
    (("Readin",), "the runtime's readin of a graph input (host, with its NCHW -> NC1HWC2; no layer)"),  # LOWERING.md 33.4
    (("LSTM", "GRU", "RNN"), "unrolled into 1x1 convs, DPU look-up tables and element-wise layers (LOWERING.md 30, 31)"),  # LOWERING.md 30, 31
    (("FlatConcat",), "DPU copies, one per input, into its columns of the output (LOWERING.md 29)"),  # LOWERING.md 29
    (("Pad", "Slice", "Pow", "Sqrt", "ReduceMean", "Gather"),  # rewritten by graph passes (LOWERING.md 32)
     "the layers a graph pass rewrites it into (LOWERING.md 20.3, 24, 32)"),
    (("Transpose",), "DPU-only copies in the vendor's forms: H<->W one per C1 surface, the other perms "
                    "with TP_EN, TP_ORG_EN tiles and a compacting copy (LOWERING.md 35, 36)"),
    (("MatMul", "ActMatMul"),  # MatMul of two activations (LOWERING.md 37)
     "CNA 1x1 convs with run-time weights (the second operand's bytes), per head and surface (LOWERING.md 37)"),
)
#: kinds whose nodes never reach layer_from_node as themselves (op_table.LOWERINGS)
EXPANDED_KINDS = {"conv_phases", "split", "alias", "as_conv"}


def test_every_registered_op_has_a_row_or_is_import_only() -> None:
    registered = set(REGISTRY)
    assert registered - set(op_table.BY_OP) == set(op_table.IMPORT_ONLY)
    assert not set(op_table.IMPORT_ONLY) & set(op_table.BY_OP)
    assert len(op_table.BY_OP) == len(op_table.ROWS), "an op has two rows"


def test_rows_from_the_importer_are_registered() -> None:
    # internal rows are build records and host steps no model names; DataConvert is the one the
    # float evaluator also runs (quantization inserts it and registers it)
    for row in op_table.ROWS:
        registered = row.origin != "internal" or row.op == "DataConvert"
        assert (row.op in REGISTRY) == registered, row.op


@pytest.mark.parametrize("op, kind", sorted(op_table.onnx_lut_kinds().items()))
def test_every_lut_kind_has_a_program_and_an_emulator_path(op: str, kind: str) -> None:
    row = op_table.BY_OP[op]
    attrs = {"alpha": 0.3, "beta": 0.4}
    function = lut.lut_function(kind, *(attrs[name] for name in row.lut_attrs))
    assert np.isfinite(function(np.linspace(-8.0, 8.0, 33))).all()
    program, _, _ = lut.lut_program(kind, input_unit=0.05, output_scale=0.04, output_zero_point=-3)
    assert program.le.shape == program.lo.shape == (513,)
    # int8 runs through the DPU LUT RAM (any table); fp16 and after a residual add on the host
    assert row.host and op in HOST_RUNTIME
    activation = build_adapt.lut_activation(op, attrs)
    assert activation.kind == kind and activation.uses_lut
    assert (activation.alpha is not None, activation.beta is not None) == ("alpha" in row.lut_attrs,
                                                                          "beta" in row.lut_attrs)


def test_lut_kinds_are_exactly_the_lut_programs() -> None:
    assert sorted(op_table.onnx_lut_kinds().values()) == sorted(lut.LUT_KINDS)
    assert op_table.onnx_lut_kinds() == lut.ONNX_LUT_KINDS  # until lut.py reads the table itself


def test_host_rows_are_the_runtime_host_ops() -> None:
    assert op_table.host_ops() == set(HOST_RUNTIME)


def test_derived_lists_equal_the_ones_they_replaced() -> None:
    assert build_adapt.ONNX_LUT_KINDS == OLD_LUT_KINDS | {"Rsqrt": "rsqrt"}  # 1/sqrt added since (LOWERING.md 24)
    assert build_adapt.LUT_ACTIVATIONS == frozenset(OLD_LUT_KINDS) | {"Rsqrt"}
    assert build_adapt._ELTWISE == OLD_ELTWISE and build_adapt.ELTWISE_OPS == frozenset(OLD_ELTWISE)
    assert layers.ELTWISE_OPS == ("add", "sub", "mul", "max", "min")
    assert build_host.CPU_OPS == frozenset(OLD_CPU_OPS) | {"LSTM", "GRU", "RNN", "Rsqrt", "SpaceToDepth"}  # host rows added since (issue 18/19)
    assert fusion_rules.LUT_EXTRAS == ("HardSwish", "HardSigmoid")
    assert match.CONV_TYPES == ("Conv", "ConvTranspose", "FullyConnected")
    assert op_table.ops_lowered_as("conv") == ("Conv",)
    assert op_table.ops_lowered_as("slice") == (build_adapt.CHANNEL_SLICE,)
    assert op_table.ops_lowered_as("alias") == ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
    assert tuple((entry.ops, entry.unit) for entry in partition.NPU_OPS) == OLD_NPU_OPS


def test_partition_groups_and_rules_match() -> None:
    assert set(op_table.npu_groups()) == set(partition.RULES)
    assert all(op_table.npu_group(group) for group in partition.RULES)


def test_every_lowering_kind_is_built() -> None:
    kinds = {row.lowering for row in op_table.ROWS if row.lowering is not None}
    assert kinds == set(build_adapt.LAYER_BUILDERS) | EXPANDED_KINDS
    assert set(op_table.LOWERINGS) == kinds


def test_platform_fusion_lists_name_activation_rows() -> None:
    activations = set(op_table.fusion_role("activation"))
    for chip in list_platforms():
        assert set(load_platform(chip).fusion.activations) <= activations, chip


@pytest.mark.parametrize("reference", sorted({row.reference for row in op_table.ROWS if row.reference}))
def test_references_resolve(reference: str) -> None:
    module, _, name = reference.partition(":")
    assert callable(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize("op", ["Softmax", "Div", "PRelu", "FullyConnected", "NoSuchOp"])
def test_npu_node_without_a_builder_is_refused_by_name(op: str) -> None:
    node = Node("n", op, ["x"], ["y"], {}, [], "NPU")
    with pytest.raises(UnsupportedOpError, match=f"op {op} is not lowered to NPU tasks yet"):
        build_adapt.layer_from_node(None, node, None)


def test_host_step_and_broadcast_checks_read_the_table() -> None:
    node = Node("c", "DataConvert", ["x"], ["y"], {}, [], "NPU")
    assert layer_records._host_step(None, node, None)
    assert not layer_records._broadcasting_eltwise(None, Node("s", "Softmax", ["x", "z"], ["y"], {}, [], "NPU"))


def test_a_bad_row_fails_at_once() -> None:
    with pytest.raises(ValueError, match="lowering"):
        op_table.OpRow("X", lowering="lut")  # a LUT lowering without its kind
    with pytest.raises(ValueError, match="not one of"):
        op_table.OpRow("X", fusion="act")


def test_the_recipe_names_what_exists() -> None:
    """compiler/ADDING_AN_OP.md's worked example names these; keep the recipe true."""
    from npuemu.compiler.ops import activation
    from tests.compiler import test_lower_lut

    named = [(build_adapt, "_lut_record"), (build_adapt, "lut_activation"), (build_adapt, "split_lut_activation"),
             (build_adapt, "_preactivation_range"), (build_adapt, "LAYER_BUILDERS"), (layer_records, "_host_step"),
             (partition, "NPU_OPS"), (partition, "RULES"), (lut, "lut_function"), (lut, "lut_program"),
             (lut, "LUT_KINDS"), (activation, "register"), (activation, "same_as_input"), (op_table, "_lut"),
             (test_lower_lut, "float_function"), (test_lower_lut, "test_standalone_activation_on_every_int8_input"),
             (test_lower_lut, "test_conv_fused_lut_activation_matches_fake_quant")]
    assert [name for module, name in named if not hasattr(module, name)] == []
    assert "OPS" in dir(importlib.import_module("npuemu.emulator.cpu_ops"))
