"""``npuemu platforms``: the list, one chip in full, --set, --file and --json."""

import json

from npuemu.platforms import iter_leaves, list_platforms, load_platform
from npuemu.tools.cli import main


def run(capsys, *argv):
    code = main(["platforms", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_is_an_aligned_table_of_every_chip(capsys):
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    lines = out.rstrip("\n").splitlines()
    header, rule, rows = lines[0], lines[1], lines[2:]
    for title in ("chip", "cores", "int8 MAC/core", "int8 TOPS", "CBUF/core", "SRAM", "DDR B/cycle"):
        assert title in header
    assert [row.split()[0] for row in rows] == list_platforms()
    # Columns line up: every line has a gap (a space) right before each column of the rule.
    starts = [i for i, char in enumerate(rule) if char == "-" and (i == 0 or rule[i - 1] == " ")]
    for line in [header, *rows]:
        assert all(start == 0 or line[start - 1] == " " for start in starts), line
    rk3588 = next(row for row in rows if row.startswith("rk3588"))
    assert "rk3588s" in rk3588 and "1024" in rk3588 and "6.14" in rk3588
    assert "384 KiB" in rk3588 and "956 KiB system" in rk3588 and "5.887" in rk3588


def test_list_as_json(capsys):
    code, out, _ = run(capsys, "--json")
    rows = json.loads(out)
    assert code == 0
    assert [row["chip"] for row in rows] == list_platforms()
    rk3576 = {row["chip"]: row for row in rows}["rk3576"]
    assert rk3576["cores"] == 2 and rk3576["cbuf_bytes_per_core"] == 384 * 1024
    assert rk3576["ddr_read_bytes_per_cycle"] == load_platform("rk3576").ddr.read_bytes_per_cycle and rk3576["sram_kind"] == "nbuf"


def test_one_chip_in_full_with_sources(capsys):
    code, out, _ = run(capsys, "rk3566")
    assert code == 0
    assert out.startswith("rk3568: ")
    assert "aliases: rk3566" in out
    assert "cbuf:\n  source: hardware.md §1" in out
    assert "  banks       8\n" in out
    assert "  family  rk356x" in out
    assert "  int4   null\n" in out
    assert "derived (computed from the figures above):" in out
    # Every group of the platform is shown, each with its source.
    groups = [leaf.path for leaf in iter_leaves(load_platform("rk3568")) if leaf.path.endswith(".source")]
    assert len(groups) == 18
    assert out.count("  source: ") == len(groups)


def test_one_chip_as_json_is_the_yaml_data_plus_derived_figures(capsys):
    code, out, _ = run(capsys, "rk3588", "--json")
    data = json.loads(out)
    assert code == 0
    derived = data.pop("derived")
    assert data == load_platform("rk3588").to_dict()
    assert derived["cbuf_bytes_per_core"] == 393216
    assert derived["atom_k"]["fp16"] == 16


def test_set_overrides_what_is_shown(capsys):
    code, out, _ = run(capsys, "rk3588", "--set", "ddr.read_bytes_per_cycle=8", "--set", "cbuf.banks=10", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["ddr"]["read_bytes_per_cycle"] == 8.0
    assert data["cbuf"]["banks"] == 10


def test_set_applies_to_the_list_too(capsys):
    code, out, _ = run(capsys, "--set", "clock.npu_mhz=500", "--json")
    assert code == 0
    assert {row["npu_mhz"] for row in json.loads(out)} == {500.0}


def test_file_loads_a_user_platform(capsys, write_yaml, raw_platform):
    data = raw_platform("rk3562")
    data["name"] = "myboard"
    path = write_yaml(data, "myboard.yaml")
    code, out, _ = run(capsys, "--file", str(path), "--set", "clock.npu_mhz=900")
    assert code == 0
    assert out.startswith("myboard: ")
    assert "npu_mhz  900" in out


def test_errors_are_printed_without_traceback(capsys):
    code, out, err = run(capsys, "rk3588", "--set", "cbuf.banks=99")
    assert code == 2 and out == ""
    assert err.startswith("npuemu platforms: error: rk3588.yaml: override 'cbuf.banks=99': cbuf.banks: expected")
    assert "Traceback" not in err


def test_unknown_chip_and_conflicting_arguments(capsys, tmp_path):
    code, _, err = run(capsys, "rk1234")
    assert code == 2 and "unknown platform 'rk1234'" in err
    code, _, err = run(capsys, "rk3588", "--file", str(tmp_path / "x.yaml"))
    assert code == 2 and "either a chip name or --file" in err
