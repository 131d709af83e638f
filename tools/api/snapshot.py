"""``RKNN.accuracy_analysis()`` (guide 3.2.2, 4.1.3.1): the vendor's snapshot folder.

Layout (as rknn-toolkit2 writes it)::

    snapshot/
      error_analysis.txt     the per-layer table (tools/accuracy.py's vendor layout)
      map_name_to_file.txt   tensor name -> file name used below
      golden/                the float model's tensors (<file>.txt: values one per line;
        npy/                  npy/<file>.npy: the same with its shape)
      simulator/             the fake-quant simulator's tensors (entire)
        npy/
      runtime/               the emulated NPU's tensors (with a target only)
        npy/

The simulator columns come from the compiler's fake-quant model, the runtime columns from the
emulated NPU (``target`` given) instead of a board; without ``target`` the vendor analyses on
the simulator only, and so does this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from npuemu.isa.errors import InputError


def analyse(front: Any, inputs: Mapping[str, np.ndarray], name: str, run_emulator: bool) -> tuple[Any, dict]:
    """The accuracy report and the tensors to dump: ``{"golden"|"simulator"|"runtime": {tensor: array}}``."""
    from npuemu.compiler.float_eval import evaluate
    from npuemu.compiler.quant import fake_quant_evaluate
    from npuemu.tools import accuracy

    graph = front.graph
    report = accuracy.analyze(graph, front.platform, inputs, model=name, mode=front.quantization.mode,
                              run_emulator=run_emulator)
    tensors = [row.tensor for row in report.rows]
    dumps = {"golden": _pick(evaluate(graph, inputs, return_all=True), tensors),
             "simulator": _pick(fake_quant_evaluate(graph, inputs, return_all=True), tensors)}
    if run_emulator and not report.runtime_note:
        # the values the table's runtime columns measured (one probe build and run, tools/accuracy.py)
        dumps["runtime"] = dict(report.runtime_values)
    return report, dumps


def _pick(values: Mapping[str, Any], tensors: list[str]) -> dict[str, np.ndarray]:
    return {name: np.asarray(values[name]) for name in tensors if name in values}


def write(folder: Path, table: str, dumps: Mapping[str, Mapping[str, np.ndarray]]) -> None:
    """Write the snapshot folder (module docstring)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "error_analysis.txt").write_text(table, encoding="utf-8")
        files = _file_names([name for values in dumps.values() for name in values])
        (folder / "map_name_to_file.txt").write_text(
            "".join(f"{name} {file}\n" for name, file in files.items()), encoding="utf-8")
        for kind, values in dumps.items():
            (folder / kind / "npy").mkdir(parents=True, exist_ok=True)
            for name, array in values.items():
                np.savetxt(folder / kind / f"{files[name]}.txt", np.asarray(array, np.float64).reshape(-1), fmt="%.6f")
                np.save(folder / kind / "npy" / f"{files[name]}.npy", array)
    except OSError as error:
        raise InputError(f"cannot write the snapshot to {folder}: {error.strerror or error}") from None


def _file_names(names: list[str]) -> dict[str, str]:
    """A file name per tensor: its name with path-unsafe characters replaced, made unique."""
    files: dict[str, str] = {}
    used: set[str] = set()
    for name in dict.fromkeys(names):
        base = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "tensor"
        file, index = base, 1
        while file in used:
            file, index = f"{base}_{index}", index + 1
        files[name] = file
        used.add(file)
    return files
