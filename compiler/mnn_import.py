"""MNN model files (.mnn) -> an ONNX model the ONNX importer takes, without MNN's runtime.

An .mnn file is one FlatBuffers buffer whose root table is ``MNN.Net`` (layout walked through
in ../shared/seeds/mnn_flatbuffer_layout_zh.md; field ids in ``mnn_schema``). The reader below
parses it by hand: a little-endian uoffset to the root table, each table a soffset back to its
vtable of uint16 field offsets, vectors and strings a uint32 length then the data. Every read
is bounds-checked, so a damaged or hostile file gives one ModelFileError naming the offset,
never a crash or an allocation larger than the file.

The graph is then written as ONNX nodes (opset 14) with the weights as initializers, and the
ONNX importer takes it from there: both paths share folding, fusion and partition. MNN's
NC4HW4 layout is a storage detail of a tensor whose logical dims are NCHW, so ConvertTensor
between NCHW and NC4HW4 is an Identity; conversions to or from NHWC are Transposes. MNN's
integer tensors (shape arithmetic the converter writes out) become int64 as ONNX's shape ops
need; the importer folds them away. The per-op mappings are in ``mnn_ops``; an op they do not
cover is refused with its type and node name.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npuemu.compiler import mnn_schema as S
from npuemu.compiler.mnn_ops import MAPPINGS as _MAPPINGS
from npuemu.isa.errors import ModelFileError, UnsupportedOpError

OPSET = 14  # HardSwish (MNN UnaryOp 31) needs 14; Squeeze/Unsqueeze/ReduceSum take axes as inputs as in 13


# ---- 1. the FlatBuffers reader ---------------------------------------------------------------

class _Buffer:
    """The file's bytes with bounds-checked little-endian reads."""

    def __init__(self, data: bytes, source: str):
        self.data, self.source = data, source

    def fail(self, offset: int, what: str) -> ModelFileError:
        return ModelFileError(f"{self.source}: not a readable MNN model: {what} at offset {offset}")

    def read(self, fmt: str, offset: int, what: str = "value"):
        size = struct.calcsize(fmt)
        if offset < 0 or offset + size > len(self.data):
            raise self.fail(offset, f"{what} outside the file ({len(self.data)} bytes)")
        return struct.unpack_from("<" + fmt, self.data, offset)[0]

    def table(self, offset: int) -> _Table:
        vtable = offset - self.read("i", offset, "table")
        size = self.read("H", vtable, "vtable")
        if size < 4 or size % 2 or vtable + size > len(self.data):
            raise self.fail(vtable, f"vtable of size {size}")
        return _Table(self, offset, vtable, size)

    def vector(self, offset: int, element: int) -> tuple[int, int]:
        """(start, count) of the vector at ``offset`` whose elements are ``element`` bytes."""
        count = self.read("I", offset, "vector length")
        start = offset + 4
        if start + count * element > len(self.data):
            raise self.fail(offset, f"vector of {count} x {element} bytes runs past the end")
        return start, count


class _Table:
    """One FlatBuffers table: fields by id, absent fields give the default."""

    def __init__(self, buf: _Buffer, offset: int, vtable: int, vtable_size: int):
        self.buf, self.offset, self.vtable, self.vtable_size = buf, offset, vtable, vtable_size

    def _field(self, field_id: int) -> int:
        slot = 4 + 2 * field_id
        if slot + 2 > self.vtable_size:
            return 0
        return self.buf.read("H", self.vtable + slot, "vtable slot")

    def scalar(self, field_id: int, fmt: str = "i", default=0):
        where = self._field(field_id)
        return default if not where else self.buf.read(fmt, self.offset + where, "field")

    def _target(self, field_id: int) -> int | None:
        where = self._field(field_id)
        if not where:
            return None
        at = self.offset + where
        return at + self.buf.read("I", at, "offset")

    def table(self, field_id: int) -> _Table | None:
        target = self._target(field_id)
        return None if target is None else self.buf.table(target)

    def array(self, field_id: int, dtype: str) -> np.ndarray:
        """A vector of scalars as a numpy array (a view of the file's bytes)."""
        target = self._target(field_id)
        kind = np.dtype(dtype).newbyteorder("<")
        if target is None:
            return np.zeros(0, kind)
        start, count = self.buf.vector(target, kind.itemsize)
        return np.frombuffer(self.buf.data, kind, count, start)

    def string(self, field_id: int) -> str | None:
        target = self._target(field_id)
        return None if target is None else _string_at(self.buf, target)

    def _offsets(self, field_id: int) -> list[int]:
        target = self._target(field_id)
        if target is None:
            return []
        start, count = self.buf.vector(target, 4)
        return [start + 4 * i + self.buf.read("I", start + 4 * i) for i in range(count)]

    def strings(self, field_id: int) -> list[str]:
        return [_string_at(self.buf, at) for at in self._offsets(field_id)]

    def tables(self, field_id: int) -> list[_Table]:
        return [self.buf.table(at) for at in self._offsets(field_id)]


