"""Vendor rk3576 programs rewritten into the register positions the emulator's units read.

Each task block of the program to run is decoded (``rk3576_layout``), checked, and replaced in
place by the RK3588 form of the same conv (``rk3576_forms``) encoded with the emulator's map; the
block keeps its size, so task records, tails and PC amounts stay valid (emulator/rknn_runner.py
applies this when it loads an rk3576 file; REGISTER_SEMANTICS.md 10.3).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from npuemu.isa.errors import EncodingError, UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.model import Region, RknnModel, TaskRecord
from npuemu.isa.rknn.relocate import RelocatedProgram, region_image
from npuemu.isa.rknn.rk3576_forms import RK3588_CBUF, Cbuf, rk3588_specs
from npuemu.isa.rknn.rk3576_layout import (
    CONV_ENABLE, INT8, KERNEL_GROUP, VENDOR_DEPTHWISE, VENDOR_FAMILY, Reader, VendorTask, bs_shift, check_conv, decomp_control, read_task,
)
from npuemu.isa.rknn.rk3576_dpu import dpu_only_specs, is_dpu_only
from npuemu.isa.rknn.rk3576_ew import is_lut_dpu_only, lut_dpu_only_specs, without_lut_flag
from npuemu.isa.rknn.rk3576_clip import is_vendor_clip, rk3588_clip_specs
from npuemu.isa.rknn.rk3576_lut import is_lut_upload, is_vendor_lut, rk3588_lut_specs, translate_lut_upload
from npuemu.isa.rknn.rk3576_lut_fp16 import is_fp16, rk3588_out_specs
from npuemu.isa.rknn.rk3576_image import check_image, image_specs, is_image_input, own_room, plain_view, take_offsets
from npuemu.isa.rknn.rk3576_dw8 import is_int8_depthwise, place_memory, rewrite_memory, spare_offset, to_rk3588_words
from npuemu.isa.rknn.rk3576_ppu import is_ppu, translate_ppu
from npuemu.isa.rknn.rk3576_concat import copy_specs, is_padded_fp16_copy, is_vendor_copy
from npuemu.isa.rknn.rk3576_convert import convert_specs, is_vendor_convert
from npuemu.isa.rknn.rk3576_resize import clear_conv_specs, clear_conv_view, is_clear_conv, is_vendor_unpool, unpool_specs
from npuemu.isa.rknn.rk3576_pool_fp16 import is_pool_depthwise, pool_specs
from npuemu.isa.rknn.rk3576_deconv import deconv_writes, is_direct_phase_conv, is_vendor_deconv
from npuemu.isa.rknn.rk3576_deconv import phase_writes as deconv_phase_writes
from npuemu.isa.rknn.rk3576_bilinear import (
    check_notch_words, cpend_depthwise_specs, edge_copy_specs, is_cpend_depthwise, is_edge_copy, is_int8_phase,
    is_phase_conv, phase_writes,
)
from npuemu.isa.words import TARGET_OP_ENABLE, encode_word

__all__ = ["VENDOR_FAMILY", "encode_writes", "is_vendor_layout", "region_reader", "translate_regcmd", "translate_task"]


#: places bytes in memory the runner adds past a vendor file's regions; returns their device address
Placer = Callable[[bytes], int]


def translate_task(task: VendorTask, out: RegisterMap, read: Reader, cbuf: Cbuf = RK3588_CBUF,
                   own_build: bool = False, place: Placer | None = None) -> list[tuple[str, str, int]]:
    """The (block, register, value) writes the emulator's map ``out`` needs for ``task``: the
    kept registers as written, then the RK3588 form of every re-packed one (a PPU task: rk3576_ppu).
    ``own_build``: an npuemu model file, whose int8 depthwise tasks keep room for their RK3588 BS
    record past the vendor's (rk3576_dw8); a vendor .rknn file has none: its int8 depthwise tasks need
    ``place`` (RK3588's cube and record in buffers of their own) or stay refused, as do its image-input
    convs (rk3576_image: RK3588's cube)."""
    if is_ppu(task.enable):
        return translate_ppu(task)
    check_notch_words(task)   # a bilinear Resize's edge copies and interleaved phase convs (rk3576_bilinear)
    if is_edge_copy(task) and not is_padded_fp16_copy(task):   # the latter: a Concat copy (rk3576_concat)
        return _writes(task, out, edge_copy_specs(task))
    if is_phase_conv(task):
        plain = ((lambda view: _writes(view, out, cpend_depthwise_specs(view, read, cbuf))) if is_int8_phase(task)
                 else lambda view: translate_task(view, out, read, cbuf, own_build, place))
        return phase_writes(task, out, plain)
    if is_vendor_deconv(task):   # a ConvTranspose's CNA deconvolution: strides alone (rk3576_deconv)
        return deconv_writes(task, out, lambda view: translate_task(view, out, read, cbuf, own_build, place))
    if is_direct_phase_conv(task):   # npuemu's ConvTranspose phase convs writing interleaved (rk3576_deconv)
        return deconv_phase_writes(task, out, lambda view: translate_task(view, out, read, cbuf, own_build, place))
    if is_cpend_depthwise(task):   # int8 depthwise, one CPEND for all channels (rk3576_bilinear)
        return _writes(task, out, cpend_depthwise_specs(task, read, cbuf))
    if is_vendor_unpool(task):   # a Resize's unpooling copy and the clear convs around it (rk3576_resize)
        return _writes(task, out, unpool_specs(task))
    if is_clear_conv(task):
        return _writes(task, out, clear_conv_specs(rk3588_specs(clear_conv_view(task), INT8, (0, 0), cbuf)))
    if is_vendor_convert(task):   # an int8 <-> fp16 DataConvert (rk3576_convert), before the copies it resembles
        return _writes(task, out, convert_specs(task, read))
    if is_vendor_copy(task):   # a Concat's DPU-only copy, plain or requantizing (rk3576_concat)
        return _writes(task, out, copy_specs(task, read))
    if is_pool_depthwise(task):   # an fp16 average pool: a depthwise conv with no bias record (rk3576_pool_fp16)
        return _writes(task, out, pool_specs(task, cbuf))
    if is_lut_upload(task):   # the LUT table upload (rk3576_lut)
        return translate_lut_upload(task, out)
    if place is not None and task.enable == CONV_ENABLE and is_image_input(task.values, task.regmap):
        return _image_input(task, out, read, cbuf, place)
    if task.enable == CONV_ENABLE and is_int8_depthwise(task.values, VENDOR_DEPTHWISE):
        if own_build:
            return _int8_depthwise(task, out, read, cbuf)
        if place is not None:
            return _placed_int8_depthwise(task, out, read, cbuf, place)
    return _translate_words(task, out, read, cbuf)


def _placed_int8_depthwise(task: VendorTask, out: RegisterMap, read: Reader, cbuf: Cbuf,
                           place: Placer) -> list[tuple[str, str, int]]:
    """A vendor file's int8 depthwise task: the fp16 depthwise form's words reading RK3588's cube and record
    from the buffers ``place`` gave them (rk3576_dw8.place_memory); both addresses written even when the
    vendor's delta task leaves them to the task two before."""
    moved = place_memory(task.values, read, place)
    task = replace(task, values=to_rk3588_words(dict(task.values), task.where))
    writes = [(block, name, moved.get((block, name), value))
              for block, name, value in _translate_words(task, out, read, cbuf, int8_depthwise=True)]
    written = {(block, name) for block, name, _ in writes}
    return writes + [(block, name, value) for (block, name), value in moved.items() if (block, name) not in written]


def _int8_depthwise(task: VendorTask, out: RegisterMap, read: Reader, cbuf: Cbuf) -> list[tuple[str, str, int]]:
    """The cube with CPEND and the record without (rk3576_dw8): the fp16 depthwise form's words, the
    RK3588 record where the model file left room for it (rk3576_program rewrites the memory on load)."""
    spare = spare_offset(task.values)
    task = replace(task, values=to_rk3588_words(dict(task.values), task.where))
    return [(block, name, value + spare if (block, name) == ("DPU_RDMA", "BS_BASE_ADDR") else value)
            for block, name, value in _translate_words(task, out, read, cbuf, int8_depthwise=True)]


def _image_input(task: VendorTask, out: RegisterMap, read: Reader, cbuf: Cbuf,
                 place: Placer) -> list[tuple[str, str, int]]:
    """A vendor file's image-input conv (rk3576_image): the direct conv's words with the image ones, RK3588's
    weight cube where ``place`` put it."""
    check_image(task)
    plain = plain_view(task)
    check_conv(plain)
    lut = rk3588_lut_specs(plain, read) if is_vendor_lut(plain) else None
    specs, cube = image_specs(task, rk3588_specs(plain, INT8, bs_shift(plain, read), cbuf, lut), read, place)
    weights = ("CNA", "DCOMP_ADDR0")
    writes = [(block, name, cube if (block, name) == weights else value) for block, name, value in _writes(task, out, specs)]
    return writes if any((block, name) == weights for block, name, _ in writes) else writes + [(*weights, cube)]


def _translate_words(task: VendorTask, out: RegisterMap, read: Reader, cbuf: Cbuf,
                     int8_depthwise: bool = False) -> list[tuple[str, str, int]]:
    if is_lut_dpu_only(task):   # rk3576_ew: a standalone fp16 LUT (REGISTER_SEMANTICS.md 54.2)
        specs = lut_dpu_only_specs(task, read)
    elif is_dpu_only(task.enable):   # rk3576_dpu: an fp16 / int8 EW Add or Mul of two operands
        specs = dpu_only_specs(task, read)
    else:
        check_conv(task, int8_depthwise)
        precision = task.field("CNA", "CONV_CON1", "PROC_PRECISION")
        if precision not in KERNEL_GROUP:
            raise UnsupportedProgramError(f"{task.where}: vendor rk3576 conv precision {precision} is not decoded "
                                          f"(int8 0 and fp16 2 are)")
        # a LUT activation (rk3576_lut), a Clip with a lower bound (rk3576_clip): BN / EW from a record
        vendor_lut = is_vendor_lut(task)
        lut = (rk3588_lut_specs(task, read) if vendor_lut else rk3588_clip_specs(task, read)
               if is_vendor_clip(task) else None)
        specs = rk3588_specs(task, precision, bs_shift(task, read), cbuf, lut)
        if vendor_lut and is_fp16(precision):   # the factor in OUT_CVT
            specs = rk3588_out_specs(task, specs)
    return _writes(task, out, specs)


def _writes(task: VendorTask, out: RegisterMap, specs) -> list[tuple[str, str, int]]:
    """The kept registers as written, then ``specs`` packed in ``out``'s positions."""
    # DCOMP_CTRL kept, with DECOMP_CONTROL naming the sparse mode (rk3576_layout.decomp_control)
    writes = [(block, name, decomp_control(task, value) if (block, name) == ("CNA", "DCOMP_CTRL") else value)
              for block, name, value in task.kept]
    for block, name, fields in specs:
        if out.block(block).has(name):   # rk3576.yaml has no FC_DATA_SIZE1 / EW_OP_VALUE_7 (REGISTERS.md)
            value = fields["raw"] if "raw" in fields else out.register(block, name).pack(fields)
            writes.append((block, name, value))
    return writes


def encode_writes(writes: list[tuple[str, str, int]], out: RegisterMap, count: int, where: str) -> list[int]:
    """``writes`` as ``count`` command words: the vendor task's slot keeps its size (the tails
    and PC amounts stay valid), filled by repeating the last write."""
    words = [encode_word(out.block(block).target, value, out.register(block, name).offset)
             for block, name, value in writes]
    if len(words) > count:
        raise UnsupportedProgramError(f"{where}: the RK3588 form of this vendor rk3576 task needs {len(words)} "
                                      f"writes, more than its {count}")
    return words + [words[-1]] * (count - len(words))


def is_vendor_layout(target: str | None) -> bool:
    """A vendor ``.rknn`` built for rk3576 holds this layout (model slot 8 names the target)."""
    return target == "rk3576"


def translate_regcmd(regcmd: np.ndarray, lists: Sequence[Sequence[TaskRecord]], regmap: RegisterMap,
                     out: RegisterMap, read: Reader, source: str, cbuf: Cbuf = RK3588_CBUF,
                     place: Placer | None = None) -> np.ndarray:
    """A copy of the relocated ``regcmd`` words with the task blocks of ``lists`` (the program's
    task records, one list per core in run order; ``regcmd_addr`` a blob offset) rewritten in
    ``out``'s positions. Block sizes, tails (but the sync bit) and padding stay as stored.

    Registers are ping-pong groups (REGISTER_SEMANTICS.md 1.1): task n of a list writes the group
    task n - 2 wrote, so a vendor delta task is read on top of that task's values, and when the
    full RK3588 form does not fit its slot only the registers whose RK3588 value differs from the
    group's are written (the kept ones as translated: a vendor int8 depthwise task's addresses move).
    A block's pointer flips only with the tasks that start it (1.1), so the group a write lands in is
    counted per block: a conv after DPU-only tasks writes the CNA group the previous conv did not
    (REGISTER_SEMANTICS.md 56.2).
    ``place``: where RK3588's blobs of a vendor int8 depthwise or image-input task go (translate_task)."""
    words = regcmd.copy()
    for records in lists:
        vendor: list[dict] = [{}, {}]   # per group: the vendor values its last task left
        held: dict[tuple[str, int], dict] = {}   # per block and group: the RK3588 values written into it
        starts: dict[str, int] = {}              # per block: the tasks so far that started it
        for position, record in enumerate(records):
            group, first, amount = position % 2, record.regcmd_addr // 8, record.regcfg_amount
            where = f"{source}: task record {record.index} (regcmd word {first})"
            block, image = take_offsets(regcmd[first:first + amount], regmap, vendor[group])   # rk3576_image
            task = read_task(without_lut_flag(block, regmap), regmap, where, record.enable_mask,
                             {**vendor[group], **image})   # rk3576_ew: a standalone LUT's 0x40CC word
            writes = _translate(task, out, read, where, cbuf, place=place)
            if len(writes) > amount:
                kept = len(task.kept)
                writes = writes[:kept] + [(block, name, value) for block, name, value in writes[kept:]
                                          if held.get((block, starts.get(block, 0) % 2), {}).get(name) != value]
            words[first:first + amount] = encode_writes(writes, out, amount, where)
            _clear_sync_bit(words, first + amount + 3)
            vendor[group] = dict(task.values)
            for unit, name, value in writes:
                held.setdefault((unit, starts.get(unit, 0) % 2), {})[name] = value
            for unit in out.op_enable_names(task.enable):
                starts[unit] = starts.get(unit, 0) + 1
    return words


def _translate(task: VendorTask, out: RegisterMap, read: Reader, where: str,
               cbuf: Cbuf, own_build: bool = False, place: Placer | None = None) -> list[tuple[str, str, int]]:
    try:
        return translate_task(task, out, read, cbuf, own_build, place)
    except EncodingError as error:   # a vendor value that no RK3588 field holds
        raise UnsupportedProgramError(f"{where}: the vendor rk3576 task has no RK3588 form: {error}") from None


#: OP_EN bit 24: set in the tails of the 2-core program's tasks only, next to PC_REGISTER_AMOUNTS
#: bits 31:16 = 1 [V FIX, isa/RKNN_TAILS.md 1]; read as the cores' sync [I]. No block owns it on
#: RK3588; the emulator models the barrier from bits 31:16 (emulator/rknn_multicore.py).
SYNC_BIT = 1 << 24


def _clear_sync_bit(words: np.ndarray, index: int) -> None:
    if index < len(words):
        word = int(words[index])
        if word >> 48 == TARGET_OP_ENABLE and (word >> 16) & SYNC_BIT:
            words[index] = np.uint64(word & ~(SYNC_BIT << 16))


def region_reader(model: RknnModel, program: RelocatedProgram) -> Reader:
    """Reads the constant regions (weight, misc, LUT) of a relocated program by device
    address: where the BS shift words (const tensors) live."""
    images = [(program.bases.of(region), bytes(region_image(model, program.plan, region)))
              for region in (Region.WEIGHT, Region.MISC, Region.LUT)]

    def read(address: int, size: int) -> bytes:
        for base, image in images:
            if base <= address and address + size <= base + len(image):
                return image[address - base:address - base + size]
        raise UnsupportedProgramError(f"{model.source}: a vendor rk3576 BS shift word at {address:#x} lies in no "
                                      f"constant region of the file")
    return read


def translate_model_sections(sections, chains, regmap: RegisterMap, out: RegisterMap, scale: int) -> dict[str, bytes]:
    """An npuemu model file in the vendor layout (trailer ``platform.register_layout``, LOWERING.md
    39) with every task of ``chains`` ((section name, byte offset, first PC amount) each) rewritten
    into ``out``'s positions: {section name: new bytes}. ``sections``: the file's sections (name,
    data, load_address); the BS shift words are read from them by device address."""
    images = {section.name: bytearray(section.data) for section in sections}
    stored = {section.name: bytes(section.data) for section in sections}
    bases = [(section.load_address, section.name) for section in sections]

    def where_is(address: int, size: int) -> tuple[str, int]:
        for base, name in bases:
            if base <= address and address + size <= base + len(images[name]):
                return name, address - base
        raise UnsupportedProgramError(f"a vendor rk3576 BS shift word or weight cube at {address:#x} lies in no "
                                      f"section")

    def read(address: int, size: int) -> bytes:
        name, at = where_is(address, size)
        return stored[name][at:at + size]

    def write(address: int, data: bytes) -> None:   # int8 depthwise memory (rk3576_dw8.rewrite_memory)
        name, at = where_is(address, len(data))
        images[name][at:at + len(data)] = data
        done[name] = bytes(images[name])

    done: dict[str, bytes] = {}
    for name, offset, amount in chains:
        image, base = images[name], dict((n, b) for b, n in bases)[name]
        for first, count, enable in _chain_tasks(image, base, offset, amount, scale, name):
            where = f"model section {name!r}: task at byte {first * 8:#x}"
            body, offsets = take_offsets(np.frombuffer(bytes(image[first * 8:(first + count) * 8]), "<u8"), regmap, {})
            task = read_task(without_lut_flag(body, regmap), regmap, where, enable, offsets)
            if task.enable == CONV_ENABLE and is_int8_depthwise(task.values, VENDOR_DEPTHWISE):
                rewrite_memory(task.values, read, write, where)
            words = encode_writes(_translate(task, out, read, where, RK3588_CBUF, own_build=True,
                                             place=_own_room(task, write) if offsets else None), out, count, where)
            image[first * 8:(first + count) * 8] = np.asarray(words, "<u8").tobytes()
        done[name] = bytes(image)
    return done


def _own_room(task: VendorTask, write: Callable[[int, bytes], None]) -> Placer:
    """An own build's image conv (rk3576_image.own_room): RK3588's cube written into the room its weight
    constant leaves past the vendor cube, on load."""
    room = own_room(task.values, task.regmap)

    def place(blob: bytes) -> int:
        write(room, blob)
        return room
    return place


def _chain_tasks(image: bytearray, base: int, offset: int, amount: int, scale: int, name: str):
    """(first body word, body words, op-enable) of each task the PC fetches from byte ``offset``
    of a section loaded at ``base`` (tails as isa/chain.py lays them: link, amounts, marker,
    op-enable, then at most scale - 1 padding words in the fetch)."""
    def word_at(index: int) -> int:
        if not 0 <= index * 8 < len(image):
            raise UnsupportedProgramError(f"model section {name!r}: a chain runs past the section (word {index})")
        return int.from_bytes(image[index * 8:index * 8 + 8], "little")

    index, seen = offset // 8, set()
    while True:
        if index in seen:
            raise UnsupportedProgramError(f"model section {name!r}: a chain loops back to a task it already ran")
        seen.add(index)
        end = index + (amount + 1) * scale
        while end > index + 4 and word_at(end - 1) == 0:
            end -= 1
        link, amounts, enable = word_at(end - 4), word_at(end - 3), word_at(end - 1)
        yield index, end - 4 - index, (enable >> 16) & 0xFFFFFFFF
        amount = (amounts >> 16) & 0xFFFF
        if not amount:
            return
        index = (((link >> 16) & 0xFFFFFFFF) - base) // 8
