"""The vendor's rk3576 register layout: decoding a conv task and what is understood of it.

rknn-toolkit2 writes rk3576 programs in a re-packed layout (``isa/regmaps/rk3576_vendor.yaml``,
emulator/REGISTER_SEMANTICS.md 10.3): the CNA/CORE geometry moves, the DPU's BS/BN/EW words
become clamp pairs, and the BS shift moves to a 16-bit word in memory (``<output>_BScfgTensor``
at DPU_RDMA 0x5024). The per-channel BS record (``b2``) and the weight cube are byte-identical
to the vendor's rk3588 build of the same ONNX [V: oracle builds, 10.3], so a task translates
word for word: :func:`read_task` decodes one task with the vendor map, the checks here refuse
what is not decoded, ``rk3576_forms`` gives the writes of the vendor's rk3588 build of the same
conv and ``rk3576_program`` rewrites a whole program.

Only what the oracle builds pin down is translated: direct int8/fp16 convolutions (any kernel,
stride, pads, channel counts; split into row windows that keep CBUF rows, with delta tasks),
with no activation, a Relu or a Relu6 / Clip(0, x), and with a residual Add (+ Relu) in the EW stage
(REGISTER_SEMANTICS.md 39, 41), dense or sparse weights in all three modes (44); fp16 depthwise convs;
PPU pools (``rk3576_ppu``) and fp16 / int8 DPU-only Adds and Muls (``rk3576_dpu``); int8 depthwise convs
of npuemu's own files (``rk3576_dw8``: they leave room for RK3588's BS record). Anything else -
int8 depthwise in vendor files, image input, a Clip with a lower bound, another task kind, a constant word with an unseen value - raises
:class:`UnsupportedProgramError` naming the task and the word.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.sparse_layout import DECOMP_CONTROL, MODES
from npuemu.isa.words import TARGET_MARKER, TARGET_OP_ENABLE

VENDOR_FAMILY = "rk3576_vendor"
CONV_ENABLE = 0x1D                      # CNA | CORE | DPU | DPU_RDMA (op-enable bits 0, 2, 3, 4)
INT8, FP16 = 0, 2                       # CNA/DPU precision codes [V: fp16 CONV_CON1 0x120]
KERNEL_GROUP = {INT8: 32, FP16: 16}     # RK3588 pads CORE/DPU channels to these [V ORC twins]
FEATURE_ALIGN = {INT8: 16, FP16: 8}     # ... and input channels to one 16-byte atom
ALU, CPEND, MUL = 1, 2, 4               # BRDMA_DATA_USE bits, the same on both layouts [V ORC]
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
CLAMPS = ("BS_CLAMP0", "CLAMP1", "CLAMP2", "CLAMP3", "CLAMP4", "CLAMP5")
RELU_CLAMPS = ("CLAMP2", "CLAMP3")      # lower bound 0 with Relu [V ORC relu int8 and fp16]
#: Registers the vendor writes at the RK3588 position with the RK3588 meaning: copied as written.
KEPT = {"CNA": ("S_POINTER",), "CORE": ("S_POINTER",), "DPU": ("S_POINTER",),
        "DPU_RDMA": ("S_POINTER", "DATA_CUBE_WIDTH", "DATA_CUBE_HEIGHT", "SRC_BASE_ADDR", "BS_BASE_ADDR",
                     "BN_BASE_ADDR", "EW_BASE_ADDR", "SRC_DMA_CFG", "PAD_CFG")}
KEPT_PREFIXES = ("DCOMP_", "LUT_")      # CNA weight decompression, DPU LUT port [V FIX sparse]
RESERVED_PREFIX = "RSV_"                # words every vendor conv task writes 0 to (rk3576_vendor.yaml)

Reader = Callable[[int, int], bytes]    # (device address, bytes) -> bytes


def field_reader(values: Mapping[tuple[str, str], int], source: RegisterMap) -> Callable[[str, str, str], int]:
    """``field(block, register, name)`` of npuemu's RK3588-position ``values`` (packed with ``source``;
    an unwritten register reads 0): how the packers read the task they translate."""

    def field(block: str, register: str, name: str) -> int:
        return source.register(block, register).field(name).extract(values.get((block, register), 0))

    return field


@dataclass(frozen=True)
class VendorTask:
    """One vendor rk3576 task's writes, read through the vendor map."""

    regmap: RegisterMap
    where: str
    values: Mapping[tuple[str, str], int]        # (block, register) -> last value written
    kept: tuple[tuple[str, str, int], ...]       # kept-register writes in stream order
    enable: int

    def raw(self, block: str, register: str) -> int:
        try:
            return self.values[(block, register)]
        except KeyError:
            raise UnsupportedProgramError(f"{self.where}: neither the vendor rk3576 task nor the task two "
                                          f"before it writes {block}.{register}") from None

    def field(self, block: str, register: str, name: str) -> int:
        return self.regmap.register(block, register).field(name).extract(self.raw(block, register))

    def signed(self, block: str, register: str) -> int:
        value = self.raw(block, register)
        return value - (1 << 32) if value >> 31 else value


