"""npuemu's own rk3576 builds in the vendor's register layout (LOWERING.md 39, 42).

The lowering emits every task at RK3588 positions (the ``rk3576`` map); a build for a chip whose
map family has a vendor layout (``rk3576_pack.VENDOR_LAYOUT_OF``) is then re-packed task by task
into that layout (``isa/rknn/rk3576_pack.py``; PPU pools ``rk3576_ppu.py``) - when every task of
the build has a vendor form that translates back to the same registers. Otherwise the whole build
stays at RK3588 positions and says why (the trailer's ``platform.register_layout_notice``, shown by
the compile summary and ``inspect``): one stream holds one layout.

The per-conv BS shift words (16-bit, DPU_RDMA 0x5024; 0x0000 for an fp16 depthwise conv) go to one
constant, ``SHIFT_TENSOR``: the distinct words of the build, 2 bytes each, padded to 16 bytes, then
the distinct BS records of its int8 DPU-only tasks, 64 bytes each (rk3576_pack.dpu_record; LOWERING.md 44.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_pack import (
    VENDOR_LAYOUT_OF, check_round_trip, dpu_record, dpu_vendor_writes, shift_word, uses_shift_word, vendor_writes,
    window_bytes,
)
from npuemu.isa.rknn.rk3576_ppu import check_ppu_round_trip, ppu_vendor_writes
from npuemu.isa.task import RegisterWrite, Task

from .driver import LoweredLayer
from .emit_conv import ENABLE_CONV
from .emit_dpu import ENABLE_DPU_ONLY
from .emit_ppu import ENABLE_PPU

SHIFT_TENSOR = "__rk3576_bs_shift_words"
SHIFT_WORDS_MAX = 8           # one 16-byte constant
CONST_ALIGN = 16


@dataclass(frozen=True)
class LayoutChoice:
    """The register layout of a build: ``vendor`` the map its tasks are encoded with (None: the
    platform's own, RK3588 positions); ``notice``: why a chip with a vendor layout did not get it."""

    family: str
    vendor: RegisterMap | None = None
    notice: str | None = None
    words: tuple[int, ...] = ()
    records: tuple[bytes, ...] = ()

    @property
    def records_offset(self) -> int:
        """Where the BS records start in ``shift_blob``: past the padded shift words."""
        return -(-2 * len(self.words) // CONST_ALIGN) * CONST_ALIGN

    @property
    def shift_blob(self) -> bytes:
        blob = b"".join(word.to_bytes(2, "little") for word in self.words)
        return blob + bytes(-len(blob) % CONST_ALIGN) + b"".join(self.records)

    def trailer(self) -> dict:
        """What the model file's ``platform`` record says of the layout (absent: RK3588 positions)."""
        if self.vendor is not None:
            return {"register_layout": self.vendor.family}
        return {"register_layout_notice": self.notice} if self.notice else {}


def choose_layout(lowered: Sequence[LoweredLayer], regmap: RegisterMap, cores: int) -> LayoutChoice:
    """The vendor layout when the chip has one and every task of ``lowered`` is expressible in it."""
    family = VENDOR_LAYOUT_OF.get(regmap.family)
    if family is None:
        return LayoutChoice(regmap.family)
    if cores > 1:
        return _fallback(regmap, "a multi-core build (the vendor's 2-core CBUF sharing is not modelled)")
    vendor = load_regmap(family)
    words: list[int] = []
    records: list[bytes] = []
    try:
        for layer in lowered:
            _pack_layer(layer, regmap, vendor, words, 0, records)
    except UnsupportedProgramError as error:
        return _fallback(regmap, str(error))
    if len(words) > SHIFT_WORDS_MAX:
        return _fallback(regmap, f"{len(words)} distinct BS shift words, more than the {SHIFT_WORDS_MAX} kept")
    if records and not words:   # the constant is placed where the build has shift words: keep one (0x0000)
        words.append(0)
    return LayoutChoice(regmap.family, vendor, words=tuple(words), records=tuple(records))


def _fallback(regmap: RegisterMap, reason: str) -> LayoutChoice:
    return LayoutChoice(regmap.family, notice=f"RK3588 register positions kept (not the vendor {regmap.family} "
                                              f"layout a real {regmap.family} reads): {reason}")


def to_vendor_layout(lowered: Sequence[LoweredLayer], regmap: RegisterMap, choice: LayoutChoice,
                     shift_address: int) -> list[LoweredLayer]:
    """``lowered`` with every task re-packed (``choice`` from :func:`choose_layout` on the same
    build; ``shift_address``: where ``SHIFT_TENSOR`` was placed)."""
    if choice.vendor is None:
        return list(lowered)
    words, records = list(choice.words), list(choice.records)
    return [replace(layer, tasks=_pack_layer(layer, regmap, choice.vendor, words, shift_address, records,
                                             shift_address + choice.records_offset)) for layer in lowered]


def _pack_layer(layer: LoweredLayer, regmap: RegisterMap, vendor: RegisterMap, words: list[int],
                shift_base: int, records: list[bytes], records_base: int = 0) -> tuple[Task, ...]:
    """A layer's tasks re-packed; the CBUF bank words follow its largest window (rk3576_pack.cbuf_banks)."""
    windows = [window_bytes({(w.block, w.register): w.value for w in task.writes}, regmap) for task in layer.tasks
               if task.enable_mask == ENABLE_CONV]
    return tuple(_pack(task, regmap, vendor, layer.layer, index, words, shift_base, max(windows, default=0),
                       (records, records_base)) for index, task in enumerate(layer.tasks))


def _pack(task: Task, regmap: RegisterMap, vendor: RegisterMap, layer: str, index: int, words: list[int],
          shift_base: int, layer_window: int, records: tuple[list[bytes], int]) -> Task:
    where = f"layer {layer} task {index}"
    if task.enable_mask not in (ENABLE_CONV, ENABLE_PPU, ENABLE_DPU_ONLY) or task.amount_hi16:
        raise UnsupportedProgramError(f"{where}: a task with op-enable {task.enable_mask:#x} (only conv tasks, "
                                      f"{ENABLE_CONV:#x}, PPU pools, {ENABLE_PPU:#x}, and DPU-only Adds / Muls, "
                                      f"{ENABLE_DPU_ONLY:#x}, have a known vendor rk3576 form)")
    values = {(w.block, w.register): w.value for w in task.writes}
    if task.enable_mask != ENABLE_CONV:   # pools, DPU-only Adds / Muls (REGISTER_SEMANTICS.md 41, 44)
        return replace(task, writes=_other_writes(task, values, regmap, vendor, where, records))
    word = shift_word(values, regmap)
    if uses_shift_word(values, regmap) and word not in words:
        words.append(word)
    address = shift_base + 2 * words.index(word) if word in words else 0
    writes = vendor_writes(values, regmap, shift_address=address, where=where, layer_window=layer_window)
    check_round_trip(values, regmap, vendor, writes, word, where)
    return replace(task, writes=tuple(RegisterWrite(block, name, value) for block, name, value in writes))


def _other_writes(task: Task, values, regmap: RegisterMap, vendor: RegisterMap, where: str,
                  records: tuple[list[bytes], int]) -> tuple[RegisterWrite, ...]:
    """A PPU or DPU-only task's vendor writes, proven by their round trip; an int8 DPU-only task's BS
    record joins ``records`` (the list, the address of its first)."""
    if task.enable_mask == ENABLE_PPU:
        writes = ppu_vendor_writes(values, regmap, where)
        check_ppu_round_trip(values, vendor, writes, where)
    else:
        record = dpu_record(values, regmap) or b""
        kept, base = records
        if record and record not in kept:
            kept.append(record)
        address = base + len(record) * kept.index(record) if record else 0
        writes = dpu_vendor_writes(values, regmap, where, address)
        check_round_trip(values, regmap, vendor, writes, 0, where, ENABLE_DPU_ONLY, record)
    return tuple(RegisterWrite(block, name, value) for block, name, value in writes)
