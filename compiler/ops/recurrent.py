"""LSTM, GRU and RNN (ONNX opset 7-22 semantics): canonical attributes, shapes, float numpy.

The canonical form keeps every ONNX attribute with its default written out, the activation
list expanded to one entry per function per direction (upper-case ONNX names), and
``input_slots``: the ONNX input position of each tensor input kept (absent optional inputs,
written "" in ONNX, are dropped, so the slots say which is which). The runtime's host step
(emulator/cpu_ops_recurrent.py) reads the same attributes.

Gate order of W/R/B is ONNX's: LSTM i, o, f, c (peepholes P: i, o, f); GRU z, r, h; RNN one.
``clip`` bounds the gates' activation inputs (not LSTM's h(C), as onnxruntime); ``sequence_lens`` ends a batch row's sequence early:
its outputs past the end are 0 and its final state is the last step's (for the reverse
direction the walk starts at its last valid step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from npuemu.isa.errors import CompileError

from .base import Canonical, NodeView, TensorInfo, Unsupported, as_float, register

#: op -> (gates per direction, default activations of one direction, its ONNX input names)
KINDS = {
    "LSTM": (4, ("SIGMOID", "TANH", "TANH"), ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")),
    "GRU": (3, ("SIGMOID", "TANH"), ("X", "W", "R", "B", "sequence_lens", "initial_h")),
    "RNN": (1, ("TANH",), ("X", "W", "R", "B", "sequence_lens", "initial_h")),
}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
#: activation -> (default alpha, default beta); None: the function takes no such parameter
ACTIVATION_PARAMS = {
    "RELU": (None, None), "TANH": (None, None), "SIGMOID": (None, None), "SOFTSIGN": (None, None),
    "SOFTPLUS": (None, None), "AFFINE": (1.0, 0.0), "LEAKYRELU": (0.01, None), "THRESHOLDEDRELU": (1.0, None),
    "SCALEDTANH": (1.0, 1.0), "HARDSIGMOID": (0.2, 0.5), "ELU": (1.0, None),
}


def _activations(view: NodeView, defaults: tuple[str, ...], directions: int) -> tuple[list, list, list]:
    """One (name, alpha, beta) per function per direction; the given alphas/betas are taken
    in order by the functions that have such a parameter (as onnxruntime reads them)."""
    names = [str(name).upper() for name in (view.attr("activations") or list(defaults) * directions)]
    if len(names) != len(defaults) * directions:
        raise CompileError(f"{view.op_type} needs {len(defaults) * directions} activations "
                           f"({len(defaults)} per direction), got {len(names)}")
    alphas, betas = list(view.attr("activation_alpha") or []), list(view.attr("activation_beta") or [])
    out_alpha, out_beta = [], []
    for name in names:
        if name not in ACTIVATION_PARAMS:
            raise Unsupported(f"activation {name} (supported: {', '.join(sorted(ACTIVATION_PARAMS))})")
        alpha, beta = ACTIVATION_PARAMS[name]
        out_alpha.append(float(alphas.pop(0)) if alpha is not None and alphas else alpha)
        out_beta.append(float(betas.pop(0)) if beta is not None and betas else beta)
    return names, out_alpha, out_beta


def _canonical(view: NodeView) -> Canonical:
    gates, defaults, _ = KINDS[view.op_type]
    direction = str(view.attr("direction", "forward"))
    if direction not in DIRECTIONS:
        raise CompileError(f"direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    names, alphas, betas = _activations(view, defaults, DIRECTIONS[direction])
    clip = view.attr("clip")
    slots = [slot for slot, name in enumerate(view.input_names) if name]
    attrs: dict[str, Any] = {
        "hidden_size": int(view.attr("hidden_size", 0)) or int(view.info(2).shape[-1]),
        "direction": direction, "layout": int(view.attr("layout", 0)), "activations": names,
        "activation_alpha": alphas, "activation_beta": betas, "clip": None if clip is None else float(clip),
        "input_slots": slots}
    if view.op_type == "LSTM":
        attrs["input_forget"] = int(view.attr("input_forget", 0))
    if view.op_type == "GRU":
        attrs["linear_before_reset"] = int(view.attr("linear_before_reset", 0))
    if attrs["layout"] not in (0, 1):
        raise CompileError(f"layout {attrs['layout']} is not 0 or 1")
    return Canonical(attrs, [name for name in view.input_names if name])


def _infer(op_type: str):
    def infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
        x = inputs[0]
        if len(x.shape) != 3:
            raise CompileError(f"{op_type} input X must have rank 3, got {list(x.shape)}")
        seq, batch = (x.shape[1], x.shape[0]) if attrs["layout"] else (x.shape[0], x.shape[1])
        hidden, dirs = attrs["hidden_size"], DIRECTIONS[attrs["direction"]]
        gates = KINDS[op_type][0]
        w = inputs[1].shape
        if w != (dirs, gates * hidden, x.shape[2]):
            raise CompileError(f"{op_type} W has shape {list(w)}, expected {[dirs, gates * hidden, x.shape[2]]}")
        y = (batch, seq, dirs, hidden) if attrs["layout"] else (seq, dirs, batch, hidden)
        state = (batch, dirs, hidden) if attrs["layout"] else (dirs, batch, hidden)
        count = 3 if op_type == "LSTM" else 2
        return [TensorInfo.of(y, x.dtype)] + [TensorInfo.of(state, x.dtype)] * (count - 1)
    return infer


def _activation(name: str, alpha: float | None, beta: float | None, v: np.ndarray) -> np.ndarray:
    if name == "SIGMOID":
        return 0.5 * (1.0 + np.tanh(0.5 * v))  # no overflow warning for large negative v
    if name == "TANH":
        return np.tanh(v)
    if name == "RELU":
        return np.maximum(v, 0.0)
    if name == "AFFINE":
        return alpha * v + beta
    if name == "LEAKYRELU":
        return np.where(v >= 0, v, alpha * v)
    if name == "THRESHOLDEDRELU":
        return np.where(v > alpha, v, 0.0)
    if name == "SCALEDTANH":
        return alpha * np.tanh(beta * v)
    if name == "HARDSIGMOID":
        return np.clip(alpha * v + beta, 0.0, 1.0)
    if name == "ELU":
        return np.where(v >= 0, v, alpha * (np.exp(np.minimum(v, 0.0)) - 1.0))
    if name == "SOFTSIGN":
        return v / (1.0 + np.abs(v))
    return np.logaddexp(0.0, v)  # SOFTPLUS


class _Cell:
    """One direction's weights and functions; ``step`` maps (x_t, state) to the new state."""

    def __init__(self, op_type: str, attrs: dict[str, Any], arrays: dict[str, np.ndarray], d: int):
        count = len(KINDS[op_type][1])
        self.op_type, self.attrs, self.hidden = op_type, attrs, attrs["hidden_size"]
        self.w, self.r = as_float(arrays["W"][d]), as_float(arrays["R"][d])
        gates = KINDS[op_type][0] * self.hidden
        bias = as_float(arrays["B"][d]) if "B" in arrays else np.zeros(2 * gates)
        self.wb, self.rb = bias[:gates], bias[gates:]
        self.p = as_float(arrays["P"][d]) if "P" in arrays else np.zeros(3 * self.hidden)
        names = attrs["activations"][d * count:(d + 1) * count]
        alphas = attrs["activation_alpha"][d * count:(d + 1) * count]
        betas = attrs["activation_beta"][d * count:(d + 1) * count]
        # clip bounds the gates' inputs, not LSTM's output function h(C) (as onnxruntime does)
        clipped = [self.op_type != "LSTM" or k < 2 for k in range(count)]
        self.f = [lambda v, n=n, a=a, b=b, k=k: _activation(n, a, b, self._clip(v) if k else v)
                  for n, a, b, k in zip(names, alphas, betas, clipped)]

    def _clip(self, v: np.ndarray) -> np.ndarray:
        clip = self.attrs["clip"]
        return v if clip is None else np.clip(v, -clip, clip)

    def step(self, x: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.hidden
        xw = x @ self.w.T + self.wb
        if self.op_type == "RNN":
            return self.f[0](xw + h @ self.r.T + self.rb), c
        if self.op_type == "GRU":
            hr = h @ self.r.T
            z = self.f[0](xw[:, :n] + hr[:, :n] + self.rb[:n])
            r = self.f[0](xw[:, n:2 * n] + hr[:, n:2 * n] + self.rb[n:2 * n])
            if self.attrs["linear_before_reset"]:
                candidate = xw[:, 2 * n:] + r * (hr[:, 2 * n:] + self.rb[2 * n:])
            else:
                candidate = xw[:, 2 * n:] + (r * h) @ self.r[2 * n:].T + self.rb[2 * n:]
            return (1.0 - z) * self.f[1](candidate) + z * h, c
        gates = xw + h @ self.r.T + self.rb
        i = self.f[0](gates[:, :n] + self.p[:n] * c)
        f = 1.0 - i if self.attrs["input_forget"] else self.f[0](gates[:, 2 * n:3 * n] + self.p[2 * n:] * c)
        c = f * c + i * self.f[1](gates[:, 3 * n:])
        o = self.f[0](gates[:, n:2 * n] + self.p[n:2 * n] * c)
        return o * self.f[2](c), c


def _direction(cell: _Cell, x: np.ndarray, h: np.ndarray, c: np.ndarray, lengths: np.ndarray,
               reverse: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y [seq, batch, hidden] and the final h, c of one direction over X [seq, batch, input]."""
    seq = x.shape[0]
    y = np.zeros((seq, x.shape[1], cell.hidden))
    for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
        live = (t < lengths)[:, None]  # rows whose sequence has ended keep their state
        new_h, new_c = cell.step(x[t], h, c)
        h, c = np.where(live, new_h, h), np.where(live, new_c, c)
        y[t] = np.where(live, h, 0.0)
    return y, h, c


def run_recurrent(op_type: str, attrs: dict[str, Any], x: list[np.ndarray]) -> list[np.ndarray]:
    arrays = dict(zip((KINDS[op_type][2][slot] for slot in attrs["input_slots"]), x))
    layout, hidden = attrs["layout"], attrs["hidden_size"]
    data = as_float(arrays["X"])
    data = data.transpose(1, 0, 2) if layout else data  # -> [seq, batch, input]
    seq, batch = data.shape[:2]
    dirs = DIRECTIONS[attrs["direction"]]
    lengths = np.asarray(arrays["sequence_lens"]).astype(np.int64) if "sequence_lens" in arrays \
        else np.full(batch, seq, np.int64)
    states = {}
    for key in ("initial_h", "initial_c"):
        value = as_float(arrays[key]) if key in arrays else np.zeros((dirs, batch, hidden))
        states[key] = value.transpose(1, 0, 2) if layout and key in arrays else value  # -> [dirs, batch, hidden]
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = attrs["direction"] == "reverse" or d == 1
        cell = _Cell(op_type, attrs, arrays, d)
        y, h, c = _direction(cell, data, states["initial_h"][d], states["initial_c"][d], lengths, reverse)
        ys.append(y), hs.append(h), cs.append(c)
    y, h, c = np.stack(ys, 1), np.stack(hs), np.stack(cs)  # [seq, dirs, batch, hidden], [dirs, batch, hidden]
    if layout:
        y, h, c = y.transpose(2, 0, 1, 3), h.transpose(1, 0, 2), c.transpose(1, 0, 2)
    dtype = arrays["X"].dtype
    outputs = [y.astype(dtype), h.astype(dtype)]
    return outputs + [c.astype(dtype)] if op_type == "LSTM" else outputs


def _register(op_type: str) -> None:
    register(op_type, infer=_infer(op_type), canonicalize=_canonical)(
        lambda attrs, x: run_recurrent(op_type, attrs, x))


for _op in KINDS:
    _register(_op)
