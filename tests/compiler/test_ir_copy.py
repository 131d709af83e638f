"""Deep copies of the graph IR (compiler/ir_copy.py): what ``copy.deepcopy`` gives, without its
generic path (issue 20: compile time). Checked against an independent walk of both graphs, and
against ``copy.deepcopy``'s own result with the fast path switched off."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from npuemu.compiler import ir_copy
from npuemu.compiler.ir import FusedOp, Graph, Node, QuantParams, Tensor

_ATOMS = (str, int, float, bool, type(None))


def _same_structure(original, copied, seen: dict, path: str = "graph") -> None:
    """``copied`` equals ``original`` with every mutable object fresh and the original's sharing
    kept (an object reached twice maps to one copy)."""
    assert type(original) is type(copied), path
    if isinstance(original, _ATOMS):
        assert original == copied, path
        return
    if id(original) in seen:
        assert seen[id(original)] is copied, f"{path}: sharing lost"
        return
    seen[id(original)] = copied
    if isinstance(original, tuple):
        assert len(original) == len(copied), path
        for index, (a, b) in enumerate(zip(original, copied)):
            _same_structure(a, b, seen, f"{path}[{index}]")
        return
    assert original is not copied, f"{path}: not copied"
    if isinstance(original, np.ndarray):
        assert original.dtype == copied.dtype and np.array_equal(original, copied), path
    elif isinstance(original, list):
        assert len(original) == len(copied), path
        for index, (a, b) in enumerate(zip(original, copied)):
            _same_structure(a, b, seen, f"{path}[{index}]")
    elif isinstance(original, dict):
        assert list(original) == list(copied), path
        for key in original:
            _same_structure(original[key], copied[key], seen, f"{path}[{key!r}]")
    else:
        _same_structure(vars(original), vars(copied), seen, f"{path}.__dict__")


def _graph() -> Graph:
    weights = np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2)
    graph = Graph("g", source="test")
    graph.add_tensor(Tensor("x", (1, 3, 4, 4), "float32", quant=QuantParams("int8", 0.5, 3)))
    graph.add_tensor(Tensor("w", weights.shape, "float32", weights,
                            QuantParams("int8", np.ones(2, np.float32), np.zeros(2, np.int32), axis=0)))
    graph.add_tensor(Tensor("w_alias", weights.shape, "float32", weights))  # the same array twice
    graph.add_tensor(Tensor("y", (1, 2, 3, 3), "float32"))
    graph.add_tensor(Tensor("r", (1, 2, 3, 3), "float32"))
    graph.add_tensor(Tensor("z", (1, 2, 3, 3), "float32"))
    shared = [1, [2, 3]]
    conv = Node("conv", "Conv", ["x", "w"], ["y"], {"pads": [0, 0, 0, 0], "shape": (1, 2), "table": shared,
                                                   "nested": {"k": (1, [2]), "a": np.ones(3)}})
    conv.fused.append(FusedOp("Add", {"again": shared}, ["r"], carry_index=1, source="add0", tag="add"))
    conv.note = {"extra": [1.5]}  # an attribute a pass set on the instance
    graph.nodes += [Node("r", "Relu", ["x"], ["r"], target="NPU"), conv, Node("out", "Relu", ["y"], ["z"])]
    graph.inputs, graph.outputs, graph.opset = ["x"], ["z"], 17
    return graph


def test_a_graph_copy_is_fresh_equal_and_keeps_sharing():
    graph = _graph()
    copied = copy.deepcopy(graph)
    _same_structure(graph, copied, {})
    node = copied.nodes[1]
    assert node.attrs["table"] is node.fused[0].attrs["again"]  # shared in the original: shared here
    assert copied.tensors["w"].data is copied.tensors["w_alias"].data
    assert node.attrs["shape"] is graph.nodes[1].attrs["shape"]  # a tuple of numbers: kept, as deepcopy does
    node.inputs.append("q")
    node.attrs["table"][1].append(4)
    copied.tensors["w"].data[0, 0, 0, 0] = -1
    copied.tensors["w"].quant.scale[0] = 7
    assert graph.nodes[1].inputs == ["x", "w"] and graph.nodes[1].attrs["table"] == [1, [2, 3]]
    assert graph.tensors["w"].data[0, 0, 0, 0] == 0 and graph.tensors["w"].quant.scale[0] == 1


def test_the_fast_copy_equals_the_generic_deepcopy(monkeypatch):
    graph = _graph()
    fast = copy.deepcopy(graph)
    for cls in list(ir_copy._OBJECTS):
        monkeypatch.delattr(cls, "__deepcopy__")
    generic = copy.deepcopy(graph)
    _same_structure(generic, fast, {})
    assert vars(fast.nodes[1]).keys() == vars(generic.nodes[1]).keys()


def test_copies_inside_other_containers_share_one_memo():
    graph = _graph()
    node = graph.nodes[1]
    pair = copy.deepcopy({"graph": graph, "node": node, "tensor": graph.tensors["w"]})
    assert pair["node"] is pair["graph"].nodes[1]
    assert pair["tensor"] is pair["graph"].tensors["w"]
    assert pair["node"] is not node


@pytest.mark.parametrize("cls", [Graph, Node, Tensor, FusedOp, QuantParams])
def test_every_ir_class_is_registered(cls):
    assert cls in ir_copy._OBJECTS and cls.__deepcopy__ is ir_copy.copy_object


def test_node_equality_compares_every_field():
    """Node.__eq__ answers different names first (issue 20) but still compares every field."""
    import dataclasses

    base = dict(name="n", op_type="Conv", inputs=["x"], outputs=["y"], attrs={"k": [1]},
                fused=[FusedOp("Relu")], target="NPU")
    assert [f.name for f in dataclasses.fields(Node)] == list(base)
    other = {"name": "m", "op_type": "Relu", "inputs": ["z"], "outputs": ["w"], "attrs": {"k": [2]},
             "fused": [], "target": "CPU"}
    assert Node(**base) == Node(**copy.deepcopy(base))
    for field, value in other.items():
        assert Node(**base) != Node(**{**base, field: value}), field
    assert Node(**base) != "n" and Node(**base).__eq__("n") is NotImplemented
