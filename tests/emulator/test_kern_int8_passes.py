"""Issue 20's faster int8 passes against references written here, each shown to catch a broken
variant: the DPU chain pixel by pixel (``dpu_pixel._rows_pixels_to_atoms``: per-channel operands
untiled, a shared window sum per pixel, nothing gathered, the folded form's ReLU rounding as
``trunc(max(y, 0) + 0.5)``) against the per-element reference chain (tests/emulator/reference);
the depthwise layouts (``depthwise._pad_pixels`` / ``_to_pixel_major``: per row and phase
without a division, the pad written around the input only) against a plain numpy padding and phase split; and the DPU
input's conversion to pixel-major int32 in working buffers (``dpu_pixel._int32_pixels``)
against a plain transposition; the depthwise kernels (the padded path now for every kernel
size and CORE shift with an int8 pad value, the general one for pad values past int8) against
the reference convolution."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import numerics as nm
from npuemu.emulator.kernels import ConvGeometry, EwConfig, OutCvtConfig, XStageConfig
from npuemu.emulator.kernels import depthwise, dpu_pixel
from tests.emulator.reference import arithmetic as ref_arith
from tests.emulator.reference import convolution as ref
from tests.emulator.reference import layouts as ref_layouts
from tests.emulator.test_dpu_pixel import as_atoms, channel_blocks, expected_cube, run
from tests.emulator.test_kernels_mac import as_dict

# ---------------------------------------------------------------------------------------------
# The folded chain, pixel by pixel
# ---------------------------------------------------------------------------------------------


@st.composite
def row_cases(draw):
    """A task the pixel-by-pixel variant takes: pixel-major int32 data, window sums none, one per
    pixel or one per pixel and channel, atoms holding all the channels or the first ones; BS's
    clamp from 0 (BS or BN ReLU) or not, either rounding; no EW stage (OUT_CVT's scale >= 0:
    ``_folded_rows``) or an EW add with its converter, the operand per pixel or per channel
    (``_ew_rows``, OUT_CVT's scale of either sign)."""
    out_dtype = draw(st.sampled_from([np.int8, np.int16, np.int32]))
    c2 = 16 // np.dtype(out_dtype).itemsize
    surfaces = draw(st.integers(1, 3))
    channels = c2 * surfaces + draw(st.sampled_from([0, 0, 1, c2 - 1, c2 + 3]))  # past the atoms' lanes too
    height, width = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = draw(st.sampled_from([2**7, 2**15, 2**24, 2**31]))
    data = np.clip(rng.integers(-magnitude, magnitude + 1, (channels, height, width)),
                   -(2**31), 2**31 - 1).astype(np.int32)
    data.flat[rng.integers(0, data.size)] = draw(st.sampled_from([-(2**31), 2**31 - 1, 0, -1, 1]))
    shift = draw(st.sampled_from([0, 1, 8, 14, 20, 31]))
    bs = XStageConfig(alu_enable=draw(st.booleans()), alu_algo=nm.ALU_ADD, mul_enable=draw(st.booleans()),
                      shift_positive=shift, shift_negative=shift, relu=draw(st.booleans()),
                      cpend_enable=draw(st.booleans()))
    bn = XStageConfig(relu=draw(st.booleans()), relux=draw(st.booleans()),
                      relux_value=draw(st.sampled_from([0, 127, 14037, 2**31 - 1])))
    ew = draw(st.none() | st.builds(
        EwConfig, cvt_enable=st.booleans(), cvt_offset=st.sampled_from([-128, 0, 7]),
        cvt_scale=st.sampled_from([-(2**15), 1, 23062, 2**15 - 1]), cvt_shift=st.sampled_from([0, 3, 16, 31]),
        cvt_round=st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY]), op_enable=st.booleans(),
        alu_algo=st.just(nm.ALU_ADD), relu=st.booleans()))
    scales = [0, 1, 3, 19049, 2**15 - 1] + ([-3, -(2**15)] if ew is not None else [])
    cvt = OutCvtConfig(draw(st.sampled_from(scales)), draw(st.sampled_from([0, 1, 12, 20, 33])),
                       draw(st.sampled_from([-(2**31), -128, -1, 0, 12, 2**31 - 1])),
                       draw(st.sampled_from([nm.ROUND_HALF_EVEN, nm.ROUND_HALF_AWAY])))
    limit = 2**15
    operands = [rng.integers(-(2**31), 2**31, channels), rng.integers(-limit, limit, channels),
                rng.integers(-limit, limit, channels)]
    groups = draw(st.sampled_from([1, channels]))
    sums = rng.integers(-(2**10), 2**10 + 1, (height, width, groups))
    sums = np.ascontiguousarray(sums, np.int32).transpose(2, 0, 1)  # a pixel-major buffer as [G][H][W]
    operand = rng.integers(-(2**31), 2**31, data.shape).astype(np.int32)
    if draw(st.booleans()):  # one per channel
        operand = np.ascontiguousarray(np.broadcast_to(operand[:, :1, :1], data.shape))
    stages = {"bs": draw(st.none() | st.just(bs)), "bn": draw(st.none() | st.just(bn)), "ew": ew, "cvt": cvt}
    return data, sums, operands, stages, operand, out_dtype, c2, surfaces


