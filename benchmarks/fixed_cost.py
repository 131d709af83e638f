"""Fixed cost per NPU task and per host step (issue 20): ``python -m benchmarks.fixed_cost``.

Two pairs of micro models on an 8x8x16 map, so compute is negligible and what is left is the
emulator's work per task or per step (register writes, decode lookups, DMA plans, the timing
model, the host step's layout round trip):

- tasks: a chain of N 1x1 convolutions with Relu (one CNA+CORE+DPU task each), N = ``few`` and
  ``many``; us/task = (time(many) - time(few)) / (many - few), so the per-run cost (input,
  output, report set-up) cancels.
- host steps: a 1x1 convolution, then N ``Abs`` nodes (a host-only op, compiler/SUPPORT.md),
  then a 1x1 convolution; us/host-step the same difference.

``--first-call N`` also times a fresh process's first inference (issue 20: import, model
load, one run and output with the Numba cache warm) on the ``tasks_few`` build, N processes,
and prints the minimum with its parts (import, of it numpy + Numba's own import, Runtime(), the
first run), in wall time and in CPU time (steadier on a shared machine), the process's peak RSS
(VmHWM), and how many kernel signatures the run loaded from Numba's cache (a process that had to
compile one, because a kernel source changed meanwhile, is left out), for how many of them the
linking bitcode was left unparsed and whether Numba's NRT library was compiled (neither is
needed by a run whose kernels all load from the cache: emulator/numba_lazy_link.py,
numba_nrt_deferred.py), and whether Numba's extension entry points were run and
``numba.np.arrayobj`` imported (a warm run needs neither: numba_deferred_extensions.py,
numba_lazy_env.py). ``--first-call-model NPU
INPUT`` times a real model the same way; ``--first-call-only`` skips the per-task figures. The
processes run as an installed package runs: with a warm bytecode cache (a private ``PYTHONPYCACHEPREFIX``, written by
one process run first and not timed, bytecode writing on even where the environment sets
``PYTHONDONTWRITEBYTECODE``; pip writes an installed package's bytecode). The same first process writes
what npuemu keeps beside the bytecode: its dataclasses' methods (emulator/dataclass_code_cache.py) and
the register map's parsed YAML (isa/yaml_cache.py). Without it every process
compiles the ~100 modules an inference imports from source again (0.3-0.45 s of CPU on the dev
machine); ``--no-bytecode-cache`` measures that.

The reference is onnxruntime's single-thread time of the same layers (the same difference of the
same models: a Conv+Relu pair per task, an Abs per host step) in the same run (``ort us``), so
the figure can be read against the machine's load at the time. Times are
CPU time (time.process_time) of Runtime.run() plus the timing report, as in measure.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CHANNELS, SIZE = 16, 8


def chain_model(convs: int, host_steps: int, seed: int = 0, input_name: str = "input") -> onnx.ModelProto:
    """conv, ``host_steps`` Abs nodes, then ``convs`` more 1x1 convs with Relu (at least one)."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], input_name

    def conv(x: str, index: int) -> str:
        name = f"conv{index}"
        w = (rng.standard_normal((CHANNELS, CHANNELS, 1, 1)) * np.sqrt(2.0 / CHANNELS)).astype(np.float32)
        b = (rng.standard_normal(CHANNELS) * 0.05).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, name + "_w"), numpy_helper.from_array(b, name + "_b")])
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], name=name,
                                      kernel_shape=[1, 1]))
        nodes.append(helper.make_node("Relu", [name], [name + "_r"], name=name + "_relu"))
        return name + "_r"

    x = conv(x, 0)
    for i in range(host_steps):
        nodes.append(helper.make_node("Abs", [x], [f"abs{i}"], name=f"abs{i}"))
        x = f"abs{i}"
    for i in range(max(1, convs)):
        x = conv(x, i + 1)
    nodes.append(helper.make_node("Identity", [x], ["output"], name="out"))
    shape = [1, CHANNELS, SIZE, SIZE]
    graph = helper.make_graph(nodes, "fixed_cost", [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


#: (label, convs, host steps) of the four builds: the few/many pairs differ in one count
BUILDS = (("tasks_few", 8, 0), ("tasks_many", 108, 0), ("host_few", 1, 4), ("host_many", 1, 104))


def _worker(npu_path: str, x_path: str, repeat: int) -> None:
    from benchmarks import measure

    runtime = measure.load_runtime(npu_path)
    x = np.load(x_path)
    name = runtime.inputs[0]
    for _ in range(measure.WARMUP_RUNS):  # (measure.py: the chain replays and their steps)
        measure.run_once(runtime, name, x)
    times = []
    for _ in range(repeat):
        start = time.process_time()
        measure.run_once(runtime, name, x)
        times.append(time.process_time() - start)
    tasks = sum(len(getattr(run, "tasks", ())) for run in runtime.runs)
    print(json.dumps({"ms": statistics.median(times) * 1e3, "tasks": tasks,
                      "steps": len(runtime.model.schedule())}))


#: a fresh process's first inference (seconds, wall), timed from before numpy's import (the
#: issue's ``python -c "import time; t = time.time(); from npuemu.emulator.runtime import ..."``).
#: numpy and Numba are imported first, on their own, so their share (the floor no npuemu change
#: moves) shows apart from npuemu's modules; the import total is the same either way.
_FIRST_CALL = """
import time
began, cpu_began = time.perf_counter(), time.process_time()
import json, sys
import numpy as np
import numba
floor, cpu_floor = time.perf_counter(), time.process_time()
from npuemu.emulator.runtime import Runtime
from npuemu.isa.container import ModelFile
imported, cpu_imported = time.perf_counter(), time.process_time()
runtime = Runtime(ModelFile.read(sys.argv[1]))
loaded, cpu_loaded = time.perf_counter(), time.process_time()
runtime.set_input(runtime.inputs[0], np.load(sys.argv[2]))
runtime.run()
runtime.output(runtime.outputs[0])
done, cpu_done = time.perf_counter(), time.process_time()
# VmHWM: this process's own peak (ru_maxrss starts from the forking parent's peak on Linux)
with open("/proc/self/status") as status:
    peak_kb = next((int(line.split()[1]) for line in status if line.startswith("VmHWM:")), 0)
# after the timing: the Numba dispatchers npuemu's modules hold and their cache statistics: the
# signatures the run loaded from the Numba cache (one load each; the first pays Numba's one-time
# set-up) and those it compiled (a cold or invalidated cache: not a warm first call)
from numba.core import entrypoints
from numba.core.registry import CPUDispatcher
from numba.core.runtime import nrt
modules = [m for name, m in list(sys.modules.items()) if name.startswith("npuemu") and m is not None]
dispatchers = {id(v): v for m in modules for v in vars(m).values() if isinstance(v, CPUDispatcher)}
lazy = sys.modules.get("npuemu.emulator.numba_lazy_link")
print(json.dumps({"total_s": done - began, "import_s": imported - began, "load_s": loaded - imported,
                  "run_s": done - loaded, "cpu_total_s": cpu_done - cpu_began, "cpu_import_s": cpu_imported - cpu_began,
                  "cpu_load_s": cpu_loaded - cpu_imported, "cpu_run_s": cpu_done - cpu_loaded,
                  "cpu_numpy_numba_s": cpu_floor - cpu_began, "peak_rss_mb": peak_kb / 1024,
                  "npuemu_modules": len(modules), "dispatchers": len(dispatchers),
                  "kernel_loads": sum(len(d.stats.cache_hits) for d in dispatchers.values()),
                  "kernel_compiles": sum(len(d.stats.cache_misses) for d in dispatchers.values()),
                  "nrt_library_compiled": getattr(nrt.rtsys, "_library", None) is not None,
                  "bitcode_unparsed": sum(map(len, lazy._pending.values())) if lazy else 0,
                  "entry_points_run": bool(getattr(entrypoints, "_already_initialized", True)),
                  "arrayobj_imported": "numba.np.arrayobj" in sys.modules}))
"""


def measure_first_call(workdir: str, processes: int, log=print, bytecode_cache: bool = True,
                       model: tuple[str, str] | None = None) -> dict:
    """The fastest of ``processes`` fresh processes' first inference of ``model`` (a model file and
    an input .npy), by default the ``tasks_few`` build (built by :func:`measure_fixed` or
    :func:`build_tasks_few` in the same ``workdir``)."""
    from benchmarks import measure

    npu, x_path = model or (os.path.join(workdir, "fixed_tasks_few.npu"), os.path.join(workdir, "fixed_x.npy"))
    env = measure.child_env()
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(workdir, "pycache")
    rows = []
    for index in range(processes + bytecode_cache):
        proc = subprocess.run([sys.executable, "-c", _FIRST_CALL, npu, x_path], capture_output=True, text=True,
                              env=env, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if proc.returncode != 0:
            raise RuntimeError(f"first-call worker failed: {proc.stderr.strip()[-800:]}")
        if index or not bytecode_cache:  # (the first process only writes the bytecode cache)
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    compiled = sum(row["kernel_compiles"] > 0 for row in rows)
    if compiled:  # (another process changed a kernel source meanwhile: the cache was dropped)
        log(f"  note: {compiled} of {processes} processes compiled kernels (Numba cache not warm); left out")
        rows = [row for row in rows if row["kernel_compiles"] == 0] or rows
    best = min(rows, key=lambda row: row["total_s"])
    cache = "warm bytecode cache" if bytecode_cache else "modules compiled from source"
    name = "tasks_few" if model is None else os.path.basename(npu)
    log(f"first call of {name} in a fresh process ({cache}; min of {processes}): {best['total_s']:.3f} s = import "
        f"{best['import_s']:.3f} + Runtime() {best['load_s']:.3f} + first run and output {best['run_s']:.3f}")
    # CPU time moves far less with other processes' load than wall time does
    cpu = min(rows, key=lambda row: row["cpu_total_s"])
    log(f"  CPU time (min of {processes}): {cpu['cpu_total_s']:.3f} s = import {cpu['cpu_import_s']:.3f} (numpy + "
        f"numba {cpu['cpu_numpy_numba_s']:.3f}) + Runtime() {cpu['cpu_load_s']:.3f} + first run and output "
        f"{cpu['cpu_run_s']:.3f}; peak RSS {cpu['peak_rss_mb']:.0f} MB (max of {len(rows)}: "
        f"{max(row['peak_rss_mb'] for row in rows):.0f} MB)")
    log(f"  {best['npuemu_modules']} npuemu modules, {best['dispatchers']} Numba dispatchers, "
        f"{best['kernel_loads']} kernel signatures loaded from the Numba cache by the first run "
        f"({best['kernel_compiles']} compiled; linking bitcode left unparsed for {best['bitcode_unparsed']}, "
        f"NRT library {'compiled' if best['nrt_library_compiled'] else 'not compiled'}, Numba's extension entry points "
        f"{'run' if best.get('entry_points_run') else 'not run'}, numba.np.arrayobj "
        f"{'imported' if best.get('arrayobj_imported') else 'not imported'}: emulator/numba_lazy_link.py, "
        "numba_nrt_deferred.py, numba_deferred_extensions.py, numba_lazy_env.py)")
    return best


def build_tasks_few(workdir: str) -> None:
    """Only the ``tasks_few`` build and its input (``--first-call-only``)."""
    _build(workdir, BUILDS[0], _save_input(workdir)[2])


def _save_input(workdir: str) -> tuple[np.ndarray, str, str]:
    """The micro models' input saved in ``workdir`` with its calibration list: (x, its path, the list's path)."""
    x = np.random.default_rng(0).standard_normal((1, CHANNELS, SIZE, SIZE)).astype(np.float32)
    x_path = os.path.join(workdir, "fixed_x.npy")
    np.save(x_path, x)
    ds_path = os.path.join(workdir, "fixed_ds.txt")
    with open(ds_path, "w") as f:
        f.write("fixed_x.npy\n")
    return x, x_path, ds_path


def _build(workdir: str, build: tuple, ds_path: str) -> tuple:
    """One of ``BUILDS`` compiled int8 in ``workdir``: (the ONNX model, its path, the model file's path)."""
    from benchmarks import measure

    label, convs, hosts = build
    model = chain_model(convs, hosts)
    onnx_path = os.path.join(workdir, f"fixed_{label}.onnx")
    onnx.save(model, onnx_path)
    npu = os.path.join(workdir, f"fixed_{label}.npu")
    measure.compile_int8({"onnx": onnx_path, "dataset": ds_path}, npu)
    return model, onnx_path, npu


def _ort_ms(onnx_path: str, x: np.ndarray, repeat: int) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    session.run(None, {"input": x})
    times = []
    for _ in range(repeat):
        start = time.process_time()
        session.run(None, {"input": x})
        times.append(time.process_time() - start)
    return statistics.median(times) * 1e3


def measure_fixed(workdir: str, repeat: int = 7, log=print) -> dict:
    """Build the four micro models, time them, return the per-task and per-host-step figures."""
    from benchmarks import measure

    x, x_path, ds_path = _save_input(workdir)
    results = {}
    for label, convs, hosts in BUILDS:
        model, onnx_path, npu = _build(workdir, (label, convs, hosts), ds_path)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.fixed_cost", "--worker", npu, x_path, str(repeat)],
                              capture_output=True, text=True, env=measure.child_env(),
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if proc.returncode != 0:
            raise RuntimeError(f"fixed-cost worker failed: {proc.stderr.strip()[-800:]}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["ort_ms"] = _ort_ms(onnx_path, x, repeat)
        row["nodes"] = len(model.graph.node)
        results[label] = row
    few, many = results["tasks_few"], results["tasks_many"]
    per_task = (many["ms"] - few["ms"]) / max(1, many["tasks"] - few["tasks"]) * 1e3
    ort_task = (many["ort_ms"] - few["ort_ms"]) / max(1, many["tasks"] - few["tasks"]) * 1e3
    few, many = results["host_few"], results["host_many"]
    host_steps = (many["steps"] - few["steps"])
    per_host = (many["ms"] - few["ms"]) / max(1, host_steps) * 1e3
    ort_host = (many["ort_ms"] - few["ort_ms"]) / max(1, host_steps) * 1e3
    out = {"us_per_task": per_task, "us_per_host_step": per_host, "ort_us_per_task": ort_task,
           "ort_us_per_host_step": ort_host, "builds": results}
    log(table(out))
    return out


def table(result: dict) -> str:
    """The figures as printed by ``python -m benchmarks`` and ``python -m benchmarks.fixed_cost``."""
    builds = result["builds"]
    lines = ["fixed cost (CPU time of run + timing report; 8x8x16 micro models, difference of "
             f"{builds['tasks_many']['tasks'] - builds['tasks_few']['tasks']} tasks / "
             f"{builds['host_many']['steps'] - builds['host_few']['steps']} host steps):",
             f"{'per':<10} {'emu us':>8} {'ort us':>8} {'ratio':>8}"]
    for label, emu, ort in (("NPU task", result["us_per_task"], result["ort_us_per_task"]),
                            ("host step", result["us_per_host_step"], result["ort_us_per_host_step"])):
        ratio = f"{emu / ort:.0f}x" if ort > 0 else "n/a"
        lines.append(f"{label:<10} {emu:>8.1f} {ort:>8.2f} {ratio:>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fixed_cost", description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--workdir")
    parser.add_argument("--json", metavar="OUT")
    parser.add_argument("--first-call", type=int, default=0, metavar="N",
                        help="also time N fresh processes' first inference (the minimum is printed)")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="first call: every process compiles the modules from source (module docstring)")
    parser.add_argument("--first-call-model", nargs=2, action="append", default=[], metavar=("NPU", "INPUT"),
                        help="first call: also time this model file with this input .npy (repeatable)")
    parser.add_argument("--first-call-only", action="store_true",
                        help="skip the per-task / per-host-step figures (builds only tasks_few)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="npuemu-fixed-") as tmp:
        workdir = args.workdir or tmp
        if args.first_call_only:
            build_tasks_few(workdir)
            result = {}
        else:
            result = measure_fixed(workdir, args.repeat)
        if args.first_call > 0:
            result["first_call"] = measure_first_call(workdir, args.first_call,
                                                      bytecode_cache=not args.no_bytecode_cache)
            for npu, x_path in args.first_call_model:
                result.setdefault("first_call_models", {})[npu] = measure_first_call(
                    workdir, args.first_call, bytecode_cache=not args.no_bytecode_cache,
                    model=(os.path.abspath(npu), os.path.abspath(x_path)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--worker":
    _worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
elif __name__ == "__main__":
    raise SystemExit(main())
