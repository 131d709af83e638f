"""Per-input preprocessing of calibration samples: channel order, mean and std.

The vendor's ``mean_values`` / ``std_values`` / ``quant_img_RGB2BGR`` (SDK guide 3.1.2,
10.3): a sample holds what the deployed model is fed (image pixels 0..255, or the raw values
of a ``.npy``); the model itself starts with ``(x - mean[c]) / std[c]`` per channel ``c``
(axis 1 of NCHW). The graph we import is the ONNX model, which expects the normalized
tensor, so calibration applies the preprocessing to every sample before the float graph
runs. ``bgr`` (the vendor's quant_img_RGB2BGR) reverses the channel order of *images* first
and never touches ``.npy`` samples, as in the guide ("only affects images read from the
calibration set"); the order is reorder, then mean, then std.

The preprocessing is recorded with the quantization (``QuantizationResult.preprocess`` and the
quant-config YAML) so that whoever builds the model's input stage can fold it in, as the
vendor folds mean/std into the first layer's input quantization (vendor-corpus README 5,
rep03b).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import ConfigError

from ..ir import Graph


@dataclass(frozen=True)
class InputPreprocess:
    """``(x - mean) / std`` per channel; one value applies to every channel."""

    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    bgr: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if not self.mean or not self.std:
            raise ConfigError("mean and std need at least one value")
        if any(not np.isfinite(v) for v in self.mean + self.std):
            raise ConfigError(f"mean {list(self.mean)} and std {list(self.std)} must be finite numbers")
        if any(v == 0 for v in self.std):
            raise ConfigError(f"std {list(self.std)} has a zero: every std value must be non-zero")

    @property
    def is_identity(self) -> bool:
        return all(v == 0 for v in self.mean) and all(v == 1 for v in self.std) and not self.bgr

    def check_channels(self, channels: int, where: str) -> None:
        for what, values in (("mean", self.mean), ("std", self.std)):
            if len(values) not in (1, channels):
                raise ConfigError(f"{where}: {what} has {len(values)} values; the input has {channels} channels "
                                  "(give one value, or one per channel)")

    def apply(self, sample: np.ndarray, *, is_image: bool) -> np.ndarray:
        """Preprocessed float32 copy of an NCHW (or any rank >= 2, channels on axis 1) sample."""
        values = np.asarray(sample, dtype=np.float64)
        if self.bgr and is_image:
            values = values[:, ::-1]
        shape = [1] * values.ndim
        if values.ndim >= 2:
            shape[1] = -1
        mean = np.asarray(self.mean).reshape(shape) if len(self.mean) > 1 else self.mean[0]
        std = np.asarray(self.std).reshape(shape) if len(self.std) > 1 else self.std[0]
        return ((values - mean) / std).astype(np.float32)

    def to_plain(self) -> dict:
        return {"mean": list(self.mean), "std": list(self.std), "bgr": self.bgr}


def parse_values(text: str, what: str) -> tuple[str | None, tuple[float, ...]]:
    """``[NAME=]v0,v1,...`` -> (NAME or None, values)."""
    name, _, values = text.rpartition("=") if "=" in text else (None, "", text)
    try:
        numbers = tuple(float(item) for item in values.split(","))
    except ValueError:
        raise ConfigError(f"{what} '{text}': expected [NAME=]V0,V1,... with numbers, e.g. 0,0,0") from None
    return (name or None), numbers


def preprocess_for_inputs(graph: Graph, means: Sequence[str] = (), stds: Sequence[str] = (),
                          bgr: bool = False) -> dict[str, InputPreprocess]:
    """One :class:`InputPreprocess` per graph input from ``--mean``/``--std`` option texts.

    Each option is given once per input in input order, or as ``NAME=...``; a single
    unnamed option applies to every input. Inputs without one get mean 0 / std 1.
    """
    mean_by_input = _assign(graph, [parse_values(text, "--mean") for text in means], "--mean")
    std_by_input = _assign(graph, [parse_values(text, "--std") for text in stds], "--std")
    result = {}
    for name in graph.inputs:
        preprocess = InputPreprocess(mean_by_input.get(name, (0.0,)), std_by_input.get(name, (1.0,)), bgr)
        shape = graph.tensors[name].shape
        if len(shape) >= 2:
            preprocess.check_channels(shape[1], f"input '{name}'")
        elif len(preprocess.mean) > 1 or len(preprocess.std) > 1:
            raise ConfigError(f"input '{name}' has shape {list(shape)} without a channel axis: give one mean/std value")
        result[name] = preprocess
    return result


def _assign(graph: Graph, specs: list[tuple[str | None, tuple[float, ...]]], what: str) -> dict[str, tuple[float, ...]]:
    if not specs:
        return {}
    if len(specs) == 1 and specs[0][0] is None:
        return dict.fromkeys(graph.inputs, specs[0][1])
    assigned: dict[str, tuple[float, ...]] = {}
    for position, (name, values) in enumerate(specs):
        if name is None:
            if position >= len(graph.inputs):
                raise ConfigError(f"{what} is given {len(specs)} times; the model has {len(graph.inputs)} "
                                  f"input(s) {graph.inputs}")
            name = graph.inputs[position]
        if name not in graph.inputs:
            raise ConfigError(f"{what} names input '{name}'; the model's inputs are {graph.inputs}")
        if name in assigned:
            raise ConfigError(f"{what} is given twice for input '{name}'")
        assigned[name] = values
    return assigned


def identity_preprocess(graph: Graph) -> dict[str, InputPreprocess]:
    return {name: InputPreprocess() for name in graph.inputs}


def preprocess_from_plain(data: Mapping, where: str) -> InputPreprocess:
    """From the quant-config form ``{mean: [...], std: [...], bgr: bool}``."""
    try:
        return InputPreprocess(tuple(data.get("mean", (0.0,))), tuple(data.get("std", (1.0,))),
                               bool(data.get("bgr", False)))
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: mean/std must be lists of numbers and bgr true or false") from None
