"""``npuemu accuracy``: per-layer cosine / Euclidean distance of the quantized model against
the float model (SDK guide 3.2.2, 4.1.3.1), from the compiler's fake-quant model and from the
emulated NPU. The rendering and the analysis live in ``tools/accuracy.py``; this module parses
options and runs the same import / passes / quantize steps as ``npuemu compile``."""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

from npuemu.tools.cmd_compile import _add_model_options, add_calibration_options


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "accuracy",
        help="per-layer accuracy of the quantized model against the float model",
        description="Quantize the model as `npuemu compile` does (int8 calibrated on --dataset, or a hybrid "
        "--quant-config), then print for every layer the cosine similarity and Euclidean distance against "
        "the float model: the compiler's fake-quant simulation entire and single, and the emulated NPU "
        "entire. The analysed sample is one line of --dataset (--sample).",
    )
    _add_model_options(parser)
    parser.add_argument("-O", "--optimization-level", type=int, choices=(0, 1, 2, 3), default=3,
                        help="graph passes, as in `npuemu compile` (default 3)")
    add_calibration_options(parser)
    group = parser.add_argument_group("analysis")
    group.add_argument("--quant-config", metavar="FILE", type=Path, default=None,
                       help="quantize from a per-layer config written by `npuemu quant-config` (hybrid int8/"
                       "float16); --dataset then only gives the analysed sample")
    group.add_argument("--sample", metavar="N", type=int, default=1,
                       help="the dataset sample to analyse, 1-based (default 1)")
    group.add_argument("--input", metavar="FILE", type=Path, action="append", default=[],
                       help="analyse this sample instead (.npy/.png/.jpg, preprocessed like the dataset; repeat "
                       "once per model input, in input order)")
    group.add_argument("--no-emulator", action="store_true",
                       help="simulator columns only: do not build and run the model on the emulator")
    group.add_argument("-o", "--output-dir", metavar="DIR", type=Path, default=None,
                       help="also write accuracy.txt (the table), accuracy.csv and accuracy.png (cosine per "
                       "layer; needs matplotlib: pip install 'npuemu[plot]') to DIR")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from npuemu.isa.errors import ConfigError
    from npuemu.tools import accuracy
    from npuemu.compiler.driver import quantize
    from npuemu.tools.cmd_compile import compile_options, prepare_float

    if args.dataset is None:
        raise ConfigError("accuracy needs --dataset ds.txt: the calibration set (int8) and the analysed sample")
    front = prepare_float(args)
    front.options = compile_options(_quantize_args(args))  # the passes ran as they do for an int8 build
    quantize(front)
    graph, result = front.graph, front.quantization
    inputs = _analysed_sample(args, graph, result.preprocess)
    report = accuracy.analyze(graph, front.platform, inputs, model=args.model.name, mode=result.mode,
                              run_emulator=not args.no_emulator)
    table = accuracy.format_table(report)
    print(table, end="")
    if args.output_dir is not None:
        _write_files(args.output_dir, report, table)
    return 0


def _analysed_sample(args: argparse.Namespace, graph, preprocess) -> dict:
    """``--input`` files as one dataset line, else line ``--sample`` of the dataset."""
    from npuemu.compiler.quant import CalibrationSamples, read_dataset
    from npuemu.compiler.quant.dataset import Dataset, DatasetEntry
    from npuemu.isa.errors import InputError

    if args.input:
        missing = [str(path) for path in args.input if not path.is_file()]
        if missing:
            raise InputError(f"--input: no such file: {', '.join(missing)}")
        dataset = Dataset(Path("--input"), (DatasetEntry(1, tuple(args.input)),))
        index = 0
    else:
        dataset = read_dataset(args.dataset, list(graph.inputs))
        if not 1 <= args.sample <= len(dataset.entries):
            raise InputError(f"--sample {args.sample}: {args.dataset} has {len(dataset.entries)} sample(s)")
        index = args.sample - 1
    return CalibrationSamples(dataset, graph, preprocess).load(dataset.entries[index])


def _quantize_args(args: argparse.Namespace) -> argparse.Namespace:
    """The namespace ``compile``'s quantize step expects: int8 from the dataset, or the config
    (which holds its own ranges, so the dataset is not a calibration input there)."""
    shaped = copy.copy(args)
    shaped.fp16 = False
    shaped.quantize = args.quant_config is None
    if args.quant_config is not None:
        shaped.dataset = None
    return shaped


def _write_files(folder: Path, report, table: str) -> None:
    from npuemu.isa.errors import InputError
    from npuemu.tools import accuracy

    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "accuracy.txt").write_text(table, encoding="utf-8")
        (folder / "accuracy.csv").write_text(accuracy.format_csv(report), encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write to {folder}: {error.strerror}") from None
    written = ["accuracy.txt", "accuracy.csv"]
    if accuracy.plot_available():
        accuracy.write_plot(report, folder / "accuracy.png")
        written.append("accuracy.png")
    else:
        print("note: matplotlib is not installed, so no accuracy.png (pip install 'npuemu[plot]' or "
              "pip install matplotlib)")
    print(f"wrote {', '.join(written)} to {folder}")
