"""The vendor's RK3576 16:4 sparse streams (isa/sparse_vendor.py ``along="both"``, compiler/LOWERING.md
43) against a reference decoder written here from the documented order, and against two vendor
builds committed in tests/data/sparse_vendor (how they were made: its README).

Order written out (the reference): each 4 x 4 tile [4 kernels][4 channels] keeps 2 kernels (rows
r0 < r1) x 2 channels (c0 < c1). Stream s holds the values in channel column c_s; a tile gives
kept row 2G + k (kernel group G, row r_k) one value per group of 4 channels. Blocks of 8 values
(8 channel groups) run over [kept rows / 32][IC / 64][tap][32 kept rows][the 2 blocks of the 64
channels]; a value's field is the channel pair's code in k = 0 rows and the kernel pair's code in
k = 1 rows (code & 3 in stream 0, code >> 2 in stream 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.isa import sparse_vendor

from tests.isa.test_sparse_vendor import PAIRS, reference_stream

DATA = Path(__file__).resolve().parents[1] / "data" / "sparse_vendor"


def reference_decode_16_4(data: bytes, amounts: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    oc_count, ic_count, kh, kw = shape
    taps, rows, groups = kh * kw, oc_count // 2, ic_count // 4
    slots = [(row, g, tap) for rb in range(0, rows, 32) for gb in range(0, groups, 16) for tap in range(taps)
             for row in range(rb, min(rb + 32, rows)) for g in range(gb, min(gb + 16, groups))]
    starts = (0, -(-(amounts[0] + 1) * 16 // 64) * 64)
    kept = []
    for stream in range(2):
        blocks = reference_stream(data[starts[stream]:starts[stream] + (amounts[stream] + 1) * 16], len(slots) // 8)
        kept.append(dict(zip(slots, [(v, f) for values, fields in blocks for v, f in zip(values, fields)])))
    weights = np.zeros((oc_count, ic_count, taps), np.int8)
    for tile_row in range(oc_count // 4):
        for g in range(groups):
            for tap in range(taps):
                (_, f00), (_, f01) = kept[0][(2 * tile_row, g, tap)], kept[1][(2 * tile_row, g, tap)]
                (_, f10), (_, f11) = kept[0][(2 * tile_row + 1, g, tap)], kept[1][(2 * tile_row + 1, g, tap)]
                channels, kernels = PAIRS[f00 | f01 << 2], PAIRS[f10 | f11 << 2]
                for k in range(2):
                    for s in range(2):
                        value = kept[s][(2 * tile_row + k, g, tap)][0]
                        weights[4 * tile_row + kernels[k], 4 * g + channels[s], tap] = value
    return weights.reshape(shape)


def random_16_4(seed: int, shape: tuple[int, int, int, int], fewer: bool) -> np.ndarray:
    """int8 weights whose 4 x 4 tiles keep 2 random kernels x 2 random channels (``fewer``: some of
    those values are 0 too)."""
    rng = np.random.default_rng(seed)
    oc, ic, kh, kw = shape
    values = np.clip(np.rint(rng.normal(0, rng.uniform(1, 60), shape)), -128, 127).astype(np.int8)
    keep = np.zeros((oc // 4, 4, ic // 4, 4, kh * kw), bool)
    for a, b, t in np.ndindex(oc // 4, ic // 4, kh * kw):
        keep[a, :, b, :, t][np.ix_(rng.permutation(4)[:2], rng.permutation(4)[:2])] = True
    if fewer:
        keep &= rng.random(keep.shape) < 0.7
    return np.where(keep.reshape(shape), values, 0).astype(np.int8)


@pytest.mark.parametrize("name, amounts", [("16_4_32x32x1x1", (11, 11)), ("16_4_64x96x1x1", (62, 62))])
def test_the_vendor_builds_decode_and_re_encode_byte_for_byte(name, amounts):
    fixture = np.load(DATA / f"{name}.npz")
    weights, tensor = fixture["weights"], fixture["tensor"].tobytes()
    assert tuple(int(a) for a in fixture["amounts"]) == amounts
    assert (weights != 0).sum() == weights.size // 4
    np.testing.assert_array_equal(reference_decode_16_4(tensor, amounts, weights.shape), weights)
    np.testing.assert_array_equal(sparse_vendor.decode(tensor, amounts, weights.shape, "both"), weights)
    packed = sparse_vendor.encode(weights, "both")
    assert packed.amounts == amounts and packed.data == tensor


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), oc=st.sampled_from([32, 64, 96, 128]), ic=st.sampled_from([32, 64, 96, 160]),
       kernel=st.sampled_from([(1, 1), (3, 3), (1, 3)]), fewer=st.booleans())
def test_encode_then_decode_against_the_reference(seed, oc, ic, kernel, fewer):
    weights = random_16_4(seed, (oc, ic) + kernel, fewer)
    packed = sparse_vendor.encode(weights, "both")
    np.testing.assert_array_equal(reference_decode_16_4(packed.data, packed.amounts, weights.shape), weights)
    np.testing.assert_array_equal(sparse_vendor.decode(packed.data, packed.amounts, weights.shape, "both"), weights)
    # the vendor's tensor size: end of stream 1 + kept values / 4, rounded up to 64 [V: 8 builds]
    assert len(packed.data) == -(-(sparse_vendor.span_bytes(packed.amounts) + weights.size // 16) // 64) * 64


def test_decomp_control_7_reads_the_16_4_streams_in_the_emulator():
    """npuemu's register stand-in for the vendor's 16:4 mode (DECOMP_CONTROL 7, REGNUM 5) gives the
    CNA the dense blob of isa/weight_layout.py."""
    from npuemu.emulator.kernels import weights_sparse
    from npuemu.isa.weight_layout import INT8_CONV, pack_conv_weights

    shape = (96, 64, 3, 3)
    weights = random_16_4(3, shape, fewer=True)
    packed = sparse_vendor.encode(weights, "both")
    setting = weights_sparse.decompression(7, 0, 5, list(packed.amounts) + [0] * 14, "t")
    assert setting.mode == "in_out_16_4"
    dense = pack_conv_weights(weights, INT8_CONV)
    raw = np.frombuffer(packed.data[:setting.span], np.uint8)
    np.testing.assert_array_equal(weights_sparse.decompress_weights(raw, setting, dense.size, "t", shape, INT8_CONV),
                                  dense)


def test_tiles_outside_2_x_2_are_refused():
    eye = np.tile(np.eye(4, dtype=np.int8), (8, 8)).reshape(32, 32, 1, 1)  # 4 kernels x 4 channels a tile
    with pytest.raises(sparse_vendor.VendorFormatError, match="64 groups of 4 output channels \\(16:4 tiles"):
        sparse_vendor.encode(eye, "both")
