"""The vendor's own 2-core programs of its rk3576 LUT files run (isa/rknn/variants.py ``is_table_upload``,
emulator/REGISTER_SEMANTICS.md 56.4): each chain holds a LUT table upload next to the conv, and the layers'
tasks-per-chain entries count it in some programs (the SE gate's 2-core entry) and not in others (every entry of
the Conv + Sigmoid files).

Files: tests/emulator/test_rknn_rk3576_lut.py's and test_rknn_rk3576_fp16_lut.py's (how they were made is said there).
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import pytest

from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.errors import ModelFileError
from npuemu.isa.rknn import load_rknn, variants
from npuemu.isa.rknn.variants import core_programs, is_table_upload

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"


def _model(name: str):
    return load_rknn(lzma.decompress((DATA / f"{name}.rknn.xz").read_bytes()), name)


def _run(name: str, cores, channels: int = 16) -> np.ndarray:
    x = np.random.RandomState(5).randn(1, channels, 12, 12).astype(np.float32)
    (_, out), = RknnRunner(_model(name), "rk3576", cores).run([x]).outputs.items()
    return np.asarray(out, dtype=np.float32)


@pytest.mark.parametrize("name", ["lut_sig_int8", "lut_hsw_int8", "lut_sig_fp16"])
def test_the_two_core_lut_program_runs_and_gives_chain_0s_output(name):
    """Both cores run the whole conv (the layer is not split: core 1's list repeats it), each after its upload."""
    programs = {program.label: program for program in core_programs(_model(name))}
    assert programs["2-core"].lists == ((4, 5), (6, 7))
    single = _run(name, (0,))
    np.testing.assert_array_equal(_run(name, (0, 1)), single)
    assert len(np.unique(single)) > 100


def test_the_se_gate_2_core_entry_counts_its_upload():
    """se8: the single-core entry (4) leaves its upload out, the 2-core core-0 entry (5) counts it."""
    model = _model("se8_int8")
    uploads = [index for index in range(len(model.program.tasks)) if is_table_upload(model, index)]
    assert uploads == [2, 7, 12]
    programs = {program.label: program for program in core_programs(model)}
    assert programs["2-core"].lists == ((10, 11, 12, 13, 14), (15,))
    np.testing.assert_array_equal(_run("se8_int8", (0, 1), 8), _run("se8_int8", (0,), 8))


def test_records_beyond_the_count_that_are_no_upload_are_still_refused(monkeypatch):
    """With no record read as an upload (a table of more writes than any has), core 0's chain holds 2 records for
    the layers' 1: refused by name, as every file was before the upload rule."""
    monkeypatch.setattr(variants, "TABLE_WRITES", 1 << 20)
    with pytest.raises(ModelFileError, match=r"hold 2 task records \(0 LUT table uploads\); the layers give core 0 1"):
        core_programs(_model("lut_sig_int8"))
