"""The multi-core programs of vendor ``.rknn`` files (isa/rknn/variants.py, emulator/rknn_multicore.py;
issue 24 item 2): which records each core runs, the launches and barrier phases, the outputs
against the vendor simulator, the per-core timeline and the vendor-table cycles.

Structural facts are the files' own (regcmd_tasks.txt of each fixture and the decoded listings
of docs/vendor-corpus/regcmd): relocation core fields, tail links and bits 31:16 of the tail's
PC_REGISTER_AMOUNTS. Outputs are compared with the simulator in LSBs (int8) or absolute error
(fp16), the measure test_rknn_fixtures_run.py uses for chain 0.
"""

from __future__ import annotations

import json
import lzma

import numpy as np
import pytest

from tests.shared_data import RKNN_FIXTURES, RKNN_FIXTURES_OPS
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.emulator.timing.report import report_rknn
from npuemu.isa.errors import InputError, ModelFileError
from npuemu.isa.rknn import load_rknn
from npuemu.isa.rknn.variants import core_programs, launches
from npuemu.platforms import load_platform
from npuemu.tools.cli import main


def _folder(case: str):
    folder = RKNN_FIXTURES / case
    return folder if folder.is_dir() else RKNN_FIXTURES_OPS / case


def _meta(case: str) -> dict:
    return json.loads((_folder(case) / "meta.json").read_text())


def _inputs(case: str) -> list[np.ndarray]:
    names = [i["name"] for i in _meta(case)["inputs"]]
    files = ["input_0.npy.xz"] if len(names) == 1 else [f"input_0_{n}.npy.xz" for n in names]
    return [np.load(lzma.open(_folder(case) / f)) for f in files]


# --- which records each core runs ----------------------------------------------------------

def test_rep01_programs_follow_the_relocation_cores():
    """rep01 (listing docs/vendor-corpus/regcmd/rep01...: task 1/2 chain 1, 3/4 chain 2, 5..10
    chains 3..5; in0 + 0x5e80 on core (1,1) in task 3): 1 + 2 + 3 programs."""
    model = load_rknn(RKNN_FIXTURES / "rep01_conv3x3s1_32to32_56_relu" / "model.rknn")
    programs = core_programs(model)
    assert [p.label for p in programs] == ["single-core", "2-core", "3-core"]
    assert programs[0].lists == ((0,),)
    assert programs[1].lists == ((1, 2), (3, 4)) and programs[1].list_cores == (0, 1)
    assert programs[2].lists == ((5, 6), (7, 8), (9, 10))
    # one launch group; the conv task of each core ends at a barrier (HI16 1 / 2), the PPU task after it
    (group,) = launches(model, programs[2])
    assert [[(p.core, p.tasks) for p in phase] for phase in group.phases] == \
        [[(0, (5,)), (1, (7,)), (2, (9,))], [(0, (6,)), (1, (8,)), (2, (10,))]]


def test_conv1d_program_runs_its_single_core_layers_apart():
    """conv1d_fp16 regcmd_tasks.txt: the 2-core program's core-0 records are 3 (Reshape, block 0x0,
    whose tail continues at chain 0's conv block 0x280), 4-5 (conv half, barrier after 4), 6
    (Reshape); core 1's are 7-8. So: Reshape alone, the conv on both cores, Reshape alone."""
    model = load_rknn(RKNN_FIXTURES_OPS / "conv1d_fp16" / "model.rknn")
    program = core_programs(model)[1]
    assert program.lists == ((3, 4, 5, 6), (7, 8))
    groups = launches(model, program)
    assert [[[(p.core, p.tasks) for p in phase] for phase in g.phases] for g in groups] == [
        [[(0, (3,))]],
        [[(0, (4,)), (1, (7,))], [(0, (5,)), (1, (8,))]],
        [[(0, (6,))]],
    ]


def test_rk3576_files_hold_a_core_1_copy_of_the_single_core_program():
    """dense_rk3576_int8 regcmd_tasks.txt: chain 1 (task 1) is relocated for core 1 and counted by
    no layer entry; tasks 2 and 3 are the 2-core program, each ending with amount word 0x10000."""
    model = load_rknn(RKNN_FIXTURES_OPS / "dense_rk3576_int8" / "model.rknn")
    programs = core_programs(model)
    assert [(p.label, p.lists, p.list_cores) for p in programs] == [
        ("single-core", ((0,),), (0,)), ("single-core on core 1", ((1,),), (1,)),
        ("2-core", ((2,), (3,)), (0, 1))]


def test_a_mask_the_file_has_no_program_for_is_named():
    model = load_rknn(RKNN_FIXTURES / "rep01_conv3x3s1_32to32_56_relu" / "model.rknn")
    with pytest.raises(InputError, match=r"no program of the file runs on core\(s\) 1_2; it holds: "
                                         r"single-core \(cores 0\); 2-core \(cores 0_1\); 3-core \(cores 0_1_2\)"):
        RknnRunner(model, "rk3588", (1, 2))


