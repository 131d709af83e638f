"""The vendor's rk3576 image input: raw 3-byte pixels normalized and quantized by the CNA's input converter
(emulator/REGISTER_SEMANTICS.md 45.1, 47.1), translated into the RK3588 positions the emulator reads; and the same
form written by npuemu's own builds (``own_image_words``, ``own_blob``; compiler/LOWERING.md 52,
REGISTER_SEMANTICS.md 51).

The vendor task [V ORC: Conv 3 -> K 3x3 (W 24, 20, 200), 7x7 (W 60, 224) and 1x1 (W 16), with and without mean
/ std, against the ONNX weights and the simulator]: CONV_CON1 ARGB_IN 10 (3 channels, as RK3588's) with
CONV_MODE 2 or 6 (below); the input tensor ``[1, 1, H, W, 3]`` stored as 3-byte pixels in rows of
align(W, 16) pixels (LINE_STRIDE in 16-byte units, the tensor's size H x that; PAD_VALUE the zero point in
each byte); CVT_CON0 CVT_BYPASS 0, CVT_TYPE 0, DATA_SIGN 0, per-channel CVT_TRUNCATE_c and CVT_SCALE_c, the
per-channel offsets at CNA 0x1054 / 0x1058 / 0x105C (0x1060, a 4th group's, 0 with scale 1 and truncate 0);
0x1070 the zero point or 0 (mode 6 with a mean: raw bytes near it, unused here). The weight cube, per
32-kernel block, kernels stored to a multiple of 16: CONV_MODE 2 taps in order, each kernel's 4 channels
([ky][kx][kernel][4]); CONV_MODE 6 (a 1x1 and a 224-wide 7x7) kernel rows, the row folded into channels
([ky][kernel][kx x 4 padded to 16 bytes], DATAIN_CHANNEL 4 x kw - 1). The 4th channel meets no pixel byte.

The RK3588 form: the image mode with the converter on - ARGB_IN 10, DATAIN_CHANNEL 3, LINE_STRIDE in pixels,
the converter's words at RK3588's CVT_CON0..4, and RK3588's weight cube (16 channels a tap, 3 used) in a buffer
of its own (``place``), its address in DCOMP_ADDR0. The CNA offsets are not in
``rk3576_vendor.yaml`` (rk3576_pack writes those offsets as reserved words in every own conv task):
:func:`take_offsets` reads them from the stream by offset before ``read_task``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import numpy as np

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_layout import VendorTask
from npuemu.isa.weight_layout import INT8_CONV, conv_blob_offsets, pack_conv_weights

#: the CNA words the image form writes that the vendor map leaves reserved: offset -> the name its value
#: takes in a task's values (the offsets of the converter's four groups, then the 0x1070 word)
IMAGE_WORDS = {0x1054: "CVT_OFFSET0", 0x1058: "CVT_OFFSET1", 0x105C: "CVT_OFFSET2", 0x1060: "CVT_OFFSET3",
               0x1070: "CVT_1070"}
VENDOR_ARGB = 10                        # the vendor's ARGB_IN of a 3-channel image [V ORC, all builds]
TAPS_MODE, ROWS_MODE = 2, 6            # CONV_MODE of the two cube layouts (below) [V ORC]
VENDOR_IMAGE_MODES = (TAPS_MODE, ROWS_MODE)
PIXEL_BYTES, ATOM_BYTES = 3, 16         # a pixel: the 3 channels of ARGB_IN 10 [V ORC: row strides above]
VENDOR_CHANNELS = 4                     # channels a tap in the vendor's cubes [V ORC: 36 bytes for 3x3]
ROW_ALIGN = 16                          # bytes a kernel row of CONV_MODE 6 is padded to [V ORC: 7x7 28 -> 32]
BLOCK = 32                              # kernels per weight block (RK3588's int8 conv, the vendor's here)
Placer = Callable[[bytes], int]


def _signed32(value: int) -> int:
    return value - (1 << 32) if value >> 31 else value


def is_image_input(values: Mapping[tuple[str, str], int], regmap: RegisterMap) -> bool:
    """A vendor conv task reading a packed image (CONV_CON1 ARGB_IN set, not a deconvolution)."""
    con1 = regmap.register("CNA", "CONV_CON1")
    raw = values.get(("CNA", "CONV_CON1"), 0)
    return bool(con1.field("ARGB_IN").extract(raw)) and not con1.field("DECONV").extract(raw)


def take_offsets(words: np.ndarray, regmap: RegisterMap,
                 base: Mapping[tuple[str, str], int]) -> tuple[np.ndarray, dict[tuple[str, str], int]]:
    """(``words`` without the CNA image words, {("CNA", name): value} of those it writes) for an image-input
    task (its CONV_CON1 written here or, a delta task, in ``base``); ``words`` and {} for any other task, whose
    non-zero reserved words read_task then refuses as before."""
    cna = regmap.block("CNA")
    con1 = cna.register("CONV_CON1")
    values = dict(base)
    for word in (int(w) for w in words):
        if word >> 48 == cna.target and word & 0xFFFF == con1.offset:
            values[("CNA", "CONV_CON1")] = (word >> 16) & 0xFFFFFFFF
    if not is_image_input(values, regmap):
        return words, {}
    kept, found = words.copy(), {}
    for index, word in enumerate(int(w) for w in words):
        if word >> 48 == cna.target and word & 0xFFFF in IMAGE_WORDS:
            found[("CNA", IMAGE_WORDS[word & 0xFFFF])] = _signed32((word >> 16) & 0xFFFFFFFF)
            kept[index] = 0
    return kept, found


def plain_view(task: VendorTask) -> VendorTask:
    """The task as the direct conv the other checks and rk3576_forms read: ARGB_IN 0, CONV_MODE 0, the
    converter bypassed (the image words are checked and written by :func:`image_specs`), and CBUF entries a
    row as the vendor counts an image's (CBUF_DATA ROW_ENTRIES: align(W, 16) / 16 [V: 2, 2, 13 for widths 24,
    20, 200], CBUF_FILL = that x rows; CBUF_CON1's 32, 32, 208 count pixels), which rk3576_forms' RK3588
    banks are sized by [I: the emulator checks only the bank counts]."""
    regmap, values = task.regmap, dict(task.values)
    values[("CNA", "CONV_CON1")] = regmap.update("CNA", "CONV_CON1", values[("CNA", "CONV_CON1")], ARGB_IN=0, CONV_MODE=0)
    values[("CNA", "CVT_CON0")] = regmap.pack("CNA", "CVT_CON0", CVT_BYPASS=1)
    values[("CNA", "CBUF_CON1")] = regmap.update("CNA", "CBUF_CON1", task.raw("CNA", "CBUF_CON1"),
                                                 DATA_ENTRIES=task.field("CNA", "CBUF_DATA", "ROW_ENTRIES"))
    return replace(task, values=values)


def check_image(task: VendorTask) -> None:
    """Refuse an image task unlike every decoded build: 3-channel int8 pixels, the converter on with unsigned
    input and per-channel scale / truncate / offset, the 4th channel passed as read (scale 1, truncate 0,
    offset 0), 0x1070 the zero point or 0."""
    f = task.field
    pad = _signed8(task.raw("CNA", "PAD_VALUE"))
    checks = {
        "CONV_CON1.ARGB_IN": f("CNA", "CONV_CON1", "ARGB_IN") == VENDOR_ARGB,
        "CONV_CON1.CONV_MODE": f("CNA", "CONV_CON1", "CONV_MODE") in VENDOR_IMAGE_MODES,
        "CONV_CON1 precision": not f("CNA", "CONV_CON1", "IN_PRECISION") and not f("CNA", "CONV_CON1", "PROC_PRECISION"),
        "CVT_CON0": (f("CNA", "CVT_CON0", "CVT_BYPASS"), f("CNA", "CVT_CON0", "CVT_TYPE"),
                     f("CNA", "CVT_CON0", "DATA_SIGN"), f("CNA", "CVT_CON0", "ROUND_TYPE")) == (0, 0, 0, 0),
        "the 4th channel's converter": (f("CNA", "CVT_SCALE23", "CVT_SCALE3"), f("CNA", "CVT_CON0", "CVT_TRUNCATE_3"),
                                        task.values.get(("CNA", "CVT_OFFSET3"), 0)) == (1, 0, 0),
        # mode 6 writes raw pixel bytes near the mean there [V ORC 7x7: 124, 116, 103 for 123.675, 116.28, 103.53];
        # the pads are PAD_VALUE's in both modes [I: the simulator's border outputs agree, 47.1]
        "0x1070": task.values.get(("CNA", "CVT_1070"), 0) in (0, pad) or f("CNA", "CONV_CON1", "CONV_MODE") == ROWS_MODE,
        "DATA_IN_CHANNEL": f("CNA", "DATA_IN_CHANNEL", "DATAIN_CHANNEL") + 1 == _vendor_channels(task),
        "LINE_STRIDE": f("CNA", "LINE_STRIDE", "LINE_STRIDE") * ATOM_BYTES % PIXEL_BYTES == 0,
    }
    for what, ok in checks.items():
        if not ok:
            raise UnsupportedProgramError(f"{task.where}: vendor rk3576 image input with {what} unlike any decoded "
                                          f"build (emulator/REGISTER_SEMANTICS.md 47.1)")


def _signed8(value: int) -> int:
    value &= 0xFF
    return value - 0x100 if value & 0x80 else value


def _kernel_size(task: VendorTask) -> tuple[int, int]:
    return task.field("CNA", "WEIGHT_KERNELS", "WEIGHT_HEIGHT") + 1, task.field("CNA", "WEIGHT_KERNELS", "WEIGHT_WIDTH") + 1


def _vendor_channels(task: VendorTask) -> int:
    """The vendor's DATAIN_CHANNEL + 1: the pixel's 3 (CONV_MODE 2), or a kernel row's 4 x kw (6: the row
    folded into channels) [V ORC: 2 for 3x3 mode 2; 3 for 1x1 and 27 for 7x7 mode 6]."""
    mode = task.field("CNA", "CONV_CON1", "CONV_MODE")
    return PIXEL_BYTES if mode == TAPS_MODE else VENDOR_CHANNELS * _kernel_size(task)[1]


def _geometry(task: VendorTask) -> tuple[int, int, int, int]:
    """(kernels, kernel height, kernel width, CONV_MODE) of the vendor's image cube, whose bytes a kernel
    are 4 x kh x kw (mode 2) or kh rows of align(4 x kw, 16) (mode 6)."""
    f = task.field
    kernels, mode = f("CNA", "WEIGHT_KERNELS", "WEIGHT_KERNELS") + 1, f("CNA", "CONV_CON1", "CONV_MODE")
    height, width = _kernel_size(task)
    per_kernel = f("CNA", "WEIGHT_BYTES_PER_KERNEL", "WEIGHT_BYTES_PER_KERNEL")
    if per_kernel != kernel_bytes(mode, height, width):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 image-input weights of {per_kernel} bytes a "
                                      f"{height}x{width} kernel are not CONV_MODE {mode}'s "
                                      f"{kernel_bytes(mode, height, width)}")
    return kernels, height, width, mode


def kernel_bytes(mode: int, height: int, width: int) -> int:
    row = VENDOR_CHANNELS * width
    return height * (row if mode == TAPS_MODE else -(-row // ROW_ALIGN) * ROW_ALIGN)


def vendor_weights(cube: bytes, kernels: int, height: int, width: int, mode: int) -> np.ndarray:
    """[kernels][3][kh][kw] int8 of the vendor's image cube: per 32-kernel block, taps in order with each
    kernel's 4 channels (CONV_MODE 2: [ky][kx][kernel][4]), or kernel rows (6: [ky][kernel][kx x 4, padded
    to 16 bytes]); the pixel's 3 channels read [V ORC: both against the ONNX weights]."""
    source = np.frombuffer(cube, np.int8)
    out = np.zeros((kernels, PIXEL_BYTES, height, width), np.int8)
    row = kernel_bytes(mode, 1, width)
    at = 0
    for start in range(0, kernels, BLOCK):
        count = min(BLOCK, kernels - start)
        size = count * kernel_bytes(mode, height, width)
        if mode == TAPS_MODE:
            block = source[at:at + size].reshape(height, width, count, VENDOR_CHANNELS).transpose(2, 3, 0, 1)
        else:
            block = source[at:at + size].reshape(height, count, row)[:, :, :VENDOR_CHANNELS * width]
            block = block.reshape(height, count, width, VENDOR_CHANNELS).transpose(1, 3, 0, 2)
        out[start:start + count] = block[:, :PIXEL_BYTES]
        at += size
    return out


