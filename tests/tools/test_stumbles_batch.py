"""`npuemu run` on a --batch-size build states the batch's totals (issue 21 item 2): slices,
contexts, the NPU work summed over the contexts and the elapsed cycles of the timeline - a batch
of 2 on two contexts takes one slice's time but does twice its work."""

from __future__ import annotations

import re

import numpy as np
import pytest

from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import compile_graph, small_cnn


def _timing(capsys, path, shape, batch: int, tmp_path) -> str:
    x = np.random.default_rng(batch).standard_normal((batch, *shape[1:])).astype(np.float32)
    np.save(tmp_path / f"x{batch}.npy", x)
    assert main(["run", str(path), "-i", str(tmp_path / f"x{batch}.npy")]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("timing: "))


@pytest.mark.parametrize("batch, contexts, waves", [(2, 2, 1), (4, 3, 2)])
def test_batch_summary_states_slices_contexts_work_and_elapsed(tmp_path, capsys, batch, contexts, waves) -> None:
    from npuemu.compiler.build import build_model

    model, shape = small_cnn()
    build_model(compile_graph(model, shape)).write(tmp_path / "b1.npu")
    build_model(compile_graph(model, shape), batch=batch).write(tmp_path / "bn.npu")
    single = re.match(r"timing: (\d+) tasks, (\d+) cycles", _timing(capsys, tmp_path / "b1.npu", shape, 1, tmp_path))
    tasks, cycles = int(single.group(1)), int(single.group(2))
    line = _timing(capsys, tmp_path / "bn.npu", shape, batch, tmp_path)
    got = re.match(rf"timing: batch of {batch}: {batch} slices in (\d+) context\(s\) side by side, (\d+) tasks, "
                   r"(\d+) NPU cycles of work summed over the contexts; elapsed (\d+) cycles = ([\d.]+) us for the "
                   r"batch \(([\d.]+) us per slice\)", line)
    assert got, line
    assert int(got.group(1)) == contexts and int(got.group(2)) == batch * tasks
    assert int(got.group(3)) == batch * cycles      # every slice does the single build's work
    assert int(got.group(4)) == waves * cycles      # contexts side by side: one slice's time per wave
    assert abs(float(got.group(6)) - float(got.group(5)) / batch) < 0.06
