"""The JSON trailer of a model file: strict encoding/decoding and schema validation.

The schema is deliberately open: unknown keys anywhere are kept and ignored, so the compiler
can record more than this module knows. What the schema defines (CONTAINER.md, "Trailer")
is checked for type, and schedule steps for their required keys, so that the emulator and
the reports can trust what they read. Messages name the JSON path, e.g.
``trailer.schedule[2].chain.tasks``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from npuemu.isa.errors import ModelFileError

Check = Callable[[Any, str], None]


class SchemaViolation(ModelFileError):
    """A trailer value has the wrong type or misses a required key (path in the message)."""


# --- encoding -------------------------------------------------------------------------------


def encode_trailer(trailer: Mapping[str, Any]) -> bytes:
    """UTF-8 JSON, key order kept; refuses NaN/Infinity and anything JSON cannot represent."""
    try:
        text = json.dumps(trailer, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as error:
        raise ModelFileError(f"trailer cannot be stored as JSON: {error}") from None


def decode_trailer(raw: bytes | memoryview) -> Any:
    """Parse trailer bytes as strict JSON (no duplicate keys, no non-finite numbers)."""
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ModelFileError(f"trailer is not valid UTF-8 ({error.reason} at byte {error.start})") from None
    try:
        return json.loads(
            text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant, parse_float=_finite_float
        )
    except json.JSONDecodeError as error:
        raise ModelFileError(f"trailer is not valid JSON: {error.msg} at character {error.pos}") from None
    except RecursionError:  # a hostile file nesting arrays ten thousand deep
        raise ModelFileError("trailer JSON is nested too deeply") from None
    except ValueError as error:  # from the hooks below, or int() digit limits
        raise ModelFileError(f"trailer is not valid JSON: {error}") from None


def canonical_trailer(trailer: Mapping[str, Any]) -> dict[str, Any]:
    """The trailer as it will read back from a file: tuples become lists, a deep copy."""
    decoded = decode_trailer(encode_trailer(trailer))
    if not isinstance(decoded, dict):
        raise ModelFileError(f"trailer must be a JSON object, got {_type_name(decoded)}")
    return decoded


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:  # two readers could disagree on which value wins
            raise ValueError(f"duplicate key {_short(key)}")
        result[key] = value
    return result


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e999 overflows to inf
        raise ValueError(f"number {text[:40]} is out of range")
    return value


# --- checks ---------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _fail(path: str, expected: str, value: Any) -> None:
    raise SchemaViolation(f"{path}: expected {expected}, got {_type_name(value)} {_short(value)}")


def text(value: Any, path: str) -> None:
    if not isinstance(value, str):
        _fail(path, "a string", value)


def integer(value: Any, path: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(path, "an integer", value)


def unsigned(value: Any, path: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        _fail(path, "a non-negative integer", value)


def number(value: Any, path: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        _fail(path, "a number", value)


def obj(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        _fail(path, "an object", value)


def anything(value: Any, path: str) -> None:
    """Any JSON value (free-form parts such as ``extra``)."""


def list_of(item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if not isinstance(value, list):
            _fail(path, "an array", value)
        for index, element in enumerate(value):
            item(element, f"{path}[{index}]")
    return check


def scalar_or_list(item: Check, description: str) -> Check:
    def check(value: Any, path: str) -> None:
        if isinstance(value, list):
            list_of(item)(value, path)
        else:
            try:
                item(value, path)
            except SchemaViolation:
                _fail(path, f"{description} or an array of them", value)
    return check


def record(required: dict[str, Check], optional: dict[str, Check] | None = None,
           extra_check: Check | None = None) -> Check:
    """An object with typed keys; keys not listed are allowed and left alone."""
    optional = optional or {}

    def check(value: Any, path: str) -> None:
        obj(value, path)
        for key, item in required.items():
            if key not in value:
                raise SchemaViolation(f"{path}: missing required key {key!r}")
            item(value[key], f"{path}.{key}")
        for key, item in optional.items():
            if key in value:
                item(value[key], f"{path}.{key}")
        if extra_check:
            extra_check(value, path)
    return check


def unique_names(value: list[dict[str, Any]], path: str) -> None:
    seen: set[str] = set()
    for index, element in enumerate(value):
        name = element["name"]
        if name in seen:
            raise SchemaViolation(f"{path}[{index}].name: duplicate name {_short(name)}")
        seen.add(name)


def _list_with_unique_names(item: Check) -> Check:
    def check(value: Any, path: str) -> None:
        list_of(item)(value, path)
        unique_names(value, path)
    return check


def _quantization_lengths(value: dict[str, Any], path: str) -> None:
    scale, zero_point = value.get("scale"), value.get("zero_point")
    if isinstance(scale, list) and isinstance(zero_point, list) and len(scale) != len(zero_point):
        raise SchemaViolation(
            f"{path}: per-channel scale has {len(scale)} entries but zero_point has {len(zero_point)}"
        )


def _step(value: Any, path: str) -> None:
    obj(value, path)
    if "kind" not in value:
        raise SchemaViolation(f"{path}: missing required key 'kind'")
    kind = value["kind"]
    if not isinstance(kind, str) or kind not in STEP_KINDS:
        _fail(f"{path}.kind", '"npu" or "cpu"', kind)
    STEP_KINDS[kind](value, path)


# --- the schema -----------------------------------------------------------------------------

FORMAT = record({}, {"name": text, "version": text})
PLATFORM = record({}, {"chip": text, "overrides": obj, "figures": obj})
COMPILER = record({}, {"version": text, "options": obj})
QUANTIZATION = record(
    {},
    {"scale": scalar_or_list(number, "a number"), "zero_point": scalar_or_list(integer, "an integer"),
     "axis": integer},
    _quantization_lengths,
)
#: layout of a tensor only host steps touch: row-major in its logical ``shape`` (the ONNX
#: layout, any rank), elements of ``dtype`` (one of ND_DTYPES), ``size`` >= the bytes it holds
ND_LAYOUT = "ND"
ND_DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
             "float16", "float32", "float64",
             "bfloat16", "int4", "uint4")  # ml_dtypes' types: 2, 1 and 1 byte per element


def _nd_tensor(value: dict[str, Any], path: str) -> None:
    if value.get("layout") != ND_LAYOUT:
        return
    if value.get("dtype") not in ND_DTYPES:
        _fail(f"{path}.dtype", f"one of {', '.join(ND_DTYPES)} for an {ND_LAYOUT} tensor", value.get("dtype"))
    if "shape" not in value:
        raise SchemaViolation(f"{path}: an {ND_LAYOUT} tensor needs its 'shape'")


#: a multi-batch graph input/output: slice i at ``addresses[i]``, also listed as tensor ``tensors[i]``
TENSOR_BATCH = record({"size": unsigned, "addresses": list_of(unsigned)}, {"tensors": list_of(text)})
#: a graph output the runtime hands out transposed by ``perm`` and reshaped to ``shape`` (CONTAINER.md 3.3)
TENSOR_READOUT = record({"perm": list_of(unsigned), "shape": list_of(unsigned)})
#: a graph input the runtime takes in ``shape``, transposed by ``perm`` before it is stored (CONTAINER.md 3.3)
TENSOR_READIN = TENSOR_READOUT
TENSOR = record(
    {"name": text},
    {"shape": list_of(unsigned), "dtype": text, "layout": text, "native_shape": list_of(unsigned),
     "c2": unsigned, "surface_stride": unsigned, "quantization": QUANTIZATION, "region": text,
     "address": unsigned, "size": unsigned, "batch": TENSOR_BATCH, "view_of": text, "readout": TENSOR_READOUT,
     "readin": TENSOR_READIN},
    _nd_tensor,
)
TASK_RANGE = record({"step": unsigned, "first": unsigned, "count": unsigned})
LAYER = record(
    {"id": integer},
    {"name": text, "op_type": text, "fused": list_of(text), "target": text, "inputs": list_of(text),
     "outputs": list_of(text), "tasks": list_of(TASK_RANGE)},
)
GRAPH = record({}, {"name": text, "inputs": list_of(text), "outputs": list_of(text), "layers": list_of(LAYER)})
MEMORY_REGION = record({"name": text, "base": unsigned, "size": unsigned})
MEMORY_AREA = record({"name": text, "size": unsigned}, {"region": text, "base": unsigned})
MEMORY_MAP = record(
    {}, {"regions": _list_with_unique_names(MEMORY_REGION), "areas": list_of(MEMORY_AREA)}
)
CHAIN = record({"section": text, "offset": unsigned, "first_amount": unsigned, "tasks": unsigned})
NPU_STEP = record({"core": unsigned, "chain": CHAIN}, {"layers": list_of(integer), "group": unsigned})
CPU_STEP = record(
    {"op": text, "inputs": list_of(text), "outputs": list_of(text)},
    {"params": obj, "layers": list_of(integer)},
)
STEP_KINDS: dict[str, Check] = {"npu": NPU_STEP, "cpu": CPU_STEP}
TRAILER = record(
    {},
    {"format": FORMAT, "platform": PLATFORM, "compiler": COMPILER, "graph": GRAPH,
     "tensors": _list_with_unique_names(TENSOR), "memory_map": MEMORY_MAP,
     "schedule": list_of(_step), "extra": obj,
     "batch": record({"size": unsigned, "contexts": unsigned})},
)


def validate_trailer(trailer: Any) -> None:
    """Raise :class:`SchemaViolation` naming the first value that breaks the schema."""
    TRAILER(trailer, "trailer")
