"""Per-core register files: two ping-pong groups per block, the S_POINTER logic that picks
them, and the DPU's LUT access port.

Model (evidence in REGISTER_SEMANTICS.md section 1):

- Every block (CNA, CORE, DPU, DPU_RDMA, PPU, PPU_RDMA) has two register groups; a register
  write lands in the group the block's *pointer* selects, and an op-enable that starts the
  block runs it from the group its *executer* selects (rknpu-isa.md 2.5; TRM 36.5.1).
- ``S_POINTER`` (block + 0x004, not itself shadowed: the TRM shadows "everything from
  OPERATION_ENABLE upward"): POINTER_PP_EN / EXECUTER_PP_EN make the pointer / executer flip
  after each op-enable that starts the block; POINTER_PP_CLEAR / EXECUTER_PP_CLEAR reset them
  to group 0; with POINTER_PP_EN = 0 the written POINTER bit selects the group by software.
  POINTER_PP_MODE (bit 3) has no modelled effect.
- With 0xe in every block (the vendor driver sets CNA and CORE, the stream sets DPU, DPU_RDMA,
  PPU, PPU_RDMA), task n writes and runs group n % 2 of each block it starts, so a task's
  state is the accumulation of the writes of tasks n, n-2, n-4, ...: the vendor's delta tasks
  are deltas against the task two before (rep05 only computes correctly that way).
- Groups start at 0 (reset) and persist across tasks and chains on the same core.

``LUT_ACCESS_CFG``/``LUT_ACCESS_DATA`` form an access port into the LUT RAM: a data write with
LUT_ACCESS_TYPE = 1 stores into table LUT_TABLE_ID at the current address and advances it
(rep10 uploads 513 words per table after setting the address to 0). The RAM belongs to the
core, not to a register group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from npuemu.emulator.memo import Memo
from npuemu.isa.errors import EmulationError
from npuemu.isa.lut_format import LUT_ACCESS_WRITE, LUT_ENTRIES, LUT_TABLES, entries
from npuemu.isa.regmap import Block, RegisterMap

S_POINTER_OFFSET = 0x004  # block-relative (rknpu-isa.md 2.5)
#: What the vendor driver writes to CNA and CORE S_POINTER before a job (rknpu-isa.md 2.3:
#: 0xe | 0x10000000 * core; bit 28 is reserved in the TRM and has no modelled effect).
DRIVER_S_POINTER = 0xE
DRIVER_S_POINTER_BLOCKS = ("CNA", "CORE")
#: kinds of RegisterFile.resolve steps (_GROUP steps are merged into _GROUPS before apply sees them);
#: _LUT_STORE: a store into the LUT RAM worked out ahead (RegisterFile.lut_stores)
_GROUP, _PC, _S_POINTER, _LUT_DATA, _GROUPS, _LUT_CFG, _LUT_STORE = range(7)
#: the int16 entries of a resolved run of LUT_ACCESS_DATA words (read-only: ``resolve`` makes them
#: so), by the very array: a replayed chain uploads the same tables every run (issue 20, ppocr_rec
#: fp16: ~390 runs of 513 words a run)
_ENTRIES: Memo[np.ndarray] = Memo(entries, identity=1, limit=1024)


@dataclass
class PingPong:
    """One block's two register groups and its pointer / executer state."""

    block: Block
    groups: tuple[dict[int, int], dict[int, int]] = field(default_factory=lambda: ({}, {}))
    pointer: int = 0
    executer: int = 0
    pointer_pp: bool = False
    executer_pp: bool = False

    #: S_POINTER fields by value (a stream writes the same few values every task)
    s_pointer_fields: dict[int, dict[str, int]] = field(default_factory=dict, repr=False)

    def write_s_pointer(self, value: int) -> None:
        fields = self.s_pointer_fields.get(value)
        if fields is None:
            fields = self.s_pointer_fields[value] = self.block.register("S_POINTER").unpack(value)
        self.pointer_pp = bool(fields["POINTER_PP_EN"])
        self.executer_pp = bool(fields["EXECUTER_PP_EN"])
        if fields["POINTER_PP_CLEAR"]:
            self.pointer = 0
        if fields["EXECUTER_PP_CLEAR"]:
            self.executer = 0
        if not self.pointer_pp:
            self.pointer = fields["POINTER"]
        if not self.executer_pp:
            # Without executer ping-pong the block runs the group software programs.
            self.executer = self.pointer

    def started(self) -> None:
        """After an op-enable that started the block."""
        if self.pointer_pp:
            self.pointer ^= 1
        if self.executer_pp:
            self.executer ^= 1


