"""``--set KEY=VALUE`` on compile and perf (compiler/driver.py CompileOptions.platform_overrides):
validated as `npuemu platforms --set` validates, recorded in the model file only when given,
applied by perf; and the compiler-vs-timing key split (driver.TIMING_ONLY_KEYS) holds: a build
never depends on a key marked timing-only."""

from __future__ import annotations

import dataclasses
import json

import pytest

from npuemu.compiler.driver import (TIMING_ONLY_KEYS, CompileOptions, compile_model, target_platform,
                                    timing_only)
from npuemu.isa.container import ModelFile
from npuemu.platforms import load_platform
from npuemu.tools.cli import main
from npuemu.tools.demo_network import demo_network


@pytest.fixture(scope="module")
def onnx_path(tmp_path_factory):
    import onnx

    path = tmp_path_factory.mktemp("set") / "demo.onnx"
    onnx.save(demo_network(), path)
    return path


def _perf_json(capsys, *argv) -> dict:
    assert main(["perf", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_compile_records_overrides_only_when_given(onnx_path, tmp_path, capsys):
    plain, tuned = tmp_path / "plain.npu", tmp_path / "tuned.npu"
    assert main(["compile", str(onnx_path), "--fp16", "-o", str(plain)]) == 0
    assert main(["compile", str(onnx_path), "--fp16", "--set", "ddr.read_bytes_per_cycle=6",
                 "--set", "cbuf.banks=8", "-o", str(tuned)]) == 0
    capsys.readouterr()
    trailer = ModelFile.read(plain).trailer
    assert "platform_overrides" not in trailer["compiler"]["options"]
    assert "overrides" not in trailer["platform"]
    trailer = ModelFile.read(tuned).trailer
    expected = {"ddr.read_bytes_per_cycle": 6.0, "cbuf.banks": 8}  # parsed with the figure's type
    assert trailer["compiler"]["options"]["platform_overrides"] == expected
    assert trailer["platform"]["overrides"] == expected


@pytest.mark.parametrize("override", ["ddr.read_bytes_per_cycle=0", "cbuf.banks=99", "ddr.no_such_key=1",
                                      "ddr.read_bytes_per_cycle=fast", "novalue"])
def test_bad_override_fails_as_platforms_set_does(onnx_path, tmp_path, capsys, override):
    assert main(["platforms", "rk3588", "--set", override]) == 2
    expected = capsys.readouterr().err.split("error: ", 1)[1]
    for command in (["compile", str(onnx_path), "--fp16", "-o", str(tmp_path / "x.npu")],
                    ["perf", str(onnx_path), "--fp16"]):
        assert main([*command, "--set", override]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.split("error: ", 1)[1] == expected
    assert not (tmp_path / "x.npu").exists()


def test_perf_applies_recorded_and_given_overrides(onnx_path, tmp_path, capsys):
    npu = tmp_path / "fast.npu"
    assert main(["compile", str(onnx_path), "--fp16", "--set", "ddr.read_bytes_per_cycle=1.5", "-o", str(npu)]) == 0
    capsys.readouterr()
    slow = _perf_json(capsys, npu)["totals"]
    whatif = _perf_json(capsys, onnx_path, "--fp16", "--set", "ddr.read_bytes_per_cycle=1.5")["totals"]
    assert slow == whatif
    default = _perf_json(capsys, onnx_path, "--fp16")["totals"]
    assert slow["ddr_cycles"] > default["ddr_cycles"]  # the recorded figure is applied, not the YAML's
    faster = _perf_json(capsys, npu, "--set", "ddr.read_bytes_per_cycle=12")["totals"]  # timing keys: free
    assert faster["ddr_cycles"] < slow["ddr_cycles"]
    assert faster["ddr_read_bytes"] == slow["ddr_read_bytes"]


def test_perf_refuses_compiler_figure_on_built_file(onnx_path, tmp_path, capsys):
    npu = tmp_path / "b.npu"
    assert main(["compile", str(onnx_path), "--fp16", "--set", "cbuf.banks=8", "-o", str(npu)]) == 0
    capsys.readouterr()
    assert _perf_json(capsys, npu, "--set", "cbuf.banks=8")["totals"]  # the value it was built with: fine
    assert main(["perf", str(npu), "--set", "cbuf.banks=6"]) == 2
    err = capsys.readouterr().err
    assert "built with cbuf.banks=8" in err and "Traceback" not in err


# --- the split: a timing-only key never changes a build ------------------------------------

def _leaf_keys(platform) -> list[str]:
    """Every figure under the timing-only prefixes, as a --set key path."""
    keys = []
    for prefix in TIMING_ONLY_KEYS:
        value = platform.get(prefix)
        if dataclasses.is_dataclass(value):
            keys += [f"{prefix}.{f.name}" for f in dataclasses.fields(value) if f.name not in ("source", "note")]
        else:
            keys.append(prefix)
    return keys


def _other_value(value):
    """A valid value different from ``value`` (the figures' ranges allow these)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    if value is None:
        return 3.0
    if value == "stored":
        return "logical"
    return "stored"


@pytest.mark.parametrize("dtype", ["fp16", "int8"])
def test_timing_only_keys_never_change_a_build(dtype):
    from npuemu.tools.demo_network import demo_images

    options = CompileOptions(precision=dtype, dataset=[{"image": image} for image in demo_images(2, 1)]
                             if dtype == "int8" else None)
    base = load_platform("rk3588")
    reference = compile_model(demo_network(), base, options).to_bytes()
    keys = _leaf_keys(base)
    assert len(keys) >= 15 and all(timing_only(key) for key in keys)
    for key in keys:
        variant = target_platform(base, {key: _other_value(base.get(key))})
        assert compile_model(demo_network(), variant, options).to_bytes() == reference, key


def test_a_compiler_key_does_change_a_build():
    """The check above can fail: a figure the compiler reads (the kernels per MAC pass follow
    macs) gives other bytes."""
    options = CompileOptions(precision="fp16")
    base = load_platform("rk3588")
    assert not timing_only("macs.fp16") and not timing_only("cbuf.banks")
    variant = target_platform(base, {"macs.fp16": base.macs.fp16 // 2})
    assert compile_model(demo_network(), variant, options).to_bytes() != \
        compile_model(demo_network(), base, options).to_bytes()
