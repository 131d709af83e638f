"""The DPU's transpose writes (emulator/kernels/dpu_transpose.py, REGISTER_SEMANTICS.md 31).

Three kinds of evidence, each against a reference that does not use the emulator:
- small vendor builds committed here (tests/emulator/vendor_dpu_transpose/*.rknn.xz, a few KB each):
  rknn-toolkit2 2.5.0, ``RKNN.config(target_platform='rk3588')``, ``load_onnx`` of a one-node ONNX
  Transpose (opset 13, float32 input of the shape and perm in ``CASES``), ``build(do_quantization=
  True, dataset=2 N(0,1) samples)`` for int8 / ``build(do_quantization=False)`` for fp16,
  ``export_rknn``; then ``xz -9``. A Transpose moves bytes, so the whole output must equal
  numpy's transpose of the quantised (int8) or float16 input exactly (the vendor simulator gave
  exactly that on every build);
- the shipped rknn-fixtures-ops builds, compared with the vendor simulator's outputs;
- the vectorised kernels against numpy layout conversions (NC1HWC2 <-> NHWC / NCHW).
"""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import dpu_transpose
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import EmulationError
from npuemu.isa.rknn import load_rknn
from tests.shared_data import RKNN_FIXTURES_OPS

HERE = Path(__file__).parent / "vendor_dpu_transpose"

#: committed build -> (input shape, perm); which DPU forms each exercises is in REGISTER_SEMANTICS 31
CASES = {
    "nhwc_fp16_24x12x10": ((1, 24, 12, 10), (0, 2, 3, 1)),   # copy, TP_EN, TP_ORG (W 1), lane clearing
    "nhwc_int8_24x12x10": ((1, 24, 12, 10), (0, 2, 3, 1)),   # TP_EN on int8 pairs, byte TP_ORG, compacting copy
    "nhwc_fp16_16x8x8": ((1, 16, 8, 8), (0, 2, 3, 1)),       # TP_EN straight from the input
    "nhwc_int8_40x6x8": ((1, 40, 6, 8), (0, 2, 3, 1)),       # 40 channels: a partial int8 surface
    "nhwc_fp16_8x5x7": ((1, 8, 5, 7), (0, 2, 3, 1)),         # odd H and W
    "nhwc_int8_17x11x6": ((1, 17, 11, 6), (0, 2, 3, 1)),     # odd channels
    "nwch_fp16_20x6x8": ((1, 20, 6, 8), (0, 3, 1, 2)),
    "nwch_int8_32x20x24": ((1, 32, 20, 24), (0, 3, 1, 2)),
    "nwh_fp16_16x6x10": ((1, 16, 6, 10), (0, 1, 3, 2)),      # no TP bit: WDMA 6 x 1 lines of a 1 x 6 cube
    "nwh_int8_16x6x10": ((1, 16, 6, 10), (0, 1, 3, 2)),
    "hcw_int8_8x30x12": ((1, 8, 30, 12), (0, 2, 1, 3)),
    "hcw_fp16_8x30x12": ((1, 8, 30, 12), (0, 2, 1, 3)),       # TP_ORG groups x blocks tiles, TP_EN W 4
    "whc_fp16_12x16x40": ((1, 12, 16, 40), (0, 3, 2, 1)),     # both TP_ORG tile orders in one program
    "whc_int8_12x16x40": ((1, 12, 16, 40), (0, 3, 2, 1)),    # notched copies, byte TP_ORG 48 column groups,
    #                                                          a 3-surface read with LINE_NOTCH 4 (the notch rule)
}


def _runner(name: str, tmp_path: Path) -> RknnRunner:
    path = tmp_path / f"{name}.rknn"
    path.write_bytes(lzma.decompress((HERE / f"{name}.rknn.xz").read_bytes()))
    return RknnRunner(load_rknn(path))


@pytest.mark.parametrize("name", sorted(CASES))
def test_vendor_transpose_build_moves_every_byte(name, tmp_path):
    shape, perm = CASES[name]
    runner = _runner(name, tmp_path)
    x = np.random.RandomState(sum(shape)).randn(*shape).astype(np.float32)
    run = runner.run([x])
    expected = np.transpose(runner.quantize_input(0, x), perm)
    (got,) = run.quantized.values()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    assert run.host_layers == ()


