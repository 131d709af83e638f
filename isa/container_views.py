"""Typed, read-only views of a validated trailer (see CONTAINER.md, "Trailer").

Each ``from_json`` (and ``step_from_json``) takes a part of a trailer that passed
``validate_trailer`` and returns frozen dataclasses; an absent optional part reads as empty
or None, never as an error, so a minimal file with an empty graph is still fully readable.
Keys the schema does not define stay available in the raw trailer dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _ints(values: list[int] | None) -> tuple[int, ...] | None:
    return None if values is None else tuple(values)


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, list) else (value,)


@dataclass(frozen=True)
class Quantization:
    """Affine quantization: real = scale * (q - zero_point); per-channel along ``axis``."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None
    per_channel: bool = False

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Quantization:
        scale, zero_point = value.get("scale", 1.0), value.get("zero_point", 0)
        per_channel = isinstance(scale, list) or isinstance(zero_point, list)
        return cls(_as_tuple(scale), _as_tuple(zero_point), value.get("axis"), per_channel)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    layout: str | None = None
    native_shape: tuple[int, ...] | None = None
    c2: int | None = None
    quantization: Quantization | None = None
    region: str | None = None
    address: int | None = None
    size: int | None = None

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> TensorInfo:
        quantization = value.get("quantization")
        return cls(
            value["name"], _ints(value.get("shape")), value.get("dtype"), value.get("layout"),
            _ints(value.get("native_shape")), value.get("c2"),
            Quantization.from_json(quantization) if quantization is not None else None,
            value.get("region"), value.get("address"), value.get("size"),
        )


@dataclass(frozen=True)
class TaskRange:
    """Tasks ``first .. first+count-1`` of the chain run by schedule step ``step``."""

    step: int
    first: int
    count: int


@dataclass(frozen=True)
class LayerInfo:
    id: int
    name: str = ""
    op_type: str = ""
    fused: tuple[str, ...] = ()
    target: str = ""
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    tasks: tuple[TaskRange, ...] = ()

    @property
    def task_count(self) -> int:
        return sum(task_range.count for task_range in self.tasks)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> LayerInfo:
        return cls(
            value["id"], value.get("name", ""), value.get("op_type", ""), tuple(value.get("fused", ())),
            value.get("target", ""), tuple(value.get("inputs", ())), tuple(value.get("outputs", ())),
            tuple(TaskRange(t["step"], t["first"], t["count"]) for t in value.get("tasks", ())),
        )


@dataclass(frozen=True)
class ChainRef:
    """A task chain inside a regcmd section: PC starts at ``offset`` fetching ``first_amount``."""

    section: str
    offset: int
    first_amount: int
    tasks: int


@dataclass(frozen=True)
class NpuStep:
    """One chain run by one core. Consecutive steps with the same ``group`` start together on
    their cores and all finish before the next step (one layer split across cores); None: a
    step of its own."""

    core: int
    chain: ChainRef
    layers: tuple[int, ...] = ()
    kind: str = "npu"
    group: int | None = None


@dataclass(frozen=True)
class CpuStep:
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    layers: tuple[int, ...] = ()
    kind: str = "cpu"


Step = NpuStep | CpuStep


def step_from_json(value: Mapping[str, Any]) -> Step:
    layers = tuple(value.get("layers", ()))
    if value["kind"] == "npu":
        chain = value["chain"]
        ref = ChainRef(chain["section"], chain["offset"], chain["first_amount"], chain["tasks"])
        return NpuStep(value["core"], ref, layers, group=value.get("group"))
    return CpuStep(value["op"], tuple(value["inputs"]), tuple(value["outputs"]),
                   dict(value.get("params", {})), layers)


@dataclass(frozen=True)
class RegionInfo:
    name: str
    base: int
    size: int


@dataclass(frozen=True)
class AreaInfo:
    name: str
    size: int
    region: str | None = None
    base: int | None = None


@dataclass(frozen=True)
class MemoryMap:
    regions: tuple[RegionInfo, ...] = ()
    areas: tuple[AreaInfo, ...] = ()

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> MemoryMap:
        regions = tuple(RegionInfo(r["name"], r["base"], r["size"]) for r in value.get("regions", ()))
        areas = tuple(AreaInfo(a["name"], a["size"], a.get("region"), a.get("base")) for a in value.get("areas", ()))
        return cls(regions, areas)


@dataclass(frozen=True)
class PlatformInfo:
    chip: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict, hash=False)
    figures: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> PlatformInfo:
        return cls(value.get("chip"), dict(value.get("overrides", {})), dict(value.get("figures", {})))


@dataclass(frozen=True)
class CompilerInfo:
    version: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> CompilerInfo:
        return cls(value.get("version"), dict(value.get("options", {})))


@dataclass(frozen=True)
class GraphInfo:
    name: str | None = None
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    layers: tuple[LayerInfo, ...] = ()

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> GraphInfo:
        return cls(value.get("name"), tuple(value.get("inputs", ())), tuple(value.get("outputs", ())),
                   tuple(LayerInfo.from_json(layer) for layer in value.get("layers", ())))


def tensor_cube(shape) -> tuple[int, int, int] | None:
    """(C, H, W) of a feature map as the NPU stores it (NC1HWC2 with N = 1): [1, C, H, W]; [1, C]
    (an FC output) as C x 1 x 1; fewer than 4 dimensions padded with leading ones, [n] -> 1 x 1 x n,
    [h, w] -> 1 x h x w, [c, h, w] -> c x h x w (the vendor's rank padding to NCHW); None for
    anything else. The compiler lays tensors out by this rule and the runtime reads them by it."""
    dims = tuple(int(d) for d in shape)
    if len(dims) == 4:
        return dims[1:] if dims[0] == 1 else None
    if len(dims) == 2 and dims[0] == 1:
        return dims[1], 1, 1
    if 1 <= len(dims) <= 3:
        return (1,) * (3 - len(dims)) + dims
    return None
