"""npuemu's own int8 rk3576 builds with the vendor's image input run (compiler/LOWERING.md 52, emulator/
REGISTER_SEMANTICS.md 51): the runtime stores the input as 3-byte pixels u = q + 128 (q the int8 value its
quantization gives) in rows of 16-pixel multiples, the translation turns the vendor image conv into RK3588's image
conv with the CNA converter on (u - 128 = q) and RK3588's cube written into the room the weight constant leaves.

The converter gives back q exactly, so an image build's outputs must equal, bit for bit, those of the same build at
RK3588 positions (packed int8 input, converter off; ``VENDOR_LAYOUT_OF`` emptied) and of the build with the input
stored unpacked (``pack_inputs=False``: NC1HWC2, what rk3576 builds held before).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.compiler.lower import emit_rk3576
from npuemu.emulator.runtime import Runtime
from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap_loader import load_regmap
from tests.compiler.test_rk3576_vendor_emit import conv_model

SHAPES = {   # cout, kernel, stride, pads, (H, W)
    "3x3s2": (24, (3, 3), (2, 2), (1, 1, 1, 1), (20, 32)),
    "3x3s1": (8, (3, 3), (1, 1), (1, 1, 1, 1), (12, 16)),
    "1x1": (40, (1, 1), (1, 1), (0, 0, 0, 0), (8, 48)),
    "5x3": (70, (5, 3), (2, 1), (2, 1, 2, 1), (16, 32)),
    "7x7s2": (16, (7, 7), (2, 2), (3, 3, 3, 3), (32, 64)),
}


def _samples(size, count=3, seed=3):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(1, 3, *size)).astype(np.float32)} for _ in range(count)]


def _builds(model, samples, **options):
    """(the image build, the packed build at RK3588 positions, the unpacked build)."""
    image = build(prepare(model, "rk3576", CompileOptions(dataset=samples, **options)))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(emit_rk3576, "VENDOR_LAYOUT_OF", {})
        packed = build(prepare(model, "rk3576", CompileOptions(dataset=samples, **options)))
    unpacked = build(prepare(model, "rk3576", CompileOptions(dataset=samples, pack_inputs=False, **options)))
    return image, packed, unpacked


def _run(model_file, x):
    runtime = Runtime(model_file)
    runtime.set_input("x", x)
    runtime.run()
    return runtime.output("y", dequantize=False)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_image_build_runs_like_the_packed_and_the_unpacked_builds(shape):
    cout, kernel, stride, pads, size = SHAPES[shape]
    model = conv_model(3, cout, size, kernel, stride, pads, relu=True)
    samples = _samples(size)
    image, packed, unpacked = _builds(model, samples)
    platform = image.trailer["platform"]
    assert "image_inputs" in platform and platform["register_layout"] == "rk3576_vendor"
    assert "register_layout" not in packed.trailer["platform"] and unpacked.tensor("x").c2 == 16
    for sample in [*samples, *_samples(size, 2, seed=11)]:
        want = _run(packed, sample["x"])
        np.testing.assert_array_equal(_run(image, sample["x"]), want)
        np.testing.assert_array_equal(_run(unpacked, sample["x"]), want)
    stored = np.random.default_rng(1).integers(-128, 128, (1, 3, *size)).astype(np.int8)   # int8: stored values
    np.testing.assert_array_equal(_run(image, stored), _run(packed, stored))


def test_the_runtime_stores_the_pixels_the_converter_reads():
    """The input's bytes: per pixel its 3 channels, u = clamp(rint(x / s) + z) + 128, row after row (a width that is a
    multiple of 16: no row padding), written independently of the runtime's layout code."""
    size = (6, 16)
    image = build(prepare(conv_model(3, 8, size, (3, 3), (1, 1), (1, 1, 1, 1)), "rk3576",
                          CompileOptions(dataset=_samples(size))))
    x = _samples(size, 1, seed=9)[0]["x"]
    runtime = Runtime(image)
    runtime.set_input("x", x)
    info = runtime.tensor_info("x")
    scale, zero = info["quantization"]["scale"], info["quantization"]["zero_point"]
    q = np.clip(np.rint(x[0].astype(np.float64) / scale) + zero, -128, 127).astype(np.int64)
    expected = bytes(int(q[c, y, w]) + 128 for y in range(size[0]) for w in range(size[1]) for c in range(3))
    assert bytes(runtime.machine.memory.dump(int(info["address"]), len(expected))) == expected
    np.testing.assert_array_equal(runtime.read_native("x")[0], q)   # read back as the int8 values


def test_multicore_and_batched_image_builds_run_like_the_single_build():
    cout, kernel, stride, pads, size = SHAPES["3x3s2"]
    model = conv_model(3, cout, size, kernel, stride, pads, relu=True)
    samples = _samples(size)
    single = build(prepare(model, "rk3576", CompileOptions(dataset=samples)))
    cores = build(prepare(model, "rk3576", CompileOptions(dataset=samples, core_mask="0_1")))
    batched = build(prepare(model, "rk3576", CompileOptions(dataset=samples, batch_size=2)))
    assert "image_inputs" in cores.trailer["platform"] and "image_inputs" in batched.trailer["platform"]
    x = np.concatenate([sample["x"] for sample in _samples(size, 2, seed=5)])
    runtime = Runtime(batched)
    runtime.set_input("x", x)
    runtime.run()
    both = runtime.output("y", dequantize=False)
    for index in range(2):
        want = _run(single, x[index:index + 1])
        np.testing.assert_array_equal(_run(cores, x[index:index + 1]), want)
        np.testing.assert_array_equal(both[index:index + 1], want)


def _small_image_build():
    size = (6, 16)
    return build(prepare(conv_model(3, 8, size, (3, 3), (1, 1), (1, 1, 1, 1)), "rk3576",
                         CompileOptions(dataset=_samples(size, 2))))


def test_an_image_task_without_its_cbuf_word_is_refused_by_name():
    """A damaged file: the image conv's CNA CBUF_CON1 write replaced by a repeat of the word before it. The
    translation names the missing register (it read it unchecked before: a KeyError)."""
    image = _small_image_build()
    cna = load_regmap("rk3576_vendor").block("CNA")
    index = next(i for i, section in enumerate(image.sections) if section.name == "regcmd")
    words = np.frombuffer(bytes(image.sections[index].data), "<u8").copy()
    at = next(i for i, w in enumerate(words) if int(w) >> 48 == cna.target
              and int(w) & 0xFFFF == cna.register("CBUF_CON1").offset)
    words[at] = words[at - 1]
    sections = list(image.sections)
    sections[index] = dataclasses.replace(sections[index], data=words.tobytes())
    with pytest.raises(UnsupportedProgramError, match="writes CNA.CBUF_CON1"):
        Runtime(dataclasses.replace(image, sections=tuple(sections)))


def test_inspect_refuses_an_image_inputs_record_that_is_not_an_object(tmp_path, capsys):
    from npuemu.tools.cli import main
    image = _small_image_build()
    trailer = copy.deepcopy(image.trailer)
    trailer["platform"]["image_inputs"] = [1]
    path = tmp_path / "damaged.npu"
    dataclasses.replace(image, trailer=trailer).write(path)
    assert main(["inspect", str(path)]) == 2
    assert "trailer.platform.image_inputs is not an object" in capsys.readouterr().err
