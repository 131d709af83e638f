"""The multi-core programs of a vendor ``.rknn`` file: which task records each core runs, and in
which launches and barrier phases (emulator/REGISTER_SEMANTICS.md 10.1).

Facts used, all read from the file:

- **Per-core lists.** Each layer's ``tasks_per_chain`` (node slot 10) has 1 + 2 + ... + N
  entries on an N-core chip: the single-core program, then core 0 and core 1 of the 2-core
  program, then cores 0..2 of the 3-core one [V: the 59 shared fixtures; rk3588 6 entries,
  rk3576 3]. The task records follow in that order; the records of one entry are one or more
  of the loader's PC chains (consecutive, all on that entry's core), and the entry's record
  count is the sum over the layers [V: every fixture; chain 0 alone may hold more records than
  its entry, the LUT-upload task of conv_hardswish/gelu/glu is counted in no layer there].
- **A chain's core** is the core field (relocation slot 2) of the relocated words in its blocks
  [V: docs/rknn-relocation.md R5]. rk3576 files hold one more chain that no entry counts, just
  after chain 0: the single-core program again, relocated for core 1 [V: dense/sparse_rk3576_*].
- **Launches.** A core's list is cut where a record's tail does not continue at the next
  record's block: the PC follows tails, so such a record must end a launch (the driver's task
  count stops it, ``rknpu_submit.subcore_task``). conv1d_fp16's 2-core list runs the Reshape at
  block 0x0, whose tail points at chain 0's conv block, then the core-0 half of the conv at
  0x940 [V]. Launches on different cores whose first records belong to the same layer start
  together; the others run alone, in list order [I: the vendor runtime switches between
  single- and multi-core work on the CPU, hardware.md 7].
- **Barriers.** Bits 31:16 of a tail's PC_REGISTER_AMOUNTS are 1 in the 2-core and 2 in the
  3-core program, 0 elsewhere [V: every fixture]. Read as "wait here for the other cores"
  [I: mobilenet_v2's 2-core program splits every layer by rows across both cores in one launch
  each, so a core's next layer reads rows the other core wrote just before; only a barrier
  after every such task makes that correct]. A launch is cut into phases after each barrier
  tail; phase k of every core of a launch group runs between barriers k-1 and k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import ModelFileError
from npuemu.isa.rknn.model import RknnModel


@dataclass(frozen=True)
class Piece:
    """Consecutive task records one core runs between two barriers (or launch ends)."""

    core: int
    tasks: tuple[int, ...]      # task record indices, PC-linked
    launch: bool                # the first piece of a launch (the driver starts the PC here)


@dataclass(frozen=True)
class Launch:
    """Launches that start together, one per core, as barrier phases: ``phases[k]`` holds the
    pieces every core runs between barrier k - 1 and barrier k."""

    phases: tuple[tuple[Piece, ...], ...]

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(sorted({piece.core for phase in self.phases for piece in phase}))


@dataclass(frozen=True)
class CoreProgram:
    """One program of the file: ``cores`` cores side by side (1: a single-core program on
    ``lists[0]``'s core)."""

    label: str                          # "single-core", "single-core on core 1", "2-core", ...
    cores: int
    lists: tuple[tuple[int, ...], ...]  # per core (0..cores-1, or the one core): task records in order
    list_cores: tuple[int, ...]         # the core each list runs on
    chains: tuple[tuple[int, ...], ...]  # the loader's chain indices of each list


def chain_cores(model: RknnModel) -> tuple[frozenset[int], ...]:
    """The cores the relocated words of each chain's blocks name (empty: no core-tagged word)."""
    word_core: dict[int, int] = {}
    for entry in model.relocations:
        for (_, word), (_, core) in zip(entry.pairs, entry.cores or ()):
            word_core[word] = core
    program = model.program
    out = []
    for chain in program.chains:
        cores = set()
        for index in chain.tasks:
            task = program.tasks[index]
            cores.update(word_core[w] for w in range(task.first_word, task.tail_word) if w in word_core)
        out.append(frozenset(cores))
    return tuple(out)


def core_programs(model: RknnModel) -> tuple[CoreProgram, ...]:
    """Every program of the file: chain 0 (single-core), then the multi-core ones, by the layers'
    tasks-per-chain entries (module note). A file whose chains do not fit its entries is refused."""
    program = model.program
    if not program.chains:
        return ()
    counts = _entry_counts(model)
    if not counts:   # no layer lists its tasks per chain: chain 0 is all that is known
        return (single_core(model),)
    cores_of = chain_cores(model)
    found, extra = [single_core(model)], []
    next_chain = 1
    for n in range(2, _max_cores(len(counts), model) + 1):
        lists, chains = [], []
        for core in range(n):
            wanted = counts[n * (n - 1) // 2 + core]
            taken, next_chain, skipped = _take(model, cores_of, next_chain, core, wanted)
            extra.extend(skipped)
            chains.append(taken)
            lists.append(tuple(i for c in taken for i in program.chains[c].tasks))
        found.append(CoreProgram(f"{n}-core", n, tuple(lists), tuple(range(n)), tuple(chains)))
    if next_chain != len(program.chains):
        raise ModelFileError(f"{model.source}: chains {next_chain}..{len(program.chains) - 1} belong to no "
                             f"program of the layers' tasks-per-chain entries {list(counts)}")
    for chain, core in extra:
        found.insert(1, CoreProgram(f"single-core on core {core}", 1, (tuple(program.chains[chain].tasks),),
                                    (core,), ((chain,),)))
    return tuple(found)


def single_core(model: RknnModel) -> CoreProgram:
    """Chain 0, the program the layer table describes, on core 0."""
    return CoreProgram("single-core", 1, (tuple(model.program.chains[0].tasks),), (0,), ((0,),))


def _entry_counts(model: RknnModel) -> tuple[int, ...]:
    width = max((len(layer.tasks_per_chain) for layer in model.layers), default=0)
    return tuple(sum(layer.tasks_per_chain[e] for layer in model.layers if len(layer.tasks_per_chain) > e)
                 for e in range(width))


def _max_cores(entries: int, model: RknnModel) -> int:
    n = 1
    while n * (n + 1) // 2 < entries:
        n += 1
    if n * (n + 1) // 2 != entries:
        raise ModelFileError(f"{model.source}: the layers list {entries} tasks-per-chain entries; expected "
                             f"1 + 2 + ... + N (one per core of each program)")
    return n


def _take(model: RknnModel, cores_of, start: int, core: int, wanted: int):
    """Consecutive chains from ``start`` on ``core`` holding ``wanted`` records; before the first
    of them, a single-core chain on another core (rk3576's core-1 copy) is set aside."""
    chains = model.program.chains
    taken, got, skipped, index = [], 0, [], start
    while got < wanted:
        if index >= len(chains):
            raise ModelFileError(f"{model.source}: the file ends before core {core}'s {wanted} task records "
                                 f"(found {got})")
        cores = cores_of[index]
        if cores and cores != {core}:
            if not taken and core == 0 and len(cores) == 1 and not skipped and index == 1:
                skipped.append((index, next(iter(cores))))
                index += 1
                continue
            raise ModelFileError(f"{model.source}: chain {index} relocates for core(s) {sorted(cores)}, but its "
                                 f"records fall in core {core}'s list")
        taken.append(index)
        got += chains[index].task_count
        index += 1
    if got != wanted:   # the uploads are counted only where the entries may leave them out
        uploads = sum(is_table_upload(model, i) for c in taken for i in chains[c].tasks)
        if wanted != got - uploads:
            raise ModelFileError(f"{model.source}: chains {taken} hold {got} task records ({uploads} LUT table "
                                 f"uploads); the layers give core {core} {wanted}")
    return tuple(taken), index, skipped


#: a LUT table upload writes the table through one port register, 2 x 513 times (RK3588's LUT_ACCESS_DATA)
#: [V: conv_hardswish / gelu / glu, the rk3576 LUT builds of REGISTER_SEMANTICS.md 46 / 50]
TABLE_WRITES = 513


def is_table_upload(model: RknnModel, index: int) -> bool:
    """Task record ``index`` writes one register at least :data:`TABLE_WRITES` times: a LUT table upload. The
    layers' tasks-per-chain entries count it in some programs and not in others [V: rk3576 Conv + Sigmoid, int8
    and fp16: every chain holds an upload and a conv, every entry is 1; the SE gate's 2-core entry counts its
    upload, its single-core entry does not; REGISTER_SEMANTICS.md 56.4]."""
    record = model.program.tasks[index]
    first = record.regcmd_addr // 8
    words = model.program.regcmd[first:first + record.regcfg_amount]
    _, counts = np.unique(words & np.uint64(0xFFFF_0000_0000_FFFF), return_counts=True)   # target and offset
    return bool(counts.size) and int(counts.max()) >= TABLE_WRITES


# --- launches and barriers -------------------------------------------------------------------


def launches(model: RknnModel, program: CoreProgram) -> tuple[Launch, ...]:
    """The launches of ``program`` in order (module note): consecutive layers that several cores
    share run as one launch group, the others on their core alone; a group is cut at its
    barriers, a core's part of a phase where a tail does not continue at the next record."""
    tasks = model.program.tasks
    sharing: dict[int, set[int]] = {}
    for core, listed in zip(program.list_cores, program.lists):
        for index in listed:
            sharing.setdefault(tasks[index].op_idx, set()).add(core)
    lists = dict(zip(program.list_cores, program.lists))
    cursor = dict.fromkeys(program.list_cores, 0)
    out = []
    while any(cursor[c] < len(lists[c]) for c in cursor):
        lead = next(c for c in program.list_cores if cursor[c] < len(lists[c]))
        shared = len(sharing[tasks[lists[lead][cursor[lead]]].op_idx]) > 1
        listed, end = lists[lead], cursor[lead]
        while end < len(listed) and (len(sharing[tasks[listed[end]].op_idx]) > 1) == shared:
            end += 1
        layers = {tasks[i].op_idx for i in listed[cursor[lead]:end]}
        group = {}
        for core in (program.list_cores if shared else (lead,)):
            listed, begin = lists[core], cursor[core]
            end = begin
            while end < len(listed) and tasks[listed[end]].op_idx in layers:
                end += 1
            if end > begin:
                group[core] = listed[begin:end]
                cursor[core] = end
        out.append(_phased(model, group))
    return tuple(out)


def barrier(model: RknnModel, index: int) -> int:
    """Bits 31:16 of task ``index``'s PC_REGISTER_AMOUNTS: the other cores it waits for (0: none)."""
    program = model.program
    return program.tail_of(program.tasks[index]).amount_word >> 16


def _continues(model: RknnModel, before: int, after: int) -> bool:
    program = model.program
    tail = program.tail_of(program.tasks[before])
    return not tail.ends_chain and tail.next_offset == program.tasks[after].regcmd_addr


def _phased(model: RknnModel, group: dict[int, tuple[int, ...]]) -> Launch:
    per_core = {}
    for core, run in group.items():
        phases, current = [], []
        for index in run:
            current.append(index)
            if barrier(model, index):
                phases.append(tuple(current))
                current = []
        if current or not phases:
            phases.append(tuple(current))
        per_core[core] = phases
    depth = max(len(p) for p in per_core.values())
    if any(len(p) != depth for p in per_core.values()):
        counts = {core: len(p) for core, p in per_core.items()}
        raise ModelFileError(f"{model.source}: the cores of one launch group pass through different numbers "
                             f"of barrier phases ({counts}); they cannot be paired")
    phases = []
    for k in range(depth):
        pieces = []
        for core, parts in sorted(per_core.items()):
            pieces.extend(_pieces(model, core, parts[k], k == 0))
        phases.append(tuple(pieces))
    return Launch(tuple(phases))


def _pieces(model: RknnModel, core: int, run: tuple[int, ...], first: bool) -> list[Piece]:
    """``run`` cut where a tail does not continue at the next record's block (a new launch)."""
    pieces: list[Piece] = []
    for position, index in enumerate(run):
        if position and _continues(model, run[position - 1], index):
            pieces[-1] = Piece(core, pieces[-1].tasks + (index,), pieces[-1].launch)
        else:
            pieces.append(Piece(core, (index,), first or bool(position)))
    return pieces
