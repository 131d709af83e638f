"""Attention's MatMul of two activations as a conv whose weights an earlier task wrote
(LOWERING.md 22.3).

For one head with q and k stored channel-major as [1, d, 1, T] float16 maps, the scores
s[j, i] = sum_c k[c, j] q[c, i] are a 1x1 conv of q with weights W[j, c] = k[c, j]. LOWERING.md
22.3 claims that for d <= 8 (one 8-channel NC1HWC2 surface) and T even, the feature bytes of k
*are* the CNA's float16 weight blob of W, so the conv can read them where the producing task
wrote them. Checked here:

- the byte claim itself, with the NC1HWC2 bytes written out in this file and the packer of the
  build (``isa.weight_layout``) - plus the two cases where it does not hold (odd T: the blob
  has one kernel more than the map has pixels; d > 8: the second surface is not the blob's
  channels 8..15);
- two lowered float16 layers on the emulator's machine - a conv that writes k, and the scores
  conv whose weight address is k's - against a numpy float16 chain written here; then the
  same machine run again with a new k, which the scores conv must read afresh (the emulator
  keeps unpacked weights in the memory's derived-value cache, dropped when a DMA write touches
  their bytes);
- the HeadAttention layer (passes/lower_attention.py) built and run: bit for bit against a
  numpy float16 chain on inputs where no sum depends on the MAC order, and against float
  attention; its partition limits;
- the graph pass (passes/attention_npu.py) on attention blocks and an encoder layer written as
  exporters write them (both qkv orders): the graph after the passes, its float values and
  the emulated float16 build against onnxruntime, the host steps left; int8 builds, bodies
  that are not attention and odd token counts left as they were; PP-OCRv4 rec.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from npuemu.compiler.lower import ConvLayer, feature_bytes, layer_constants, lower_layer, output_align
from npuemu.compiler.memory_plan import TensorLifetime, plan_memory, regcmd_bytes
from npuemu.emulator.machine import Machine
from npuemu.isa import weight_layout
from npuemu.isa.chain import encode_chain
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.task import Chain
from npuemu.platforms import load_platform

PLATFORM = load_platform("rk3588")
REGMAP = load_regmap("rk3588")
C2 = 8  # float16 elements per NC1HWC2 pixel atom on rk3588 [V] hardware.md 3


def nc1hwc2_fp16(x: np.ndarray, surface_elements: int | None = None) -> np.ndarray:
    """[C][H][W] -> float16 NC1HWC2 elements (surfaces of ``surface_elements``, zero padding),
    written from the layout's definition: element (c, h, w) at
    (c // 8) * surface + (h * W + w) * 8 + c % 8."""
    channels, height, width = x.shape
    surface = surface_elements or height * width * C2
    out = np.zeros(-(-channels // C2) * surface, np.float16)
    for c in range(channels):
        for h in range(height):
            for w in range(width):
                out[(c // C2) * surface + (h * width + w) * C2 + c % C2] = x[c, h, w]
    return out


def from_nc1hwc2_fp16(buf: np.ndarray, shape: tuple[int, int, int], surface_elements: int) -> np.ndarray:
    channels, height, width = shape
    out = np.zeros(shape, np.float16)
    for c in range(channels):
        for h in range(height):
            for w in range(width):
                out[c, h, w] = buf[(c // C2) * surface_elements + (h * width + w) * C2 + c % C2]
    return out


# ---- the byte claim ---------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(d=st.integers(1, 8), half_t=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_one_surface_map_is_the_weight_blob_of_its_transpose(d, half_t, seed):
    tokens = 2 * half_t
    rng = np.random.default_rng(seed)
    k = rng.normal(0, 2, (d, 1, tokens)).astype(np.float16)
    weights = k[:, 0, :].T.reshape(tokens, d, 1, 1)  # W[j, c] = k[c, j]
    blob = weight_layout.pack_conv_weights(weights, weight_layout.FP16_CONV)
    feature = nc1hwc2_fp16(k)
    # the blob pads the d channels to 8 (zeros), the map's surface holds zeros there too
    assert blob.size == feature.size == tokens * C2
    assert np.array_equal(blob.view(np.uint16), feature.view(np.uint16))


def test_where_the_claim_stops():
    rng = np.random.default_rng(1)
    odd = rng.normal(0, 1, (8, 1, 39)).astype(np.float16)  # 39 kernels stored as 39 (LOWERING.md 34)
    blob = weight_layout.pack_conv_weights(odd[:, 0, :].T.reshape(39, 8, 1, 1), weight_layout.FP16_CONV)
    assert np.array_equal(blob.view(np.uint16), nc1hwc2_fp16(odd).view(np.uint16))
    blob = weight_layout.pack_conv_weights(odd[:, 0, :].T.reshape(39, 8, 1, 1), weight_layout.FP16_CONV_V1)
    assert blob.size == 40 * C2 > nc1hwc2_fp16(odd).size  # the even tail of npuemu's older builds
    wide = rng.normal(0, 1, (16, 1, 40)).astype(np.float16)  # two surfaces: [c1][j][8], the blob [j][16]
    blob = weight_layout.pack_conv_weights(wide[:, 0, :].T.reshape(40, 16, 1, 1), weight_layout.FP16_CONV)
    feature = nc1hwc2_fp16(wide)
    assert blob.size == feature.size and not np.array_equal(blob.view(np.uint16), feature.view(np.uint16))
    # ... but each surface alone is the blob of its 8 channels (a d > 8 head is a sum of such convs)
    for surface in range(2):
        part = wide[8 * surface:8 * surface + 8, 0, :].T.reshape(40, 8, 1, 1)
        piece = weight_layout.pack_conv_weights(part, weight_layout.FP16_CONV)
        assert np.array_equal(piece.view(np.uint16), feature[surface * 320:(surface + 1) * 320].view(np.uint16))


# ---- on the machine ---------------------------------------------------------------------------

def fp16_conv(x: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """A float16 1x1 conv as the build computes it (emulator/NUMERICS.md 8): exact products of
    float16 values summed (exact in float64 for these sizes), rounded to float32, the float32
    bias added, rounded once to float16. x [C][1][T], weights [O][C] -> [O][1][T]."""
    products = np.einsum("oc,cht->oht", weights.astype(np.float64), x.astype(np.float64))
    return (products.astype(np.float32) + bias.astype(np.float32).reshape(-1, 1, 1)).astype(np.float16)


def grid(rng, shape, step: float, bound: float) -> np.ndarray:
    """float16 multiples of ``step`` in [-bound, bound]. On such grids every product and every
    float32 sum of the convs here is exact, so the result does not depend on the order the MAC
    array adds in (NUMERICS.md 3.3: unknown; the emulator's BLAS order) and the only rounding
    is the final float16 one - the reference is exact, not one order of several."""
    return (rng.integers(-round(bound / step), round(bound / step) + 1, shape) * step).astype(np.float16)


def _layers(d: int, tokens: int, queries: int, seed: int, source: str = "k"):
    rng = np.random.default_rng(seed)
    # |k| <= 8 * 2 * 1 + 1 on a 2^-4 grid: exact in float16 (11 significant bits)
    make_k = ConvLayer("make_k", "a", "k", (d, 1, tokens), grid(rng, (d, d, 1, 1), 0.25, 1.0),
                       bias=grid(rng, d, 0.25, 1.0).astype(np.float64), dtype="float16")
    # the scores conv: its weights are the bytes of ``source`` (k); ``weights`` only gives the
    # blob's geometry
    scores = ConvLayer("scores", "q", "s", (d, 1, queries), np.zeros((tokens, d, 1, 1), np.float16),
                       bias=grid(rng, tokens, 0.125, 1.0).astype(np.float64), dtype="float16", weight_source=source)
    return make_k, scores


def _build(layers, shapes: dict[str, tuple[int, int, int]]):
    """Plan and lower ``layers`` together (a run-time-weights conv stores no weight constant)."""
    constants = {}
    for layer in layers:
        constants |= layer_constants(layer, PLATFORM)
    aligns = {layer.output: output_align(layer, PLATFORM) for layer in layers}
    lifetimes = [TensorLifetime(name, feature_bytes(shape, "float16", PLATFORM, channel_align=aligns.get(name, 1)),
                                kind="output" if name == layers[-1].output else "input")
                 for name, shape in shapes.items()]

    def lower(plan):
        placements = {name: plan.constant(name) for name in constants}
        placements |= {name: plan.feature(name, shape, "float16", PLATFORM, channel_align=aligns.get(name, 1))
                       for name, shape in shapes.items()}
        return placements, [task for layer in layers for task in lower_layer(layer, placements, PLATFORM, REGMAP).tasks]

    sizes = {n: len(b) for n, b in constants.items()}
    _, first = lower(plan_memory(sizes, lifetimes))
    plan = plan_memory(sizes, lifetimes, regcmd_bytes(first))
    placements, tasks = lower(plan)
    regcmd = plan["regcmd"]
    chain = encode_chain(Chain(tuple(tasks)), REGMAP, base_addr=regcmd.address, scale=PLATFORM.pc.data_amount_scale)
    machine = Machine.for_platform("rk3588", ddr_size=plan.end + (1 << 16))
    for name, blob in constants.items():
        machine.memory.load(placements[name].address, blob)
    machine.memory.load(regcmd.address, chain.data)
    return machine, placements, (regcmd.address, chain.first_amount)


def _run(machine, placements, chain, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
    for name, value in inputs.items():
        place = placements[name]
        machine.memory.load(place.address, nc1hwc2_fp16(value, place.surface_bytes // 2).view(np.uint8))
    machine.run_chain(*chain)
    out = placements[output]
    raw = machine.memory.dump(out.address, out.size).view(np.float16)
    return from_nc1hwc2_fp16(raw, out.shape, out.surface_bytes // 2)


@pytest.mark.parametrize("d, tokens, queries", [(8, 40, 40), (5, 16, 24), (8, 2, 7), (3, 64, 33)])
def test_runtime_weights_conv_bit_exact(d, tokens, queries):
    make_k, scores = _layers(d, tokens, queries, seed=d * 100 + tokens)
    shapes = {"a": (d, 1, tokens), "k": (d, 1, tokens), "q": (d, 1, queries), "s": (tokens, 1, queries)}
    machine, placements, chain = _build([make_k, scores], shapes)
    rng = np.random.default_rng(tokens)
    for run in range(3):  # every run writes a new k: the scores conv must read it afresh
        a, q = grid(rng, (d, 1, tokens), 0.25, 2.0), grid(rng, (d, 1, queries), 0.25, 2.0)
        k = fp16_conv(a, make_k.weights[:, :, 0, 0], make_k.bias)
        want = fp16_conv(q, k[:, 0, :].T, scores.bias)  # W[j, c] = k[c, j]
        got = _run(machine, placements, chain, {"a": a, "q": q}, "s")
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), f"run {run}"


def test_runtime_weights_conv_full_range():
    """Arbitrary float16 values: within one float16 step of the exact result (the fp32 sum's
    order-dependent error, NUMERICS.md 3.3, can move a value across a rounding midpoint)."""
    d, tokens = 8, 40
    make_k, scores = _layers(d, tokens, tokens, seed=7)
    shapes = {"a": (d, 1, tokens), "k": (d, 1, tokens), "q": (d, 1, tokens), "s": (tokens, 1, tokens)}
    machine, placements, chain = _build([make_k, scores], shapes)
    rng = np.random.default_rng(5)
    a, q = (rng.normal(0, 1, (d, 1, tokens)).astype(np.float16) for _ in range(2))
    got = _run(machine, placements, chain, {"a": a, "q": q}, "s").astype(np.float64)
    k = _run(machine, placements, chain, {"a": a, "q": q}, "k")
    want = fp16_conv(q, k[:, 0, :].T, scores.bias).astype(np.float64)
    step = np.spacing(np.abs(want).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(got - want) <= step)


@pytest.mark.parametrize("weights, dtype", [((40, 9, 1, 1), "float16"), ((39, 8, 1, 1), "float16"),
                                            ((40, 8, 3, 3), "float16"), ((40, 8, 1, 1), "int8")])
def test_runtime_weights_outside_the_layout_are_refused(weights, dtype):
    from npuemu.compiler.lower import Quant
    from npuemu.isa.errors import CompileError
    extra = {} if dtype == "float16" else dict(
        weight_scale=np.ones(weights[0]), weight_zero_point=np.zeros(weights[0], int), input_quant=Quant(0.1, 0),
        output_quant=Quant(0.1, 0))
    values = np.zeros(weights, np.float16 if dtype == "float16" else np.int8)
    with pytest.raises(CompileError, match="weights read from feature map"):
        ConvLayer("scores", "q", "s", (weights[1], 5, 40), values, dtype=dtype, weight_source="k",
                  pads=(1, 1, 1, 1) if weights[2] == 3 else (0, 0, 0, 0), **extra)


def test_a_source_map_too_small_is_a_compile_error():
    from npuemu.isa.errors import CompileError
    make_k, scores = _layers(8, 16, 16, seed=0)
    shapes = {"a": (8, 1, 8), "k": (8, 1, 8), "q": (8, 1, 16), "s": (16, 1, 16)}  # k: 8 pixels for 16 kernels
    make_k = ConvLayer("make_k", "a", "k", (8, 1, 8), make_k.weights, bias=make_k.bias, dtype="float16")
    with pytest.raises(CompileError, match="is not the 256-byte weight blob"):
        _build([make_k, scores], shapes)


def test_the_runtime_weights_are_the_producers_bytes():
    """A control for the test above: with the weight blob pointed elsewhere (at q), the result
    differs - the scores conv really reads its weights from the address it is given."""
    d, tokens = 8, 8
    make_k, scores = _layers(d, tokens, tokens, seed=3, source="q")
    shapes = {"a": (d, 1, tokens), "k": (d, 1, tokens), "q": (d, 1, tokens), "s": (tokens, 1, tokens)}
    machine, placements, chain = _build([make_k, scores], shapes)
    rng = np.random.default_rng(0)
    a, q = (grid(rng, (d, 1, tokens), 0.25, 2.0) for _ in range(2))
    got = _run(machine, placements, chain, {"a": a, "q": q}, "s")
    assert np.array_equal(got.view(np.uint16), fp16_conv(q, q[:, 0, :].T, scores.bias).view(np.uint16))
    k = fp16_conv(a, make_k.weights[:, :, 0, 0], make_k.bias)
    assert not np.array_equal(got, fp16_conv(q, k[:, 0, :].T, scores.bias))



# ---- HeadAttention: the float semantics and the built layer ------------------------------------

def reference_attention(z: np.ndarray, heads: int, width: int) -> np.ndarray:
    """Multi-head attention on the channel-major qkv map z [1, 3 H P, 1, T] (float64): for head h,
    q, k, v are the P channels at h P, (H + h) P, (2 H + h) P; softmax over the keys of k^T q;
    the heads' v P concatenated."""
    z = np.asarray(z, np.float64)[0, :, 0, :]
    heads_out = []
    for h in range(heads):
        q = z[h * width:(h + 1) * width]
        k = z[(heads + h) * width:(heads + h + 1) * width]
        v = z[(2 * heads + h) * width:(2 * heads + h + 1) * width]
        scores = np.einsum("cj,ci->ji", k, q)
        weights = np.exp(scores - scores.max(axis=0))
        heads_out.append(np.einsum("ej,ji->ei", v, weights / weights.sum(axis=0)))
    return np.concatenate(heads_out)[None, :, None, :]


def head_attention_graph(heads: int, width: int, tokens: int):
    from npuemu.compiler.ir import Graph, Node, Tensor
    graph = Graph("attention", inputs=["z"], outputs=["y"])
    graph.add_tensor(Tensor("z", (1, 3 * heads * width, 1, tokens), "float32"))
    graph.add_tensor(Tensor("y", (1, heads * width, 1, tokens), "float32"))
    graph.nodes.append(Node("att", "HeadAttention", ["z"], ["y"], {"heads": heads, "head_channels": width}))
    return graph


def _built(graph, element_bytes: int = 2):
    from npuemu.compiler.build import build_model
    from npuemu.compiler.passes import PassContext, optimize
    from npuemu.compiler.quant import float16_graph
    _, split = optimize(graph, PassContext.for_chip("rk3588", 3, element_bytes=element_bytes), check_every_pass=True)
    float16_graph(graph)
    return split, build_model(graph)


def _emulate(model, feeds: dict, output: str = "y") -> np.ndarray:
    from npuemu.emulator.runtime import Runtime
    runtime = Runtime(model)
    for name, value in feeds.items():
        runtime.set_input(name, value)
    runtime.run()
    return np.asarray(runtime.output(output))


def test_float_semantics_is_the_reference():
    from npuemu.compiler.passes.lower_attention import head_attention
    z = np.random.default_rng(0).normal(0, 1, (1, 3 * 2 * 8, 1, 10))
    np.testing.assert_allclose(head_attention({"heads": 2, "head_channels": 8}, [z]), reference_attention(z, 2, 8),
                               rtol=1e-12)


def _chain_reference(z: np.ndarray, heads: int, width: int) -> np.ndarray:
    """The built layer's float16 arithmetic for inputs where every conv sum has at most one
    non-zero product per 8-channel chunk or is exact on its grid (see the test): scores exact,
    the softmax as tests/compiler/test_softmax_npu's task reference, v copied by the transpose
    conv, P v as one product per conv chained by float16 residual adds (chunk order)."""
    from tests.compiler.test_softmax_npu import reference_softmax_npu
    z = np.asarray(z, np.float16)[0, :, 0, :].astype(np.float32)
    tokens, out = z.shape[1], []
    for h in range(heads):
        q, k, v = (z[(part * heads + h) * width:(part * heads + h + 1) * width] for part in range(3))
        scores = (k.astype(np.float64).T @ q.astype(np.float64)).astype(np.float32).astype(np.float16)
        probs = reference_softmax_npu(scores[None, :, None, :])[0, :, 0, :].astype(np.float32)
        for s in range(width // C2):
            running = None
            for start in range(0, tokens, C2):
                rows = slice(start, min(start + C2, tokens))
                part = np.einsum("ej,ji->ei", v[s * C2:(s + 1) * C2, rows].astype(np.float64),
                                 probs[rows].astype(np.float64)).astype(np.float32)
                running = (part if running is None else part + running).astype(np.float16).astype(np.float32)
            out.append(running)
    return np.concatenate(out).astype(np.float16)[None, :, None, :]


@pytest.mark.parametrize("heads, width, tokens", [(2, 16, 40), (1, 8, 8), (3, 8, 22), (1, 32, 12), (2, 64, 16)])
def test_head_attention_bit_exact(heads, width, tokens):
    """q, k on a 2^-3 grid (scores exact in float32 and float16); v non-zero only where token
    j = e mod 8 within each 8-token chunk, so each P v conv has one product per output: the
    result is independent of the MAC order, and a v read with the wrong layout gives other
    values."""
    rng = np.random.default_rng(heads * 100 + tokens)
    z = np.zeros((1, 3 * heads * width, 1, tokens), np.float32)
    z[0, :2 * heads * width, 0] = rng.integers(-8, 9, (2 * heads * width, tokens)) / 8.0
    v = rng.integers(-8, 9, (heads * width, tokens)) / 8.0
    mask = (np.arange(tokens)[None, :] % C2) == (np.arange(heads * width)[:, None] % C2)
    z[0, 2 * heads * width:, 0] = np.where(mask, v, 0.0)
    split, model = _built(head_attention_graph(heads, width, tokens))
    assert dict(split.cpu_ops()) == {}
    got = _emulate(model, {"z": z}).astype(np.float16)
    want = _chain_reference(z, heads, width)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_allclose(got, reference_attention(z, heads, width), atol=5e-3)  # scores up to d: fp16 steps


@settings(max_examples=4, deadline=None)
@given(heads=st.integers(1, 3), surfaces=st.sampled_from([1, 2, 4]), half_tokens=st.integers(1, 24),
       seed=st.integers(0, 99))
@example(heads=2, surfaces=4, half_tokens=23, seed=51)
def test_head_attention_against_float(heads, surfaces, half_tokens, seed):
    """The fp16 chain against float64: the error bound scales with the output's largest magnitude (fp16
    keeps ~11 significant bits; the chain rounds the scores, the softmax and each product's partial sums),
    12 units of 2^-10 of it. The example: CI's draw (2026-11-28) whose error, 0.034 on outputs up to 3.86,
    broke the former absolute bound of 0.03 - the same bits before and after that session's changes."""
    width, tokens = 8 * surfaces, 2 * half_tokens
    z = np.random.default_rng(seed).normal(0, 1, (1, 3 * heads * width, 1, tokens)).astype(np.float32)
    _, model = _built(head_attention_graph(heads, width, tokens))
    got, want = _emulate(model, {"z": z}), reference_attention(z, heads, width)
    assert cosine(got, want) >= 0.9999 and np.abs(got - want).max() < 12 * 2.0 ** -10 * np.abs(want).max()


def test_head_attention_limits_in_the_partition():
    from npuemu.compiler.passes import PassContext
    from npuemu.compiler.passes.partition import decide
    for (width, tokens, bytes_), reason in [((8, 7, 2), "7 tokens"), ((12, 8, 2), "heads of 12"),
                                            ((24, 40, 2), "heads of 24"), ((272, 40, 2), "heads of 272"),
                                            ((8, 386, 2), "386 tokens"), ((8, 8, 3), "3-byte elements")]:
        graph = head_attention_graph(1, width, tokens)
        decision = decide(graph, graph.nodes[0], PassContext.for_chip("rk3588", 3, element_bytes=bytes_))
        assert decision.target == "CPU" and reason in decision.reason, decision.reason


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# ---- the graph pass: attention written as exporters write it -------------------------------------

def _attention(nodes: list, inits: dict, x: str, y: str, prefix: str, rng, tokens: int, features: int, heads: int,
               head_major: bool = False) -> None:
    """SVTR's attention (PP-OCRv4 rec): qkv FC, Reshape [1, T, 3, H, d], Transpose, Slice +
    Squeeze of q, k, v, q * d^-1/2, q k^T, Softmax(-1), * v, Transpose, Reshape, output FC;
    ``head_major``: the qkv features grouped [H, 3, d] instead of [3, H, d]."""
    from onnx import helper
    depth = features // heads
    p = prefix
    inits |= {p + "wqkv": rng.normal(0, 0.3, (features, 3 * features)), p + "bqkv": rng.normal(0, 0.1, 3 * features),
              p + "wo": rng.normal(0, 0.2, (features, features)), p + "bo": rng.normal(0, 0.1, features),
              p + "split": np.array([1, tokens, heads, 3, depth] if head_major else [1, tokens, 3, heads, depth],
                                    np.int64),
              p + "merge": np.array([1, tokens, features], np.int64), p + "scale": np.array(depth ** -0.5),
              p + "axis0": np.array([0], np.int64)}
    nodes += [helper.make_node("MatMul", [x, p + "wqkv"], [p + "qkv0"]),
              helper.make_node("Add", [p + "qkv0", p + "bqkv"], [p + "qkv"]),
              helper.make_node("Reshape", [p + "qkv", p + "split"], [p + "r"]),
              helper.make_node("Transpose", [p + "r"], [p + "t"],
                               perm=[3, 0, 2, 1, 4] if head_major else [2, 0, 3, 1, 4])]
    for index, part in enumerate("qkv"):
        inits |= {f"{p}s{index}": np.array([index], np.int64), f"{p}e{index}": np.array([index + 1], np.int64)}
        nodes += [helper.make_node("Slice", [p + "t", f"{p}s{index}", f"{p}e{index}", p + "axis0"], [p + part + "5"]),
                  helper.make_node("Squeeze", [p + part + "5", p + "axis0"], [p + part])]
    nodes += [helper.make_node("Mul", [p + "q", p + "scale"], [p + "qs"]),
              helper.make_node("Transpose", [p + "k"], [p + "kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", [p + "qs", p + "kt"], [p + "s"]),
              helper.make_node("Softmax", [p + "s"], [p + "a"], axis=-1),
              helper.make_node("MatMul", [p + "a", p + "v"], [p + "o"]),
              helper.make_node("Transpose", [p + "o"], [p + "ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", [p + "ot", p + "merge"], [p + "om"]),
              helper.make_node("MatMul", [p + "om", p + "wo"], [p + "o2"]),
              helper.make_node("Add", [p + "o2", p + "bo"], [y])]


def _attention_separate(nodes: list, inits: dict, x: str, y: str, prefix: str, rng, tokens: int, features: int,
                        heads: int) -> None:
    """BERT's self-attention: q, k, v projections of their own, each Reshape [1, T, H, d] +
    Transpose (k straight to [1, H, d, T]), scores / sqrt(d), Softmax(-1), * v, Transpose,
    Reshape, output FC."""
    from onnx import helper
    depth, p = features // heads, prefix
    inits |= {p + "heads": np.array([1, tokens, heads, depth], np.int64), p + "merge": np.array([1, tokens, features],
                                                                                                 np.int64),
              p + "root": np.array(np.sqrt(depth)), p + "wo": rng.normal(0, 0.2, (features, features)),
              p + "bo": rng.normal(0, 0.1, features)}
    for part, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        inits |= {p + "w" + part: rng.normal(0, 0.3, (features, features)),
                  p + "b" + part: rng.normal(0, 0.1, features)}
        nodes += [helper.make_node("MatMul", [x, p + "w" + part], [p + part + "0"]),
                  helper.make_node("Add", [p + part + "0", p + "b" + part], [p + part + "1"]),
                  helper.make_node("Reshape", [p + part + "1", p + "heads"], [p + part + "2"]),
                  helper.make_node("Transpose", [p + part + "2"], [p + part], perm=perm)]
    nodes += [helper.make_node("MatMul", [p + "q", p + "k"], [p + "s0"]),
              helper.make_node("Div", [p + "s0", p + "root"], [p + "s"]),
              helper.make_node("Softmax", [p + "s"], [p + "a"], axis=-1),
              helper.make_node("MatMul", [p + "a", p + "v"], [p + "o"]),
              helper.make_node("Transpose", [p + "o"], [p + "ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", [p + "ot", p + "merge"], [p + "om"]),
              helper.make_node("MatMul", [p + "om", p + "wo"], [p + "o2"]),
              helper.make_node("Add", [p + "o2", p + "bo"], [y])]


def _onnx(nodes, inits, shape):
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(np.asarray(v, v.dtype if v.dtype == np.int64 else np.float32), k)
                               for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def attention_block(tokens=40, features=64, heads=8, head_major=False, seed=0, separate=False):
    """x [1, T, C] -> attention (``separate``: BERT's form) -> + x -> y."""
    from onnx import helper
    rng, inits, nodes = np.random.default_rng(seed), {}, []
    if separate:
        _attention_separate(nodes, inits, "x", "att", "a_", rng, tokens, features, heads)
    else:
        _attention(nodes, inits, "x", "att", "a_", rng, tokens, features, heads, head_major)
    nodes.append(helper.make_node("Add", ["att", "x"], ["y"]))
    return _onnx(nodes, inits, [1, tokens, features])


def encoder_layer(tokens=40, features=64, heads=8, hidden=128, seed=0):
    """Pre-norm transformer encoder layer: x + attention(LN(x)), then + FC(GELU(FC(LN(.)))), then LN."""
    from onnx import helper
    from tests.compiler.test_tokens_as_channels import _activation, _layer_norm
    rng, inits, nodes = np.random.default_rng(seed), {}, []
    _layer_norm(nodes, inits, "x", "n1", "ln1_", rng, 1e-5, False, features)
    _attention(nodes, inits, "n1", "att", "a_", rng, tokens, features, heads)
    nodes.append(helper.make_node("Add", ["att", "x"], ["r1"]))
    _layer_norm(nodes, inits, "r1", "n2", "ln2_", rng, 1e-5, False, features)
    inits |= {"w1": rng.normal(0, 0.2, (features, hidden)), "c1": rng.normal(0, 0.1, hidden),
              "w2": rng.normal(0, 0.2, (hidden, features)), "c2": rng.normal(0, 0.1, features)}
    nodes += [helper.make_node("MatMul", ["n2", "w1"], ["f1"]), helper.make_node("Add", ["f1", "c1"], ["f1b"])]
    _activation(nodes, inits, "f1b", "g", "gelu_", "gelu")
    nodes += [helper.make_node("MatMul", ["g", "w2"], ["f2"]), helper.make_node("Add", ["f2", "c2"], ["f2b"]),
              helper.make_node("Add", ["f2b", "r1"], ["r2"])]
    _layer_norm(nodes, inits, "r2", "y", "ln3_", rng, 1e-5, False, features)
    return _onnx(nodes, inits, [1, tokens, features])


def _passes(model, element_bytes: int):
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.compiler.passes import PassContext, optimize
    graph = import_onnx(model)
    _, split = optimize(graph, PassContext.for_chip("rk3588", 3, element_bytes=element_bytes), check_every_pass=True)
    return graph, split


#: host steps left: none - the [1, T, C] graph input is the runtime's readin of the channel-major
#: map (tokens_as_channels' Transpose + Reshape in, LOWERING.md 33.4), the output its readout
#: (LOWERING.md 25), and no LayerNorm step (its 1/sqrt runs on the NPU, LOWERING.md 24)
EDGES: dict[str, int] = {}


@pytest.mark.parametrize("features, heads, head_major, separate",
                         [(64, 8, False, False), (120, 8, False, False), (64, 4, True, False), (96, 6, False, True)])
def test_attention_block_graph_and_float_values(features, heads, head_major, separate):
    from npuemu.compiler.float_eval import evaluate
    from tests.compiler.test_tokens_as_channels import ort_run
    model = attention_block(features=features, heads=heads, head_major=head_major, separate=separate)
    graph, split = _passes(model, 2)
    ops = [node.op_type for node in graph.nodes]
    assert ops.count("HeadAttention") == 1 and "MatMul" not in ops and "Softmax" not in ops
    assert {op: n for op, n in split.cpu_ops().items() if op != "Reshape"} == EDGES, split.cpu_ops()
    x = np.random.default_rng(1).normal(0, 1, (1, 40, features)).astype(np.float32)
    np.testing.assert_allclose(evaluate(graph, {"x": x})["y"], ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_int8_builds_run_the_attention_as_a_float16_island():
    """int8 build: the attention is one HeadAttention computing float16 between two NPU
    DataConverts (quant/islands.py, LOWERING.md 26); its qkv and projection convs stay int8."""
    from npuemu.compiler.build import build_model
    from npuemu.compiler.quant import calibrate, quantize_graph
    from tests.compiler.test_tokens_as_channels import ort_run
    model = attention_block()
    graph, split = _passes(model, 1)
    assert [node.op_type for node in graph.nodes].count("HeadAttention") == 1
    assert {op: n for op, n in split.cpu_ops().items() if op != "Reshape"} == EDGES, split.cpu_ops()
    rng = np.random.default_rng(4)
    quantize_graph(graph, calibrate(graph, [{"x": rng.normal(0, 1, (1, 40, 64)).astype(np.float32)} for _ in range(4)],
                                    progress=False).ranges)
    dtypes = {node.op_type: graph.tensors[node.outputs[0]].quant.dtype for node in graph.nodes}
    assert dtypes["HeadAttention"] == "float16" and dtypes["Conv"] == "int8", dtypes
    built = build_model(graph)
    assert {info.op_type for info in built.layers() if info.target != "NPU"} <= {"Transpose", "Reshape"}
    assert sum(info.op_type == "DataConvert" and info.target == "NPU" for info in built.layers()) == 2
    x = rng.normal(0, 1, (1, 40, 64)).astype(np.float32)
    got, want = _emulate(built, {"x": x}), ort_run(model, {"x": x})
    assert cosine(got, want) >= 0.99, cosine(got, want)


@pytest.mark.parametrize("builder, features", [(attention_block, 64), (attention_block, 120), (encoder_layer, 64),
                                               (lambda features: attention_block(features=features, separate=True), 64),
                                               (lambda features: attention_block(features=features, heads=4), 256)])
def test_attention_on_the_emulator_against_onnxruntime(builder, features):
    from npuemu.compiler.build import build_model
    from npuemu.compiler.quant import float16_graph
    from tests.compiler.test_tokens_as_channels import ort_run
    model = builder(features=features)
    graph, split = _passes(model, 2)
    host = dict(split.cpu_ops())
    assert {op: n for op, n in host.items() if op != "Reshape"} == EDGES, host  # no Pow: LOWERING.md 24
    float16_graph(graph)
    x = np.random.default_rng(2).normal(0, 1, (1, 40, features)).astype(np.float32)
    got, want = _emulate(build_model(graph), {"x": x}), ort_run(model, {"x": x})
    assert cosine(got, want) >= 0.9999, cosine(got, want)


def _softmax_over_queries(model):
    for node in model.graph.node:
        if node.op_type == "Softmax":
            node.attribute[0].i = 2
    return model


@pytest.mark.parametrize("case", ["softmax over the queries", "odd tokens"])
def test_what_is_not_attention_or_does_not_fit_stays_as_it_was(case):
    """A body that computes something else (the numeric check) or a T the layer does not take
    (the partition's attention_heads: the rewrite is undone) keeps its MatMuls on the host."""
    from npuemu.compiler.float_eval import evaluate
    from tests.compiler.test_tokens_as_channels import ort_run
    tokens = 13 if case == "odd tokens" else 40
    model = attention_block(tokens=tokens)
    if case != "odd tokens":
        model = _softmax_over_queries(model)
    graph, split = _passes(model, 2)
    assert "HeadAttention" not in [node.op_type for node in graph.nodes] and split.cpu_ops()["MatMul"] == 2
    x = np.random.default_rng(3).normal(0, 1, (1, tokens, 64)).astype(np.float32)
    np.testing.assert_allclose(evaluate(graph, {"x": x})["y"], ort_run(model, {"x": x}), rtol=1e-4, atol=1e-4)


def test_ppocr_rec_attention_in_float16(onnx_case):
    """PP-OCRv4 rec's two attention blocks become HeadAttention layers in a float16 build: host
    steps 40 -> 10 (LOWERING.md 22.3); the float graph still equals onnxruntime."""
    import onnx
    from npuemu.compiler.float_eval import evaluate
    from npuemu.compiler.onnx_import import import_onnx
    from npuemu.compiler.passes import PassContext, optimize
    from tests.compiler.test_pass_real_models import MODELS, _path
    package, file, shape, _, _ = MODELS["ppocr_rec"]
    path = _path(package, file)
    graph = import_onnx(path, {"x": list(shape)})
    _, split = optimize(graph, PassContext.for_chip("rk3588", 3, element_bytes=2), check_every_pass=True)
    assert [node.op_type for node in graph.nodes].count("HeadAttention") == 2
    # the head FC and its Softmax join the region, the output is the runtime's readout (LOWERING.md 25);
    # the 480 -> 480 conv + HardSwish over 15 CBUF banks is an input-channel chain (LOWERING.md 49)
    assert {op: n for op, n in split.cpu_ops().items() if op != "Pow"} == {}
    x = np.random.default_rng(7).uniform(0, 1, shape).astype(np.float32)
    ours, theirs = evaluate(graph, {"x": x}), onnx_case.ort(onnx.load(str(path)), {"x": x})
    for name, value in theirs.items():
        np.testing.assert_allclose(ours[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