def run_rows(case):
    """The pass on ``case`` and the reference chain's atoms; asserts the pixel-by-pixel variant's
    conditions hold (so it is what ran, but for window sums per channel with atoms of every
    channel, which keep the flat variant)."""
    data, sums, (alu, cpend, mul), stages, operand, out_dtype, c2, surfaces = case
    ew = stages["ew"]
    chain = dpu_pixel.chain_settings(stages["bs"], stages["bn"], ew, stages["cvt"], np.dtype(out_dtype),
                                     tuple(int(np.abs(row).max()) for row in (alu, cpend, mul)),
                                     np.dtype(np.int32), np.dtype(np.int32))
    assert chain is not None and (ew is not None or chain[0][dpu_pixel.CH_K] >= 0)
    assert int(np.abs(sums).max()) <= chain[1]
    if ew is None:
        passed = None
    elif (operand == operand[:, :1, :1]).all():  # per channel: [1][1][C]
        passed = np.ascontiguousarray(operand[:, 0, 0])[None, None, :]
    else:
        passed = channel_blocks(operand, "hwc", data.shape[0])
    atoms, _ = run(data, "hwc", data.shape[0], out_dtype, c2, surfaces, bs=stages["bs"], bs_alu=alu,
                   bs_cpend=cpend, bs_mul=mul, window_sum=sums, bn=stages["bn"], bn_alu=0, bn_mul=1, ew=ew,
                   ew_operand=passed, cvt=stages["cvt"])
    expected = expected_cube(data, sums, alu, cpend, mul, (0, 1), operand, stages, out_dtype)
    return atoms, as_atoms(expected, c2, surfaces, out_dtype)


@settings(max_examples=150, deadline=None)
@given(row_cases())
def test_pixel_rows_match_the_reference_chain(case):
    atoms, expected = run_rows(case)
    assert np.array_equal(atoms, expected)


def relu_case(cpend_enable=True, ew=False):
    """MobileNetV2's common task (BS CPEND + ALU + MUL >> 3, BN ReLU6, OUT_CVT to int8) with BS
    sums on both sides of 0 and of every half; with ``ew`` a residual add after it."""
    rng = np.random.default_rng(7)
    channels, height, width = 32, 2, 7
    data = rng.integers(-(2**14), 2**14, (channels, height, width)).astype(np.int32)
    bs = XStageConfig(alu_enable=True, alu_algo=nm.ALU_ADD, mul_enable=True, shift_positive=3, shift_negative=3,
                      cpend_enable=cpend_enable)
    bn = XStageConfig(relu=True, relux=True, relux_value=14037)
    cvt = OutCvtConfig(19049, 20, -128, nm.ROUND_HALF_EVEN)
    operands = [rng.integers(-(2**12), 2**12, channels), rng.integers(-300, 300, channels),
                rng.integers(1, 9, channels)]
    sums = rng.integers(-900, 900, (1, height, width)).astype(np.int32)
    add = EwConfig(cvt_enable=True, cvt_offset=3, cvt_scale=3, cvt_shift=1, op_enable=True, alu_algo=nm.ALU_ADD)
    operand = rng.integers(-128, 128, data.shape).astype(np.int32)
    return data, sums, operands, {"bs": bs, "bn": bn, "ew": add if ew else None, "cvt": cvt}, operand, np.int8, 16, 2


@pytest.mark.parametrize("cpend_enable, ew", [(True, False), (False, False), (True, True)])
def test_mobilenet_tasks_match_the_reference(cpend_enable, ew):
    atoms, expected = run_rows(relu_case(cpend_enable, ew))
    assert np.array_equal(atoms, expected)
    assert len(np.unique(expected)) > 20  # the values spread over the range, not all clamped


