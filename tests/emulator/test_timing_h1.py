"""Model H1 (vendor-corpus README §4.1) as implemented in emulator/timing/npu_cycles.py, checked
against the vendor's static per-layer NPU cycles:

1. every rk3588 conv-type row of ../shared/docs/vendor-corpus/layers.csv, from a decoded
   conv state built from the row's shapes (one task per layer, as the vendor's estimate);
2. the 15 vendor .rknn fixtures: their real register streams run through RknnRunner, the
   per-task NPU cycles summed per vendor layer (task op_idx), compared with meta.json.

The shared data live outside the repository; missing data fails the module, never skips it.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.emulator.timing_support import BASE
from tests.shared_data import RKNN_FIXTURES, VENDOR_CORPUS
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.emulator.timing.npu_cycles import atom_k, conv_npu_cycles
from npuemu.emulator.timing.report import report_rknn
from npuemu.emulator.units.state import FP16, INT8, ConvState
from npuemu.isa.rknn import load_rknn
from npuemu.platforms import load_platform

CORPUS = VENDOR_CORPUS
FIXTURES = RKNN_FIXTURES
RK3588 = load_platform("rk3588")



def conv_state(**fields) -> ConvState:
    return replace(BASE, **fields)


def _dims(text: str) -> list[int]:
    return [int(v) for v in text.strip("()").split(",") if v.strip()]


def _state_from_row(row: dict) -> ConvState:
    n, cin, _, _ = _dims(row["input_shape"])
    weight = _dims(row["weight_shape"])
    _, cout, oh, ow = _dims(row["output_shape"])
    # the vendor lists depthwise (and GAP-as-dw) weights as (1, C, kh, kw) with C out = C in;
    # a normal conv with one output channel also has (1, Cin, kh, kw) but C out = 1
    depthwise = weight[0] == 1 and weight[1] == cin == cout and cin > 1
    return conv_state(depthwise=depthwise, precision=FP16 if row["dtype"] == "FLOAT16" else INT8,
                      in_channels=-(-cin // 16) * 16, real_channels=cin, kernel_h=weight[2], kernel_w=weight[3],
                      kernels=1 if depthwise else cout, out_channels=cout, out_height=oh, out_width=ow)


def test_atom_k_follows_the_mac_rate():
    assert atom_k(INT8, RK3588) == 32
    assert atom_k(FP16, RK3588) == 16  # README §4.1: "halved for FLOAT16 layers"


def test_h1_readme_examples():
    # README §4.1: FC 512 -> 1000 as conv, P = 16: 16 * 32 * 16 = 8192
    fc = conv_state(in_channels=512, real_channels=512, kernels=1000, out_channels=1000)
    assert conv_npu_cycles(fc, RK3588) == 8192
    # 7x7 output rounds to 64 pixels; 1x1 conv with Cin <= 96 pays the minimum of 4 passes
    small = conv_state(in_channels=64, real_channels=64, kernels=32, out_channels=32, out_height=7, out_width=7)
    assert conv_npu_cycles(small, RK3588) == 64 * 1 * 4
    # Cin == 1: no Cout factor, no minimum
    single = conv_state(in_channels=16, real_channels=1, kernels=64, out_channels=64, kernel_h=3, kernel_w=3,
                        out_height=10, out_width=10)
    assert conv_npu_cycles(single, RK3588) == 112 * 9


def test_h1_matches_every_rk3588_conv_row_of_the_corpus():
    with open(CORPUS / "cases.csv", newline="") as handle:
        cases = {row["case"] for row in csv.DictReader(handle)}
    with open(CORPUS / "layers.csv", newline="") as handle:
        rows = [row for row in csv.DictReader(handle)
                if row["target"] == "rk3588" and row["op_type"].startswith("Conv") and row["case"] in cases]
    assert len(rows) >= 200, f"only {len(rows)} rk3588 conv rows found in {CORPUS}"
    mismatches = [(row["case"], row["full_name"], int(row["npu_cycles"]), conv_npu_cycles(_state_from_row(row), RK3588))
                  for row in rows if conv_npu_cycles(_state_from_row(row), RK3588) != int(row["npu_cycles"])]
    print(f"H1 exact on {len(rows) - len(mismatches)} / {len(rows)} rk3588 conv rows")
    assert not mismatches, mismatches[:10]


def _fixture_names() -> list[str]:
    names = sorted(p.name for p in FIXTURES.iterdir() if (p / "model.rknn").is_file())
    assert len(names) == 15, f"expected the 15 vendor fixtures in {FIXTURES}, found {names}"
    return names


# Layers where the emulator's per-task figure differs from the vendor's per-layer estimate: the
# layer is split into tasks along H, and H1 rounds each task's OH*OW up to 16 pixels (README §4.1
# rounds the whole plane). 56x56 dw split as 25+24+7 rows: (1408+1344+400)*2*9 = 56736 vs 3136*2*9.
PER_TASK_ROUNDING = {("rep05_dw3x3s2_96_112", 1): 56736, ("mobilenet_v2", 5): 56736}


def test_h1_on_the_register_streams_of_the_vendor_fixtures():
    exact = total = 0
    for name in _fixture_names():
        model = load_rknn(FIXTURES / name / "model.rknn")
        runner = RknnRunner(model)
        run = runner.run([np.zeros(t.shape, np.float32) for t in runner.input_tensors])
        report = report_rknn(model, run, RK3588)
        vendor = json.loads((FIXTURES / name / "meta.json").read_text())["librknnc"]["layers"]
        assert [layer.id for layer in report.layers] == [row["id"] for row in vendor], name
        for layer, row in zip(report.layers, vendor):
            if row["npu_cycles"] == 0:
                assert layer.npu_cycles == 0, (name, layer.id, layer.op_type)
                continue
            total += 1
            expected = PER_TASK_ROUNDING.get((name, layer.id), row["npu_cycles"])
            assert layer.npu_cycles == expected, (name, layer.id, layer.full_name, row["npu_cycles"], layer.npu_cycles)
            exact += layer.npu_cycles == row["npu_cycles"]
    print(f"fixtures: per-layer NPU cycles exact on {exact} / {total} conv-type layers")
    assert total == 90 and exact == 88


def test_vendor_mode_rounds_the_layer_plane_once_and_matches_every_fixture_layer():
    """``perf --ddr-model vendor`` reports librknnc's per-layer NPU figure: H-split tasks merged
    back into one plane. Then all 90 conv-type layers of the fixtures equal meta.json, while
    the board mode keeps the per-task figure (PER_TASK_ROUNDING above)."""
    exact = total = 0
    for name in _fixture_names():
        model = load_rknn(FIXTURES / name / "model.rknn")
        runner = RknnRunner(model)
        run = runner.run([np.zeros(t.shape, np.float32) for t in runner.input_tensors])
        board, vendor_mode = report_rknn(model, run, RK3588), report_rknn(model, run, RK3588, "vendor")
        vendor = json.loads((FIXTURES / name / "meta.json").read_text())["librknnc"]["layers"]
        for per_task, layer, row in zip(board.layers, vendor_mode.layers, vendor, strict=True):
            assert layer.npu_cycles <= per_task.npu_cycles
            if row["npu_cycles"]:
                total += 1
                exact += layer.npu_cycles == row["npu_cycles"]
            else:
                assert layer.npu_cycles == 0
    assert (exact, total) == (90, 90)
