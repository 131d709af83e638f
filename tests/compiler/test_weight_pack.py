"""Weight and BS-operand blobs: vendor sizes and block shapes, and agreement with the layout the
emulator's CNA reads (``npuemu.emulator.kernels.weights``, NUMERICS.md 8.2/8.3)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.compiler import weight_pack as wp
from npuemu.emulator.kernels import weights as emu

CORPUS = Path(__file__).parents[2] / ".." / "shared" / "docs" / "vendor-corpus"


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"\d+", text))


def corpus_weights() -> list[tuple[str, tuple[int, ...], str, int]]:
    """(op_type, weight shape, native shape, bytes) of every rk3588 Conv* layer (Mul holds a plain vector)."""
    rows = [r for r in csv.DictReader(open(CORPUS / "layers.csv")) if r["target"] == "rk3588" and r["w_native"] and r["op_type"].startswith("Conv")]
    assert len(rows) > 200
    return [(r["op_type"], _shape(r["weight_shape"]), r["w_native"], int(r["w_bytes"])) for r in rows]


def _native_text(blocks: tuple[tuple[int, ...], ...]) -> str:
    return "x".join(str(v) for block in blocks for v in block)


def test_native_shapes_and_sizes_match_the_corpus() -> None:
    mismatches = []
    for op_type, (oc, ic, kh, kw), native, size in corpus_weights():
        depthwise = oc == 1 and native.count("x") in (5, 11) and native.split("x")[4] == "1"
        if depthwise:
            blocks = wp.depthwise_native_shapes(ic, kh, kw)
            stored = wp.INT8_DEPTHWISE.stored_channels(ic) * kh * kw
        else:
            blocks = wp.conv_native_shapes(oc, ic, kh, kw)
            stored = wp.INT8_CONV.stored_kernels(oc) * wp.INT8_CONV.stored_channels(ic) * kh * kw
        ours = _native_text(blocks)
        if ours != native or stored != size or sum(int(np.prod(b)) for b in blocks) != size:
            mismatches.append((op_type, (oc, ic, kh, kw), native, ours, size, stored))
    assert not mismatches, mismatches[:10]


def test_listing_examples() -> None:
    rng = np.random.default_rng(0)
    w1 = rng.integers(-128, 128, (32, 32, 3, 3), dtype=np.int8)
    assert wp.conv_native_shapes(32, 32, 3, 3) == ((1, 1, 3, 3, 32, 32),)
    assert wp.pack_conv_weights(w1, 0).size == 9216
    fc = rng.integers(-128, 128, (1000, 512, 1, 1), dtype=np.int8)
    assert wp.conv_native_shapes(1000, 512, 1, 1) == ((31, 16, 1, 1, 32, 32), (1, 16, 1, 1, 8, 32))
    assert wp.pack_conv_weights(fc, 0).size == 512000
    assert wp.depthwise_native_shapes(16, 3, 3) == ((1, 0, 3, 3, 1, 64), (1, 1, 3, 3, 1, 16))
    zeros = np.zeros(32, np.int32)
    assert len(wp.bias_blob(zeros, zeros, zeros, 32)) == 256
    assert len(wp.bias_blob(np.zeros(1000), np.zeros(1000), np.zeros(1000), 1024)) == 8192


def test_first_layer_block_layout_by_hand() -> None:
    """rep03-like: 32 kernels, 3 input channels stored as 16, zp fill in channels 3..15."""
    w = np.arange(32 * 3 * 2 * 2, dtype=np.int64).reshape(32, 3, 2, 2).astype(np.int8)
    zp = np.arange(32, dtype=np.int8) - 5
    blob = wp.pack_conv_weights(w, zp).reshape(2, 2, 32, 16)  # [KH][KW][32 oc][16 ic]
    assert np.array_equal(blob[1, 0, 7, :3], w[7, :, 1, 0])
    assert np.all(blob[:, :, 7, 3:] == zp[7])


@given(st.integers(1, 70), st.integers(1, 70), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2**31))
def test_conv_layout_matches_the_emulator(oc: int, ic: int, kh: int, kw: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    weights = rng.integers(-128, 128, (oc, ic, kh, kw), dtype=np.int8)
    zp = rng.integers(-128, 128, oc).astype(np.int8)
    ours = wp.pack_conv_weights(weights, zp)
    theirs = emu.pack_conv_weights(weights, emu.INT8_CONV_RK3588, zp)
    assert np.array_equal(ours, theirs)
    assert np.array_equal(emu.unpack_conv_weights(ours, oc, ic, kh, kw), weights)


@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 3), st.integers(0, 2**31))
def test_fp16_conv_layout_matches_the_emulator(oc: int, ic: int, kh: int, seed: int) -> None:
    weights = np.random.default_rng(seed).normal(size=(oc, ic, kh, kh)).astype(np.float16)
    ours = wp.pack_conv_weights(weights.view(np.uint16), 0, wp.FP16_CONV)
    back = emu.unpack_conv_weights(ours.view(np.float16), oc, ic, kh, kh, emu.FP16_CONV_RK3588)
    assert np.array_equal(back, weights)


@given(st.integers(1, 200), st.integers(1, 5), st.integers(0, 2**31))
def test_depthwise_layout_matches_the_emulator(channels: int, kernel: int, seed: int) -> None:
    weights = np.random.default_rng(seed).integers(-128, 128, (channels, 1, kernel, kernel), dtype=np.int8)
    ours = wp.pack_depthwise_weights(weights)
    assert np.array_equal(ours, emu.pack_depthwise_weights(weights))
    assert np.array_equal(emu.unpack_depthwise_weights(ours, channels, kernel, kernel), weights)
    fp = weights.astype(np.float16)
    packed = wp.pack_depthwise_weights(fp.view(np.uint16), wp.FP16_DEPTHWISE)
    assert np.array_equal(emu.unpack_depthwise_weights(packed.view(np.float16), channels, kernel, kernel,
                                                       emu.FP16_DEPTHWISE_RK3588), fp)


def test_bias_blob_layout() -> None:
    alu = np.arange(10, dtype=np.int32) * 1000 - 4000
    cpend = -np.arange(10, dtype=np.int16)
    mul = np.arange(10, dtype=np.int16) + 16000
    blob = wp.bias_blob(alu, cpend, mul, 32)
    assert len(blob) == 4 * 64
    first = np.frombuffer(blob[:64], dtype=np.uint8)
    assert np.array_equal(first[:32].view("<i4"), alu[:8])
    assert np.array_equal(first[32:48].view("<i2"), cpend[:8])
    assert np.array_equal(first[48:64].view("<i2"), mul[:8])
    back = wp.unpack_bias_blob(blob, 32)
    assert np.array_equal(back[0][:10], alu) and not back[0][10:].any()
    with pytest.raises(Exception, match="cannot hold"):
        wp.bias_blob(alu, cpend, mul, 8)


def test_float_bias_blob_carries_fp32_bits() -> None:
    blob = wp.float_bias_blob(np.array([1.5, -2.0]), 2, 16)
    alu, cpend, mul = wp.unpack_bias_blob(blob, 2)
    assert np.array_equal(alu.view(np.float32), np.array([1.5, -2.0], np.float32))
    assert not cpend.any() and not mul.any()
