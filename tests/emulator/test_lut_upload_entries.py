"""A replayed chain's LUT uploads (emulator/regfile.py, issue 20): the int16 entries of a resolved
run of LUT_ACCESS_DATA words are worked out once per run of words (``_ENTRIES``, by the very
read-only array ``resolve`` makes) and stored again on every ``apply`` / ``apply_lut``. The RAM
must hold what one ``write`` per word leaves, whatever the tables, the start address and the
order of uploads; a writable array (not from ``resolve``) is converted each time."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import regfile as regfile_module
from npuemu.emulator.regfile import RegisterFile
from npuemu.isa.lut_format import LUT_ENTRIES
from npuemu.isa.task import RegisterWrite
from tests.emulator.test_machine_support import REGMAP


def _upload(table: int, address: int, words: list[int]) -> list[RegisterWrite]:
    cfg = REGMAP.pack("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=table, LUT_ADDR=address)
    return [RegisterWrite("DPU", "LUT_ACCESS_CFG", cfg)] + [RegisterWrite("DPU", "LUT_ACCESS_DATA", w) for w in words]


uploads = st.lists(st.tuples(st.integers(0, 1), st.integers(0, LUT_ENTRIES - 1), st.integers(1, 40),
                             st.integers(0, 2**31)), min_size=1, max_size=6)


def _writes(plan) -> list[RegisterWrite]:
    writes = []
    for table, address, count, seed in plan:
        count = min(count, LUT_ENTRIES - address)
        words = np.random.default_rng(seed).integers(0, 1 << 32, count, dtype=np.int64).tolist()
        writes += _upload(table, address, words)
    return writes


@settings(max_examples=60, deadline=None)
@given(uploads, st.integers(1, 4))
def test_resolved_uploads_leave_what_one_write_per_word_leaves(plan, repeats):
    writes = _writes(plan)
    direct, resolved = RegisterFile(REGMAP), RegisterFile(REGMAP)
    steps = resolved.resolve(writes)
    lut_steps = RegisterFile.lut_steps(steps)
    runs = [step[2] for step in lut_steps if isinstance(step[2], np.ndarray)]  # (the data steps' words)
    assert runs and not any(words.flags.writeable for words in runs)
    for repeat in range(repeats):  # the same steps again: the entries come from the memo
        for write in writes:
            direct.write(write.block, write.register, write.value, "t")
        if repeat % 2:
            resolved.apply(steps, "t")
        else:
            resolved.apply_lut(lut_steps, "t")
        assert np.array_equal(resolved.lut.tables, direct.lut.tables)


def test_a_writable_run_is_converted_each_time(monkeypatch):
    port = RegisterFile(REGMAP).lut
    port.configure({"LUT_ACCESS_TYPE": 1, "LUT_TABLE_ID": 0, "LUT_ADDR": 0})
    words = np.array([1, 0xFFFF, 0x18000], np.int64)
    memoised = []
    monkeypatch.setattr(regfile_module, "_ENTRIES", lambda values: memoised.append(values) or None)
    assert port.data_run(words, "t")
    words[0] = 0x7FFF  # (a caller's own array may change between runs)
    port.configure({"LUT_ACCESS_TYPE": 1, "LUT_TABLE_ID": 0, "LUT_ADDR": 0})
    assert port.data_run(words, "t")
    assert memoised == [] and port.tables[0, :3].tolist() == [0x7FFF, -1, -32768]
