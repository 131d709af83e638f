"""``load_rknn``: read and validate a vendor ``.rknn`` file (format 6) into an :class:`RknnModel`.

Which FlatBuffer slot holds what is documented in ``docs/rknn-relocation.md`` §2 and §5 and
in the fixtures README; the reader (``flatbuffer.py``) checks every offset and length, and
this module checks what the slots mean to each other: tensor and blob indices, the regcmd and
task blobs, each task's block and tail, the chains, and the relocation table. Anything that
would make relocation or execution touch the wrong word is refused here, so that the later
steps (``relocate.py``, the emulator) can trust the model.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from npuemu.isa.errors import ModelFileError
from npuemu.isa.rknn.container import read_container
from npuemu.isa.rknn.flatbuffer import FlatBuffer, Table
from npuemu.isa.rknn.model import (
    PC_BASE_ADDRESS, PC_REGISTER_AMOUNTS, PC_TARGET, REGCMD_WORD_BYTES, TAIL_WORDS, TASK_RECORD, Chain,
    InputNormalization, RegionSizes, RelocationEntry, RknnLayer, RknnModel, RknnProgram, RknnTensor, TaskRecord,
    TaskTail, TensorKind,
)

logger = logging.getLogger(__name__)

FILE_IDENTIFIER = b"RKNN"
ADDRESS_SPACE = 1 << 32
"""Command words carry 32-bit values, so every region and address must lie below 4 GiB."""


def load_rknn(source: str | os.PathLike[str] | bytes | bytearray | memoryview, name: str | None = None, *,
              graph_index: int = 0) -> RknnModel:
    """Read a vendor ``.rknn`` file from a path or from its bytes (``name`` labels messages);
    ``graph_index`` picks the graph of a dynamic-shape build (one per input shape set)."""
    data, label = _read(source, name)
    container, flatbuffer, trailer = read_container(memoryview(data), label)
    buffer = FlatBuffer(flatbuffer, label, container.flatbuffer_offset)
    root = buffer.root(FILE_IDENTIFIER, "model")
    blobs, blob_offsets = _blobs(root)
    graphs, graph = _graph(root, graph_index)
    tensors = _tensors(graph, len(blobs))
    if graph_index:
        tensors = _shared_weights(tensors, _tensors(graphs[0], len(blobs)), blobs)
    program = _program(tensors, blobs, blob_offsets, graph)
    return RknnModel(
        source=label, container=container, trailer=trailer,
        platform=root.string(1), target=root.string(8), compiler_version=root.string(7),
        source_framework=root.string(9), shape_mode=root.string(16),
        input_formats=root.string(12), output_formats=root.string(13),
        regions=_regions(root), tensors=tensors, blobs=blobs, blob_offsets=blob_offsets,
        inputs=_tensor_ids(graph, 2, len(tensors)), outputs=_tensor_ids(graph, 3, len(tensors)),
        normalization=_normalization(graph), layers=_layers(graph, len(tensors)),
        relocations=_relocations(graph, tensors, program), program=program,
        graph_index=graph_index, graph_shapes=_graph_shapes(graphs, len(blobs)) if len(graphs) > 1 else (),
    )


def _read(source, name: str | None) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        # The model keeps views of these bytes: take an immutable copy of a mutable buffer.
        return source if isinstance(source, bytes) else bytes(source), name or "<rknn bytes>"
    label = name or os.fspath(source)
    try:
        with open(source, "rb") as handle:
            return handle.read(), label
    except OSError as exc:
        raise ModelFileError(f"{label}: cannot read the file ({exc.strerror or exc})") from None


def _fail(table: Table, slot: int | None, problem: str) -> ModelFileError:
    where = table.path if slot is None else table.where(slot)
    return table.buffer.error(where, problem, table.position)


# --- model-level tables ------------------------------------------------------------------


def _regions(root: Table) -> RegionSizes:
    table = root.table(19, "regions")
    if table is None:
        return RegionSizes(0, 0, 0)
    sizes = []
    for slot in range(3):
        size = table.scalar(slot, "u64")
        if size >= ADDRESS_SPACE:
            raise _fail(table, slot, f"region size {size:#x} does not fit the 32-bit device address space")
        sizes.append(size)
    return RegionSizes(*sizes)


def _blobs(root: Table) -> tuple[tuple[memoryview, ...], tuple[int, ...]]:
    """Each blob's bytes (a view of the file) and the file offset of its first byte."""
    empty = (root.buffer.file_offset, root.buffer.data[0:0])
    found = [_or(table.byte_vector_at(0), empty) for table in root.tables(20, "blobs") or ()]
    return tuple(view for _, view in found), tuple(offset for offset, _ in found)


