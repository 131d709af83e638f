"""Which start states a recorded chain run can be replayed from (issue 20: reach the steady
state sooner).

A chain replay (core.py ``_Replay``) runs the units from the decoded states a recorded run left,
so it is exact from any start state in which every task sees the register values it saw then:
the same groups written and executed, and the same values in each executing group at each start.
``RegisterFile.equals`` asks for the whole state to be equal; this module allows three
differences that cannot reach a task (``RegisterFile.matches`` asks it when they are not equal):

- a register of a group that the chain writes before the block first runs from that group (the
  write replaces whatever the start held: a task two before in a delta stream, or a value the
  last run left; the view of every start from that group then holds the chain's value);
- a block's pointer state (POINTER, EXECUTER and their PP_EN bits) when the chain's own S_POINTER
  writes and op-enables take it through the very same groups and to the very same end (the first
  runs start from reset, whose PP bits the chain then sets: the same course);
- any register of a group the block never runs from in the chain while it runs from its other
  group (a chain with one PPU task runs it from the other group on the next run: the group it
  leaves holds what the last run wrote). Such a group ends as it started, with the chain's writes
  into it on top (``end``).

Everything else must be equal: the groups of a block the chain never starts, the LUT port, the
PC registers. Under these conditions every task's views, decoded states and LUT stores are the
recorded run's, and the chain ends in the recorded end state but for the groups of the last case
(a register of a group a task ran from that the chain does not write keeps a start value that had
to be equal; one it writes ends with the chain's last write).

The course of the recorded run (``Course``) is worked out once per recorded run from its resolved
writes (``RegisterFile.resolve``'s steps) by replaying only the pointer logic on copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npuemu.emulator.regfile import _GROUPS, _LUT_CFG, _LUT_DATA, _S_POINTER, PingPong, RegisterFile

_WRITE, _START = 0, 1  # course events besides an S_POINTER write (its value)
_MISSING = object()


class Start(tuple):
    """A recorded run's start snapshot (``RegisterFile.snapshot``), equal to it as a tuple, with
    what ``loose`` needs: ``tasks``, per task its resolved writes and the blocks it started
    (``_TaskMemo.steps`` and ``.blocks``), and ``course``, worked out from them at the first state
    that is not equal (and handed on to the replays made from it: their course is the same)."""

    tasks: tuple = ()
    course: Course | None = None

    @classmethod
    def of(cls, snapshot: tuple, tasks: tuple, course: Course | None = None) -> Start:
        start = cls(snapshot)
        start.tasks, start.course = tasks, course
        return start

    def loose(self, regfile: RegisterFile) -> Loose | bool:
        """``RegisterFile.matches``' question for a state that does not equal this one (``loose``;
        a method, so that the register file needs no import of this module)."""
        return loose(regfile, self)


@dataclass(frozen=True)
class Loose:
    """``RegisterFile.matches``' answer for a state ``matches`` allows but does not equal: the
    course, and the groups whose end is not the recorded one (``end``)."""

    course: Course
    others: tuple[tuple[int, int], ...]


def loose(regfile: RegisterFile, start: tuple) -> Loose | bool:
    """``matches`` for a ``Start`` (False for a plain snapshot: no course to go by)."""
    if not isinstance(start, Start) or not start.tasks:
        return False
    known = start.course
    if known is None:
        known = start.course = course(regfile, start, start.tasks)
    others = matches(regfile, start, known)
    return False if others is None else Loose(known, tuple(others))


@dataclass(frozen=True, eq=False)
class Course:
    """Per block (the register file's order): its events in the chain (``_WRITE``, ``_START`` or
    ``("S", value)``), the group each of them went to, the pointer state it ended in; per group
    the registers written into it before the block first ran from it (None: never ran from it)
    and all the chain wrote into it; whether the chain starts the block at all."""

    events: tuple[tuple, ...]
    groups: tuple[tuple[int, ...], ...]
    ends: tuple[tuple, ...]
    written_first: tuple[tuple[frozenset | None, frozenset | None], ...]
    written: tuple[tuple[frozenset, frozenset], ...]
    started: tuple[bool, ...]
    #: ``_same_course``'s answers by (block index, pointer state): a chain of an odd number of
    #: tasks alternates between two states, each asked about on every run
    same: dict = field(default_factory=dict, repr=False)


def course(regfile: RegisterFile, start: tuple, tasks: tuple[tuple[tuple, tuple[str, ...]], ...]) -> Course:
    """The course of a chain run from the snapshot ``start``; ``tasks``: per task its resolved
    writes and the blocks its op-enable started (``_TaskMemo.steps`` and ``.blocks``)."""
    pingpongs = list(regfile.blocks.values())
    index = {id(p): i for i, p in enumerate(pingpongs)}
    by_name = {name: i for i, name in enumerate(regfile.blocks)}
    shadows = [_shadow(p, state[2:]) for p, state in zip(pingpongs, start)]
    events = [[] for _ in pingpongs]
    groups = [[] for _ in pingpongs]
    written = [(set(), set()) for _ in pingpongs]
    first: list[list] = [[None, None] for _ in pingpongs]

    def wrote(i: int, offsets) -> None:
        events[i].append(_WRITE)
        groups[i].append(shadows[i].pointer)
        written[i][shadows[i].pointer].update(offsets)

    for steps, blocks in tasks:
        for kind, target, key, value in steps:
            if kind == _GROUPS:
                for pingpong, values in key:
                    wrote(index[id(pingpong)], values)
            elif kind == _S_POINTER:
                i = index[id(target)]
                events[i].append(("S", value))
                groups[i].append(-1)
                shadows[i].write_s_pointer(value)
            elif kind == _LUT_CFG:
                wrote(index[id(target)], (key,))
            elif kind == _LUT_DATA:
                wrote(index[id(target)], (value,))
            # (_PC: the PC registers, compared whole)
        for name in blocks:
            i = by_name[name]
            group = shadows[i].executer
            events[i].append(_START)
            groups[i].append(group)
            if first[i][group] is None:
                first[i][group] = frozenset(written[i][group])
            shadows[i].started()
    return Course(tuple(map(tuple, events)), tuple(map(tuple, groups)),
                  tuple(_pointers(s) for s in shadows), tuple(tuple(f) for f in first),
                  tuple((frozenset(a), frozenset(b)) for a, b in written),
                  tuple(f != [None, None] for f in first))


def matches(regfile: RegisterFile, start: tuple, known: Course) -> list[tuple[int, int]] | None:
    """Whether a chain whose run from the snapshot ``start`` took course ``known`` runs every task
    from the same register values from the register file's state now (see the module docstring):
    None if not, else the (block index, group) pairs whose end is not the recorded one (``end``)."""
    lut = regfile.lut
    if regfile.pc != start[-1] or (lut.access_type, lut.table, lut.address) != start[-2]:
        return None
    others = []
    for i, (p, recorded) in enumerate(zip(regfile.blocks.values(), start)):
        state = _pointers(p)
        if state != recorded[2:]:
            same = known.same.get((i, state))
            if same is None:
                same = known.same[(i, state)] = _same_course(p, state, known.events[i], known.groups[i],
                                                             known.ends[i])
            if not same:
                return None
        for group, values in enumerate(p.groups):
            was = recorded[group]
            if values == was:
                continue
            first = known.written_first[i][group]
            if first is None and known.started[i]:  # (never run from: its values reach no task)
                others.append((i, group))
            elif first is None or not _equal_outside(values, was, first):
                return None
    return others


def end(regfile: RegisterFile, recorded_end: tuple, known: Course, others) -> tuple:
    """The end snapshot of a replay that ``matches`` allowed from the state now: the recorded end,
    with each of ``others`` (groups never run from) as it is now plus the chain's writes into it."""
    if not others:
        return recorded_end
    blocks = [list(state) for state in recorded_end[:-2]]
    pingpongs = list(regfile.blocks.values())
    for i, group in others:
        values = dict(pingpongs[i].groups[group])
        final = recorded_end[i][group]
        values.update((offset, final[offset]) for offset in known.written[i][group])
        blocks[i][group] = values
    return tuple(map(tuple, blocks)) + recorded_end[-2:]


