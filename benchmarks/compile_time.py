"""Compile time against the vendor's build (issue 20): ``python -m benchmarks.compile_time``.

Times the whole ``npuemu compile model.onnx -t rk3588 --quantize --dataset ds.txt`` process (import,
graph passes, calibration on ``--samples`` samples, lowering, model-file write) for the issue's
four models, ``--repeat`` times each, and prints the fastest and slowest wall time, the process's
CPU time (user + system, steadier than wall time on a shared machine) and its peak RSS beside the
vendor's build time (issue 20's figures, measured with rknn-toolkit2 on the same kind of 2-core
machine; not re-measured here). The calibration samples are ``benchmarks.measure.prepare``'s: the
benchmark input, then seeded random inputs.

For scale, the same run times onnxruntime (one thread) creating a session and running the same
samples (``ort s``): when that figure moves, the machine's load moved.

The compiles run as an installed package runs them: with a warm bytecode cache (a private
``PYTHONPYCACHEPREFIX`` under the work directory, filled by one untimed compile of each model,
bytecode writing on even where the environment sets ``PYTHONDONTWRITEBYTECODE``; pip writes the
bytecode of an installed package). Without a cache every process compiles the project's ~190
modules from source again, ~0.2-0.4 s of CPU per compile; ``--no-bytecode-cache`` measures that.
The untimed compile also fills Numba's cache of calibration's depthwise kernel where a model uses
it (compiler/depthwise_kernel.py; a first compile on a machine takes ~1-2 s more).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

#: model -> the vendor's rk3588 build time with 20 calibration samples, seconds (issue 20)
VENDOR_BUILD_S = {"mobilenetv2": 2.2, "resnet50": 8.2, "ppocr_rec": 4.2, "yolox_det": 5.9}
MODELS = list(VENDOR_BUILD_S)


#: Runs the command and prints its wall time and rusage. Started as a small process of its own:
#: on Linux a process's ru_maxrss starts from the peak of the process it was forked from, so
#: forking the compile from this (large) process would report this process's peak.
_LAUNCH = """
import json, os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(json.dumps({"wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "rss_mb": usage.ru_maxrss / 1024, "code": os.waitstatus_to_exitcode(status)}))
"""


def timed_process(cmd: list[str], env: dict) -> dict:
    """Wall time, CPU time (user + system, its calibration workers included) and peak RSS (of
    its largest process: with N calibration workers there are N + 1 such processes at once)."""
    proc = subprocess.run([sys.executable, "-c", _LAUNCH, *cmd], capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    row = json.loads(lines[-1]) if proc.returncode == 0 and lines else {"code": proc.returncode}
    if row["code"] != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({row['code']}): {proc.stderr.strip()[-800:]}")
    del row["code"]
    return row


def ort_seconds(paths: dict, samples: int) -> float:
    """onnxruntime, one thread: session creation plus ``samples`` runs (CPU time)."""
    import onnxruntime as ort

    start = time.process_time()
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(paths["onnx"], options, providers=["CPUExecutionProvider"])
    x = np.load(paths["x"])
    for _ in range(samples):
        session.run(None, {paths["input_name"]: x})
    return time.process_time() - start


def compile_env(workdir: str, bytecode_cache: bool) -> dict:
    """The compile processes' environment (module docstring: the bytecode cache)."""
    from benchmarks import measure

    env = measure.child_env()
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    return env


def measure_model(name: str, workdir: str, samples: int, repeat: int, log=print,
                  bytecode_cache: bool = True) -> dict | None:
    from benchmarks import measure, models

    model, _, reason = models.build(name)
    if model is None:
        log(f"{name}: skipped ({reason})")
        return None
    paths = measure.prepare(name, model, os.path.join(workdir, name), samples=samples)
    out = os.path.join(workdir, f"{name}.npu")
    cmd = measure.npuemu_exe() + ["compile", paths["onnx"], "-t", "rk3588", "--quantize", "--dataset",
                                  paths["dataset"], "--no-progress", "-o", out]
    env = compile_env(workdir, bytecode_cache)
    if bytecode_cache:
        timed_process(cmd, env)  # untimed: fills the bytecode cache (the modules this model's compile imports)
    runs = [timed_process(cmd, env) for _ in range(repeat)]
    row = {"model": name, "samples": samples, "runs": runs, "vendor_s": VENDOR_BUILD_S.get(name),
           "ort_s": ort_seconds(paths, samples)}
    log(format_row(row))
    return row


def format_row(row: dict) -> str:
    walls = [run["wall_s"] for run in row["runs"]]
    cpus = [run["cpu_s"] for run in row["runs"]]
    target = row["vendor_s"]
    best = min(walls)
    verdict = "" if target is None else ("meets" if best <= target else f"{best / target:.1f}x the target")
    rss = max(run["rss_mb"] for run in row["runs"])
    return (f"{row['model']:<12} {_span(walls):>13} {_span(cpus):>13} {rss:>7.0f} "
            f"{target if target is not None else '-':>9} {row['ort_s']:>6.2f}  {verdict}")


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}-{high:.2f}"


HEADER = f"{'model':<12} {'wall s':>13} {'cpu s':>13} {'rss MB':>7} {'vendor s':>9} {'ort s':>6}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compile_time", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)} "
                        "(any model of `python -m benchmarks` works, without a vendor figure)")
    parser.add_argument("--samples", type=int, default=20, help="calibration samples (default 20, as the vendor's)")
    parser.add_argument("--repeat", type=int, default=3, help="compiles per model; the range is printed (default 3)")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS/OpenMP/Numba threads of the compile processes (default 1)")
    parser.add_argument("--workdir", help="where models and builds are written (default: a temporary directory)")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="compile the project's modules from source in every process when the environment "
                             "says so (PYTHONDONTWRITEBYTECODE), instead of a warm private bytecode cache")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    from benchmarks import measure, models

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    known = models.EVERY + ["tiny"]
    for name in names:
        if name not in known:
            parser.error(f"unknown model {name!r}; choose from {', '.join(known)}")
    if args.samples < 1 or args.repeat < 1 or args.threads < 1:
        parser.error("--samples, --repeat and --threads must be >= 1")
    measure.set_threads(args.threads)
    cache = "no bytecode cache" if args.no_bytecode_cache else "warm bytecode cache"
    print(f"compile with {args.samples} calibration samples, {args.repeat} run(s) each, {args.threads} thread(s), "
          f"{cache}; vendor s = rknn-toolkit2's build (issue 20)")
    print(HEADER)
    with tempfile.TemporaryDirectory(prefix="npuemu-compile-") as tmp:
        rows = [measure_model(name, args.workdir or tmp, args.samples, args.repeat,
                              bytecode_cache=not args.no_bytecode_cache) for name in names]
    if args.json:
        with open(args.json, "w") as f:
            json.dump([row for row in rows if row], f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
