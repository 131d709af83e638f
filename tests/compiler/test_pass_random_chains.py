"""Random chains of convs, BatchNorms, activations, per-channel constants and residual adds:
whatever the passes fold and fuse, the float IR equals onnxruntime at every level."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from tests.compiler.pass_cases import passed, same_as_ort

C = 4
F = np.float32
STEPS = ("conv3x3", "conv1x1", "depthwise", "bn", "relu", "clip", "sigmoid", "hard_swish", "mul", "add", "residual",
         "pad_conv")


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.tensors = ["x"]
        self.padded: set[str] = set()  # Pad outputs are 8x8, not residual partners of 6x6 tensors

    def const(self, shape, low=-1.0, high=1.0) -> str:
        name = f"k{len(self.inits)}"
        self.inits[name] = self.rng.uniform(low, high, shape).astype(F)
        return name

    def emit(self, op: str, inputs: list[str], **attrs) -> None:
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"n{len(self.nodes)}", **attrs))
        self.tensors.append(out)

    def step(self, kind: str) -> None:
        x = self.tensors[-1]
        if kind in ("conv3x3", "conv1x1", "depthwise"):
            k, group = (1, 1) if kind == "conv1x1" else (3, C if kind == "depthwise" else 1)
            inputs = [x, self.const([C, C // group, k, k], -0.6, 0.6)] + ([self.const([C])] if self.rng.random() < 0.5 else [])
            self.emit("Conv", inputs, pads=[k // 2] * 4, group=group)
        elif kind == "bn":
            self.emit("BatchNormalization", [x, self.const([C], 0.5, 1.5), self.const([C]), self.const([C]),
                                             self.const([C], 0.5, 2.0)])
        elif kind in ("relu", "sigmoid"):
            self.emit(kind.capitalize(), [x])
        elif kind == "clip":
            self.emit("Clip", [x, self.const([], -1.0, 0.0), self.const([], 0.5, 6.0)])
        elif kind == "hard_swish":
            three, six = self.const([], 3, 3), self.const([], 6, 6)
            self.emit("Add", [x, three])
            self.emit("Clip", [self.tensors[-1], self.const([], 0, 0), six])
            self.emit("Mul", [x, self.tensors[-1]])
            self.emit("Div", [self.tensors[-1], six])
        elif kind in ("mul", "add"):
            self.emit(kind.capitalize(), [x, self.const([1, C, 1, 1], 0.5, 1.5)])
        elif kind == "residual":
            partners = [name for name in self.tensors if name not in self.padded]
            self.emit("Add", [x, partners[int(self.rng.integers(0, len(partners)))]])
        else:  # pad_conv
            pads = self.const([0], 0, 0)
            self.inits[pads] = np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)
            self.emit("Pad", [x, pads])
            self.padded.add(self.tensors[-1])
            self.emit("Conv", [self.tensors[-1], self.const([C, C, 3, 3], -0.6, 0.6)])


@settings(max_examples=40)
@given(st.lists(st.sampled_from(STEPS), min_size=1, max_size=6), st.integers(0, 2**16), st.sampled_from([1, 2, 3]))
def test_random_chains_keep_their_output(onnx_case, steps, seed, level):
    builder = _Builder(seed)
    for kind in steps:
        builder.step(kind)
    model = onnx_case.model(builder.nodes, {"x": [1, C, 6, 6]}, [builder.tensors[-1]], builder.inits)
    x = np.random.default_rng(seed).uniform(-3, 3, (1, C, 6, 6)).astype(F)
    # deep chains grow values to ~100 and onnxruntime rounds each layer in float32: the absolute
    # bound scales with the output's magnitude
    expected = onnx_case.ort(model, {"x": x})[builder.tensors[-1]]
    same_as_ort(onnx_case, model, passed(model, level), {"x": x}, atol=1e-5 * max(1.0, float(np.abs(expected).max())))
