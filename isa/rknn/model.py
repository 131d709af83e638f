"""Typed description of a vendor ``.rknn`` model (format 6), as the loader returns it.

Field meanings follow ``docs/rknn-relocation.md`` (FlatBuffer slots) and the fixtures README.
Where a code's meaning is inferred rather than documented, the docstring says so. Nothing here
reads files; see ``loader.py``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

TASK_RECORD = struct.Struct("<8IQ")
"""The 40-byte ``rknpu_task`` record: eight u32 fields, then the u64 regcmd address."""
REGCMD_WORD_BYTES = 8
TAIL_WORDS = 4
"""Every task block ends in [PC_BASE_ADDRESS][PC_REGISTER_AMOUNTS][0x0041 marker][OP_EN]."""

PC_TARGET = 0x0101
PC_BASE_ADDRESS = 0x0010
PC_REGISTER_AMOUNTS = 0x0014


class TensorKind(enum.IntEnum):
    """Tensor slot 2. Code 0 is the unnamed placeholder at index 0; 7 has not been seen."""

    NONE = 0
    INPUT = 1
    OUTPUT = 2
    INTERNAL = 3
    CONST = 4
    CONST_OTHER = 5
    LUT_PROGRAM = 6
    MISC = 8
    REGCMD = 9
    TASK = 10


def kind_name(kind: int) -> str:
    try:
        return TensorKind(kind).name.lower()
    except ValueError:
        return f"kind{kind}"


DTYPE_NAMES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
}
"""Tensor slot 0. The codes are ONNX's TensorProto data types [inferred: int8 weights are 3,
int32 biases 6, int64 shape constants 7 and the 64-bit regcmd blob 13 in every fixture]."""


def dtype_name(code: int | None) -> str:
    if code is None:
        return "-"
    return DTYPE_NAMES.get(code, f"dtype{code}")


class Region(enum.Enum):
    """Where a tensor lives in the vendor memory plan (rknn-relocation.md §4, R4)."""

    WEIGHT = "weight"
    INTERNAL = "internal"
    MISC = "misc"
    LUT = "lut"
    PROGRAM = "program"
    NONE = "none"


_REGION_OF_KIND = {
    TensorKind.INPUT: Region.INTERNAL, TensorKind.OUTPUT: Region.INTERNAL, TensorKind.INTERNAL: Region.INTERNAL,
    TensorKind.CONST: Region.WEIGHT, TensorKind.CONST_OTHER: Region.WEIGHT, TensorKind.MISC: Region.MISC,
    TensorKind.LUT_PROGRAM: Region.LUT, TensorKind.REGCMD: Region.PROGRAM, TensorKind.TASK: Region.PROGRAM,
}


@dataclass(frozen=True)
class RknnTensor:
    """One entry of ``graphs[0].tensors`` (slot numbers in brackets)."""

    index: int
    name: str                              # [5]; "" for the placeholder at index 0
    kind: int                              # [2] TensorKind code
    dtype: int | None                      # [0] ONNX data-type code
    layout_code: int | None                # [1] 64 for NC1HWC2 features, 65 for conv weights [inferred]
    shape: tuple[int, ...]                 # [4] the model's shape
    native_shape: tuple[int, ...]          # [3] the shape in NPU memory
    size: int | None                       # [12] bytes; absent for the regcmd/task blobs
    memory_offset: int                     # [13] offset in the internal region (absent = 0)
    blob_index: int | None                 # [18] index into the model's blobs
    scales: tuple[float, ...]              # [10]
    zero_points: tuple[int, ...]           # [11]
    quant_method: str | None               # [6] e.g. "layer"
    quant_dtype: str | None                # [7] e.g. "int8"
    calibration_min: tuple[float, ...]     # [8]
    calibration_max: tuple[float, ...]     # [9]

    @property
    def kind_name(self) -> str:
        return kind_name(self.kind)

    @property
    def dtype_name(self) -> str:
        return dtype_name(self.dtype)

    @property
    def region(self) -> Region:
        try:
            return _REGION_OF_KIND.get(TensorKind(self.kind), Region.NONE)
        except ValueError:
            return Region.NONE


@dataclass(frozen=True)
class RknnLayer:
    """One vendor graph node (``graphs[0].nodes``): the fused layer as librknnc lists it."""

    index: int
    op_type: str                           # [1] e.g. "ConvRelu"
    name: str                              # [2] e.g. "Conv:Conv4"
    inputs: tuple[int, ...]                # [4] tensor indices
    outputs: tuple[int, ...]               # [5] tensor indices
    tasks_per_chain: tuple[int, ...]       # [10] task records of this node in each chain
    unit_code: int                         # [3] 2 on NPU layers, absent (0) on CPU layers [inferred]

    @property
    def unit(self) -> str:
        return {0: "CPU", 2: "NPU"}.get(self.unit_code, f"unit{self.unit_code}")


@dataclass(frozen=True)
class InputNormalization:
    """Graph slot 4, per graph input: the mean/std/channel order given to the toolkit's config()."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    channel_order: tuple[int, ...]


