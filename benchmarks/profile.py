"""Profile one steady-state int8 inference (timing model on) with cProfile:
``python -m benchmarks.profile [resnet50|resnet18|mobilenetv2] [--top 25]``.

Compiles the model (single random calibration sample, as in measure.py), runs one warm-up
inference, then profiles exactly one more and prints the top entries by cumulative and by self time."""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import tempfile

import numpy as np

from benchmarks import measure, models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("model", nargs="?", default="resnet50", choices=["resnet50", "resnet18", "mobilenetv2", "tiny"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--workdir")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="npuemu-prof-") as tmp:
        workdir = args.workdir or tmp
        model, _, _ = models.build(args.model)
        paths = measure.prepare(args.model, model, workdir)
        npu = os.path.join(workdir, f"{args.model}.npu")
        if not os.path.exists(npu):
            measure.compile_int8(paths, npu)
        runtime = measure.load_runtime(npu)
        x = np.load(paths["x"])
        name = runtime.inputs[0]
        measure.run_once(runtime, name, x)  # warm-up
        profiler = cProfile.Profile()
        profiler.enable()
        measure.run_once(runtime, name, x)
        profiler.disable()
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        stats = pstats.Stats(profiler, stream=buf).strip_dirs().sort_stats(key)
        stats.print_stats(args.top)
        text = buf.getvalue()
        print(f"=== top {args.top} by {key} ===")
        print(text[text.find("   ncalls"):].rstrip() if "   ncalls" in text else text)
        print(f"total: {stats.total_tt:.3f} s\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
