"""``npuemu mem``, ``npuemu trace`` and the timing line of ``npuemu run`` (emulator/timing/
memory_report.py, trace.py; tools/cmd_mem.py, cmd_trace.py, cmd_run.py)."""

from __future__ import annotations

import json
import lzma
import os
from pathlib import Path

import numpy as np
import pytest

from tests.shared_data import RKNN_FIXTURES
from npuemu.tools.cli import main
from npuemu.tools.cmd_run import _file_name

FIXTURES = RKNN_FIXTURES
RESNET18 = FIXTURES / "resnet18"
REP12 = FIXTURES / "rep12_resblock_convadd_3x3_64_56"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    directory = tmp_path_factory.mktemp("demo")
    assert main(["demo", "-o", str(directory)]) == 0
    return directory


def _fixture_input(case: Path, tmp_path: Path) -> str:
    with lzma.open(case / "input_0.npy.xz") as handle:
        np.save(tmp_path / "x.npy", np.load(handle))
    return str(tmp_path / "x.npy")


def test_mem_rknn_matches_vendor_figures(capsys):
    model = str(RESNET18 / "model.rknn")
    assert main(["mem", model, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    vendor = json.loads((RESNET18 / "meta.json").read_text())["librknnc"]
    # the vendor prints KB with one decimal: "Total Weight/Internal Memory Size"
    assert abs(report["weight_bytes"] / 1024 - vendor["weight_memory_kb"]) < 0.05
    assert abs(report["internal_bytes"] / 1024 - vendor["internal_memory_kb"]) < 0.05
    from npuemu.isa.rknn import load_rknn
    rknn = load_rknn(model)
    io = sum(rknn.tensors[i].size for i in tuple(rknn.inputs) + tuple(rknn.outputs))
    assert report["other"]["I/O tensors"] == io == 1 * 3 * 224 * 224 + 1024
    # regcmd blob (64-bit words) + task blob (40-byte rknpu_task records)
    assert report["other"]["register commands"] == rknn.program.regcmd_words * 8 + 40 * len(rknn.program.tasks)
    assert report["total_bytes"] == report["weight_bytes"] + report["internal_bytes"] + report["other_bytes"]
    assert report["model_file_bytes"] == os.path.getsize(model)

    assert main(["mem", model]) == 0
    text = capsys.readouterr().out
    for label in ("Weight Memory:", "Internal Tensor Memory:", "Other Memory:", "Total Memory:",
                  "current model size is:"):
        assert label in text
    assert f"({report['total_bytes']} B)" in text


def test_mem_npu_from_memory_map_and_errors(demo, tmp_path, capsys):
    from npuemu.isa.container import ModelFile

    npu = str(demo / "demo_cnn.npu")
    assert main(["mem", npu, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    areas = {a.name: a.size for a in ModelFile.read(npu).memory_map().areas}
    assert report["weight_bytes"] == areas["weights"] > 0
    assert report["internal_bytes"] == areas["internal"] > 0
    assert report["other"] == {"I/O tensors": areas["io"], "register commands": areas["regcmd"]}
    assert report["total_bytes"] == sum(areas.values())
    assert report["model_file_bytes"] == os.path.getsize(npu)

    (tmp_path / "junk.bin").write_bytes(b"nothing")
    assert main(["mem", str(tmp_path / "junk.bin")]) == 2
    err = capsys.readouterr().err
    assert "not a .rknn file" in err and "Traceback" not in err


def platform_overhead(perf: dict) -> int:
    from npuemu.platforms import load_platform

    return load_platform(perf["platform"]).launch.task_overhead_cycles


def _check_trace(trace: dict, perf: dict) -> None:
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all(e["ph"] in ("X", "M") for e in events)
    for event in complete:
        assert {"name", "ph", "pid", "tid", "ts", "dur", "args"} <= set(event)
        assert event["dur"] > 0 and event["ts"] >= 0
    tracks: dict[tuple, list] = {}
    for event in complete:
        tracks.setdefault((event["pid"], event["tid"]), []).append(event)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    task_tracks = [key for key in tracks if names[key].startswith("core")]
    assert task_tracks == [(1, 0)]  # one core for now
    assert {names[key] for key in tracks} <= {"core 0", "DMA read", "DMA write"}
    assert "DMA read" in {names[key] for key in tracks}
    for key, track in tracks.items():
        starts = [e["ts"] for e in track]
        assert starts == sorted(starts), f"track {names[key]} not sorted"
        for before, after in zip(track, track[1:]):
            assert before["ts"] + before["dur"] <= after["ts"] + 1e-6, f"overlap on {names[key]}"
    tasks = tracks[(1, 0)]
    totals = perf["totals"]
    assert len(tasks) == totals["tasks"]
    assert sum(e["dur"] for e in tasks) == pytest.approx(totals["time_us"], rel=1e-9, abs=1e-6)
    assert sum(e["args"]["cycles"] for e in tasks) == totals["cycles"]
    assert sum(e["args"]["npu_cycles"] for e in tasks) == totals["npu_cycles"]
    assert sum(e["args"]["ddr_read_bytes"] for e in tasks) == totals["ddr_read_bytes"]
    # tasks end to end, and each task's DMA events lie inside the task
    end = 0.0
    for event in tasks:
        assert event["ts"] == pytest.approx(end, abs=1e-6)
        end = event["ts"] + event["dur"]
        assert event["args"]["enable_mask"].startswith("0x")
    dma = [e for key, track in tracks.items() if key[0] == 2 for e in track]
    assert sum(e["args"]["bytes"] for e in dma if names[(e["pid"], e["tid"])] == "DMA read") == totals["ddr_read_bytes"]
    assert sum(e["args"]["cycles"] for e in dma if e["cat"] == "dma") == totals["ddr_cycles"]
    fetch = [e for e in dma if e["cat"] == "regcmd"]
    assert fetch and all(e["args"]["cycles"] > 0 for e in fetch)
    assert sum(e["args"]["cycles"] for e in fetch) + len(tasks) * platform_overhead(perf) == \
        sum(e["args"]["overhead_cycles"] for e in tasks)
    assert max(e["ts"] + e["dur"] for e in dma) <= end + 1e-6


def test_trace_rknn_resnet18(tmp_path, capsys):
    model = str(RESNET18 / "model.rknn")
    assert main(["perf", model, "--json"]) == 0
    perf = json.loads(capsys.readouterr().out)
    out = tmp_path / "trace.json"
    assert main(["trace", model, "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "zeros" in printed and f"{perf['totals']['cycles']} cycles" in printed
    trace = json.loads(out.read_text())
    _check_trace(trace, perf)
    layer_names = {layer["full_name"] for layer in perf["layers"]}
    first = next(e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 1)
    assert first["name"].rsplit(" #", 1)[0] in layer_names and first["name"].endswith("#0")


def test_trace_npu_demo_and_errors(demo, tmp_path, capsys):
    npu, image = str(demo / "demo_cnn.npu"), str(demo / "image.npy")
    assert main(["perf", npu, "-i", image, "--json"]) == 0
    perf = json.loads(capsys.readouterr().out)
    out = tmp_path / "trace.json"
    assert main(["trace", npu, "-i", image, "-o", str(out)]) == 0
    capsys.readouterr()
    _check_trace(json.loads(out.read_text()), perf)

    assert main(["trace", npu, "-o", str(tmp_path / "no_such_dir" / "t.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the trace" in err and "Traceback" not in err


def test_run_prints_timing_and_outputs_unchanged_npu(demo, tmp_path, capsys):
    from npuemu.emulator.rknn_runner import load_input_arrays
    from npuemu.emulator.runtime import Runtime
    from npuemu.isa.container import ModelFile

    npu, image = str(demo / "demo_cnn.npu"), str(demo / "image.npy")
    assert main(["perf", npu, "-i", image, "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert main(["run", npu, "-i", image, "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    line = next(row for row in printed.splitlines() if row.startswith("timing:"))
    assert line.startswith(f"timing: {totals['tasks']} tasks, {totals['cycles']} cycles = {totals['time_us']:.1f} us")

    runtime = Runtime(ModelFile.read(npu))  # the runtime alone, no timing
    for name, array in zip(runtime.inputs, load_input_arrays([image])):
        runtime.set_input(name, array)
    runtime.run()
    for name in runtime.outputs:
        saved = np.load(tmp_path / "out" / f"{name}.npy")
        np.testing.assert_array_equal(saved, runtime.output(name, True))


def test_run_prints_timing_and_outputs_unchanged_rknn(tmp_path, capsys):
    from npuemu.emulator.rknn_runner import RknnRunner, load_input_arrays
    from npuemu.isa.rknn import load_rknn

    model = str(REP12 / "model.rknn")
    x = _fixture_input(REP12, tmp_path)
    assert main(["perf", model, "-i", x, "--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert main(["run", model, "-i", x, "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"timing: {totals['tasks']} tasks, {totals['cycles']} cycles" in printed

    result = RknnRunner(load_rknn(model), "rk3588").run(load_input_arrays([x]))
    assert result.outputs
    for name, array in result.outputs.items():
        np.testing.assert_array_equal(np.load(tmp_path / "out" / f"{_file_name(name)}.npy"), array)


def test_mem_sram_table_predicts_the_sram_hits(tmp_path, capsys):
    """`npuemu mem --sram` (guide 5.7.3.4): a row per layer output, SramHit = the bytes of the
    tensors placed in SRAM, and predicted per-frame RW amounts (sram_report.py)."""
    from npuemu.compiler.build import build_model
    from tests.compiler.test_build_e2e import MODELS, compile_graph

    model, shape = MODELS["small_cnn"]()
    graph = compile_graph(model, shape)
    for sram in (False, True):
        path = tmp_path / f"m{int(sram)}.npu"
        build_model(graph, sram=sram).write(path)
        assert main(["mem", str(path), "--sram", "--json"]) == 0
        table = json.loads(capsys.readouterr().out)["sram_table"]
        built = {t["name"]: t for t in json.loads(json.dumps(build_model(graph, sram=sram).trailer))["tensors"]}
        assert [row["tensor"] for row in table["layers"]] == [n.outputs[0] for n in graph.nodes]
        for row in table["layers"]:
            tensor = built[row["tensor"]]
            expected = None if row["tensor"] in graph.outputs else (tensor["size"] if tensor["region"] == "sram" else 0)
            assert row["sram_hit"] == expected and row["end"] - row["start"] == tensor["size"]
        hits = table["predict_sram_hit_rw_bytes"]
        assert (hits > 0) == sram and hits <= table["predict_internal_rw_bytes"]
        assert (table["sram_area"]["size"] > 0) == sram
    assert main(["mem", str(path), "--sram"]) == 0
    out = capsys.readouterr().out
    assert "Total allocated Internal SRAM Size" in out and "Predict SRAM Hit RW Amount" in out
    assert main(["mem", str(REP12 / "model.rknn"), "--sram"]) == 2
    assert "does not record one" in capsys.readouterr().err
