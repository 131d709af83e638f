"""Measure one benchmark model: compile time, cold-process run, steady emulation time, peak RSS,
onnxruntime float time. Every figure is wall-clock on this machine (time.perf_counter).

What each figure times (see RESULTS.md):
- compile_s: the whole `npuemu compile model.onnx --quantize --dataset ds.txt -o m.npu` process
  (interpreter start, ONNX import, passes, int8 calibration, lowering, model-file write). The
  calibration uses ONE random sample by default (int8 needs scales, so a single-sample calibration
  stands in for "no calibration"); ``--calibration-samples 20`` gives issue 20's compile figure.
- first_run_s: one cold `npuemu run m.npu --input x.npy` process, end to end, with the Numba cache
  already warm (one untimed run first).
- emu_int8_ms: in a worker process, Runtime.run() plus the timing-model report (report_npu),
  median of --repeat runs after WARMUP_RUNS warm-up runs (the steady state of an inner loop: a
  chain is replayed from a start state seen before, and its tasks compiled into steps on the first
  replay - a chain of an odd number of tasks alternates between two start states - so the first
  runs cost more; with one warm-up run the median of 3 still held them). Session 15: rec int8 and
  ppocr_cls fp16 settle only at run 6-7 on af44d64 and after (runs 2-5 are 3-5x steady; steps that
  prepare a conv on the second sight of its weights add a run), so 8 warm-up runs.
- peak_rss_mb: the worker's own peak resident set after its warm-up runs, before it opens the onnxruntime
  session (the emulator's peak, not onnxruntime's): VmHWM, reset when the worker starts (``_reset_peak``).
  ru_maxrss alone carried the parent's peak over fork and exec - every model after ResNet-50 showed its
  580 MB (session 26).
- ort_ms: onnxruntime CPU float32 on the same ONNX, intra-op threads = --threads (default
  os.cpu_count()), median of --repeat runs after one warm-up, in the int8 worker, each run right after
  one of the emulator's (session 25: on a shared host whose speed drifts over seconds, timing them
  one after the other put them in different spells - the same tree measured 2.3x and 2.6x; paired,
  a slow spell slows both). The emulator processes get the same thread count for
  BLAS/OpenMP/Numba (set_threads).
- *_cpu_ms: the same runs' process CPU time (time.process_time). On the shared 2-core box wall
  times move with other processes' load; CPU times move much less, so the CPU ratio is the
  steadier comparison at --threads 1.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np


def npuemu_exe() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "npuemu")
    return [exe] if os.path.exists(exe) else [sys.executable, "-m", "npuemu.tools.cli"]


THREADS = os.cpu_count() or 1


def set_threads(n: int) -> None:
    """Thread count for every measured process: BLAS (numpy's matmul in the MAC kernel), OpenMP,
    Numba and onnxruntime's intra-op pool all get the same N. Measured here: with other load on the
    2 cores, 2 OpenBLAS threads made emulation 3-6x slower than 1 (spinning threads fight for cores)."""
    global THREADS
    THREADS = n


def child_env() -> dict:
    env = dict(os.environ)
    for key in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[key] = str(THREADS)
    return env


def _timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    return elapsed


def prepare(name: str, model, workdir: str, seed: int = 0, samples: int | None = None) -> dict:
    """The ONNX file, the benchmark input and a dataset list of ``samples`` calibration samples
    (default CALIBRATION_SAMPLES): the input itself, then further seeded random inputs."""
    import onnx

    os.makedirs(workdir, exist_ok=True)
    onnx_path = os.path.join(workdir, f"{name}.onnx")
    onnx.save(model, onnx_path)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(dims).astype(np.float32)
    x_path = os.path.join(workdir, f"{name}_x.npy")
    np.save(x_path, x)
    names = [os.path.basename(x_path)]
    for i in range(1, samples or CALIBRATION_SAMPLES):
        names.append(f"{name}_cal{i}.npy")
        np.save(os.path.join(workdir, names[-1]), rng.standard_normal(dims).astype(np.float32))
    ds_path = os.path.join(workdir, f"{name}_ds.txt")
    with open(ds_path, "w") as f:
        f.write("".join(n + "\n" for n in names))
    return {"onnx": onnx_path, "x": x_path, "dataset": ds_path, "input_name": model.graph.input[0].name}


#: calibration samples of the compile_s figure (``python -m benchmarks --calibration-samples``)
CALIBRATION_SAMPLES = 1


def set_calibration_samples(n: int) -> None:
    global CALIBRATION_SAMPLES
    CALIBRATION_SAMPLES = n


def compile_int8(paths: dict, out: str, extra: tuple[str, ...] = ()) -> float:
    return _timed(npuemu_exe() + ["compile", paths["onnx"], "-t", "rk3588", "--quantize", "--dataset",
                                  paths["dataset"], "--no-progress", *extra, "-o", out])


def compile_fp16(paths: dict, out: str) -> float:
    return _timed(npuemu_exe() + ["compile", paths["onnx"], "-t", "rk3588", "--fp16", "-o", out])


def first_run(npu_path: str, x_path: str) -> float:
    cmd = npuemu_exe() + ["run", npu_path, "--input", x_path]
    _timed(cmd)  # warms the Numba cache; not counted
    return _timed(cmd)


def steady(npu_path: str, x_path: str, repeat: int, onnx_path: str | None = None) -> dict:
    """Run the worker in a fresh process: its median time and its own peak RSS; with ``onnx_path`` also
    onnxruntime's median on the same input, each of its runs right after one of the emulator's
    (``ort_median_ms``, ``ort_cpu_ms``)."""
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", npu_path, x_path, str(repeat),
                           onnx_path or "", str(THREADS)], capture_output=True, text=True, env=child_env())
    if proc.returncode != 0:
        raise RuntimeError(f"steady-state worker failed: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_once(runtime, name: str, x) -> None:
    from npuemu.emulator.timing.report import report_npu

    runtime.set_input(name, x)
    runtime.run()
    report_npu(runtime.model, runtime.runs, runtime.machine.platform).totals()  # timing model on


def load_runtime(npu_path: str):
    from npuemu.emulator.runtime import Runtime
    from npuemu.isa.container import ModelFile

    return Runtime(ModelFile.read(npu_path))


#: untimed runs before the timed ones (module docstring, emu_int8_ms)
WARMUP_RUNS = 8


def _reset_peak() -> bool:
    """Reset this process's peak resident set (VmHWM) to its resident set now (Linux ``clear_refs`` 5): a
    forked and exec'd worker starts with its parent's peak. False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_kb() -> float:
    """This process's peak resident set in KiB: VmHWM (since ``_reset_peak``), else ru_maxrss."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # (Linux: kilobytes)


def _worker(npu_path: str, x_path: str, repeat: int, onnx_path: str = "", threads: int = 1) -> None:
    _reset_peak()
    runtime = load_runtime(npu_path)
    x = np.load(x_path)
    name = runtime.inputs[0]

    def emulate() -> None:
        run_once(runtime, name, x)

    for _ in range(WARMUP_RUNS):  # Numba load, first-touch allocations, chain replays and their steps
        emulate()
    peak_kb = _peak_kb()  # (before onnxruntime's session)
    reference = _ort_call(onnx_path, threads, x) if onnx_path else None
    emulated, referenced = [], []
    for _ in range(repeat):  # (each onnxruntime run right after an emulator run: the same spell of the host)
        emulated.append(_timed_call(emulate))
        if reference is not None:
            referenced.append(_timed_call(reference))
    result = {"median_ms": statistics.median(wall for wall, _ in emulated) * 1e3,
              "times_ms": [wall * 1e3 for wall, _ in emulated],
              "cpu_ms": statistics.median(used for _, used in emulated) * 1e3, "peak_rss_mb": peak_kb / 1024}
    if referenced:
        result["ort_median_ms"] = statistics.median(wall for wall, _ in referenced) * 1e3
        result["ort_cpu_ms"] = statistics.median(used for _, used in referenced) * 1e3
    print(json.dumps(result))


def _timed_call(call) -> tuple[float, float]:
    """(wall s, CPU s) of one ``call()``."""
    start, start_cpu = time.perf_counter(), time.process_time()
    call()
    return time.perf_counter() - start, time.process_time() - start_cpu


def _ort_call(onnx_path: str, threads: int, x: np.ndarray):
    """One run of onnxruntime's float session (``threads`` intra-op threads) on ``x``, warmed up once."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x}
    session.run(None, feed)
    return lambda: session.run(None, feed)


def measure(name: str, model, macs: int, workdir: str, repeat: int, log=print) -> dict:
    paths = prepare(name, model, workdir)
    row: dict = {"model": name, "macs": macs}
    npu = os.path.join(workdir, f"{name}.npu")
    row["compile_s"] = compile_int8(paths, npu)
    log(f"  {name}: compile {row['compile_s']:.2f} s")
    row["first_run_s"] = first_run(npu, paths["x"])
    log(f"  {name}: cold run {row['first_run_s']:.2f} s")
    result = steady(npu, paths["x"], repeat, paths["onnx"])
    row["emu_int8_ms"] = result["median_ms"]
    row["emu_int8_cpu_ms"] = result["cpu_ms"]
    row["peak_rss_mb"] = result["peak_rss_mb"]
    log(f"  {name}: steady int8 {row['emu_int8_ms']:.1f} ms, peak RSS {row['peak_rss_mb']:.0f} MB")
    row["emu_fp16_ms"] = None
    row["fp16_note"] = fp16_attempt(paths, workdir, name, repeat, row, log)
    row["ort_ms"], row["ort_cpu_ms"] = result["ort_median_ms"], result["ort_cpu_ms"]  # (paired with the int8 runs)
    row["ratio"] = row["emu_int8_ms"] / row["ort_ms"]
    row["cpu_ratio"] = row["emu_int8_cpu_ms"] / row["ort_cpu_ms"]
    row["gmac_s"] = macs / (row["emu_int8_ms"] * 1e-3) / 1e9
    log(f"  {name}: onnxruntime {row['ort_ms']:.2f} ms, ratio {row['ratio']:.1f}x")
    return row


def batch_scaling(name: str, model, workdir: str, sizes: list[int], repeat: int, log=print) -> list[dict]:
    """int8 steady time of `npuemu compile --batch-size N` builds of one model, fed N copies of the
    benchmark input: time per run and per image."""
    paths = prepare(name, model, workdir)
    x = np.load(paths["x"])
    rows = []
    for size in sizes:
        npu = os.path.join(workdir, f"{name}_b{size}.npu")
        x_path = os.path.join(workdir, f"{name}_x_b{size}.npy")
        np.save(x_path, np.concatenate([x] * size))
        try:
            compile_int8(paths, npu, ("--batch-size", str(size)))
            result = steady(npu, x_path, repeat)
        except RuntimeError as exc:
            log(f"  {name} batch {size}: n/a: {str(exc).splitlines()[-1][:200]}")
            continue
        rows.append({"model": name, "batch": size, "int8_ms": result["median_ms"], "cpu_ms": result["cpu_ms"]})
        log(f"  {name} batch {size}: {result['median_ms']:.1f} ms")
    return rows


def fp16_attempt(paths: dict, workdir: str, name: str, repeat: int, row: dict, log) -> str:
    """fp16 steady time if an --fp16 build compiles and runs here; otherwise the reason, verbatim."""
    npu = os.path.join(workdir, f"{name}_fp16.npu")
    try:
        compile_fp16(paths, npu)
        row["emu_fp16_ms"] = steady(npu, paths["x"], repeat)["median_ms"]
        log(f"  {name}: steady fp16 {row['emu_fp16_ms']:.1f} ms")
        return ""
    except RuntimeError as exc:
        reason = str(exc).splitlines()[-1][:200]
        log(f"  {name}: fp16 n/a: {reason}")
        return f"n/a ({reason})"


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))
