"""Every NaN an fp16 / bf16 CORE sum produces is the canonical NaN 0x7FC00000 (NUMERICS.md 3.3, the
section on canonical NaN sums; ``kernels/canonical_nan.py``), on every path and every target.

Where two NaNs meet in one add or multiply, x86 keeps one operand's sign and payload (which one is the
compiled instruction's choice), an infinity times a zero gives x86's default NaN 0xFFC00000, and a
single NaN operand passes its own payload on: before, a NaN output's bits depended on the host and the
path. The operands here are rich in NaNs of both signs and many payloads (quiet and signalling),
infinities and zeros of both signs, in the features, the weights and the pad value.

The reference is written here: numpy planes padded with the pad value, +0 then one product a step in
(input channel, ky, kx) order, every add rounded to float32, then every NaN replaced by 0x7FC00000 - so
each path is compared bit for bit, NaN bits included. Paths: the GEMM micro-kernel (fused or not), its
narrow form, its plain loops (and ``run`` as NPUEMU_FP16_GEMM=0 selects it), ``conv2d_fp16``'s gemm and
direct methods, the prepared task plans (depthwise rows or atoms, pointwise, direct, gemm), the fetched-
weight step, the depthwise kernels called directly (rows, atoms, 1x1 scalings short and long), the
pointwise kernel, the bf16 conv (NaN positions and bits; its finite sums are BLAS's). Subprocesses
compile for ``NUMBA_CPU_NAME=haswell`` (fmul + fadd) and ``generic`` (no F16C: the portable kernels)
with fresh caches, and run with NPUEMU_FP16_GEMM=0: every digest equals this process's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import (cna_bf16, conv_fp16_plan, depthwise_fp16, depthwise_fp16_rows, gemm_fp32_seq, mac,
                                     pointwise_fp16)
from npuemu.emulator.kernels.mac import ConvGeometry
from npuemu.emulator.numerics import fp32_bits_to_fp16_bits
from npuemu.emulator.units import cna_fetched_fp16

ROOT = Path(__file__).resolve().parents[2]
CANONICAL = 0x7FC00000
#: fp16 patterns the operands draw from: zeros, infinities, quiet and signalling NaNs of both signs
SPECIAL = np.array([0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7E01, 0xFFFF, 0x7C01, 0xFD55, 0x7DFF,
                    0x7F00, 0x3C00], np.uint16)
NAN_PADS = (0.0, -1.5, float("-inf"), np.array([0x7FC0A000], np.uint32).view(np.float32)[0])


def fp16(rng, shape, share) -> np.ndarray:
    values = (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 6, shape))).astype(np.float16)
    bits = values.view(np.uint16)
    where = rng.random(shape) < share
    bits[where] = rng.choice(SPECIAL, int(where.sum()))
    return values


def canonicalised(values: np.ndarray) -> np.ndarray:
    values = values.copy()
    values.view(np.uint32)[np.isnan(values)] = CANONICAL
    return values


def reference_conv(planes: np.ndarray, weights: np.ndarray, g: ConvGeometry, pad) -> np.ndarray:
    """float32 [K][OH][OW] of float16 planes [C][H][W] and weights [K][C/groups][KH][KW]: +0, then the
    products in (c, ky, kx) order, one float32 rounding an add; NaN as 0x7FC00000."""
    channels, height, width = planes.shape
    kernels, per_group, kernel_h, kernel_w = weights.shape
    padded = np.full((channels, g.padded_h, g.padded_w), np.float32(pad), np.float32)
    rows, columns = min(height, g.padded_h - g.pad_top), min(width, g.padded_w - g.pad_left)
    padded[:, g.pad_top:g.pad_top + rows, g.pad_left:g.pad_left + columns] = planes[:, :rows, :columns]
    w = weights.astype(np.float32)
    first = (np.arange(kernels) // (kernels // g.groups)) * per_group
    acc = np.zeros((kernels, g.out_h, g.out_w), np.float32)
    with np.errstate(all="ignore"):
        for c in range(per_group):
            for ky in range(kernel_h):
                for kx in range(kernel_w):
                    y0, x0 = ky * g.dilation_y, kx * g.dilation_x
                    window = padded[first + c, y0:y0 + (g.out_h - 1) * g.stride_y + 1:g.stride_y,
                                    x0:x0 + (g.out_w - 1) * g.stride_x + 1:g.stride_x]
                    acc = acc + w[:, c, ky, kx, None, None] * window
    return canonicalised(acc)


def reference_products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    with np.errstate(all="ignore"):
        for k in range(a.shape[1]):
            acc = acc + a[:, k:k + 1] * b[k]
    return canonicalised(acc)


def to_atoms(planes: np.ndarray) -> np.ndarray:
    """float16 [C1][H][W][8]; lanes past C hold a NaN no path may read."""
    channels, height, width = planes.shape
    atoms = np.full((-(-channels // 8), height, width, 8), np.array(0x7E55, np.uint16).view(np.float16))
    for c in range(channels):
        atoms[c // 8, :, :, c % 8] = planes[c]
    return atoms


def gemm_paths(a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """The products on the micro-kernel, the narrow form (few columns), the plain loops and ``run`` as
    NPUEMU_FP16_GEMM=0 selects it."""
    rows, reduction, columns = a.shape[0], a.shape[1], b.shape[1]
    offsets, packed = gemm_fp32_seq.row_offsets(reduction, columns), gemm_fp32_seq.pack(a)
    results = {}
    with np.errstate(all="ignore"):
        for name, weights in (("kernel", packed), ("narrow", gemm_fp32_seq.pack(a, True))):
            if name == "narrow" and columns > gemm_fp32_seq.NARROW:
                continue
            results[name] = np.empty((rows, columns), np.float32)
            gemm_fp32_seq.products(weights, offsets, b, 0, columns, results[name], rows)
        results["loops"] = np.empty((rows, columns), np.float32)
        gemm_fp32_seq.products_loops(packed, offsets, b.reshape(-1), 0, columns, results["loops"], rows)
        results["run plain"] = plain_run(lambda: _run_into(packed, offsets, b, rows, columns))
    return results


def _run_into(packed, offsets, b, rows, columns):
    out = np.empty((rows, columns), np.float32)
    gemm_fp32_seq.run(packed, offsets, b.reshape(-1), 0, out)
    return out


def plain_run(call):
    """``call()`` with ``gemm_fp32_seq.run`` taking the plain loops (NPUEMU_FP16_GEMM=0, read at import)."""
    kept = gemm_fp32_seq._PLAIN
    gemm_fp32_seq._PLAIN = True
    try:
        return call()
    finally:
        gemm_fp32_seq._PLAIN = kept


def conv_paths(planes: np.ndarray, weights: np.ndarray, g: ConvGeometry, pad) -> dict[str, np.ndarray]:
    """Every fp16 CORE path that takes this convolution -> float32 [K][OH][OW]."""
    channels, kernels = planes.shape[0], weights.shape[0]
    atoms, shared = to_atoms(planes), weights.copy()
    shared.flags.writeable = False
    results = {}
    with np.errstate(all="ignore"):
        padded = mac.fetch_padded_input(atoms, channels, g, pad)
        for method in ("gemm", "direct"):
            results[f"conv2d {method}"] = mac.conv2d_fp16(padded, weights, g, method)
        results["conv2d gemm plain"] = plain_run(lambda: mac.conv2d_fp16(padded, weights, g, "gemm"))
        run = conv_fp16_plan.prepare_conv2d_fp16(atoms.shape, channels, shared, g, pad, kernels + 3)
        results["plan"] = run(atoms)[:kernels].copy()
        fetched = cna_fetched_fp16.prepare_fetched_fp16(atoms.shape, channels, weights.shape, g, pad, kernels)
        if fetched is not None:
            results["fetched"] = fetched(atoms, weights).copy()
        matrices = weights.astype(np.float32)
        if g.groups == kernels == channels and weights.shape[1] == 1:
            results.update(depthwise_paths(atoms, matrices, g, pad))
        if pointwise_fp16.takes(atoms.shape, channels, weights.shape, g):
            out = np.empty((kernels, g.out_h, g.out_w), np.float32)
            pointwise_fp16.pointwise_fp16_atoms(atoms.view(np.uint16), matrices.reshape(kernels, -1), channels, out)
            results["pointwise"] = out
    return results


def depthwise_paths(atoms: np.ndarray, matrices: np.ndarray, g: ConvGeometry, pad) -> dict[str, np.ndarray]:
    kernels = matrices.shape[0]
    phase_rows, pitch, length = depthwise_fp16.phase_layout(g)
    phases = np.empty(g.stride_y * g.stride_x * phase_rows * pitch * 8, np.float32)
    out = np.empty((kernels, g.out_h, g.out_w), np.float32)
    depthwise_fp16.depthwise_fp16_atoms(atoms.view(np.uint16), depthwise_fp16.lane_tiles(matrices, g), g, pad, out,
                                        phases, np.empty((pitch, 2), np.uint64), np.empty(length * 8, np.float32))
    results = {"depthwise atoms": out}
    if depthwise_fp16_rows.available():
        rows, line = depthwise_fp16_rows.scratch_sizes(g)
        out = np.empty((kernels, g.out_h, g.out_w), np.float32)
        depthwise_fp16_rows.depthwise_fp16_rows(atoms.view(np.uint16), depthwise_fp16_rows.lane_weights(matrices), g,
                                                pad, out, np.empty(rows, np.float32), np.empty(line, np.float32))
        results["depthwise rows"] = out
    return results


def bf16_path(rng, share) -> tuple[np.ndarray, np.ndarray]:
    """(``conv2d_bf16``'s result, the float64 sums' NaN positions) of bf16 words rich in NaNs."""
    words = (rng.integers(0x3C00, 0x4100, (20, 5, 6)) ^ (rng.integers(0, 2, (20, 5, 6)) << 15)).astype(np.uint16)
    specials = np.array([0x7FC0, 0xFFC0, 0x7F81, 0xFFAA, 0x7F80, 0xFF80, 0x0000, 0x8000], np.uint16)
    where = rng.random(words.shape) < share
    words[where] = rng.choice(specials, int(where.sum()))
    kernel = rng.integers(0x3C00, 0x4100, (12, 20, 1, 1)).astype(np.uint16)
    kernel[rng.random(kernel.shape) < share] = 0x7F80
    planes = to_atoms(words.view(np.float16))
    with np.errstate(all="ignore"):
        out = cna_bf16.conv2d_bf16(planes, 20, kernel.view(np.float16), ConvGeometry(1, 1, 5, 6))
        wide = (words.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        weights = (kernel.astype(np.uint32) << 16).view(np.float32).astype(np.float64)[:, :, 0, 0]
        want = np.zeros((12, 5, 6))
        for c in range(20):
            want = want + weights[:, c, None, None] * wide[c]
    return out, np.isnan(want)


def _case(kind: str, channels: int, kernels: int, size: tuple, kernel: int, stride: int, pad: int, groups: int = 1):
    height, width = size
    out_h = (height + 2 * pad - kernel) // stride + 1
    out_w = (width + 2 * pad - kernel) // stride + 1
    return kind, channels, kernels, (height, width), ConvGeometry(kernel, kernel, out_h, out_w, stride, stride,
                                                                  pad_top=pad, pad_left=pad, groups=groups)


#: one convolution for each path and form: gemm (taps read in place, wide rows, phases at a stride, im2col
#: of a 1x1 kernel at a stride, two reduction blocks, narrow), direct, pointwise (whole and partial
#: atoms), depthwise (map and row modes, pairs, a partial group, stride 2, 1x1 scalings short and long,
#: 2x2, 5x5 and 7x7 kernels and a long 3x3 line for the portable kernel's fused taps)
CASES = (
    _case("gemm", 16, 24, (6, 7), 3, 1, 1), _case("gemm", 16, 20, (9, 8), 1, 2, 0),
    _case("gemm", 12, 18, (9, 9), 3, 2, 1), _case("gemm", 40, 13, (5, 5), 3, 1, 1),
    _case("gemm", 16, 9, (3, 4), 3, 1, 0), _case("direct", 16, 3, (6, 7), 3, 1, 1),
    _case("pointwise", 16, 2, (5, 6), 1, 1, 0), _case("pointwise", 12, 1, (4, 9), 1, 1, 0),
    _case("depthwise", 16, 16, (6, 7), 3, 1, 1, 16), _case("depthwise", 16, 16, (40, 40), 3, 1, 1, 16),
    _case("depthwise", 12, 12, (9, 8), 3, 2, 1, 12), _case("depthwise", 16, 16, (4, 5), 1, 1, 0, 16),
    _case("depthwise", 12, 12, (48, 48), 1, 1, 0, 12), _case("depthwise", 8, 8, (6, 6), 2, 1, 0, 8),
    _case("depthwise", 8, 8, (9, 10), 5, 1, 2, 8), _case("depthwise", 8, 8, (40, 36), 7, 1, 3, 8),
    _case("depthwise", 8, 8, (14, 14), 3, 1, 1, 8),
)


def case_operands(case, rng, scale):
    """(planes, weights) of ``case``: about ``scale`` special values a sum's operands (share capped at 1/2)."""
    _, channels, kernels, (height, width), g = case
    share = min(0.5, scale / (2 * channels // g.groups * g.kernel_h * g.kernel_w))
    planes = fp16(rng, (channels, height, width), share)
    weights = fp16(rng, (kernels, channels // g.groups, g.kernel_h, g.kernel_w), share)
    return planes, weights


def every_path_bits(seed: int = 0) -> dict[str, np.ndarray]:
    """Every path's output bits on NaN-rich operands (fixed by ``seed``), named ``case i: path``."""
    rng = np.random.default_rng(seed)
    results = {}
    for i, case in enumerate(CASES):
        planes, weights = case_operands(case, rng, 0.6)
        pad = NAN_PADS[i % len(NAN_PADS)]
        for name, out in conv_paths(planes, weights, case[4], pad).items():
            results[f"case {i}: {name}"] = out.view(np.uint32)
    a, b = fp16(rng, (13, 300), 0.05).astype(np.float32), fp16(rng, (300, 70), 0.05).astype(np.float32)
    for width in (70, 3):
        for name, out in gemm_paths(a, np.ascontiguousarray(b[:, :width])).items():
            results[f"gemm {width}: {name}"] = out.view(np.uint32)
    results["bf16"] = bf16_path(rng, 0.1)[0].view(np.uint32)
    return results


def digests(seed: int = 0) -> dict[str, str]:
    return {name: hashlib.sha256(bits.tobytes()).hexdigest() for name, bits in every_path_bits(seed).items()}


def nan_bits(bits: np.ndarray) -> set[int]:
    return {int(v) for v in bits[np.isnan(bits.view(np.float32))]}


def test_the_canonical_nan_is_fp16_0x7e00_at_the_output_conversion():
    assert int(fp32_bits_to_fp16_bits(np.uint32(CANONICAL))) == 0x7E00


@pytest.mark.parametrize("index", range(len(CASES)))
def test_every_conv_path_gives_the_reference_bits_nans_canonical(index):
    case = CASES[index]
    planes, weights = case_operands(case, np.random.default_rng(100 + index), 0.6)
    planes.view(np.uint16)[0, 0, 0] = 0x7E01  # (at least one NaN sum)
    pad = NAN_PADS[index % len(NAN_PADS)]
    want = reference_conv(planes, weights, case[4], pad)
    paths = conv_paths(planes, weights, case[4], pad)
    assert np.isnan(want).any()
    for name, out in paths.items():
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (case[0], name)


def test_every_path_of_one_form_is_taken():
    names = {name.split(": ")[-1] for name in every_path_bits()}
    assert {"conv2d gemm", "conv2d direct", "conv2d gemm plain", "plan", "fetched", "depthwise atoms", "pointwise",
            "kernel", "narrow", "loops", "run plain", "bf16"} <= names
    if depthwise_fp16_rows.available():
        assert "depthwise rows" in names


def test_where_nans_meet_in_the_gemm_every_path_gives_the_canonical_nan():
    # one output each where NaNs of different sign / payload meet in one add or multiply
    positive, negative = (np.array([bits], np.uint32).view(np.float32)[0] for bits in (0x7FC01234, 0xFFC05678))
    ones, zeros = np.ones((1, 3), np.float32), np.zeros((1, 3), np.float32)
    meetings = [
        (np.array([[positive, negative]], np.float32), np.vstack([ones, ones])),  # NaN sum + NaN product
        (np.array([[positive, np.inf]], np.float32), np.vstack([ones, zeros])),  # NaN sum + (inf x 0)
        (np.array([[np.inf, positive]], np.float32), np.vstack([zeros, ones])),  # (inf x 0) sum + NaN product
        (np.array([[np.inf, -np.inf, positive]], np.float32), np.vstack([ones, ones, ones])),  # inf - inf, NaN
        (np.array([[positive]], np.float32), np.full((1, 3), negative, np.float32)),  # NaN x NaN
        (np.array([[np.inf]], np.float32), zeros),  # inf x 0 alone: x86's default NaN 0xFFC00000
    ]
    for a, b in meetings:
        for name, out in gemm_paths(a, b).items():
            assert (out.view(np.uint32) == CANONICAL).all(), name


def test_the_bf16_conv_gives_the_canonical_nan_where_its_sums_are_nan():
    out, nan = bf16_path(np.random.default_rng(5), 0.1)
    assert nan.any() and np.array_equal(np.isnan(out), nan)
    assert (out.view(np.uint32)[nan] == CANONICAL).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, len(CASES) - 1), st.sampled_from([0.1, 0.6, 3.0]), st.integers(0, len(NAN_PADS) - 1),
       st.integers(0, 2**32 - 1))
def test_nan_rich_convolutions_on_every_path_against_the_reference(index, scale, pad_index, seed):
    case = CASES[index]
    planes, weights = case_operands(case, np.random.default_rng(seed), scale)
    want = reference_conv(planes, weights, case[4], NAN_PADS[pad_index])
    for name, out in conv_paths(planes, weights, case[4], NAN_PADS[pad_index]).items():
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (case[0], name)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 14), st.one_of(st.integers(1, 20), st.sampled_from([255, 256, 257, 300])),
       st.one_of(st.integers(1, 5), st.integers(6, 140)), st.sampled_from([0.02, 0.1, 0.4]), st.integers(0, 2**32 - 1))
