"""The vendor's exLSTM programs (rknn-fixtures-ops lstm_int8 / lstm_fp16): what the words the
relocation table points at the placeholder tensor 0 are, and the PC that fetches each block when it
starts it (emulator/rknn_self_modifying.py, REGISTER_SEMANTICS.md 32)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emulator.test_machine_support import MASK_FLYING, REGMAP, flying_task
from tests.shared_data import RKNN_FIXTURES_OPS
from npuemu.emulator.machine import Machine
from npuemu.emulator.rknn_runner import RknnRunner
from npuemu.emulator import rknn_self_modifying as sm
from npuemu.emulator.rknn_self_modifying import run_fetching_each_block
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import EmulationError, UnsupportedProgramError
from npuemu.isa.rknn import load_rknn, relocate
from npuemu.isa.task import Chain
from npuemu.isa.words import decode_word, encode_write

LSTM = ("lstm_int8", "lstm_fp16")


def _model(case: str):
    return load_rknn(RKNN_FIXTURES_OPS / case / "model.rknn")


def _register(word: int) -> str:
    decoded = decode_word(int(word), REGMAP)
    return f"{decoded.block}.{decoded.register}"


@pytest.mark.parametrize("case", LSTM)
def test_placeholder_words_are_dpu_outputs_into_later_register_words(case):
    """The 7 relocated words are DPU DST_BASE_ADDR writes; relocated to the regcmd buffer they
    point at 4 DPU_RDMA source addresses, 1 DPU destination address and the replayed step's PC
    tail (BASE_ADDRESS, REGISTER_AMOUNTS) of later blocks."""
    model = _model(case)
    with pytest.raises(UnsupportedProgramError, match="placeholder tensor 0"):
        relocate(model)                                     # still refused unless asked for
    program = relocate(model, self_modifying=True)
    (entry,) = [e for e in model.relocations if e.tensor_index == 0]
    base = program.bases.regcmd
    writers = [_register(program.regcmd[word]) for _, word in entry.pairs]
    assert writers == ["DPU.DST_BASE_ADDR"] * 7
    targets = [((int(program.regcmd[word]) >> 16) & 0xFFFFFFFF) - base for _, word in entry.pairs]
    assert all(t % 16 == 0 for t in targets)                # a 16-byte DPU write: two words each
    written = [_register(model.program.regcmd[t // 8]) for t in targets]
    assert written == ["DPU_RDMA.SRC_BASE_ADDR"] * 4 + ["DPU.DST_BASE_ADDR", "PC.BASE_ADDRESS",
                                                         "PC.REGISTER_AMOUNTS"]


@pytest.mark.parametrize("case", LSTM)
def test_rubik_convs_assemble_register_words(case):
    """The writing tasks are int16 1x1 convs whose bias is a register word's 4 int16 fields
    [register, 0, 0, target] (named by the register) and whose one-hot weights copy two int16
    input channels (a 32-bit value's halves) into fields 1 and 2: 4 words per 16-channel output."""
    model = _model(case)
    targets = {"0x14": 0x0101, "0x10": 0x0101, "0x5018": 0x2001, "0x4020": 0x1001}   # PC, PC, DPU_RDMA, DPU
    for register, target in targets.items():
        bias = np.frombuffer(bytes(model.blob(model.tensor(f"RubikConvBias_{register}"))), "<i4")
        assert bias.tolist() == [int(register, 16), 0, 0, target] * 4
    weight = np.frombuffer(bytes(model.blob(model.tensor("RubikConvWeight"))), "<i2").reshape(16, 8)
    expected = np.zeros((16, 8), np.int16)
    for word in range(4):
        expected[4 * word + 1, 0] = expected[4 * word + 2, 1] = 1
    np.testing.assert_array_equal(weight, expected)


@pytest.mark.parametrize("case", LSTM)
def test_lstm_runs_every_block_and_replays_the_step(case, monkeypatch):
    """The PC fetches block by block through the whole program (REGISTER_SEMANTICS.md 38): blocks 0-32
    (the set-up and the first time step), blocks 33-75 fifteen times - the link back to block 33 is
    what the Rubik convs write into block 75's tail - and the final block: 33 + 15 x 43 + 1 = 679 fetches
    for lstm_int8, as many as the chain has task records (the vendor's table unrolls the loop)."""
    model = _model(case)
    runner = RknnRunner(model)
    assert runner.self_modifying
    run = runner.run([np.zeros(model.input_tensors[0].shape, np.float32)])
    assert len(run.chain.tasks) == model.program.chains[0].task_count
    fetched = []
    real = sm.parse_block
    monkeypatch.setattr(sm, "parse_block",
                        lambda words, regmap, where: fetched.append(where) or real(words, regmap, where))
    runner.run([np.zeros(model.input_tensors[0].shape, np.float32)])
    stack = np.frombuffer(bytes(model.blob(model.tensor("DynamicCMD_StackBuf"))), "<u4")
    replay = f"(block at {runner.program.bases.regcmd + int(stack[608 // 4]):#x})"   # the loop's first block
    assert sum(where.endswith(replay) for where in fetched) == 15


def test_multicore_run_of_a_self_modifying_program_is_refused():
    with pytest.raises(UnsupportedProgramError, match="writes into its own regcmd buffer"):
        RknnRunner(_model("lstm_int8"), cores=(0, 1))


# --- the PC on a small program that rewrites itself ----------------------------------------------

REG, SRC, DST, NEW_DST, PATCH = 0x100000, 0x10000, 0x20000, 0x30000, 0x40000


def _copy(src: int, dst: int, *, lead: int = 0):
    """A DPU copy of 16 int8 bytes; ``lead`` extra writes first (to move the later words)."""
    t = flying_task(1, 1, 16, src=src, dst=dst)
    t.writes[:0] = t.writes[:1] * lead     # its first write (DPU S_POINTER 0xe) repeated up front
    return t


def _word_index(encoded, task: int, block: str, register: str) -> int:
    words = np.frombuffer(encoded.data, "<u8")
    first = (encoded.task_addresses[task] - encoded.base_addr) // 8
    return next(i for i in range(first, words.size) if words[i] and _register(words[i]) == f"{block}.{register}")


def _program(patch_register: tuple[str, str]):
    """Block 0 copies PATCH (16 bytes) over the two words of block 2 starting at ``patch_register``
    (even word index: a 16-byte write); block 1 and 2 copy SRC to DST; block 3, after the chain's
    stored end, copies SRC to NEW_DST + 0x100."""
    for lead in range(2):
        tasks = [_copy(PATCH, 0).task(MASK_FLYING), _copy(SRC, DST).task(MASK_FLYING),
                 _copy(SRC, DST, lead=lead).task(MASK_FLYING)]
        encoded = encode_chain(Chain(tuple(tasks)), REGMAP, base_addr=REG)
        index = _word_index(encoded, 2, *patch_register) if patch_register[0] != "PC" else \
            (encoded.task_addresses[2] - REG) // 8 + len(tasks[2].writes)
        if index % 2 == 0:
            break
    assert index % 2 == 0
    tasks[0] = _copy(PATCH, REG + index * 8).task(MASK_FLYING)
    encoded = encode_chain(Chain(tuple(tasks)), REGMAP, base_addr=REG)
    extra = encode_chain(Chain((_copy(SRC, NEW_DST + 0x100).task(MASK_FLYING),)), REGMAP, base_addr=REG + 0x4000)
    return encoded, extra, index


def _machine(encoded, extra, patch: list[int]) -> Machine:
    machine = Machine.for_platform("rk3588", ddr_size=4 << 20)
    machine.memory.load(REG, encoded.data)
    machine.memory.load(extra.base_addr, extra.data)
    machine.memory.load(SRC, bytes(range(1, 17)))
    machine.memory.load(PATCH, np.asarray(patch, "<u8").tobytes())
    return machine


def test_a_register_word_written_by_an_earlier_task_is_used():
    encoded, extra, index = _program(("DPU", "DST_BASE_ADDR"))
    words = np.frombuffer(encoded.data, "<u8")
    patch = [encode_write(REGMAP, "DPU", "DST_BASE_ADDR", NEW_DST), int(words[index + 1])]
    machine = _machine(encoded, extra, patch)
    run = run_fetching_each_block(machine, REG, encoded.first_amount, 3, (0x200000, 256))
    assert len(run.tasks) == 3
    assert machine.memory.dump(NEW_DST, 16).tobytes() == bytes(range(1, 17))   # block 2 used the new word
    # the emulator's own PC decodes the chain before running it, so it writes the stored address
    before = _machine(encoded, extra, patch)
    before.run_chain(REG, encoded.first_amount)
    assert before.memory.dump(NEW_DST, 16).tobytes() == bytes(16)


def test_a_tail_written_at_run_time_is_followed():
    """Block 0 rewrites block 2's tail (a chain end) into a link to block 3: the PC runs 0, 1, 2, 3."""
    encoded, extra, index = _program(("PC", "BASE_ADDRESS"))
    amount = encode_write(REGMAP, "PC", "REGISTER_AMOUNTS", extra.first_amount)
    machine = _machine(encoded, extra, [encode_write(REGMAP, "PC", "BASE_ADDRESS", extra.base_addr), amount])
    run = run_fetching_each_block(machine, REG, encoded.first_amount, 8, (0x200000, 256))
    assert len(run.tasks) == 4
    assert machine.memory.dump(NEW_DST + 0x100, 16).tobytes() == bytes(range(1, 17))


def test_task_count_stops_the_pc():
    encoded, extra, index = _program(("PC", "BASE_ADDRESS"))
    amount = encode_write(REGMAP, "PC", "REGISTER_AMOUNTS", extra.first_amount)
    machine = _machine(encoded, extra, [encode_write(REGMAP, "PC", "BASE_ADDRESS", extra.base_addr), amount])
    assert len(run_fetching_each_block(machine, REG, encoded.first_amount, 2, (0x200000, 256)).tasks) == 2
    assert machine.memory.dump(DST, 16).tobytes() == bytes(range(1, 17))
    assert machine.memory.dump(NEW_DST + 0x100, 16).tobytes() == bytes(16)
