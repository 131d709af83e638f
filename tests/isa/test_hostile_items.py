"""Each finding of issue 23, fed as the hostile user did: a one-line error naming the offset,
key, layer or limit - or, for the data-loss items, the input left untouched."""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))

import hostile_gen  # noqa: E402

from npuemu.isa.container import ModelFile  # noqa: E402
from npuemu.tools.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def model() -> ModelFile:
    return hostile_gen.base_model()


@pytest.fixture()
def folder(tmp_path) -> Path:
    np.save(tmp_path / "x.npy", np.random.RandomState(1).rand(1, 3, 8, 8).astype(np.float32))
    return tmp_path


def edited(model: ModelFile, folder: Path, edit, name: str = "m.npu") -> Path:
    """The model with ``edit(trailer)`` applied, written with valid CRCs (no schema check)."""
    trailer = copy.deepcopy(model.trailer)
    edit(trailer)
    path = folder / name
    path.write_bytes(hostile_gen.rebuild(model, trailer))
    return path


def npuemu(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused(capsys, *argv, match: str) -> str:
    code, _, err = npuemu(capsys, *argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    # one error line; asm echoes the offending source line below it, indented
    assert "Traceback" not in err and len(lines) == 1 or lines[0].startswith("npuemu asm"), err
    assert match in lines[0], err
    return err


def tensor(trailer: dict, name: str) -> dict:
    return next(t for t in trailer["tensors"] if t["name"] == name)


# --- 1-6: tracebacks and allocations from a model file -------------------------------------------


@pytest.mark.parametrize("stride", [0, 2**40, 63])
@pytest.mark.parametrize("command", ["run", "perf", "trace"])
def test_surface_stride_is_bounded(model, folder, capsys, stride, command):
    path = edited(model, folder, lambda t: tensor(t, "x").update(surface_stride=stride))
    extra = {"run": ["-i", folder / "x.npy"], "perf": [], "trace": ["-o", folder / "t.json"]}[command]
    refused(capsys, command, path, *extra, match="trailer.tensors[0].surface_stride")


def test_perf_does_not_allocate_a_huge_input_shape(model, folder, capsys):
    path = edited(model, folder, lambda t: tensor(t, "x").update(shape=[1, 3, 10**6, 10**6]))
    refused(capsys, "perf", path, match="trailer.tensors[0].shape")
    path = edited(model, folder, lambda t: tensor(t, "x").update(shape=[1, 3, 8, 8000]))
    refused(capsys, "trace", path, "-o", folder / "t.json", match="does not fit native_shape")


@pytest.mark.parametrize("text, match", [(".align 1099511627776", "at most 65536"),
                                         (".align 268435456", "at most 65536"),
                                         (".zero 1099511627776", "limit of 67108864 bytes")])
def test_asm_directives_are_bounded(folder, capsys, text, match):
    source = folder / "s.s"
    source.write_text(text + "\n")
    refused(capsys, "asm", source, "-o", folder / "s.bin", match=match)
    assert not (folder / "s.bin").exists()


def test_per_channel_quantization_on_an_nc1hwc2_tensor(model, folder, capsys):
    path = edited(model, folder, lambda t: tensor(t, "x").update(
        dtype="int8", quantization={"scale": [0.1, 0.2], "zero_point": [0, 0]}))
    refused(capsys, "run", path, "-i", folder / "x.npy", match="trailer.tensors[0].quantization: an NC1HWC2")


@pytest.mark.parametrize("batch, key", [({"size": 1, "contexts": 0}, "batch.contexts"),
                                        ({"size": 0, "contexts": 1}, "batch.size"),
                                        ({"size": 2, "contexts": 3}, "batch.contexts")])
def test_batch_contexts_and_size(model, folder, capsys, batch, key):
    path = edited(model, folder, lambda t: t.update(batch=batch))
    refused(capsys, "perf", path, match=f"trailer.{key}")


def test_run_output_dir_that_is_a_file_is_refused_before_the_run(model, folder, capsys):
    path = edited(model, folder, lambda t: None)
    (folder / "out").write_text("keep")
    err = refused(capsys, "run", path, "-i", folder / "x.npy", "-o", folder / "out", match="names a file")
    assert "--output-dir" in err and (folder / "out").read_text() == "keep"


# --- 7-8: the compiler ----------------------------------------------------------------------------


def _onnx(folder: Path, nodes, inits=()) -> Path:
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    outputs = [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                              opset_imports=[helper.make_opsetid("", 13)])
    path = folder / "m.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("weight, attrs, match", [
    ((0, 3, 3, 3), {}, "output channels included) must be >= 1"),
    ((8, 3, 3, 3), {"strides": [0, 1]}, "attribute strides [0, 1]"),
    ((8, 3, 3, 3), {"pads": [-1, 0, 0, 0]}, "attribute pads [-1, 0, 0, 0]"),
    ((8, 3, 9, 9), {}, "does not fit the input's spatial size"),
])
def test_conv_attributes_name_the_node(folder, capsys, weight, attrs, match):
    init = numpy_helper.from_array(np.ones(weight, np.float32), "w")
    path = _onnx(folder, [helper.make_node("Conv", ["x", "w"], ["y"], name="conv_a", **attrs)], [init])
    err = refused(capsys, "compile", path, "--fp16", match=match)
    assert "node 'conv_a' (Conv)" in err


@pytest.mark.parametrize("attrs, match", [({"kernel_shape": [9, 9]}, "kernel_shape [9, 9]"),
                                          ({"kernel_shape": [2, 2], "pads": [0, -1, 0, 0]}, "attribute pads"),
                                          ({"kernel_shape": [2, 2], "strides": [0, 2]}, "attribute strides")])
