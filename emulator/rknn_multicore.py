"""Run a multi-core program of a vendor ``.rknn`` file (isa/rknn/variants.py) on the machine's cores.

The vendor runtime starts each core's part of a launch with its first record and a task count
(``rknpu_submit.subcore_task``); the PC then follows the tails, and the cores meet at the
barrier tails (bits 31:16 of PC_REGISTER_AMOUNTS, REGISTER_SEMANTICS.md 10.1). The emulator's PC
follows tails until a zero link and has no task count, so each piece (one core's records
between two barriers) is laid out as a chain of its own: its blocks copied, already relocated,
into a buffer after the file's program, each tail relinked to the next copy and the last one
ended. Register writes, enable masks and fetch amounts are the file's, so each task does and
reads (regcmd fetch bytes included) what it does in place.

Cores run one after another within a barrier phase and phase after phase: the same results as
side by side when no core reads what another writes before the next barrier, which is what
the barriers are for. The timeline (timing/timeline.py ``plan_rknn``) puts the pieces of one
phase side by side, each on its core's track.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.emulator.machine import ChainRun, Machine
from npuemu.isa.chain import SEGMENT_ALIGN, fetch_amount
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn import RelocatedProgram, RknnModel
from npuemu.isa.rknn.variants import Launch, Piece
from npuemu.isa.words import WORD_BYTES, encode_write


@dataclass(frozen=True)
class PlacedPiece:
    launch: int                 # index of its launch group in the program
    phase: int                  # barrier phase within the launch group
    piece: Piece
    address: int                # where its first copied block starts
    first_amount: int           # PC_DATA_AMOUNT of the first block


@dataclass(frozen=True)
class PieceRun:
    placed: PlacedPiece
    run: ChainRun

    @property
    def core(self) -> int:
        return self.placed.piece.core


def place_pieces(model: RknnModel, program: RelocatedProgram, launches: tuple[Launch, ...], regmap: RegisterMap,
                 scale: int, base: int) -> tuple[tuple[PlacedPiece, ...], np.ndarray]:
    """Every piece's blocks copied from the relocated stream, laid out from ``base`` (64-byte
    aligned): the placed pieces in run order and the uint64 words of the buffer."""
    words: list[int] = []
    placed = []
    for number, launch in enumerate(launches):
        for phase, pieces in enumerate(launch.phases):
            for piece in pieces:
                address = base + len(words) * WORD_BYTES
                words.extend(_piece_words(model, program, piece, regmap, scale, address))
                first = program.tasks[piece.tasks[0]]
                placed.append(PlacedPiece(number, phase, piece, address, fetch_amount(first.regcfg_amount, scale)))
    return tuple(placed), np.asarray(words, dtype=np.uint64)


def _piece_words(model: RknnModel, program: RelocatedProgram, piece: Piece, regmap: RegisterMap, scale: int,
                 address: int) -> list[int]:
    records = [model.program.tasks[i] for i in piece.tasks]   # regcmd_addr: blob offsets
    sizes = [_segment_words(r.regcfg_amount, scale) for r in records]
    starts = [address + sum(sizes[:k]) * WORD_BYTES for k in range(len(records))]
    words: list[int] = []
    for k, record in enumerate(records):
        first, tail_at = record.first_word, record.tail_word
        body = [int(w) for w in program.regcmd[first:tail_at]]   # relocated
        hi16 = model.program.tail_of(record).amount_word >> 16
        marker, enable = int(program.regcmd[tail_at + 2]), int(program.regcmd[tail_at + 3])
        if k + 1 < len(records):
            link = encode_write(regmap, "PC", "BASE_ADDRESS", starts[k + 1])
            amount = fetch_amount(records[k + 1].regcfg_amount, scale)
        else:
            link, amount = 0, 0
        words += body + [link, encode_write(regmap, "PC", "REGISTER_AMOUNTS", hi16 << 16 | amount), marker, enable]
        words += [0] * (sizes[k] - record.regcfg_amount - 4)
    return words


def _segment_words(writes: int, scale: int) -> int:
    """Block, tail and the zero words a fetch rounded up to the scale may take in, 64-byte aligned."""
    per = SEGMENT_ALIGN // WORD_BYTES
    return -(-(writes + 4 + scale - 1) // per) * per


def run_pieces(machine: Machine, placed: tuple[PlacedPiece, ...]) -> tuple[PieceRun, ...]:
    """Each piece on its core, in placement order (launch, phase, core): the driver's set-up
    (S_POINTER) where a launch starts the core's PC, none where the PC continues past a barrier."""
    runs = []
    for item in placed:
        core = machine.cores[item.piece.core]
        records = core.run_chain(item.address, item.first_amount, driver_setup=item.piece.launch)
        runs.append(PieceRun(item, ChainRun(item.piece.core, item.address, item.first_amount, records)))
    return tuple(runs)
