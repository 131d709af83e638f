"""npuemu's own rk3576 builds in the vendor's register layout (LOWERING.md 39, 42).

The lowering emits every task at RK3588 positions (the ``rk3576`` map); a build for a chip whose
map family has a vendor layout (``rk3576_pack.VENDOR_LAYOUT_OF``) is then re-packed task by task
into that layout (``isa/rknn/rk3576_pack.py``; PPU pools ``rk3576_ppu.py``) - when every task of
the build has a vendor form that translates back to the same registers. Otherwise the whole build
stays at RK3588 positions and says why (the trailer's ``platform.register_layout_notice``, shown by
the compile summary and ``inspect``): one stream holds one layout. A packed int8 3-channel image input
whose width is a multiple of 16 is written in the vendor's image form (``rk3576_image.own_image_words``,
the trailer's ``image_inputs``; LOWERING.md 52). When another packed image input (ARGB_IN) stands in the
way, ``LayoutChoice.unpack_inputs`` asks the build to store the graph input unpacked (NC1HWC2, as the
vendor's rk3588 build reads it) and try again (LOWERING.md 45).

An int8 depthwise conv's weight and BS constants are stored in the vendor's forms in such builds, each
task's record followed by room for RK3588's, which the translation writes on load (``vendor_constants``,
``isa/rknn/rk3576_dw8.py``, LOWERING.md 45.2).

The per-conv BS shift words (16-bit, DPU_RDMA 0x5024; 0x0000 for an fp16 depthwise conv) go to one
constant, ``SHIFT_TENSOR``: the distinct words of the build, 2 bytes each, padded to 16 bytes, then
the distinct BS records of its int8 DPU-only tasks, 64 bytes each (rk3576_pack.dpu_record; LOWERING.md 44.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.regmap_loader import load_regmap
from npuemu.isa.rknn.rk3576_pack import (
    VENDOR_LAYOUT_OF, ImageInputError, check_round_trip, dpu_record, dpu_vendor_writes, shift_word, uses_shift_word, vendor_writes,
    lut_dpu_vendor_writes,
    window_bytes,
)
from npuemu.isa.rknn.rk3576_dw8 import BLOCK as DW8_BLOCK
from npuemu.isa.rknn.rk3576_ew import as_the_record_holds_it
from npuemu.isa.rknn.rk3576_dw8 import VENDOR_GROUP_BYTES as DW8_RECORD_BYTES
from npuemu.isa.rknn.rk3576_dw8 import rk3588_cpend, vendor_cube, vendor_record_blob
from npuemu.isa.rknn.rk3576_layout import RK3588_DEPTHWISE, field_reader
from npuemu.isa.rknn.rk3576_clip import clip_record, npuemu_clip
from npuemu.isa.rknn.rk3576_image import OWN_BIAS, image_row_entries, is_image_input, own_blob, own_image_words
from npuemu.isa.rknn.rk3576_lut import bn_record, check_lut, is_lut_conv, table_ends
from npuemu.isa.rknn.rk3576_lut_fp16 import as_the_vendor_scales_it, is_fp16
from npuemu.isa.rknn.rk3576_ppu import check_ppu_round_trip, ppu_vendor_writes
from npuemu.isa.rknn.rk3576_concat import copy_vendor_writes, is_copy_values
from npuemu.isa.rknn.rk3576_convert import as_the_vendor_groups_it, convert_records, convert_vendor_writes, is_convert_values
from npuemu.isa.rknn.rk3576_resize import is_unpool_values, unpool_vendor_writes
from npuemu.isa.rknn.rk3576_deconv import phase_vendor_words, phase_write
from npuemu.isa.task import RegisterWrite, Task

from .driver import LoweredLayer, as_conv, cached_conv_constants
from .layers import FLOAT16, ConvLayer, FcLayer
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
    unpack_inputs: bool = False   # only a packed image input kept the vendor layout out: build unpacked
    images: tuple[tuple[str, int], ...] = ()   # (graph input, width) stored in the vendor's image form (LOWERING.md 52)

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
        if self.vendor is not None and self.images:   # what the runtime feeds those inputs (LOWERING.md 52)
            return {"register_layout": self.vendor.family, "image_inputs": {
                name: {"pixel_bytes": 3, "row_pixels": -(-width // IMAGE_ROW) * IMAGE_ROW, "value_bias": OWN_BIAS}
                for name, width in self.images}}
        if self.vendor is not None:
            return {"register_layout": self.vendor.family}
        return {"register_layout_notice": self.notice} if self.notice else {}


def choose_layout(lowered: Sequence[LoweredLayer], regmap: RegisterMap, cores: int) -> LayoutChoice:
    """The vendor layout when the chip has one and every task of ``lowered`` is expressible in it; a multi-core
    build's (``cores`` > 1) tasks are each core's own, packed alike (LOWERING.md 46.5)."""
    family = VENDOR_LAYOUT_OF.get(regmap.family)
    if family is None:
        return LayoutChoice(regmap.family)
    vendor = load_regmap(family)
    words: list[int] = []
    records: list[bytes] = []
    image: ImageInputError | None = None   # a packed image input: the build may be redone unpacked (LOWERING.md 45)
    table: list = []                       # the LUT table last uploaded (_lut_parts)
    try:
        for layer in lowered:
            try:
                _pack_layer(layer, regmap, vendor, words, 0, records, table=table)
            except ImageInputError as error:
                image = image or error
    except UnsupportedProgramError as error:
        return _fallback(regmap.family, str(image or error))
    if image is not None:
        return replace(_fallback(regmap.family, str(image)), unpack_inputs=True)
    if len(words) > SHIFT_WORDS_MAX:
        return _fallback(regmap.family, f"{len(words)} distinct BS shift words, more than the {SHIFT_WORDS_MAX} kept")
    if records and not words:   # the constant is placed where the build has shift words: keep one (0x0000)
        words.append(0)
    return LayoutChoice(regmap.family, vendor, words=tuple(words), records=tuple(records))


def _fallback(family: str, reason: str) -> LayoutChoice:
    return LayoutChoice(family, notice=f"RK3588 register positions kept (not the vendor {family} "
                                       f"layout a real {family} reads): {reason}")


def to_vendor_layout(lowered: Sequence[LoweredLayer], regmap: RegisterMap, choice: LayoutChoice,
                     shift_address: int) -> list[LoweredLayer]:
    """``lowered`` with every task re-packed (``choice`` from :func:`choose_layout` on the same
    build; ``shift_address``: where ``SHIFT_TENSOR`` was placed)."""
    if choice.vendor is None:
        return list(lowered)
    words, records, table = list(choice.words), list(choice.records), []
    return [replace(layer, tasks=_pack_layer(layer, regmap, choice.vendor, words, shift_address, records,
                                             shift_address + choice.records_offset, table)) for layer in lowered]


def _pack_layer(layer: LoweredLayer, regmap: RegisterMap, vendor: RegisterMap, words: list[int],
                shift_base: int, records: list[bytes], records_base: int = 0, table: list | None = None
                ) -> tuple[Task, ...]:
    """A layer's tasks re-packed; the CBUF bank words follow its largest window (rk3576_pack.cbuf_banks);
    ``table`` holds the ends of the LUT table last uploaded, in run order (_lut_parts)."""
    convs = _conv_values(layer)
    windows = [window_bytes(_plain_image(values, regmap, layer.layer) if is_image_input(values, regmap) else values,
                            regmap) for values in convs]
    if len({values.get(("CNA", "DCOMP_ADDR0")) for values in convs if is_image_input(values, regmap)}) > 1:
        raise ImageInputError(f"layer {layer.layer}: an image-input conv split by kernels has no known form in the "
                              f"vendor rk3576 layout (compiler/LOWERING.md 52)")
    bases = _int8_depthwise_bases([values for values in convs if _is_int8_depthwise(values, regmap)])
    return tuple(_pack(task, regmap, vendor, layer.layer, index, words, shift_base, max(windows, default=0),
                       (records, records_base), bases, [] if table is None else table)
                 for index, task in enumerate(layer.tasks))


def _is_int8_depthwise(values, regmap: RegisterMap) -> bool:
    con1, raw = regmap.register("CNA", "CONV_CON1"), values.get(("CNA", "CONV_CON1"), 0)
    return con1.field("CONV_MODE").extract(raw) == RK3588_DEPTHWISE and con1.field("PROC_PRECISION").extract(raw) == 0


def _int8_depthwise_bases(found: list[dict]) -> tuple[int, int] | None:
    """(weight, BS) addresses of an int8 depthwise layer's first channels (``found``: its tasks' values): its
    vendor blobs (vendor_constants) start there; a task's cube lies at twice its RK3588 offset, its record at
    14/8 (rk3576_dw8)."""
    if not found:
        return None
    return (min(v.get(("CNA", "DCOMP_ADDR0"), 0) for v in found),
            min(v.get(("DPU_RDMA", "BS_BASE_ADDR"), 0) for v in found))


def _conv_values(layer: LoweredLayer) -> list[dict]:
    """The register values of each of the layer's conv tasks."""
    return [{(w.block, w.register): w.value for w in task.writes} for task in layer.tasks
            if task.enable_mask == ENABLE_CONV]


