"""The widest conv kernel an rk3576 build writes (compiler/LOWERING.md 56): the vendor layout's CNA 0x1024 holds kw - 1 in
4 bits, so the attention expansion's "ones" convs (passes/lower_attention.py) narrow the token axis with kernels of at
most 16 there - rknn-toolkit2 2.5.0 itself builds a 1x31 conv as a 16- and a 15-wide one - and of 31 on rk3588, whose
build is unchanged. The rk3576 attention stays bit-exact against the float16 chain reference of
tests/compiler/test_attention_npu.py."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.build import build_model
from npuemu.compiler.lower import emit_rk3576
from npuemu.compiler.layer_records import layer_records
from npuemu.compiler.passes import PassContext, optimize
from npuemu.compiler.passes.lower_attention import MAX_KERNEL, widest_kernel
from npuemu.compiler.quant import float16_graph
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform
from tests.compiler.test_attention_npu import _chain_reference, _emulate, head_attention_graph, reference_attention

C2 = 8


def test_the_widest_kernel_is_the_vendor_layouts_field():
    field = load_regmap("rk3576_vendor").register("CNA", "WEIGHT_KERNELS").field("WEIGHT_WIDTH")
    assert field.maximum == 15   # kw - 1 in bits 27:24
    assert widest_kernel(load_platform("rk3576")) == 16
    assert widest_kernel(load_platform("rk3588")) == MAX_KERNEL == 31
    assert widest_kernel(None) == 31


def _graph(chip: str, heads: int, width: int, tokens: int):
    graph = head_attention_graph(heads, width, tokens)
    optimize(graph, PassContext.for_chip(chip, 3))
    float16_graph(graph)
    return graph


def _ones_kernels(chip: str, tokens: int) -> list[tuple[int, int]]:
    """(kernel width, stride) of the expansion's ones convs, in order."""
    records = layer_records(_graph(chip, 1, 8, tokens), load_platform(chip))
    convs = [node for node in records.nodes if node.op_type == "Conv" and "_ones" in node.name]
    return [(node.attrs["kernel_shape"][1], node.attrs["strides"][1]) for node in convs]


@pytest.mark.parametrize("tokens, rk3576, rk3588", [
    (40, [(16, 7), (4, 1)], [(31, 7), (2, 1)]),    # PP-OCRv4 rec's 40 tokens
    (80, [(16, 7), (10, 1)], [(31, 7), (8, 1)]),
    (16, [(16, 1)], [(16, 1)]),
    (18, [(16, 7)], [(18, 1)]),
])
def test_the_ones_convs_narrow_the_tokens_with_the_chips_kernels(tokens, rk3576, rk3588):
    assert _ones_kernels("rk3576", tokens) == rk3576
    assert _ones_kernels("rk3588", tokens) == rk3588


@pytest.mark.parametrize("heads, width, tokens", [(2, 16, 40), (1, 8, 22)])
def test_rk3576_attention_with_narrow_ones_convs_is_bit_exact(heads, width, tokens):
    """test_attention_npu's exact inputs (q, k on a 2^-3 grid; v with one product per P v output) on rk3576."""
    rng = np.random.default_rng(heads * 100 + tokens)
    z = np.zeros((1, 3 * heads * width, 1, tokens), np.float32)
    z[0, :2 * heads * width, 0] = rng.integers(-8, 9, (2 * heads * width, tokens)) / 8.0
    v = rng.integers(-8, 9, (heads * width, tokens)) / 8.0
    mask = (np.arange(tokens)[None, :] % C2) == (np.arange(heads * width)[:, None] % C2)
    z[0, 2 * heads * width:, 0] = np.where(mask, v, 0.0)
    with pytest.MonkeyPatch.context() as patch:   # RK3588 positions: exact fp32 LUT factors (LOWERING.md 51.1)
        patch.setattr(emit_rk3576, "VENDOR_LAYOUT_OF", {})
        model = build_model(_graph("rk3576", heads, width, tokens), "rk3576")
    got = _emulate(model, {"z": z}).astype(np.float16)
    assert np.array_equal(got.view(np.uint16), _chain_reference(z, heads, width).view(np.uint16))
    np.testing.assert_allclose(got, reference_attention(z, heads, width), atol=5e-3)
    # the vendor layout (its fp16 merge copy: REGISTER_SEMANTICS.md 58) rounds the softmax LUT factors to 15 bits
    vendor = build_model(_graph("rk3576", heads, width, tokens), "rk3576")
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor"
    np.testing.assert_allclose(_emulate(vendor, {"z": z}), reference_attention(z, heads, width), atol=5e-3)
