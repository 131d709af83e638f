"""`npuemu matmul`: run the Matmul API on random inputs through the emulator (issue 6)."""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from npuemu.compiler.core_mask import CORE_MASKS
from npuemu.tools.matmul_types import TYPES

BENCH_SHAPES = [(1, 64, 64), (16, 256, 256), (64, 512, 512), (128, 1024, 1024)]
_INT = {"int4": 8, "int8": 128}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "matmul", help="run a Matmul API call (C = A @ B) on the emulator and report error and perf",
        description="Random A (M,K) and B (K,N) of the type's element types run as a 1x1 convolution "
        "through the compiler and the emulator; prints the max error of C (dequantized for an int8 C) "
        "against numpy's float64 product, the cycles, DDR bytes and MAC usage. --bench sweeps sizes and "
        "prints GOPS at the chip clock (tools/MATMUL.md).")
    parser.add_argument("-M", type=int, default=4)
    parser.add_argument("-K", type=int, default=64)
    parser.add_argument("-N", type=int, default=64)
    parser.add_argument("--type", default="int8xint8->int8", choices=sorted(TYPES))
    parser.add_argument("-t", "--target", default="rk3588", help="chip (default rk3588)")
    parser.add_argument("--core-mask", default="auto", choices=CORE_MASKS,
                        help="NPU cores as RKNN_NPU_CORE_* names them (default auto: one core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bench", action="store_true", help="sweep sizes and print GOPS")
    parser.set_defaults(func=run)


def _operand(rng, element: str, shape) -> np.ndarray:
    if element == "fp16":
        return rng.uniform(-1, 1, shape).astype(np.float16)
    return rng.integers(-_INT[element], _INT[element], shape).astype(np.int8)


def _one(M, K, N, args):
    from npuemu.tools.matmul import MatmulContext

    t = TYPES[args.type]
    rng = np.random.default_rng(args.seed)
    A, B = _operand(rng, t.a, (M, K)), _operand(rng, t.b, (K, N))
    a_s = 1.0 if t.a == "fp16" else 1.0 / _INT[t.a]
    b_s = 1.0 if t.b == "fp16" else 1.0 / _INT[t.b]
    ctx = MatmulContext(M, K, N, args.type, chip=args.target, a_scale=a_s, b_scale=b_s,
                        core_mask=args.core_mask)
    ctx.run(A, B)
    # last_float is C in real units: int C x a_scale x b_scale, an int8 C dequantized, float C as is
    ref = (A.astype(np.float64) * (a_s if t.a != "fp16" else 1.0)) @ (B.astype(np.float64) * b_s)
    err = float(np.abs(ctx.last_float - ref).max())
    return ctx, err, float(np.abs(ref).max()), ctx.platform.clock.npu_mhz


def run(args: argparse.Namespace) -> int:
    shapes = BENCH_SHAPES if args.bench else [(args.M, args.K, args.N)]
    for M, K, N in shapes:
        ctx, err, peak, mhz = _one(M, K, N, args)
        p = ctx.perf
        line = (f"M={M} K={K} N={N} {ctx.type} on {ctx.chip} (cores {list(ctx.cores)}, {ctx.path} path): "
                f"max |C - numpy| = "
                f"{err:.4g} (|C| <= {peak:.4g}); {p.cycles} cycles, DDR {p.ddr_read_bytes} B read / "
                f"{p.ddr_write_bytes} B written, MAC usage {p.mac_usage if p.mac_usage is None else round(p.mac_usage, 1)}%")
        if args.bench:
            gops = 2 * M * K * N / (p.cycles / (mhz * 1e6)) / 1e9 if p.cycles else float("nan")
            line += f", {gops:.2f} GOPS at {mhz} MHz"
        print(line)
    return 0