def test_chains_that_fit_no_program_are_refused():
    from dataclasses import replace

    model = load_rknn(RKNN_FIXTURES / "rep01_conv3x3s1_32to32_56_relu" / "model.rknn")
    # the layer says 3 records on core 0 of the 2-core program, the file's chain 1 holds 2
    layers = tuple(replace(l, tasks_per_chain=(1, 3, 2, 2, 2, 2)) if l.unit == "NPU" else l for l in model.layers)
    with pytest.raises(ModelFileError, match=r"chain 2 relocates for core\(s\) \[1\], but its records fall in core 0's list"):
        core_programs(replace(model, layers=layers))


# --- outputs: every rk3588 fixture whose chain 0 runs, on 2 and 3 cores ---------------------

# (max LSB vs the simulator, min identical share): chain 0's figures (test_rknn_fixtures_run.py)
INT8_CASES = {
    "rep01_conv3x3s1_32to32_56_relu": (1, 0.995), "rep02_conv1x1_64to128_28": (1, 0.995),
    "rep03_conv3x3s2_3to32_224_first": (1, 0.995), "rep03b_conv3x3s2_3to32_224_first_meanstd": (1, 0.995),
    "rep04_dw3x3s1_64_56": (1, 0.995), "rep05_dw3x3s2_96_112": (1, 0.995),
    "rep06_conv3x3s1_64to64_150_bigcbuf": (1, 0.995), "rep09_add_64_56": (1, 0.995),
    "rep11_fc_512to1000": (1, 0.995), "rep12_resblock_convadd_3x3_64_56": (1, 0.94),
    "resnet18": (3, 0.50), "mobilenet_v2": (16, 0.08),
    "qdq_prequant_int8": (1, 0.995), "se_gate_int8": (1, 0.99), "focus_slice_int8": (1, 0.99),
}
FP16_CASES = {"se_gate_fp16": 0.0025, "conv_silu_add_fp16": 0.03}   # max |emu - sim|, as chain 0's


def _run(case: str, cores):
    return RknnRunner(load_rknn(_folder(case) / "model.rknn"), "rk3588", cores).run(_inputs(case))


@pytest.mark.parametrize("cores", [(0, 1), (0, 1, 2)])
@pytest.mark.parametrize("case", sorted(INT8_CASES))
def test_multicore_program_matches_the_simulator(case, cores):
    run = _run(case, cores)
    output = _meta(case)["outputs"][0]
    sim = np.load(lzma.open(_folder(case) / "sim_output_0.npy.xz")).astype(np.float64)
    q_sim = np.rint(sim / np.float32(output["scale"])).astype(np.int64) + output["zero_point"]
    q_emu = run.quantized[output["name"]].astype(np.int64).reshape(q_sim.shape)
    diff = np.abs(q_emu - q_sim)
    max_lsb, min_identical = INT8_CASES[case]
    report = f"{case} on {cores}: max {diff.max()} LSB, {100 * np.mean(diff == 0):.2f} % identical"
    print(report)
    assert diff.max() <= max_lsb and np.mean(diff == 0) >= min_identical, report
    assert set(run.cores) == set(cores)
    # the cores the records ran on: every core of the program that has records
    program = RknnRunner(load_rknn(_folder(case) / "model.rknn"), "rk3588", cores).core_program
    assert {t.core for t in run.tasks} == {c for c, listed in zip(program.list_cores, program.lists) if listed}
    assert len(run.tasks) == sum(len(listed) for listed in program.lists)


@pytest.mark.parametrize("cores", [(0, 1), (0, 1, 2)])
@pytest.mark.parametrize("case", sorted(FP16_CASES))
def test_multicore_fp16_program_matches_the_simulator(case, cores):
    run = _run(case, cores)
    (ours,) = run.outputs.values()
    sim = np.load(lzma.open(_folder(case) / "sim_output_0.npy.xz")).astype(np.float64).reshape(ours.shape)
    assert np.abs(ours.astype(np.float64) - sim).max() <= FP16_CASES[case]


def test_split_layers_compute_what_chain_0_computes():
    """The halves of rep12's split layers read rows the other core wrote before the barrier:
    running the cores in the wrong order would change the output, the barrier order keeps it
    equal to chain 0's, bit for bit."""
    single = _run("rep12_resblock_convadd_3x3_64_56", None).quantized
    for cores in ((0, 1), (0, 1, 2)):
        multi = _run("rep12_resblock_convadd_3x3_64_56", cores).quantized
        assert all(np.array_equal(single[k], multi[k]) for k in single)


# --- timing ---------------------------------------------------------------------------------