def image_specs(task: VendorTask, specs: list, read, place: Placer) -> tuple[list, int]:
    """(RK3588 specs of the image task: ``specs``, rk3576_forms' for :func:`plain_view`, with the image words,
    the address of RK3588's weight cube placed with ``place``)."""
    f = task.field
    kernels, height, width, mode = _geometry(task)
    cube = read(task.raw("CNA", "DCOMP_ADDR0"), kernels * kernel_bytes(mode, height, width))
    weights = vendor_weights(cube, kernels, height, width, mode)
    rk_cube = pack_conv_weights(weights, INT8_CONV).tobytes()
    stored = conv_blob_offsets(INT8_CONV, kernels, PIXEL_BYTES, height, width).shape[1]
    in_width = f("CNA", "DATA_IN_SIZE", "DATAIN_WIDTH") + 1
    line = f("CNA", "LINE_STRIDE", "LINE_STRIDE") * ATOM_BYTES // PIXEL_BYTES
    con0 = {f"CVT_TRUNCATE_{n}": f("CNA", "CVT_CON0", f"CVT_TRUNCATE_{n}") for n in range(4)}
    scales = (f("CNA", "CVT_SCALE01", "CVT_SCALE0"), f("CNA", "CVT_SCALE01", "CVT_SCALE1"),
              f("CNA", "CVT_SCALE23", "CVT_SCALE2"), f("CNA", "CVT_SCALE23", "CVT_SCALE3"))
    rows = f("CNA", "DATA_IN_SIZE", "DATAIN_HEIGHT") + 1
    fields = {
        ("CNA", "CONV_CON1"): {"NONALIGN_DMA": 1, "GROUP_LINE_OFF": 1, "ARGB_IN": VENDOR_ARGB, "CONV_MODE": 0},
        ("CNA", "DATA_SIZE1"): {"DATAIN_CHANNEL_REAL": PIXEL_BYTES - 1, "DATAIN_CHANNEL": PIXEL_BYTES},
        ("CNA", "WEIGHT_SIZE0"): {"WEIGHT_BYTES": len(rk_cube)},
        ("CNA", "WEIGHT_SIZE1"): {"WEIGHT_BYTES_PER_KERNEL": height * width * stored},
        ("CNA", "CVT_CON0"): {**con0, "DATA_SIGN": 0, "ROUND_TYPE": 0, "CVT_TYPE": 0, "CVT_BYPASS": 0},
        **{("CNA", f"CVT_CON{n + 1}"): {f"CVT_SCALE{n}": scales[n],
                                        f"CVT_OFFSET{n}": task.values.get(("CNA", f"CVT_OFFSET{n}"), 0)}
           for n in range(4)},
        ("CNA", "DMA_CON1"): {"LINE_STRIDE": line},
        ("CNA", "DMA_CON2"): {"SURF_STRIDE": 0},
        ("CNA", "FC_DATA_SIZE0"): {"DMA_WIDTH": in_width, "DMA_HEIGHT": rows},
        ("CNA", "FC_DATA_SIZE1"): {"DMA_CHANNEL": PIXEL_BYTES},
    }
    out = []
    for block, name, values in specs:
        if (block, name) in fields:
            values = {**values, **fields[(block, name)]} if name == "CONV_CON1" else fields[(block, name)]
        out.append((block, name, values))
    return out, place(rk_cube)


