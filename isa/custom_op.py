"""The custom-op calling convention shared by the compiler and the runtime (guide 5.5).

A custom op's host step carries ``custom_op: "module:Class"`` in its params (the compiler writes
it, compiler/ops/custom.py); the class is imported where the model runs and called with a
``node`` namespace (op_type, name, domain, attrs) and the float inputs.
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

CUSTOM_OP_KEY = "custom_op"  # the host step's param naming the class


def import_class(spec: str) -> Any:
    """The class ``"module:Class"`` names (a dotted name inside the module allowed). Raises
    ValueError for a spec without both parts, ImportError or AttributeError as Python does."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"expected module:Class, got {spec!r}")
    found = importlib.import_module(module_name)
    for part in class_name.split("."):
        found = getattr(found, part)
    return found


def custom_node(op_type: str, name: str, attrs: dict[str, Any], domain: str | None = None) -> SimpleNamespace:
    """The ``node`` argument of shape_infer/compute: the attributes without the class spec."""
    plain = {key: value for key, value in attrs.items() if key != CUSTOM_OP_KEY}
    return SimpleNamespace(op_type=op_type, name=name, domain=domain or "", attrs=plain)