def _int8_depthwise_values(layer: LoweredLayer, regmap: RegisterMap) -> list[dict]:
    return [values for values in _conv_values(layer) if _is_int8_depthwise(values, regmap)]


def _record_channels(values) -> int:
    """The channels a task's BS record covers (its output channels rounded up to 64, rk3576_dw8)."""
    return -(-((values.get(("DPU", "DATA_CUBE_CHANNEL"), 0) >> 16 & 0x1FFF) + 1) // DW8_BLOCK) * DW8_BLOCK


def _as_vendor_addresses(values, bases: tuple[int, int], where: str) -> tuple[dict, dict]:
    """(the task's RK3588 values with its vendor blobs' addresses, what the translation gives back: the BS
    address past the vendor record, where the room is)."""
    weight, record = values.get(("CNA", "DCOMP_ADDR0"), 0), values.get(("DPU_RDMA", "BS_BASE_ADDR"), 0)
    if (record - bases[1]) % (DW8_BLOCK * 8):
        raise UnsupportedProgramError(f"{where}: an int8 depthwise task starting inside a 64-channel block has no "
                                      f"vendor rk3576 form here (LOWERING.md 45.2)")
    start = bases[1] + (record - bases[1]) * 14 // 8
    values = {**values, ("CNA", "DCOMP_ADDR0"): bases[0] + 2 * (weight - bases[0]), ("DPU_RDMA", "BS_BASE_ADDR"): start}
    return values, {**values, ("DPU_RDMA", "BS_BASE_ADDR"): start + _record_channels(values) * DW8_RECORD_BYTES // 8}


def vendor_constants(choice: LayoutChoice, layers, lowered: Sequence[LoweredLayer], platform,
                     regmap: RegisterMap) -> tuple[LayoutChoice, dict[str, bytes]]:
    """The constants a vendor-layout build stores instead of RK3588's: each int8 depthwise conv's cube with
    CPEND and its BS record without, each task's channels followed by room for RK3588's record (rk3576_dw8;
    LOWERING.md 45.2); a layer whose blobs have no such form makes ``choice`` the fallback."""
    if choice.vendor is None:
        return choice, {}
    out: dict[str, bytes] = {}
    images: list[tuple[str, int]] = []
    try:
        for layer, done in zip(layers, lowered):
            conv = as_conv(layer) if isinstance(layer, (ConvLayer, FcLayer)) else None
            if conv is not None and any(is_image_input(values, regmap) for values in _conv_values(done)):
                out[conv.weight_tensor] = own_blob(np.asarray(conv.weights, np.int8))   # rk3576_image (LOWERING.md 52)
                images.append((conv.input, conv.input_shape[2]))
                continue
            tasks = _int8_depthwise_values(done, regmap)   # none: the layer was lowered another way
            if conv is None or not conv.depthwise or conv.dtype == FLOAT16 or conv.weight_source or not tasks:
                continue
            out.update(_vendor_blobs(layer, conv, platform, tasks))
    except UnsupportedProgramError as error:
        return _fallback(choice.family, str(error)), {}
    return replace(choice, images=tuple(dict.fromkeys(images))), out


def _vendor_blobs(layer, conv, platform, tasks: list[dict]) -> dict[str, bytes]:
    constants = cached_conv_constants(layer, platform)
    taps = int(np.prod(np.asarray(conv.weights).shape[2:]))
    try:
        cube = vendor_cube(constants.weights, rk3588_cpend(constants.bias), taps)
    except UnsupportedProgramError as error:
        raise UnsupportedProgramError(f"layer {layer.name}: {error}") from None
    base = min((v.get(("DPU_RDMA", "BS_BASE_ADDR"), 0) for v in tasks), default=0)
    ranges = sorted({((v.get(("DPU_RDMA", "BS_BASE_ADDR"), 0) - base) // 8, _record_channels(v)) for v in tasks})
    ends = [0] + [start + count for start, count in ranges]
    if [start for start, _ in ranges] != ends[:-1] or 8 * ends[-1] > len(constants.bias):
        raise UnsupportedProgramError(f"layer {layer.name}: int8 depthwise tasks whose channel ranges {ranges} do "
                                      f"not tile the layer (LOWERING.md 45.2)")
    record = b"".join(vendor_record_blob(constants.bias[8 * start:8 * (start + count)]) for start, count in ranges)
    return {conv.weight_tensor: cube, conv.bias_tensor: record + bytes(len(constants.bias) * 14 // 8 - len(record))}


def _pack(task: Task, regmap: RegisterMap, vendor: RegisterMap, layer: str, index: int, words: list[int],
          shift_base: int, layer_window: int, records: tuple[list[bytes], int],
          dw8_bases: tuple[int, int] | None, table: list) -> Task:
    where = f"layer {layer} task {index}"
    if task.enable_mask not in (ENABLE_CONV, ENABLE_PPU, ENABLE_DPU_ONLY) or task.amount_hi16:
        raise UnsupportedProgramError(f"{where}: a task with op-enable {task.enable_mask:#x} (only conv tasks, "
                                      f"{ENABLE_CONV:#x}, PPU pools, {ENABLE_PPU:#x}, and DPU-only Adds / Muls, "
                                      f"{ENABLE_DPU_ONLY:#x}, have a known vendor rk3576 form)")
    values = {(w.block, w.register): w.value for w in task.writes}
    if task.enable_mask == ENABLE_DPU_ONLY and is_lut_conv(values, regmap):   # a standalone LUT (LOWERING.md 55)
        return replace(task, writes=_lut_dpu_only(task, values, regmap, vendor, where, records, table))
    if task.enable_mask != ENABLE_CONV:   # pools, DPU-only Adds / Muls (REGISTER_SEMANTICS.md 41, 44)
        return replace(task, writes=_other_writes(task, values, regmap, vendor, where, records))
    image = is_image_input(values, regmap)   # the packed 3-channel input: the vendor's image form (LOWERING.md 52)
    if image:
        values = _plain_image(values, regmap, where)
    expected = values
    if dw8_bases is not None and _is_int8_depthwise(values, regmap):   # the vendor blobs (45.2)
        values, expected = _as_vendor_addresses(values, dw8_bases, where)
    phase = phase_write(values, regmap, where)   # an interleaved write: the plain conv's words, then its own (rk3576_deconv)
    if phase is not None:
        values = phase.plain
    word = shift_word(values, regmap)
    if uses_shift_word(values, regmap) and word not in words:
        words.append(word)
    address = shift_base + 2 * words.index(word) if word in words else 0
    lut, upload, record = _lut_parts(task, values, regmap, records, where, table)
    if lut is not None and is_fp16(field_reader(values, regmap)("DPU", "DATA_FORMAT", "PROC_PRECISION")):
        check_lut(values, regmap, where)   # its factor t to 15 bits in OUT_CVT (LOWERING.md 51.1)
        expected = as_the_vendor_scales_it(expected, where)
    clip, record = _clip_record(values, records, record)
    writes = vendor_writes(values, regmap, shift_address=address, where=where, layer_window=layer_window,
                           lut=lut, clip=clip) + upload
    if phase is not None:
        writes = phase_vendor_words(writes, phase, where)
    check_round_trip(expected, regmap, vendor, writes, word, where, record=record)
    if image:   # the direct conv's words proven above, then the image words (rk3576_image.own_image_words)
        writes = own_image_words(writes[:len(writes) - len(upload)], field_reader(values, regmap), vendor) + upload
    return replace(task, writes=tuple(RegisterWrite(block, name, value) for block, name, value in writes))


def _lut_dpu_only(task: Task, values, regmap: RegisterMap, vendor: RegisterMap, where: str,
                  records: tuple[list[bytes], int], table: list) -> tuple[RegisterWrite, ...]:
    """An int8 / fp16 standalone LUT task's vendor writes (rk3576_pack.lut_dpu_vendor_writes) with its upload after them,
    as a LUT conv's (_lut_parts), proven by their round trip against the factor as the vendor scales it."""
    # the record holds the int8 BN ALU operand in input units (rk3576_ew.as_the_record_holds_it)
    lut, upload, record = _lut_parts(task, as_the_record_holds_it(values, regmap, where), regmap, records, where, table)
    writes = lut_dpu_vendor_writes(values, regmap, where, lut) + upload
    fp16 = is_fp16(field_reader(values, regmap)("DPU", "DATA_FORMAT", "PROC_PRECISION"))
    check_round_trip(as_the_vendor_scales_it(values, where) if fp16 else values, regmap, vendor, writes, 0, where,
                     ENABLE_DPU_ONLY, record)
    return tuple(RegisterWrite(block, name, value) for block, name, value in writes)


IMAGE_ARGB = 10          # ARGB_IN of a 3-channel packed input, the only image the vendor's rk3576 form is known for
IMAGE_ROW = 16           # pixels a row of the vendor's image input is padded to (REGISTER_SEMANTICS.md 47.1)


def _plain_image(values, regmap: RegisterMap, where: str) -> dict:
    """An own conv task reading the packed image input as the direct conv the vendor words are built from (ARGB_IN
    cleared; rk3576_image.own_image_words writes the image words); ImageInputError (the build is redone with the
    input unpacked, LOWERING.md 45) for what the image form does not cover here: 1, 2 or 4 channels, and widths
    that are not a multiple of 16 (the vendor's rows are padded to 16 pixels, npuemu's packed rows are not)."""
    field = field_reader(values, regmap)
    argb, width = field("CNA", "CONV_CON1", "ARGB_IN"), field("CNA", "DATA_SIZE0", "DATAIN_WIDTH")
    if argb != IMAGE_ARGB or width % IMAGE_ROW or field("CNA", "CONV_CON1", "PROC_PRECISION"):
        raise ImageInputError(f"{where}: an image-input task ({argb - 7} channels, {width} pixels wide) has no "
                              f"known form in the vendor rk3576 layout (int8 3-channel images of a width that is a "
                              f"multiple of {IMAGE_ROW} have: compiler/LOWERING.md 52)")
    entries = image_row_entries(width, field("CNA", "WEIGHT_SIZE2", "WEIGHT_WIDTH"))
    return {**values, ("CNA", "CONV_CON1"): regmap.update("CNA", "CONV_CON1", values[("CNA", "CONV_CON1")], ARGB_IN=0),
            # the CBUF entries a row as the vendor counts an image's (rk3576_image.plain_view reads them so)
            ("CNA", "CBUF_CON1"): regmap.pack("CNA", "CBUF_CON1", DATA_ENTRIES=entries)}


def _clip_record(values, records: tuple[list[bytes], int], record: bytes) -> tuple[int | None, bytes]:
    """A Clip with a lower bound: its record (rk3576_clip) joins ``records``; (its address, the record), else
    (None, ``record``)."""
    bounds = npuemu_clip(values)
    if bounds is None:
        return None, record
    record = clip_record(bounds)
    return _record_address(records, record), record


def _record_address(records: tuple[list[bytes], int], record: bytes) -> int:
    """Where ``record`` lies among the build's distinct BS records (``records``: the list, joined here when new,
    and the address of its first; every record is as long)."""
    kept, base = records
    if record not in kept:
        kept.append(record)
    return base + len(record) * kept.index(record)


def _lut_parts(task: Task, values, regmap: RegisterMap, records: tuple[list[bytes], int], where: str,
               table: list):
    """A LUT conv's (BN record address and table ends, its upload writes, the record) - the record joins
    ``records``; the upload stays in the conv task, after the vendor words, as npuemu's RK3588 form has it
    (LOWERING.md 46); a task without one uses the table last uploaded (``table``: its ends, updated here).
    (None, [], b"") for any other conv."""
    if not is_lut_conv(values, regmap):
        return None, [], b""
    start = next((i for i, w in enumerate(task.writes)
                  if w.register == "LUT_ACCESS_CFG" and w.block == "DPU" and w.value), len(task.writes))
    upload = [(w.block, w.register, w.value) for w in task.writes[start:]]
    if any(block != "DPU" or not name.startswith("LUT_ACCESS_") for block, name, _ in upload) or not (
            upload or table):
        raise UnsupportedProgramError(f"{where}: a LUT conv whose table upload is not the task's last writes (or "
                                      f"that no upload before it holds) has no vendor rk3576 form here (LOWERING.md 46)")
    try:
        ends = table_ends([(name, value) for _, name, value in upload]) if upload else table[-1]
    except UnsupportedProgramError as error:
        raise UnsupportedProgramError(f"{where}: {error}") from None
    table[:] = [ends]
    record = bn_record(values, regmap)
    return (_record_address(records, record), ends), upload, record


def _convert_writes(values, regmap: RegisterMap, vendor: RegisterMap, where: str,
                    records: tuple[list[bytes], int]) -> list:
    """A DataConvert's vendor frame with its BS / BN records joining ``records``, proven by its round trip to the
    task as the vendor groups its output (rk3576_convert.as_the_vendor_groups_it: the same addresses)."""
    values = as_the_vendor_groups_it(values, regmap)
    bs, bn = convert_records(values, regmap)
    addresses = (_record_address(records, bs) if bs else 0, _record_address(records, bn))
    writes = convert_vendor_writes(values, regmap, where, addresses)
    placed = {address: record for address, record in zip(addresses, (bs, bn)) if record}
    check_round_trip(values, regmap, vendor, writes, 0, where, ENABLE_DPU_ONLY, placed)
    return writes


def _other_writes(task: Task, values, regmap: RegisterMap, vendor: RegisterMap, where: str,
                  records: tuple[list[bytes], int]) -> tuple[RegisterWrite, ...]:
    """A PPU or DPU-only task's vendor writes, proven by their round trip; an int8 DPU-only task's BS
    record joins ``records`` (the list, the address of its first)."""
    if task.enable_mask == ENABLE_PPU:
        writes = ppu_vendor_writes(values, regmap, where)
        check_ppu_round_trip(values, vendor, writes, where)
    elif is_unpool_values(values, regmap):   # a Resize's unpooling copy (rk3576_resize, LOWERING.md 50)
        writes = unpool_vendor_writes(values, regmap, where)
        check_round_trip(values, regmap, vendor, writes, 0, where, ENABLE_DPU_ONLY)
    elif is_convert_values(values, regmap):   # an int8 <-> fp16 DataConvert (rk3576_convert, LOWERING.md 56)
        writes = _convert_writes(values, regmap, vendor, where, records)
    elif is_copy_values(values, regmap):   # a Concat's copy, plain or requantizing (rk3576_concat, LOWERING.md 50.3)
        record = dpu_record(values, regmap)
        writes = copy_vendor_writes(values, regmap, where, record, _record_address(records, record) if record else 0)
        check_round_trip(values, regmap, vendor, writes, 0, where, ENABLE_DPU_ONLY, record or b"")
    else:
        record = dpu_record(values, regmap) or b""
        address = _record_address(records, record) if record else 0
        writes = dpu_vendor_writes(values, regmap, where, address)
        check_round_trip(values, regmap, vendor, writes, 0, where, ENABLE_DPU_ONLY, record)
    return tuple(RegisterWrite(block, name, value) for block, name, value in writes)
