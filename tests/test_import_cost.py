"""Running a model file does not load the compiler or onnx (issue 20: first-call time). Checked
in fresh processes, as a user runs a model: `npuemu run model.npu -i x.npy` and the Runtime
API. (onnx alone costs 0.08-0.4 s to import; the compiler's passes and ops about as much.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.compiler.test_build_e2e import build, compile_front, small_cnn

ROOT = Path(__file__).resolve().parents[1]

#: the compiler modules the command line loads for every command: the package and the core-mask
#: names `npuemu matmul` offers as choices (compiler/core_mask.py: no imports beyond isa)
CLI_ALLOWED = {"npuemu.compiler", "npuemu.compiler.core_mask"}

_LOADED = """
import json, sys
{body}
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "onnx" or name.startswith("npuemu.compiler"))
print("LOADED " + json.dumps(loaded))
"""

_CLI = """
from npuemu.tools import cli
code = cli.main(["run", sys.argv[1], "-i", sys.argv[2]])
assert code == 0, code
"""

_API = """
import numpy as np
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
runtime = Runtime(ModelFile.read(sys.argv[1]))
runtime.set_input(runtime.inputs[0], np.load(sys.argv[2]))
runtime.run()
print(runtime.output(runtime.outputs[0]).shape)
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("import_cost")
    model, shape = small_cnn()
    path, x_path = folder / "small.npu", folder / "x.npy"
    build(compile_front(model, shape)).write(path)
    np.save(x_path, np.random.default_rng(0).normal(size=shape).astype(np.float32))
    return str(path), str(x_path)


def loaded_modules(body: str, model: str, x: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", _LOADED.format(body=body), model, x], capture_output=True,
                          text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("LOADED "))
    return json.loads(line[len("LOADED "):])


def test_npuemu_run_loads_neither_the_compiler_nor_onnx(model_file) -> None:
    loaded = loaded_modules(_CLI, *model_file)
    assert set(loaded) <= CLI_ALLOWED, f"loaded by `npuemu run`: {sorted(set(loaded) - CLI_ALLOWED)}"


def test_the_runtime_api_loads_neither_the_compiler_nor_onnx(model_file) -> None:
    assert loaded_modules(_API, *model_file) == []


def test_the_check_sees_a_compiler_import(model_file) -> None:
    loaded = loaded_modules("import npuemu.compiler.driver", *model_file)
    assert "onnx" in loaded and "npuemu.compiler.passes" in loaded
