"""Custom ops: a user's Python class registered for a compile (issue 25 item 5; guide 5.5,
``rknn.reg_custom_op``).

A custom op is a class importable as ``"module:Class"`` holding, as the vendor's does:

- ``op_type``: the node's op type in the ONNX model (a name no ONNX op has, e.g. ``cstSoftmax``);
  optional ``domain`` (default: any domain; set it to accept only nodes of that domain);
- ``shape_infer(self, node, in_shapes, in_dtypes) -> (out_shapes, out_dtypes)``: lists of shapes
  (lists of ints) and numpy dtypes, one per output;
- ``compute(self, node, inputs) -> outputs``: the float semantics on numpy arrays (a list, one
  array per output).

``node`` is not the vendor's ONNX NodeProto but a plain object with ``op_type``, ``name``,
``domain`` and ``attrs`` (a dict of the node's attributes): where the vendor's class reads
``get_node_attr(node, "axis")``, this one reads ``node.attrs["axis"]``. The emulator builds the
same object from the host step (emulator/cpu_ops.py), so the class runs unchanged there.

Registering one (``CompileOptions(custom_ops=...)``, ``npuemu compile --custom-op module:Class``)
adds an import rule to the op registry (ops/base.py): the node keeps its attributes plus
``custom_op`` (the "module:Class" text), shapes come from ``shape_infer``, constant folding and
calibration use ``compute``. No op-table row names it, so the partition sends it to the CPU and
the build writes a ``cpu`` step whose params carry ``custom_op``: the emulator imports that
class again to run it (it must be importable where the model file runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from npuemu.isa.custom_op import CUSTOM_OP_KEY, custom_node, import_class
from npuemu.isa.errors import ConfigError

from .base import REGISTRY, Canonical, NodeView, OpDef, TensorInfo



@dataclass(frozen=True)
class CustomOp:
    spec: str  # "module:Class"
    op_type: str
    domain: str | None
    instance: Any


#: op type -> the custom op registered under it (this process)
CUSTOM_OPS: dict[str, CustomOp] = {}


def load_class(spec: str) -> Any:
    """The class ``"module:Class"`` names, or a ConfigError naming the spec."""
    module_name, _, class_name = spec.partition(":")
    try:
        return import_class(spec)
    except ValueError:
        raise ConfigError(f"custom op {spec!r}: expected module:Class") from None
    except ImportError as error:
        raise ConfigError(f"custom op {spec!r}: cannot import module {module_name!r} ({error})") from None
    except AttributeError:
        raise ConfigError(f"custom op {spec!r}: module {module_name!r} has no {class_name!r}") from None


def register_custom_op(spec: str) -> CustomOp:
    """Import ``spec`` and register its op type for import, folding and calibration. Registering
    the same spec again is a no-op; an op type ONNX (or another custom op) has is refused."""
    instance = load_class(spec)()
    op_type = getattr(instance, "op_type", None)
    if not isinstance(op_type, str) or not op_type:
        raise ConfigError(f"custom op {spec!r}: the class needs an op_type string (the node's op type)")
    for method in ("shape_infer", "compute"):
        if not callable(getattr(instance, method, None)):
            raise ConfigError(f"custom op {spec!r}: the class needs a {method}() method (guide 5.5.3)")
    known = CUSTOM_OPS.get(op_type)
    if known is not None:
        if known.spec != spec:
            raise ConfigError(f"custom op {spec!r}: op type {op_type} is already registered by {known.spec}")
        return known
    if op_type in REGISTRY:
        raise ConfigError(f"custom op {spec!r}: op type {op_type} is a built-in op; custom op types must differ "
                          "(the vendor suggests a 'cst' prefix)")
    entry = CustomOp(spec, op_type, getattr(instance, "domain", None), instance)
    CUSTOM_OPS[op_type] = entry
    REGISTRY[op_type] = OpDef(op_type, _compute(entry), _infer(entry), _canonicalize(entry))
    return entry


def register_custom_ops(specs) -> list[CustomOp]:
    return [register_custom_op(spec) for spec in specs or ()]


def unregister_custom_op(op_type: str) -> None:
    """Forget a registered custom op (tests)."""
    if CUSTOM_OPS.pop(op_type, None) is not None:
        REGISTRY.pop(op_type, None)


def accepts(op_type: str, domain: str, specs=None) -> bool:
    """Whether a registered custom op takes a node of this type and domain (and, given ``specs``,
    is one of them: a compile accepts the custom ops it was given, not every one this process
    registered)."""
    entry = CUSTOM_OPS.get(op_type)
    return (entry is not None and (entry.domain is None or entry.domain == domain)
            and (specs is None or entry.spec in specs))


def _canonicalize(entry: CustomOp):
    def canonicalize(view: NodeView) -> Canonical:
        if view.node.domain not in ("", "ai.onnx") and entry.domain is not None and view.node.domain != entry.domain:
            raise view.fail(f"domain {view.node.domain!r}, the custom op {entry.spec} is of domain {entry.domain!r}")
        inputs = [name for name in view.input_names if name]
        return Canonical(dict(view.attrs) | {CUSTOM_OP_KEY: entry.spec}, inputs)
    return canonicalize


def _infer(entry: CustomOp):
    def infer(attrs: dict[str, Any], inputs: list[TensorInfo]) -> list[TensorInfo]:
        node = custom_node(entry.op_type, entry.op_type, attrs, entry.domain)
        result = entry.instance.shape_infer(node, [list(info.shape) for info in inputs],
                                            [np.dtype(info.dtype) for info in inputs])
        shapes, dtypes = result
        if len(shapes) != len(dtypes):
            raise ConfigError(f"custom op {entry.spec}: shape_infer returned {len(shapes)} shapes and "
                              f"{len(dtypes)} dtypes")
        return [TensorInfo.of(shape, dtype) for shape, dtype in zip(shapes, dtypes)]
    return infer


def _compute(entry: CustomOp):
    def compute(attrs: dict[str, Any], arrays: list[np.ndarray]) -> list[np.ndarray]:
        node = custom_node(entry.op_type, entry.op_type, attrs, entry.domain)
        outputs = entry.instance.compute(node, [np.asarray(array) for array in arrays])
        return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    return compute


__all__ = ["CUSTOM_OPS", "CUSTOM_OP_KEY", "CustomOp", "accepts", "custom_node", "load_class", "register_custom_op",
           "register_custom_ops", "unregister_custom_op"]
