"""Layers split across NPU cores (compiler/lower/multicore.py, `--core-mask`): values identical
to the single-core build, disjoint row blocks per core with the weights (and LUT) loaded on
every core, schedule groups, and the timing model's concurrent cores."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.build import build_model
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.report import report_npu
from npuemu.isa.chain import decode_chain
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.errors import CompileError, ConfigError
from npuemu.platforms import load_platform
from npuemu.compiler.core_mask import parse_core_mask
from tests.compiler.test_build_e2e import MODELS, compile_graph
from tests.compiler.test_lower_lut import _fused
from tests.networks.builders import mobilenet_v2


def _run(graph, shape, cores):
    model = build_model(graph, cores=cores)
    runtime = Runtime(model)
    runtime.set_input("x", np.random.default_rng(1).normal(size=shape).astype(np.float32))
    runtime.run()
    return model, runtime


CASES = {**MODELS, "conv_sigmoid": _fused("Sigmoid"), "mobilenet_v2_64": lambda: (mobilenet_v2(64), (1, 3, 64, 64))}


@pytest.mark.parametrize("case", sorted(CASES))
def test_split_build_computes_the_same_bits(case) -> None:
    model, shape = CASES[case]()
    graph = compile_graph(model, shape)
    _, single = _run(graph, shape, (0,))
    for cores in ((0, 1, 2), (2, 1)):
        built, split = _run(graph, shape, cores)
        output = graph.outputs[0]
        assert np.array_equal(split.output(output, dequantize=False), single.output(output, dequantize=False))
        assert {step.core for step in built.schedule() if step.kind == "npu"} <= set(cores)


def test_split_layers_have_one_step_per_core_in_a_group() -> None:
    model, shape = MODELS["tiled_cnn"]()
    built, runtime = _run(compile_graph(model, shape), shape, (0, 1, 2))
    steps = built.schedule()
    groups: dict[int, list] = {}
    for step in steps:
        if step.kind == "npu" and step.group is not None:
            groups.setdefault(step.group, []).append(step)
    assert groups, "no layer was split"
    for members in groups.values():
        assert len({step.core for step in members}) == len(members) >= 2
        assert len({step.layers for step in members}) == 1  # one layer per group
    # each core has its own CBUF: the first conv task of every split step loads the weights
    regmap = load_regmap("rk3588")
    section = built.section("regcmd")
    for members in groups.values():
        for step in members:
            decoded = decode_chain(section.data, regmap, section.load_address,
                                   section.load_address + step.chain.offset, step.chain.first_amount)
            writes = {(w.block, w.register): w.value for w in decoded.chain.tasks[0].writes}
            assert regmap.unpack("CNA", "CBUF_CON0", writes[("CNA", "CBUF_CON0")])["WEIGHT_REUSE"] == 0


def test_the_report_overlaps_cores_and_keeps_the_work() -> None:
    graph = compile_graph(mobilenet_v2(96), (1, 3, 96, 96))
    platform = load_platform("rk3588")
    reports = {}
    for cores in ((0,), (0, 1, 2)):
        built, runtime = _run(graph, (1, 3, 96, 96), cores)
        reports[cores] = report_npu(built, runtime.runs, platform)
    one, three = reports[(0,)], reports[(0, 1, 2)]
    macs = [sum(layer.macs for layer in report.layers) for report in (one, three)]
    assert macs[0] == macs[1]  # splitting never adds MACs (issue 5 property)
    assert three.totals()["cycles"] < one.totals()["cycles"]
    assert three.speedup() > 1.2 and one.speedup() == 1.0
    split = [layer for layer in three.layers if layer.split]
    assert split and all(abs(sum(layer.workload().values()) - 100.0) < 1e-6 for layer in split)
    assert all(layer.cycles >= max(layer._per_core(lambda t: t.cycles).values()) for layer in split)
    json = three.to_json()
    assert json["speedup"] == three.speedup() and any(len(layer["workload"]) == 3 for layer in json["layers"])
    assert "Up:" in three.format_table()


def test_core_masks_are_checked_against_the_chip() -> None:
    assert parse_core_mask("auto", 3, "rk3588") == (0,)
    assert parse_core_mask("all", 3, "rk3588") == (0, 1, 2)
    assert parse_core_mask("0_1", 3, "rk3588") == (0, 1)
    with pytest.raises(ConfigError, match="rk3568 has 1 NPU core"):
        parse_core_mask("0_1", 1, "rk3568")
    with pytest.raises(ConfigError, match="expected one of auto, 0, 1, 2, 0_1, 0_1_2, all"):
        parse_core_mask("3", 3, "rk3588")
    model, shape = MODELS["conv_relu"]()
    with pytest.raises(CompileError, match="rk3588 has 3 core"):
        build_model(compile_graph(model, shape), cores=(0, 3))
