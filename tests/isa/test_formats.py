"""The memory formats of ``npuemu.isa`` (weight_layout, lut_format, tensor_layout): what the
compiler writes, the emulator reads back identically, and the figures match their sources."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.compiler import weight_pack
from npuemu.compiler.lower.placement import feature_placement
from npuemu.emulator.kernels import weights as emulator_weights
from npuemu.emulator.regfile import LutPort
from npuemu.isa import lut_format, tensor_layout, weight_layout
from npuemu.platforms import load_platform

KERNEL_GROUPS = st.sampled_from([None, 8, 16, 32, 64])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(oc=st.integers(1, 130), ic=st.integers(1, 130), kh=st.integers(1, 3), kw=st.integers(1, 3),
       fp16=st.booleans(), group=KERNEL_GROUPS, seed=st.integers(0, 2**16))
def test_conv_blob_written_by_the_compiler_reads_back(oc, ic, kh, kw, fp16, group, seed) -> None:
    rng = np.random.default_rng(seed)
    dtype = np.float16 if fp16 else np.int8
    weights = rng.integers(-128, 128, (oc, ic, kh, kw)).astype(dtype)
    layout = weight_pack.conv_blocking("float16" if fp16 else "int8", group)
    blob = weight_pack.pack_conv_weights(weights, rng.integers(-128, 128, oc).astype(dtype), layout)
    assert blob.size == layout.elements(oc, ic, kh, kw)
    np.testing.assert_array_equal(emulator_weights.unpack_conv_weights(blob, oc, ic, kh, kw, layout), weights)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(channels=st.integers(1, 200), kh=st.integers(1, 5), kw=st.integers(1, 5), fp16=st.booleans())
def test_depthwise_blob_written_by_the_compiler_reads_back(channels, kh, kw, fp16) -> None:
    dtype = np.float16 if fp16 else np.int8
    weights = (np.arange(channels * kh * kw) % 251 - 125).astype(dtype).reshape(channels, 1, kh, kw)
    layout = weight_pack.depthwise_blocking("float16" if fp16 else "int8")
    blob = weight_pack.pack_depthwise_weights(weights, layout)
    assert blob.size == layout.elements(channels, kh, kw)
    np.testing.assert_array_equal(emulator_weights.unpack_depthwise_weights(blob, channels, kh, kw, layout), weights)


def test_blob_offsets_are_a_permutation_in_the_vendors_block_order() -> None:
    # (48, 48, 1, 1): blocks 32x32, 32x16, 16x32, 16x16 in that order (vendor-corpus layers.csv)
    offsets = weight_layout.conv_blob_offsets(weight_layout.INT8_CONV, 48, 48, 1, 1)
    assert sorted(offsets.reshape(-1).tolist()) == list(range(48 * 48))
    assert offsets[0, 0, 0, 0] == 0 and offsets[0, 1, 0, 0] == 1 and offsets[1, 0, 0, 0] == 32
    assert offsets[0, 32, 0, 0] == 32 * 32 and offsets[32, 0, 0, 0] == 32 * 48
    assert weight_layout.conv_native_shapes(1000, 512, 1, 1) == ((31, 16, 1, 1, 32, 32), (1, 16, 1, 1, 8, 32))


def test_layouts_and_kernel_groups() -> None:
    assert weight_layout.INT8_CONV.with_kernel_group(32) is weight_layout.INT8_CONV
    assert weight_layout.INT8_CONV_RK3566 == weight_layout.ConvWeightLayout(16, 32, 16, 2)
    assert weight_layout.FP16_CONV.with_kernel_group(8) == weight_layout.ConvWeightLayout(8, 32, 8, 2)
    assert weight_layout.INT8_DEPTHWISE.stored_channels(16) == 16  # tail rounded to 16
    assert weight_layout.INT8_DEPTHWISE.stored_channels(70) == 64 + 16


@settings(max_examples=30, deadline=None, derandomize=True)
@given(values=st.lists(st.integers(-8, 7), min_size=2, max_size=64).filter(lambda v: len(v) % 2 == 0),
       high_first=st.booleans())
def test_int4_nibbles_round_trip(values, high_first) -> None:
    packed = weight_layout.pack_int4(np.array(values, np.int8), high_first)
    assert packed.size == len(values) // 2
    np.testing.assert_array_equal(weight_layout.unpack_int4(packed, high_first), values)
    assert weight_layout.pack_int4(np.array([1, -2]), True).tolist() == [0x1E]


def test_bs_blob_groups() -> None:
    assert weight_layout.BS_GROUP_BYTES == 64
    assert weight_layout.bs_group_dtype(weight_layout.BS_USE_ALU).itemsize == 32
    blob = weight_pack.bias_blob(np.arange(10), -np.arange(10), np.arange(10) * 3, 16)
    assert len(blob) == 2 * 64
    alu, cpend, mul = weight_pack.unpack_bias_blob(blob, 10)
    np.testing.assert_array_equal(alu, np.arange(10))
    np.testing.assert_array_equal(cpend, -np.arange(10))
    np.testing.assert_array_equal(mul, np.arange(10) * 3)
    group = np.frombuffer(blob, weight_layout.bs_group_dtype(weight_layout.BS_USE_ALL))
    assert group["ALU"][1].tolist() == [8, 9, 0, 0, 0, 0, 0, 0]


def test_lut_upload_words_land_in_the_emulators_port() -> None:
    table = np.linspace(-32768, 32767, lut_format.LUT_ENTRIES).astype(np.int16)
    port = LutPort()
    port.configure({"LUT_ACCESS_TYPE": lut_format.LUT_ACCESS_WRITE, "LUT_TABLE_ID": lut_format.LUT_TABLE_LO,
                    "LUT_ADDR": 0})
    assert port.data_run(np.array([lut_format.data_word(v) for v in table], np.int64), "test")
    np.testing.assert_array_equal(port.tables[lut_format.LUT_TABLE_LO], table)
    assert lut_format.LUT_TABLES[lut_format.LUT_TABLE_LE] == "LE"
    assert lut_format.LUT_SPAN >> lut_format.LUT_INDEX_SELECT == lut_format.LUT_ENTRIES - 1


@pytest.mark.parametrize(("chip", "dtype", "c2"), [("rk3588", "int8", 16), ("rk3588", "float16", 8),
                                                   ("rk3566", "int8", 8), ("rk3566", "float16", 4)])
def test_nc1hwc2_geometry_per_chip(chip, dtype, c2) -> None:
    placement = feature_placement("t", 0, (13, 4, 4), dtype, load_platform(chip))
    assert placement.c2 == c2
    assert placement.native_shape == (1, -(-13 // c2), 4, 4, c2)  # hardware.md 2: RK3568 (1,2,4,4,8)
    assert placement.surface_stride == 16


def test_surface_stride_rule() -> None:
    # vendor-corpus tasks.csv: 75x75 -> 5628, 7x7 -> 52, 1x1 -> 1 (16-byte atoms), 2 with 8-byte pixels
    assert [tensor_layout.surface_atoms(h, h) for h in (75, 7, 1)] == [5628, 52, 1]
    assert tensor_layout.surface_atoms(1, 1, 8) == 2


@settings(max_examples=30, deadline=None, derandomize=True)
@given(channels=st.integers(1, 40), height=st.integers(1, 6), width=st.integers(1, 6), c2=st.sampled_from([4, 8, 16]))
def test_native_image_round_trip(channels, height, width, c2) -> None:
    values = np.arange(channels * height * width, dtype=np.int16).reshape(channels, height, width)
    c1 = -(-channels // c2)
    surface = tensor_layout.surface_atoms(height, width, c2)
    image = tensor_layout.to_native(values, c1, c2, surface)
    assert image.shape == (c1, surface, c2)
    assert image[0, 0, 0] == values[0, 0, 0] and (channels < 2 or image[0, 0, 1] == values[1, 0, 0])
    np.testing.assert_array_equal(
        tensor_layout.from_native(image.reshape(-1), channels, height, width, c1, c2, surface), values)
