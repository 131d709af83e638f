"""The DPU look-up tables as they travel through the command stream, stated once: the compiler
writes them (``compiler/lower/lut.py``, ``emit_dpu.write_lut_upload``) and the emulator's LUT
port stores them (``emulator/regfile.py``) and reads them (``emulator/kernels/lut.py``).

- **Two tables**, LE (LUT_TABLE_ID 0) and LO (1), of 513 int16 entries each: rep10 uploads
  513 LUT_ACCESS_DATA words after each LUT_ACCESS_CFG with table id 0 and 1 (vendor-corpus
  regcmd/rep10_sigmoid_64_56.txt; NUMERICS.md 5; compiler/LOWERING.md 4.1).
- **Upload**: LUT_ACCESS_CFG with LUT_ACCESS_TYPE 1 (write), the table id and LUT_ADDR 0, then
  one LUT_ACCESS_DATA word per entry; each data write stores at the current address and
  advances it (rep10; emulator/regfile.py). An entry is the int16's two's-complement bits in
  the word's low 16 bits.
- **The vendor's table layout** (rep10 LUT_CFG / LUT_INFO / LUT_*_START/END, words 1146-1155):
  LE over LUT inputs [-16384, 0], LO over [0, 16384], index select 5 (a step of 32 inputs:
  16384 / 2^5 = 512 intervals per table), LUT_CFG hybrid and overflow priority LO, underflow
  priority LE, LO_LE_MUX 2. The compiler writes this layout; the emulator reads whatever the
  registers say (NUMERICS.md 5 for the interpolation).
"""

from __future__ import annotations

import numpy as np

LUT_ENTRIES = 513  # entries per table (rep10)
LUT_TABLES = ("LE", "LO")  # by LUT_ACCESS_CFG.LUT_TABLE_ID (rep10)
LUT_TABLE_LE, LUT_TABLE_LO = 0, 1
LUT_ACCESS_WRITE = 1  # LUT_ACCESS_CFG.LUT_ACCESS_TYPE of an upload (rep10)
LUT_ENTRY_MASK = 0xFFFF  # LUT_ACCESS_DATA bits an entry occupies

# rep10's table layout (module docstring)
LUT_SPAN = 16384  # LE [-LUT_SPAN, 0], LO [0, LUT_SPAN]
LUT_INDEX_SELECT = 5  # LUT_INFO: one entry every 2^5 inputs
LUT_CFG_REP10 = dict(LUT_HYBRID_PRIORITY=1, LUT_OFLOW_PRIORITY=1, LUT_UFLOW_PRIORITY=0, LUT_LO_LE_MUX=2)


def data_word(entry: int) -> int:
    """The LUT_ACCESS_DATA field value that uploads one int16 ``entry``."""
    return int(entry) & LUT_ENTRY_MASK


def entries(words: np.ndarray) -> np.ndarray:
    """int16 entries of LUT_ACCESS_DATA words (any integer array)."""
    return (np.asarray(words) & LUT_ENTRY_MASK).astype(np.uint16).view(np.int16)