@dataclass(frozen=True)
class RegisterView:
    """The register values of one block's executing group, frozen for a task."""

    block: Block
    group: int
    values: Mapping[int, int]  # full register offset -> raw 32-bit value (missing = 0)

    def raw(self, register: str) -> int:
        return self.values.get(self.block.register(register).offset, 0)

    def field(self, register: str, name: str) -> int:
        reg = self.block.register(register)
        return reg.field(name).extract(self.values.get(reg.offset, 0))

    def fields(self, register: str) -> dict[str, int]:
        reg = self.block.register(register)
        return reg.unpack(self.values.get(reg.offset, 0))

    def was_written(self, register: str) -> bool:
        return self.block.register(register).offset in self.values

    def show(self, register: str, name: str | None = None) -> str:
        """``BLOCK.REGISTER=0x...`` (or ``.FIELD=value``) for error messages."""
        if name is None:
            return f"{self.block.name}.{register}={self.raw(register):#x}"
        return f"{self.block.name}.{register}.{name}={self.field(register, name)}"


@dataclass
class LutPort:
    """The DPU LUT RAM (two 513-entry int16 tables) and its access port."""

    tables: np.ndarray = field(default_factory=lambda: np.zeros((2, LUT_ENTRIES), np.int16))
    access_type: int = 0
    table: int = 0
    address: int = 0

    def configure(self, fields: Mapping[str, int]) -> None:
        self.access_type = fields["LUT_ACCESS_TYPE"]
        self.table = fields["LUT_TABLE_ID"]
        self.address = fields["LUT_ADDR"]

    def data(self, value: int, where: str) -> None:
        if self.access_type != LUT_ACCESS_WRITE:
            return  # a read-type access: the data register is not stored [I] (REGISTER_SEMANTICS 1.3)
        if self.address >= LUT_ENTRIES:
            raise EmulationError(
                f"{where}: DPU.LUT_ACCESS_DATA write to {LUT_TABLES[self.table]} table entry "
                f"{self.address}, past its {LUT_ENTRIES} entries (DPU.LUT_ACCESS_CFG set the start address)")
        self.tables[self.table, self.address] = entries(value)
        self.address += 1

    def data_run(self, values: np.ndarray, where: str) -> bool:
        """:meth:`data` for each of ``values`` (int64 words) in one assignment: True when done (a
        read-type access stores nothing), False (nothing done) when they would pass the table's end."""
        if self.access_type != LUT_ACCESS_WRITE:
            return True
        end = self.address + values.size
        if end > LUT_ENTRIES:
            return False
        self.tables[self.table, self.address:end] = entries(values) if values.flags.writeable else _ENTRIES(values)
        self.address = end
        return True


