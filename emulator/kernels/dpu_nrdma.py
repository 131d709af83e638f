"""The DPU_RDMA's NRDMA: one per-channel BN operand fetched alone (REGISTER_SEMANTICS.md 37, 38).

NRDMA_DATA_USE names one BRDMA operand bit (isa/weight_layout.BS_OPERANDS); the blob at BN_BASE_ADDR is
then that operand alone, in the BRDMA's 8-channel groups. The exNorm (fp32 ALU), the exLSTM (int32 ALU)
and the exGRU (16-bit MUL) read it; each caller checks the form it models and reads the words here.
"""

from __future__ import annotations

import numpy as np

from npuemu.emulator.memory import TaskDma, Traffic
from npuemu.emulator.units.state import DpuRdmaState
from npuemu.isa import weight_layout

#: NRDMA_DATA_USE of one operand alone (the BRDMA's bit order, isa/weight_layout.BS_OPERANDS):
#: the ALU [V: layernorm task 21, BN_ALU_SRC 1; lstm_int8] and the MUL [V: gru_* task 17]
NRDMA_ALU, NRDMA_MUL = 1, 4


def read_operand(dma: TaskDma, rdma: DpuRdmaState, use: int, channels: int, what: str) -> np.ndarray:
    """The first ``channels`` words of the NRDMA blob of operand ``use``, in the blob's own type."""
    group = weight_layout.bs_group_dtype(use)
    nbytes = weight_layout.bs_groups(channels) * group.itemsize
    raw = dma.read_rows(Traffic.BN_READ, np.array([rdma.bn_address], np.int64), nbytes,
                        f"{what} (BN_BASE_ADDR={rdma.bn_address:#x})")
    return np.ascontiguousarray(raw).reshape(-1).view(group)[group.names[0]].reshape(-1)[:channels]