def _string_at(buf: _Buffer, offset: int) -> str:
    start, count = buf.vector(offset, 1)
    try:
        return buf.data[start:start + count].decode("utf-8")
    except UnicodeDecodeError:
        raise buf.fail(offset, "string that is not UTF-8") from None


# ---- 2. the graph: MNN ops -> ONNX nodes -------------------------------------------------------

class _Op:
    """One MNN op as the mapping functions see it."""

    def __init__(self, table: _Table, net: _Converter):
        self.table, self.net = table, net
        self.type = S.OP_TYPES.get(table.scalar(S.OP["type"]), f"OpType {table.scalar(S.OP['type'])}")
        self.name = table.string(S.OP["name"]) or ""
        self.inputs = [net.tensor(i) for i in table.array(S.OP["inputIndexes"], "i4")]
        self.outputs = [net.tensor(i) for i in table.array(S.OP["outputIndexes"], "i4")]
        self.main_type = table.scalar(S.OP["main_type"], "B")

    def param(self, kind: str) -> _Table | None:
        """The op's parameter table, which must be of union member ``kind`` if present."""
        if self.main_type == S.PARAMS["NONE"]:
            return None
        if self.main_type != S.PARAMS[kind]:
            raise self.net.buf.fail(self.table.offset, f"op '{self.name}' ({self.type}) has parameter "
                                                       f"type {self.main_type}, expected {kind}")
        return self.table.table(S.OP["main"])

    def refuse(self, why: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.net.buf.source}: MNN op '{self.name}' ({self.type}): {why}")