class RegisterFile:
    """All ping-pong register groups of one core, plus its LUT port."""

    def __init__(self, regmap: RegisterMap) -> None:
        self.regmap = regmap
        self.blocks: dict[str, PingPong] = {
            b.name: PingPong(b) for b in regmap.blocks if b.op_enable_bit is not None}
        self.lut = LutPort()
        self.pc: dict[str, int] = {}  # PC registers written by the stream (outside the tail)

    def driver_setup(self, core_index: int) -> None:
        """What the vendor driver writes over MMIO before launching a job (rknpu-isa.md 2.3)."""
        for name in DRIVER_S_POINTER_BLOCKS:
            if name in self.blocks:
                self.blocks[name].write_s_pointer(DRIVER_S_POINTER | (core_index << 28))

    def write(self, block: str, register: str, value: int, where: str) -> None:
        if block == "PC":
            self.pc[register] = value
            return
        pingpong = self.blocks.get(block)
        if pingpong is None:
            raise EmulationError(f"{where}: write to {block}.{register}, a block the core does not have")
        reg = pingpong.block.register(register)
        if reg.offset - pingpong.block.base == S_POINTER_OFFSET:
            pingpong.write_s_pointer(value)
            return
        pingpong.groups[pingpong.pointer][reg.offset] = value
        if block == "DPU" and register == "LUT_ACCESS_CFG":
            self.lut.configure(reg.unpack(value))
        elif block == "DPU" and register == "LUT_ACCESS_DATA":
            self.lut.data(value, where)

    def resolve(self, writes: Iterable) -> tuple[tuple, ...] | None:
        """The writes of a task as ``(kind, target, key, value)`` steps for :meth:`apply`, looked
        up once; None if one of them needs :meth:`write`'s error (a block the core lacks)."""
        steps = []
        for write in writes:
            block, register, value = write.block, write.register, write.value
            if block == "PC":
                steps.append((_PC, self.pc, register, value))
                continue
            pingpong = self.blocks.get(block)
            if pingpong is None:
                return None
            reg = pingpong.block.register(register)
            if reg.offset - pingpong.block.base == S_POINTER_OFFSET:
                steps.append((_S_POINTER, pingpong, None, value))
            elif block == "DPU" and register == "LUT_ACCESS_DATA":
                # a run of table uploads (513 words per table) becomes one step
                if steps and steps[-1][0] == _LUT_DATA:
                    steps[-1][2].append(value)
                else:
                    steps.append((_LUT_DATA, pingpong, [value], reg.offset))
            elif block == "DPU" and register == "LUT_ACCESS_CFG":
                steps.append((_LUT_CFG, pingpong, reg.offset, (value, reg.unpack(value))))
            else:
                steps.append((_GROUP, pingpong, reg.offset, value))
        return tuple(_merge_group_runs((kind, target, _frozen(key), value) if kind == _LUT_DATA
                                       else (kind, target, key, value) for kind, target, key, value in steps))

    def apply(self, steps: tuple[tuple, ...], where: str) -> None:
        """Apply :meth:`resolve`'s steps: the same effect as :meth:`write` for each write."""
        for kind, target, key, value in steps:
            if kind == _GROUPS:  # key: per block, its writes in stream order (later ones win)
                for pingpong, values in key:
                    pingpong.groups[pingpong.pointer].update(values)
            elif kind == _PC:
                target[key] = value
            elif kind == _S_POINTER:
                target.write_s_pointer(value)
            elif kind == _LUT_CFG:  # key: the register's offset; value: (raw, its fields)
                target.groups[target.pointer][key] = value[0]
                self.lut.configure(value[1])
            else:  # _LUT_DATA; key: the data words; value: the register's offset
                if not self.lut.data_run(key, where):
                    for word in key:  # one at a time, to the error at the right word
                        self.write("DPU", "LUT_ACCESS_DATA", int(word), where)
                    continue
                target.groups[target.pointer][value] = int(key[-1])

    def view(self, block: str) -> RegisterView:
        """The executing group of ``block`` as it stands now."""
        pingpong = self.blocks[block]
        return RegisterView(pingpong.block, pingpong.executer, dict(pingpong.groups[pingpong.executer]))

    def unchanged(self, views: Mapping[str, RegisterView]) -> bool:
        """Whether :meth:`view` of each block would equal ``views`` now (same group, same values)."""
        for name, view in views.items():
            pingpong = self.blocks[name]
            if view.group != pingpong.executer or view.values != pingpong.groups[pingpong.executer]:
                return False
        return True

    def started(self, blocks: Iterable[str]) -> None:
        for name in blocks:
            self.blocks[name].started()

    # -- whole-state copies, for the core's chain replay (core.py) ----------------------------
    def snapshot(self) -> tuple:
        """Every group's values, every pointer, the LUT port's position and the PC registers,
        copied (not the LUT RAM: a replay applies the chain's LUT writes, :meth:`apply_lut`)."""
        lut = self.lut
        return tuple((dict(p.groups[0]), dict(p.groups[1]), p.pointer, p.executer, p.pointer_pp,
                      p.executer_pp) for p in self.blocks.values()) \
            + ((lut.access_type, lut.table, lut.address), dict(self.pc))

    def matches(self, snapshot: tuple):
        """Whether a chain recorded from ``snapshot`` can replay from the state now: True when the
        state equals it (same values, groups and pointers); for a recorded run's start
        (``replay_match.Start``) a ``replay_match.Loose`` when it differs only where no task of
        that chain can see it (replay_match.py); else False."""
        if self.equals(snapshot):
            return True
        check = getattr(snapshot, "loose", None)  # (a replay_match.Start carries its own check)
        return check(self) if check is not None else False

    def equals(self, snapshot: tuple) -> bool:
        """Whether the state now equals ``snapshot`` (same values, groups and pointers)."""
        lut = self.lut
        if self.pc != snapshot[-1] or (lut.access_type, lut.table, lut.address) != snapshot[-2]:
            return False
        for p, (first, second, pointer, executer, pointer_pp, executer_pp) in zip(self.blocks.values(), snapshot):
            if p.pointer != pointer or p.executer != executer or p.pointer_pp != pointer_pp \
                    or p.executer_pp != executer_pp or p.groups[0] != first or p.groups[1] != second:
                return False
        return True

    def restore(self, snapshot: tuple) -> None:
        """Set the state to ``snapshot`` (copied again: the snapshot stays as it was)."""
        # in place: resolved steps hold the PC dict (and the groups are looked up through them)
        for p, (first, second, pointer, executer, pointer_pp, executer_pp) in zip(self.blocks.values(), snapshot):
            for group, values in zip(p.groups, (first, second)):
                group.clear()
                group.update(values)
            p.pointer, p.executer, p.pointer_pp, p.executer_pp = pointer, executer, pointer_pp, executer_pp
        self.lut.access_type, self.lut.table, self.lut.address = snapshot[-2]
        self.pc.clear()
        self.pc.update(snapshot[-1])

    def restore_from(self, start: tuple, end: tuple, moves: list) -> None:
        """:meth:`restore` of ``end`` for a state that equals ``start`` but for the LUT port's position (a
        replay's: its tasks' writes are not made, its LUT port writes are): only the values, keys and
        pointers that differ between them set (issue 20: silero-vad's end state differs from its start in a
        few values; restore copies ~340). ``moves``: the differences, worked out at the first call (kept
        with the snapshots they are for)."""
        if not moves or moves[0] is not start or moves[1] is not end:
            moves[:] = [start, end, self._moves(start, end), start[-1] != end[-1]]
        blocks = self.blocks
        for name, group, values, dropped in moves[2]:
            pingpong = blocks[name]
            if group is None:
                pingpong.pointer, pingpong.executer, pingpong.pointer_pp, pingpong.executer_pp = values
                continue
            held = pingpong.groups[group]
            held.update(values)
            for key in dropped:
                del held[key]
        self.lut.access_type, self.lut.table, self.lut.address = end[-2]
        if moves[3]:
            self.pc.clear()
            self.pc.update(end[-1])

    def _moves(self, start: tuple, end: tuple) -> list:
        """``restore_from``'s differences: per block (name), per group the values ``end`` sets and the keys
        it lacks, and (group None) its pointers where they differ."""
        moves = []
        for name, was, now in zip(self.blocks, start, end):
            for group in (0, 1):
                before, after = was[group], now[group]
                values = {key: value for key, value in after.items() if before.get(key, _ABSENT) != value}
                dropped = tuple(key for key in before if key not in after)
                if values or dropped:
                    moves.append((name, group, values, dropped))
            if tuple(was[2:6]) != tuple(now[2:6]):
                moves.append((name, None, tuple(now[2:6]), ()))
        return moves

    @staticmethod
    def lut_steps(steps: tuple[tuple, ...]) -> tuple[tuple, ...]:
        """The steps of :meth:`resolve` that move the LUT port or fill the LUT RAM."""
        return tuple(step for step in steps if step[0] in (_LUT_DATA, _LUT_CFG))

    @staticmethod
    def lut_inert(start: tuple, steps: Iterable[tuple]) -> bool:
        """Whether the LUT steps of a chain that starts in the :meth:`snapshot` ``start`` never
        store into the RAM: the port is read-type at the start and every LUT_ACCESS_CFG write keeps
        it so (a read-type data write stores nothing, LutPort.data). The port's own position then
        comes back with the end state's :meth:`restore`."""
        return start[-2][0] != LUT_ACCESS_WRITE and all(
            value[1]["LUT_ACCESS_TYPE"] != LUT_ACCESS_WRITE for kind, _, _, value in steps if kind == _LUT_CFG)

    @staticmethod
    def lut_stores(port: tuple, luts: Iterable[tuple[tuple, ...]]) -> list[tuple[tuple, ...]] | None:
        """Per task of a chain, its :meth:`lut_steps` (``luts``) as the stores into the LUT RAM they
        make, for :meth:`apply_lut` (issue 20: ppocr_cls's chain sets the port to read-type and writes
        one data word, which stores nothing, before each of its 93 tasks; 27 of them also upload
        tables). The port's state at the chain's start is ``port`` (a :meth:`snapshot`'s
        (access type, table, address): a replay starts only from it), so where each data write lands
        is known ahead; a store of entries an earlier store of the chain left in place is left out.
        The port itself comes back with the end state's :meth:`restore`. None where a run of words
        would pass a table's end or name no table (:meth:`apply_lut` then keeps the steps, to the error)."""
        access, table, address = port
        known = np.full((len(LUT_TABLES), LUT_ENTRIES), -1 << 20, np.int32)  # (a value no entry has)
        stores = []
        for steps in luts:
            made = []
            for kind, _, key, value in steps:
                if kind == _LUT_CFG:
                    access, table, address = (value[1]["LUT_ACCESS_TYPE"], value[1]["LUT_TABLE_ID"],
                                              value[1]["LUT_ADDR"])
                    continue
                if access != LUT_ACCESS_WRITE:  # (LutPort.data: a read-type access stores nothing)
                    continue
                end = address + key.size
                if not 0 <= table < len(LUT_TABLES) or end > LUT_ENTRIES:
                    return None
                values = entries(key) if key.flags.writeable else _ENTRIES(key)
                if not np.array_equal(known[table, address:end], values):
                    made.append((_LUT_STORE, table, address, values))
                    known[table, address:end] = values
                address = end
            stores.append(_whole_ram(made))
        return stores

    def apply_lut(self, steps: tuple[tuple, ...], where: str) -> None:
        """:meth:`apply` of :meth:`lut_steps` for the port and RAM alone (the group values they
        also set come back with a later :meth:`restore`), or the stores :meth:`lut_stores` made of them."""
        for kind, target, key, value in steps:
            if kind == _LUT_STORE:  # target: the table (None: all); key: the first entry; value: the int16 entries
                if target is None:
                    self.lut.tables[...] = value
                else:
                    self.lut.tables[target, key:key + value.size] = value
            elif kind == _LUT_CFG:
                self.lut.configure(value[1])
            elif not self.lut.data_run(key, where):
                for word in key:  # one at a time, to the error at the right word
                    self.write("DPU", "LUT_ACCESS_DATA", int(word), where)


