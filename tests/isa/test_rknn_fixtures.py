"""The 15 vendor-compiled fixtures load, and what the loader reads agrees with three sources
written independently of it: each fixture's meta.json, the fixtures README table, and the
vendor-corpus listings (regcmd/<case>.txt tensor and task lines, tensors.csv memory plan)."""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from pathlib import Path

import pytest

from npuemu.isa.rknn import Region, describe_rknn, format_rknn, load_rknn, plan_memory

SHARED = Path(__file__).parents[2] / ".." / "shared"
FIXTURES = SHARED / "rknn-fixtures"
CORPUS = SHARED / "docs" / "vendor-corpus"

# The fixtures README table: chain-0 tasks, all task records, regcmd words.
README_TABLE = {
    "rep01_conv3x3s1_32to32_56_relu": (1, 11, 936),
    "rep02_conv1x1_64to128_28": (1, 11, 936),
    "rep03_conv3x3s2_3to32_224_first": (3, 15, 1400),
    "rep03b_conv3x3s2_3to32_224_first_meanstd": (3, 15, 1400),
    "rep04_dw3x3s1_64_56": (1, 11, 936),
    "rep05_dw3x3s2_96_112": (6, 21, 1840),
    "rep06_conv3x3s1_64to64_150_bigcbuf": (5, 26, 2568),
    "rep07_maxpool_k3s2p1_64_112": (1, 3, 32),
    "rep08_avgpool_k2s2_64_56": (1, 3, 32),
    "rep09_add_64_56": (1, 6, 480),
    "rep10_sigmoid_64_56": (2, 6, 1184),
    "rep11_fc_512to1000": (2, 14, 1016),
    "rep12_resblock_convadd_3x3_64_56": (3, 23, 2488),
    "mobilenet_v2": (68, 352, 43696),
    "resnet18": (35, 215, 21592),
}
NAMES = sorted(README_TABLE)
CORPUS_CASES = [name for name in NAMES if name.startswith("rep")]

_MODELS: dict[str, object] = {}


def fixture_dir(name: str) -> Path:
    folder = FIXTURES / name
    if not (folder / "model.rknn").is_file() or not (folder / "meta.json").is_file():
        pytest.fail(f"fixture {name} is missing: expected {folder}/model.rknn and meta.json "
                    f"(the shared folder must sit next to the repository as ../shared)")
    return folder


def model_of(name: str):
    if name not in _MODELS:
        _MODELS[name] = load_rknn(fixture_dir(name) / "model.rknn")
    return _MODELS[name]


def meta_of(name: str) -> dict:
    return json.loads((fixture_dir(name) / "meta.json").read_text())


def test_all_fixtures_are_listed():
    if not FIXTURES.is_dir():
        pytest.fail(f"fixture folder {FIXTURES} is missing")
    found = sorted(path.parent.name for path in FIXTURES.glob("*/model.rknn"))
    assert found == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_program_matches_readme_and_meta(name):
    model, rknn = model_of(name), meta_of(name)["rknn"]
    program = model.program
    chain0 = program.chains[0]
    assert (chain0.task_count, len(program.tasks), program.regcmd_words) == README_TABLE[name]
    assert model.container.format_version == rknn["format_version"] == 6
    assert model.container.file_size == rknn["file_bytes"]
    assert model.platform == rknn["platform"]
    assert model.target == meta_of(name)["target"] == "rk3588"
    assert (model.regions.weight, model.regions.internal, model.regions.misc) == tuple(
        rknn["regions_bytes"][key] for key in ("weight", "internal", "misc"))
    assert len(program.chains) == rknn["chains"]
    assert chain0.first_task == 0 and chain0.task_count == rknn["tasks_chain0"]
    assert program.is_linked(chain0) == rknn["chain0_is_records_0_to_n_minus_1"]
    assert program.chain_regcfg_words(chain0) == rknn["chain0_regcfg_words"]
    assert int((program.regcmd != 0).sum()) == rknn["regcmd_words_nonzero"]
    masks = sorted({f"{program.tasks[i].enable_mask:#x}" for i in chain0.tasks})
    assert masks == sorted(rknn["enable_masks_chain0"])
    relocation = rknn["relocation"]
    assert len(model.relocations) == relocation["tensors"]
    assert sum(len(entry.pairs) for entry in model.relocations) == relocation["entries"]
    assert sum(not tail.ends_chain for tail in program.tails) == relocation["pc_tails"]


