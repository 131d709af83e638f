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
with no activation or a Relu, and with a residual Add (+ Relu) in the EW stage (REGISTER_SEMANTICS.md
39). Anything else - depthwise, image input, a Clip or a LUT
activation, a non-conv task, a constant word with an unseen value - raises
:class:`UnsupportedProgramError` naming the task and the word.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
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


def check_conv(task: VendorTask) -> None:
    where = task.where
    if task.enable != CONV_ENABLE:
        raise UnsupportedProgramError(f"{where}: vendor rk3576 task with op-enable {task.enable:#x}; only conv "
                                      f"tasks (CNA+CORE+DPU+DPU_RDMA, {CONV_ENABLE:#x}) are decoded")
    refused = (("CNA", "CONV_CON1", "CONV_MODE", "a depthwise or other non-direct conv (its weight cube and BS "
                                                 "record differ from RK3588's; CONV_MODE 0 is translated)"),
               ("CNA", "CONV_CON1", "ARGB_IN", "an image-input first conv"),
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
    activation(task)   # the clamp words first: they name a refused activation better than 0x407C does
    ew_config(task)
    _check_constants(task)


#: Words with no RK3588 equivalent, and the values every decoded build holds [V ORC, FIX]: any
#: other value is a configuration not seen, refused rather than ignored. BS_OW_CFG bit 8 varies
#: with the output channels (set for 17, 32, 64; clear for 16, 40, 48) and is not compared.
CONSTANTS = {("CNA", "CONV_CON2"): {0xFFF}, ("DPU", "DATA_CUBE_NOTCH"): {0}, ("DPU", "CFG_4094"): {0},
             ("DPU", "CFG_409C"): {0},
             ("DPU", "CFG_40BC"): {0}, ("DPU", "CFG_40C0"): {0x04440100}, ("DPU", "CFG_40D0"): {0x0040FFFF}}
BY_PRECISION = {INT8: {("DPU", "CFG_4038"): 0x00120080, ("DPU", "BS_MODE"): 1, ("DPU", "BS_OW_CFG"): 0x80011011},
                FP16: {("DPU", "CFG_4038"): 0x00100092, ("DPU", "BS_MODE"): 2, ("DPU", "BS_OW_CFG"): 0x00021011}}
BS_OW_CFG_FREE = 0x100


def _check_constants(task: VendorTask) -> None:
    precision = task.field("CNA", "CONV_CON1", "PROC_PRECISION")
    expected = {key: values for key, values in CONSTANTS.items()}
    for key, value in BY_PRECISION.get(precision, {}).items():
        expected[key] = {value}
    for (block, register), values in expected.items():
        value = task.raw(block, register) & ~(BS_OW_CFG_FREE if register == "BS_OW_CFG" else 0)
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
EW_CONFIGS = {(INT8, 0x8002C0C0): 0x904202C0, (FP16, 0x0002C0C0): 0x108202C0}
EW_RELU_CLAMPS = ("CLAMP4", "CLAMP5")
EW_RELU_BYPASS = 1 << 9                 # RK3588 EW_CFG.EW_RELU_BYPASS


def ew_config(task: VendorTask) -> int | None:
    """The RK3588 EW_CFG of the task's EW stage without its Relu (None: bypassed), refusing
    configurations no decoded build writes."""
    value = task.raw("DPU", "CFG_407C")
    if value == EW_BYPASS:
        if task.raw("DPU", "CFG_4080") or task.raw("DPU", "CFG_4084") != 1:
            raise UnsupportedProgramError(f"{task.where}: vendor rk3576 EW stage bypassed (0x407C) with converter "
                                          f"words {task.raw('DPU', 'CFG_4080'):#x} / {task.raw('DPU', 'CFG_4084'):#x}")
        return None
    precision = task.field("CNA", "CONV_CON1", "PROC_PRECISION")
    if (precision, value) not in EW_CONFIGS:
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU.CFG_407C = {value:#x}, an EW stage no decoded "
                                      f"build writes (an Add of the ERDMA operand is; "
                                      f"emulator/REGISTER_SEMANTICS.md 39)")
    return EW_CONFIGS[(precision, value)]


def ew_relu(task: VendorTask) -> bool:
    return task.signed("DPU", "CLAMP4_MIN") == 0


def activation(task: VendorTask) -> str:
    """"none" or "relu" from the DPU's clamp words; anything else is refused by name. CLAMP4 and
    CLAMP5 hold the Relu after an EW Add (ew_relu)."""
    relu = not task.field("DPU", "ACT_CFG", "RELU_BYPASS")
    clip = task.field("DPU", "ACT_CFG", "CLIP_EN")
    precision = task.field("CNA", "CONV_CON1", "PROC_PRECISION")
    after_ew = (precision, task.raw("DPU", "CFG_407C")) in EW_CONFIGS and ew_relu(task)
    expected = {name: (0 if (relu and name in RELU_CLAMPS) or (after_ew and name in EW_RELU_CLAMPS) else INT32_MIN,
                       INT32_MAX) for name in CLAMPS}
    found = {name: (task.signed("DPU", f"{name}_MIN"), task.signed("DPU", f"{name}_MAX")) for name in CLAMPS}
    odd = [f"{name} = [{low}, {high}]" for name, (low, high) in found.items() if (low, high) != expected[name]]
    if clip or odd or task.raw("DPU", "EW_OP_VALUE_0"):
        detail = "; ".join(odd) or f"ACT_CFG {task.raw('DPU', 'ACT_CFG'):#x}"
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 DPU activation not decoded ({detail}); only "
                                      f"none and Relu are (emulator/REGISTER_SEMANTICS.md 10.3)")
    return "relu" if relu else "none"


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