def _graph(root: Table, index: int) -> tuple[tuple[Table, ...], Table]:
    graphs = root.tables(2, "graphs")
    if not graphs:
        raise _fail(root, 2, "the model has no graph (slot 2 graphs is absent or empty)")
    if not 0 <= index < len(graphs):
        raise _fail(root, 2, f"graph {index} asked; the model has {len(graphs)} (0..{len(graphs) - 1})")
    return tuple(graphs), graphs[index]


def _graph_shapes(graphs, blob_count: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Each graph's input shapes: a dynamic-shape build has one graph per shape set."""
    shapes = []
    for graph in graphs:
        tensors = _tensors(graph, blob_count)
        shapes.append(tuple(tuple(tensors[i].shape) for i in _tensor_ids(graph, 2, len(tensors))))
    return tuple(shapes)


def _shared_weights(tensors: tuple[RknnTensor, ...], first: tuple[RknnTensor, ...],
                    blobs: tuple[memoryview, ...]) -> tuple[RknnTensor, ...]:
    """A later graph of a dynamic-shape build stores its weights once, in graphs[0]: its const
    tensors (kinds 4, 5) have empty blobs ([V] dynamic_shape_int8: graphs[1] w1..b18 are blobs of
    0 bytes, graphs[0]'s hold them). Such a tensor takes the blob of graphs[0]'s tensor of the same
    name, kind and shape; one without that partner keeps its empty blob."""
    by_name = {(t.name, t.kind, tuple(t.shape)): t for t in first}
    shared = []
    for tensor in tensors:
        partner = by_name.get((tensor.name, tensor.kind, tuple(tensor.shape)))
        if (tensor.kind in (TensorKind.CONST, TensorKind.CONST_OTHER) and tensor.blob_index is not None
                and len(blobs[tensor.blob_index]) == 0 and partner is not None and partner.blob_index is not None):
            tensor = replace(tensor, blob_index=partner.blob_index)
        shared.append(tensor)
    return tuple(shared)


def _or(value, default):
    return default if value is None else value


# --- tensors -----------------------------------------------------------------------------


def _tensors(graph: Table, blob_count: int) -> tuple[RknnTensor, ...]:
    tables = graph.tables(0, "tensors")
    if tables is None:
        raise _fail(graph, 0, "the graph has no tensor list")
    tensors = tuple(_tensor(index, table, blob_count) for index, table in enumerate(tables))
    owner: dict[int, int] = {}
    for tensor in tensors:   # a shared blob would be copied once per tensor: refuse, as no build does it
        if tensor.blob_index is not None:
            if tensor.blob_index in owner:
                raise _fail(tables[tensor.index], 18, f"blob {tensor.blob_index} is already the data of "
                            f"tensors[{owner[tensor.blob_index]}]")
            owner[tensor.blob_index] = tensor.index
    return tensors


def _tensor(index: int, table: Table, blob_count: int) -> RknnTensor:
    blob_index = table.scalar(18, "u32", None)
    if blob_index is not None and blob_index >= blob_count:
        raise _fail(table, 18, f"blob index {blob_index} is out of range (the model has {blob_count} blobs)")
    return RknnTensor(
        index=index, name=_or(table.string(5), ""), kind=table.scalar(2, "u8"), dtype=table.scalar(0, "u8", None),
        layout_code=table.scalar(1, "u8", None),
        shape=_or(table.scalars(4, "i32"), ()), native_shape=_or(table.scalars(3, "i32"), ()),
        size=table.scalar(12, "u32", None), memory_offset=table.scalar(13, "u32"), blob_index=blob_index,
        scales=_or(table.scalars(10, "f32"), ()), zero_points=_or(table.scalars(11, "i32"), ()),
        quant_method=table.string(6), quant_dtype=table.string(7),
        calibration_min=_or(table.scalars(8, "f32"), ()), calibration_max=_or(table.scalars(9, "f32"), ()),
    )


def _tensor_ids(table: Table, slot: int, tensor_count: int) -> tuple[int, ...]:
    ids = _or(table.scalars(slot, "u32"), ())
    for position, tensor_id in enumerate(ids):
        if tensor_id >= tensor_count:
            raise _fail(table, slot, f"element {position} names tensor {tensor_id}, but the graph has "
                        f"{tensor_count} tensors")
    return ids


# --- graph annotations -------------------------------------------------------------------


def _normalization(graph: Table) -> tuple[InputNormalization, ...]:
    return tuple(
        InputNormalization(_or(table.scalars(0, "f32"), ()), _or(table.scalars(1, "f32"), ()),
                           _or(table.scalars(2, "u32"), ()))
        for table in graph.tables(4, "normalization") or ()
    )


def _layers(graph: Table, tensor_count: int) -> tuple[RknnLayer, ...]:
    return tuple(
        RknnLayer(index, _or(table.string(1), ""), _or(table.string(2), ""),
                  _tensor_ids(table, 4, tensor_count), _tensor_ids(table, 5, tensor_count),
                  _or(table.scalars(10, "u32"), ()), table.scalar(3, "u8"))
        for index, table in enumerate(graph.tables(1, "nodes") or ())
    )


# --- the program: regcmd blob, task records, tails, chains ---------------------------------


def _program(tensors: tuple[RknnTensor, ...], blobs: tuple[memoryview, ...], blob_offsets: tuple[int, ...],
             graph: Table) -> RknnProgram:
    source = graph.buffer.source
    regcmd_tensor = _single_tensor(tensors, TensorKind.REGCMD, source)
    task_tensor = _single_tensor(tensors, TensorKind.TASK, source)
    if regcmd_tensor is None and task_tensor is None:
        return RknnProgram(np.zeros(0, np.uint64), (), (), (), None, None)
    if regcmd_tensor is None or task_tensor is None:
        missing = "regcmd (kind 9)" if regcmd_tensor is None else "task (kind 10)"
        raise ModelFileError(f"{source}: graphs[0].tensors: the {missing} tensor is missing while its partner exists")
    regcmd_blob = _blob_of(tensors[regcmd_tensor], blobs, REGCMD_WORD_BYTES, "8-byte command words", source)
    task_blob = _blob_of(tensors[task_tensor], blobs, TASK_RECORD.size, "40-byte task records", source)
    regcmd = np.frombuffer(regcmd_blob, dtype="<u8").astype(np.uint64)
    regcmd.setflags(write=False)
    tasks = tuple(TaskRecord(i, *TASK_RECORD.unpack_from(task_blob, i * TASK_RECORD.size))
                  for i in range(len(task_blob) // TASK_RECORD.size))
    origin = _Origin(source, blob_offsets[tensors[regcmd_tensor].blob_index],
                     blob_offsets[tensors[task_tensor].blob_index])
    tails = _tails(tasks, regcmd, origin)
    return RknnProgram(regcmd, tasks, _chains(tasks, tails, origin), tuple(sorted(tails.values(),
                       key=lambda tail: tail.word_index)), regcmd_tensor, task_tensor)


def _single_tensor(tensors: tuple[RknnTensor, ...], kind: TensorKind, source: str) -> int | None:
    found = [tensor.index for tensor in tensors if tensor.kind == kind]
    if len(found) > 1:
        raise ModelFileError(f"{source}: graphs[0].tensors {found} all have kind {int(kind)} "
                             f"({kind.name.lower()}); expected one")
    return found[0] if found else None


def _blob_of(tensor: RknnTensor, blobs: tuple[memoryview, ...], unit: int, what: str, source: str) -> memoryview:
    where = f"{source}: graphs[0].tensors[{tensor.index}] ({tensor.name!r})"
    if tensor.blob_index is None:
        raise ModelFileError(f"{where}: slot 18 (blob index) is absent; expected the blob of {what}")
    blob = blobs[tensor.blob_index]
    if len(blob) % unit:
        raise ModelFileError(f"{where}: blob {tensor.blob_index} holds {len(blob)} bytes, not a whole number of {what}")
    return blob


@dataclass(frozen=True)
class _Origin:
    """Where the program's blobs sit in the file, so that messages give offsets for a hex dump."""

    source: str
    regcmd_offset: int
    task_offset: int

    def task(self, task: TaskRecord) -> str:
        return f"{self.source}: task record {task.index} (file offset " \
               f"{self.task_offset + task.index * TASK_RECORD.size:#x})"

    def word(self, index: int) -> str:
        return f"regcmd word {index} (file offset {self.regcmd_offset + index * REGCMD_WORD_BYTES:#x})"


def _tails(tasks: tuple[TaskRecord, ...], regcmd: np.ndarray, origin: _Origin) -> dict[int, TaskTail]:
    """The tail of every task, checked to be PC words; tails shared by several records appear once."""
    tails: dict[int, TaskTail] = {}
    words = regcmd.size
    for task in tasks:
        where = f"{origin.task(task)}, regcmd_addr {task.regcmd_addr:#x}, regcfg_amount {task.regcfg_amount}"
        if task.regcmd_addr % REGCMD_WORD_BYTES:
            raise ModelFileError(f"{where}: regcmd_addr is not a multiple of {REGCMD_WORD_BYTES}")
        if task.tail_word + TAIL_WORDS > words:
            raise ModelFileError(f"{where}: the block and its {TAIL_WORDS}-word tail end at word "
                                 f"{task.tail_word + TAIL_WORDS}, past the {words}-word regcmd blob")
        if task.tail_word not in tails:
            tails[task.tail_word] = _tail(task, regcmd, where, origin)
    return tails


def _tail(task: TaskRecord, regcmd: np.ndarray, where: str, origin: _Origin) -> TaskTail:
    """The tail at ``regcfg_amount``: [link][PC_REGISTER_AMOUNTS][marker][OP_EN], where the link is

    - a PC_BASE_ADDRESS write (the next block), or
    - a zero word, when the fetch amount (bits 15:0) is 0: the chain ends. Bits 31:16 may be set:
      every rk3576 2-core chain ends each core's task with amount word 0x10000 (isa/RKNN_TAILS.md §1), or
    - a second, identical PC_REGISTER_AMOUNTS write, in the exLSTM blocks that the vendor replays
      per timestep: the PC_BASE_ADDRESS write(s) sit just before it (isa/RKNN_TAILS.md §2).

    Anything else (a zero link that would fetch from offset 0, a stray register) is refused.
    """
    index = task.tail_word
    link, amounts = int(regcmd[index]), int(regcmd[index + 1])
    if not _is_pc(amounts, PC_REGISTER_AMOUNTS):
        raise ModelFileError(f"{where}: {origin.word(index + 1)} is {amounts:#018x}, expected the tail's "
                             f"PC_REGISTER_AMOUNTS word (target {PC_TARGET:#06x}, register {PC_REGISTER_AMOUNTS:#06x})")
    amount = _value(amounts)
    if _is_pc(link, PC_BASE_ADDRESS):
        return TaskTail(index, _value(link), amount, (index,))
    if link == 0 and amount & 0xFFFF == 0:
        return TaskTail(index, 0, amount, ())
    if link == amounts:
        return _repeated_tail(task, regcmd, where, origin, amount)
    raise ModelFileError(f"{where}: {origin.word(index)} is {link:#018x}, expected the tail's PC_BASE_ADDRESS "
                         f"word (target {PC_TARGET:#06x}, register {PC_BASE_ADDRESS:#06x}), 0 at a chain end "
                         f"(fetch amount 0; here {amount & 0xFFFF}), or a repeat of the PC_REGISTER_AMOUNTS word "
                         f"after it")


def _repeated_tail(task: TaskRecord, regcmd: np.ndarray, where: str, origin: _Origin, amount: int) -> TaskTail:
    """The exLSTM form [PC_BASE_ADDRESS x k][PC_REGISTER_AMOUNTS x 2][marker][OP_EN] (lstm_int8 task 75,
    words 11077..11083: k = 3, all three BASE words 0x15a80). The register that counts is the last
    one written, so the BASE writes must all agree; each is patched when the regcmd base moves."""
    index = task.tail_word
    first = index
    while first > task.first_word and _is_pc(int(regcmd[first - 1]), PC_BASE_ADDRESS):
        first -= 1
    values = {_value(int(regcmd[word])) for word in range(first, index)}
    if len(values) != 1:
        problem = "no PC_BASE_ADDRESS write precedes it" if not values else \
            f"the PC_BASE_ADDRESS writes before it ({origin.word(first)} on) disagree: " \
            f"{', '.join(hex(v) for v in sorted(values))}"
        raise ModelFileError(f"{where}: {origin.word(index)} repeats the PC_REGISTER_AMOUNTS write, but {problem}")
    return TaskTail(index, values.pop(), amount, tuple(range(first, index)))


def _is_pc(word: int, register: int) -> bool:
    return _target(word) == PC_TARGET and _register(word) == register


def _target(word: int) -> int:
    return word >> 48


def _value(word: int) -> int:
    return (word >> 16) & 0xFFFF_FFFF


def _register(word: int) -> int:
    return word & 0xFFFF


def _chains(tasks: tuple[TaskRecord, ...], tails: dict[int, TaskTail], origin: _Origin) -> tuple[Chain, ...]:
    """Split the records into chains at the tails that end one (amount 0), as the vendor lists them.

    A continuing tail must point at the first word of some task's block; it need not be the next
    record's block: the multi-core chains reuse blocks of other chains.
    """
    starts = {task.regcmd_addr for task in tasks}
    chains: list[Chain] = []
    first = 0
    for task in tasks:
        tail = tails[task.tail_word]
        if not tail.ends_chain and tail.next_offset not in starts:
            raise ModelFileError(
                f"{origin.task(task)}: its tail ({origin.word(tail.word_index)}) continues at regcmd offset "
                f"{tail.next_offset:#x}, which is not the start of any task's block")
        if tail.ends_chain:
            chains.append(Chain(len(chains), first, task.index + 1 - first))
            first = task.index + 1
    if first != len(tasks):
        raise ModelFileError(f"{origin.source}: task records {first}..{len(tasks) - 1} never reach a tail that "
                             f"ends their chain (PC_REGISTER_AMOUNTS bits 15:0 = 0)")
    return tuple(chains)


# --- relocation table (graph slot 7) ---------------------------------------------------------


def _relocations(graph: Table, tensors: tuple[RknnTensor, ...], program: RknnProgram) -> tuple[RelocationEntry, ...]:
    tables = graph.tables(7, "relocations") or ()
    names = Counter(tensor.name for tensor in tensors)
    by_name = {tensor.name: tensor.index for tensor in tensors}
    reserved = {tail.word_index + k for tail in program.tails for k in range(TAIL_WORDS)}
    reserved.update(word for tail in program.tails for word in tail.base_words)
    seen: dict[int, int] = {}
    entries = []
    for position, table in enumerate(tables):
        entry = _relocation(table, names, by_name, tensors)
        for offset, word in entry.pairs:
            if word >= program.regcmd_words:
                raise _fail(table, 1, f"word index {word} is past the {program.regcmd_words}-word regcmd blob")
            if word in reserved:
                raise _fail(table, 1, f"word index {word} is a PC tail word, which only the regcmd base relocates")
            if word in seen:
                raise _fail(table, 1, f"word index {word} is also relocated by relocations[{seen[word]}]")
            seen[word] = position
        entries.append(entry)
    return tuple(entries)


def _relocation(table: Table, names: Counter, by_name: dict[str, int], tensors) -> RelocationEntry:
    name = table.string(0)
    if name is None or names[name] != 1:
        problem = "is absent" if name is None else (
            f"names tensor {name!r}, which does not exist" if names[name] == 0 else
            f"names tensor {name!r}, which is ambiguous ({names[name]} tensors have that name)")
        raise _fail(table, 0, problem)
    index = by_name[name]
    if tensors[index].kind in (TensorKind.REGCMD, TensorKind.TASK):
        raise _fail(table, 0, f"names the {tensors[index].kind_name} blob {name!r}, which the table never relocates")
    pairs = _or(table.structs(1, "<II"), ())
    cores = table.structs(2, "<II") or None   # empty for LUT-program tensors: same as absent
    if cores is not None and len(cores) != len(pairs):
        raise _fail(table, 2, f"{len(cores)} core records for {len(pairs)} (offset, word) pairs; expected one each")
    return RelocationEntry(name, index, pairs, cores)
