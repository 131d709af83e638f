"""The sweep file of ``npuemu sweep`` and its grid of points.

    models: [net.onnx]            # paths relative to the sweep file
    target: rk3588                # a chip name/alias or a platform YAML
    dtype: [int8, fp16]
    dataset: ds/dataset.txt       # calibration set of the int8 builds
    core_mask: [auto, 0_1_2]
    batch_size: [1]
    sram: [false, true]           # or one bool
    set:                          # platform keys (`npuemu platforms --set`), each a list of values
      ddr.read_bytes_per_cycle: [3.0, 6.0]
    sample: 20                    # optional: 20 points drawn at random from the product
    seed: 0                       # of the draw
    values: true                  # optional: value columns, each build run on the dataset's samples
    values_samples: 1             # how many of its first lines (default 1)

Every list may be a single value. The grid is the product of the lists, in the order above (the
last key varies fastest); ``sample`` draws points without enumerating the product.
With ``values: true`` every row also has ``output_cosine`` and ``output_max_abs_error``: the build
emulated on the dataset's first ``values_samples`` lines against the float ONNX model
(tools/sweep_values.py).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npuemu.isa.errors import ConfigError

#: the swept dimensions of a point besides the platform keys, in column order
DIMENSIONS = ("model", "dtype", "core_mask", "batch_size", "sram")
_KEYS = {"models", "target", "dtype", "dataset", "core_mask", "batch_size", "sram", "set", "sample", "seed", "values",
         "values_samples"}
DTYPES = ("int8", "fp16")


@dataclass(frozen=True)
class SweepSpec:
    path: Path
    models: tuple[str, ...]
    target: str
    dtype: tuple[str, ...] = ("int8",)
    dataset: str | None = None
    core_mask: tuple[str, ...] = ("auto",)
    batch_size: tuple[int, ...] = (1,)
    sram: tuple[bool, ...] = (False,)
    set: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    sample: int | None = None
    seed: int = 0
    values: bool = False  # value columns: each build run on the dataset's samples
    values_samples: int = 1  # the first lines of the dataset it is run on

    def resolve(self, relative: str) -> Path:
        """A path of the sweep file, relative to the file's folder."""
        path = Path(relative).expanduser()
        return path if path.is_absolute() else self.path.parent / path

    @property
    def target_ref(self) -> str:
        """The target as the compiler takes it: a platform YAML path made absolute, else the name."""
        looks_like_file = self.target.lower().endswith((".yaml", ".yml")) or "/" in self.target
        return str(self.resolve(self.target).resolve()) if looks_like_file else self.target

    def lists(self) -> list[tuple[str, tuple[Any, ...]]]:
        """(column, values) of every swept dimension, the platform keys last."""
        fixed = [(name, getattr(self, name if name != "model" else "models")) for name in DIMENSIONS]
        return fixed + [(key, values) for key, values in self.set.items()]

    def size(self) -> int:
        total = 1
        for _, values in self.lists():
            total *= len(values)
        return total