def read_task(words, regmap: RegisterMap, where: str, enable: int = CONV_ENABLE,
              base: Mapping[tuple[str, str], int] | None = None) -> VendorTask:
    """A task block (its words before the tail) decoded with the vendor map ``regmap``;
    ``enable`` is the task record's op-enable mask (an op-enable word in ``words`` overrides it).
    ``base``: the values of the register group the block writes into, i.e. of the task two
    before (REGISTER_SEMANTICS.md 1.1) - the vendor's later tasks of a split conv write only
    what changes [V: a 150x150 conv's tasks 2-4 write 31, 21 and 30 words]."""
    values: dict[tuple[str, str], int] = dict(base or {})
    kept: list[tuple[str, str, int]] = []
    for word in (int(w) for w in words):
        target, value, offset = word >> 48, (word >> 16) & 0xFFFFFFFF, word & 0xFFFF
        if word == 0 or target == TARGET_MARKER:
            continue
        if target == TARGET_OP_ENABLE:
            enable = value
            continue
        block = regmap.block_for_target(target)
        register = block.register_at(offset) if block is not None else None
        if register is None or register.name.startswith(RESERVED_PREFIX):
            if value:   # every unnamed offset holds 0 in every vendor conv task [V ORC]
                raise UnsupportedProgramError(f"{where}: vendor rk3576 word {word:#018x} writes {value:#x} at "
                                              f"offset {offset:#06x}, which no decoded register holds")
            continue
        values[(block.name, register.name)] = value
        if _is_kept(block.name, register.name):
            kept.append((block.name, register.name, value))
    return VendorTask(regmap, where, values, tuple(kept), enable)


def _is_kept(block: str, register: str) -> bool:
    return register in KEPT.get(block, ()) or register.startswith(KEPT_PREFIXES)


# --- checks -----------------------------------------------------------------------------------