# --- npuemu's own builds: the image form written (compiler/LOWERING.md 52) --------------------------------------

#: The converter npuemu's own builds write [C, LOWERING.md 52]: the input is stored as bytes u = q + 128 (q the
#: int8 value npuemu's quantization gives, so u is a uint8 quantization with the same scale and zero point + 128)
#: and every group maps u back to q exactly: SCALE / 2^TRUNCATE = 1 written as the vendor writes a unit scale,
#: 16384 / 2^14, offset -128 [V ORC c3: Conv 3 -> 24 3x3 s2 p1 on [1, 3, 20, 32] without mean / std, input
#: scale 1, zero point -128: these very words]; the 4th group passes its byte (scale 1, truncate 0, offset 0).
OWN_BIAS = 128
UNIT_SCALE, UNIT_TRUNCATE = 16384, 14
WORD = 0xFFFFFFFF
PLAIN_PIXEL_FLAG = 0x80                 # CORE MISC_CFG bit 7 in every image task [V ORC a, b, c, c3]


def own_converter() -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(scales, truncates, offsets) of the four groups in npuemu's own image tasks."""
    return (UNIT_SCALE,) * 3 + (1,), (UNIT_TRUNCATE,) * 3 + (0,), (-OWN_BIAS,) * 3 + (0,)


