"""The fp16 conv cycle rule (issue 24; emulator/timing/npu_cycles.py, TIMING.md "fp16") held against
every fp16 row we have of librknnc's static NPU cycles:

1. ../shared/docs/vendor-fp16/: MobileNetV2 and ResNet-18 (rk3588), every conv-type row, from a
   conv state built from the row's shapes (and the int8 tables of the same networks, unchanged);
2. ../shared/rknn-fixtures-ops/: every fp16 fixture's conv-type rows (meta.json librknnc layers);
3. ../shared/docs/vendor-corpus/layers.csv: the rk3576 FLOAT16 rows;
4. the register path: a small ONNX model compiled with ``--fp16`` (1x1 16->96 and 32->16 at
   112x112, MobileNetV2's layers 3-4, then its dw 144 at 56x56) through ``perf --ddr-model vendor``.

The rule: fp16 halves ATOM_K (README §4.1) and the floor of passes with it, F = 4 * K / K_int8.
The shared data live outside the repository; missing data fails the module, never skips it.
"""

from __future__ import annotations

import csv
import json
import re

import numpy as np

from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.npu_cycles import atom_k, conv_npu_cycles, min_passes
from npuemu.emulator.timing.report import report_npu
from npuemu.emulator.units.state import FP16, INT8
from npuemu.isa.container import ModelFile
from npuemu.platforms import load_platform
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import Net
from tests.emulator.test_timing_h1 import conv_state
from tests.shared_data import RKNN_FIXTURES_OPS, SHARED, VENDOR_CORPUS

VENDOR_FP16 = SHARED / "docs" / "vendor-fp16"
RK3588 = load_platform("rk3588")
CHIPS = ("rk3588", "rk3562", "rk3576", "rk3568", "rv1106")


def _dims(text: str) -> list[list[int]]:
    return [[int(v) for v in group.split(",")] for group in re.findall(r"\(([\d,]+)\)", text)]


