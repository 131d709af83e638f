"""The PPU pooling task in the vendor's rk3576 layout, both ways (emulator/REGISTER_SEMANTICS.md 41).

The vendor's rk3576 PPU task keeps every RK3588 position but four [V ORC: MaxPool 3x3 s2 p1,
MaxPool 2x2 s2 and AveragePool 2x2 s2 of a 12 x 20 x 16 int8 conv output, each built for rk3576
and rk3588 with rknn-toolkit2 2.5.0; ``tests/data/rk3576_vendor/relux_pool_tasks.npz.xz``]:

- the pad value is a 19-bit word written four times (0x6044, 0x6048, 0x604C, 0x6050): 1x..4x the
  pad of an average pool (zero point -7: -7, -14, -21, -28), the lowest value of a max pool (int8
  -128, fp16 0xfbff = -65504 [V ORC fp16 MaxPool 3x3 s2 p1]), where the rk3588 twin writes
  PADDING_VALUE_1 = the pad (average) or 0 (max) and PADDING_VALUE_2 = bits 34:32 of the pad (7 for
  a negative one, 0 for a max pool) [I: no unit reads them];
- three zero words follow (0x6054-0x605C); MISC_CTRL is 0 (RK3588 BURST_LEN 3);
- PPU_RDMA DATA_FORMAT is 0x40 + the precision code (int8 0x40, fp16 0x42), RK3588's the element
  size code (1, 2).

Decoded: int8 average and max pools, fp16 max pools, and fp16 average pools whose pad words are 0 (the
vendor's GlobalAveragePool over 1 x 1: pad words 0, RECIP_KERNEL_* 0x7c00, the fp16 bits of 2^16 / k
[V ORC: rknn-toolkit2 2.5.0 rk3576 fp16 build]; REGISTER_SEMANTICS.md 57); anything else is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.rknn.rk3576_layout import VendorTask, read_task, field_reader
from npuemu.isa.words import encode_write

PPU_ENABLE = 0x60                           # PPU + PPU_RDMA (op-enable bits 5, 6)
POOL_AVERAGE, POOL_MAX = 0, 1
INT8, FP16 = 0, 2                           # PPU DATA_FORMAT.PROC_PRECISION = the vendor's PPU_RDMA code
ELEMENTS = {INT8: 1, FP16: 2}               # RK3588 PPU_RDMA IN_PRECISION [V ORC twins]
RDMA_FLAG = 0x40                            # vendor PPU_RDMA DATA_FORMAT bit 6 [V ORC, every PPU task]
MAX_POOL_PAD = {INT8: 0x7FF80, FP16: 0xFBFF}   # the vendor's max-pool pad words [V ORC mp, mp2, mp fp16]
#: pools decoded: (precision, method); an fp16 average pool's pad words are seen as 0 only (its counted pad 0)
DECODED = {(INT8, POOL_AVERAGE), (INT8, POOL_MAX), (FP16, POOL_MAX), (FP16, POOL_AVERAGE)}
REFUSED = "only int8 average / max, fp16 max and pad-0 fp16 average pools are decoded"
PAD_COPIES = 4
RK3588_BURST_LEN = 3                        # the twins' MISC_CTRL [V ORC]
HEAD = ("DATA_CUBE_IN_WIDTH", "DATA_CUBE_IN_HEIGHT", "DATA_CUBE_IN_CHANNEL", "DATA_CUBE_OUT_WIDTH",
        "DATA_CUBE_OUT_HEIGHT", "DATA_CUBE_OUT_CHANNEL", "OPERATION_MODE_CFG", "POOLING_KERNEL_CFG",
        "RECIP_KERNEL_WIDTH", "RECIP_KERNEL_HEIGHT", "POOLING_PADDING_CFG")
OUTPUT = ("DST_BASE_ADDR", "DST_SURF_STRIDE", "DATA_FORMAT")
SOURCE = ("CUBE_IN_WIDTH", "CUBE_IN_HEIGHT", "CUBE_IN_CHANNEL", "SRC_BASE_ADDR", "SRC_LINE_STRIDE",
          "SRC_SURF_STRIDE")
PAD_WORDS = tuple(f"PADDING_VALUE_{n}_CFG" for n in range(1, PAD_COPIES + 1))
PAD_MASK = (1 << 19) - 1
Write = tuple[str, str, int]


def is_ppu(enable: int) -> bool:
    return enable == PPU_ENABLE


# --- vendor -> RK3588 (the emulator's translation) -------------------------------------------


def translate_ppu(task: VendorTask) -> list[Write]:
    """The RK3588-position writes of the vendor's rk3576 PPU task (the rk3588 twin's, in its order)."""
    where = task.where
    method = task.field("PPU", "OPERATION_MODE_CFG", "POOLING_METHOD")
    precision = task.field("PPU", "DATA_FORMAT", "PROC_PRECISION")
    if ((precision, method) not in DECODED or task.raw("PPU_RDMA", "DATA_FORMAT") != RDMA_FLAG | precision
            or task.raw("PPU", "MISC_CTRL")):
        raise UnsupportedProgramError(f"{where}: vendor rk3576 PPU task (method {method}, DATA_FORMAT "
                                      f"{task.raw('PPU', 'DATA_FORMAT'):#x}, PPU_RDMA DATA_FORMAT "
                                      f"{task.raw('PPU_RDMA', 'DATA_FORMAT'):#x}, MISC_CTRL "
                                      f"{task.raw('PPU', 'MISC_CTRL'):#x}): {REFUSED} "
                                      f"(emulator/REGISTER_SEMANTICS.md 41, 57)")
    pads = [task.field("PPU", name, "PAD_VALUE") for name in PAD_WORDS]
    pad = _rk3588_pad(method, precision, pads, where)
    return ([("PPU", "S_POINTER", task.raw("PPU", "S_POINTER")),
             ("PPU_RDMA", "S_POINTER", task.raw("PPU_RDMA", "S_POINTER"))]
            + [("PPU", name, task.raw("PPU", name)) for name in HEAD]
            + [("PPU", "PADDING_VALUE_1_CFG", pad & 0xFFFFFFFF), ("PPU", "PADDING_VALUE_2_CFG", (pad >> 32) & 7)]
            + [("PPU", name, task.raw("PPU", name)) for name in OUTPUT]
            + [("PPU", "MISC_CTRL", RK3588_BURST_LEN)]
            + [("PPU_RDMA", name, task.raw("PPU_RDMA", name)) for name in SOURCE]
            + [("PPU_RDMA", "DATA_FORMAT", ELEMENTS[precision])])


def _rk3588_pad(method: int, precision: int, pads: list[int], where: str) -> int:
    """The RK3588 pad of the pool: an average's pad (its 19-bit words 1x..4x it), 0 for a max pool
    (the twins' value; a max pool never pools a pad, emulator/kernels/ppu.py)."""
    signed = [value - (1 << 19) if value >> 18 else value for value in pads]
    # an fp16 average's pad words are seen as 0 only (REGISTER_SEMANTICS.md 57); other fp16 pads are not known
    if (method == POOL_AVERAGE and signed == [n * signed[0] for n in range(1, PAD_COPIES + 1)]
            and (precision == INT8 or signed[0] == 0)):
        return signed[0]
    if method == POOL_MAX and pads == [MAX_POOL_PAD[precision]] * PAD_COPIES:
        return 0
    raise UnsupportedProgramError(f"{where}: vendor rk3576 PPU pooling method {method} with pad words "
                                  f"{[hex(value) for value in pads]}: not decoded (an average's 1x..4x its pad, "
                                  f"a max pool's lowest value are)")


# --- RK3588 -> vendor (npuemu's own builds) ---------------------------------------------------

Values = Mapping[tuple[str, str], int]


def ppu_vendor_writes(values: Values, source: RegisterMap, where: str) -> list[Write]:
    """npuemu's RK3588-position PPU task (``values``, packed with ``source``) in the vendor's order."""
    field = field_reader(values, source)
    method = field("PPU", "OPERATION_MODE_CFG", "POOLING_METHOD")
    precision = field("PPU", "DATA_FORMAT", "PROC_PRECISION")
    pad = field("PPU", "PADDING_VALUE_1_CFG", "PAD_VALUE_0")
    if ((precision, method) not in DECODED or field("PPU_RDMA", "DATA_FORMAT", "IN_PRECISION") != ELEMENTS[precision]
            or (precision, method, pad != 0) == (FP16, POOL_AVERAGE, True)):
        raise UnsupportedProgramError(f"{where}: a PPU task other than an int8 average or max pool, an fp16 max "
                                      f"pool or an fp16 average pool with pad 0 has no known form in the vendor "
                                      f"rk3576 layout (emulator/REGISTER_SEMANTICS.md 41, 57)")
    pads = [MAX_POOL_PAD[precision]] * PAD_COPIES if method == POOL_MAX else [n * pad for n in range(1, PAD_COPIES + 1)]
    return ([("PPU", "S_POINTER", values.get(("PPU", "S_POINTER"), 0)),
             ("PPU_RDMA", "S_POINTER", values.get(("PPU_RDMA", "S_POINTER"), 0))]
            + [("PPU", name, values.get(("PPU", name), 0)) for name in HEAD]
            + [("PPU", name, value & PAD_MASK) for name, value in zip(PAD_WORDS, pads)]
            + [("PPU", f"RSV_{offset:04X}", 0) for offset in (0x6054, 0x6058, 0x605C)]
            + [("PPU", name, values.get(("PPU", name), 0)) for name in OUTPUT]
            + [("PPU", "MISC_CTRL", 0)]
            + [("PPU_RDMA", name, values.get(("PPU_RDMA", name), 0)) for name in SOURCE]
            + [("PPU_RDMA", "DATA_FORMAT", RDMA_FLAG | precision)])


#: PADDING_VALUE_2_CFG: no unit reads it (emulator/units/ppu.py reads PADDING_VALUE_1); npuemu
#: writes 0 where the translation gives the twins' bits 34:32 of the pad.
NOT_ROUND_TRIPPED = {("PPU", "PADDING_VALUE_2_CFG")}


def check_ppu_round_trip(values: Values, vendor: RegisterMap, writes: list[Write], where: str) -> None:
    """Raise unless the vendor ``writes`` translate back to ``values`` on every register a unit reads."""
    words = [encode_write(vendor, block, name, value) for block, name, value in writes]
    back = {(block, name): value for block, name, value in translate_ppu(read_task(words, vendor, where, PPU_ENABLE))}
    for key in (set(values) | set(back)) - NOT_ROUND_TRIPPED:
        if values.get(key, 0) != back.get(key, 0):
            raise UnsupportedProgramError(
                f"{where}: {key[0]}.{key[1]} = {values.get(key, 0):#x} comes back from the vendor rk3576 layout as "
                f"{back.get(key, 0):#x}; the PPU task has no vendor form (emulator/REGISTER_SEMANTICS.md 41)")
