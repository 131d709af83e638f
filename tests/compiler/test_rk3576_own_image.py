"""npuemu's own int8 rk3576 builds write a 3-channel image input in the vendor's image form (compiler/LOWERING.md 52,
emulator/REGISTER_SEMANTICS.md 51; isa/rknn/rk3576_image.py, lower/emit_rk3576.py).

References: the vendor itself - ``tests/data/rk3576_vendor/own_image_tasks.npz.xz`` holds the image conv task
rknn-toolkit2 2.5.0 built for rk3576 (default config: no mean / std; ``build(do_quantization=True)`` on 3 images
``RandomState(0).randint(0, 256, (1, 3, H, W))`` float32, the input quantized with scale 1, zero point -128):
``c3``: :func:`c3_model` (``conv_model(3, 24, (20, 32), (3, 3), (2, 2), (1, 1, 1, 1), relu=True)``, its record 0);
``cls0``: :func:`cls0_model` (ppocr_cls's first conv: 3 -> 8 3x3 s2 p1 + HardSwish on [1, 3, 48, 192], record 1
of its chain 0, after the LUT upload). npuemu's build of the same ONNX on the same images writes the same words
but for the relocated addresses (0 in the .rknn), the requantization (its own calibration) and the task's
S_POINTER (the vendor's program variants).
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler.driver import CompileOptions, build, prepare
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_image import image_row_entries, own_converter, rows_cube, vendor_weights
from tests.compiler.test_rk3576_vendor_emit import DIFFERENT_BY_RIGHT, conv_model

DATA = Path(__file__).resolve().parents[1] / "data" / "rk3576_vendor"
VENDOR = load_regmap("rk3576_vendor")
with lzma.open(DATA / "own_image_tasks.npz.xz") as _f:
    _archive = np.load(io.BytesIO(_f.read()))
    VENDOR_TASKS = {name: _archive[name] for name in _archive.files}


def c3_model() -> onnx.ModelProto:
    return conv_model(3, 24, (20, 32), (3, 3), (2, 2), (1, 1, 1, 1), relu=True)


def cls0_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = (rng.normal(size=(8, 3, 3, 3)) * 0.3).astype(np.float32)
    bias = rng.normal(0, 0.1, 8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 48, 192])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


CASES = {"c3": (c3_model, (20, 32)), "cls0": (cls0_model, (48, 192))}


def pixel_samples(size, count=3, seed=0) -> list[dict[str, np.ndarray]]:
    rng = np.random.RandomState(seed)
    return [{"x": rng.randint(0, 256, (1, 3, *size)).astype(np.float32)} for _ in range(count)]


def _named(words) -> list[tuple[str, str, int]]:
    out = []
    for word in (int(w) for w in words):
        block = VENDOR.block_for_target(word >> 48)
        if block is not None:
            out.append((block.name, block.register_at(word & 0xFFFF).name, (word >> 16) & 0xFFFFFFFF))
    return out


def _own_image_task(built) -> list[tuple[str, str, int]]:
    """The named vendor writes of the build's first conv task (its image conv)."""
    section = next(s for s in built.sections if s.name == "regcmd")
    named = _named(np.frombuffer(bytes(section.data), "<u8"))
    start = next(i for i, (block, name, value) in enumerate(named) if (block, name) == ("CNA", "CONV_CON1")
                 and VENDOR.register("CNA", "CONV_CON1").field("ARGB_IN").extract(value))
    return named[start:]