@dataclass(frozen=True)
class RegionSizes:
    """Model slot 19: bytes of the weight, internal and misc regions (absent field = 0)."""

    weight: int
    internal: int
    misc: int


@dataclass(frozen=True)
class TaskRecord:
    """One 40-byte ``rknpu_task`` record of the task blob; ``regcmd_addr`` is a blob offset."""

    index: int
    flags: int
    op_idx: int
    enable_mask: int
    int_mask: int
    int_clear: int
    int_status: int
    regcfg_amount: int
    regcfg_offset: int
    regcmd_addr: int

    @property
    def first_word(self) -> int:
        return self.regcmd_addr // REGCMD_WORD_BYTES

    @property
    def tail_word(self) -> int:
        """Index of the PC_BASE_ADDRESS word of this task's 4-word tail."""
        return self.first_word + self.regcfg_amount

    def pack(self) -> bytes:
        return TASK_RECORD.pack(self.flags, self.op_idx, self.enable_mask, self.int_mask, self.int_clear,
                                self.int_status, self.regcfg_amount, self.regcfg_offset, self.regcmd_addr)


@dataclass(frozen=True)
class TaskTail:
    """The PC words that end a task block, as stored (regcmd-blob offsets, not addresses)."""

    word_index: int                        # first tail word (block start + regcfg_amount); +1 is PC_REGISTER_AMOUNTS
    next_offset: int                       # PC_BASE_ADDRESS value (0 for the zero word at a chain end)
    amount_word: int                       # 32-bit PC_REGISTER_AMOUNTS value; bits 15:0 = 0 end the chain
    base_words: tuple[int, ...]            # the PC_BASE_ADDRESS word(s) holding next_offset; () at a chain end
    """``base_words`` is ``(word_index,)`` in the ordinary tail. In the vendor's exLSTM blocks that
    are replayed once per timestep, the tail starts with a second PC_REGISTER_AMOUNTS write and the
    link is held by the (identical) PC_BASE_ADDRESS writes just before it (isa/RKNN_TAILS.md)."""

    @property
    def ends_chain(self) -> bool:
        """Nothing more to fetch. Bits 31:16 do not count: rk3576 writes 1 there in the tails that end
        each core's part of a 2-core chain (isa/RKNN_TAILS.md)."""
        return self.amount == 0

    @property
    def amount(self) -> int:
        """Bits 15:0: the next block's fetch count; bits 31:16 are set only in multi-core chains."""
        return self.amount_word & 0xFFFF


@dataclass(frozen=True)
class Chain:
    """Consecutive task records up to a tail that ends the chain; chain 0 is the single-core program.

    Within chain 0 each tail continues at the next record's block. The other chains are the
    multi-core variants [inferred]; their records may borrow blocks of other chains.
    """

    index: int
    first_task: int
    task_count: int

    @property
    def tasks(self) -> range:
        return range(self.first_task, self.first_task + self.task_count)