def pure_chain_pixels(data, sums, layout, operands, operand, chain, surfaces, width, tile, offsets, target):
    """``_chain_pixels_to_atoms``' pixel-by-pixel branch in its pure-Python form (its row kernels
    as a test set them)."""
    window = sums.reshape(-1, data.shape[2] if layout == dpu_pixel.SUMS_PIXEL_MAJOR else 1)
    dpu_pixel._rows_pixels_to_atoms.py_func(data[0], window, layout, operands, operand[0], chain, surfaces, width,
                                            tile, offsets, target)


@pytest.mark.parametrize("broken", [None, "window", "operand"])
def test_the_rows_check_catches_dropped_inputs(monkeypatch, broken):
    """The check on the pure-Python form: as it is it passes; with the folded row kernel ignoring
    the shared window sum, or the EW row kernel reading an operand of zeros (plausible slips),
    it fails."""
    folded, ew_rows = dpu_pixel._folded_rows.py_func, dpu_pixel._ew_rows.py_func

    def no_window(rows, window, layout, first, operands, chain, out, even):
        folded(rows, window, dpu_pixel.SUMS_NONE, first, operands, chain, out, even)

    def no_operand(rows, window, layout, first, operands, operand, chain, out):
        ew_rows(rows, window, layout, first, operands, np.zeros_like(operand), chain, out)

    monkeypatch.setattr(dpu_pixel, "_folded_rows", no_window if broken == "window" else folded)
    monkeypatch.setattr(dpu_pixel, "_ew_rows", no_operand if broken == "operand" else ew_rows)
    monkeypatch.setattr(dpu_pixel, "_chain_pixels_to_atoms", pure_chain_pixels)
    atoms, expected = run_rows(relu_case(ew=broken == "operand"))
    assert np.array_equal(atoms, expected) == (broken is None)


# ---------------------------------------------------------------------------------------------
# The depthwise layouts
# ---------------------------------------------------------------------------------------------


def padded_phases(atoms, pad_value, pad_top, pad_left, padded_h, stride, phase_w):
    """Reference: the atoms [S][H][W][C2] pixel-major, placed at (pad_top, pad_left) in a
    [padded_h][phase_w * stride] grid of the pad value, then column X to phase X mod stride,
    position X // stride: [padded_h][stride][phase_w][S * C2] int8."""
    surfaces, height, width, c2 = atoms.shape
    grid = np.full((padded_h, phase_w * stride, surfaces * c2), pad_value, np.int8)
    pixels = atoms.transpose(1, 2, 0, 3).reshape(height, width, surfaces * c2)
    grid[pad_top:pad_top + height, pad_left:pad_left + width] = pixels
    return np.stack([grid[:, phase::stride] for phase in range(stride)], axis=1)