# --- the shipped vendor fixtures, against the vendor simulator ------------------------------------
#: fixture -> (max |emu - sim| allowed, in output LSBs (int8) or absolute (fp16); ...); measured on input_0:
#: the pure moves are bit-identical; conv1d's conv rounds (int8: 1 LSB on 0.08 % of elements; fp16:
#: one fp16 step, 0.00195 at |y| 2..4, on 0.12 %); resize_bilinear_2x_int8 1 LSB on 3.5 % (its phase convs
#: round), its fp16 build bit-identical
FIXTURES = {
    "transpose_nhwc_int8": (0, 1.0), "transpose_nhwc_fp16": (0.0, 1.0), "transpose_heads_fp16": (0.0, 1.0),
    "matmul_act_fp16": (0.0, 1.0), "conv1d_int8": (1, 0.999), "conv1d_fp16": (0.00196, 0.998),
    "resize_bilinear_2x_int8": (1, 0.96), "resize_bilinear_2x_fp16": (0.0, 1.0),
}
#: (the second figure: the fraction of elements that must be identical; measured 0.9992, 0.9988, 0.9648)


def _load(path: Path) -> np.ndarray:
    return np.load(lzma.open(path))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_vendor_fixture_matches_the_simulator(name):
    case = RKNN_FIXTURES_OPS / name
    meta = json.loads((case / "meta.json").read_text())
    names = [e["name"] for e in meta["inputs"]]
    files = ["input_0.npy.xz"] if len(names) == 1 else [f"input_0_{n}.npy.xz" for n in names]
    run = RknnRunner(load_rknn(case / "model.rknn")).run([_load(case / f) for f in files])
    (out,) = run.outputs.values()
    sim = _load(case / "sim_output_0.npy.xz").reshape(out.shape)
    err = np.abs(out.astype(np.float64) - sim)
    lsb = meta["outputs"][0].get("lsb")
    max_err, identical = FIXTURES[name]
    limit = max_err * lsb * 1.0001 if lsb else max_err
    assert err.max() <= limit, (name, err.max())
    assert np.mean(err == 0) >= identical, (name, np.mean(err == 0))


# --- the kernels against numpy layout conversions --------------------------------------------------
def _state(mode: int, width: int, height: int, channels: int, *, dst_surface_stride: int, surface_add: int,
           size_e: int = 7, element_bytes: int = 2, block_atoms: int = 1,
           wdma_atoms: int | None = None) -> SimpleNamespace:
    """What the kernels read of a DpuState (addresses in bytes, as decoded); ``wdma_atoms`` (SIZE_C_WDMA + 1)
    defaults to the column groups."""
    groups = channels * element_bytes // 16
    return SimpleNamespace(width=width, height=height, channels=channels, dst_address=0, atom_bytes=16,
                           dst_surface_stride=dst_surface_stride * 16, surface_add=surface_add * 16, size_e=size_e,
                           transpose=SimpleNamespace(mode=mode, element_bytes=element_bytes, block_atoms=block_atoms,
                                                     wdma_atoms=groups if wdma_atoms is None else wdma_atoms))


def _scatter(starts: np.ndarray, rows: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, np.uint8)
    for start, row in zip(starts, rows):
        out[start:start + row.size] = row
    return out


def _nc1hwc2(planes: np.ndarray, c2: int) -> np.ndarray:
    """[C][H][W] -> [C/c2][H][W][c2] (C a multiple of c2)."""
    c, h, w = planes.shape
    return np.ascontiguousarray(planes.reshape(c // c2, c2, h, w).transpose(0, 2, 3, 1))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 8), st.integers(0, 2 ** 31))
def test_atom_transpose_is_nc1hwc2_to_nhwc(groups, surfaces, seed):
    """The vendor's TP_EN form (transpose_nhwc task 1): W = 8, H = the C1 groups (one per line),
    CHANNEL = the pixels (8 per surface); DST_SURF_STRIDE H atoms, SURFACE_ADD 8 H. The result is NHWC."""
    pixels = 8 * surfaces
    x = np.random.RandomState(seed % 2 ** 32).randn(groups * 8, pixels).astype(np.float16)     # [C][pixels]
    lines = _nc1hwc2(x.reshape(groups * 8, 1, pixels), 8)[:, 0].copy()                             # [C1][pixels][8]
    # the MRDMA's cube [S][H][W][16]: surface s, line g, pixel x = atom s * W + x of line g
    cube = lines.view(np.uint8).reshape(groups, surfaces, 8, 16).transpose(1, 0, 2, 3)
    state = _state(dpu_transpose.ATOM_TRANSPOSE, 8, groups, pixels, dst_surface_stride=groups,
                   surface_add=8 * groups)
    starts, rows = dpu_transpose.atom_transpose(state, cube)
    out = _scatter(starts, rows, x.size * 2).view(np.float16)
    np.testing.assert_array_equal(out.reshape(pixels, groups * 8), x.T)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.sampled_from([1, 2]), st.integers(1, 4), st.integers(0, 2 ** 31))
def test_row_transpose_is_rows_to_nc1hwc2(col_atoms, size, row_blocks, seed):
    """The vendor's W = 1 TP_ORG_EN form (layernorm / conv1d task 0): a plain [rows][columns] matrix
    becomes the NC1HWC2 tensor of the columns with the rows as channels."""
    lanes = 16 // size
    rows_n, cols_n = row_blocks * lanes if size == 2 else lanes, col_atoms * lanes
    dtype = np.float16 if size == 2 else np.int8
    m = np.random.RandomState(seed % 2 ** 32).randn(rows_n, cols_n).astype(dtype)
    # the MRDMA's cube [S][H][W = 1][16]: line r holds the row, its atoms the surfaces
    cube = m.view(np.uint8).reshape(rows_n, col_atoms, 16).transpose(1, 0, 2).reshape(col_atoms, rows_n, 1, 16)
    state = _state(dpu_transpose.ROW_TRANSPOSE, 1, rows_n, col_atoms * 8, dst_surface_stride=1, surface_add=lanes,
                   element_bytes=size, block_atoms=cols_n)
    starts, rows = dpu_transpose.element_transpose(state, cube)
    out = _scatter(starts, rows, rows_n * cols_n * size).view(dtype)
    expected = _nc1hwc2(m.reshape(rows_n, 1, cols_n), lanes)                # [rows/R][1][cols][R]
    np.testing.assert_array_equal(out.reshape(expected.shape), expected)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2 ** 31))