def _equal_outside(now: dict, was: dict, written: frozenset) -> bool:
    """Whether ``now`` and ``was`` hold the same registers (and values) outside ``written``."""
    for offset, value in now.items():
        if offset not in written and was.get(offset, _MISSING) != value:
            return False
    for offset in was:
        if offset not in written and offset not in now:
            return False
    return True


def _same_course(pingpong: PingPong, state: tuple, events: tuple, groups: tuple, end: tuple) -> bool:
    """Whether the block's events from pointer ``state`` go to the recorded groups and end state."""
    shadow = _shadow(pingpong, state)
    for event, group in zip(events, groups):
        if event == _WRITE:
            if shadow.pointer != group:
                return False
        elif event == _START:
            if shadow.executer != group:
                return False
            shadow.started()
        else:
            shadow.write_s_pointer(event[1])
    return _pointers(shadow) == end


def _shadow(pingpong: PingPong, state: tuple) -> PingPong:
    """A copy of the block's pointer logic in ``state`` (no register values)."""
    pointer, executer, pointer_pp, executer_pp = state
    return PingPong(pingpong.block, ({}, {}), pointer, executer, pointer_pp, executer_pp,
                    pingpong.s_pointer_fields)


def _pointers(pingpong: PingPong) -> tuple:
    return pingpong.pointer, pingpong.executer, pingpong.pointer_pp, pingpong.executer_pp
