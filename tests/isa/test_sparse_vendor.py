"""The vendor's RK3576 4:2 sparse streams (isa/sparse_vendor.py, compiler/LOWERING.md 27) against
a reference decoder written here bit by bit from the documented format, and against the vendor's
own build: ../shared/rknn-fixtures-ops/sparse_rk3576_int8's weight tensor decodes to the ONNX
model's weights quantized per output channel (scale max|w| / 127, the sparse build's w4a16
scales), and encoding those weights gives the vendor's tensor byte for byte."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npuemu.isa import sparse_vendor

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "rknn-fixtures-ops"
PAIRS = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
CODES = {"00": 0, "10": 1, "111": 2, "110": 3, "011": 4, "0101": 5, "01001": 6, "01000": 7}


class Bits:
    """Reads a stream's bits, least significant bit of each byte first."""

    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, count: int) -> int:
        value = 0
        for i in range(count):
            byte = self.data[(self.at + i) // 8] if (self.at + i) // 8 < len(self.data) else 0
            value |= ((byte >> ((self.at + i) % 8)) & 1) << i
        self.at += count
        return value

    def symbol(self) -> int:
        code = ""
        while code not in CODES:
            code += str(self.take(1))
        return CODES[code]


def reference_stream(stream: bytes, blocks: int) -> list[tuple[list[int], list[int]]]:
    """[(8 values, 8 fields)] per block: int32 bias, 8 width nibbles, 8 zero bytes, then per block
    the width symbol, 8 signs, 8 magnitudes of that width, 8 two-bit fields; v = int8(d - bias)."""
    bias = int.from_bytes(stream[:4], "little", signed=True)
    widths = [(int.from_bytes(stream[4:8], "little") >> (4 * i)) & 0xF for i in range(8)]
    bits, out = Bits(stream[16:]), []
    for _ in range(blocks):
        width = widths[bits.symbol()]
        signs = [bits.take(1) for _ in range(8)]
        magnitudes = [bits.take(width) for _ in range(8)]
        fields = [bits.take(2) for _ in range(8)]
        stored = [~m if s else m for s, m in zip(signs, magnitudes)]
        out.append(([((d - bias + 128) % 256) - 128 for d in stored], fields))
    return out


def reference_decode(data: bytes, amounts: tuple[int, int], shape: tuple[int, ...]) -> np.ndarray:
    """Both streams -> weights [OC][IC][KH][KW]: blocks of 8 groups of 4 input channels in the order
    [OC/32][IC/64][tap][32 kernels][32-channel halves]; the mask code is field0 | field1 << 2."""
    oc_count, ic_count, kh, kw = shape
    slots = [(oc, ic, tap) for ob in range(0, oc_count, 32) for ib in range(0, ic_count, 64)
             for tap in range(kh * kw) for oc in range(ob, ob + 32)
             for ic in range(ib, min(ib + 64, ic_count), 32)]
    second = -(-(amounts[0] + 1) * 16 // 64) * 64
    first_stream = reference_stream(data[:(amounts[0] + 1) * 16], len(slots))
    second_stream = reference_stream(data[second:second + (amounts[1] + 1) * 16], len(slots))
    weights = np.zeros((oc_count, ic_count, kh * kw), np.int8)
    for (oc, ic, tap), (v0, f0), (v1, f1) in zip(slots, first_stream, second_stream):
        for group in range(8):
            p0, p1 = PAIRS[f0[group] | f1[group] << 2]
            weights[oc, ic + 4 * group + p0, tap] = v0[group]
            weights[oc, ic + 4 * group + p1, tap] = v1[group]
    return weights.reshape(shape)


def random_sparse(seed: int, shape: tuple[int, int, int, int], fewer: bool) -> np.ndarray:
    """int8 weights with a random 4:2 mask along input channels (``fewer``: some kept values are 0)."""
    rng = np.random.default_rng(seed)
    oc, ic, kh, kw = shape
    values = np.clip(np.rint(rng.normal(0, rng.uniform(1, 60), shape)), -128, 127).astype(np.int8)
    groups = values.reshape(oc, ic // 4, 4, kh, kw)
    keep = np.zeros(groups.shape, bool)
    np.put_along_axis(keep, np.argsort(rng.random(groups.shape), axis=2)[:, :, :2], True, axis=2)
    if fewer:
        keep &= rng.random(groups.shape) < 0.7
    return np.where(keep, groups, 0).reshape(shape).astype(np.int8)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), oc=st.sampled_from([32, 64]), ic=st.sampled_from([32, 64, 96, 128]),
       kernel=st.sampled_from([(1, 1), (3, 3), (1, 3)]), fewer=st.booleans())
def test_encode_then_decode_against_the_reference(seed, oc, ic, kernel, fewer):
    weights = random_sparse(seed, (oc, ic) + kernel, fewer)
    packed = sparse_vendor.encode(weights)
    np.testing.assert_array_equal(reference_decode(packed.data, packed.amounts, weights.shape), weights)
    np.testing.assert_array_equal(sparse_vendor.decode(packed.data, packed.amounts, weights.shape), weights)
    assert sparse_vendor.span_bytes(packed.amounts) <= len(packed.data)
    assert len(packed.data) % 64 == 0


def test_bias_is_minus_the_most_frequent_value_lowest_byte_on_a_tie():
    """[V] chosen-weight builds: ties between -5 and 9 give bias -9 (byte 9 < byte 251), -9 and -5
    give 9, 5 and 9 give -5; a stream of 1s gives -1 and stores only zeros (width 0)."""
    for a, b, bias in ((-5, 9, -9), (5, 9, -5), (-9, -5, 9)):
        values = np.array([[a, b] * 4] * 8, np.int8)
        stream = sparse_vendor.encode_stream(values, np.zeros(values.shape, np.int64))
        assert int.from_bytes(stream[:4], "little", signed=True) == bias
    ones = sparse_vendor.encode_stream(np.ones((4, 8), np.int8), np.zeros((4, 8), np.int64))
    assert ones[:8] == bytes.fromhex("ffffffff10325476") and not any(ones[16:])


def _fixture_weights() -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(FIXTURES / "sparse_rk3576_int8" / "model.onnx")
    w = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "w1").astype(np.float32)
    scale = (np.abs(w).reshape(w.shape[0], -1).max(axis=1) / np.float32(127)).astype(np.float32)
    return np.clip(np.rint(w / scale[:, None, None, None]), -127, 127).astype(np.int8)