def _state(cin: int, weight: list[int], out: list[int], fp16: bool):
    """A conv state from a vendor row's shapes (the vendor lists depthwise weights as (1, C, kh, kw))."""
    _, cout, oh, ow = out if len(out) == 4 else (1, out[1], 1, 1)
    depthwise = weight[0] == 1 and weight[1] == cin == cout and cin > 1
    return conv_state(depthwise=depthwise, precision=FP16 if fp16 else INT8, in_channels=-(-cin // 16) * 16,
                      real_channels=cin, kernel_h=weight[2], kernel_w=weight[3], kernels=1 if depthwise else cout,
                      out_channels=cout, out_height=oh, out_width=ow)


def _conv_rows(rows, shapes_key: str, out_key: str, dtype_key: str):
    """(name, state, vendor cycles) of every conv-type row (the vendor's fused Conv* types) with NPU
    cycles. Not exMatMul (matmul_act_fp16: two feature operands, no weights; issue 24 item 4)."""
    out = []
    for row in rows:
        shapes = _dims(row[shapes_key])
        if int(row["npu_cycles"]) and row["op_type"].startswith("Conv"):
            state = _state(shapes[0][1], shapes[1], _dims(row[out_key])[0], row[dtype_key] == "FLOAT16")
            out.append((row["full_name"], state, int(row["npu_cycles"])))
    return out


def _mismatches(rows, platform=RK3588):
    return [(name, vendor, conv_npu_cycles(state, platform)) for name, state, vendor in rows
            if conv_npu_cycles(state, platform) != vendor]


def test_the_floor_scales_with_atom_k_and_is_unchanged_for_int8():
    for chip in CHIPS:
        platform = load_platform(chip)
        assert min_passes(atom_k(INT8, platform), platform) == platform.cycle_model.min_taps_per_pass, chip
    assert (atom_k(FP16, RK3588), min_passes(atom_k(FP16, RK3588), RK3588)) == (16, 2)


def test_every_conv_row_of_the_vendor_fp16_and_int8_tables():
    counts = {}
    for name in ("mobilenet_v2", "resnet18"):
        for dtype in ("fp16", "int8"):
            with open(VENDOR_FP16 / f"{name}_rk3588_{dtype}.csv", newline="") as handle:
                table = list(csv.DictReader(handle))
            rows = _conv_rows(table, "input_shapes", "output_shape", "dtype")
            # every NPU row with cycles is a conv-type row with a weight operand
            assert len(rows) == sum(1 for r in table if int(r["npu_cycles"])), (name, dtype)
            assert not _mismatches(rows), (name, dtype, _mismatches(rows)[:5])
            counts[name, dtype] = len(rows)
    print(f"vendor-fp16 tables: exact on {counts}")
    assert counts[("mobilenet_v2", "fp16")] == 54 and counts[("resnet18", "fp16")] == 35


def test_every_fp16_conv_row_of_the_op_fixtures():
    rows = []
    for meta_path in sorted(RKNN_FIXTURES_OPS.glob("*_fp16/meta.json")):
        meta = json.loads(meta_path.read_text())
        layers = [dict(r, npu_cycles=r["npu_cycles"] or 0) for r in meta["librknnc"]["layers"]]
        fixture_rows = _conv_rows(layers, "input_shapes", "output_shape", "dtype")
        rows += [(f"{meta_path.parent.name}:{n}", s, v, meta["target"]) for n, s, v in fixture_rows]
    wrong = [(n, v, conv_npu_cycles(s, load_platform(t))) for n, s, v, t in rows
             if conv_npu_cycles(s, load_platform(t)) != v]
    print(f"rknn-fixtures-ops fp16: exact on {len(rows) - len(wrong)} / {len(rows)} conv rows")
    assert len(rows) == 31 and not wrong, wrong


def test_the_rk3576_float16_rows_of_the_corpus():
    with open(VENDOR_CORPUS / "layers.csv", newline="") as handle:
        table = [r for r in csv.DictReader(handle) if r["dtype"] == "FLOAT16" and r["weight_shape"]]
    rows = _conv_rows([dict(r, shapes=f"{r['input_shape']},{r['weight_shape']}") for r in table],
                      "shapes", "output_shape", "dtype")
    assert len(rows) == 4 and not _mismatches(rows, load_platform("rk3576"))


def _mobilenet_v2_block():
    """MobileNetV2's layers 3, 4 and (at 56x56) 8: 1x1 32->16, 1x1 16->96, then a 1x1 96->144 and
    the dw 3x3 144 whose fp16 build npuemu splits into 32-channel groups."""
    net = Net(24)
    net.conv("pw1", "x", "a", 32, 16, kernel=1)
    net.conv("pw2", "a", "b", 16, 96, kernel=1)
    net.conv("down", "b", "c", 96, 144, kernel=1, stride=2)
    net.conv("dw", "c", "y", 144, 144, kernel=3, group=144)
    return net.model([1, 32, 112, 112], "y")


def test_the_register_path_of_an_fp16_build_gives_the_vendor_rows(tmp_path):
    import onnx

    onnx.save(_mobilenet_v2_block(), tmp_path / "m.onnx")
    assert main(["compile", str(tmp_path / "m.onnx"), "--fp16", "-o", str(tmp_path / "m.npu")]) == 0
    runtime = Runtime(ModelFile.read(tmp_path / "m.npu"))
    runtime.set_input("x", np.zeros((1, 32, 112, 112), np.float32))
    runtime.run()
    vendor = {layer.full_name: layer.npu_cycles for layer in
              report_npu(runtime.model, runtime.runs, runtime.machine.platform, "vendor").layers}
    board = {layer.full_name: layer.npu_cycles for layer in
             report_npu(runtime.model, runtime.runs, runtime.machine.platform).layers}
    # vendor-fp16 MobileNetV2 rows 3, 4, 8 (the 1x1 96->144 s2: 3136 * 9 * max(3, 2))
    assert [vendor[n] for n in ("pw1", "pw2", "down", "dw")] == [25088, 150528, 84672, 84672]
    # board mode keeps each task's figure: a 32-channel dw task fills a whole 64-channel pass
    assert board["dw"] >= vendor["dw"] and board["pw2"] == 150528