@dataclass(frozen=True)
class RknnProgram:
    """The register-command program: regcmd words as stored, task records, chains and tails."""

    regcmd: np.ndarray = field(compare=False, repr=False)   # uint64, read-only, as stored
    tasks: tuple[TaskRecord, ...]
    chains: tuple[Chain, ...]
    tails: tuple[TaskTail, ...]            # one per distinct tail word, in word order
    regcmd_tensor: int | None              # tensor indices of the two blobs (None: no NPU program)
    task_tensor: int | None

    @property
    def regcmd_words(self) -> int:
        return int(self.regcmd.size)

    def tail_of(self, task: TaskRecord) -> TaskTail:
        return self.tails_by_word[task.tail_word]

    @cached_property
    def tails_by_word(self) -> dict[int, TaskTail]:
        return {tail.word_index: tail for tail in self.tails}

    def is_linked(self, chain: Chain) -> bool:
        """True when each task's tail continues at the next record's block (chain 0 of every corpus build)."""
        for index in chain.tasks[:-1]:
            if self.tail_of(self.tasks[index]).next_offset != self.tasks[index + 1].regcmd_addr:
                return False
        return bool(chain.task_count)

    def chain_regcfg_words(self, chain: Chain) -> int:
        return sum(self.tasks[i].regcfg_amount for i in chain.tasks)


@dataclass(frozen=True)
class RelocationEntry:
    """Graph slot 7, one tensor: the regcmd words whose value must become address + offset."""

    tensor_name: str                       # [0]
    tensor_index: int
    pairs: tuple[tuple[int, int], ...]     # [1] (offset in tensor, regcmd word index)
    cores: tuple[tuple[int, int], ...] | None   # [2] (first field, always 1 [meaning unknown]; core)


@dataclass(frozen=True)
class RknnContainer:
    """The outer file layout: 64-byte header, FlatBuffer, u64 JSON length, JSON trailer."""

    format_version: int
    file_size: int
    header_size: int
    flatbuffer_offset: int
    flatbuffer_size: int
    json_offset: int
    json_size: int


@dataclass(frozen=True)
class RknnModel:
    """Everything the loader read and checked from one ``.rknn`` file."""

    source: str
    container: RknnContainer
    trailer: dict[str, Any] = field(compare=False)
    platform: str | None                   # model slot 1, e.g. "RKNPU v2"
    target: str | None                     # model slot 8, e.g. "rk3588"
    compiler_version: str | None           # model slot 7
    source_framework: str | None           # model slot 9, e.g. "ONNX"
    shape_mode: str | None                 # model slot 16, e.g. "static_shape"
    input_formats: str | None              # model slot 12, JSON text: dtype/layout per input
    output_formats: str | None             # model slot 13
    regions: RegionSizes
    tensors: tuple[RknnTensor, ...]
    blobs: tuple[memoryview, ...] = field(compare=False, repr=False)
    blob_offsets: tuple[int, ...]          # file offset of each blob's first byte
    inputs: tuple[int, ...]                # graph slot 2: tensor indices
    outputs: tuple[int, ...]               # graph slot 3
    normalization: tuple[InputNormalization, ...]
    layers: tuple[RknnLayer, ...]
    relocations: tuple[RelocationEntry, ...]
    program: RknnProgram
    # a dynamic-shape build (guide 5.4, shape_mode "dynamic_shape") holds one graph per input shape
    # set: which one this model is, and every graph's input shapes (one tuple per input)
    graph_index: int = 0
    graph_shapes: tuple[tuple[tuple[int, ...], ...], ...] = ()

    def tensor(self, name: str) -> RknnTensor:
        for tensor in self.tensors:
            if tensor.name == name:
                return tensor
        raise KeyError(name)

    def blob(self, tensor: RknnTensor) -> memoryview | None:
        return None if tensor.blob_index is None else self.blobs[tensor.blob_index]

    @property
    def input_tensors(self) -> tuple[RknnTensor, ...]:
        return tuple(self.tensors[i] for i in self.inputs)

    @property
    def output_tensors(self) -> tuple[RknnTensor, ...]:
        return tuple(self.tensors[i] for i in self.outputs)
