"""`npuemu inspect`: the summary of a model file, its --json trailer, and corrupt files."""

from __future__ import annotations

import json
import struct

import pytest

from npuemu.isa.container import ModelFile, Section
from npuemu.tools.cli import main


def sample_model() -> ModelFile:
    sections = (
        Section("regcmd", "regcmd.core0", b"\x11" * 512, "ddr", 0x1000_0000),
        Section("regcmd", "regcmd.core1", b"\x22" * 256, "ddr", 0x1000_1000),
        Section("weights", "weights", b"\x33" * 300, "ddr", 0x1010_0000, 4096),
        Section("lut", "lut", b"\x44" * 64, "sram", 0x80),
    )
    chain = {"offset": 0, "first_amount": 55}
    trailer = {
        "platform": {"chip": "rk3588", "overrides": {"cores": 2}},
        "compiler": {"version": "0.1.0", "options": {"core_mask": "0_1", "quantized_method": "channel"}},
        "graph": {
            "inputs": ["images"], "outputs": ["prob"],
            "layers": [
                {"id": 0, "name": "conv_0", "op_type": "ConvRelu", "target": "NPU",
                 "tasks": [{"step": 0, "first": 0, "count": 3}, {"step": 1, "first": 0, "count": 2}]},
                {"id": 1, "name": "gap", "op_type": "GlobalAveragePool", "target": "NPU",
                 "tasks": [{"step": 2, "first": 0, "count": 1}]},
                {"id": 2, "name": "softmax_9", "op_type": "Softmax", "target": "CPU"},
            ],
        },
        "tensors": [
            {"name": "images", "shape": [1, 3, 32, 32], "dtype": "int8", "layout": "NC1HWC2", "c2": 3,
             "native_shape": [1, 1, 32, 32, 3], "quantization": {"scale": 0.0078125, "zero_point": -1},
             "region": "ddr", "address": 0x1020_0000, "size": 3072},
            {"name": "conv_0.weight", "shape": [16, 3, 3, 3], "dtype": "int8",
             "quantization": {"scale": [0.01, 0.02], "zero_point": [0, 0], "axis": 0}},
            {"name": "prob", "shape": [1, 10], "dtype": "float32", "layout": "NCHW"},
        ],
        "memory_map": {
            "regions": [{"name": "ddr", "base": 0x1000_0000, "size": 0x40_0000}],
            "areas": [{"name": "weights", "region": "ddr", "base": 0x1010_0000, "size": 300},
                      {"name": "regcmd", "region": "ddr", "base": 0x1000_0000, "size": 0x2000}],
        },
        "schedule": [
            {"kind": "npu", "core": 0, "chain": {"section": "regcmd.core0", "tasks": 3, **chain}, "layers": [0]},
            {"kind": "npu", "core": 1, "chain": {"section": "regcmd.core1", "tasks": 2, **chain}, "layers": [0]},
            {"kind": "npu", "core": 0, "chain": {"section": "regcmd.core0", "tasks": 1, **chain, "offset": 448},
             "layers": [1]},
            {"kind": "cpu", "op": "Softmax", "inputs": ["gap_out"], "outputs": ["prob"], "params": {"axis": 1},
             "layers": [2]},
        ],
    }
    return ModelFile(sections, trailer)


@pytest.fixture
def sample_path(tmp_path):
    path = tmp_path / "net.npu"
    sample_model().write(path)
    return path


