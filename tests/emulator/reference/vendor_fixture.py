"""Register values and quantisation parameters of real vendor layers, for the chain tests.

``vendor_layers.json`` (next to this file) is extracted from the vendor corpus
(``../shared/docs/vendor-corpus/regcmd``: rep01, rep09, rep10, rep12 ``.txt`` register
listings and ``.quant.json`` tables, rknn-toolkit2 2.5.0 builds for rk3588) so the tests do not
depend on that folder. Regenerate with ``python -m tests.emulator.reference.vendor_fixture DIR``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

FIXTURE = Path(__file__).with_name("vendor_layers.json")


def load() -> dict:
    return json.loads(FIXTURE.read_text())


def _task_lines(listing: str, task: int) -> list[str]:
    """The register lines of one task (from its ``=== TASK n`` header to the next header)."""
    lines, current = [], -1
    for line in listing.splitlines():
        header = re.match(r"=== TASK (\d+) ", line)
        if header:
            current = int(header.group(1))
        elif current == task:
            lines.append(line)
    return lines


def _fields(listing: str, task: int) -> dict[str, int]:
    """Decoded register fields of one task (``NAME=value`` pairs), later writes winning."""
    fields: dict[str, int] = {}
    for line in _task_lines(listing, task):
        for name, value in re.findall(r"\b([A-Z][A-Z0-9_]*)=(-?\d+)", line):
            fields[name] = int(value)
    return fields


def _lut_tables(listing: str) -> list[list[int]]:
    tables: list[list[int]] = []
    current = None
    for line in listing.splitlines():
        if "LUT_ACCESS_CFG" in line and "LUT_ACCESS_TYPE=1" in line:
            current = []
            tables.append(current)
        elif current is not None and "LUT_ACCESS_DATA=" in line:
            current.append(int(re.search(r"LUT_ACCESS_DATA=(-?\d+)", line).group(1)))
        else:
            current = None
    return tables


def _scales(quant: dict) -> dict[str, tuple[float, int]]:
    return {t["name"]: (t["scale"][0], t["zero_point"][0]) for t in quant["tensors"] if t["scale"]}


def extract(regcmd: Path) -> dict:
    def read(case):
        return ((regcmd / f"{case}.txt").read_text(),
                json.loads((regcmd / f"{case}.quant.json").read_text()))

    rep01_txt, rep01 = read("rep01_conv3x3s1_32to32_56_relu")
    conv = next(layer for layer in rep01["layers"] if layer.get("channels"))
    rep01_regs = _fields(rep01_txt, 0)
    rep09_txt, rep09 = read("rep09_add_64_56")
    rep10_txt, rep10 = read("rep10_sigmoid_64_56")
    rep12_txt, rep12 = read("rep12_resblock_convadd_3x3_64_56")
    convadd = [layer for layer in rep12["layers"] if layer.get("channels")][-1]
    keys = ("OUT_CVT_SCALE", "OUT_CVT_SHIFT", "OUT_CVT_OFFSET", "CVT_ROUND", "BS_MUL_SHIFT_VALUE",
            "BS_MUL_SHIFT_VALUE_NEG", "BS_ALU_OPERAND", "BS_MUL_OPERAND", "BN_ALU_OPERAND",
            "BN_MUL_OPERAND", "BN_MUL_SHIFT_VALUE", "BN_MUL_SHIFT_VALUE_NEG", "EW_OP_CVT_OFFSET",
            "EW_OP_CVT_SCALE", "EW_OP_CVT_SHIFT", "EW_CVT_ROUND", "LUT_HYBRID_PRIORITY",
            "LUT_OFLOW_PRIORITY", "LUT_UFLOW_PRIORITY", "LUT_LE_INDEX_SELECT",
            "LUT_LO_INDEX_SELECT")

    def pick(fields):
        return {k: fields[k] for k in keys if k in fields}

    rep10_regs = _fields(rep10_txt, 1)  # task 1 runs the sigmoid; task 0 uploads the tables
    rep10_lines = _task_lines(rep10_txt, 1)
    listing_values = {}
    for name in ("LE_START", "LE_END", "LO_START", "LO_END"):
        line = next(line for line in rep10_lines if f"DPU.LUT_{name} " in line)
        listing_values[name] = int(re.search(r"V=(-?\d+)", line).group(1))
    slope_fields = {}
    for line in (line for line in rep10_lines if "_SLOPE_" in line):
        table = "LE" if "LUT_LE" in line else "LO"
        for name, value in re.findall(r"\b([OU]FLOW_(?:SCALE|SHIFT))=(-?\d+)", line):
            slope_fields[f"{table}_{name}"] = int(value)
    le, lo = _lut_tables(rep10_txt)
    return {
        "source": "vendor-corpus/regcmd (rknn-toolkit2 2.5.0, rk3588)",
        "rep01": {
            "registers": pick(rep01_regs),
            "s_in": conv["inputs"][0]["scale"][0], "zp_in": conv["inputs"][0]["zero_point"][0],
            "s_out": conv["outputs"][0]["scale"][0], "zp_out": conv["outputs"][0]["zero_point"][0],
            "channels": [{k: ch[k] for k in ("c", "s_w", "zp_w", "alu", "cpend", "mul", "M",
                                             "M_regs")} for ch in conv["channels"]],
        },
        "rep09": {"registers": pick(_fields(rep09_txt, 0)), "tensors": _scales(rep09)},
        "rep10": {"registers": {**pick(rep10_regs), **listing_values, **slope_fields},
                  "tensors": _scales(rep10), "le_table": le, "lo_table": lo},
        "rep12": {"registers": pick(_fields(rep12_txt, 2)), "tensors": _scales(rep12),
                  "conv_add_s_w": [ch["s_w"] for ch in convadd["channels"]],
                  "conv_add_mul": [ch["mul"] for ch in convadd["channels"]]},
    }


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(extract(Path(sys.argv[1])), indent=1) + "\n")
