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