def _fixture_tensor() -> bytes:
    from npuemu.isa.rknn import load_rknn

    model = load_rknn(FIXTURES / "sparse_rk3576_int8" / "model.rknn")
    tensor = next(t for t in model.tensors if t.name == "w1")
    return bytes(model.blobs[tensor.blob_index])


@pytest.mark.skipif(not (FIXTURES / "sparse_rk3576_int8").exists(), reason="rknn op fixtures not present")
def test_the_vendor_tensor_decodes_to_the_model_weights_and_reencodes_byte_for_byte():
    """DCOMP_AMOUNT0/1 = 712/716 (regcmd_diff_vs_off.txt); stream biases 0 and 12, width map
    0x01243567 (widths 7, 6, 5 first) [V]."""
    tensor, weights = _fixture_tensor(), _fixture_weights()
    assert len(tensor) == 27584
    np.testing.assert_array_equal(reference_decode(tensor, (712, 716), weights.shape), weights)
    np.testing.assert_array_equal(sparse_vendor.decode(tensor, (712, 716), weights.shape), weights)
    packed = sparse_vendor.encode(weights)
    assert packed.amounts == (712, 716)
    assert packed.data == tensor
    assert tensor[:8] == bytes.fromhex("0000000067352401")  # bias 0, widths 7, 6, 5, 3, 4, 2, 1, 0
    assert tensor[11456:11464] == bytes.fromhex("0c00000067352401")  # bias 12: the mode is -12


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:100], r"the streams span \d+ bytes, 100 given"),
    (lambda b: b[:8] + b"\x01" + b[9:], "header bytes 8..15 are 01"),
    (lambda b: b"\x00\x01\x00\x00" + b[4:], "header bias 256 is not an int8"),
    (lambda b: b[:4] + b"\xff\xff\xff\xff" + b[8:], "names a width above 7"),
])
def test_damaged_streams_are_refused(damage, message):
    packed = sparse_vendor.encode(random_sparse(3, (32, 64, 3, 3), False))
    with pytest.raises(sparse_vendor.VendorFormatError, match=message):
        sparse_vendor.decode(damage(packed.data), packed.amounts, (32, 64, 3, 3))