def check_conv(task: VendorTask, int8_depthwise: bool = False) -> None:
    """Refuse what the translation does not decode; ``int8_depthwise``: an own build's int8 depthwise
    task, its words already in the fp16 form's (rk3576_dw8.to_rk3588_words)."""
    where = task.where
    if task.enable != CONV_ENABLE:
        raise UnsupportedProgramError(f"{where}: vendor rk3576 task with op-enable {task.enable:#x}; only conv "
                                      f"tasks (CNA+CORE+DPU+DPU_RDMA, {CONV_ENABLE:#x}) are decoded")
    precision = task.field("CNA", "CONV_CON1", "PROC_PRECISION")
    if task.field("CNA", "CONV_CON1", "CONV_MODE") not in (0, VENDOR_DEPTHWISE) or (
            is_depthwise(task) and precision != FP16 and not int8_depthwise):
        raise UnsupportedProgramError(f"{where}: vendor rk3576 CNA.CONV_CON1.CONV_MODE = "
                                      f"{task.field('CNA', 'CONV_CON1', 'CONV_MODE')}: a depthwise or other "
                                      f"non-direct conv is not translated but an fp16 depthwise one (an int8 one's "
                                      f"weight cube and BS record differ from RK3588's; emulator/"
                                      f"REGISTER_SEMANTICS.md 10.3, 41)")
    refused = (("CNA", "CONV_CON1", "ARGB_IN", "an image-input first conv"),
               ("CNA", "CONV_CON1", "DECONV", "a deconvolution"))
    for block, register, name, what in refused:
        if task.field(block, register, name):
            raise UnsupportedProgramError(f"{where}: vendor rk3576 {block}.{register}.{name} = "
                                          f"{task.field(block, register, name)}: {what} is not translated "
                                          f"(emulator/REGISTER_SEMANTICS.md 10.3)")
    if task.field("CNA", "WEIGHT_KERNELS", "SPARSE_MODE") and not task.field("CNA", "DCOMP_CTRL", "DECOMP_CONTROL"):
        raise UnsupportedProgramError(f"{where}: vendor rk3576 4:2 sparse weights with the decompressor off: the "
                                      f"2-core program's core-1 task reads the weights core 0 decompressed into "
                                      f"their shared CBUF [I]; the emulator's cores have a CBUF each")
    if task.field("CNA", "CVT_CON0", "CVT_BYPASS") != 1:
        raise UnsupportedProgramError(f"{where}: vendor rk3576 CNA.CVT_CON0 enables the input converter; "
                                      f"not decoded")
    retained_rows(task)
    check_sparse(task)
    activation(task)   # the clamp words first: they name a refused activation better than 0x407C does
    ew_config(task)
    _check_constants(task)


# --- sparse weights (compiler/LOWERING.md 43, 44) ---------------------------------------------

#: CORE 0x3018 bits 13:12 -> npuemu's DECOMP_CONTROL in its RK3588-position form (isa/sparse_layout.py:
#: 5 along input channels [V], 6 along output channels and 7 for 16:4 [I: npuemu's stand-ins]) [V: the
#: bits name the mode in 96 chosen-weight builds, LOWERING.md 43].
SPARSE_CONTROL = {vendor: DECOMP_CONTROL[mode] for vendor, mode in enumerate(MODES, 1)}
#: ... and the CNA 0x1024 bits 31:30 the vendor writes with each [V].
KERNEL_MODE = {1: 3, 2: 2, 3: 3}
#: Modes whose kernels leave the CORE in kept-row order: the vendor's DPU runs in its depthwise output
#: order for them (DPU 0x400C and DPU_RDMA 0x5044 CONV_MODE 1, 0x4030 0x310, 0x4050 SIZE_E 3, 0x40B8 for
#: 4 surfaces) [V: sparse vs dense builds of the same weights, LOWERING.md 44]. The emulator's
#: decompressor gives the CORE the dense kernel order, so the RK3588 form is the dense conv's.
KEPT_ROW_ORDER = (2, 3)
VENDOR_DEPTHWISE_SIZES = (3, 3, 3)      # BS_OW_CFG SIZE_E_2/1/0 of the depthwise output order
DENSE_SIZES = (1, 1, 1)                 # ... of a direct conv's [V ORC]
BS_CHANNEL_ORDER = {False: 0x710, True: 0x310}   # DPU 0x4030 low half: direct, depthwise order [V ORC]


def sparse_mode(task: VendorTask) -> int:
    """CORE 0x3018 bits 13:12: 0 dense, 1 4:2 along input channels, 2 along output channels, 3 16:4."""
    return task.field("CORE", "MISC_CFG", "SPARSE_MODE")


def kept_row_order(task: VendorTask) -> bool:
    """The DPU reads the CORE's output in the depthwise order: a depthwise conv or an output-channel
    or 16:4 sparse one."""
    return is_depthwise(task) or sparse_mode(task) in KEPT_ROW_ORDER


