"""RegisterFile.restore_from (issue 20: a replay's end state set from its start by their differences alone)
against RegisterFile.restore: from a state equal to the start, every group value, key, pointer, the PC registers
and the LUT port's position as ``restore(end)`` leaves them - for random starts and ends, with keys the end lacks,
the differences kept and used again, and made again for other snapshots. A broken variant is caught."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.regfile import RegisterFile
from npuemu.isa.regmap_loader import load_regmap

REGMAP = load_regmap("rk3588")


def _randomized(registers: RegisterFile, rng: np.random.Generator) -> tuple:
    """A random state (some keys of each group set, some dropped; pointers, PC registers, LUT port) as its snapshot."""
    for pingpong in registers.blocks.values():
        for group in pingpong.groups:
            for key in list(group):
                if rng.random() < 0.3:
                    del group[key]
            for key in rng.integers(0, 64, int(rng.integers(0, 12))).tolist():
                group[key] = int(rng.integers(0, 4))  # (few values: many equal between start and end)
        pingpong.pointer, pingpong.executer = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        pingpong.pointer_pp, pingpong.executer_pp = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
    registers.pc.clear()
    registers.pc.update({f"PC_{index}": int(rng.integers(0, 3)) for index in range(int(rng.integers(0, 3)))})
    port = registers.lut
    port.access_type, port.table, port.address = int(rng.integers(0, 2)), int(rng.integers(0, 2)), \
        int(rng.integers(0, 513))
    return registers.snapshot()


def _check(seed: int) -> None:
    registers, rng = RegisterFile(REGMAP), np.random.default_rng(seed)
    start = _randomized(registers, rng)
    end = _randomized(registers, rng)
    other = _randomized(registers, rng)
    moves: list = []
    for first, last in ((start, end), (start, end), (end, other), (other, start), (start, end)):
        registers.restore(first)
        registers.lut.access_type, registers.lut.address = 1, 7  # (a replay's LUT port writes move it)
        registers.restore_from(first, last, moves)
        assert registers.snapshot() == last
        assert moves[0] is first and moves[1] is last


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32 - 1))
def test_restore_from_leaves_what_restore_leaves(seed):
    _check(seed)


def test_the_checks_catch_differences_missing_the_keys_the_end_lacks(monkeypatch):
    inner = RegisterFile._moves

    def no_drops(self, start, end):
        return [(name, group, values, ()) for name, group, values, _ in inner(self, start, end)]

    monkeypatch.setattr(RegisterFile, "_moves", no_drops)
    with pytest.raises(AssertionError):
        for seed in range(20):
            _check(seed)

