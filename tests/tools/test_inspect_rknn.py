import json
from pathlib import Path

from npuemu.tools.cli import main

FIXTURES = Path(__file__).parents[2] / ".." / "shared" / "rknn-fixtures"


def _fixture(name: str) -> Path:
    path = FIXTURES / name / "model.rknn"
    assert path.is_file(), f"vendor fixture missing: {path} (expected ../shared beside the repo)"
    return path


def test_inspect_rknn_shows_tensors_chains_and_quantization(capsys):
    assert main(["inspect", str(_fixture("rep01_conv3x3s1_32to32_56_relu"))]) == 0
    out = capsys.readouterr().out
    assert "vendor RKNN model, format 6" in out
    assert "relu_out5" in out and "0.0430256" in out and "-128" in out
    assert "single-core program" in out


def test_inspect_rknn_json(capsys):
    assert main(["inspect", "--json", str(_fixture("rep02_conv1x1_64to128_28"))]) == 0
    described = json.loads(capsys.readouterr().out)
    assert isinstance(described, dict) and described


def test_inspect_truncated_rknn_is_a_clear_error(tmp_path, capsys):
    data = _fixture("rep01_conv3x3s1_32to32_56_relu").read_bytes()
    broken = tmp_path / "broken.rknn"
    broken.write_bytes(data[: len(data) // 2])
    assert main(["inspect", str(broken)]) == 2
    err = capsys.readouterr().err
    assert "broken.rknn" in err and "Traceback" not in err


def test_disasm_of_an_rknn_reassembles_to_its_stored_blob(tmp_path, capsys):
    from npuemu.isa.rknn import load_rknn

    path = _fixture("rep12_resblock_convadd_3x3_64_56")
    text_path = tmp_path / "rknn.s"
    assert main(["disasm", str(path), "-o", str(text_path)]) == 0
    assert main(["asm", str(text_path), "-o", str(tmp_path / "out.bin")]) == 0
    stored = load_rknn(path).program.regcmd.astype("<u8").tobytes()
    assert (tmp_path / "out.bin").read_bytes() == stored