def check_sparse(task: VendorTask) -> None:
    """The sparse mode's words agree with each other [V: every vendor build of LOWERING.md 43, 44]:
    DECOMP_CONTROL 5 and 0x1024's mode bits with CORE 0x3018's mode, the DPU in the depthwise order
    exactly when the kernels come in kept-row order."""
    mode, control = sparse_mode(task), task.field("CNA", "DCOMP_CTRL", "DECOMP_CONTROL")
    kernels = task.field("CNA", "WEIGHT_KERNELS", "SPARSE_MODE")
    if mode and (control not in (0, 5) or kernels != KERNEL_MODE[mode]) or (not mode and (control or kernels)):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 sparse words disagree: CORE 0x3018 mode {mode}, "
                                      f"CNA 0x1024 mode {kernels}, DECOMP_CONTROL {control} (compiler/LOWERING.md 44)")
    ordered = kept_row_order(task)
    found = (task.field("DPU", "FEATURE_MODE_CFG", "CONV_MODE"), task.field("DPU_RDMA", "FEATURE_MODE_CFG", "CONV_MODE"),
             task.field("DPU", "BS_CHANNEL", "MODE"))
    if found != (int(ordered), int(ordered), BS_CHANNEL_ORDER[ordered]) or (
            mode in KEPT_ROW_ORDER and ow_sizes(task) != VENDOR_DEPTHWISE_SIZES):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU output order (0x400C / 0x5044 CONV_MODE, "
                                      f"0x4030, 0x4050: {found}, {task.raw('DPU', 'BS_OW_CFG'):#x}) is not the one "
                                      f"its conv (depthwise {int(is_depthwise(task))}, sparse mode {mode}) goes with "
                                      f"in any decoded build (compiler/LOWERING.md 44)")


def decomp_control(task: VendorTask, value: int) -> int:
    """The DCOMP_CTRL word of npuemu's form: the vendor's ``value`` with DECOMP_CONTROL naming the mode."""
    mode = sparse_mode(task)
    return (value & ~0x7) | SPARSE_CONTROL[mode] if mode and value & 0x7 else value


def weight_sizes(task: VendorTask) -> tuple[int, int, int]:
    """(WEIGHT_SIZE0 bytes, WEIGHT_SIZE1 bytes per kernel, kernels) of npuemu's form, which holds half
    the dense sizes and every kernel in all three sparse modes (isa/sparse_layout.py). The vendor
    halves the kernel count along output channels (0x1020 whole) and for 16:4 (0x101c a quarter)
    [V: LOWERING.md 43]."""
    size = task.field("CNA", "WEIGHT_BYTES", "WEIGHT_BYTES")
    per_kernel = task.field("CNA", "WEIGHT_BYTES_PER_KERNEL", "WEIGHT_BYTES_PER_KERNEL")
    kernels = task.field("CNA", "WEIGHT_KERNELS", "WEIGHT_KERNELS") + 1
    mode = sparse_mode(task) if task.field("CNA", "DCOMP_CTRL", "DECOMP_CONTROL") else 0
    if mode == 2:
        return size, per_kernel // 2, 2 * kernels
    if mode == 3:
        return 2 * size, per_kernel, 2 * kernels
    return size, per_kernel, kernels


#: Words with no RK3588 equivalent, and the values every decoded build holds [V ORC, FIX]: any
#: other value is a configuration not seen, refused rather than ignored. BS_OW_CFG follows from its
#: own fields and the output channels (bs_ow_word).
CONSTANTS = {("CNA", "CONV_CON2"): {0xFFF}, ("DPU", "DATA_CUBE_NOTCH"): {0}, ("DPU", "CFG_4094"): {0},
             ("DPU", "CFG_409C"): {0},
             ("DPU", "CFG_40BC"): {0}, ("DPU", "CFG_40C0"): {0x04440100}, ("DPU", "CFG_40D0"): {0x0040FFFF}}
BY_PRECISION = {INT8: {("DPU", "CFG_4038"): 0x00120080, ("DPU", "BS_MODE"): 1},
                FP16: {("DPU", "CFG_4038"): 0x00100092, ("DPU", "BS_MODE"): 2}}
