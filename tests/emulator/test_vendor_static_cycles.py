"""``npuemu perf FILE.rknn --ddr-model vendor`` against librknnc's own per-layer table of the vendor op
fixtures (issue 24 item 4): every NPU row's DDR / NPU / Total cycles equal.

One fixture per rule of emulator/timing/vendor_estimate.py that these files exercise: op types the
vendor's estimate leaves at 0/0/0 although their tasks are convs (matmul_rows_fp16's Transposes, the
bilinear Resize's depthwise convs, exSoftmax13), the exMatMul operands without their ``_exSecondary``
scratch copies (matmul_act), the counted direct-conv weight bytes (matmul_rows: Cin 120 counted, 128
stored; focus_slice: Cin 3 and 12 counted as 16 in int8, 8 and 16 in fp16), a dynamic-shape file's
first shape set. The table is read here from the fixture's meta.json (``librknnc.layers``, parsed
from the vendor's build log when the fixtures were made). Skipped when ../shared is absent.
"""

from __future__ import annotations

import json

import pytest

from tests.shared_data import MISSING_REASON, RKNN_FIXTURES_OPS
from npuemu.tools.cli import main

CASES = ("matmul_rows_fp16", "matmul_rows_int8", "matmul_act_int8", "matmul_act_fp16", "focus_slice_int8",
         "focus_slice_fp16", "resize_bilinear_2x_int8", "softmax_last_fp16", "se_gate_int8", "dynamic_shape_int8")


def _vendor_rows(name: str) -> dict[int, tuple[int, int, int]]:
    """NPU rows of the vendor's table; a dynamic-shape file lists one table per shape set: the first."""
    rows: dict[int, tuple[int, int, int]] = {}
    for row in json.loads((RKNN_FIXTURES_OPS / name / "meta.json").read_text())["librknnc"]["layers"]:
        if row["target"] == "NPU" and row["id"] not in rows:
            rows[row["id"]] = (row["ddr_cycles"], row["npu_cycles"], row["total_cycles"])
    return rows


@pytest.mark.parametrize("name", CASES)
def test_vendor_mode_gives_the_vendor_table(name, capsys):
    if not (RKNN_FIXTURES_OPS / name / "model.rknn").is_file():
        pytest.skip(MISSING_REASON)
    assert main(["perf", str(RKNN_FIXTURES_OPS / name / "model.rknn"), "--ddr-model", "vendor", "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    ours = {row["id"]: (row["ddr_cycles"], row["npu_cycles"], row["max_cycles"]) for row in layers
            if row["target"] == "NPU"}
    vendor = _vendor_rows(name)
    assert vendor and ours == vendor
