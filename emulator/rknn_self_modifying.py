"""A PC that fetches each task block from DDR only when it starts it: for vendor programs whose
tasks write into the regcmd buffer (the exLSTM of lstm_int8 / lstm_fp16, isa/RKNN_TAILS.md 2).

The emulator's own PC (core.py) decodes a whole chain before running it and refuses a chain that
comes back to a block it already ran; that is exact for programs whose words do not change while
they run. The exLSTM's do: its int16 "Rubik" convolutions assemble register words (PC
BASE_ADDRESS / REGISTER_AMOUNTS of the replayed step's tail, DPU_RDMA SRC_BASE_ADDR and DPU
DST_BASE_ADDR of later blocks) and the DPU writes them into the buffer, so which block runs next,
and on which addresses, is known only at run time (REGISTER_SEMANTICS.md 32).

Here, as on the hardware, the PC fetches a block when the task before it has finished: it reads
the block's fetch amount of words from DDR as they are then, takes the last PC BASE_ADDRESS /
REGISTER_AMOUNTS writes before the marker as the link (the vendor repeats them, identical, so a
16-byte DPU write can replace them) and runs the block's other writes as a one-task chain from a
scratch copy whose tail ends the chain; the driver's task count (TASK_CONTROL, rknpu-isa.md 2.3)
stops it. [C] The PC's prefetch of the next block while a task runs (TASK_CON pp_en) is not
modelled: a block is read after every earlier task has written. [C] The copy's fetch leaves out
the extra PC words, so the regcmd bytes counted for such a block are up to 3 words fewer.
The values the exLSTM computes are offsets (DynamicCMD_StackBuf); :class:`Rebase` makes the fetched
run-time words addresses (REGISTER_SEMANTICS.md 38).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from npuemu.emulator.machine import ChainRun, Machine
from npuemu.isa.chain import SEGMENT_ALIGN, fetch_amount, fetch_words
from npuemu.isa.errors import EmulationError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.words import MARKER_WORD, WORD_BYTES, WordKind, decode_word, encode_write

_PC_LINK = {"BASE_ADDRESS", "REGISTER_AMOUNTS"}


@dataclass(frozen=True)
class FetchedBlock:
    """One block as the PC fetched it: its ordinary writes, op-enable word and the link it names."""

    body: tuple[int, ...]          # raw words of the non-PC register writes, in order
    enable: int                    # the 0x0081 op-enable word
    next_address: int              # last PC BASE_ADDRESS write (0: none / a zero link)
    next_amount_word: int          # last PC REGISTER_AMOUNTS value (bits 15:0 = 0 end the chain)


def parse_block(words: np.ndarray, regmap: RegisterMap, where: str) -> FetchedBlock:
    """The fetched words -> a :class:`FetchedBlock`. The block must end in [PC writes][marker]
    [op-enable] (zero words around them allowed: the vendor's chain-end link and 64-byte padding)."""
    decoded = [decode_word(int(word), regmap) for word in words]
    kinds = [word.kind for word in decoded]
    if WordKind.OP_ENABLE not in kinds:
        raise EmulationError(f"{where}: the fetched words hold no op-enable word (0x0081); a real NPU hangs here")
    end = kinds.index(WordKind.OP_ENABLE)
    if end == 0 or kinds[end - 1] is not WordKind.MARKER:
        raise EmulationError(f"{where}: word {end - 1} before the op-enable word is not the 0x0041 marker")
    body, link = [], {"BASE_ADDRESS": 0, "REGISTER_AMOUNTS": 0}
    for index, word in enumerate(decoded[:end - 1]):
        if word.kind is WordKind.ZERO:
            continue
        if word.kind is not WordKind.WRITE:
            raise EmulationError(f"{where}: word {index} ({word.raw:#018x}) is not a register write")
        if word.block == "PC" and word.register in _PC_LINK:
            link[word.register] = word.value
        elif link["BASE_ADDRESS"] or link["REGISTER_AMOUNTS"]:
            raise EmulationError(f"{where}: word {index} writes {word.block}.{word.register} after the PC link "
                                 f"words; only the marker and op-enable word may follow them")
        else:
            body.append(word.raw)
    return FetchedBlock(tuple(body), decoded[end].raw, link["BASE_ADDRESS"], link["REGISTER_AMOUNTS"])


def scratch_words(largest_regcfg: int) -> int:
    """Words to reserve for the scratch copy: the largest block and its tail, 64-byte aligned."""
    return _aligned(largest_regcfg + 4)


def _aligned(words: int) -> int:
    per = SEGMENT_ALIGN // WORD_BYTES
    return -(-words // per) * per


@dataclass(frozen=True)
class Rebase:
    """What the exLSTM's run-time words are relative to (REGISTER_SEMANTICS.md 38) [V: lstm_int8: the int32
    tasks compute 0xc20 + 0x1000 k for DPU_RDMA SRC_BASE_ADDR words the file relocates to y_compute_zone +
    0xc10 + 0x1000 k, x_exSecondary2 + 0x40 t for a DPU DST word relocated to x_exSecondary2 + 0x40, and
    0x9e80, block 33's offset in the regcmd buffer, for the replay's PC BASE_ADDRESS: DynamicCMD_StackBuf
    holds offsets, and the file says nowhere how the runtime makes them addresses]. [C] A fetched word that
    differs from the relocated program's (a DPU task wrote it) gets the base the file relocates that word
    against added to its value - the tensor's address, or the regcmd buffer's for a PC BASE_ADDRESS."""

    regcmd: int                       # the regcmd buffer's device address
    words: np.ndarray                 # the relocated program's words (uint64), as loaded
    tensor_bases: dict[int, int]      # word index -> address of the tensor its relocation entry names

    @classmethod
    def of(cls, model, program) -> Rebase:
        bases = {}
        for entry in model.relocations:
            if entry.tensor_name in program.addresses:
                for _, word in entry.pairs:
                    bases[word] = program.addresses[entry.tensor_name]
        return cls(program.bases.regcmd, program.regcmd, bases)

    def apply(self, address: int, raw: np.ndarray, regmap: RegisterMap) -> np.ndarray:
        """The fetched words with the run-time ones made addresses (a copy when any changes)."""
        first = (address - self.regcmd) // WORD_BYTES
        out = raw
        for i, word in enumerate(raw.tolist()):
            index = first + i
            if not 0 <= index < self.words.size or word == int(self.words[index]):
                continue
            decoded = decode_word(word, regmap)
            if decoded.kind is not WordKind.WRITE:
                continue
            base = self.tensor_bases.get(index)
            if base is None and decoded.block == "PC" and decoded.register == "BASE_ADDRESS":
                base = self.regcmd
            if base:
                out = out.copy() if out is raw else out
                out[i] = encode_write(regmap, decoded.block, decoded.register, (decoded.value + base) & 0xFFFFFFFF)
        return out


def run_fetching_each_block(machine: Machine, address: int, amount: int, task_count: int,
                            scratch: tuple[int, int], core: int = 0, rebase: Rebase | None = None) -> ChainRun:
    """Run up to ``task_count`` blocks from ``address`` (first fetch ``amount``), each read from DDR
    when it starts (module note); ``scratch``: (address, words) of the copy's buffer; ``rebase``: the
    run-time words' bases (:class:`Rebase`). The records are in run order."""
    memory, regmap = machine.memory, machine.regmap
    scale = machine.platform.pc.data_amount_scale
    records, start, start_amount = [], address, amount
    for step in range(task_count):
        where = f"core {core} PC step {step} (block at {address:#x})"
        raw = memory.dump(address, fetch_words(amount, scale) * WORD_BYTES).view("<u8")
        if rebase is not None:
            raw = rebase.apply(address, raw, regmap)
        block = parse_block(raw, regmap, where)
        words = list(block.body) + [0, encode_write(regmap, "PC", "REGISTER_AMOUNTS",
                                                    block.next_amount_word & 0xFFFF0000), MARKER_WORD, block.enable]
        words += [0] * (_aligned(len(words)) - len(words))   # the fetch may take in one padding word
        if len(words) > scratch[1]:
            raise EmulationError(f"{where}: a {len(block.body)}-write block does not fit the {scratch[1]}-word "
                                 f"scratch buffer sized by the file's largest block")
        memory.load(scratch[0], np.asarray(words, dtype="<u8").tobytes())
        try:
            ran = machine.cores[core].run_chain(scratch[0], fetch_amount(len(block.body), scale),
                                                driver_setup=step == 0)
        except EmulationError as error:   # every EmulationError subclass takes the one message
            raise type(error)(f"{where}, run from a copy at {scratch[0]:#x}: {error}") from None
        # each block runs as a one-task chain (its record says task 0): numbered by PC step, as a chain's are
        records.extend(dataclasses.replace(record, index=step) for record in ran)
        address, amount = block.next_address, block.next_amount_word & 0xFFFF
        if amount == 0:
            break
    return ChainRun(core, start, start_amount, tuple(records))
