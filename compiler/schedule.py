"""Build stage 8: lowered layers -> task chains per core and the model file's schedule.

Runs of consecutive single-core NPU layers form one chain each (on the first core of the
mask); a layer split across cores gets one chain per core, its steps sharing a schedule group
(they run in parallel, isa/CONTAINER.md 3.5); a host step ends the current chain and becomes a
``cpu`` step between chains. Chains are laid out one after another in the regcmd section.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npuemu.compiler.build_adapt import CpuOp
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import CompileError
from npuemu.isa.task import Chain

REGCMD_SECTION = "regcmd"


def segments(work, lowered) -> list:
    """("npu", [layer indices]), ("split", [layer index]) or ("cpu", CpuOp), in order;
    ``lowered[i]`` is NPU layer i's lowering (its cores decide a split)."""
    out: list = []
    npu_index = 0
    for record in work:
        if isinstance(record, CpuOp):
            out.append(("cpu", record))
            continue
        if len(set(lowered[npu_index].cores)) > 1:
            out.append(("split", [npu_index]))
        elif out and out[-1][0] == "npu":
            out[-1][1].append(npu_index)
        else:
            out.append(("npu", [npu_index]))
        npu_index += 1
    return out


def chains(lowered, kind: str, members) -> list:
    """(logical core, [(layer index, first task index in the layer, tasks)]) per chain of a segment."""
    if kind == "npu":
        return [(0, [(i, 0, list(lowered[i].tasks)) for i in members])]
    (i,) = members
    item = lowered[i]
    out = []
    for core in sorted(set(item.cores)):
        picked = [k for k, c in enumerate(item.cores) if c == core]
        out.append((core, [(i, picked[0], [item.tasks[k] for k in picked])]))
    return out


def chain_tasks(lowered, plan: list, max_tasks: int) -> list:
    """Every task of every chain in regcmd order (to size the regcmd area); a chain longer than
    one submit is refused."""
    tasks = []
    for kind, members in plan:
        if kind == "cpu":
            continue
        for _, parts in chains(lowered, kind, members):
            chain = [task for _, _, layer_tasks in parts for task in layer_tasks]
            if len(chain) > max_tasks:
                raise CompileError(f"{len(chain)} tasks exceed the {max_tasks} tasks of one "
                                   "submit; splitting a chain into several NPU steps is not built yet")
            tasks += chain
    return tasks


@dataclass
class Schedule:
    """The encoded chains and the schedule steps that point into them."""

    regcmd: bytearray = field(default_factory=bytearray)
    steps: list = field(default_factory=list)
    ranges: dict[int, list[dict]] = field(default_factory=dict)  # NPU layer index -> its task ranges


def encode_schedule(plan: list, lowered, layer_ids, npu_layers, regmap, *, regcmd_base: int, cores,
                    scale: int) -> Schedule:
    """The schedule of ``plan`` (segments) with chains encoded for regcmd area ``regcmd_base``;
    ``layer_ids[id(record)]`` is a record's graph-layer index, ``npu_layers[i]`` NPU layer i's
    record, ``cores`` maps logical to physical cores."""
    out = Schedule()
    group = 0
    for kind, members in plan:
        if kind == "cpu":
            out.steps.append(_cpu_step(members, layer_ids))
            continue
        for core, parts in chains(lowered, kind, members):
            step = _npu_step(out, core, parts, regmap, regcmd_base, scale, cores)
            step["layers"] = [layer_ids[id(npu_layers[i])] for i, _, _ in parts]
            if kind == "split":
                step["group"] = group
            out.steps.append(step)
        group += kind == "split"
    return out


def _cpu_step(op: CpuOp, layer_ids) -> dict:
    return {"kind": "cpu", "op": op.op, "inputs": list(op.inputs), "outputs": [op.output],
            "params": dict(op.params), "layers": [layer_ids[id(op)]]}


def _npu_step(out: Schedule, core: int, parts, regmap, regcmd_base: int, scale: int, cores) -> dict:
    offset = len(out.regcmd)
    chain = [task for _, _, tasks in parts for task in tasks]
    encoded = encode_chain(Chain(chain), regmap, base_addr=regcmd_base + offset, scale=scale)
    out.regcmd += bytes(encoded.data)
    position = 0
    for i, _, tasks in parts:
        out.ranges.setdefault(i, []).append({"step": len(out.steps), "first": position, "count": len(tasks)})
        position += len(tasks)
    return {"kind": "npu", "core": cores[core],
            "chain": {"section": REGCMD_SECTION, "offset": offset, "first_amount": encoded.first_amount,
                      "tasks": len(chain)}}


__all__ = ["REGCMD_SECTION", "Schedule", "chain_tasks", "chains", "encode_schedule", "segments"]
