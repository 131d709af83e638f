"""`npuemu compile --sram`: internal tensors in the chip's SRAM as far as it goes (guide 5.7;
compiler/memory_plan.plan_sram), the same values, SRAM hits instead of DDR traffic in the timing
model (never more DDR bytes), and the memory report's SRAM line."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.build import build_model
from npuemu.compiler.memory_plan import TensorLifetime, plan_sram, reuse_offsets
from npuemu.emulator.runtime import Runtime
from npuemu.emulator.timing.memory_report import memory_npu
from npuemu.emulator.timing.report import report_npu
from npuemu.isa.errors import CompileError
from npuemu.platforms import load_platform
from tests.compiler.test_build_e2e import MODELS, compile_graph
from tests.networks.builders import mobilenet_v2


def _run(graph, shape, **kwargs):
    model = build_model(graph, **kwargs)
    runtime = Runtime(model)
    runtime.set_input("x", np.random.default_rng(1).normal(size=shape).astype(np.float32))
    runtime.run()
    return model, runtime


@pytest.mark.parametrize("case", ["small_cnn", "tiled_cnn", "pools_add", "mobilenet_v2"])
def test_sram_build_keeps_values_and_moves_traffic_off_ddr(case, tmp_path) -> None:
    model, shape = (mobilenet_v2(96), (1, 3, 96, 96)) if case == "mobilenet_v2" else MODELS[case]()
    graph = compile_graph(model, shape)
    platform = load_platform("rk3588")
    reports = {}
    for sram, cores in ((False, (0,)), (True, (0,)), (True, (0, 1, 2))):
        built, runtime = _run(graph, shape, sram=sram, cores=cores)
        reports[sram, cores] = (report_npu(built, runtime.runs, platform), runtime.output(graph.outputs[0], False), built)
    base, sram, both = reports[False, (0,)], reports[True, (0,)], reports[True, (0, 1, 2)]
    assert np.array_equal(base[1], sram[1]) and np.array_equal(base[1], both[1])
    b, s = base[0].totals(), sram[0].totals()
    assert s["sram_hit_bytes"] > 0 and b["sram_hit_bytes"] == 0
    assert s["ddr_read_bytes"] + s["ddr_write_bytes"] < b["ddr_read_bytes"] + b["ddr_write_bytes"]
    # the bytes did not vanish: DDR + SRAM traffic of the SRAM build = DDR traffic of the DDR build
    assert s["ddr_read_bytes"] + s["ddr_write_bytes"] + s["sram_hit_bytes"] == b["ddr_read_bytes"] + b["ddr_write_bytes"]
    assert s["cycles"] <= b["cycles"]
    regions = {region.name: region for region in sram[2].memory_map().regions}
    assert regions["sram"].size <= platform.sram.size_bytes
    path = tmp_path / "m.npu"
    sram[2].write(path)
    report = memory_npu(sram[2].__class__.read(path), str(path))
    assert report.sram_bytes == regions["sram"].size and report.sram_tensors
    assert "SRAM (internal tensors)" in report.format_text()


def test_plan_sram_fits_the_capacity_and_reuses_by_lifetime() -> None:
    rng = np.random.default_rng(0)
    tensors = [TensorLifetime(f"t{i}", int(rng.integers(1, 50)) * 1000, i, i + int(rng.integers(0, 4)))
               for i in range(40)]
    plan = plan_sram(tensors, 64 * 1024, 4096)
    chosen = [t for t in tensors if t.name in plan.addresses]
    assert chosen and plan.size <= 64 * 1024 and plan.size % 4096 == 0
    _, extent = reuse_offsets(chosen)
    assert extent <= plan.size
    for a in chosen:  # tensors alive together never share bytes
        for b in chosen:
            if a is not b and a.overlaps(b):
                sa, sb = plan.addresses[a.name], plan.addresses[b.name]
                assert sa + a.size <= sb or sb + b.size <= sa


def test_sram_on_a_chip_without_one_is_refused() -> None:
    model, shape = MODELS["conv_relu"]()
    with pytest.raises(CompileError, match="rk3568 has no NPU-usable SRAM"):
        build_model(compile_graph(model, shape), "rk3568", sram=True)
