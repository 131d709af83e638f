"""Where the CPU layers of a vendor ``.rknn`` program run relative to its NPU tasks.

The vendor's int8 builds keep some Reshape layers on the CPU in front of (or between) NPU layers
[V: layernorm_int8, layernorm_decomposed_int8, matmul_rows_int8, transpose_heads_int8
librknnc_tables.txt: "Reshape INT8 CPU" turns the plain ``(1,40,120)`` input into the NC1HWC2
``(1,40,1,120)`` tensor the first Transpose reads]. The vendor runtime runs the layers in table
order: the NPU tasks of the layers before a CPU layer as one submit (the driver's task count,
``rknpu_submit.task_number``, stops the PC there, rknpu-isa.md 2.3), then the CPU layer, then the
next submit. This module works out that order from the file:

- a CPU layer's place is the number of chain-0 task records whose layer (``op_idx``) comes
  before it in the layer table; the records must be in layer order there [V: every fixture];
- CPU layers after the last NPU task stay where the runner always ran them (after the program,
  untimed as before); the ones the NPU program waits for are :class:`HostStep` s the timeline
  charges like npuemu's own host steps (``timing/host_model.py``: the step's input elements).

The NPU segments between host steps are run as pieces (``rknn_multicore.place_pieces``): the
emulator's PC has no task count, so a segment that stops before the chain's end is a copy of its
blocks with the last tail ended, the same device the multi-core programs use.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.errors import EmulationError
from npuemu.isa.rknn import RknnLayer, RknnModel

LAYOUT_ONLY = ("InputOperator", "OutputOperator")
"""CPU layers that only hand tensors in and out: the runner writes/reads the tensors directly."""


@dataclass(frozen=True)
class HostStep:
    """A CPU layer the NPU program waits for: it runs after ``after_tasks`` chain-0 records."""

    layer: RknnLayer
    after_tasks: int
    input_shapes: tuple[tuple[int, ...], ...]   # its data input (what host_model.py charges)


def host_layers(model: RknnModel) -> tuple[RknnLayer, ...]:
    """The CPU layers the runner executes, in table order."""
    return tuple(layer for layer in model.layers if layer.unit != "NPU" and layer.op_type not in LAYOUT_ONLY)


def feeds_npu(model: RknnModel) -> frozenset[int]:
    """Indices of the host layers whose outputs a later NPU layer reads (directly)."""
    made: dict[int, int] = {}
    wanted: set[int] = set()
    for layer in model.layers:
        if layer.unit == "NPU":
            wanted.update(made[i] for i in layer.inputs if i in made)
        elif layer.op_type not in LAYOUT_ONLY:
            made.update(dict.fromkeys(layer.outputs, layer.index))
    return frozenset(wanted)


def host_steps(model: RknnModel) -> tuple[HostStep, ...]:
    """The host layers that run before the last NPU task, each with its place in chain 0."""
    chain = model.program.chains[0]
    order = [model.program.tasks[i].op_idx for i in chain.tasks]
    position = {layer.index: k for k, layer in enumerate(model.layers)}
    ranks = [position.get(op, -1) for op in order]
    steps = []
    for layer in host_layers(model):
        rank = position[layer.index]
        before = sum(1 for r in ranks if r < rank)
        if before == len(ranks):
            continue   # after the whole NPU program: the runner's trailing host layers
        if any(r > rank for r in ranks[:before]) or any(r < rank for r in ranks[before:]):
            raise EmulationError(f"{model.source}: CPU layer {layer.name!r} sits between NPU layers whose chain-0 "
                                 f"task records are not in layer order ({order}); the program cannot be cut there")
        # the data input: a Reshape's others are its shape constant and the 1-byte "_exSecondary"
        # companion the vendor lists [V layernorm_int8: x, x_rs_i1, x_exSecondary]
        steps.append(HostStep(layer, before, tuple(tuple(model.tensors[i].shape) for i in layer.inputs[:1])))
    return tuple(steps)


def segments(task_count: int, steps: tuple[HostStep, ...]) -> tuple[tuple[int, int], ...]:
    """Chain-0 record ranges [start, end) the NPU runs between the host steps (empty ones left out)."""
    cuts = sorted({0, task_count, *(step.after_tasks for step in steps)})
    return tuple((a, b) for a, b in zip(cuts, cuts[1:]) if b > a)