def _whole_ram(made: list) -> tuple:
    """A task's stores (``RegisterFile.lut_stores``), those that fill every table from its first entry in table
    order as one store of the whole RAM (target None: one copy, ~0.15 us, for ~0.55: silero-vad uploads both
    tables before each of its 3-4 LUT tasks)."""
    if len(made) == len(LUT_TABLES) and all(step[1] == table and step[2] == 0 and step[3].size == LUT_ENTRIES
                                            for table, step in enumerate(made)):
        return ((_LUT_STORE, None, 0, np.stack([step[3] for step in made])),)
    return tuple(made)


#: a value no register holds (``RegisterFile._moves``)
_ABSENT = object()


def lut_ram_after(steps: tuple[tuple, ...]) -> np.ndarray | None:
    """The LUT RAM's entries after a task's LUT steps whose last one stores the whole RAM (``_whole_ram``'s store:
    the same entries whatever the RAM held), else None."""
    if steps and steps[-1][0] == _LUT_STORE and steps[-1][1] is None:
        return steps[-1][3]
    return None


def lut_stores_only(steps: tuple[tuple, ...]) -> bool:
    """Whether a task's LUT steps (``apply_lut``'s) are all stores :meth:`RegisterFile.lut_stores` worked out
    ahead: within the RAM, they cannot raise, and leave the port as it was."""
    return all(step[0] == _LUT_STORE for step in steps)


def _frozen(words: list[int]) -> np.ndarray:
    """A run of LUT_ACCESS_DATA words as a read-only int64 array (its entries are memoised by identity)."""
    array = np.array(words, np.int64)
    array.flags.writeable = False
    return array


def _merge_group_runs(steps: Iterable[tuple]) -> list[tuple]:
    """Consecutive plain register writes become one step of per-block dicts: no write between
    them moves a pointer, so each block's run lands in one group (a task's ~100-300 writes
    become a few ``dict.update`` calls instead of a Python loop over every write)."""
    merged: list[tuple] = []
    run: dict[int, tuple[PingPong, dict[int, int]]] = {}

    def close() -> None:
        if run:
            merged.append((_GROUPS, None, tuple(run.values()), None))
            run.clear()

    for step in steps:
        kind, target, key, value = step
        if kind == _GROUP:
            run.setdefault(id(target), (target, {}))[1][key] = value
            continue
        close()
        merged.append(step)
    close()
    return merged
