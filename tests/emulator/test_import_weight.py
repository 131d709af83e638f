"""An int8 model's process does not import the float DPU path (issue 20: first call in a fresh
process). ``task_plan.prepare_fp_dpu`` imports ``units.dpu_plan_fp`` at the first float DPU task
and ``units.dpu``'s float stages import ``kernels.dpu_fp_chain`` / ``kernels.lut_fp`` where they
run, so importing the runtime and running an int8 model leave those modules (and
``kernels.fp16_atoms``, which only ``dpu_fp_chain`` imports) out, while a float16 model's run
imports them. Checked in fresh interpreters, so a new eager import cannot slip in unnoticed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.fixed_cost import chain_model
from npuemu.compiler.build import build_model
from npuemu.compiler.driver import CompileOptions, build, prepare
from tests.compiler.test_build_e2e import compile_graph

ROOT = Path(__file__).resolve().parents[2]
SHAPE = (1, 16, 8, 8)

#: the float DPU path: imported only by a model with a float DPU task
FLOAT_DPU = ("npuemu.emulator.units.dpu_plan_fp", "npuemu.emulator.kernels.dpu_fp_chain",
             "npuemu.emulator.kernels.lut_fp", "npuemu.emulator.kernels.fp16_atoms")

_RUN = """
import json, sys
import numpy as np
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
print("IMPORTED " + json.dumps(sorted(sys.modules)))
if len(sys.argv) > 1:
    runtime = Runtime(ModelFile.read(sys.argv[1]))
    runtime.set_input(runtime.inputs[0], np.load(sys.argv[2]))
    runtime.run()
    runtime.output(runtime.outputs[0])
print("RAN " + json.dumps(sorted(sys.modules)))
"""


def _modules(*args: str) -> tuple[set[str], set[str]]:
    """The modules loaded after the runtime's import and after one run of ``args`` (model, input)."""
    proc = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split(" ", 1)[0]: set(json.loads(line.split(" ", 1)[1])) for line in proc.stdout.splitlines()
             if line.startswith(("IMPORTED ", "RAN "))}
    return lines["IMPORTED"], lines["RAN"]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """A 1x1 conv + Relu pair (two tasks) built int8 and float16, with an input file."""
    folder = tmp_path_factory.mktemp("import_weight")
    x = str(folder / "x.npy")
    np.save(x, np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32))
    graph = chain_model(1, 0, input_name="x")
    builds = {"int8": build_model(compile_graph(graph, SHAPE)),
              "fp16": build(prepare(graph, "rk3588", CompileOptions(precision="fp16")))}
    paths = {}
    for name, model in builds.items():
        path = folder / f"{name}.npu"
        model.write(path)
        paths[name] = (str(path), x)
    return paths


def test_importing_the_runtime_leaves_the_float_dpu_path_out() -> None:
    imported, _ = _modules()
    assert "npuemu.emulator.task_plan" in imported and "npuemu.emulator.units.dpu" in imported
    assert not imported.intersection(FLOAT_DPU)


def test_an_int8_run_leaves_it_out_and_a_float16_run_imports_it(models) -> None:
    _, ran_int8 = _modules(*models["int8"])
    assert "npuemu.emulator.kernels.dpu_pixel" in ran_int8  # (the int8 DPU path ran)
    assert not ran_int8.intersection(FLOAT_DPU)
    imported, ran_fp16 = _modules(*models["fp16"])
    assert not imported.intersection(FLOAT_DPU)
    assert ran_fp16.issuperset(FLOAT_DPU)  # (the check sees them once a float task needs them)
