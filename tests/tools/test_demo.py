from npuemu.isa.container import ModelFile
from npuemu.tools.cli import main


def test_demo_writes_a_model_file_that_reads_back(tmp_path, capsys):
    assert main(["demo", "--assembler", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "chain on core 0: 2 tasks" in out
    assert "CNA      CONV_CON1" in out and "OP_EN = 0x00000060" in out
    model = ModelFile.read(tmp_path / "conv_pool.npu")
    step = model.schedule()[0]
    assert step.core == 0 and step.chain.tasks == 2


def test_disasm_of_a_model_file_reassembles_to_its_regcmd_section(tmp_path, capsys):
    assert main(["demo", "--assembler", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    text_path = tmp_path / "model.s"
    assert main(["disasm", str(tmp_path / "conv_pool.npu"), "-o", str(text_path)]) == 0
    assert main(["asm", str(text_path), "-o", str(tmp_path / "out.bin")]) == 0
    model = ModelFile.read(tmp_path / "conv_pool.npu")
    assert (tmp_path / "out.bin").read_bytes() == model.section("regcmd").data


def test_disasm_of_a_corrupt_model_file_is_a_clear_error(tmp_path, capsys):
    assert main(["demo", "--assembler", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    path = tmp_path / "conv_pool.npu"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert main(["disasm", str(path)]) == 2
    assert "conv_pool.npu" in capsys.readouterr().err


def test_demo_compiles_and_runs_the_bundled_network(tmp_path, capsys):
    import numpy as np

    assert main(["demo", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "$ npuemu compile" in out and "$ npuemu run" in out
    cosine = float(out.split("cosine ")[1].split(",")[0])
    assert cosine >= 0.99
    assert np.load(tmp_path / "out" / "logits.npy").shape == (1, 10)
    model = ModelFile.read(tmp_path / "demo_cnn.npu")
    assert [step.kind for step in model.schedule()] == ["npu"]


def test_run_npu_checks_its_inputs(tmp_path, capsys):
    import numpy as np

    assert main(["demo", "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    npu = str(tmp_path / "demo_cnn.npu")
    assert main(["run", npu]) == 2
    assert "0 --input file(s) given; the model takes 1: image" in capsys.readouterr().err
    np.save(tmp_path / "wrong.npy", np.zeros((1, 3, 8, 8), np.float32))
    assert main(["run", npu, "--input", str(tmp_path / "wrong.npy")]) == 2
    err = capsys.readouterr().err
    assert "image" in err and "Traceback" not in err
    assert main(["run", npu, "--input", str(tmp_path / "image.npy"), "--raw",
                 "-o", str(tmp_path / "raw")]) == 0
    assert np.load(tmp_path / "raw" / "logits.npy").dtype == np.int8