@dataclass(frozen=True)
class Point:
    """One grid point: a value per dimension and per platform key."""

    model: str
    dtype: str
    core_mask: str
    batch_size: int
    sram: bool
    overrides: tuple[tuple[str, Any], ...]

    @property
    def id(self) -> str:
        """Stable over runs and orders: a rerun recognises the point's row by it."""
        text = json.dumps([self.model, self.dtype, self.core_mask, self.batch_size, self.sram,
                           [list(item) for item in self.overrides]], default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def columns(self) -> dict[str, Any]:
        return {"model": self.model, "dtype": self.dtype, "core_mask": self.core_mask,
                "batch_size": self.batch_size, "sram": self.sram, **dict(self.overrides)}


def _loader():
    """The strict platform loader, except that digits with underscores stay text: YAML 1.1 reads
    the core mask 0_1_2 as the integer 12."""
    import re

    import yaml

    from npuemu.platforms.loader import _StrictLoader

    class SweepLoader(_StrictLoader):
        def resolve(self, kind, value, implicit):
            if kind is yaml.ScalarNode and implicit[0] and "_" in value and re.fullmatch(r"[0-9_]+", value):
                return "tag:yaml.org,2002:str"
            return super().resolve(kind, value, implicit)

    return SweepLoader


def load_spec(path: str | Path) -> SweepSpec:
    """Read and check a sweep file (unknown keys and empty lists are errors)."""
    from npuemu.platforms.loader import parse_yaml

    path = Path(path)
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"), str(path), _loader())
    except OSError as error:
        raise ConfigError(f"{path}: cannot read the sweep file: {error.strerror}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sweep keys (models, target, dtype, ...)")
    unknown = sorted(set(map(str, data)) - _KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; expected some of {', '.join(sorted(_KEYS))}")
    return _spec(path, data)


def _spec(path: Path, data: Mapping[str, Any]) -> SweepSpec:
    where = str(path)
    models = _list(data, "models", str, where, required=True)
    dtype = _list(data, "dtype", str, where, default=("int8",))
    bad = [d for d in dtype if d not in DTYPES]
    if bad:
        raise ConfigError(f"{where}: dtype: {bad[0]!r}: expected one of {', '.join(DTYPES)}")
    dataset = data.get("dataset")
    if "int8" in dtype and dataset is None:
        raise ConfigError(f"{where}: dtype int8 needs a calibration set: dataset: ds/dataset.txt")
    sets = data.get("set") or {}
    if not isinstance(sets, Mapping):
        raise ConfigError(f"{where}: set: expected a mapping of platform keys to lists of values")
    sample = data.get("sample")
    if sample is not None and (not isinstance(sample, int) or isinstance(sample, bool) or sample < 1):
        raise ConfigError(f"{where}: sample: expected a count of points, 1 or more; got {sample!r}")
    values, values_samples = _values(data, where)
    return SweepSpec(path, models, str(data.get("target", "rk3588")), dtype,
                     None if dataset is None else str(dataset),
                     tuple(str(m) for m in _list(data, "core_mask", (str, int), where, default=("auto",))),
                     _list(data, "batch_size", int, where, default=(1,)),
                     _list(data, "sram", bool, where, default=(False,)),
                     {str(key): _list(sets, key, (int, float, str, bool), f"{where}: set") for key in sets},
                     sample, int(data.get("seed", 0)), values, values_samples)


def _values(data: Mapping[str, Any], where: str) -> tuple[bool, int]:
    """(values, values_samples): value columns need samples to run the builds on."""
    values = data.get("values", False)
    if not isinstance(values, bool):
        raise ConfigError(f"{where}: values: expected true or false; got {values!r}")
    count = data.get("values_samples", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"{where}: values_samples: expected a count of dataset lines, 1 or more; got {count!r}")
    if values and data.get("dataset") is None:
        raise ConfigError(f"{where}: values: true runs every build on samples of a dataset: give one with "
                          "dataset: ds/dataset.txt (one line per sample, one .npy/image file per model input)")
    return values, count


def _list(data: Mapping[str, Any], key: str, kind, where: str, default: Sequence[Any] = (),
          required: bool = False) -> tuple[Any, ...]:
    """A sweep list: a YAML list, or one value standing for a list of one."""
    if key not in data or data[key] is None:
        if required:
            raise ConfigError(f"{where}: {key}: required")
        return tuple(default)
    values = data[key] if isinstance(data[key], list) else [data[key]]
    if not values:
        raise ConfigError(f"{where}: {key}: an empty list sweeps nothing")
    for value in values:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: {key}: {value!r} is not a valid value here")
    return tuple(values)


def points(spec: SweepSpec) -> list[Point]:
    """The grid (product of the lists), or ``sample`` points of it drawn with ``seed``."""
    lists = spec.lists()
    size = spec.size()
    if spec.sample is None or spec.sample >= size:
        return [_point(spec, combo) for combo in itertools.product(*(values for _, values in lists))]
    indices = sorted(random.Random(spec.seed).sample(range(size), spec.sample))
    return [_point(spec, _unrank(index, [values for _, values in lists])) for index in indices]


def _unrank(index: int, lists: list[tuple[Any, ...]]) -> list[Any]:
    """The product's index-th combination (mixed radix, last list fastest), without the product."""
    combo = []
    for values in reversed(lists):
        index, digit = divmod(index, len(values))
        combo.append(values[digit])
    return combo[::-1]


def _point(spec: SweepSpec, combo: Sequence[Any]) -> Point:
    model, dtype, core_mask, batch_size, sram, *values = combo
    return Point(model, dtype, core_mask, batch_size, sram, tuple(zip(spec.set, values)))


def iter_columns(spec: SweepSpec) -> Iterator[str]:
    """The swept columns of a results row, in order."""
    yield "model"
    yield "target"
    yield from DIMENSIONS[1:]
    yield from spec.set
