"""``npuemu calibrate [-t CHIP] [--fit] [--json]``: the timing model against the real-board rows
of calibration.md (tools/calibration.py, emulator/TIMING.md "Calibration").

Each listed layer is compiled for its chip and run on the emulator; the report prints model vs
board for NPU cycles, DDR cycles and time with the relative errors and their medians. Without
``--fit`` the platform YAML's figures are used; with ``--fit`` the figures are fitted to the
rows first (least squares, once per chip) and printed as the YAML lines to record.
"""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="compare the timing model with the real-board layer profiles of calibration.md",
        description="Compile and emulate every layer of calibration.md on its chip and print model vs "
        "board for NPU cycles, DDR cycles and time (per-layer profiling: task cycles at the NPU clock "
        "plus one host submit per layer). --fit fits the DDR rates, the compute/DMA overlap and the "
        "launch overheads to the rows first.",
    )
    parser.add_argument("-t", "--target", default=None,
                        help="only this chip's rows (rk3588: Table A, rk3562: Table B; default: all)")
    parser.add_argument("--fit", action="store_true",
                        help="fit ddr.read/write_bytes_per_cycle, ddr.compute_overlap and launch.* to the rows")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.errors import ConfigError
    from npuemu.platforms import load_platform
    from npuemu.tools.calibration import Figures, fit, report, run_row
    from npuemu.tools.calibration_rows import ROWS

    chips = sorted({row.chip for row in ROWS})
    if args.target is not None:
        chip = load_platform(args.target).name
        if chip not in chips:
            raise ConfigError(f"calibration.md has no board rows for {args.target!r}; rows exist for: "
                              f"{', '.join(chips)}")
        chips = [chip]
    reports = []
    for chip in chips:
        runs = [run_row(row) for row in ROWS if row.chip == chip]
        figures = Figures.of(load_platform(chip))
        if args.fit:
            figures = fit(runs, figures)
        reports.append(report(chip, runs, figures))
    out = sys.stdout
    if args.json:
        json.dump({"fitted": args.fit, "chips": [r.to_json() for r in reports]}, out, indent=1)
        out.write("\n")
        return 0
    for index, chip_report in enumerate(reports):
        if index:
            out.write("\n")
        out.write(chip_report.format_text() + "\n")
        if args.fit:
            out.write(_yaml_lines(chip_report) + "\n")
    return 0


def _yaml_lines(chip_report) -> str:
    f = chip_report.figures
    rows = ", ".join(f"{r.run.row.table}{r.run.row.id}" for r in chip_report.results if r.run.fit_row)
    source = f"fitted to calibration.md rows {rows} by npuemu calibrate --fit"
    return "\n".join([
        f"fitted figures for platforms/{chip_report.chip}.yaml ({source}):",
        "ddr:",
        f"  read_bytes_per_cycle: {f.read_bytes_per_cycle:g}",
        f"  write_bytes_per_cycle: {f.write_bytes_per_cycle:g}",
        f"  compute_overlap: {f.compute_overlap:g}",
        "launch:",
        f"  task_overhead_cycles: {f.task_overhead_cycles}",
        f"  host_submit_overhead_us: {f.host_submit_overhead_us:g}",
        "cycle_model:",
        f"  conv_write_bytes_per_cycle: {'null' if f.conv_write_bytes_per_cycle is None else f'{f.conv_write_bytes_per_cycle:g}'}",
    ])