def test_nan_rich_products_on_every_gemm_path_against_the_reference(rows, reduction, columns, share, seed):
    rng = np.random.default_rng(seed)
    a, b = fp16(rng, (rows, reduction), share).astype(np.float32), fp16(rng, (reduction, columns), share).astype(np.float32)
    want = reference_products(a, b)
    for name, out in gemm_paths(a, b).items():
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), name


_CHILD = """
import json
from tests.emulator.test_canonical_nan_sums import digests
print("RESULT " + json.dumps(digests()))
"""


@pytest.mark.parametrize("target", [{"NUMBA_CPU_NAME": "haswell"}, {"NUMBA_CPU_NAME": "generic"},
                                    {"NPUEMU_FP16_GEMM": "0"}], ids=["haswell", "generic", "plain"])
def test_other_targets_and_the_plain_switch_give_the_same_bits(target, tmp_path):
    # haswell: fmul + fadd in the micro-kernels; generic: no F16C (the portable depthwise kernel in the
    # plans, no depthwise rows); NPUEMU_FP16_GEMM=0: the plain loops wherever the products run
    env = dict(os.environ, **target)
    if "NUMBA_CPU_NAME" in target:
        env["NUMBA_CACHE_DIR"] = str(tmp_path)  # (kernels compiled for that target only)
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs, ours = json.loads(done.stdout.split("RESULT ", 1)[1]), digests()
    if target.get("NUMBA_CPU_NAME") == "generic":
        ours = {name: digest for name, digest in ours.items() if "depthwise rows" not in name}
    assert theirs == ours
    assert len(theirs) > 60
