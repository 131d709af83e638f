"""Accuracy analysis of a quantized graph against its float self (SDK guide 3.2.2, 4.1.3.1).

For every node output, the cosine similarity and the Euclidean distance of the fake-quant
value against the float value, two ways:

- **entire**: the whole graph runs with simulated quantization, so errors accumulate;
- **single**: the node alone runs with simulated quantization on the *float* values of its
  inputs (each stored as its tensor's quantization says), so the figure is that layer's own
  loss.

A high single cosine does not make a layer harmless: cosine is dominated by the large values,
while a later layer may depend on the small ones. ``tensor_sensitivity`` measures what
matters for the result: the graph outputs' cosine when only one tensor is stored quantized
and everything else stays float. The most sensitive tensors are the ones to keep in float16;
a tensor stays float16 only if its producer *and* every layer reading it are float16
(``float16_layers_for``), since an int8 reader gets an int8 copy.

The float reference is the quantized graph evaluated without simulation (DataConvert nodes
are the identity there), so tensor names line up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..float_eval import evaluate, run_node
from ..ir import Graph
from . import convert_op
from .fake_quant import fake_quant_evaluate, storage_hook
from .quantize import layer_dtype


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays as vectors (1.0 for two zero vectors)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    if norms == 0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a, b) / norms)


@dataclass(frozen=True)
class LayerAccuracy:
    layer: str
    op: str
    dtype: str | None
    tensor: str
    entire_cosine: float
    single_cosine: float
    entire_euclidean: float
    single_euclidean: float


def layer_accuracy(graph: Graph, inputs: Mapping[str, Any]) -> list[LayerAccuracy]:
    """Entire and single figures for every float output of every node, in graph order."""
    reference = evaluate(graph, inputs, return_all=True)
    simulated = fake_quant_evaluate(graph, inputs, return_all=True)
    hook = storage_hook(graph)
    stored: dict[str, np.ndarray] = {}

    def fetch(name: str) -> np.ndarray:
        if name not in stored:
            tensor = graph.tensors[name]
            value = tensor.data if tensor.is_const else reference[name]
            stored[name] = hook(tensor, value)
        return stored[name]

    rows = []
    for node in graph.nodes:
        if node.op_type == convert_op.OP_TYPE:
            continue
        outputs = run_node(node, fetch)
        for name, value in zip(node.outputs, outputs):
            tensor = graph.tensors[name]
            if not np.issubdtype(np.asarray(reference[name]).dtype, np.floating):
                continue
            single = hook(tensor, np.asarray(value).astype(tensor.dtype, copy=False))
            rows.append(LayerAccuracy(node.layer_name, node.display_op, layer_dtype(graph, node), name,
                                      cosine(simulated[name], reference[name]), cosine(single, reference[name]),
                                      _distance(simulated[name], reference[name]), _distance(single, reference[name])))
    return rows


def output_cosines(graph: Graph, inputs: Mapping[str, Any]) -> dict[str, float]:
    """Cosine of each graph output, fake quant against float."""
    reference = evaluate(graph, inputs)
    simulated = fake_quant_evaluate(graph, inputs)
    return {name: cosine(simulated[name], reference[name]) for name in graph.outputs}


@dataclass(frozen=True)
class TensorSensitivity:
    tensor: str
    layer: str  # the producing node ("" for a graph input)
    output_cosine: float  # mean over the samples of the worst graph output's cosine


def tensor_sensitivity(graph: Graph, samples: list[Mapping[str, Any]], *, progress: bool = False) -> list[TensorSensitivity]:
    """For each stored activation tensor: the outputs' cosine when only it is quantized
    (weights and every other tensor float), most harmful first."""
    from .progress import Progress

    hook = storage_hook(graph)
    references = [evaluate(graph, sample) for sample in samples]
    producers = graph.producers()
    names = [name for name in graph.inputs if graph.tensors[name].quant is not None]
    names += [name for node in graph.nodes if node.op_type != convert_op.OP_TYPE
              for name in node.outputs if graph.tensors[name].quant is not None]
    rows = []
    with Progress(len(names), "sensitivity", enabled=progress) as bar:
        for name in names:
            def only(tensor, value, name=name):
                return hook(tensor, value) if tensor.name == name else value
            scores = []
            for sample, reference in zip(samples, references):
                values = evaluate(graph, sample, tensor_hook=only)
                scores.append(min(cosine(values[out], reference[out]) for out in graph.outputs))
            node = producers.get(name)
            rows.append(TensorSensitivity(name, node.name if node is not None else "", float(np.mean(scores))))
            bar.advance()
    return sorted(rows, key=lambda row: row.output_cosine)


def float16_layers_for(graph: Graph, tensors: list[str]) -> set[str]:
    """The layers to set to float16 so that ``tensors`` are never stored as int8: each one's
    producer and all its readers."""
    producers, consumers = graph.producers(), graph.consumers()
    layers: set[str] = set()
    for name in tensors:
        if name in producers:
            layers.add(producers[name].name)
        layers.update(node.name for node in consumers.get(name, []))
    return layers


def _distance(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)))


def format_accuracy(rows: list[LayerAccuracy], *, worst: int | None = None) -> str:
    """A text table (all rows in graph order, or the ``worst`` by single cosine)."""
    if worst is not None:
        rows = sorted(rows, key=lambda row: row.single_cosine)[:worst]
    header = f"{'layer':<40} {'op':<24} {'dtype':<8} {'entire cos':>10} {'single cos':>10}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row.layer[:40]:<40} {row.op[:24]:<24} {str(row.dtype):<8} {row.entire_cosine:>10.6f} "
                     f"{row.single_cosine:>10.6f}")
    return "\n".join(lines) + "\n"