@pytest.mark.parametrize("name", NAMES)
def test_graph_inputs_and_outputs_match_meta(name):
    model, meta = model_of(name), meta_of(name)
    for tensors, expected in ((model.input_tensors, meta["inputs"]), (model.output_tensors, meta["outputs"])):
        assert [t.name for t in tensors] == [e["name"] for e in expected]
        for tensor, entry in zip(tensors, expected):
            assert list(tensor.shape) == entry["shape"]
            assert list(tensor.native_shape) == entry["native_shape"]
            assert tensor.dtype_name == entry["rknn_dtype"]
            assert tensor.size == entry["size_bytes"]
            assert tensor.memory_offset == entry["internal_offset"]
            assert tensor.scales == (pytest.approx(entry["scale"], rel=1e-7),)
            assert tensor.zero_points == (entry["zero_point"],)
    for normalization, entry in zip(model.normalization, meta["inputs"]):
        if "mean" in entry:   # rep03b: the config's mean/std, per channel
            assert normalization.mean[:3] == pytest.approx(entry["mean"], rel=1e-6)
            assert normalization.std[:3] == pytest.approx(entry["std"], rel=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_layers_match_librknnc_table(name):
    model, layers = model_of(name), meta_of(name)["librknnc"]["layers"]
    assert [(layer.op_type, layer.name, layer.unit) for layer in model.layers] == [
        (row["op_type"], row["full_name"], row["target"]) for row in layers]


@pytest.mark.parametrize("name", NAMES)
def test_trailer_and_model_strings(name):
    model = model_of(name)
    assert model.trailer["target_platform"] == ["rk3588"]
    assert model.trailer["version"] == "2.5.0"
    assert model.compiler_version.startswith("2.5.0")
    assert model.source_framework == "ONNX" and model.shape_mode == "static_shape"
    assert {t["url"] for t in model.trailer["norm_tensor"]} == {
        t.name for t in (*model.input_tensors, *model.output_tensors)}


# --- the vendor-corpus listings --------------------------------------------------------------

_TENSOR_LINE = re.compile(
    r"^#  T(?P<index>\d+)\s+.*?\s(?P<dtype>\S+)\s+(?P<name>\S+)\s+shape=(?P<shape>None|\[[^\]]*\]) "
    r"native=(?P<native>None|\[[^\]]*\]) size=(?P<size>\S+) off=(?P<off>\S+) "
    r"scale=(?P<scale>None|\[[^\]]*\]) zp=(?P<zp>None|\[[^\]]*\])$")
_TASK_LINE = re.compile(
    r"^#  task (?P<index>\d+)\s+chain (?P<chain>\d+) .*? op_idx=(?P<op_idx>\d+) enable_mask=(?P<enable>0x[0-9a-f]+) "
    r"int_mask=(?P<int_mask>0x[0-9a-f]+) int_clear=(?P<int_clear>0x[0-9a-f]+) regcfg_amount=(?P<amount>\d+) "
    r"regcmd_addr=(?P<addr>0x[0-9a-f]+) flags=(?P<flags>\d+) \| tail: next_addr=(?P<next>0x[0-9a-f]+) "
    r"next_amount_word=(?P<next_amount>0x[0-9a-f]+)$")


def listing(case: str) -> list[str]:
    path = CORPUS / "regcmd" / f"{case}.txt"
    if not path.is_file():
        pytest.fail(f"vendor-corpus listing {path} is missing")
    return path.read_text().splitlines()


def _literal(text: str):
    return None if text == "None" else ast.literal_eval(text)


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_tensors_match_corpus_listing(case):
    model = model_of(case)
    rows = [m for m in map(_TENSOR_LINE.match, listing(case)) if m]
    assert rows, "no tensor lines found in the listing"
    named = [t for t in model.tensors if t.name and t.kind not in (9, 10)]
    assert [int(m["index"]) for m in rows] == [t.index for t in named]
    for match, tensor in zip(rows, named):
        assert tensor.name == match["name"]
        assert list(tensor.shape) == (_literal(match["shape"]) or [])
        assert list(tensor.native_shape) == (_literal(match["native"]) or [])
        assert tensor.size == _literal(match["size"])
        assert tensor.memory_offset == (_literal(match["off"]) or 0)
        assert list(tensor.scales) == pytest.approx(_literal(match["scale"]) or [], rel=1e-7)
        assert list(tensor.zero_points) == (_literal(match["zp"]) or [])
        if tensor.dtype != 13:   # the listing calls LUT blobs "blob"
            assert tensor.dtype_name == match["dtype"]


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_tasks_and_tails_match_corpus_listing(case):
    model = model_of(case)
    rows = [m for m in map(_TASK_LINE.match, listing(case)) if m]
    assert len(rows) == len(model.program.tasks)
    chain_of = {i: chain.index for chain in model.program.chains for i in chain.tasks}
    for match, task in zip(rows, model.program.tasks):
        assert task.index == int(match["index"]) and chain_of[task.index] == int(match["chain"])
        assert (task.op_idx, task.enable_mask, task.int_mask, task.int_clear, task.regcfg_amount,
                task.regcmd_addr, task.flags) == (
            int(match["op_idx"]), int(match["enable"], 16), int(match["int_mask"], 16),
            int(match["int_clear"], 16), int(match["amount"]), int(match["addr"], 16), int(match["flags"]))
        tail = model.program.tail_of(task)
        assert (tail.next_offset, tail.amount_word) == (int(match["next"], 16), int(match["next_amount"], 16))


def corpus_rows(case: str) -> list[dict]:
    path = CORPUS / "tensors.csv"
    if not path.is_file():
        pytest.fail(f"vendor-corpus table {path} is missing")
    with path.open(newline="") as handle:
        return [row for row in csv.DictReader(handle) if row["case"] == case and row["target"] == "rk3588"]


@pytest.mark.parametrize("case", CORPUS_CASES)
def test_memory_plan_reproduces_corpus_tensor_table(case):
    model = model_of(case)
    placements = plan_memory(model).by_name()
    rows = corpus_rows(case)
    assert rows, f"tensors.csv has no rk3588 rows for {case}"
    for row in rows:
        placement = placements[row["tensor"]]
        expected_region = Region.INTERNAL if row["table"] == "feature" else Region.WEIGHT
        assert placement.region is expected_region, row
        assert (placement.offset, placement.offset + placement.size, placement.size) == (
            int(row["start"], 16), int(row["end"], 16), int(row["size"])), row
        if row["scale"]:
            tensor = model.tensor(row["tensor"])
            assert math.isclose(tensor.scales[0], float(row["scale"]), rel_tol=1e-8)
            assert tensor.zero_points[0] == int(row["zero_point"])


@pytest.mark.parametrize("name", NAMES)
def test_memory_plan_fills_the_vendor_regions(name):
    """R4: the packed weight layout and the internal extent equal model slot 19 on every fixture."""
    model = model_of(name)
    plan = plan_memory(model)
    assert plan.extent(Region.WEIGHT) == model.regions.weight
    assert plan.extent(Region.INTERNAL) == model.regions.internal
    assert all(p.offset % 64 == 0 for p in plan.in_region(Region.WEIGHT))


# --- inspect summary ---------------------------------------------------------------------------


def test_describe_is_json_and_carries_the_facts():
    model = model_of("rep11_fc_512to1000")
    facts = describe_rknn(model)
    json.dumps(facts)
    assert facts["container"]["format_version"] == 6
    assert facts["model"]["target"] == "rk3588"
    assert facts["trailer"]["target_platform"] == ["rk3588"]
    assert facts["regions"] == {"weight": 522368, "internal": 2112, "misc": 0, "lut": 0}
    assert facts["program"]["regcmd_words"] == 1016
    assert [c["tasks"] for c in facts["program"]["chains"]][0] == 2
    by_name = {t["name"]: t for t in facts["tensors"]}
    assert by_name["gemm_out3"]["native_shape"] == [1, 1000]
    assert by_name["gemm_out3"]["offset"] == 1088 and by_name["gemm_out3"]["zero_point"] == [4]
    assert by_name["b2"]["region"] == "weight" and by_name["b2"]["offset"] == 0x7D000
    assert [layer["op_type"] for layer in facts["layers"]] == [
        "InputOperator", "Reshape", "Conv", "Reshape", "OutputOperator"]


def test_format_lists_tensors_layers_and_chains():
    text = format_rknn(model_of("rep01_conv3x3s1_32to32_56_relu"))
    assert "format 6" in text and "rk3588" in text and "RKNPU v2" in text
    assert re.search(r"relu_out5\s+output\s+int8\s+\[1,32,56,56\]\s+\[1,2,56,56,16\]\s+100352\s+internal\s+0x18800"
                     r"\s+0\.0430256\s+-128", text)
    assert re.search(r"ConvRelu\s+NPU\s+Conv:Conv4", text)
    assert re.search(r"^  0\s+0\s+1\s+126\s+0x1d\s+single-core program$", text, re.MULTILINE)
    assert "936 regcmd words" in text
    assert re.search(r"^chain 0 tasks:\n.*\n  0\s+Conv:Conv4\s+0x1d\s+126\s+0x0$", text, re.MULTILINE)
