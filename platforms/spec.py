"""Constraints attached to platform dataclass fields.

A platform figure's allowed range lives next to its declaration (``figure(minimum=1)``) so
that the YAML validator, the override parser, the CLI and the tests all read one source.
For ``tuple[...]`` fields the constraint applies to each item.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

SPEC_KEY = "npuemu.spec"


@dataclass(frozen=True)
class Spec:
    """Range and shape rules for one field (all optional; bounds are inclusive)."""

    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: float | None = None
    choices: tuple[Any, ...] = ()
    pattern: str | None = None
    hint: str = ""  # what a matching string looks like, shown instead of the regex

    def violation(self, value: Any) -> bool:
        """True when ``value`` (already of the right Python type) breaks a rule."""
        if self.choices and value not in self.choices:
            return True
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                return True
            if self.maximum is not None and value > self.maximum:
                return True
            if self.exclusive_minimum is not None and value <= self.exclusive_minimum:
                return True
        if isinstance(value, str) and self.pattern is not None:
            return re.fullmatch(self.pattern, value) is None
        return False

    def describe(self, kind: str) -> str:
        """Human text for what is expected, e.g. 'an integer in [1, 15]'."""
        if self.choices:
            return "one of " + ", ".join(repr(choice) for choice in self.choices)
        if self.pattern is not None:
            return f"{kind} ({self.hint})" if self.hint else f"{kind} matching {self.pattern!r}"
        low, high = self.minimum, self.maximum
        if self.exclusive_minimum is not None:
            text = f"{kind} > {_num(self.exclusive_minimum)}"
            return text + (f" and <= {_num(high)}" if high is not None else "")
        if low is not None and high is not None:
            return f"{kind} in [{_num(low)}, {_num(high)}]"
        if low is not None:
            return f"{kind} >= {_num(low)}"
        if high is not None:
            return f"{kind} <= {_num(high)}"
        return kind


def _num(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return str(value)


def figure(*, default: Any = dataclasses.MISSING, **rules: Any) -> Any:
    """A dataclass field carrying a :class:`Spec` (required unless ``default`` is given)."""
    return dataclasses.field(default=default, metadata={SPEC_KEY: Spec(**rules)})


def spec_of(field: dataclasses.Field) -> Spec:
    return field.metadata.get(SPEC_KEY, Spec())
