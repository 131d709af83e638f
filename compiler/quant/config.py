"""The per-layer quantization config (hybrid quantization, SDK guide 6.3).

Step 1, ``npuemu quant-config MODEL -t CHIP --dataset ds.txt -o cfg.yaml``, calibrates and
writes this file; the user edits it; step 2, ``npuemu compile MODEL --quant-config cfg.yaml``,
builds from it without a dataset. The file (``version: 1``)::

    version: 1
    model: net.onnx
    target: rk3588
    algorithm: normal            # how the ranges were found (information)
    weights: per-channel         # or per-layer
    weight_clipping: minmax      # or mmse
    inputs:
      "x":
        preprocess: {mean: [0.0], std: [255.0], bgr: false}
        quant: {min: 0.0, max: 1.0, scale: 0.00392156886, zero_point: -128}
    layers:
      "conv1":
        op: Conv+Relu
        dtype: int8              # or float16
        outputs:
          "c1": {min: 0.0, max: 5.25, scale: 0.0205882359, zero_point: -128}
      "pool1":
        op: MaxPool
        dtype: int8
        outputs:
          "p1": {shares: "c1"}

A tensor entry gives a clipping range ``min``/``max`` (min <= 0 <= max: 0 must stay exactly
representable), from which scale and zero point are derived; the written ``scale`` and
``zero_point`` are there to read. Edit ``min``/``max``, or give ``scale``/``zero_point`` alone;
if both pairs are present they must agree. ``shares: T`` means "no range of its own: use T's"
(tensors that must share parameters, sharing.py); a tensor in a sharing group is quantized
with the union of its group's ranges. Layers are the nodes of the fused graph, named as in
``npuemu compile --dump-ir``; every layer and every tensor must be present, so a config written
for another model (or another version of the passes) is refused, not half applied.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from npuemu.isa.errors import ConfigError

from ..ir import Graph, Node
from .affine import Range, affine_params
from .calibrate import is_float_tensor
from .islands import island_dtype
from .preprocess import InputPreprocess, preprocess_from_plain
from .quantize import INT8, LAYER_DTYPES, WEIGHT_CLIPPING
from .sharing import sharing_groups

VERSION = 1
WEIGHT_METHODS = {"per-channel": True, "per-layer": False}
TOP_KEYS = ("version", "model", "target", "algorithm", "weights", "weight_clipping", "inputs", "layers")
INPUT_KEYS = ("preprocess", "quant")
LAYER_KEYS = ("op", "dtype", "outputs")
TENSOR_KEYS = ("min", "max", "scale", "zero_point", "shares")
MAX_CONFIG_BYTES = 64 * 1024 * 1024


@dataclass
class QuantConfig:
    """A quantization config, as written or as read and checked against a graph."""

    layer_dtypes: dict[str, str]
    ranges: dict[str, Range]  # tensors with a range of their own
    shares: dict[str, str] = field(default_factory=dict)  # tensor -> tensor whose range it uses
    preprocess: dict[str, InputPreprocess] = field(default_factory=dict)
    per_channel: bool = True
    weight_clipping: str = "minmax"
    algorithm: str | None = None
    model: str = ""
    target: str = ""

    def tensor_ranges(self) -> dict[str, Range]:
        """A range for every tensor: its own, or the one it shares (followed to the end)."""
        result = dict(self.ranges)
        for name in self.shares:
            result[name] = self.ranges[self._resolve(name)]
        return result

    def _resolve(self, name: str) -> str:
        seen = {name}
        while name in self.shares:
            name = self.shares[name]
            if name in seen:
                raise ConfigError(f"'shares' entries form a cycle through tensor '{name}'")
            seen.add(name)
        return name


# ---- building and writing -------------------------------------------------------------------

def config_from_ranges(graph: Graph, ranges: Mapping[str, Range], *, layer_dtypes: Mapping[str, str] | None = None,
                       preprocess: Mapping[str, InputPreprocess] | None = None, per_channel: bool = True,
                       weight_clipping: str = "minmax", algorithm: str | None = None, model: str = "",
                       target: str = "") -> QuantConfig:
    """A config for ``graph`` (unquantized) from calibrated ranges: every layer int8 unless
    ``layer_dtypes`` says otherwise; members of a sharing group write ``shares: <anchor>`` and
    the anchor the union of the group."""
    dtypes = {node.name: (layer_dtypes or {}).get(node.name, island_dtype(node) or INT8) for node in graph.nodes}
    anchors = sharing_groups(graph, dtypes, ranges)
    own: dict[str, Range] = {}
    shares: dict[str, str] = {}
    for name in _activation_names(graph):
        anchor = anchors.get(name, name)
        if anchor != name:
            shares[name] = anchor
        elif name in ranges:
            group = [member for member, owner in anchors.items() if owner == name] or [name]
            union = ranges[name]
            for member in group:
                if member in ranges:
                    union = union.union(ranges[member])
                elif graph.tensors[member].is_const:
                    data = np.asarray(graph.tensors[member].data, dtype=np.float64)
                    union = union.union(Range(float(data.min()), float(data.max())))
            own[name] = union.including_zero()
    missing = [name for name in _activation_names(graph) if name not in own and name not in shares]
    if missing:
        raise ConfigError(f"no calibrated range for tensor(s) {missing[:5]}")
    return QuantConfig(dtypes, own, shares, dict(preprocess or {}), per_channel, weight_clipping, algorithm, model, target)


def _activation_names(graph: Graph) -> list[str]:
    names = [name for name in graph.inputs if is_float_tensor(graph.tensors[name])]
    for node in graph.nodes:
        names += [name for name in node.outputs if is_float_tensor(graph.tensors[name])]
    return list(dict.fromkeys(names))


def dump_config(config: QuantConfig, graph: Graph) -> str:
    """The YAML text of ``config`` for ``graph`` (layers in execution order)."""
    lines = [
        "# npuemu quantization config (hybrid quantization). Edit a layer's dtype (int8 or float16)",
        "# or a tensor's min/max clipping range (min <= 0 <= max), then build with",
        "#   npuemu compile MODEL --quant-config THIS_FILE",
        "# scale/zero_point follow from min/max: edit one pair and delete the other.",
        "# 'shares: T' = the tensor uses T's parameters (pooling, reshapes, concat by address).",
        f"version: {VERSION}",
        f"model: {_quote(config.model)}",
        f"target: {_quote(config.target)}",
        f"algorithm: {_quote(config.algorithm or '')}",
        f"weights: {'per-channel' if config.per_channel else 'per-layer'}",
        f"weight_clipping: {config.weight_clipping}",
        "inputs:",
    ]
    for name in graph.inputs:
        if not is_float_tensor(graph.tensors[name]):
            continue
        preprocess = config.preprocess.get(name, InputPreprocess()).to_plain()
        lines += [f"  {_quote(name)}:",
                  f"    preprocess: {{mean: {_numbers(preprocess['mean'])}, std: {_numbers(preprocess['std'])}, "
                  f"bgr: {'true' if preprocess['bgr'] else 'false'}}}",
                  f"    quant: {_tensor_entry(config, name)}"]
    lines.append("layers:")
    for node in graph.nodes:
        lines += [f"  {_quote(node.name)}:", f"    op: {_quote(node.display_op)}",
                  f"    dtype: {config.layer_dtypes.get(node.name, INT8)}"]
        outputs = [name for name in node.outputs if is_float_tensor(graph.tensors[name])]
        if outputs:
            lines.append("    outputs:")
            lines += [f"      {_quote(name)}: {_tensor_entry(config, name)}" for name in outputs]
    return "\n".join(lines) + "\n"


def write_config(config: QuantConfig, graph: Graph, path: Path | str) -> None:
    try:
        Path(path).write_text(dump_config(config, graph), encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror}") from None


def _layer_names_hint(name: str, layers: list[str]) -> str:
    """The way out of a layer name the model lacks: the nearest names, else the first few."""
    import difflib

    near = difflib.get_close_matches(name, layers, n=3, cutoff=0.6)
    shown = near or layers[:8]
    more = "" if near or len(layers) <= len(shown) else f" ... ({len(layers)} layers)"
    return (f"{'the nearest names' if near else 'a layer name'}: {', '.join(shown)}{more}; or write the config "
            "again with `npuemu quant-config` at the same -O level")


def _tensor_entry(config: QuantConfig, name: str) -> str:
    if name in config.shares:
        return f"{{shares: {_quote(config.shares[name])}}}"
    value = config.ranges[name]
    scale, zero_point = affine_params(value.lo, value.hi)
    return (f"{{min: {_number(value.lo)}, max: {_number(value.hi)}, scale: {_number(float(scale), 9)}, "
            f"zero_point: {zero_point}}}")


def _quote(text: str) -> str:
    return json.dumps(str(text))  # a JSON string is a valid YAML double-quoted scalar


def _number(value: float, digits: int | None = None) -> str:
    value = float(value)
    text = repr(value) if digits is None else f"{value:.{digits}g}"
    return "0.0" if text == "-0.0" else text


def _numbers(values: list[float]) -> str:
    return "[" + ", ".join(_number(value) for value in values) + "]"


# ---- reading --------------------------------------------------------------------------------

class _Located(dict):
    """A mapping read from YAML that remembers the line of itself and of each key."""

    line: int = 0
    lines: dict


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode):
    data = _Located()
    data.line = node.start_mark.line + 1
    data.lines = {}
    yield data
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in data
        except TypeError:
            raise yaml.constructor.ConstructorError(None, None, f"unhashable key {key!r}", key_node.start_mark) from None
        if duplicate:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        data[key] = loader.construct_object(value_node, deep=True)
        data.lines[key] = key_node.start_mark.line + 1


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


class _Reader:
    """Checks one config file against one graph; every error names the file, line and key path."""

    def __init__(self, path: Path, graph: Graph):
        self.path, self.graph = path, graph

    def fail(self, line: int, keys: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: line {line}: {keys}: {problem}")

    def mapping(self, value: Any, line: int, keys: str) -> _Located:
        if not isinstance(value, _Located):
            raise self.fail(line, keys, f"expected a mapping, got {_kind(value)}")
        return value

    def known_keys(self, data: _Located, allowed: tuple[str, ...], keys: str) -> None:
        for key in data:
            if key not in allowed:
                raise self.fail(data.lines[key], f"{keys}.{key}" if keys else str(key),
                                f"unknown key; expected one of {', '.join(allowed)}")

    def read(self, text: str) -> QuantConfig:
        try:
            data = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark or error.context_mark
            line = mark.line + 1 if mark else 0
            raise ConfigError(f"{self.path}: line {line}: invalid YAML: {error.problem or error.context}") from None
        except yaml.YAMLError as error:
            raise ConfigError(f"{self.path}: invalid YAML: {error}") from None
        top = self.mapping(data, 1, "(top level)")
        self.known_keys(top, TOP_KEYS, "")
        for key in ("version", "layers"):
            if key not in top:
                raise self.fail(top.line, key, "missing; this does not look like an npuemu quant config")
        if top["version"] != VERSION:
            raise self.fail(top.lines["version"], "version", f"{top['version']!r} is not supported; expected {VERSION}")
        weights = top.get("weights", "per-channel")
        if weights not in WEIGHT_METHODS:
            raise self.fail(top.lines.get("weights", top.line), "weights",
                            f"{weights!r}; expected one of {', '.join(WEIGHT_METHODS)}")
        clipping = top.get("weight_clipping", "minmax")
        if clipping not in WEIGHT_CLIPPING:
            raise self.fail(top.lines.get("weight_clipping", top.line), "weight_clipping",
                            f"{clipping!r}; expected one of {', '.join(WEIGHT_CLIPPING)}")
        config = QuantConfig({}, {}, per_channel=WEIGHT_METHODS[weights], weight_clipping=clipping,
                             algorithm=str(top.get("algorithm") or "") or None, model=str(top.get("model") or ""),
                             target=str(top.get("target") or ""))
        self.read_inputs(top.get("inputs") or _Located(), top.lines.get("inputs", top.line), config)
        self.read_layers(top["layers"], top.lines["layers"], config)
        self.check_complete(top, config)
        return config

    def read_inputs(self, data: Any, line: int, config: QuantConfig) -> None:
        inputs = self.mapping(data, line, "inputs")
        for name, entry in inputs.items():
            keys = f"inputs.{name}"
            if name not in self.graph.inputs or not is_float_tensor(self.graph.tensors[name]):
                floats = [n for n in self.graph.inputs if is_float_tensor(self.graph.tensors[n])]
                raise self.fail(inputs.lines[name], keys, f"the model has no float input of that name; its inputs are {floats}")
            entry = self.mapping(entry, inputs.lines[name], keys)
            self.known_keys(entry, INPUT_KEYS, keys)
            if "preprocess" in entry:
                where = f"{self.path}: line {entry.lines['preprocess']}: {keys}.preprocess"
                plain = self.mapping(entry["preprocess"], entry.lines["preprocess"], f"{keys}.preprocess")
                self.known_keys(plain, ("mean", "std", "bgr"), f"{keys}.preprocess")
                preprocess = preprocess_from_plain(plain, where)
                shape = self.graph.tensors[name].shape
                if len(shape) >= 2:
                    preprocess.check_channels(shape[1], where)
                config.preprocess[name] = preprocess
            if "quant" in entry:
                self.read_tensor(name, entry["quant"], entry.lines["quant"], f"{keys}.quant", config)

    def read_layers(self, data: Any, line: int, config: QuantConfig) -> None:
        layers = self.mapping(data, line, "layers")
        nodes = {node.name: node for node in self.graph.nodes}
        for name, entry in layers.items():
            keys = f"layers.{name}"
            node = nodes.get(name)
            if node is None:
                raise self.fail(layers.lines[name], keys, "no layer of that name in the model (layer names are those "
                                "of `npuemu compile --dump-ir`, after fusion at the -O level compiled with); try: "
                                + _layer_names_hint(name, list(nodes)))
            entry = self.mapping(entry, layers.lines[name], keys)
            self.known_keys(entry, LAYER_KEYS, keys)
            if "op" in entry and entry["op"] != node.display_op:
                raise self.fail(entry.lines["op"], f"{keys}.op", f"{entry['op']!r} does not match the model's layer "
                                f"({node.display_op}); the config was written for another model or compiler version")
            dtype = entry.get("dtype")
            if dtype not in LAYER_DTYPES:
                raise self.fail(entry.lines.get("dtype", entry.line), f"{keys}.dtype",
                                f"{dtype!r}; expected one of {', '.join(LAYER_DTYPES)}")
            config.layer_dtypes[name] = dtype
            self.read_outputs(node, entry, keys, config)

    def read_outputs(self, node: Node, entry: _Located, keys: str, config: QuantConfig) -> None:
        outputs = [name for name in node.outputs if is_float_tensor(self.graph.tensors[name])]
        if not outputs:
            if "outputs" in entry:
                raise self.fail(entry.lines["outputs"], f"{keys}.outputs", "this layer has no float output to quantize")
            return
        if "outputs" not in entry:
            raise self.fail(entry.line, f"{keys}.outputs", f"missing; expected ranges for {outputs}")
        given = entry["outputs"]
        if given is None:  # "outputs:" with every entry deleted or commented out
            given = _Located()
            given.line, given.lines = entry.lines["outputs"], {}
        given = self.mapping(given, entry.lines["outputs"], f"{keys}.outputs")
        for name, value in given.items():
            if name not in outputs:
                raise self.fail(given.lines[name], f"{keys}.outputs.{name}", f"not an output of this layer; its outputs are {outputs}")
            self.read_tensor(name, value, given.lines[name], f"{keys}.outputs.{name}", config)
        for name in outputs:
            if name not in given:
                raise self.fail(given.line, f"{keys}.outputs", f"missing tensor '{name}'")

    def read_tensor(self, name: str, value: Any, line: int, keys: str, config: QuantConfig) -> None:
        entry = self.mapping(value, line, keys)
        self.known_keys(entry, TENSOR_KEYS, keys)
        if "shares" in entry:
            if len(entry) != 1:
                raise self.fail(entry.lines["shares"], keys, "'shares' stands alone (the shared tensor's range is used)")
            config.shares[name] = str(entry["shares"])
            return
        numbers = {key: self.number(entry, key, keys) for key in ("min", "max", "scale", "zero_point") if key in entry}
        has_range, has_params = {"min", "max"} <= numbers.keys(), {"scale", "zero_point"} <= numbers.keys()
        for pair in (("min", "max"), ("scale", "zero_point")):
            if (pair[0] in numbers) != (pair[1] in numbers):
                present = pair[0] if pair[0] in numbers else pair[1]
                raise self.fail(entry.lines[present], keys, f"'{present}' needs its partner '{(set(pair) - {present}).pop()}'")
        if not has_range and not has_params:
            raise self.fail(line, keys, "expected min/max (or scale/zero_point, or shares)")
        if has_range:
            lo, hi = numbers["min"], numbers["max"]
            if not lo <= 0 <= hi or lo == hi:
                raise self.fail(entry.lines["min"], keys, f"min {lo} / max {hi}: expected min <= 0 <= max and "
                                "min < max (0 must be exactly representable)")
        if has_params:
            scale, zero_point = numbers["scale"], numbers["zero_point"]
            if not scale > 0 or zero_point != int(zero_point) or not -128 <= zero_point <= 127:
                raise self.fail(entry.lines["scale"], keys, f"scale {scale} / zero_point {zero_point}: expected "
                                "scale > 0 and an integer zero_point in -128..127")
            from_params = Range(scale * (-128 - zero_point), scale * (127 - zero_point))
            if has_range and not _agree(Range(lo, hi), scale, int(zero_point)):
                derived = affine_params(lo, hi)
                raise self.fail(entry.lines["scale"], keys, f"scale/zero_point {scale:.9g}/{int(zero_point)} do not "
                                f"match min/max (which give {float(derived[0]):.9g}/{derived[1]}); edit one pair and "
                                "delete the other")
            config.ranges[name] = Range(lo, hi) if has_range else from_params
        else:
            config.ranges[name] = Range(lo, hi)

    def number(self, entry: _Located, key: str, keys: str) -> float:
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(entry.lines[key], f"{keys}.{key}", f"{value!r}; expected a finite number")
        return float(value)

    def check_complete(self, top: _Located, config: QuantConfig) -> None:
        missing_layers = [node.name for node in self.graph.nodes if node.name not in config.layer_dtypes]
        if missing_layers:
            raise self.fail(top.lines["layers"], "layers", f"missing layer(s) {missing_layers[:5]}"
                            + (f" and {len(missing_layers) - 5} more" if len(missing_layers) > 5 else "")
                            + "; every layer of the model must be listed")
        floats = [name for name in self.graph.inputs if is_float_tensor(self.graph.tensors[name])]
        for name in floats:
            if name not in config.ranges and name not in config.shares:
                raise self.fail(top.lines.get("inputs", top.line), f"inputs.{name}.quant", "missing")
        known = set(config.ranges) | set(config.shares)
        for name, target in config.shares.items():
            if target not in known:
                raise ConfigError(f"{self.path}: tensor '{name}' shares '{target}', which has no entry in the config")
        config.tensor_ranges()  # raises on a cycle


def _agree(value: Range, scale: float, zero_point: int) -> bool:
    derived_scale, derived_zero_point = affine_params(value.lo, value.hi)
    return abs(float(derived_scale) - scale) <= 1e-6 * scale and derived_zero_point == zero_point


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


def read_config(path: Path | str, graph: Graph) -> QuantConfig:
    """Read and check a config against ``graph`` (unquantized, after the same passes)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such quant config file")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: {path.stat().st_size} bytes is too large for a quant config")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: expected UTF-8 text, found byte {error.start}: {error.reason}") from None
    return _Reader(path, graph).read(text)
