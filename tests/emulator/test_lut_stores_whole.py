"""A task's LUT stores that fill both tables from their first entry, in table order, become one store of the
whole RAM (emulator/regfile.py ``_whole_ram``, issue 20): the RAM ``apply_lut`` leaves must be what the port's
writes leave (test_lut_stores' model of the port), whatever it held; other uploads keep their stores. A broken
variant is caught."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.emulator import regfile as regfile_module
from npuemu.emulator.regfile import RegisterFile
from npuemu.isa.lut_format import LUT_ENTRIES
from npuemu.isa.task import RegisterWrite
from tests.emulator.test_lut_stores import _cfg, _PortModel
from tests.emulator.test_machine_support import REGMAP


def _upload(tables: list[tuple[int, np.ndarray]]) -> list[RegisterWrite]:
    """Write-type port uploads of whole tables (table, its 513 words), in the order given."""
    writes = []
    for table, words in tables:
        writes.append(_cfg(1, table, 0))
        writes += [RegisterWrite("DPU", "LUT_ACCESS_DATA", int(word)) for word in words]
    return writes


@pytest.mark.parametrize("seed", range(4))
def test_both_tables_in_order_are_one_store_and_leave_what_the_writes_leave(seed):
    rng = np.random.default_rng(seed)
    words = [rng.integers(0, 1 << 32, LUT_ENTRIES, dtype=np.int64) for _ in range(3)]
    tasks = [_upload([(0, words[0]), (1, words[1])]), _upload([(1, words[2]), (0, words[1])]),
             _upload([(0, words[2])]), _upload([(0, words[0]), (1, words[0])])]
    regfile = RegisterFile(REGMAP)
    stores = RegisterFile.lut_stores((0, 0, 0), [RegisterFile.lut_steps(regfile.resolve(task)) for task in tasks])
    assert [[step[1] for step in made] for made in stores] == [[None], [1, 0], [0], [None]]
    start = rng.integers(-2 ** 15, 2 ** 15, (2, LUT_ENTRIES)).astype(np.int16)
    model, regfile.lut.tables[:] = _PortModel(start.copy(), (0, 0, 0)), start
    for task, made in zip(tasks, stores):
        for write in task:
            model.write(write.register, write.value)
        regfile.apply_lut(made, "t")
        assert np.array_equal(regfile.lut.tables, model.ram)


def test_the_checks_catch_the_tables_swapped_in_the_whole_store(monkeypatch):
    inner = regfile_module._whole_ram

    def swapped(made):
        whole = inner(made)
        return whole if whole[0][1] is not None else ((whole[0][0], None, 0, whole[0][3][::-1].copy()),)

    monkeypatch.setattr(regfile_module, "_whole_ram", swapped)
    with pytest.raises(AssertionError):
        test_both_tables_in_order_are_one_store_and_leave_what_the_writes_leave(0)
