"""Multi-batch builds (compiler/batch.py, `compile --batch-size N`, guide 5.6): slice i computes
what the single-batch build computes on input i, every context writes its own internal memory,
the batched I/O buffers hold slice i at address + i * size / N, the schedule runs a wave of
slices on different cores in one group, and perf/mem show the overlap and the duplication."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from npuemu.compiler.batch import ADDRESS_REGISTERS, slice_name
from npuemu.compiler.build import build_model
from npuemu.compiler.driver import CompileOptions, prepare
from npuemu.compiler.quant import calibrate, quantize_graph
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.memory_report import memory_npu
from npuemu.emulator.timing.report import report_npu
from npuemu.isa.chain import decode_chain
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import CompileError, InputError, NpuemuError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform
from tests.compiler.test_build_cpu_steps import classifier_softmax, conv_resize_conv
from tests.compiler.test_build_e2e import MODELS, compile_graph


def _chip(name):
    """A platform by name; "one_context": rk3588 with one batch context, as on the single-core chips
    (whose 16-kernel MAC groups the emulator does not run yet, issue 4)."""
    if name != "one_context":
        return load_platform(name)
    spec = load_platform("rk3588")
    return dataclasses.replace(spec, cores=dataclasses.replace(spec.cores, parallel_batch_contexts=1))


def _inputs(shape, batch, seed=3):
    return np.random.default_rng(seed).normal(size=(batch, *shape[1:])).astype(np.float32)


def _single_outputs(graph, xs, platform="rk3588", **kwargs):
    """Each slice through the single-batch build: the reference of the batch build."""
    model = build_model(graph, platform, **kwargs)
    outs, runtimes = [], []
    for x in xs:
        runtime = Runtime(model)
        runtime.set_input(graph.inputs[0], x[None])
        runtime.run()
        outs.append(runtime.output(graph.outputs[0], dequantize=False))
        runtimes.append(runtime)
    return model, outs, runtimes


def _batch_run(graph, xs, platform="rk3588", **kwargs):
    model = ModelFile.from_bytes(build_model(graph, platform, batch=len(xs), **kwargs).to_bytes())
    runtime = Runtime(model)
    runtime.set_input(graph.inputs[0], xs)
    runtime.run()
    return model, runtime


CASES = {
    # case: (model builder, chip, build options, batch)
    "small_cnn_rk3588": (MODELS["small_cnn"], "rk3588", {}, 4),  # 3 contexts, 2 waves
    "classifier_rk3576": (MODELS["classifier"], "rk3576", {}, 3),  # 2 contexts
    "pools_add_1_context": (MODELS["pools_add"], "one_context", {}, 2),  # slices one after another
    "cpu_step_rk3588": (conv_resize_conv, "rk3588", {}, 3),  # a host step per slice between chains
    "cpu_output_rk3588": (classifier_softmax, "rk3588", {}, 2),  # the host step writes the graph output
    "sram_rk3588": (MODELS["activations_cnn"], "rk3588", {"sram": True}, 2),  # each context its own SRAM
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_slice_i_equals_the_single_batch_build_on_input_i(case) -> None:
    builder, chip, options, batch = CASES[case]
    chip = _chip(chip)
    model, shape = builder()
    graph = compile_graph(model, shape)
    xs = _inputs(shape, batch)
    _, want, _ = _single_outputs(graph, xs, chip, **options)
    built, runtime = _batch_run(graph, xs, chip, **options)
    got = runtime.output(graph.outputs[0], dequantize=False)
    assert got.shape == (batch, *want[0].shape[1:])
    for index in range(batch):
        assert np.array_equal(got[index:index + 1], want[index]), f"{case}: slice {index}"
    assert not np.array_equal(got[0], got[1]), "different inputs must give different slices"
    if options.get("sram"):
        assert any(t.region == "sram" for t in built.tensors()), "nothing was placed in SRAM"
    contexts = built.trailer["batch"]["contexts"]
    assert contexts == min(batch, chip.cores.parallel_batch_contexts)
    npu_cores = {step.core for step in built.schedule() if step.kind == "npu"}
    assert npu_cores == set(range(contexts))
    if any(step.kind == "cpu" for step in built.schedule()):  # one host step per slice
        cpu_steps = [step for step in built.schedule() if step.kind == "cpu"]
        assert len(cpu_steps) == batch * sum(1 for s in build_model(graph, chip).schedule() if s.kind == "cpu")


def test_contexts_own_their_internal_memory_and_io_slices_are_contiguous() -> None:
    model, shape = MODELS["small_cnn"]()
    graph = compile_graph(model, shape)
    xs = _inputs(shape, 3)
    single, _, single_runs = _single_outputs(graph, xs)
    built, runtime = _batch_run(graph, xs)
    tensors = {t["name"]: t for t in built.trailer["tensors"]}
    internal = [t["name"] for t in single.trailer["tensors"]
                if t["name"] not in (*graph.inputs, *graph.outputs)]
    assert internal
    for name in internal:  # each context wrote its own copy: slice k's values at context k's address
        addresses = {tensors[name]["address"], *(tensors[slice_name(name, k)]["address"] for k in (1, 2))}
        assert len(addresses) == 3
        for k in range(3):
            copy = name if k == 0 else slice_name(name, k)
            assert np.array_equal(runtime.read_native(copy), single_runs[k].read_native(name)), (name, k)
    for name in (*graph.inputs, *graph.outputs):
        record = tensors[name]
        slot = record["size"] // 3
        assert record["shape"][0] == 3 and record["batch"]["addresses"] == [record["address"] + i * slot
                                                                              for i in range(3)]
    areas = {a["name"]: a["size"] for a in built.trailer["memory_map"]["areas"]}
    single_areas = {a["name"]: a["size"] for a in single.trailer["memory_map"]["areas"]}
    assert areas["internal"] == 3 * single_areas["internal"] and areas["weights"] == single_areas["weights"]
    # weights shared: every slice's chain reads the same weight addresses as the single build
    regmap = load_regmap("rk3588")
    section = built.section("regcmd")
    weight_addresses = set()
    for step in built.schedule():
        decoded = decode_chain(section.data, regmap, section.load_address, section.load_address + step.chain.offset,
                               step.chain.first_amount)
        weight_addresses |= {w.value for t in decoded.chain.tasks for w in t.writes
                             if (w.block, w.register) == ("CNA", "DCOMP_ADDR0")}
    weights = next(a for a in built.trailer["memory_map"]["areas"] if a["name"] == "weights")
    assert weight_addresses and all(weights["base"] <= a < weights["base"] + weights["size"] for a in weight_addresses)
    assert ("DPU", "DATA_CUBE_NOTCH_ADDR") not in ADDRESS_REGISTERS


def test_a_wave_runs_in_one_group_and_every_layer_has_a_task_range_per_slice() -> None:
    model, shape = MODELS["small_cnn"]()
    built = build_model(compile_graph(model, shape), batch=4)
    steps = built.schedule()
    assert [(s.core, s.group) for s in steps] == [(0, 0), (1, 0), (2, 0), (0, None)]
    for layer in built.layers():
        if layer.tasks:
            assert sorted(r.step for r in layer.tasks) == [0, 1, 2, 3]


def test_perf_overlaps_the_slices_and_mem_shows_the_copies(tmp_path) -> None:
    model, shape = MODELS["small_cnn"]()
    graph = compile_graph(model, shape)
    platform = load_platform("rk3588")
    xs = _inputs(shape, 3)
    single = build_model(graph)
    runtime = Runtime(single)
    runtime.set_input("x", xs[:1])
    runtime.run()
    one = report_npu(single, runtime.runs, platform)
    built, batched = _batch_run(graph, xs)
    three = report_npu(built, batched.runs, platform)
    t1, t3 = one.totals(), three.totals()
    assert t3["ddr_read_bytes"] == 3 * t1["ddr_read_bytes"] and t3["npu_cycles"] == 3 * t1["npu_cycles"]
    assert sum(layer.macs for layer in three.layers) == 3 * sum(layer.macs for layer in one.layers)
    assert t1["cycles"] <= t3["cycles"] < 3 * t1["cycles"]  # overlapped on 3 cores, bounded by the shared DDR
    shared = -(-(t3["ddr_read_bytes"] + t3["ddr_write_bytes"]) // platform.ddr.shared_bytes_per_cycle)
    assert t3["cycles"] >= min(shared, t1["cycles"])
    assert three.to_json()["batch"] == {"size": 3, "contexts": 3}
    assert all(set(layer.workload()) == {0, 1, 2} for layer in three.layers if layer.tasks)
    path = tmp_path / "b.npu"
    built.write(path)
    single.write(tmp_path / "s.npu")
    mem = memory_npu(ModelFile.read(path), str(path))
    mem1 = memory_npu(ModelFile.read(tmp_path / "s.npu"), str(tmp_path / "s.npu"))
    assert mem.internal_bytes == 3 * mem1.internal_bytes and mem.weight_bytes == mem1.weight_bytes
    assert mem.other["I/O tensors"] >= 3 * mem1.other["I/O tensors"] - 3 * 64
    assert "Batch: 3 slices in 3 context(s)" in mem.format_text()


def test_sram_is_divided_between_the_contexts() -> None:
    model, shape = MODELS["small_cnn"]()
    built = build_model(compile_graph(model, shape), sram=True, batch=3)
    platform = load_platform("rk3588")
    regions = {r.name: r for r in built.memory_map().regions}
    share = regions["sram"].size // 3  # a context does not share its SRAM (guide 5.7)
    assert 0 < regions["sram"].size <= platform.sram.size_bytes and share <= platform.sram.size_bytes // 3
    by_name = {t["name"]: t for t in built.trailer["tensors"]}
    in_sram = [t for t in built.trailer["tensors"] if t.get("region") == "sram" and "#b" not in t["name"]]
    assert in_sram
    for tensor in in_sram:
        for k in (1, 2):
            assert by_name[slice_name(tensor["name"], k)]["address"] == tensor["address"] + k * share


@pytest.mark.parametrize("hybrid", [False, True])
def test_fp16_and_hybrid_batch_builds(hybrid) -> None:
    model, shape = MODELS["pools_add"]()
    if hybrid:  # first two layers in float16, DataConvert NPU tasks at the boundaries (LOWERING.md 26)
        # (the driver's hybrid build reads a quant config file: passes by the driver, dtypes by hand)
        graph = prepare(model, "rk3588", CompileOptions(precision="float")).graph
        rng = np.random.default_rng(0)
        samples = [{"x": rng.normal(size=shape).astype(np.float32)} for _ in range(4)]
        quantize_graph(graph, calibrate(graph, samples, progress=False).ranges,
                       layer_dtypes={node.name: "float16" for node in graph.nodes[:2]})
    else:
        graph = prepare(model, "rk3588", CompileOptions(precision="fp16")).graph
    xs = _inputs(shape, 2)
    _, want, _ = _single_outputs(graph, xs)
    built, runtime = _batch_run(graph, xs)
    got = runtime.output(graph.outputs[0], dequantize=False)
    assert got.dtype == want[0].dtype
    assert all(np.array_equal(got[i:i + 1], want[i]) for i in range(2))
    assert hybrid == any(node.op_type == "DataConvert" for node in graph.nodes)
    assert not any(step.kind == "cpu" for step in built.schedule())


@pytest.mark.parametrize("batch", [0, -1, 2.0])
def test_bad_batch_sizes_are_refused(batch) -> None:
    model, shape = MODELS["conv_relu"]()
    with pytest.raises(CompileError, match="--batch-size"):
        build_model(compile_graph(model, shape), batch=batch)


def test_batch_with_a_multi_core_mask_is_refused(tmp_path, capsys) -> None:
    model, shape = MODELS["conv_relu"]()
    graph = compile_graph(model, shape)
    with pytest.raises(CompileError, match="core mask auto"):
        build_model(graph, batch=2, cores=(0, 1, 2))
    from npuemu.tools.cli import main

    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    dataset = tmp_path / "ds.txt"
    np.save(tmp_path / "a.npy", _inputs(shape, 1)[0:1])
    dataset.write_text(str(tmp_path / "a.npy") + "\n")
    assert main(["compile", str(onnx_path), "--quantize", "--dataset", str(dataset), "--batch-size", "2",
                 "--core-mask", "0_1", "-o", str(tmp_path / "m.npu")]) != 0
    assert "core mask auto" in capsys.readouterr().err


def test_cli_compile_and_run_a_batch(tmp_path, capsys) -> None:
    from npuemu.tools.cli import main

    model, shape = MODELS["conv_relu"]()
    onnx_path = tmp_path / "m.onnx"
    onnx_path.write_bytes(model.SerializeToString())
    np.save(tmp_path / "a.npy", _inputs(shape, 1, seed=5))
    (tmp_path / "ds.txt").write_text(str(tmp_path / "a.npy") + "\n")
    assert main(["compile", str(onnx_path), "--quantize", "--dataset", str(tmp_path / "ds.txt"),
                 "--batch-size", "3", "-o", str(tmp_path / "m.npu")]) == 0
    xs = _inputs(shape, 3, seed=6)
    np.save(tmp_path / "xs.npy", xs)
    assert main(["run", str(tmp_path / "m.npu"), "--input", str(tmp_path / "xs.npy"),
                 "--output-dir", str(tmp_path / "out")]) == 0
    out = np.load(next((tmp_path / "out").glob("*.npy")))
    assert out.shape[0] == 3
    runtime = Runtime(ModelFile.read(tmp_path / "m.npu"))
    with pytest.raises(InputError, match="batch size 3"):
        runtime.set_input("x", xs[:2])
    capsys.readouterr()


def test_the_trailer_schema_checks_the_batch_keys() -> None:
    model, shape = MODELS["conv_relu"]()
    built = build_model(compile_graph(model, shape), batch=2)
    ModelFile.from_bytes(built.to_bytes())  # valid as built
    broken = dict(built.trailer, batch={"size": "2", "contexts": 2})
    with pytest.raises(NpuemuError, match=r"batch\.size"):
        ModelFile.from_bytes(ModelFile(built.sections, broken).to_bytes())
    tensors = [dict(t, batch={"size": 2, "addresses": [-1]}) if "batch" in t else t for t in built.trailer["tensors"]]
    with pytest.raises(NpuemuError, match=r"batch\.addresses"):
        ModelFile.from_bytes(ModelFile(built.sections, dict(built.trailer, tensors=tensors)).to_bytes())