#: an fp16 depthwise conv's [V ORC dw, dw80, gap fp16 (GlobalAveragePool as a 7x7 depthwise conv)]
DEPTHWISE_WORDS = {("DPU", "CFG_4038"): 0x00100092, ("DPU", "BS_MODE"): 0}
VENDOR_DEPTHWISE = 1                    # CONV_MODE in CNA, DPU and DPU_RDMA words (RK3588 writes 3)
RK3588_DEPTHWISE = 3
OW_PRECISION = {INT8: 1, FP16: 2}       # BS_OW_CFG bits 19:16
OW_CPEND = 1 << 31                      # BS_OW_CFG bit 31: the DPU adds CPEND x window sum (RK3588 OW_SRC)
C2 = {INT8: 16, FP16: 8}                # channels per 16-byte atom


def bs_ow_word(precision: int, sizes: tuple[int, int, int], cpend: bool, channels: int) -> int:
    """DPU 0x4050: [31] CPEND in the DPU, [19:16] precision, [15:12] SIZE_E_2, [11:8] the index of the
    output's last 16-byte surface in its group of SIZE_E_0 + 1, [7:4] SIZE_E_1, [3:0] SIZE_E_0 [V ORC:
    direct int8 0x80011011 + 0x100 for 17, 20, 32, 64 channels (2 or 4 atoms), fp16 0x21011 (+ 0x100
    for 32, 64); fp16 depthwise (SIZE_E 3) 0x23333 with 32 channels (4 atoms), 0x23133 with 80 (10);
    int8 depthwise 0x13133 (2 atoms), 0x13033 (5), 0x13133 (6)] [I: the reading of [11:8]]."""
    size_2, size_1, size_0 = sizes
    last = (-(-channels // C2[precision]) - 1) % (size_0 + 1)
    return (int(cpend) * OW_CPEND | OW_PRECISION[precision] << 16 | size_2 << 12 | last << 8 | size_1 << 4
            | size_0)


def ow_sizes(task: VendorTask) -> tuple[int, int, int]:
    """(SIZE_E_2, SIZE_E_1, SIZE_E_0) from the vendor's BS_OW_CFG word."""
    word = task.raw("DPU", "BS_OW_CFG")
    return (word >> 12) & 0xF, (word >> 4) & 0xF, word & 0xF


def is_depthwise(task: VendorTask) -> bool:
    return task.field("CNA", "CONV_CON1", "CONV_MODE") == VENDOR_DEPTHWISE


def _check_constants(task: VendorTask) -> None:
    precision = task.field("CNA", "CONV_CON1", "PROC_PRECISION")
    expected = {key: values for key, values in CONSTANTS.items()}
    for key, value in (DEPTHWISE_WORDS if is_depthwise(task) else BY_PRECISION.get(precision, {})).items():
        expected[key] = {value}
    if precision in OW_PRECISION:   # the word its own fields give (cpend: int8 direct convs)
        channels = task.field("CORE", "DATAOUT_SIZE_1", "DATAOUT_CHANNEL") + 1
        cpend = bool(task.raw("DPU", "BS_OW_CFG") & OW_CPEND)
        expected[("DPU", "BS_OW_CFG")] = {bs_ow_word(precision, ow_sizes(task), cpend, channels)}
    for (block, register), values in expected.items():
        value = task.raw(block, register)
        if value not in values:
            seen = ", ".join(f"{v:#x}" for v in sorted(values))
            raise UnsupportedProgramError(f"{task.where}: vendor rk3576 {block}.{register} = "
                                          f"{task.raw(block, register):#x}, a value no decoded build writes "
                                          f"({seen}); not decoded (emulator/REGISTER_SEMANTICS.md 10.3)")


#: The EW stage (DPU 0x407C) -> RK3588 EW_CFG, by precision [V ORC: Conv + Add of a second conv's
#: output (the residual operand through the ERDMA), with and without a Relu after it, int8 and fp16,
#: each next to the vendor's rk3588 build of the same ONNX]. A Relu after the Add is CLAMP4 and
#: CLAMP5 with min 0 in rk3576 and EW_RELU_BYPASS 0 in RK3588.
EW_BYPASS = 0x010041C1
EW_CONFIGS = {(INT8, 0x8002C0C0): 0x904202C0, (FP16, 0x0002C0C0): 0x108202C0,
              # fp16 Mul, the operand converter bypassed [V ORC: Mul of two fp16 graph inputs, a DPU-only
              # task; REGISTER_SEMANTICS.md 41] (the int8 Mul's word, 0x810F4094, goes with a BS record in memory)
              (FP16, 0x010F4194): 0x108003C4}
EW_RELU_CLAMPS = ("CLAMP4", "CLAMP5")
EW_RELU_BYPASS = 1 << 9                 # RK3588 EW_CFG.EW_RELU_BYPASS
#: a DPU LUT activation: 0x407C and ACT_CFG (0x4060) [V ORC conv + Sigmoid / Tanh / HardSwish / SiLU /
#: HardSigmoid pairs; rk3576_lut, REGISTER_SEMANTICS.md 46]
LUT_EW_WORD, LUT_ACT_CFG = 0x01004140, 0x20
#: a Clip with a lower bound other than 0: 0x407C (EW add of EW_OP_VALUE_0) and ACT_CFG [V ORC Clip(-1, 2); rk3576_clip]
CLIP_EW_WORD, CLIP_ACT_CFG = 0x000241C0, 0x920


def ew_config(task: VendorTask) -> int | None:
    """The RK3588 EW_CFG of the task's EW stage without its Relu (None: bypassed), refusing
    configurations no decoded build writes."""
    value = task.raw("DPU", "CFG_407C")
    if (value, task.raw("DPU", "ACT_CFG")) in ((LUT_EW_WORD, LUT_ACT_CFG), (CLIP_EW_WORD, CLIP_ACT_CFG)):
        return None   # the LUT (rk3576_lut), the Clip's add of a constant (rk3576_clip): no ERDMA operand
    if value == EW_BYPASS:
        if task.raw("DPU", "CFG_4080") or task.raw("DPU", "CFG_4084") != 1:
            raise UnsupportedProgramError(f"{task.where}: vendor rk3576 EW stage bypassed (0x407C) with converter "
                                          f"words {task.raw('DPU', 'CFG_4080'):#x} / {task.raw('DPU', 'CFG_4084'):#x}")
        return None
    precision = dpu_precision(task)
    if (precision, value) not in EW_CONFIGS:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU.CFG_407C = {value:#x}, an EW stage no decoded "
                                      f"build writes (an Add of the ERDMA operand is; "
                                      f"emulator/REGISTER_SEMANTICS.md 39)")
    return EW_CONFIGS[(precision, value)]


def dpu_precision(task: VendorTask) -> int:
    """The DPU's processing precision (DATA_FORMAT bits 2:0: the CNA's in every decoded conv task,
    and the only one a DPU-only task writes)."""
    return task.field("DPU", "DATA_FORMAT", "PROC_PRECISION")


def ew_relu(task: VendorTask) -> bool:
    return task.signed("DPU", "CLAMP4_MIN") == 0


def activation(task: VendorTask) -> str:
    """"none", "relu", "relux" (a Relu with an upper bound: Relu6, Clip(0, x)) or "lut" (rk3576_lut) from the DPU's clamp
    words; anything else is refused by name. CLAMP4 and CLAMP5 hold the Relu after an EW
    Add (ew_relu)."""
    lut = task.raw("DPU", "ACT_CFG") == LUT_ACT_CFG and task.raw("DPU", "CFG_407C") == LUT_EW_WORD
    clip_form = task.raw("DPU", "ACT_CFG") == CLIP_ACT_CFG and task.raw("DPU", "CFG_407C") == CLIP_EW_WORD
    relu = not task.field("DPU", "ACT_CFG", "RELU_BYPASS") and not lut
    clip = task.field("DPU", "ACT_CFG", "CLIP_EN") and not lut and not clip_form
    precision = dpu_precision(task)
    after_ew = (precision, task.raw("DPU", "CFG_407C")) in EW_CONFIGS and ew_relu(task)
    # a bound with an EW offset (0x4090) is a Clip with a lower bound other than 0: not decoded [V ORC
    # Clip(-0.5, 0.7): [0, 16646] with 0x4090 = -6936 and NRDMA_CFG 2]
    plain = not task.raw("DPU", "EW_OP_VALUE_0") or clip_form   # rk3576_clip: L in EW_OP_VALUE_0
    bound = relux_bound(task) if relu and plain else None
    expected = {name: (0 if (relu and name in RELU_CLAMPS) or (after_ew and name in EW_RELU_CLAMPS) else INT32_MIN,
                       bound if bound is not None and name in RELU_CLAMPS else INT32_MAX) for name in CLAMPS}
    found = {name: (task.signed("DPU", f"{name}_MIN"), task.signed("DPU", f"{name}_MAX")) for name in CLAMPS}
    odd = [f"{name} = [{low}, {high}]" for name, (low, high) in found.items() if (low, high) != expected[name]]
    if clip or odd or not plain:
        detail = "; ".join(odd) or f"ACT_CFG {task.raw('DPU', 'ACT_CFG'):#x}"
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU activation not decoded ({detail}); only "
                                      f"none, Relu and Relu with an upper bound are "
                                      f"(emulator/REGISTER_SEMANTICS.md 10.3, 41)")
    if clip_form and bound is None:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 Clip form without an upper bound; not decoded")
    return "lut" if lut else "clip" if clip_form else "none" if not relu else "relu" if bound is None else "relux"


def relux_bound(task: VendorTask) -> int | None:
    """The upper bound of a Relu6 / Clip(0, x): CLAMP2 and CLAMP3 share one max, compared with the
    value after the BS stage as RK3588's BN ReLU-X compares BN_RELUX_CMP_VALUE [V ORC r6: Conv 1x1 +
    Clip(0, 6). int8: [0, 42470] in both, the rk3588 twin writes BN_CFG 0x92 (RELUX_EN), bound 30962;
    the simulator's output reaches 6.0 on every channel, so the clamp does not cut below the output's
    own saturation. fp16: [0, 0x40c00000] (6.0 as fp32), the twin's bound exactly;
    REGISTER_SEMANTICS.md 41]. None: no bound (INT32_MAX)."""
    high = task.signed("DPU", "CLAMP2_MAX")
    return None if high == INT32_MAX or high < 0 else high


def retained_rows(task: VendorTask) -> int:
    """Input rows a task keeps in the CBUF from the task before: CBUF_BANKS.RETAIN_ROWS set, the
    window (DATA_IN_SIZE) taller than what it fetches (DMA_SIZE), and the feature address at the
    first fetched row [V: 64 -> 64 3x3 at 150x150, tasks 1-3: 34-row windows, 32 rows fetched,
    address = 34 rows past the previous window's; GREG]."""
    window = task.field("CNA", "DATA_IN_SIZE", "DATAIN_HEIGHT") + 1
    fetched = task.field("CNA", "DMA_SIZE", "DMA_HEIGHT") + 1
    retained = window - fetched
    if retained < 0 or bool(retained) != bool(task.field("CNA", "CBUF_BANKS", "RETAIN_ROWS")):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 task with a {window}-row window that fetches "
                                      f"{fetched} rows, CBUF_BANKS.RETAIN_ROWS "
                                      f"{task.field('CNA', 'CBUF_BANKS', 'RETAIN_ROWS')}; not decoded")
    return retained


def bs_shift(task: VendorTask, read: Reader) -> tuple[int, int]:
    """(BS_MUL_SHIFT_VALUE, BS_MUL_SHIFT_VALUE_NEG) from the BS shift word [I: low / high byte;
    0x0e0e in every vendor build, where the rk3588 build of the same ONNX writes 14 and 14]."""
    uses = task.field("DPU_RDMA", "BRDMA_CFG", "BRDMA_DATA_USE")
    if not task.field("DPU_RDMA", "BRDMA_CFG", "SHIFT_CFG_EN"):
        if uses & MUL:
            raise UnsupportedProgramError(f"{task.where}: vendor rk3576 BS multiplier without a shift word "
                                          f"(DPU_RDMA.BRDMA_CFG {task.raw('DPU_RDMA', 'BRDMA_CFG'):#x})")
        return 0, 0
    word = int.from_bytes(read(task.raw("DPU_RDMA", "BS_CFG_ADDR"), 2), "little")
    return word & 0xFF, word >> 8


def round_up(value: int, step: int) -> int:
    return -(-value // step) * step
