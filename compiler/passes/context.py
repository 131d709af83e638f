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
    # bytes per element the layers will compute in: 2 when the build is float16 (`--fp16`), so
    # CBUF-driven rewrites (input-channel tiling) size their parts for fp16 data and weights
    element_bytes: int = 1
    # remove all-zero conv output channels (--prune, guide 5.8; passes/prune.py)
    prune: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "limits", npu_limits(self.platform))

    @staticmethod
    def for_chip(chip: str = "rk3588", level: int = 3, element_bytes: int = 1) -> "PassContext":
        return PassContext(load_platform(chip), level, element_bytes=element_bytes)
