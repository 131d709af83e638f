"""A replayed chain's LUT port writes as the stores they make (emulator/regfile.py ``lut_stores``,
issue 20): from the port state at the chain's start, each task's stores must leave the LUT RAM as
its writes would, whatever the RAM held before - checked after every task against a model of the
port written here (REGISTER_SEMANTICS 1.3: LUT_ACCESS_CFG sets type, table and address; a data
write with type 1 stores the low 16 bits at the address and moves it on; type 0 stores nothing)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.regfile import RegisterFile
from npuemu.isa.lut_format import LUT_ENTRIES
from npuemu.isa.task import RegisterWrite
from tests.emulator.test_machine_support import REGMAP


class _PortModel:
    def __init__(self, ram: np.ndarray, port: tuple[int, int, int]) -> None:
        self.ram, (self.kind, self.table, self.address) = ram, port

    def write(self, register: str, value: int) -> None:
        if register == "LUT_ACCESS_CFG":
            fields = REGMAP.block("DPU").register("LUT_ACCESS_CFG").unpack(value)
            self.kind, self.table, self.address = fields["LUT_ACCESS_TYPE"], fields["LUT_TABLE_ID"], fields["LUT_ADDR"]
        elif self.kind == 1:
            self.ram[self.table, self.address] = np.uint16(value & 0xFFFF).view(np.int16)
            self.address += 1


def _cfg(kind: int, table: int, address: int) -> RegisterWrite:
    return RegisterWrite("DPU", "LUT_ACCESS_CFG", REGMAP.pack("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=kind,
                                                               LUT_TABLE_ID=table, LUT_ADDR=address))


# a task's port writes: (set the port?, type, table, address, data words from one of a few word sets)
_task = st.lists(st.tuples(st.booleans(), st.integers(0, 1), st.integers(0, 1), st.integers(0, LUT_ENTRIES - 1),
                           st.integers(0, 30), st.integers(0, 2)), max_size=4)


def _writes(task: list[tuple], word_sets: list[np.ndarray], address: list[int]) -> list[RegisterWrite]:
    writes = []
    for set_port, kind, table, start, count, which in task:
        if set_port:
            writes.append(_cfg(kind, table, start))
            address[0] = start
        count = min(count, LUT_ENTRIES - address[0])  # (past the end the writes raise: not here)
        words = word_sets[which][:count]
        writes += [RegisterWrite("DPU", "LUT_ACCESS_DATA", int(word)) for word in words]
        address[0] += count
    return writes


@settings(max_examples=80, deadline=None)
@given(st.lists(_task, min_size=1, max_size=6), st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 20)),
       st.integers(0, 2**32 - 1))
def test_stores_leave_the_ram_the_writes_leave_after_every_task(tasks, port, seed):
    rng = np.random.default_rng(seed)
    # few distinct words, so that later uploads often repeat earlier ones (the stores leave those out)
    word_sets = [rng.integers(0, 1 << 32, LUT_ENTRIES, dtype=np.int64) for _ in range(2)] + [np.zeros(LUT_ENTRIES,
                                                                                                        np.int64)]
    regfile = RegisterFile(REGMAP)
    address = [port[2]]
    luts = [RegisterFile.lut_steps(regfile.resolve(_writes(task, word_sets, address))) for task in tasks]
    stores = RegisterFile.lut_stores(port, luts)
    assert stores is not None and len(stores) == len(tasks)
    for start in (rng.integers(-2**15, 2**15, (2, LUT_ENTRIES)).astype(np.int16), np.zeros((2, LUT_ENTRIES), np.int16)):
        model = _PortModel(start.copy(), port)
        regfile.lut.tables[:] = start
        address = [port[2]]
        for task, made in zip(tasks, stores):
            for write in _writes(task, word_sets, address):
                model.write(write.register, write.value)
            regfile.apply_lut(made, "t")
            assert np.array_equal(regfile.lut.tables, model.ram)


def test_read_type_writes_store_nothing_and_a_repeated_upload_is_left_out():
    words = np.arange(LUT_ENTRIES, dtype=np.int64) * 3
    upload = [_cfg(1, 0, 0)] + [RegisterWrite("DPU", "LUT_ACCESS_DATA", int(w)) for w in words]
    read = [_cfg(0, 0, 0), RegisterWrite("DPU", "LUT_ACCESS_DATA", 7)]
    regfile = RegisterFile(REGMAP)
    luts = [RegisterFile.lut_steps(regfile.resolve(writes)) for writes in (read, upload, read, upload)]
    stores = RegisterFile.lut_stores((0, 0, 0), luts)
    assert [len(made) for made in stores] == [0, 1, 0, 0]
    assert np.array_equal(stores[1][0][3], words.astype(np.int16))


def test_a_run_past_the_table_end_keeps_the_steps():
    writes = [_cfg(1, 1, LUT_ENTRIES - 1)] + [RegisterWrite("DPU", "LUT_ACCESS_DATA", 1)] * 2
    regfile = RegisterFile(REGMAP)
    assert RegisterFile.lut_stores((0, 0, 0), [RegisterFile.lut_steps(regfile.resolve(writes))]) is None