class _Converter:
    """Builds the ONNX graph op by op (MNN's op list is already in execution order)."""

    def __init__(self, buf: _Buffer):
        self.buf = buf
        self.net = buf.table(buf.read("I", 0, "root offset"))
        self.names = _unique(self.net.strings(S.NET["tensorName"]))
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.constants: dict[str, np.ndarray] = {}  # Const ops' values, for attributes read at conversion
        self._fresh = 0
        self._node_names: set[str] = set()

    def tensor(self, index: int) -> str:
        if not 0 <= index < len(self.names):
            raise self.buf.fail(self.net.offset, f"tensor index {index} (the net has {len(self.names)})")
        return self.names[index]

    def temp(self, hint: str) -> str:
        self._fresh += 1
        return f"{hint}__mnn{self._fresh}"

    def node(self, op_type: str, inputs: list[str], outputs: list[str], name: str = "", **attrs) -> None:
        name = name or outputs[0]
        if name in self._node_names:  # one MNN op may become several nodes: ONNX wants unique names
            name = self.temp(name)
        self._node_names.add(name)
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))

    def const(self, value: np.ndarray, hint: str) -> str:
        name = self.temp(hint)
        self.initializers.append(numpy_helper.from_array(np.array(value, order="C"), name))
        self.constants[name] = np.asarray(value)
        return name

    def const_value(self, op: _Op, index: int) -> np.ndarray:
        if index >= len(op.inputs) or op.inputs[index] not in self.constants:
            raise op.refuse(f"input {index} must be a constant")
        return self.constants[op.inputs[index]]

    def model(self) -> onnx.ModelProto:
        if self.net.tables(S.NET["subgraphs"]):
            raise UnsupportedOpError(f"{self.buf.source}: MNN subgraphs (control flow) are not supported")
        for table in self.net.tables(S.NET["oplists"]):
            op = _Op(table, self)
            mapping = _MAPPINGS.get(op.type)
            if mapping is None:
                raise op.refuse("not supported by the MNN reader (the mapped ops are in compiler/mnn_ops.py)")
            if not op.outputs:
                raise self.buf.fail(table.offset, f"op '{op.name}' ({op.type}) without outputs")
            try:
                mapping(self, op)
            except (IndexError, ValueError) as error:  # a damaged file's operand counts or array sizes
                raise self.buf.fail(table.offset, f"op '{op.name}' ({op.type}) whose operands do not fit "
                                                  f"together ({str(error).splitlines()[0] if str(error) else type(error).__name__})") from None
        self.nodes = _fold_prelu(self.nodes, self.constants)
        outputs = self.net.strings(S.NET["outputName"]) or self._unread_tensors()
        graph = helper.make_graph(self.nodes, self.buf.source, self.inputs,  # errors name the file
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                                  self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="npuemu-mnn")
        model.ir_version = 8
        return model

    def _unread_tensors(self) -> list[str]:
        read = {name for node in self.nodes for name in node.input}
        return [out for node in self.nodes for out in node.output if out not in read]


def _fold_prelu(nodes: list[onnx.NodeProto], constants: dict[str, np.ndarray]) -> list[onnx.NodeProto]:
    """MNN's converter writes ONNX PRelu as x * Select(x < 0, slope, 1) (Identity layout
    conversions in between): give it back as one PRelu, the same function, which the NPU path
    fuses where the Less/Where pair would be host steps. The bypassed nodes are left dead."""
    alias = {node.output[0]: node.input[0] for node in nodes  # a damaged file may leave an Identity bare
             if node.op_type == "Identity" and len(node.input) == 1 and len(node.output) == 1}

    def root(name: str) -> str:
        while name in alias:
            name = alias[name]
        return name

    producer = {out: node for node in nodes for out in node.output}

    def constant(name: str, value: float) -> bool:
        return name in constants and constants[name].size > 0 and bool(np.all(constants[name] == value))

    def slope_of(mul: onnx.NodeProto, x: str, gate: str) -> str | None:
        select = producer.get(root(gate))
        if select is None or select.op_type != "Where" or len(select.input) != 3 or not constant(select.input[2], 1.0) \
                or select.input[1] not in constants:
            return None
        less = producer.get(root(select.input[0]))
        if less is None or less.op_type != "Less" or len(less.input) != 2 or not constant(less.input[1], 0.0) or root(less.input[0]) != root(x):
            return None
        return select.input[1]

    result = []
    for node in nodes:
        if node.op_type == "Mul" and len(node.input) == 2:
            for x, gate in (node.input, node.input[::-1]):
                slope = slope_of(node, x, gate)
                if slope is not None:
                    node = helper.make_node("PRelu", [x, slope], list(node.output), name=node.name)
                    break
        result.append(node)
    return result


def _unique(names: list[str]) -> list[str]:
    seen: set[str] = set()
    result = []
    for i, name in enumerate(names):
        name = name or f"tensor{i}"
        while name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        result.append(name)
    return result


def mnn_to_onnx(path: str | Path) -> onnx.ModelProto:
    """The ONNX model equivalent to the MNN model file at ``path`` (refuses unmapped ops)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such MNN file")
    data = path.read_bytes()
    if len(data) < 8:
        raise ModelFileError(f"{path}: not a readable MNN model: {len(data)} bytes")
    return _Converter(_Buffer(data, str(path))).model()


def is_mnn_path(model) -> bool:
    return isinstance(model, (str, Path)) and str(model).lower().endswith(".mnn")

