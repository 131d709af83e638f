"""`npuemu conformance` (tools/conformance.py): real ONNX node tests compiled for rk3588 and run
on the emulator; a handful of cases only, so it stays fast."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npuemu.tools import conformance
from npuemu.tools.cli import main


def _case(name: str):
    op = conformance._all_node_cases()
    return next(case for case in op if case.name == name)


@pytest.mark.parametrize("name, target", [("test_maxpool_2d_default", "NPU"), ("test_averagepool_2d_default", "NPU"),
                                          ("test_globalaveragepool", "NPU"), ("test_basic_conv_with_padding", "NPU"),
                                          # nearest x(2, 3), half_pixel + round: DPU unpooling (LOWERING.md 19)
                                          ("test_resize_upsample_scales_nearest", "NPU")])
def test_real_node_tests_pass(name, target):
    result = conformance.run_case(_case(name), "rk3588", "int8")
    assert result.status == "pass", result
    assert result.target == target
    assert 0 <= result.max_error <= result.tolerance


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_a_host_step_with_a_0_d_result(dtype):
    # MatMul of two vectors gives a scalar: the host step's int8 store quantizes it in place
    # (cpu_ops._store), where numpy hands back a scalar, not an array, for a 0-d result
    result = conformance.run_case(_case("test_matmul_1d_1d"), "rk3588", dtype)
    assert result.status == "pass", result


def test_wrong_expectation_fails_with_its_max_error():
    case = _case("test_maxpool_2d_default")
    prepared = conformance._prepare(case)
    wrong = [np.asarray(value) + 1.0 for value in prepared[2]]  # far beyond the int8 tolerance (~0.06)
    result = conformance.run_case(case, "rk3588", "int8", expected_override=wrong)
    assert result.status == "fail"
    assert result.max_error == pytest.approx(1.0, abs=0.1)
    assert result.max_error > result.tolerance


def test_wrong_shape_expectation_is_an_error_not_a_crash():
    case = _case("test_maxpool_2d_default")
    result = conformance.run_case(case, "rk3588", "int8", expected_override=[np.zeros(3, np.float32)])
    assert result.status == "error" and "AssertionError" in result.reason


def test_unsupported_case_carries_the_compiler_reason():
    result = conformance.run_case(_case("test_cast_FLOAT_to_FLOAT8E4M3FN"), "rk3588", "int8")
    assert result.status == "unsupported"
    assert "element type FLOAT8E4M3FN" in result.reason and "UnsupportedOpError" in result.reason


def test_multi_output_host_op_runs_one_step_per_output():
    """LayerNormalization with its Mean and InvStdDev outputs: three host steps."""
    result = conformance.run_case(_case("test_layer_normalization_4d_axis0"), "rk3588", "int8")
    assert result.status == "pass" and result.target == "CPU", result


def test_element_wise_cases_below_4d_run_on_the_npu():
    """[3, 4, 5] tensors are laid out as a 3 x 4 x 5 cube (constraints.as_cube)."""
    for name in ("test_add", "test_sigmoid", "test_relu"):
        result = conformance.run_case(_case(name), "rk3588", "int8")
        assert result.status == "pass" and result.target == "NPU", (name, result.status, result.target)


def test_json_report_schema(tmp_path):
    path = tmp_path / "out.json"
    assert main(["conformance", "--ops", "GlobalMaxPool,Relu", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["chip"] == "rk3588" and report["dtype"] == "int8"
    assert set(report["totals"]) == set(conformance.STATUSES)
    assert set(report["ops"]) == {"GlobalMaxPool", "Relu"}
    assert report["ops"]["GlobalMaxPool"]["pass"] == 2 and report["ops"]["GlobalMaxPool"]["npu"] == 2
    for case in report["cases"]:
        assert set(case) == {"name", "op", "status", "reason", "max_error", "tolerance", "target", "seconds",
                             "partition_reason"}
        assert case["status"] in conformance.STATUSES
        assert case["status"] != "unsupported" or case["reason"]
    assert sum(report["totals"].values()) == len(report["cases"])


def test_cli_exit_codes(capsys):
    assert main(["conformance", "--ops", "NoSuchOp"]) == 2
    assert "NoSuchOp" in capsys.readouterr().err
    assert main(["conformance", "--ops", "GlobalAveragePool", "--list-unsupported"]) == 0
    assert "GlobalAveragePool" in capsys.readouterr().out


def test_cli_exits_1_when_a_case_fails(monkeypatch, capsys):
    real = conformance.run_case

    def wrong(case, chip, dtype):
        prepared = conformance._prepare(case)
        return real(case, chip, dtype, expected_override=[np.asarray(v) + 5.0 for v in prepared[2]])

    monkeypatch.setattr(conformance, "run_case", wrong)
    assert main(["conformance", "--ops", "GlobalMaxPool"]) == 1
    assert "fail: test_globalmaxpool" in capsys.readouterr().out


def test_cpu_partition_reason_is_in_the_unsupported_reason(monkeypatch):
    from npuemu.compiler import build_host

    monkeypatch.setattr(build_host, "CPU_OPS", build_host.CPU_OPS - {"MaxPool"})  # as if the host had none
    result = conformance.run_case(_case("test_maxpool_2d_dilations"), "rk3588", "int8")
    assert result.status == "unsupported"
    assert result.reason.startswith("[CPU: ") and "dilation" in result.reason


def test_host_steps_run_what_the_npu_cannot():
    """A dilated MaxPool (PPU has no dilation), an int64 Gather, a batched 5-D pool, a bool
    comparison: host steps with ND tensors of their own types and ranks."""
    for name in ("test_maxpool_2d_dilations", "test_gather_0", "test_averagepool_3d_default", "test_equal",
                 "test_shape"):
        result = conformance.run_case(_case(name), "rk3588", "int8")
        assert result.status == "pass" and result.target == "CPU", (name, result)


def test_deviation_is_compared_with_onnxruntime():
    pytest.importorskip("onnxruntime")
    result = conformance.run_case(_case("test_resize_downsample_scales_linear_align_corners"), "rk3588", "int8")
    assert result.status == "pass" and result.reason.startswith("deviation"), result


def test_nan_in_the_output_must_match():
    case = _case("test_abs")
    prepared = conformance._prepare(case)
    wrong = [np.full_like(np.asarray(value, np.float64), np.nan) for value in prepared[2]]
    assert conformance.run_case(case, "rk3588", "int8", expected_override=wrong).status == "fail"


def test_fp16_build_really_runs():
    result = conformance.run_case(_case("test_basic_conv_with_padding"), "rk3588", "fp16")
    assert result.status == "pass" and result.target == "NPU", result
    shifted = [np.asarray(v) + 1.0 for v in conformance._prepare(_case("test_basic_conv_with_padding"))[2]]
    assert conformance.run_case(_case("test_basic_conv_with_padding"), "rk3588", "fp16",
                                expected_override=shifted).status == "fail"


@pytest.mark.parametrize("name", ["test_cast_FLOAT_to_BFLOAT16", "test_cast_BFLOAT16_to_FLOAT",
                                  "test_cast_FLOAT_to_INT4", "test_cast_UINT4_to_FLOAT16",
                                  "test_range_bfloat16_type_positive_delta"])
def test_bfloat16_and_int4_host_tensors_run(name):
    # ml_dtypes' bfloat16/int4/uint4 as ND host tensors (isa/CONTAINER.md 3.3)
    result = conformance.run_case(_case(name), "rk3588", "int8")
    assert result.status == "pass", result
    assert result.target == "CPU"


@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_every_node_case_passes_or_says_why_not(dtype):
    """The whole suite (~11 s per dtype): no case fails or errors, and none that passed in the
    last measurement (tools/CONFORMANCE.md: 533 of 641 on rk3588) stops passing unnoticed."""
    report = conformance.run_conformance("rk3588", dtype)
    statuses = [case.status for case in report.cases]
    bad = [f"{case.name}: {case.status}: {case.reason}" for case in report.cases if case.status in ("fail", "error")]
    assert not bad, "\n".join(bad[:10])
    assert statuses.count("pass") >= 533
    assert all(case.reason for case in report.cases if case.status == "unsupported")
