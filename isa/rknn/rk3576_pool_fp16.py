"""The vendor's rk3576 fp16 average pool: a depthwise conv with no bias record (emulator/REGISTER_SEMANTICS.md 50.3,
56.1).

Evidence [V ORC]: rknn-toolkit2 2.5.0 fp16 builds (``do_quantization=False``) for rk3576 of AveragePool (pads
counted) 3x3 s2 p1 on [1, 16, 12, 12] after a conv and on [1, 16, 12, 20] alone, 2x2 s2 on [1, 24, 12, 20], 3x3 s1
p1 on [1, 32, 10, 14], 5x5 s1 p2 on [1, 40, 14, 14]. Each pool is ``Conv:<out>_2dw``: the fp16 depthwise conv's words
(rk3576_layout, 41) with fp16 weights 1 / area and these differences from the depthwise conv the vendor writes for a
Conv with a bias (e.g. ``dw80_f16``; its GlobalAveragePools over 7 x 7 and 12 x 20 are such convs, with a record):

| word | pool conv | depthwise conv with a bias |
|---|---|---|
| DPU 0x4038 | 0x52 | 0x00100092 |
| DPU_RDMA BRDMA_CFG | 0x10: SHIFT_CFG_EN alone, no BRDMA_DATA_USE | 0x110 (the ALU operand read) |
| DPU_RDMA DATA_CUBE_CHANNEL | 0 | the channels - 1 |
| DPU_RDMA FEATURE_MODE_CFG | 0x40000010: precisions and CONV_MODE 0 (nothing read) | 0x40010052 (fp16, CONV_MODE 1) |

Read [I]: 0x4038's low byte is RK3588's BS_CFG bit for bit where both are known (0x53 every BS bypass, rk3576_dpu);
0x52 is BS_CFG with the stage on and its ALU, multiplier and Relu bypassed - the stage passes the sum through in the
depthwise output order (BS_OW_CFG 0x23133 as any fp16 depthwise conv's), reading no record; the DPU_RDMA words are
zero because its BRDMA reads nothing. The same bias-less fp16 depthwise conv appears in both builds of the bilinear
Resize (its phase convs, rk3576_bilinear), where the rk3588 twin writes BS_CFG 0x53 (the whole stage bypassed),
BRDMA_CFG 0 and BS_OW_CFG with OD_BYPASS [V]. So the RK3588 form is the depthwise conv's (rk3576_forms) with those
words: the sums as they leave the CORE (a zero bias record, npuemu's own form, gives the same values but for the sign
of an exact zero sum: -0.0 + 0.0 is +0.0).
"""

from __future__ import annotations

from npuemu.isa.errors import UnsupportedProgramError
from npuemu.isa.rknn.rk3576_forms import Cbuf, rk3588_specs
from npuemu.isa.rknn.rk3576_layout import CONV_ENABLE, FP16, VENDOR_DEPTHWISE, VendorTask, check_conv

Spec = tuple[str, str, dict[str, int]]

BS_PASS = 0x52                 # vendor 0x4038 of the pool conv: BS_CFG bits, ALU / MUL / Relu bypassed [V] [I]
TWIN_BS = 0x53                 # the twin's BS_CFG of the same bias-less conv: the stage bypassed [V bilinear fp16]
SHIFT_ONLY = 0x10              # DPU_RDMA BRDMA_CFG: SHIFT_CFG_EN, no record read [V]
#: DPU_RDMA FEATURE_MODE_CFG of the pool conv [V: the four pool builds], and without bit 30 in the bilinear Resize's
#: phase conv (rk3576_bilinear; its int8 phase conv too: 0x12) [V]
RDMA_IDLE = (0x40000010, 0x10)
#: the words of the vendor's depthwise conv with a bias that stand for the pool conv's in the translation
#: [V: dw80_f16, the se8 GlobalAveragePool convs]: 0x4038, BS_MODE, BRDMA_CFG (ALU + shift word), and its
#: DPU_RDMA FEATURE_MODE_CFG (fp16 in and processing, CONV_MODE 1, the MRDMA off)
WITH_BIAS = {("DPU", "CFG_4038"): 0x00100092, ("DPU", "BS_MODE"): 0, ("DPU_RDMA", "BRDMA_CFG"): 0x110,
             ("DPU_RDMA", "FEATURE_MODE_CFG"): 0x40010052}


def is_pool_depthwise(task: VendorTask) -> bool:
    """A conv task whose CNA writes an fp16 depthwise conv and whose DPU has the pool conv's BS words."""
    values = task.values
    return (task.enable == CONV_ENABLE and values.get(("DPU", "CFG_4038")) == BS_PASS
            and values.get(("DPU_RDMA", "BRDMA_CFG")) == SHIFT_ONLY
            and task.field("CNA", "CONV_CON1", "CONV_MODE") == VENDOR_DEPTHWISE
            and task.field("CNA", "CONV_CON1", "PROC_PRECISION") == FP16)


def pool_specs(task: VendorTask, cbuf: Cbuf) -> list[Spec]:
    """The RK3588 writes of a vendor pool conv: the depthwise conv with a bias read through the decoded form,
    then its BS stage passed through with no record (module docstring); refuses other DPU_RDMA words by name."""
    rdma = (task.raw("DPU_RDMA", "FEATURE_MODE_CFG"), task.raw("DPU_RDMA", "DATA_CUBE_CHANNEL"),
            task.raw("DPU", "BS_MODE"))
    if rdma[0] not in RDMA_IDLE or rdma[1:] != (0, 0):
        raise UnsupportedProgramError(f"{task.where}: vendor rk3576 fp16 depthwise conv without a bias record with "
                                      f"DPU_RDMA FEATURE_MODE_CFG {rdma[0]:#x}, DATA_CUBE_CHANNEL {rdma[1]:#x}, "
                                      f"BS_MODE {rdma[2]:#x}; only the average pool's {RDMA_IDLE[0]:#x} (or "
                                      f"{RDMA_IDLE[1]:#x}), 0, 0 is decoded (emulator/REGISTER_SEMANTICS.md 56.1)")
    channels = task.raw("DPU", "DATA_CUBE_CHANNEL")
    view = VendorTask(task.regmap, task.where,
                      {**task.values, **WITH_BIAS, ("DPU_RDMA", "DATA_CUBE_CHANNEL"): channels}, task.kept, task.enable)
    check_conv(view)
    passed = {("DPU", "BS_CFG"): {"raw": TWIN_BS}, ("DPU", "BS_ALU_CFG"): {}, ("DPU", "BS_MUL_CFG"): {},
              ("DPU_RDMA", "BRDMA_CFG"): {}}
    # the shift word is not read: the multiplier is bypassed (BS_MUL_SHIFT_VALUE_NEG 0 as npuemu's own pool conv)
    return [(block, name, passed.get((block, name), fields))
            for block, name, fields in rk3588_specs(view, FP16, (0, 0), cbuf, None)]
