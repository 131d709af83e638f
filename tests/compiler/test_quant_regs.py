"""Requantization register values: against the vendor's values and as a round trip.

- **Vendor values** (regcmd/*.quant.json, the 11 conv layers of the representatives): from the
  listed s_in, s_out and per-channel s_w / zp_w we derive MUL[c], OUT_CVT scale/shift/offset
  and CPEND[c]. Tolerances: OUT_CVT shift and offset, CPEND exact; OUT_CVT scale within
  0.25 % and MUL[c] within 0.3 % of 16384 - the listed s_w are fitted from the weights (max
  residual 0.67 LSB), so RKNN's exact scales are not known to better than that. The json
  has neither the float bias nor the quantized weights, so ALU[c] cannot be derived from it;
  we check that the vendor's ALU is its own exact quotient rounded (within 5, README 5: 4.8)
  and test our ALU formula through the integer round trip below.
- **Exact vendor values** for the element-wise add (rep09), which depend on activation scales
  only: BS ALU, EW converter offset/scale/shift and OUT_CVT agree exactly.
- **Precision property**: the realised factor MUL * 2^-14 * SCALE * 2^-SHIFT is within
  2^-15 + 0.5 / MUL[c] (relative) of s_in * s_w[c] / s_out for random scales.
- **Round trip**: an int8 conv evaluated with the DPU arithmetic of NUMERICS.md (written here
  from the document, in numpy) using our register values matches the float conv requantized
  to int8 within 1 LSB.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from npuemu.compiler import quant_regs
from npuemu.isa.errors import CompileError

REGCMD = Path(__file__).parents[2] / ".." / "shared" / "docs" / "vendor-corpus" / "regcmd"


def vendor_conv_layers() -> list[tuple[str, dict]]:
    assert REGCMD.is_dir(), f"vendor listings missing at {REGCMD}"
    layers = []
    for path in sorted(REGCMD.glob("*.quant.json")):
        for layer in json.loads(path.read_text())["layers"]:
            if "channels" in layer:
                layers.append((f"{path.name.split('_')[0]}:L{layer['layer_id']}", layer))
    assert len(layers) == 11, [name for name, _ in layers]
    return layers


def _derive(layer: dict, weights: np.ndarray | None = None) -> quant_regs.ConvRequant:
    channels = layer["channels"]
    s_w = np.array([c["s_w"] for c in channels])
    zp_w = np.array([int(round(c["zp_w"])) for c in channels])
    if weights is None:
        weights = np.zeros((len(channels), 1, 1, 1), dtype=np.int8)
    return quant_regs.conv_requant(
        input_scale=layer["inputs"][0]["scale"][0], input_zero_point=layer["inputs"][0]["zero_point"][0],
        weights=weights, weight_scale=s_w, weight_zero_point=zp_w, bias=None,
        output_scale=layer["outputs"][0]["scale"][0], output_zero_point=layer["outputs"][0]["zero_point"][0])


@pytest.mark.parametrize("name,layer", vendor_conv_layers(), ids=lambda v: v if isinstance(v, str) else "")
def test_conv_registers_match_vendor(name: str, layer: dict) -> None:
    ours = _derive(layer)
    assert ours.out_cvt.shift == layer["out_cvt_shift"]
    assert abs(ours.out_cvt.scale - layer["out_cvt_scale"]) <= 0.0025 * layer["out_cvt_scale"]
    assert ours.out_offset == layer["out_cvt_offset"]
    assert ours.mul_shift == layer["bs_mul_shift"] == 14
    vendor_mul = np.array([c["mul"] for c in layer["channels"]])
    assert np.max(np.abs(ours.mul.astype(int) - vendor_mul)) <= 0.003 * 16384
    assert int(ours.mul.max()) == int(vendor_mul.max()) == 16384
    assert np.array_equal(ours.cpend, np.array([c["cpend"] for c in layer["channels"]]))
    # the vendor's own realised factors agree with M within 0.25 % (VC 5), and so do ours
    m = np.array([c["M"] for c in layer["channels"]])
    assert np.all(np.abs(ours.realised_factor() / m - 1) <= 0.0025)


@pytest.mark.parametrize("name,layer", vendor_conv_layers(), ids=lambda v: v if isinstance(v, str) else "")
def test_vendor_alu_is_the_rounded_quotient(name: str, layer: dict) -> None:
    vendor, exact = np.array(layer["alu_check"]).T
    assert np.max(np.abs(vendor - quant_regs.round_half_away(exact))) <= 5


def test_eltwise_add_matches_rep09_exactly() -> None:
    regs = quant_regs.eltwise_requant("add", 0.03904080018401146, 5, 0.03490985184907913, -3,
                                      0.056662485003471375, 0)
    assert (regs.bs_alu, regs.bs_mul, regs.bs_mul_shift) == (-5, 16384, 0)
    assert (regs.ew.offset, regs.ew.scale, regs.ew.shift) == (3, 29301, 1)
    assert (regs.out_cvt.scale, regs.out_cvt.shift, regs.out_offset) == (22577, 29, 0)


def test_residual_converter_close_to_rep12() -> None:
    layer = dict(vendor_conv_layers())["rep12:L3"]
    ours = _derive(layer)
    convert = quant_regs.residual_convert(0.051166754215955734, -128, ours.acc_scale)
    assert (convert.offset, convert.shift) == (128, 6)
    assert abs(convert.scale - 21736) <= 0.0025 * 21736


@given(st.floats(1e-6, 1e6))
def test_fixed_point_precision(factor: float) -> None:
    try:
        fixed = quant_regs.fixed_point(factor)
    except CompileError:
        assert factor >= 32767.5
        return
    assert 1 << 14 <= fixed.scale < 1 << 15
    assert abs(fixed.value / factor - 1) <= 2.0 ** -15


def test_fixed_point_rejects_large_and_nonpositive() -> None:
    with pytest.raises(CompileError, match="too large"):
        quant_regs.fixed_point(40000.0)
    with pytest.raises(CompileError, match="positive finite"):
        quant_regs.fixed_point(0.0)
    small = quant_regs.fixed_point(2.0 ** -60, max_shift=63, what="x")
    assert (small.shift, small.scale) == (63, 8)
    with pytest.raises(CompileError, match="x 8.47033e-22 is below the smallest representable 2\\^-63"):
        quant_regs.fixed_point(2.0 ** -70, max_shift=63, what="x")


@given(st.floats(1e-3, 0.2), st.floats(1e-3, 0.5),
       st.lists(st.floats(1e-4, 1e-1), min_size=1, max_size=40).filter(lambda v: max(v) / min(v) <= 64))
def test_realised_factor_precision(s_in: float, s_out: float, s_w: list[float]) -> None:
    regs = quant_regs.conv_requant(
        input_scale=s_in, input_zero_point=0, weights=np.zeros((len(s_w), 1, 1, 1), np.int8),
        weight_scale=np.array(s_w), weight_zero_point=np.zeros(len(s_w), int), bias=None,
        output_scale=s_out, output_zero_point=0)
    m = s_in * np.array(s_w) / s_out
    bound = 2.0 ** -15 + 0.5 / regs.mul.astype(float)
    assert np.all(np.abs(regs.realised_factor() / m - 1) <= bound * (1 + 1e-9) + bound * 2.0 ** -15)
    assert np.all(np.abs(regs.realised_factor() / m - 1) <= 0.002)


# -- integer round trip ------------------------------------------------------------------------
def _rshift_half_away(value: np.ndarray, shift: int) -> np.ndarray:
    magnitude = (np.abs(value) + (1 << (shift - 1))) >> shift if shift else np.abs(value)
    return np.sign(value) * magnitude


def _rshift_half_even(value: np.ndarray, shift: int) -> np.ndarray:
    if shift == 0:
        return value
    floor = value >> shift
    remainder = value - (floor << shift)
    half = 1 << (shift - 1)
    return floor + ((remainder > half) | ((remainder == half) & (floor & 1 == 1)))


def _windows(padded: np.ndarray, kernel: int) -> np.ndarray:
    channels, height, width = padded.shape
    out_h, out_w = height - kernel + 1, width - kernel + 1
    return np.stack([padded[:, y:y + kernel, x:x + kernel] for y in range(out_h) for x in range(out_w)]).reshape(
        out_h, out_w, channels, kernel, kernel)


@pytest.mark.parametrize("seed", range(4))
def test_int8_conv_round_trip(seed: int) -> None:
    rng = np.random.default_rng(seed)
    channels, out_channels, size, kernel = 5, 6, 7, 3
    s_in, zp_in, s_out, zp_out = 0.05, int(rng.integers(-20, 20)), 0.2, int(rng.integers(-30, 30))
    s_w = rng.uniform(0.002, 0.02, out_channels)
    zp_w = rng.integers(-10, 10, out_channels)
    x_q = rng.integers(-128, 128, size=(channels, size, size)).astype(np.int64)
    w_q = rng.integers(-128, 128, size=(out_channels, channels, kernel, kernel)).astype(np.int8)
    bias = rng.normal(0, 0.5, out_channels)
    regs = quant_regs.conv_requant(input_scale=s_in, input_zero_point=zp_in, weights=w_q, weight_scale=s_w,
                                   weight_zero_point=zp_w, bias=bias, output_scale=s_out, output_zero_point=zp_out)
    padded = np.pad(x_q, ((0, 0), (1, 1), (1, 1)), constant_values=zp_in)  # CNA pads with zp_in
    windows = _windows(padded, kernel)  # [OH][OW][C][K][K]
    acc = np.einsum("yxckl,ockl->oyx", windows, w_q.astype(np.int64))
    window_sum = windows.sum(axis=(2, 3, 4))[None]
    v = acc + regs.cpend.astype(np.int64)[:, None, None] * window_sum + regs.alu.astype(np.int64)[:, None, None]
    v = _rshift_half_away(v * regs.mul.astype(np.int64)[:, None, None], regs.mul_shift)
    hardware = np.clip(_rshift_half_even(v * regs.out_cvt.scale, regs.out_cvt.shift) + regs.out_offset, -128, 127)
    real_x = s_in * (padded - zp_in)
    real_w = s_w[:, None, None, None] * (w_q.astype(np.int64) - zp_w[:, None, None, None])
    real = np.einsum("yxckl,ockl->oyx", _windows(real_x, kernel), real_w) + bias[:, None, None]
    reference = np.clip(np.round(real / s_out) + zp_out, -128, 127)
    assert np.max(np.abs(hardware - reference)) <= 1
    assert np.mean(hardware == reference) > 0.9


def test_alu_overflow_is_an_error() -> None:
    with pytest.raises(CompileError, match="layer big: bias operand of channel 0 .* int32"):
        quant_regs.conv_requant(input_scale=1e-6, input_zero_point=0, weights=np.zeros((1, 1, 1, 1), np.int8),
                                weight_scale=np.array([1e-6]), weight_zero_point=np.array([0]), bias=np.array([1e6]),
                                output_scale=1.0, output_zero_point=0, layer="big")


def test_pool_reciprocal() -> None:
    assert [quant_regs.pool_reciprocal(k) for k in (1, 2, 3, 4)] == [65536, 32768, 21845, 16384]
    assert math.isclose(quant_regs.pool_reciprocal(3) / 65536, 1 / 3, rel_tol=1e-4)
