"""Host steps of the recurrent ops LSTM, GRU and RNN (ONNX semantics), on float64 inputs.

Params are the compiler's canonical attributes: ``hidden_size``, ``direction``, ``layout``,
``activations`` (one upper-case ONNX name per function per direction), ``activation_alpha`` /
``activation_beta`` (one per function, null where it takes none), ``clip`` (null: none; it bounds the gates' inputs, not LSTM's h(C)),
``input_slots`` (the ONNX input position of each input given; absent optional inputs are not
passed), ``input_forget`` (LSTM) and ``linear_before_reset`` (GRU). In an int8 build the
inputs arrive dequantized and the outputs are requantized by run_step, like every host step.
"""

from __future__ import annotations

import numpy as np

_SLOTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _function(name: str, alpha, beta):
    """The ONNX recurrent activation ``name`` as a function of its (clipped) input."""
    table = {
        "SIGMOID": lambda v: 1.0 / (1.0 + np.exp(-np.clip(v, -700.0, 700.0))),
        "TANH": np.tanh,
        "RELU": lambda v: np.where(v > 0, v, 0.0),
        "AFFINE": lambda v: alpha * v + beta,
        "LEAKYRELU": lambda v: np.where(v < 0, alpha * v, v),
        "THRESHOLDEDRELU": lambda v: np.where(v <= alpha, 0.0, v),
        "SCALEDTANH": lambda v: alpha * np.tanh(beta * v),
        "HARDSIGMOID": lambda v: np.minimum(1.0, np.maximum(0.0, alpha * v + beta)),
        "ELU": lambda v: np.where(v < 0, alpha * np.expm1(np.minimum(v, 0.0)), v),
        "SOFTSIGN": lambda v: v / (1.0 + np.abs(v)),
        "SOFTPLUS": lambda v: np.log1p(np.exp(-np.abs(v))) + np.maximum(v, 0.0),
    }
    return table[name]


def _functions(params: dict, direction: int, count: int) -> list:
    clip = params.get("clip")
    chosen = slice(direction * count, (direction + 1) * count)
    result = []
    for name, alpha, beta in zip(params["activations"][chosen], params["activation_alpha"][chosen],
                                 params["activation_beta"][chosen]):
        function = _function(str(name), None if alpha is None else float(alpha), None if beta is None else float(beta))
        output_function = count == 3 and len(result) == 2  # LSTM's h(C): onnxruntime does not clip it
        result.append(function if clip is None or output_function else
                      (lambda v, g=function, limit=float(clip): g(np.clip(v, -limit, limit))))
    return result


def _lstm_step(params, weights, functions, x, h, c):
    w, r, b, p = weights
    f_gate, g_cell, h_out = functions
    i_part, o_part, f_part, c_part = np.split(x @ w.T + h @ r.T + b, 4, axis=1)  # ONNX order i, o, f, c
    p_i, p_o, p_f = np.split(p, 3)
    i = f_gate(i_part + p_i * c)
    f = 1.0 - i if params.get("input_forget") else f_gate(f_part + p_f * c)
    c_next = f * c + i * g_cell(c_part)
    o = f_gate(o_part + p_o * c_next)
    return o * h_out(c_next), c_next


def _gru_step(params, weights, functions, x, h, c):
    w, r, b, _ = weights
    f_gate, g_cand = functions
    w_z, w_r, w_h = np.split(w, 3)
    r_z, r_r, r_h = np.split(r, 3)
    wb_z, wb_r, wb_h, rb_z, rb_r, rb_h = np.split(b, 6)
    z = f_gate(x @ w_z.T + h @ r_z.T + wb_z + rb_z)
    reset = f_gate(x @ w_r.T + h @ r_r.T + wb_r + rb_r)
    if params.get("linear_before_reset"):
        candidate = g_cand(x @ w_h.T + wb_h + reset * (h @ r_h.T + rb_h))
    else:
        candidate = g_cand(x @ w_h.T + wb_h + (reset * h) @ r_h.T + rb_h)
    return z * h + (1.0 - z) * candidate, c


def _rnn_step(params, weights, functions, x, h, c):
    w, r, b, _ = weights
    wb, rb = np.split(b, 2)
    return functions[0](x @ w.T + wb + h @ r.T + rb), c


_STEPS = {"LSTM": (_lstm_step, 3), "GRU": (_gru_step, 2), "RNN": (_rnn_step, 1)}


def _weights(op: str, given: dict, d: int, hidden: int):
    """(W, R, the two biases summed where the cell adds them as one, P) of direction ``d``."""
    gates = _GATES[op] * hidden
    bias = given["B"][d] if "B" in given else np.zeros(2 * gates)
    if op == "LSTM":  # Wb and Rb are always added together
        bias = bias[:gates] + bias[gates:]
    p = given["P"][d] if "P" in given else np.zeros(3 * hidden)
    return given["W"][d], given["R"][d], bias, p


def recurrent(op: str):
    """The host step of ``op``: Y, Y_h (and Y_c for LSTM)."""
    step, count = _STEPS[op]

    def run(inputs: list[np.ndarray], params: dict) -> list[np.ndarray]:
        given = {_SLOTS[int(slot)]: value for slot, value in zip(params["input_slots"], inputs) if value is not None}
        hidden, batch_first = int(params["hidden_size"]), bool(params.get("layout", 0))
        x = np.swapaxes(given["X"], 0, 1) if batch_first else given["X"]  # [seq, batch, input]
        seq, batch = x.shape[0], x.shape[1]
        directions = 2 if params["direction"] == "bidirectional" else 1
        initial = {key: (np.swapaxes(given[key], 0, 1) if batch_first else given[key]) if key in given
                   else np.zeros((directions, batch, hidden)) for key in ("initial_h", "initial_c")}
        lengths = given["sequence_lens"].astype(np.int64) if "sequence_lens" in given else np.full(batch, seq)
        y = np.zeros((seq, directions, batch, hidden))
        finals_h, finals_c = [], []
        for d in range(directions):
            weights, functions = _weights(op, given, d, hidden), _functions(params, d, count)
            backward = params["direction"] == "reverse" or d == 1
            h, c = initial["initial_h"][d], initial["initial_c"][d]
            for t in (reversed(range(seq)) if backward else range(seq)):
                new_h, new_c = step(params, weights, functions, x[t], h, c)
                running = (lengths > t).reshape(-1, 1)  # a finished row keeps its state, outputs 0
                h, c = np.where(running, new_h, h), np.where(running, new_c, c)
                y[t, d] = np.where(running, h, 0.0)
            finals_h.append(h), finals_c.append(c)
        y_h, y_c = np.stack(finals_h), np.stack(finals_c)
        if batch_first:
            y, y_h, y_c = y.transpose(2, 0, 1, 3), np.swapaxes(y_h, 0, 1), np.swapaxes(y_c, 0, 1)
        return [y, y_h, y_c] if op == "LSTM" else [y, y_h]
    return run


RECURRENT_OPS = {op: recurrent(op) for op in _GATES}
