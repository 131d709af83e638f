"""Smoke test of ``python -m benchmarks.sequence_models``: one silero-vad export end to end (both builds, one
timed run each) prints a row of plausible figures; an unknown model name is refused naming it. No timing
thresholds."""

import numpy as np
import pytest

from benchmarks import sequence_models


def test_a_sequence_model_row(capsys):
    if sequence_models.model_path("silero_vad_openvino") is None:
        pytest.skip("silero-vad not installed (pip install --no-deps -r tests/requirements-models.txt)")
    assert sequence_models.main(["--models", "silero_vad_openvino", "--runs", "1", "--repeat", "1"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert "x ort" in header
    fields = row.split()
    assert fields[0] == "silero_vad_openvino" and fields[-1] == "0/0"  # (no host step in either build)
    reference, int8, fp16 = float(fields[1]), float(fields[2]), float(fields[4])
    assert reference > 0 and int8 > 0 and fp16 > 0
    for printed, ms in ((fields[3], int8), (fields[5], fp16)):  # (the ratios of the unrounded times)
        assert printed.endswith("x") and abs(float(printed[:-1]) - ms / reference) <= 0.05 + 0.02 * ms / reference


def test_an_unknown_model_is_named(capsys):
    with pytest.raises(SystemExit) as exited:
        sequence_models.main(["--models", "silero_vad_openvino,nonesuch"])
    assert exited.value.code == 2
    assert "nonesuch" in capsys.readouterr().err


def test_bitexact_fingerprints_a_sequence_model(tmp_path, capsys):
    """``benchmarks.bitexact`` builds and hashes the sequence models too (every input fed): the same build hashes
    equal, and a changed state input changes the fingerprint."""
    from benchmarks import bitexact

    if sequence_models.model_path("silero_vad_op15") is None:
        pytest.skip("silero-vad not installed (pip install --no-deps -r tests/requirements-models.txt)")
    bitexact.build(str(tmp_path), ["silero_vad_op15"])
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "silero_vad_op15_fp16.npu", "silero_vad_op15_inputs.npz", "silero_vad_op15_int8.npu"]
    first, again = (str(tmp_path / name) for name in ("first.json", "again.json"))
    assert bitexact.main(["hash", str(tmp_path), first, "silero_vad_op15"]) == 0
    assert bitexact.main(["hash", str(tmp_path), again, "silero_vad_op15", "--compare", first]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "equal"
    feeds = sequence_models.sample("silero_vad_op15", 1000)
    path = str(tmp_path / "silero_vad_op15_int8.npu")
    moved = dict(feeds, state=feeds["state"] + np.float32(0.25))
    assert bitexact.fingerprint(path, feeds) != bitexact.fingerprint(path, moved)


def test_bitexact_refuses_what_would_compare_nothing(tmp_path, capsys):
    """A misspelt model name is refused naming it; a directory without the builds named is an error, not an
    "equal" over nothing."""
    from benchmarks import bitexact

    with pytest.raises(SystemExit) as exited:
        bitexact.main(["hash", str(tmp_path), str(tmp_path / "out.json"), "silero_vad_op16"])
    assert exited.value.code == 2 and "silero_vad_op16" in capsys.readouterr().err
    assert bitexact.main(["hash", str(tmp_path), str(tmp_path / "out.json"), "ppocr_cls"]) == 1
    assert "no build of ppocr_cls" in capsys.readouterr().out
    assert not (tmp_path / "out.json").exists()


def test_bitexact_says_when_the_base_has_none_of_the_builds(tmp_path, capsys):
    from benchmarks import bitexact

    if sequence_models.model_path("silero_vad_op15") is None:
        pytest.skip("silero-vad not installed (pip install --no-deps -r tests/requirements-models.txt)")
    bitexact.build(str(tmp_path), ["silero_vad_op15"])
    other = tmp_path / "other.json"
    other.write_text('{"ppocr_cls_int8": "0"}')
    assert bitexact.main(["hash", str(tmp_path), str(tmp_path / "out.json"), "silero_vad_op15",
                          "--compare", str(other)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-2:] == [
        f"not in {other} (not compared): silero_vad_op15_fp16, silero_vad_op15_int8", "NOTHING COMPARED"]
