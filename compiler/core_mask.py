"""The core mask as the vendor runtime spells it (RKNN_NPU_CORE_*): ``auto``, ``0``, ``1``,
``2``, ``0_1``, ``0_1_2`` or ``all``. npuemu applies it when it builds the model file (the
split across cores is compiled in; the vendor compiles every variant and picks at run time).
``auto`` means one core, core 0: the vendor runtime's auto mode picks one idle core."""

from __future__ import annotations

from npuemu.isa.errors import ConfigError

CORE_MASKS = ("auto", "0", "1", "2", "0_1", "0_1_2", "all")


def parse_core_mask(text: str, core_count: int, chip: str) -> tuple[int, ...]:
    """The physical cores of a core mask on a chip with ``core_count`` cores."""
    if text == "auto":
        return (0,)
    if text == "all":
        return tuple(range(core_count))
    if text not in CORE_MASKS:
        raise ConfigError(f"--core-mask {text!r}: expected one of {', '.join(CORE_MASKS)}")
    cores = tuple(int(part) for part in text.split("_"))
    if max(cores) >= core_count:
        raise ConfigError(f"--core-mask {text}: {chip} has {core_count} NPU core(s) (0..{core_count - 1})")
    return cores