def test_pool_attributes_name_the_node(folder, capsys, attrs, match):
    path = _onnx(folder, [helper.make_node("MaxPool", ["x"], ["y"], name="pool_a", **attrs)])
    err = refused(capsys, "compile", path, "--fp16", match=match)
    assert "node 'pool_a' (MaxPool)" in err


def test_constant_folding_has_a_size_cap(folder, capsys):
    label, proto = next(case for case in hostile_gen.onnx_cases() if case[0].startswith("fold (32768"))
    path = folder / "fold.onnx"
    onnx.save(proto, str(path))
    err = refused(capsys, "compile", path, "--fp16", match="limit of 1073741824 bytes")
    assert "constant folding" in err and "node '" in err


# --- silent wrong results -------------------------------------------------------------------------


def test_graph_input_naming_no_tensor(model, folder, capsys):
    path = edited(model, folder, lambda t: t["graph"].update(inputs=["bogus"]))
    refused(capsys, "run", path, "-i", folder / "x.npy", match="tensor 'x' is read before anything writes it")


@pytest.mark.parametrize("tasks, match", [(2**64 - 1, "chain.tasks: 18446744073709551615 is outside 1.."),
                                          (0, "exceed the 0 tasks of step 0"),
                                          (3, "ran 2 task(s); the model file declares 3")])
def test_declared_chain_task_count(model, folder, capsys, tasks, match):
    path = edited(model, folder, lambda t: t["schedule"][0]["chain"].update(tasks=tasks))
    refused(capsys, "run", path, "-i", folder / "x.npy", match=match)


@pytest.mark.parametrize("quantization, match", [({"scale": 0.0, "zero_point": 0}, "must be a positive number"),
                                                 ({"scale": -0.5, "zero_point": 0}, "must be a positive number"),
                                                 ({"scale": 0.1, "zero_point": 1000}, "int8 range -128..127"),
                                                 ({"scale": 0.1, "zero_point": -1000}, "int8 range -128..127")])
def test_quantization_values(model, folder, capsys, quantization, match):
    path = edited(model, folder, lambda t: tensor(t, "x").update(dtype="int8", quantization=quantization))
    refused(capsys, "run", path, "-i", folder / "x.npy", match=match)


def test_run_platform_is_honoured(model, folder, capsys):
    path = edited(model, folder, lambda t: None)
    refused(capsys, "run", path, "-i", folder / "x.npy", "--platform", "rk3576", match="was compiled for rk3588")
    refused(capsys, "run", path, "-i", folder / "x.npy", "--platform", folder / "none.yaml", match="none.yaml")
    code, out, _ = npuemu(capsys, "run", path, "-i", folder / "x.npy", "--platform", "rk3588")
    assert code == 0 and "output 'y'" in out


@pytest.mark.parametrize("edit, match", [
    (lambda t: tensor(t, "x").update(size=16), "trailer.tensors[0].size: 16 bytes cannot hold"),
    (lambda t: tensor(t, "x").update(c2=16), "trailer.tensors[0].c2: 16 differs from native_shape"),
    (lambda t: tensor(t, "x").update(region="nowhere"), "'nowhere' names no memory_map region"),
    (lambda t: tensor(t, "x").update(address=0), "trailer.tensors[0].address"),
    (lambda t: t["memory_map"]["regions"][0].update(size=2**40), "regions[0].size"),
])
def test_trailer_fields_are_checked_against_each_other(model, folder, capsys, edit, match):
    refused(capsys, "run", edited(model, folder, edit), "-i", folder / "x.npy", match=match)


def test_c2_must_fill_the_chips_atom(model, folder, capsys):
    def narrow(trailer):
        x = tensor(trailer, "x")
        x.update(c2=4, native_shape=[1, 1, 8, 8, 4], size=512)
    refused(capsys, "run", edited(model, folder, narrow), "-i", folder / "x.npy", match="does not fill the rk3588 atom")


# --- data loss ------------------------------------------------------------------------------------


def test_outputs_that_are_inputs_are_refused(model, folder, capsys):
    path = edited(model, folder, lambda t: None)
    before = path.read_bytes()
    onnx_path = _onnx(folder, [helper.make_node("Relu", ["x"], ["y"])])
    onnx_before = onnx_path.read_bytes()
    source = folder / "s.s"
    source.write_text(".word 1\n")
    raw = folder / "s.bin"
    raw.write_bytes(bytes(8))
    for argv in (["compile", onnx_path, "--fp16", "-o", onnx_path], ["trace", path, "-o", path],
                 ["disasm", path, "-o", path], ["asm", source, "-o", source], ["asm", raw],
                 ["trace", path, "-i", folder / "x.npy", "-o", folder / "x.npy"]):
        refused(capsys, *argv, match="names the input file")
    assert path.read_bytes() == before and onnx_path.read_bytes() == onnx_before
    assert source.read_text() == ".word 1\n" and raw.read_bytes() == bytes(8)


def test_model_files_are_written_atomically(model, folder, monkeypatch):
    path = folder / "m.npu"
    model.write(path)
    before = path.read_bytes()
    os.chmod(path, 0o640)

    def killed(*args):
        raise KeyboardInterrupt  # the process dies between writing the new bytes and the rename

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        model.write(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and sorted(p.name for p in folder.iterdir()) == ["m.npu", "x.npy"]
    model.write(path)
    assert path.stat().st_mode & 0o777 == 0o640  # the replaced file keeps its permissions
