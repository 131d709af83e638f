"""A LUT program's RAM upload as one block of register writes (issue 20: compile time).

The upload is rep10's (isa/lut_format.py): LUT_ACCESS_CFG (write access, table id, address 0),
then one LUT_ACCESS_DATA word per entry, LE (table 0) then LO (table 1): 1,028 writes. Packed
one checked write at a time that was most of the lowering time of models with LUT activations
(PP-OCRv4 rec: 310 uploads). Here the two CFG words go through the register map's own packing,
the 1,026 data words are packed in one step - an entry's 16 bits placed at the field's position,
the same value ``Register.pack`` gives, as the field is unsigned and at least 16 bits wide (else
the per-word path runs and its check reports the misfit) - and the block is kept per table
contents and register map: the tasks of a tiled layer, and layers quantized alike, upload equal
tables.
"""

from __future__ import annotations

import numpy as np

from npuemu.isa import lut_format
from npuemu.isa.regmap import RegisterMap
from npuemu.isa.task import RegisterWrite

from .fields import RegisterBuilder
from .lut import LutProgram

#: (the two tables' data words as bytes) -> (register map, the upload's writes): the tasks of a
#: tiled layer, and layers quantized alike, upload equal tables; bounded, it is only a cache
_UPLOADS: dict[bytes, tuple[RegisterMap, tuple[RegisterWrite, ...]]] = {}
_UPLOADS_KEPT = 256
#: one shared (frozen) LUT_ACCESS_DATA write per data word
_DATA_WRITES: dict[int, RegisterWrite] = {}


def upload_writes(lut: LutProgram, regmap: RegisterMap, layer: str) -> tuple[RegisterWrite, ...]:
    """The writes that upload ``lut``'s two tables (module docstring)."""
    data = regmap.register("DPU", "LUT_ACCESS_DATA").field("LUT_ACCESS_DATA")
    if data.signed or data.width < 16 or data.lsb + data.width > 32:
        return _checked_upload(lut, regmap, layer)  # its field check names the misfit
    tables = [(np.asarray(values).astype(np.int64) & lut_format.LUT_ENTRY_MASK) << data.lsb
              for values in (lut.le, lut.lo)]
    key = len(tables[0]).to_bytes(4, "little") + b"".join(words.astype("<u4").tobytes() for words in tables)
    known = _UPLOADS.get(key)
    if known is not None and known[0] is regmap:
        return known[1]
    b = RegisterBuilder(regmap, layer)
    for table_id, words in zip((lut_format.LUT_TABLE_LE, lut_format.LUT_TABLE_LO), tables):
        b.write("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=lut_format.LUT_ACCESS_WRITE, LUT_TABLE_ID=table_id, LUT_ADDR=0)
        b.writes.extend(_DATA_WRITES.get(word) or _data_write(word) for word in words.tolist())
    if len(_UPLOADS) >= _UPLOADS_KEPT:
        _UPLOADS.clear()
    _UPLOADS[key] = (regmap, b.done())
    return _UPLOADS[key][1]


def _data_write(word: int) -> RegisterWrite:
    write = _DATA_WRITES[word] = RegisterWrite("DPU", "LUT_ACCESS_DATA", word)
    return write


def _checked_upload(lut: LutProgram, regmap: RegisterMap, layer: str) -> tuple[RegisterWrite, ...]:
    b = RegisterBuilder(regmap, layer)
    for table_id, values in ((lut_format.LUT_TABLE_LE, lut.le), (lut_format.LUT_TABLE_LO, lut.lo)):
        b.write("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=lut_format.LUT_ACCESS_WRITE, LUT_TABLE_ID=table_id, LUT_ADDR=0)
        for value in values:
            b.write("DPU", "LUT_ACCESS_DATA", LUT_ACCESS_DATA=lut_format.data_word(value))
    return b.done()