def rows_cube(weights: np.ndarray) -> bytes:
    """The vendor's CONV_MODE 6 cube of int8 ``weights`` [K][3][kh][kw] (the inverse of :func:`vendor_weights`):
    kernels stored to a multiple of 16 (zeros), per 32-kernel block [ky][kernel][kx x 4 padded to 16 bytes], the
    4th channel 0; then as many zero bytes again (the vendor's blob is twice WEIGHT_BYTES, its second half 0
    [V ORC c, c3])."""
    kernels, channels, height, width = weights.shape
    stored = -(-kernels // 16) * 16
    padded = np.zeros((stored, VENDOR_CHANNELS, height, width), np.int8)
    padded[:kernels, :channels] = weights
    row = kernel_bytes(ROWS_MODE, 1, width)
    blocks = []
    for start in range(0, stored, BLOCK):
        block = padded[start:start + BLOCK]                              # [k][c][ky][kx]
        taps = block.transpose(2, 0, 3, 1).reshape(height, len(block), VENDOR_CHANNELS * width)
        out = np.zeros((height, len(block), row), np.int8)
        out[:, :, :VENDOR_CHANNELS * width] = taps
        blocks.append(out.tobytes())
    cube = b"".join(blocks)
    return cube + bytes(len(cube))


def image_row_entries(width: int, kernel_width: int) -> int:
    """The image's CBUF entries a row (CBUF_DATA.ROW_ENTRIES): the row and kw - 1 more pixels, 4 bytes each, in
    64-byte entries [I: fits all six builds, ORC c (1x1 on 16: 1), c3 (3x3 on 32: 3), cls0 (3x3 on 192: 13) in
    CONV_MODE 6, a, b, e (3x3 on 24, 20, 200: 2, 2, 13) in mode 2]."""
    return -(-(width + kernel_width - 1) * VENDOR_CHANNELS // 64)


def own_image_words(plain: list, field, vendor: RegisterMap) -> list:
    """The vendor's CONV_MODE 6 image words of an own conv task reading the packed 3-channel input, from
    ``plain`` (rk3576_pack.vendor_writes of the task as a direct conv, ARGB_IN cleared) and ``field`` (the
    task's RK3588 fields). Widths a multiple of 16 only: the vendor writes CONV_MODE 6 for those [V ORC: widths
    16, 32 and 224; 2 for 20, 24, 60, 200], its rows hold W pixels then (no padding)."""
    width, rows = field("CNA", "DATA_SIZE0", "DATAIN_WIDTH"), field("CNA", "DATA_SIZE0", "DATAIN_HEIGHT")
    kh, kw = field("CNA", "WEIGHT_SIZE2", "WEIGHT_HEIGHT"), field("CNA", "WEIGHT_SIZE2", "WEIGHT_WIDTH")
    kernels = -(-field("CNA", "WEIGHT_SIZE2", "WEIGHT_KERNELS") // 16) * 16
    out_width = field("CNA", "DATA_SIZE2", "DATAOUT_WIDTH")
    line, per_kernel = width * PIXEL_BYTES // ATOM_BYTES, kernel_bytes(ROWS_MODE, kh, kw)
    entries = image_row_entries(width, kw)
    zero_point = field("CNA", "PAD_CON1", "PAD_VALUE") & 0xFF
    scales, truncates, offsets = own_converter()
    values = dict(((block, name), value) for block, name, value in plain)
    con1 = vendor.update("CNA", "CONV_CON1", values[("CNA", "CONV_CON1")], NONALIGN_DMA=0, ARGB_IN=VENDOR_ARGB,
                          CONV_MODE=ROWS_MODE)
    changed = {
        ("CNA", "CONV_CON1"): con1,
        ("CNA", "WEIGHT_BYTES"): kernels * per_kernel, ("CNA", "WEIGHT_BYTES_PER_KERNEL"): per_kernel,
        ("CNA", "WEIGHT_KERNELS"): (kw - 1) << 24 | (kh - 1) << 16 | kernels - 1,
        ("CNA", "DATA_IN_CHANNEL"): entries * rows << 16 | VENDOR_CHANNELS * kw - 1,
        ("CNA", "DATA_OUT_WIDTH"): 2 * per_kernel << 16 | out_width - 1,
        ("CNA", "CBUF_DATA"): entries << 16, ("CNA", "CBUF_CON1"): width << 16 | entries,
        ("CNA", "CVT_CON0"): vendor.pack("CNA", "CVT_CON0", **{f"CVT_TRUNCATE_{n}": truncates[n] for n in range(4)}),
        ("CNA", "CVT_SCALE01"): scales[1] << 16 | scales[0], ("CNA", "CVT_SCALE23"): scales[3] << 16 | scales[2],
        **{("CNA", f"RSV_{offset:04X}"): offsets[n] & WORD for n, offset in enumerate(list(IMAGE_WORDS)[:4])},
        ("CNA", "DMA_SIZE"): (line - 1) << 16 | rows - 1,
        # the zero point once per pixel byte [V ORC c, c3: 0x808080 for -128]
        ("CNA", "PAD_VALUE"): zero_point * 0x010101,
        ("CNA", "LINE_STRIDE"): line, ("CNA", "SURF_STRIDE"): rows * line, ("CNA", "TASK_SURFACE"): rows * line,
        # the row entries - 1 and - 2 [I: ORC c (1 entry): 0, c3 (3): 0x20001, cls0 (13): 0xc000b]
        ("CNA", "PLANE_WIDTH"): (entries - 1) << 16 | max(entries - 2, 0),
        ("CORE", "MISC_CFG"): values[("CORE", "MISC_CFG")] | PLAIN_PIXEL_FLAG,
    }
    return [(block, name, changed.get((block, name), value)) for block, name, value in plain]


def own_room(values: Mapping[tuple[str, str], int], regmap: RegisterMap) -> int:
    """Where an own image task's blob leaves room for RK3588's cube: past the vendor cube and its zero half,
    64-byte aligned (the translation writes RK3588's cube there on load, as rk3576_dw8's record)."""
    weight_bytes = regmap.register("CNA", "WEIGHT_BYTES").field("WEIGHT_BYTES").extract(
        values.get(("CNA", "WEIGHT_BYTES"), 0))
    return values.get(("CNA", "DCOMP_ADDR0"), 0) + -(-2 * weight_bytes // 64) * 64


def own_blob(weights: np.ndarray) -> bytes:
    """An own image conv's weight constant: :func:`rows_cube`, 64-byte aligned, then zeros where the translation
    writes RK3588's cube on load (:func:`own_room`; what :func:`image_specs` packs: kernels to a multiple of 16)."""
    cube = rows_cube(weights)
    stored = -(-weights.shape[0] // 16) * 16
    room = len(pack_conv_weights(np.zeros((stored, PIXEL_BYTES, *weights.shape[2:]), np.int8), INT8_CONV).tobytes())
    return cube + bytes(-len(cube) % 64) + bytes(room)