def test_a_truncated_stream_and_a_bad_mask_code_are_refused():
    weights = random_sparse(4, (32, 32, 1, 1), False)
    packed = sparse_vendor.encode(weights)
    with pytest.raises(sparse_vendor.VendorFormatError, match="runs past the stream"):
        sparse_vendor.decode(packed.data, (0, packed.amounts[1]), weights.shape)
    data = bytearray(packed.data)
    second = sparse_vendor.stream_starts(packed.amounts)[1]
    data[second + 16:second + 16 + (packed.amounts[1] + 1) * 16 - 16] = b"\xff" * ((packed.amounts[1] + 1) * 16 - 16)
    with pytest.raises(sparse_vendor.VendorFormatError):
        sparse_vendor.decode(bytes(data), packed.amounts, weights.shape)


def test_weights_the_format_cannot_hold_are_refused():
    with pytest.raises(sparse_vendor.VendorFormatError, match="256 groups of 4 input channels hold more than 2"):
        sparse_vendor.encode(np.ones((32, 32, 1, 1), np.int8))
    with pytest.raises(sparse_vendor.VendorFormatError, match="48 input channels"):
        sparse_vendor.encode(np.zeros((32, 48, 1, 1), np.int8))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), ic=st.sampled_from([32, 64, 96]), taps=st.sampled_from([1, 9]))
def test_decomp_control_5_reads_the_vendor_streams_in_the_emulator(seed, ic, taps):
    """DECOMP_CONTROL 5 with the vendor's REGNUM 5 and AMOUNT0/1 (2..4 = 0): the decompressor reads
    both streams and gives the CNA the dense blob of isa/weight_layout.py."""
    from npuemu.emulator.kernels import weights_sparse
    from npuemu.isa.weight_layout import INT8_CONV, pack_conv_weights

    shape = (64, ic, taps, 1)
    weights = random_sparse(seed, shape, fewer=True)
    packed = sparse_vendor.encode(weights)
    setting = weights_sparse.decompression(5, 0, 5, list(packed.amounts) + [0] * 11, "t")
    assert setting.span == sparse_vendor.span_bytes(packed.amounts)
    dense = pack_conv_weights(weights, INT8_CONV)
    raw = np.frombuffer(packed.data[:setting.span], np.uint8)
    np.testing.assert_array_equal(weights_sparse.decompress_weights(raw, setting, dense.size, "t", shape, INT8_CONV),
                                  dense)


def test_the_emulator_refuses_one_amount_and_a_wrong_geometry():
    from npuemu.emulator.kernels import weights_sparse
    from npuemu.isa.errors import EmulationError
    from npuemu.isa.weight_layout import INT8_CONV

    with pytest.raises(EmulationError, match="DCOMP_REGNUM=1 with DECOMP_CONTROL=5: its 2 streams"):
        weights_sparse.decompression(5, 0, 1, [7], "t")
    packed = sparse_vendor.encode(random_sparse(5, (32, 64, 1, 1), False))
    setting = weights_sparse.decompression(5, 0, 5, list(packed.amounts) + [0] * 3, "t")
    raw = np.frombuffer(packed.data, np.uint8)
    with pytest.raises(EmulationError, match="decodes to 2048 bytes, the weight sizes say 4096"):
        weights_sparse.decompress_weights(raw, setting, 4096, "t", (32, 64, 1, 1), INT8_CONV)
    with pytest.raises(EmulationError, match="sparse weights \\(DCOMP_ADDR0\\): .*runs past"):
        weights_sparse.decompress_weights(raw, setting, 8192, "t", (32, 64, 4, 1), INT8_CONV)