@st.composite
def layouts(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    c2 = draw(st.sampled_from([8, 16, 32]))
    surfaces, height, width = draw(st.integers(1, 4)), draw(st.integers(1, 9)), draw(st.integers(1, 11))
    stride, pad_top, pad_left = draw(st.integers(1, 3)), draw(st.integers(0, 3)), draw(st.integers(0, 3))
    padded_h = height + pad_top + draw(st.integers(0, 3))
    phase_w = -(-(width + pad_left + draw(st.integers(0, 4))) // stride)
    atoms = rng.integers(-128, 128, (surfaces, height, width, c2)).astype(np.int8)
    return atoms, int(rng.integers(-128, 128)), pad_top, pad_left, padded_h, stride, phase_w


def run_pad(kernel, atoms, pad_value, pad_top, pad_left, padded_h, stride, phase_w):
    surfaces, _, _, c2 = atoms.shape
    words = np.full((padded_h, stride, phase_w, surfaces * c2 // 8), 0x5A5A5A5A5A5A5A5A, np.uint64)  # every word rewritten
    pad_word = np.uint64((pad_value & 0xFF) * 0x0101010101010101)
    kernel(atoms.view(np.uint64), pad_word, words, pad_top, pad_left)
    return words.view(np.int8).reshape(padded_h, stride, phase_w, surfaces * c2)


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_pad_pixels_match_a_plain_padding(layout):
    assert np.array_equal(run_pad(depthwise._pad_pixels, *layout), padded_phases(*layout))


@settings(max_examples=150, deadline=None)
@given(layouts())
def test_to_pixel_major_matches_a_plain_phase_split(layout):
    atoms, _, _, _, _, stride, _ = layout
    surfaces, height, width, c2 = atoms.shape
    phase_w = -(-width // stride)
    words = np.zeros((height, stride, phase_w, surfaces * c2 // 8), np.uint64)
    depthwise._to_pixel_major(atoms.view(np.uint64), words)
    got = words.view(np.int8).reshape(height, stride, phase_w, surfaces * c2)
    want = padded_phases(atoms, 0, 0, 0, height, stride, phase_w)
    for phase in range(stride):  # the positions that hold an input column
        columns = len(range(phase, width, stride))
        assert np.array_equal(got[:, phase, :columns], want[:, phase, :columns])


def test_the_padding_check_catches_a_scatter_that_ignores_the_left_pad(monkeypatch):
    scatter = depthwise._scatter_pixels

    def broken(words, phased_words, pad_top, pad_left):
        scatter(words, phased_words, pad_top, 0)

    monkeypatch.setattr(depthwise, "_scatter_pixels", broken)
    layout = (np.arange(2 * 3 * 5 * 16).reshape(2, 3, 5, 16).astype(np.int8), -7, 1, 2, 5, 2, 4)
    assert not np.array_equal(run_pad(depthwise._pad_pixels.py_func, *layout), padded_phases(*layout))
    monkeypatch.setattr(depthwise, "_scatter_pixels", scatter)  # the pure form itself passes
    assert np.array_equal(run_pad(depthwise._pad_pixels.py_func, *layout), padded_phases(*layout))


# ---------------------------------------------------------------------------------------------
# The DPU input as pixel-major int32
# ---------------------------------------------------------------------------------------------


def pixel_major(cube, channels):
    """Reference: channel c of pixel p is cube[c // L, p, c % L]."""
    surfaces, pixels, lanes = cube.shape
    return cube.transpose(1, 0, 2).reshape(pixels, surfaces * lanes)[:, :channels].astype(np.int64)


@st.composite
def cubes(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = draw(st.sampled_from([np.int8, np.int16, np.int32]))
    lanes = draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
    surfaces, pixels = draw(st.integers(1, 4)), draw(st.integers(1, 40))
    channels = draw(st.integers((surfaces - 1) * lanes + 1, surfaces * lanes))
    info = np.iinfo(dtype)
    return rng.integers(int(info.min), int(info.max) + 1, (surfaces, pixels, lanes)).astype(dtype), channels


@settings(max_examples=150, deadline=None)
@given(cubes(), cubes())
def test_int32_pixels_match_a_plain_transposition(first, second):
    """Two cubes converted one after the other into the data and operand buffers: each holds its
    own values (the buffers are distinct), again after a second conversion into the first."""
    data = dpu_pixel._int32_pixels(*first)
    operand = dpu_pixel._int32_pixels(*second, "dpu operand")
    assert data.dtype == operand.dtype == np.int32
    assert np.array_equal(pixel_major(data, first[1]), pixel_major(*first))
    assert np.array_equal(pixel_major(operand, second[1]), pixel_major(*second))


def test_the_int32_check_catches_a_move_that_drops_a_surface(monkeypatch):
    move = dpu_pixel._atoms_to_pixels

    def broken(words, out):
        move(words[:-1], out)

    monkeypatch.setattr(dpu_pixel, "_atoms_to_pixels", broken)
    cube = np.arange(3 * 5 * 16).reshape(3, 5, 16).astype(np.int8)
    dpu_pixel.working_buffer("dpu atom words", 5 * 3 * 2, np.uint64)[:] = 0  # nothing left from before
    out = dpu_pixel._int32_pixels(cube, 40)
    assert not np.array_equal(out[0], pixel_major(cube, 40))
    monkeypatch.setattr(dpu_pixel, "_atoms_to_pixels", move)
    assert np.array_equal(dpu_pixel._int32_pixels(cube, 40)[0], pixel_major(cube, 40))


def test_int32_pixels_keep_an_int32_cube_as_it_is():
    cube = np.arange(24, dtype=np.int32).reshape(1, 3, 8)
    assert dpu_pixel._int32_pixels(cube, 8) is cube
    wide = np.arange(24, dtype=np.int64).reshape(1, 3, 8)
    assert np.array_equal(dpu_pixel._int32_pixels(wide, 8), wide)


# ---------------------------------------------------------------------------------------------
# The depthwise kernels: the padded path now takes every kernel size and CORE shift with an int8
# pad value; the general kernel keeps pad values past int8
# ---------------------------------------------------------------------------------------------


def depthwise_case(seed, kernel, stride, dilation, channels, max_height=8, max_width=11):
    """A random int8 depthwise case: (geometry, x [C, H, W], w [C, 1, kh, kw]) with random padding, H and W
    up to the maxima (grown where the kernel would leave no output)."""
    rng = np.random.default_rng(seed)
    kernel_h, kernel_w = kernel
    height, width = int(rng.integers(1, max_height + 1)), int(rng.integers(1, max_width + 1))
    pad_top, pad_left = int(rng.integers(0, kernel_h)), int(rng.integers(0, kernel_w))
    out_h = (height + 2 * pad_top - dilation * (kernel_h - 1) - 1) // stride + 1
    out_w = (width + 2 * pad_left - dilation * (kernel_w - 1) - 1) // stride + 1
    if out_h < 1 or out_w < 1:
        out_h, out_w = 1, 1
        height, width = height + dilation * (kernel_h - 1), width + dilation * (kernel_w - 1)
    geometry = ConvGeometry(kernel_h, kernel_w, out_h, out_w, stride, stride, dilation, dilation, pad_top, pad_left,
                            channels)
    x = rng.integers(-128, 128, (channels, height, width)).astype(np.int8)
    w = rng.integers(-128, 128, (channels, 1, kernel_h, kernel_w)).astype(np.int8)
    return geometry, x, w


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([(1, 1), (5, 5), (7, 7), (3, 3), (1, 3), (3, 5)]),
       st.integers(1, 2), st.integers(1, 2), st.sampled_from([0, 0, 3, 12]),
       st.sampled_from([-128, 127, -5, 200, -300]), st.integers(1, 40), st.sampled_from([0, 7]))
def test_depthwise_kernels_match_the_reference(seed, kernel, stride, dilation, truncate, pad_value, channels, extra):
    geometry, x, w = depthwise_case(seed, kernel, stride, dilation, channels)
    pad_top, pad_left = geometry.pad_top, geometry.pad_left
    atoms = ref_layouts.nchw_to_nc1hwc2(x, 16)
    atoms[-1, :, :, channels % 16 or 16:] = 77  # lanes past the channels: never data
    padded = ref.padded_input(x, pad_top, pad_left, geometry.padded_h, geometry.padded_w, pad_value, np.int64)
    exact = ref.conv(padded, w, as_dict(geometry))
    out_channels = -(-channels // 16) * 16 + extra
    out, sums = depthwise.depthwise_int8_atoms(atoms, w, geometry, pad_value, truncate, nm.ROUND_HALF_AWAY,
                                               out_channels)
    out = out.T.reshape((out_channels,) + exact.shape[1:])
    expected = np.array([ref_arith.core(int(v), truncate, "half_away") for v in exact.ravel()])
    assert np.array_equal(out[:channels].ravel(), expected)
    assert np.array_equal(sums[:channels], ref.window_sums(padded, as_dict(geometry)))
    assert not out[channels:].any() and not sums[channels:].any()


@pytest.mark.parametrize("width_bits, equal", [(16, True), (8, False)])
def test_the_depthwise_check_catches_products_cut_to_8_bits(monkeypatch, width_bits, equal):
    """``_depthwise_rows`` in its pure-Python form with the 16-bit products (equal to the
    reference) and with products cut to 8 bits (a slip the check must catch)."""
    cut = np.int16 if width_bits == 16 else np.int8
    monkeypatch.setattr(depthwise, "_product16",
                        lambda weight, value: np.int32(np.int64(int(weight) * int(value)).astype(cut)))
    monkeypatch.setattr(depthwise, "_depthwise_rows", depthwise._depthwise_rows.py_func)
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (16, 4, 5)).astype(np.int8)
    w = rng.integers(-128, 128, (16, 1, 5, 5)).astype(np.int8)
    geometry = ConvGeometry(5, 5, 4, 5, 1, 1, 1, 1, 2, 2, 16)
    padded = ref.padded_input(x, 2, 2, geometry.padded_h, geometry.padded_w, -7, np.int64)
    out, _ = depthwise.depthwise_int8_atoms(ref_layouts.nchw_to_nc1hwc2(x, 16), w, geometry, -7, 0,
                                            nm.ROUND_HALF_AWAY, 16)
    assert np.array_equal(out.T.reshape(16, 4, 5), ref.conv(padded, w, as_dict(geometry))) == equal
