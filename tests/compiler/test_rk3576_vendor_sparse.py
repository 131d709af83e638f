"""npuemu's own ``--sparse`` rk3576 builds along output channels and 16:4 in the vendor's register
layout (compiler/LOWERING.md 44.3): the vendor's words for the mode, outputs bit-identical to the same
build at RK3588 positions (the layout switched off by emptying ``VENDOR_LAYOUT_OF``). That the words
are the vendor's own is proved on the vendor's files: tests/emulator/test_rknn_rk3576_sparse.py packs
their translation back word for word."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npuemu.compiler.driver import CompileOptions
from npuemu.isa.regmap_loader import load_regmap
from tests.compiler.test_sparse_weights import conv_model, prune, run, samples
from tests.compiler.test_rk3576_vendor_emit import both_layouts

VENDOR = load_regmap("rk3576_vendor")


def _stored(built) -> dict[tuple[str, int], list[int]]:
    """(block, offset) -> every value the stored regcmd writes there, read with the vendor map."""
    regcmd = next(s for s in built.sections if s.name == "regcmd").data
    out: dict[tuple[str, int], list[int]] = {}
    for index in range(0, len(regcmd), 8):
        word = int.from_bytes(regcmd[index:index + 8], "little")
        block = VENDOR.block_for_target(word >> 48)
        if block is not None:
            out.setdefault((block.name, word & 0xFFFF), []).append((word >> 16) & 0xFFFFFFFF)
    return out


@pytest.mark.parametrize("axis, shape, size, mode", [
    (0, (64, 64, 3, 3), 8, 2), ("both", (64, 96, 1, 1), 8, 3), ("both", (128, 64, 3, 3), 9, 3),
    (0, (96, 32, 1, 1), 6, 2),
])
def test_own_sparse_build_gets_the_vendor_layout_and_runs_like_the_old_layout(monkeypatch, axis, shape, size, mode):
    rng = np.random.default_rng(3)
    model = conv_model(prune(rng.normal(0, 0.1, shape), axis, rng), size)
    data = samples(shape[1], size)
    vendor, old = both_layouts(model, CompileOptions(dataset=data, sparse=True))
    platform = vendor.trailer["platform"]
    assert platform.get("register_layout") == "rk3576_vendor" and "register_layout_notice" not in platform
    assert "register_layout" not in old.trailer["platform"]
    words = _stored(vendor)
    oc, ic, kh, kw = shape
    assert set(words[("CORE", 0x3018)]) == {words[("CORE", 0x3018)][0]} and (words[("CORE", 0x3018)][0] >> 12) & 3 == mode
    assert all(value & 0x7 == 5 for value in words[("CNA", 0x1100)])                 # DECOMP_CONTROL as the vendor
    kernels = words[("CNA", 0x1024)][0]
    assert kernels >> 30 == {2: 2, 3: 3}[mode] and (kernels & 0xFFFF) + 1 == oc // 2
    assert words[("CNA", 0x101C)][0] == oc * ic * kh * kw // (2 if mode == 2 else 4)
    assert all((value >> 3) & 3 == 1 for value in words[("DPU", 0x400C)])             # the depthwise order
    assert all(value & 0xFFFF == 0x310 for value in words[("DPU", 0x4030)])
    for sample in data:
        np.testing.assert_array_equal(run(vendor, sample["x"]).output("y", dequantize=False),
                                      run(old, sample["x"]).output("y", dequantize=False))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(axis=st.sampled_from([0, 1, "both"]), out_groups=st.integers(1, 4), in_groups=st.integers(1, 3),
       kernel=st.sampled_from([1, 3]), size=st.integers(3, 9), seed=st.integers(0, 2 ** 16))
def test_random_sparse_convs_run_bit_identically_in_both_layouts(monkeypatch, axis, out_groups, in_groups, kernel,
                                                                size, seed):
    """Any mode, 32..128 kernels x 32..96 channels, 1x1 / 3x3, 3..9 pixels square: the build gets the
    vendor layout with the mode's CORE 0x3018 bits and runs as the RK3588-position build."""
    rng = np.random.default_rng(seed)
    shape = (32 * out_groups, 32 * in_groups, kernel, kernel)
    model = conv_model(prune(rng.normal(0, 0.1, shape), axis, rng), size)
    data = samples(shape[1], size)
    vendor, old = both_layouts(model, CompileOptions(dataset=data, sparse=True))
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert {(value >> 12) & 3 for value in _stored(vendor)[("CORE", 0x3018)]} == {{0: 2, 1: 1, "both": 3}[axis]}
    np.testing.assert_array_equal(run(vendor, data[0]["x"]).output("y", dequantize=False),
                                  run(old, data[0]["x"]).output("y", dequantize=False))
