"""The 15 vendor ``.rknn`` fixtures on their second and third test inputs.

Only ``input_0`` is shipped compressed with every fixture; inputs 1 and 2 and their simulator
and onnxruntime outputs are rebuilt by the fixture folder's own ``regen.py`` (bit-exact from
their seeds, each array checked against the sha256 in meta.json). The tolerances are the ones
set on input_0 in ``test_rknn_fixtures_run.py``: the same rounding differences, on new data.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.emulator.test_rknn_fixtures_run import COS_VS_ORT_SLACK, DEFAULT_COS_VS_ORT_SLACK, TOLERANCES
from tests.shared_data import RKNN_FIXTURES
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.isa.rknn import load_rknn


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rknn-fixtures")
    done = subprocess.run([sys.executable, str(RKNN_FIXTURES / "regen.py"), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("index", [1, 2])
@pytest.mark.parametrize("case", sorted(TOLERANCES))
def test_fixture_input(regenerated, case, index, record_property):
    folder = regenerated / case
    meta = json.loads((folder / "meta.json").read_text())
    names = [inp["name"] for inp in meta["inputs"]]
    files = [folder / f"input_{index}.npy"] if len(names) == 1 else [folder / f"input_{index}_{n}.npy" for n in names]
    run = RknnRunner(load_rknn(folder / "model.rknn")).run([np.load(f) for f in files])

    output = meta["outputs"][0]
    sim = np.load(folder / f"sim_output_{index}.npy")
    ort = np.load(folder / f"ort_output_{index}.npy").reshape(-1).astype(np.float64)
    q_sim = np.rint(sim.astype(np.float64) / np.float32(output["scale"])).astype(np.int64) + output["zero_point"]
    q_emu = run.quantized[output["name"]].astype(np.int64)
    diff = np.abs(q_emu.reshape(-1) - q_sim.reshape(-1))
    identical, max_lsb = float(np.mean(diff == 0)), int(diff.max())
    emu = run.outputs[output["name"]].reshape(-1).astype(np.float64)
    sim = sim.reshape(-1).astype(np.float64)
    ours, vendor = _cos(emu, ort), _cos(sim, ort)
    report = (f"{case} input_{index}: {100 * identical:.3f} % identical, max {max_lsb} LSB, "
              f"cos vs sim {_cos(emu, sim):.6f}, cos vs ort ours {ours:.6f} / sim {vendor:.6f}")
    print(report)
    record_property("identical", identical)
    record_property("max_lsb", max_lsb)
    tolerance = TOLERANCES[case]
    assert max_lsb <= tolerance.max_lsb, report
    assert identical >= tolerance.min_identical, report
    assert _cos(emu, sim) >= tolerance.min_cos_vs_sim, report
    assert ours >= vendor - COS_VS_ORT_SLACK.get(case, DEFAULT_COS_VS_ORT_SLACK), report
