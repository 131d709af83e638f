"""Review (session 16) of replay_match.py at the register level: whenever ``RegisterFile.matches``
allows a start state that is not equal to a recorded one, a run of every task's writes from it
shows every started block the very views the recorded run showed, and ends in ``replay_match.end``'s
state (random chains of writes, S_POINTER values, LUT port writes and op-enables over all six blocks;
the LUT RAM ends alike too)."""

from collections import namedtuple

from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator import replay_match
from npuemu.emulator.machine import Machine

Write = namedtuple("Write", "block register value")
REGFILE = Machine.for_platform("rk3588", ddr_size=1 << 20).cores[0].regfile
BLOCKS = list(REGFILE.blocks)
#: a few plain registers per block (and the DPU's LUT port registers, below)
REGS = {name: [r.name for r in REGFILE.blocks[name].block.registers
               if r.name not in ("S_STATUS", "S_POINTER", "OPERATION_ENABLE") and not r.name.startswith("LUT_")][:3]
        for name in BLOCKS}
REGS["DPU"] += ["LUT_ACCESS_CFG", "LUT_ACCESS_DATA"]  # (the port's writes land in the DPU's group too)
OFFSETS = {name: [REGFILE.blocks[name].block.register(r).offset for r in REGS[name]] for name in BLOCKS}

write = st.one_of(
    st.tuples(st.sampled_from([(b, r) for b in BLOCKS for r in REGS[b]]), st.integers(0, 3)).map(
        lambda t: Write(*t[0], t[1])),
    st.tuples(st.sampled_from(BLOCKS), st.integers(0, 63)).map(lambda t: Write(t[0], "S_POINTER", t[1])),
)
task = st.tuples(st.lists(write, max_size=6), st.sets(st.sampled_from(BLOCKS), min_size=1).map(tuple))
group = st.dictionaries(st.integers(0, 4), st.integers(0, 3), max_size=3)
pointers = st.tuples(st.integers(0, 1), st.integers(0, 1), st.booleans(), st.booleans())
block_state = st.tuples(group, group, pointers)
state = st.tuples(st.lists(block_state, min_size=6, max_size=6), st.sampled_from([(0, 0, 0), (1, 0, 0)]))


def _set(regfile, blocks, lut) -> None:
    for name, (g0, g1, (pointer, executer, pp, epp)) in zip(BLOCKS, blocks):
        p = regfile.blocks[name]
        p.groups[0].clear(), p.groups[1].clear()
        p.groups[0].update({OFFSETS[name][k]: v for k, v in g0.items() if k < len(OFFSETS[name])})
        p.groups[1].update({OFFSETS[name][k]: v for k, v in g1.items() if k < len(OFFSETS[name])})
        p.pointer, p.executer, p.pointer_pp, p.executer_pp = pointer, executer, pp, epp
    regfile.lut.access_type, regfile.lut.table, regfile.lut.address = lut
    regfile.pc.clear()


def _run(regfile, tasks):
    regfile.lut.tables[:] = 0
    views = []
    for steps, blocks in tasks:
        regfile.apply(steps, "review")
        views.append([(name, regfile.view(name).group, regfile.view(name).values) for name in blocks])
        regfile.started(blocks)
    return views, (regfile.snapshot(), regfile.lut.tables.tobytes())


@settings(max_examples=1500, deadline=None)
@given(st.lists(task, min_size=1, max_size=4), state, state, st.data())
def test_a_loose_match_shows_every_task_the_recorded_views_and_ends_as_end_says(tasks, recorded, other, data):
    regfile = REGFILE
    resolved = tuple((regfile.resolve(writes), blocks) for writes, blocks in tasks)
    _set(regfile, *recorded)
    start = replay_match.Start.of(regfile.snapshot(), resolved)
    want_views, want_end = _run(regfile, resolved)
    # the other state: the recorded one with some blocks taken from ``other`` (pointers, groups)
    mixed = list(recorded[0])
    for i in data.draw(st.sets(st.integers(0, 5), min_size=1, max_size=2)):
        part = data.draw(st.integers(0, 2))  # one of its groups, or its pointers
        mixed[i] = tuple(o if k == part else r for k, (r, o) in enumerate(zip(recorded[0][i], other[0][i])))
    _set(regfile, mixed, recorded[1])
    now = regfile.snapshot()
    matched = regfile.matches(start)
    if matched is True or not matched:
        return
    end = replay_match.end(regfile, want_end[0], matched.course, matched.others)
    got_views, got_end = _run(regfile, resolved)
    assert got_views == want_views, now
    assert got_end == (end, want_end[1])
