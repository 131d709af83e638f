"""``npuemu sweep SWEEP.yaml -o results.csv [--backend local|ray] [--address ADDR] [--workers N]
[--layers layers.csv]``: a design-space sweep - models x dtypes x core masks x batch sizes x SRAM x
platform figures - one timing row per point (tools/sweep_spec.py the file, tools/sweep_run.py the
scheduling, tools/sweep_worker.py one task, tools/sweep_backends.py where tasks run;
``values: true`` adds output_cosine/output_max_abs_error per build, tools/sweep_values.py).

``npuemu sweep plot results.csv [-o front.png] [--x COL] [--y COL]``: the Pareto front of two
columns (time vs DDR bytes by default), one line per value of each swept figure
(tools/sweep_plots.py; the ``plot`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="design-space sweep: one timing row per point of a grid of builds and platform figures",
        description="Run every point of the grid a sweep file describes (models, target, dtype, dataset, "
        "core_mask, batch_size, sram, set: platform keys with lists of values; sample: N draws N points) and "
        "write one CSV row per point as it finishes: the swept values and the timing totals. Points that differ "
        "only in figures the timing model reads share one build. With values: true (values_samples: N, default 1) "
        "each build is also run on the dataset's first N samples and every row gets output_cosine and "
        "output_max_abs_error against the float ONNX model. A rerun skips the points already in the CSV. "
        "`npuemu sweep plot results.csv` draws the Pareto front.")
    parser.add_argument("spec", metavar="SWEEP.yaml | plot", help="the sweep file, or `plot` to plot a results CSV")
    parser.add_argument("results", nargs="?", type=Path, help="plot: the results CSV")
    parser.add_argument("-o", "--output", type=Path, default=None,
                        help="sweep: the results CSV (required); plot: the PNG (default: RESULTS.png)")
    parser.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="local: a process pool on this machine (default); ray: one Ray task per point")
    parser.add_argument("--address", default=None,
                        help="ray: the address of an existing Ray cluster (default: start a local Ray instance)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="worker processes (default: the CPUs of this machine, or of the Ray cluster)")
    parser.add_argument("--layers", type=Path, default=None, metavar="layers.csv",
                        help="also write one row per layer of every point to this CSV")
    parser.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help="where builds are kept for reuse (default: RESULTS.builds next to the CSV)")
    parser.add_argument("--x", default="ddr_bytes", help="plot: the column of the x axis (default ddr_bytes)")
    parser.add_argument("--y", default="time_us", help="plot: the column of the y axis (default time_us)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.errors import ConfigError

    if args.spec == "plot":
        return _plot(args)
    if args.results is not None:
        raise ConfigError(f"unexpected argument {args.results}: `npuemu sweep SWEEP.yaml -o results.csv`")
    if args.output is None:
        raise ConfigError("give the results CSV: npuemu sweep SWEEP.yaml -o results.csv")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers}: expected 1 or more")
    return _sweep(args)


def _sweep(args: argparse.Namespace) -> int:
    from npuemu.tools.paths import refuse_input_as_output
    from npuemu.tools.sweep_backends import backend
    from npuemu.tools.sweep_run import Sweep
    from npuemu.tools.sweep_spec import load_spec

    spec = load_spec(args.spec)
    for output in (args.output, args.layers):
        if output is not None:
            refuse_input_as_output(output, [Path(args.spec)], "-o" if output is args.output else "--layers")
    cache = args.cache or args.output.with_name(args.output.name + ".builds")
    if args.backend == "ray" and args.address:
        cache = args.cache  # a cluster's nodes share no folder unless told: builds travel as Ray objects
    sweep = Sweep(spec, args.output, args.layers, cache)
    runner = backend(args.backend, args.workers, args.address)
    try:
        summary = sweep.run(runner)
    finally:
        runner.close()
    print(summary.text(args.output))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from npuemu.isa.errors import ConfigError
    from npuemu.tools.sweep_plots import pareto_plot

    if args.results is None:
        raise ConfigError("give the results CSV: npuemu sweep plot results.csv [-o front.png]")
    output = args.output or args.results.with_suffix(".png")
    print(pareto_plot(args.results, output, args.x, args.y))
    return 0