def test_element_transpose_is_nc1hwc2_to_nchw(surfaces, height, half_width, seed):
    """The vendor's W > 1 TP_ORG_EN form (softmax_last / conv1d_fp16 task 2): NC1HWC2 fp16 -> planar,
    DST_SURF_STRIDE one plane, SURFACE_ADD eight, NOTCH_ADDR_0 0."""
    width = 8 * half_width
    x = np.random.RandomState(seed % 2 ** 32).randn(surfaces * 8, height, width).astype(np.float16)
    cube = _nc1hwc2(x, 8).view(np.uint8).reshape(surfaces, height, width, 16)
    plane = height * width // 8
    state = _state(dpu_transpose.ROW_TRANSPOSE, width, height, surfaces * 8, dst_surface_stride=plane,
                   surface_add=8 * plane)
    starts, rows = dpu_transpose.element_transpose(state, cube)
    out = _scatter(starts, rows, x.size * 2).view(np.float16)
    np.testing.assert_array_equal(out.reshape(x.shape), x)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2 ** 31))
def test_group_major_tiles_swap_rows_and_column_atoms(col_atoms, row_blocks, seed):
    """The vendor's groups x blocks TP_ORG_EN form (SIZE_C_WDMA + 1 = groups x blocks, SURFACE_ADD 1,
    DST_SURF_STRIDE = groups x blocks: hcw / whc builds' first task): a [rows][column atoms][8] fp16
    matrix becomes, per column lane, [column atom][row block][8 rows]."""
    rows_n = 8 * row_blocks
    m = np.random.RandomState(seed % 2 ** 32).randn(rows_n, col_atoms, 8).astype(np.float16)
    cube = m.view(np.uint8).reshape(rows_n, col_atoms, 16).transpose(1, 0, 2).reshape(col_atoms, rows_n, 1, 16)
    tiles = col_atoms * row_blocks
    state = _state(dpu_transpose.ROW_TRANSPOSE, 1, rows_n, col_atoms * 8, dst_surface_stride=tiles, surface_add=1,
                   wdma_atoms=tiles)
    starts, rows = dpu_transpose.element_transpose(state, cube)
    out = _scatter(starts, rows, m.size * 2).view(np.float16).reshape(8, col_atoms, row_blocks, 8)
    expected = m.reshape(row_blocks, 8, col_atoms, 8).transpose(3, 2, 0, 1)   # [lane][atom][block][row % 8]
    np.testing.assert_array_equal(out, expected)


def test_a_transpose_with_a_stage_enabled_is_refused():
    state = SimpleNamespace(
        transpose=SimpleNamespace(mode=dpu_transpose.ATOM_TRANSPOSE), bs=SimpleNamespace(bypass=False),
        bn=SimpleNamespace(bypass=True), ew=SimpleNamespace(bypass=True),
        out_cvt=SimpleNamespace(scale=1, shift=0, offset=0))
    with pytest.raises(EmulationError, match="stage enabled"):
        dpu_transpose.check_transpose(state, "task 0")
