"""``npuemu quant-config``: hybrid quantization step 1 (SDK guide 6.3).

Runs the same steps as ``npuemu compile`` up to its quantization (import, and the graph
passes, so the layer names match what compile will see), calibrates on the dataset and
writes the per-layer YAML (``compiler/quant/config.py``). The user edits it (a layer to
float16, a clipping range) and builds with ``npuemu compile MODEL --quant-config FILE``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    from npuemu.tools import cmd_compile

    parser = subparsers.add_parser(
        "quant-config",
        help="calibrate a model and write its per-layer quantization config (hybrid quantization step 1)",
        description="Calibrate an ONNX model on a dataset and write the per-layer quantization config: each "
        "layer's op and dtype (int8 or float16) and each tensor's min/max, scale and zero point. Edit it, then "
        "build with `npuemu compile MODEL --quant-config FILE`.",
    )
    for add_options in _option_groups(cmd_compile):
        add_options(parser)
    parser.add_argument("-o", "--output", metavar="FILE", type=Path, required=True,
                        help="the YAML config to write")
    parser.set_defaults(func=run)


def _option_groups(cmd_compile: Any) -> list:
    """Every option group of compile whose step runs before quantization (model, input shapes
    and whatever the graph passes add), plus calibration; not dumps or precision modes."""
    skipped = {cmd_compile._add_dump_options, cmd_compile._add_quant_mode_options}
    return [group for group in cmd_compile.OPTION_GROUPS if group not in skipped]


def run(args: argparse.Namespace) -> int:
    from npuemu.compiler.quant import CalibrationOptions, config_with_dataset, preprocess_for_inputs, write_config
    from npuemu.isa.errors import ConfigError
    from npuemu.tools import cmd_compile

    if args.dataset is None:
        raise ConfigError("quant-config calibrates the model: give --dataset ds.txt")
    front = cmd_compile.prepare_float(args)
    graph = front.graph
    preprocess = preprocess_for_inputs(graph, args.mean, args.std, args.bgr)
    options = CalibrationOptions(args.algorithm, args.per_channel, progress=not args.no_progress)
    config = config_with_dataset(graph, args.dataset, preprocess, options, model=args.model.name,
                                 target=front.platform.name)
    write_config(config, graph, args.output)
    print(f"{args.output}: {len(graph.nodes)} layers, {len(config.ranges)} tensor ranges "
          f"({config.algorithm}); edit it, then: npuemu compile {args.model} --quant-config {args.output}")
    return 0
