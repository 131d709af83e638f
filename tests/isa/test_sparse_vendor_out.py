"""The vendor's RK3576 4:2 sparse streams along OUTPUT channels (isa/sparse_vendor.py ``along="out"``,
compiler/LOWERING.md 43) against a reference decoder written here from the documented order, and
against a vendor build committed in tests/data/sparse_vendor (how it was made: its README): the
vendor's tensor decodes to the weights, and encoding the weights gives the tensor byte for byte.

Order written out (the reference): kept row 2g + k holds the k-th kept value of kernel group g
(kernels 4g..4g+3) for every input channel and tap; blocks of 8 values run over [kept rows / 32]
[IC / 32][tap][32 kept rows][the 16 channels of parity s in 2 blocks] for stream s; a value's
2-bit field is the group's mask code & 3 in k = 0 rows and code >> 2 in k = 1 rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.isa import sparse_vendor

from tests.isa.test_sparse_vendor import PAIRS, reference_stream

DATA = Path(__file__).resolve().parents[1] / "data" / "sparse_vendor"


def reference_decode_out(data: bytes, amounts: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    oc_count, ic_count, kh, kw = shape
    taps = kh * kw
    kept = {}  # (kept row, channel, tap) -> (value, field)
    starts = (0, -(-(amounts[0] + 1) * 16 // 64) * 64)
    for stream in range(2):
        slots = [(row, ib + c, tap) for rb in range(0, oc_count // 2, 32) for ib in range(0, ic_count, 32)
                 for tap in range(taps) for row in range(rb, min(rb + 32, oc_count // 2))
                 for c in range(stream, 32, 2)]
        blocks = reference_stream(data[starts[stream]:starts[stream] + (amounts[stream] + 1) * 16], len(slots) // 8)
        flat = [(v, f) for values, fields in blocks for v, f in zip(values, fields)]
        kept.update(zip(slots, flat))
    weights = np.zeros((oc_count, ic_count, taps), np.int8)
    for group in range(oc_count // 4):
        for ic in range(ic_count):
            for tap in range(taps):
                (v0, f0), (v1, f1) = kept[(2 * group, ic, tap)], kept[(2 * group + 1, ic, tap)]
                p0, p1 = PAIRS[f0 | f1 << 2]
                weights[4 * group + p0, ic, tap] = v0
                weights[4 * group + p1, ic, tap] = v1
    return weights.reshape(shape)


def random_out_sparse(seed: int, shape: tuple[int, int, int, int], fewer: bool) -> np.ndarray:
    """int8 weights with a random 4:2 mask along output channels (``fewer``: some kept values 0)."""
    rng = np.random.default_rng(seed)
    values = np.clip(np.rint(rng.normal(0, rng.uniform(1, 60), shape)), -128, 127).astype(np.int8)
    groups = np.moveaxis(values, 0, -1).reshape(shape[1:] + (shape[0] // 4, 4))
    keep = np.zeros(groups.shape, bool)
    np.put_along_axis(keep, np.argsort(rng.random(groups.shape), axis=-1)[..., :2], True, axis=-1)
    if fewer:
        keep &= rng.random(groups.shape) < 0.7
    return np.ascontiguousarray(np.moveaxis(np.where(keep, groups, 0).reshape(shape[1:] + (shape[0],)), -1, 0))


def test_the_vendor_build_decodes_and_re_encodes_byte_for_byte():
    fixture = np.load(DATA / "out_4_2_96x32x1x1.npz")
    weights, tensor, amounts = fixture["weights"], fixture["tensor"].tobytes(), tuple(int(a) for a in fixture["amounts"])
    assert amounts == (62, 62) and len(tensor) == 2432
    np.testing.assert_array_equal(reference_decode_out(tensor, amounts, weights.shape), weights)
    np.testing.assert_array_equal(sparse_vendor.decode(tensor, amounts, weights.shape, "out"), weights)
    packed = sparse_vendor.encode(weights, "out")
    assert packed.amounts == amounts and packed.data == tensor
    # the same weights along input channels are not 4:2 there: the input-channel format refuses them
    with pytest.raises(sparse_vendor.VendorFormatError, match="groups of 4 input channels hold more than 2"):
        sparse_vendor.encode(weights, "in")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), oc=st.sampled_from([32, 64, 96, 128]), ic=st.sampled_from([32, 64, 96]),
       kernel=st.sampled_from([(1, 1), (3, 3), (1, 3)]), fewer=st.booleans())
def test_encode_then_decode_against_the_reference(seed, oc, ic, kernel, fewer):
    weights = random_out_sparse(seed, (oc, ic) + kernel, fewer)
    packed = sparse_vendor.encode(weights, "out")
    np.testing.assert_array_equal(reference_decode_out(packed.data, packed.amounts, weights.shape), weights)
    np.testing.assert_array_equal(sparse_vendor.decode(packed.data, packed.amounts, weights.shape, "out"), weights)
    # the vendor's tensor size: end of stream 1 + kept values / 4, rounded up to 64 [V: 9 builds]
    assert len(packed.data) == -(-(sparse_vendor.span_bytes(packed.amounts) + weights.size // 8) // 64) * 64


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), oc=st.sampled_from([32, 96]), taps=st.sampled_from([1, 9]))
def test_decomp_control_6_reads_the_output_channel_streams_in_the_emulator(seed, oc, taps):
    """npuemu's register stand-in for the vendor's output-channel mode (DECOMP_CONTROL 6, REGNUM 5)
    gives the CNA the dense blob of isa/weight_layout.py."""
    from npuemu.emulator.kernels import weights_sparse
    from npuemu.isa.weight_layout import INT8_CONV, pack_conv_weights

    shape = (oc, 64, taps, 1)
    weights = random_out_sparse(seed, shape, fewer=True)
    packed = sparse_vendor.encode(weights, "out")
    setting = weights_sparse.decompression(6, 0, 5, list(packed.amounts) + [0] * 14, "t")
    assert setting.mode == "out_4_2" and setting.span == sparse_vendor.span_bytes(packed.amounts)
    dense = pack_conv_weights(weights, INT8_CONV)
    raw = np.frombuffer(packed.data[:setting.span], np.uint8)
    np.testing.assert_array_equal(weights_sparse.decompress_weights(raw, setting, dense.size, "t", shape, INT8_CONV),
                                  dense)


def test_damaged_output_channel_streams_are_refused():
    weights = random_out_sparse(4, (64, 32, 1, 1), False)
    packed = sparse_vendor.encode(weights, "out")
    with pytest.raises(sparse_vendor.VendorFormatError, match="runs past the stream"):
        sparse_vendor.decode(packed.data, (0, packed.amounts[1]), weights.shape, "out")
    with pytest.raises(sparse_vendor.VendorFormatError, match="512 groups of 4 output channels hold more than 2"):
        sparse_vendor.encode(np.ones((64, 32, 1, 1), np.int8), "out")
    with pytest.raises(sparse_vendor.VendorFormatError, match="sparse axis 'across'"):
        sparse_vendor.encode(weights, "across")
