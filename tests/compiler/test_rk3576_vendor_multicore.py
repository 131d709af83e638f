"""Own multi-core rk3576 builds in the vendor layout (compiler/LOWERING.md 46.5): npuemu's split gives each core
independent tasks (lower/multicore.py: own CBUF, own weights and LUT upload, disjoint output rows), each packed in
its single-core vendor form; they must run bit-identically to the same 2-core build at RK3588 positions."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.driver import CompileOptions
from npuemu.emulator.runtime import Runtime
from tests.compiler.test_rk3576_vendor_clip import clip_model
from tests.compiler.test_rk3576_vendor_emit import _inputs, conv_model
from tests.compiler.test_rk3576_vendor_lut import lut_model, se_model
from tests.compiler.test_rk3576_vendor_emit import both_layouts


def _run(model_file, x):
    runtime = Runtime(model_file)
    runtime.set_input("x", x)
    runtime.run()
    return runtime.output("y", dequantize=False)


@pytest.mark.parametrize("case", ["lut", "residual", "se", "clip"])
def test_two_core_build_is_vendor_layout_and_runs_like_the_old_layout(monkeypatch, case):
    size = (40, 40)
    model = {"lut": lambda: lut_model("HardSwish", size=size),
             "residual": lambda: conv_model(16, 16, size, (3, 3), (1, 1), (1, 1, 1, 1), relu="after", add=True),
             "se": lambda: se_model(16, size=size), "clip": lambda: clip_model(-1.0, 2.0)}[case]()
    size = (12, 20) if case == "clip" else size
    samples = _inputs(16, size)
    options = CompileOptions(dataset=samples, core_mask="0_1")
    vendor, old = both_layouts(model, options)
    assert vendor.trailer["platform"].get("register_layout") == "rk3576_vendor", vendor.trailer["platform"]
    assert {getattr(step, "core", None) for step in vendor.schedule()} >= {0, 1}   # both cores run tasks
    for sample in samples:
        np.testing.assert_array_equal(_run(vendor, sample["x"]), _run(old, sample["x"]))
