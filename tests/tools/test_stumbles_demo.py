"""`npuemu demo` keeps its files (issue 21 item 2): by default in ./npuemu-demo, so the commands
it prints can be repeated; a folder holding someone else's files is not used."""

from __future__ import annotations

import shlex

from npuemu.tools.cli import main


def test_demo_keeps_its_files_and_the_printed_commands_work(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "the files are kept in npuemu-demo/" in out
    assert (tmp_path / "npuemu-demo" / "demo_cnn.npu").is_file()
    commands = [shlex.split(line[len("$ npuemu "):]) for line in out.splitlines() if line.startswith("$ npuemu ")]
    assert [command[0] for command in commands] == ["compile", "run"]
    for command in commands:  # repeated after the demo ended: every file they name is still there
        assert main(command) == 0
    assert main(["demo"]) == 0  # a second demo reuses its own folder


def test_demo_refuses_a_default_folder_of_other_files(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "npuemu-demo").mkdir()
    (tmp_path / "npuemu-demo" / "notes.txt").write_text("mine")
    assert main(["demo", "--assembler"]) == 2
    assert "give the demo a folder of its own with -o DIR" in capsys.readouterr().err
    assert main(["demo", "--assembler", "--keep", str(tmp_path / "other")]) == 0
    assert (tmp_path / "other" / "conv_pool.npu").is_file()
