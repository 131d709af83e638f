"""``npuemu sweep --backend ray``: a local Ray instance (2 CPUs, no dashboard) runs a 4-point sweep,
one Ray task per build and per point, and gives the rows the local backend gives. Ray is in the
``test`` extra, so CI runs this; it takes ~15 s (Ray's start-up most of it)."""

from __future__ import annotations

import pytest

from npuemu.tools.cli import main
from npuemu.tools.sweep_rows import read_rows

SPEC = "models: [net.onnx]\ndtype: fp16\ncore_mask: [auto, 0_1_2]\nset:\n  ddr.read_bytes_per_cycle: [3.0, 6.0]\n"
FIGURES = ("point", "cycles", "ddr_cycles", "ddr_read_bytes", "ddr_write_bytes", "time_us", "tasks", "error")


@pytest.fixture
def folder(tmp_path):
    import onnx

    from npuemu.tools.demo_network import demo_network

    onnx.save(demo_network(), tmp_path / "net.onnx")
    (tmp_path / "sweep.yaml").write_text(SPEC)
    return tmp_path


def test_ray_sweep_equals_local(folder, capsys):
    import ray

    assert main(["sweep", str(folder / "sweep.yaml"), "-o", str(folder / "ray.csv"), "--backend", "ray",
                 "--workers", "2"]) == 0
    assert not ray.is_initialized()  # the sweep stopped the Ray instance it started
    assert main(["sweep", str(folder / "sweep.yaml"), "-o", str(folder / "local.csv"), "--workers", "1"]) == 0
    on_ray = sorted((tuple(row[k] for k in FIGURES) for row in read_rows(folder / "ray.csv")))
    local = sorted((tuple(row[k] for k in FIGURES) for row in read_rows(folder / "local.csv")))
    assert len(on_ray) == 4 and on_ray == local and not any(row[-1] for row in on_ray)


def test_address_without_ray_backend_is_refused(folder, capsys):
    assert main(["sweep", str(folder / "sweep.yaml"), "-o", str(folder / "x.csv"), "--address", "auto"]) == 2
    assert "--backend ray" in capsys.readouterr().err
