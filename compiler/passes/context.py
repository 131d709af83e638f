"""What every pass may read besides the graph: the target platform, its limits, the level."""

from __future__ import annotations

from dataclasses import dataclass, field

from npuemu.platforms import Platform, load_platform

from .hw_limits import NpuLimits, npu_limits


@dataclass(frozen=True)
class PassContext:
    platform: Platform
    level: int = 3
    limits: NpuLimits = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", npu_limits(self.platform))

    @staticmethod
    def for_chip(chip: str = "rk3588", level: int = 3) -> "PassContext":
        return PassContext(load_platform(chip), level)
