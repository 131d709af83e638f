"""``npuemu perf FILE.rknn --ddr-model vendor`` against librknnc's own per-layer table of the vendor op
fixtures (issue 24 item 4): every NPU row's DDR / NPU / Total cycles equal.

One fixture per rule of emulator/timing/vendor_estimate.py that these files exercise: op types the
vendor's estimate leaves at 0/0/0 although their tasks are convs (matmul_rows_fp16's Transposes, the
bilinear Resize's depthwise convs, exSoftmax13), the exMatMul operands without their ``_exSecondary``
scratch copies (matmul_act), the counted direct-conv weight bytes (matmul_rows: Cin 120 counted, 128
stored; focus_slice: Cin 3 and 12 counted as 16 in int8, 8 and 16 in fp16), a dynamic-shape file's
first shape set, a sparse conv's weights counted as -1/8 of their stored bytes (sparse_rk3576_int8,
and npuemu's own --sparse builds against the vendor's figures for the same shapes below). The table is read here from the fixture's meta.json (``librknnc.layers``, parsed
from the vendor's build log when the fixtures were made). Skipped when ../shared is absent.
"""

from __future__ import annotations

import json

import pytest

from tests.shared_data import MISSING_REASON, RKNN_FIXTURES_OPS
from npuemu.tools.cli import main

CASES = ("matmul_rows_fp16", "matmul_rows_int8", "matmul_act_int8", "matmul_act_fp16", "focus_slice_int8",
         "focus_slice_fp16", "resize_bilinear_2x_int8", "softmax_last_fp16", "se_gate_int8", "dynamic_shape_int8",
         "sparse_rk3576_int8")


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


# librknnc's (DDR, NPU) cycles of single sparse convs (pads k // 2, stride 1, int8, rk3576): own
# rknn-toolkit2 2.5.0 builds (config(target_platform='rk3576', sparse_infer=True), weights pruned 4:2
# along the axis named, 2 calibration samples), read from the build log's layer table. The DDR figure
# does not depend on the weight values: the weight term is -1/8 of the stored shape's bytes
# (vendor_estimate.sparse_weight_bytes), here checked through npuemu's own builds of the same shapes.
VENDOR_SPARSE = [  # axis (1 input, 0 output channels, "both" 16:4), (OC, IC, k), H = W, vendor (DDR, NPU)
    (1, (64, 64, 3), 16, (4150, 9216)), (1, (32, 32, 3), 16, (2152, 2304)), (1, (64, 64, 1), 32, (17593, 8192)),
    (1, (128, 64, 3), 16, (6105, 18432)), (0, (64, 64, 3), 8, (858, 2304)), (0, (96, 64, 5), 8, (189, 9600)),
    (0, (64, 32, 1), 8, (875, 512)), (0, (32, 64, 3), 8, (704, 1152)), (0, (96, 32, 1), 8, (1175, 768)),
    ("both", (32, 32, 1), 8, (579, 256)), ("both", (64, 64, 1), 8, (1149, 512)), ("both", (32, 32, 3), 8, (545, 576)),
    ("both", (96, 64, 3), 8, (1244, 3456)), ("both", (128, 128, 1), 8, (2264, 1024)), ("both", (64, 96, 1), 8, (1415, 512)),
]


@pytest.mark.parametrize("axis, shape, size, vendor", VENDOR_SPARSE)
def test_own_sparse_build_gives_the_vendor_figures(axis, shape, size, vendor, tmp_path, capsys):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from npuemu.compiler.driver import CompileOptions, build, prepare

    out, inp, k = shape
    rng = np.random.default_rng(size + out + inp + k)
    weights = rng.normal(0, 0.1, (out, inp, k, k))
    if axis == "both":  # 16:4: every 4 x 4 tile keeps 2 kernels x 2 channels
        keep = np.zeros((out // 4, 4, inp // 4, 4, k, k), bool)
        for a, b in np.ndindex(out // 4, inp // 4):
            keep[a, :, b][np.ix_(rng.permutation(4)[:2], rng.permutation(4)[:2])] = True
        weights = np.where(keep.reshape(weights.shape), weights, 0)
    else:  # 4:2: 2 of every 4 along the axis
        moved = np.moveaxis(weights, axis, -1)
        groups = moved.reshape(moved.shape[:-1] + (-1, 4))
        keep = np.zeros(groups.shape, bool)
        np.put_along_axis(keep, np.argsort(rng.random(groups.shape), axis=-1)[..., :2], True, axis=-1)
        weights = np.moveaxis(np.where(keep, groups, 0).reshape(moved.shape), -1, axis)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[k // 2] * 4)
    graph = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, inp, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights.astype(np.float32), "w"),
                               numpy_helper.from_array(np.zeros(out, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    data = [{"x": rng.normal(size=(1, inp, size, size)).astype(np.float32)} for _ in range(2)]
    path = tmp_path / "s.npu"
    path.write_bytes(build(prepare(model, "rk3576", CompileOptions(dataset=data, sparse=True))).to_bytes())
    assert main(["perf", str(path), "--ddr-model", "vendor", "--json"]) == 0
    (row,) = [row for row in json.loads(capsys.readouterr().out)["layers"] if row["target"] == "NPU"]
    assert (row["ddr_cycles"], row["npu_cycles"]) == vendor