def inspect(capsys, *args) -> tuple[int, str, str]:
    code = main(["inspect", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def lines_with(text: str, word: str) -> list[str]:
    return [line.split() for line in text.splitlines() if word in line.split()]


def test_summary_of_a_sample_file(capsys, sample_path):
    code, out, err = inspect(capsys, sample_path)
    assert code == 0 and err == ""
    assert f"file:      {sample_path} ({sample_path.stat().st_size} bytes)" in out
    assert "format:    npuemu 1.0" in out
    assert "platform:  rk3588" in out and '"cores": 2' in out
    assert '"core_mask": "0_1"' in out
    assert lines_with(out, "regcmd.core1") == [
        ["1", "regcmd", "regcmd.core1", "256", "ddr", "0x10001000", "64", f"{sample_model().sections[1].crc32:#010x}",
         "ok"]]
    assert lines_with(out, "weights")[0][:7] == ["2", "weights", "weights", "300", "ddr", "0x10100000", "4096"]
    assert lines_with(out, "images")[0] == [
        "images", "[1,3,32,32]", "int8", "NC1HWC2", "C2=3", "[1,1,32,32,3]", "scale=0.0078125", "zp=-1",
        "ddr", "0x10200000", "3072"]
    assert "per-channel[2] axis=0 scale=0.01..0.02 zp=0..0" in out
    assert lines_with(out, "ConvRelu") == [["0", "ConvRelu", "conv_0", "NPU", "5"]]
    assert lines_with(out, "Softmax") == [["2", "Softmax", "softmax_9", "CPU", "-"]]
    assert "schedule (4 steps):" in out
    assert "core 1: 2 tasks from regcmd.core1+0x0 (first amount 55)" in out
    assert "core 0: 1 task from regcmd.core0+0x1c0" in out
    assert 'Softmax(gap_out) -> prob {"axis": 1}' in out
    assert "core 0: 2 chains, 4 tasks" in out and "core 1: 1 chain, 2 tasks" in out and "cpu: 1 op" in out
    assert lines_with(out, "regcmd")[-1] == ["regcmd", "ddr", "0x10000000", "8192"]
    assert ["ddr", "0x10000000", "4194304"] in lines_with(out, "ddr")


def test_json_prints_the_trailer(capsys, sample_path):
    code, out, _ = inspect(capsys, sample_path, "--json")
    assert code == 0
    assert json.loads(out) == sample_model().trailer


def test_minimal_file(capsys, tmp_path):
    path = tmp_path / "empty.npu"
    ModelFile().write(path)
    code, out, err = inspect(capsys, path)
    assert code == 0 and err == ""
    for part in ("platform:  (not recorded)", "sections (0):", "tensors (0):", "layers (0):", "schedule (0 steps):",
                 "memory map:\n  (not recorded)"):
        assert part in out
    code, out, _ = inspect(capsys, path, "--json")
    assert code == 0 and json.loads(out) == {"format": {"name": "npuemu", "version": "1.0"}}


def _corrupt_weights(path) -> None:
    data = bytearray(path.read_bytes())
    offset = struct.unpack_from("<Q", data, 64 + 96 * 2 + 8)[0]  # entry 2 (weights): payload offset
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_file_is_an_error_without_traceback(capsys, sample_path):
    _corrupt_weights(sample_path)
    code, out, err = inspect(capsys, sample_path)
    assert code == 2 and out == ""
    assert err.startswith(f"npuemu inspect: error: {sample_path}: section 2 'weights' at offset 0x")
    assert "checksum mismatch" in err and "Traceback" not in err


def test_no_verify_reports_the_damaged_section(capsys, sample_path):
    _corrupt_weights(sample_path)
    code, out, _ = inspect(capsys, sample_path, "--no-verify")
    assert code == 1
    assert lines_with(out, "weights")[0][-1] == "MISMATCH"
    assert lines_with(out, "regcmd.core0")[0][-1] == "ok"
    assert "WARNING: checksum mismatch in 1 section: weights" in out


def test_truncated_file(capsys, sample_path):
    sample_path.write_bytes(sample_path.read_bytes()[:100])
    code, _, err = inspect(capsys, sample_path)
    assert code == 2 and "truncated" in err


def test_damaged_rknn_file_goes_to_the_rknn_reader(capsys, tmp_path):
    path = tmp_path / "model.rknn"
    path.write_bytes(b"RKNN" + bytes(60))
    code, _, err = inspect(capsys, path)
    assert code == 2 and "model.rknn: offset 8: unsupported .rknn format version" in err


def test_missing_file(capsys, tmp_path):
    code, _, err = inspect(capsys, tmp_path / "absent.npu")
    assert code == 2 and "absent.npu: cannot read the model file" in err


def test_readout_of_a_built_token_output_is_shown(capsys, tmp_path):
    """A build whose output is read out token-major (LOWERING.md 25, isa/CONTAINER.md 3.3): the
    summary names the output, its stored shape, perm and the shape handed out; --json keeps the
    record as written; a file without readouts prints no readout line."""
    from tests.compiler.test_output_readout import _tail_fp16

    built = _tail_fp16()
    path = tmp_path / "tail.npu"
    built.write(path)
    record = next(t for t in built.trailer["tensors"] if t["name"] == "y")
    assert record["readout"] == {"perm": [0, 2, 3, 1], "shape": [1, 10, 40]}
    code, out, err = inspect(capsys, path)
    assert code == 0 and err == ""
    assert "  readout (1): stored shape -> transposed by perm -> handed out as" in out
    stored = "[" + ",".join(str(d) for d in record["shape"]) + "]"
    assert f"    y: {stored} -> perm [0,2,3,1] -> [1,10,40]" in out.splitlines()
    code, out, _ = inspect(capsys, path, "--json")
    assert code == 0
    assert next(t for t in json.loads(out)["tensors"] if t["name"] == "y")["readout"] == record["readout"]
    sample_model().write(tmp_path / "plain.npu")
    code, out, _ = inspect(capsys, tmp_path / "plain.npu")
    assert code == 0 and "  readout (" not in out  # (the tmp path itself holds the word)
