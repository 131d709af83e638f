"""``python -m benchmarks [--models a,b] [--repeat N] [--quick] [--batch-sizes 1,2,3] [--json out.json]``
from the repo root."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

from benchmarks import fixed_cost, measure, models

COLUMNS = ["model", "macs", "compile_s", "first_run_s", "emu_int8_ms", "emu_int8_cpu_ms", "emu_fp16_ms",
           "peak_rss_mb", "ort_ms", "ort_cpu_ms", "ratio", "cpu_ratio", "gmac_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--models", default=",".join(models.ALL),
                        help=f"comma-separated subset of {','.join(models.EVERY)}, or all (tiny: the smoke-test CNN)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per median (default 5)")
    parser.add_argument("--quick", action="store_true", help="the tiny model only, repeat 2 (smoke test)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="threads for onnxruntime and for the emulator's BLAS/OpenMP/Numba (default: all cores)")
    parser.add_argument("--batch-sizes", default="1,2,3",
                        help="batch sizes for the scaling table (npuemu compile --batch-size; '' skips it)")
    parser.add_argument("--batch-model", default="mobilenetv2", help="model for the batch scaling table")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    parser.add_argument("--calibration-samples", type=int, default=1,
                        help="random calibration samples of the int8 compile (compile s); default 1")
    parser.add_argument("--no-fixed-cost", action="store_true",
                        help="skip the fixed cost per NPU task and per host step (benchmarks/fixed_cost.py)")
    parser.add_argument("--workdir", help="where models are written (default: a temporary directory)")
    args = parser.parse_args(argv)
    names = ["tiny"] if args.quick else [n.strip() for n in args.models.split(",") if n.strip()]
    if names == ["all"]:
        names = list(models.EVERY)
    repeat = 2 if args.quick else args.repeat
    if repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    measure.set_threads(args.threads)
    if args.calibration_samples < 1:
        parser.error("--calibration-samples must be >= 1")
    measure.set_calibration_samples(args.calibration_samples)
    known = models.EVERY + ["tiny"]
    for name in names:
        if name not in known:
            parser.error(f"unknown model {name!r}; choose from {', '.join(known)}")

    try:
        sizes = [int(n) for n in args.batch_sizes.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--batch-sizes {args.batch_sizes!r}: expected comma-separated integers")
    if any(n < 1 for n in sizes) or (sizes and args.batch_model not in known):
        parser.error("--batch-sizes must be >= 1 and --batch-model one of " + ", ".join(known))
    if args.quick:
        sizes = []

    rows, skipped, batch_rows = [], {}, []
    with tempfile.TemporaryDirectory(prefix="npuemu-bench-") as tmp:
        workdir = args.workdir or tmp
        for name in names:
            print(f"{name}: building", flush=True)
            model, macs, reason = models.build(name)
            if model is None:
                print(f"{name}: skipped: {reason}")
                skipped[name] = reason
                continue
            try:
                rows.append(measure.measure(name, model, macs, workdir, repeat,
                                            log=lambda s: print(s, flush=True)))
            except RuntimeError as exc:
                print(f"{name}: failed: {exc}")
                skipped[name] = f"failed: {exc}"
        if sizes:
            print(f"{args.batch_model}: batch sizes {sizes}", flush=True)
            model, _, reason = models.build(args.batch_model)
            if model is None:
                skipped[f"{args.batch_model} batch"] = reason
            else:
                batch_rows = measure.batch_scaling(args.batch_model, model, workdir, sizes, repeat,
                                                   log=lambda s: print(s, flush=True))
        fixed = None
        if not args.no_fixed_cost:
            print("fixed cost: building the micro models", flush=True)
            try:
                fixed = fixed_cost.measure_fixed(workdir, max(repeat, 5), log=lambda s: None)
            except RuntimeError as exc:
                skipped["fixed cost"] = f"failed: {exc}"
    print()
    print(f"threads: {args.threads} (onnxruntime intra-op; emulator BLAS/OpenMP/Numba), repeat {repeat}, "
          f"calibration samples {args.calibration_samples}")
    print(table(rows))
    print()
    print(scaling(rows))
    if batch_rows:
        print()
        print(batch_table(batch_rows))
    if fixed is not None:
        print()
        print(fixed_cost.table(fixed))
    for name, reason in skipped.items():
        print(f"skipped {name}: {reason}")
    if args.json:
        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
                "calibration_samples": args.calibration_samples,
                "cpus": os.cpu_count(), "python": platform.python_version(), "repeat": repeat,
                "threads": args.threads}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "columns": COLUMNS, "rows": rows, "batch_rows": batch_rows,
                       "fixed_cost": fixed, "skipped": skipped}, f, indent=1)
    return 0 if rows or skipped else 1


def table(rows: list[dict]) -> str:
    head = (f"{'model':<17} {'GMAC':>6} {'compile s':>9} {'cold run s':>10} {'int8 ms':>9} {'fp16 ms':>9} "
            f"{'RSS MB':>7} {'ort ms':>8} {'emu/ort':>8} {'int8 cpu':>9} {'ort cpu':>8} {'cpu ratio':>9} "
            f"{'vendor sim':>10}")
    lines = [head, "-" * len(head)]
    notes = []
    for r in rows:
        fp16 = f"{r['emu_fp16_ms']:.1f}" if r["emu_fp16_ms"] is not None else "n/a"
        if r["emu_fp16_ms"] is None:
            notes.append(f"{r['model']} fp16: {r['fp16_note'] or 'n/a'}")
        vendor = models.VENDOR_SIM_RATIO.get(r["model"])
        lines.append(f"{r['model']:<17} {r['macs'] / 1e9:>6.2f} {r['compile_s']:>9.2f} {r['first_run_s']:>10.2f} "
                     f"{r['emu_int8_ms']:>9.1f} {fp16:>9} {r['peak_rss_mb']:>7.0f} {r['ort_ms']:>8.2f} "
                     f"{r['ratio']:>7.1f}x {r['emu_int8_cpu_ms']:>9.1f} {r['ort_cpu_ms']:>8.2f} "
                     f"{r['cpu_ratio']:>8.1f}x {_vendor_cell(vendor):>10}")
    if any(r["model"] in models.VENDOR_SIM_RATIO for r in rows):
        notes.append("vendor sim: rknn-toolkit2's simulator CPU time / onnxruntime's, not measured by this command: "
                     "m = measured on the dev machine (benchmarks/vendor_sim.py), q = quoted from issue 20")
    return "\n".join(lines + notes)


def _vendor_cell(vendor: tuple[float, str] | None) -> str:
    return f"{vendor[0]:.1f}x {vendor[1][0]}" if vendor else "-"


def batch_table(rows: list[dict]) -> str:
    lines = ["scaling (int8 emulation time vs batch size, npuemu compile --batch-size N):",
             f"{'model':<12} {'batch':>5} {'int8 ms':>9} {'ms/image':>9} {'cpu ms':>9} {'cpu ms/image':>12}"]
    for r in rows:
        lines.append(f"{r['model']:<12} {r['batch']:>5} {r['int8_ms']:>9.1f} {r['int8_ms'] / r['batch']:>9.1f} "
                     f"{r['cpu_ms']:>9.1f} {r['cpu_ms'] / r['batch']:>12.1f}")
    return "\n".join(lines)


def scaling(rows: list[dict]) -> str:
    lines = ["scaling (int8 emulation time vs MACs, batch 1):",
             f"{'model':<12} {'GMAC':>6} {'int8 ms':>9} {'GMAC/s emu':>11} {'GMAC/s ort':>11}"]
    for r in sorted(rows, key=lambda r: r["macs"]):
        vendor = models.VENDOR_SIM_RATIO.get(r["model"])
        lines.append(f"{r['model']:<17} {r['macs'] / 1e9:>6.2f} {r['emu_int8_ms']:>9.1f} {r['gmac_s']:>11.2f} "
                     f"{r['macs'] / (r['ort_ms'] * 1e-3) / 1e9:>11.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
