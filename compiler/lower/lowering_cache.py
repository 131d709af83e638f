"""Lower each layer of a build once (issue 20: compile time).

A build lowers every layer twice: once to size the regcmd area, then with the final memory plan
(compiler/build.py). The regcmd area is planned last (memory_plan.plan_memory), so the second
plan gives every tensor and constant the address the first gave it, and the second lowering
would repeat the first word for word. :class:`LoweringCache` keeps each layer's lowering with
the placements it looked up (a lowering reads placements only by name, lookup.py) and hands it
back while the inputs of a lowering are the same: the same layer object (frozen), platform,
register map, op index and core count, and every placement the layer read equal to the one it
read before (a name it found missing still missing). Anything else lowers afresh.

(A convolution's packed weights and BS blob are kept per layer object as well:
driver.cached_conv_constants.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from npuemu.isa.regmap import RegisterMap
from npuemu.platforms.model import Platform

from .driver import LoweredLayer, lower_layer
from .layers import Layer
from .placement import Placement

_MISSING = object()  # a name the lowering looked up and did not find


class ReadPlacements(Mapping):
    """``placements`` as a lowering sees them, remembering every name it looked up and what it
    got; iterating (no lowering does today) makes the whole mapping count as read."""

    def __init__(self, placements: Mapping[str, Placement]):
        self._placements = placements
        self.read: dict[str, Any] | None = {}

    def __getitem__(self, name: str) -> Placement:
        try:
            value = self._placements[name]
        except KeyError:
            if self.read is not None:
                self.read[name] = _MISSING
            raise
        if self.read is not None:
            self.read[name] = value
        return value

    def __iter__(self) -> Iterator[str]:
        self.read = None
        return iter(self._placements)

    def __len__(self) -> int:
        self.read = None
        return len(self._placements)


def _unchanged(read: dict[str, Any] | None, before: Mapping[str, Placement], now: Mapping[str, Placement]) -> bool:
    if read is None:  # the whole mapping was read
        return dict(before) == dict(now)
    return all(now.get(name, _MISSING) == value for name, value in read.items())


@dataclass(frozen=True, eq=False)
class _Entry:
    layer: Layer
    inputs: tuple  # (platform, regmap, op_idx, cores): compared by identity / value
    placements: Mapping[str, Placement]
    read: dict[str, Any] | None
    lowered: LoweredLayer


class LoweringCache:
    """Lowerings of one build's layers, reused while their inputs are unchanged (module docstring).
    ``hits`` / ``misses`` count the calls answered from the cache / lowered afresh."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self.hits = 0
        self.misses = 0

    def lower(self, layer: Layer, placements: Mapping[str, Placement], platform: Platform, regmap: RegisterMap,
              *, op_idx: int | None = None, cores: int = 1) -> LoweredLayer:
        entry = self._entries.get(id(layer))
        if (entry is not None and entry.layer is layer and entry.inputs[0] is platform and entry.inputs[1] is regmap
                and entry.inputs[2:] == (op_idx, cores) and _unchanged(entry.read, entry.placements, placements)):
            self.hits += 1
            return entry.lowered
        self.misses += 1
        seen = ReadPlacements(placements)
        lowered = lower_layer(layer, seen, platform, regmap, op_idx=op_idx, cores=cores)
        self._entries[id(layer)] = _Entry(layer, (platform, regmap, op_idx, cores), placements, seen.read, lowered)
        return lowered