def test_timeline_puts_each_phase_side_by_side():
    case = "rep01_conv3x3s1_32to32_56_relu"
    model = load_rknn(_folder(case) / "model.rknn")
    platform = load_platform("rk3588")
    single = report_rknn(model, _run(case, None), platform).timeline
    double = report_rknn(model, _run(case, (0, 1)), platform).timeline
    spans = double.task_spans()
    assert sorted({s.lane for s in spans}) == [0, 1]
    conv = [s for s in spans if s.record.conv is not None]
    assert len(conv) == 2 and conv[0].start == conv[1].start      # both halves start together
    ppu = [s for s in spans if s.record.conv is None]
    assert min(s.start.cycles for s in ppu) >= max(s.end.cycles for s in conv)   # after the barrier
    assert len(double.spans("barrier")) == 2
    assert double.npu_cycles < 0.7 * single.npu_cycles


# librknnc's per-layer (DDR, NPU, Total) cycles (meta.json librknnc.layers, from
# librknnc_tables.txt): the vendor-estimate mode gives them from any of the file's programs
VENDOR_CASES = ("qdq_prequant_int8", "se_gate_int8", "focus_slice_int8", "conv_silu_add_fp16", "se_gate_fp16",
                "rep12_resblock_convadd_3x3_64_56", "resnet18")


@pytest.mark.parametrize("case", VENDOR_CASES)
def test_vendor_estimate_of_multicore_runs_equals_the_vendor_table(case):
    model = load_rknn(_folder(case) / "model.rknn")
    table = {layer["id"]: (layer["ddr_cycles"], layer["npu_cycles"], layer["total_cycles"])
             for layer in _meta(case)["librknnc"]["layers"] if layer["target"] == "NPU"}
    platform = load_platform("rk3588")
    for cores in (None, (0, 1), (0, 1, 2)):
        report = report_rknn(model, _run(case, cores), platform, "vendor")
        ours = {layer.id: (layer.ddr_cycles, layer.npu_cycles, layer.cycles) for layer in report.layers if layer.tasks}
        assert ours == table, (cores, ours, table)


# --- the command line -----------------------------------------------------------------------

def _save_input(tmp_path, case):
    path = tmp_path / "x.npy"
    np.save(path, _inputs(case)[0])
    return str(path)


def test_cli_run_and_perf_take_a_core_mask(tmp_path, capsys):
    case = "rep01_conv3x3s1_32to32_56_relu"
    model, x = str(_folder(case) / "model.rknn"), _save_input(tmp_path, case)
    assert main(["run", model, "-i", x, "--core-mask", "0_1", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "4 NPU tasks on cores 0_1 (2-core program, 4 pieces)" in out
    assert main(["perf", model, "-i", x, "--core-mask", "0_1_2", "--ddr-model", "vendor"]) == 0
    out = capsys.readouterr().out
    assert "3-core program on cores 0_1_2" in out and "28224" in out
    assert main(["run", model, "-i", x, "--core-mask", "1"]) == 2
    assert "no program of the file runs on core(s) 1" in capsys.readouterr().err


def test_vendor_estimate_keeps_a_kernel_split_apart():
    """resnet18's 2-core program splits layer 12 (3x3 s2 to 14x14, 256 kernels) by kernels, 128
    per core: H1 over each kernel group (2 x 29952) is the table's 59904; merged as if the halves
    were row blocks (14 x 28 pixels, 128 kernels) it would be 57600. mobilenet_v2: every program
    gives the table's total (every row of chain 0 equal since the counted-weights rule)."""
    platform = load_platform("rk3588")
    for case, total in (("resnet18", 3077058), ("mobilenet_v2", 1312664)):
        model = load_rknn(_folder(case) / "model.rknn")
        assert sum(layer["total_cycles"] for layer in _meta(case)["librknnc"]["layers"]) == total
        for cores in ((0, 1), (0, 1, 2)):
            report = report_rknn(model, _run(case, cores), platform, "vendor")
            assert sum(layer.cycles for layer in report.layers) == total, (case, cores)
            if case == "resnet18":
                assert next(layer for layer in report.layers if layer.id == 12).npu_cycles == 59904


def test_cli_trace_draws_one_track_per_core(tmp_path):
    case = "rep01_conv3x3s1_32to32_56_relu"
    out = tmp_path / "trace.json"
    assert main(["trace", str(_folder(case) / "model.rknn"), "-i", _save_input(tmp_path, case),
                 "--core-mask", "0_1_2", "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    tasks = [e for e in events if e.get("ph") == "X" and e.get("cat") not in ("regcmd",) and "mask" in str(e.get("args"))]
    assert len({(e["pid"], e["tid"]) for e in tasks}) == 3


def test_without_tasks_per_chain_only_chain_0_is_known():
    from dataclasses import replace

    model = load_rknn(RKNN_FIXTURES / "rep09_add_64_56" / "model.rknn")
    bare = replace(model, layers=tuple(replace(layer, tasks_per_chain=()) for layer in model.layers))
    assert [p.label for p in core_programs(bare)] == ["single-core"]
    with pytest.raises(InputError, match="it holds: single-core"):
        RknnRunner(bare, "rk3588", (0, 1))
    x = _inputs("rep09_add_64_56")
    assert np.array_equal(RknnRunner(bare).run(x).quantized["add_out1"], _run("rep09_add_64_56", None).quantized["add_out1"])
