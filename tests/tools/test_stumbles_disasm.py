"""`npuemu disasm model.npu` names the graph layer of each task (issue 21 item 2), from the
trailer's graph.layers[].tasks ranges; the names are comments, so `asm` gives the same bytes."""

from __future__ import annotations

import re

from npuemu.isa.container import ModelFile
from npuemu.tools.cli import main
from tests.compiler.test_build_e2e import compile_graph, small_cnn


def test_task_headers_name_their_layer_and_reassemble(tmp_path, capsys) -> None:
    from npuemu.compiler.build import build_model

    model, shape = small_cnn()
    build_model(compile_graph(model, shape)).write(tmp_path / "net.npu")
    built = ModelFile.read(tmp_path / "net.npu")
    assert main(["disasm", str(tmp_path / "net.npu"), "-o", str(tmp_path / "net.s")]) == 0
    headers = [line for line in (tmp_path / "net.s").read_text().splitlines() if line.startswith(".task ")]
    want = []
    for layer in built.trailer["graph"]["layers"]:
        for claim in layer.get("tasks", ()):
            want += [f"layer {layer['name']} ({layer['op_type']})"] * claim["count"]
    assert len(headers) == len(want) > 1
    for header, name in zip(headers, want):
        assert header.endswith("; " + name), header
    assert main(["asm", str(tmp_path / "net.s"), "-o", str(tmp_path / "net.bin")]) == 0
    assert (tmp_path / "net.bin").read_bytes() == built.section("regcmd").data


def test_hand_written_chain_without_layers_keeps_plain_headers(tmp_path, capsys) -> None:
    assert main(["demo", "--assembler", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["disasm", str(tmp_path / "conv_pool.npu")]) == 0
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith(".task ")]
    assert headers and not any(re.search(r"; layer ", line) for line in headers)
