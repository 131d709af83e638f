"""A model file's ``platform.image_inputs`` record (compiler/LOWERING.md 52) is checked when the runtime loads
it: a damaged or hostile record is a ModelFileError naming the key, never an allocation or a write past the
bytes the input tensor reserves."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import ModelFileError
from tests.compiler.test_rk3576_vendor_emit import conv_model


@pytest.fixture(scope="module")
def image_build():
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(size=(1, 3, 12, 16)).astype(np.float32)} for _ in range(2)]
    model = conv_model(3, 8, (12, 16), (3, 3), (1, 1), (1, 1, 1, 1), relu=True)
    built = build(prepare(model, "rk3576", CompileOptions(dataset=samples)))
    assert built.trailer["platform"]["image_inputs"]["x"] == {"pixel_bytes": 3, "row_pixels": 16, "value_bias": 128}
    return built


def _with(built, change):
    trailer = copy.deepcopy(built.trailer)
    change(trailer["platform"])
    return dataclasses.replace(built, trailer=trailer)


def test_the_recorded_form_loads(image_build):
    Runtime(image_build)


@pytest.mark.parametrize("change, says", [
    (lambda p: p.update(image_inputs=[1]), "image_inputs is not an object"),
    (lambda p: p["image_inputs"].update(nothere=p["image_inputs"]["x"]), "no such tensor"),
    (lambda p: p["image_inputs"].update(x=7), "not an object"),
    (lambda p: p["image_inputs"]["x"].update(row_pixels=2 ** 40), "row_pixels"),
    (lambda p: p["image_inputs"]["x"].update(row_pixels=15), "row_pixels"),
    (lambda p: p["image_inputs"]["x"].update(row_pixels="16"), "row_pixels: expected an integer"),
    (lambda p: p["image_inputs"]["x"].pop("value_bias"), "value_bias: expected an integer"),
    (lambda p: p["image_inputs"]["x"].update(value_bias=-1), "value_bias"),
    (lambda p: p["image_inputs"]["x"].update(pixel_bytes=4), "pixel_bytes"),
])
def test_a_damaged_record_is_refused_by_key(image_build, change, says):
    with pytest.raises(ModelFileError, match="trailer.platform.image_inputs") as error:
        Runtime(_with(image_build, change))
    assert says in str(error.value)


def test_a_batch_slice_is_checked_against_its_own_bytes():
    """A batched build's slices (compiler/batch.py) take the rows at their own addresses: a row length the
    whole [N, ...] tensor's bytes would hold but one slice's would not is refused, naming the slice."""
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(size=(1, 3, 12, 16)).astype(np.float32)} for _ in range(2)]
    model = conv_model(3, 8, (12, 16), (3, 3), (1, 1), (1, 1, 1, 1), relu=True)
    built = build(prepare(model, "rk3576", CompileOptions(dataset=samples, batch_size=2)))
    Runtime(built)
    sizes = {tensor["name"]: tensor["size"] for tensor in built.trailer["tensors"]}
    rows = [r for r in range(16, 32) if sizes["x#b0"] < 12 * r * 3 <= sizes["x"]]
    assert rows  # (a length the whole tensor's check lets through)
    with pytest.raises(ModelFileError, match=r"image_inputs\['x'\]\.row_pixels: .* of batch slice 'x#b0'"):
        Runtime(_with(built, lambda p: p["image_inputs"]["x"].update(row_pixels=rows[0])))


def test_inspect_names_the_image_input(image_build, tmp_path, capsys):
    from npuemu.tools.cli import main
    path = tmp_path / "image.npu"
    image_build.write(path)
    assert main(["inspect", str(path)]) == 0
    assert "image input: x as 3-byte pixels, rows of 16, value + 128" in capsys.readouterr().out