#: the words an own build holds by right where the vendor's stored task differs: relocated addresses,
#: the requantization, and the ping-pong pointer of the vendor's program variants
BY_RIGHT = DIFFERENT_BY_RIGHT | {"S_POINTER"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_own_image_conv_is_the_vendors_task_word_for_word(case):
    """From CONV_CON1 on: the CNA and CORE words (cls0: its DPU is the LUT conv's, LOWERING.md 46; c3 all)."""
    make, size = CASES[case]
    built = build(prepare(make(), "rk3576", CompileOptions(dataset=pixel_samples(size))))
    assert built.trailer["platform"]["register_layout"] == "rk3576_vendor"
    assert built.trailer["platform"]["image_inputs"] == {"x": {"pixel_bytes": 3, "row_pixels": size[1],
                                                                "value_bias": 128}}
    vendor = _named(VENDOR_TASKS[case])
    start = next(i for i, (block, name, _) in enumerate(vendor) if (block, name) == ("CNA", "CONV_CON1"))
    vendor = vendor[start:]
    ours = _own_image_task(built)[:len(vendor)]
    blocks = ("CNA", "CORE") if case == "cls0" else ("CNA", "CORE", "DPU", "DPU_RDMA")
    compared = [(v, o) for v, o in zip(vendor, ours) if v[0] in blocks and v[1] not in BY_RIGHT]
    assert len(compared) > 40
    assert [(b, n, hex(x)) for (b, n, x), _ in compared] == [(b, n, hex(x)) for _, (b, n, x) in compared]


def test_the_converter_restores_the_stored_int8_value():
    """Every group but the 4th maps the stored byte u = q + 128 back to q: SCALE / 2^TRUNCATE = 1, offset -128,
    the unit scale written as the vendor writes it (c3's input has scale 1, zero point -128: these words)."""
    scales, truncates, offsets = own_converter()
    for scale, truncate, offset in zip(scales[:3], truncates[:3], offsets[:3]):
        u = np.arange(256)
        assert np.array_equal(u * scale // (1 << truncate) + offset, u - 128)
    assert (scales[3], truncates[3], offsets[3]) == (1, 0, 0)


def _rows_reference(weights: np.ndarray) -> bytes:
    """CONV_MODE 6's cube written out plainly: per 32-kernel block of the kernels padded to 16, for each kernel row
    ky, for each kernel, kx by kx the 3 channel bytes and a 0, the row padded to 16 bytes; then as many zeros."""
    kernels, _, height, width = weights.shape
    stored = -(-kernels // 16) * 16
    out = bytearray()
    for start in range(0, stored, 32):
        for ky in range(height):
            for k in range(start, min(start + 32, stored)):
                row = bytearray()
                for kx in range(width):
                    for c in range(4):
                        row.append(int(weights[k, c, ky, kx]) & 0xFF if k < kernels and c < 3 else 0)
                out += row + bytes(-len(row) % 16)
    return bytes(out) + bytes(len(out))


@settings(max_examples=40, deadline=None)
@given(kernels=st.integers(1, 70), height=st.integers(1, 7), width=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_rows_cube_is_the_vendors_layout(kernels, height, width, seed):
    weights = np.random.default_rng(seed).integers(-128, 128, (kernels, 3, height, width)).astype(np.int8)
    cube = rows_cube(weights)
    assert cube == _rows_reference(weights)
    stored = -(-kernels // 16) * 16
    back = vendor_weights(cube[:len(cube) // 2], stored, height, width, 6)   # the emulator's reader of vendor files
    assert np.array_equal(back[:kernels], weights) and not back[kernels:].any()


def test_row_entries_fit_every_vendor_build():
    """CBUF_DATA.ROW_ENTRIES of the six image builds (REGISTER_SEMANTICS.md 47.1, 51): (width, kw) -> entries."""
    seen = {(16, 1): 1, (32, 3): 3, (192, 3): 13, (24, 3): 2, (20, 3): 2, (200, 3): 13}
    assert {key: image_row_entries(*key) for key in seen} == seen


@pytest.mark.parametrize("cin, size", [(3, (8, 24)), (1, (8, 16)), (4, (8, 16))])
def test_other_image_inputs_are_stored_unpacked_as_before(cin, size):
    """A width that is not a multiple of 16 (the vendor pads rows to 16 pixels, npuemu's packed rows are not), and
    1- or 4-channel images (no vendor form decoded): the build is redone with the input unpacked (LOWERING.md 45)."""
    model = conv_model(cin, 16, size, (3, 3), (1, 1), (1, 1, 1, 1), relu=True)
    built = build(prepare(model, "rk3576", CompileOptions(dataset=pixel_samples(size, 2)[:2] if cin == 3 else
                                                          [{"x": np.ones((1, cin, *size), np.float32)}])))
    assert built.trailer["platform"]["register_layout"] == "rk3576_vendor"
    assert "image_inputs" not in built.trailer["platform"]
    assert built.tensor("x").c2 == 16
