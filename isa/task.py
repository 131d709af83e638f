"""The object model of a command stream: register writes, tasks and chains.

A :class:`Task` is an ordered list of register writes (duplicates allowed: RKNN writes some
registers twice) plus the op-enable bitmap that starts it. A :class:`Chain` is the ordered
tasks one core runs; :mod:`npuemu.isa.chain` turns it into bytes and back.
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.errors import EncodingError
from npuemu.isa.regmap import RegisterMap, check_register_value


@dataclass(frozen=True)
class RegisterWrite:
    block: str
    register: str
    value: int  # the raw 32-bit register value

    def __init__(self, block: str, register: str, value: int) -> None:
        # the dataclass __init__ of a frozen class sets each field through object.__setattr__:
        # twice this one's cost, for ~80,000 writes a compile and every decoded chain (issue 20)
        fields = self.__dict__
        fields["block"], fields["register"], fields["value"] = block, register, value

    def __str__(self) -> str:
        return f"{self.block}.{self.register}={self.value:#x}"


@dataclass(frozen=True)
class Task:
    """One hardware task: its register writes, then the 4-word tail that starts it.

    ``amount_hi16`` is bits 31:16 of the tail's PC REGISTER_AMOUNTS word: RKNN's multi-core
    chains write 1 or 2 there (meaning unknown, docs/vendor-corpus/README.md 4.4); 0 otherwise.
    ``int_mask``, ``int_clear`` and ``op_idx`` are the driver's task record (rknpu_task), not
    part of the stream; they ride along for the model container and the emulator.
    """

    writes: tuple[RegisterWrite, ...]
    enable_mask: int
    amount_hi16: int = 0
    int_mask: int | None = None
    int_clear: int | None = None
    op_idx: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "writes", tuple(self.writes))


@dataclass(frozen=True)
class Chain:
    """Tasks linked by their tails; the PC walks them in order without host help."""

    tasks: tuple[Task, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", tuple(self.tasks))


def write(regmap: RegisterMap, block: str, register: str, /, value: int | None = None,
          **fields: int) -> RegisterWrite:
    """A checked register write, from a raw ``value`` and/or field values.

    ``write(m, "CNA", "CONV_CON1", CONV_MODE=3)`` packs the fields over 0;
    ``write(m, "CNA", "CONV_CON2", 0x10000260)`` keeps a raw value (reserved bits included);
    both together replace the named fields of the raw value.
    """
    reg = regmap.register(block, register)
    base = 0 if value is None else value
    check_register_value(base, reg.qualified_name)
    return RegisterWrite(block, register, reg.pack(fields, base=base))


def check_task(task: Task, regmap: RegisterMap, where: str) -> None:
    """EncodingError if a write names an unknown register, a value is not 32-bit, or the
    enable mask selects no known block."""
    if not isinstance(task, Task):
        raise EncodingError(f"{where}: expected a Task, got {type(task).__name__}")
    for index, item in enumerate(task.writes):
        if not isinstance(item, RegisterWrite):
            raise EncodingError(f"{where} write {index}: expected a RegisterWrite, got {item!r}")
        try:
            reg = regmap.register(item.block, item.register)
            check_register_value(item.value, reg.qualified_name)
        except EncodingError as error:
            raise EncodingError(f"{where} write {index}: {error}") from None
    for name, value, bits in (("enable_mask", task.enable_mask, 32), ("amount_hi16", task.amount_hi16, 16)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < (1 << bits):
            raise EncodingError(f"{where}: {name} {value!r} is not a {bits}-bit unsigned value")
    try:
        regmap.op_enable_names(task.enable_mask)
    except EncodingError as error:
        raise EncodingError(f"{where}: {error}") from None
