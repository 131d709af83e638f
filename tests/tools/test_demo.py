from npuemu.isa.container import ModelFile
from npuemu.tools.cli import main


def test_demo_writes_a_model_file_that_reads_back(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "chain on core 0: 2 tasks" in out
    assert "CNA      CONV_CON1" in out and "OP_EN = 0x00000060" in out
    model = ModelFile.read(tmp_path / "conv_pool.npu")
    step = model.schedule()[0]
    assert step.core == 0 and step.chain.tasks == 2


def test_disasm_of_a_model_file_reassembles_to_its_regcmd_section(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    text_path = tmp_path / "model.s"
    assert main(["disasm", str(tmp_path / "conv_pool.npu"), "-o", str(text_path)]) == 0
    assert main(["asm", str(text_path), "-o", str(tmp_path / "out.bin")]) == 0
    model = ModelFile.read(tmp_path / "conv_pool.npu")
    assert (tmp_path / "out.bin").read_bytes() == model.section("regcmd").data


def test_disasm_of_a_corrupt_model_file_is_a_clear_error(tmp_path, capsys):
    assert main(["demo", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    path = tmp_path / "conv_pool.npu"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["disasm", str(path)]) == 2
    assert "conv_pool.npu" in capsys.readouterr().err
