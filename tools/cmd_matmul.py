"""`npuemu matmul`: run the Matmul API on random inputs through the emulator (issue 6)."""
from __future__ import annotations

import argparse
from typing import Any

import numpy as np

BENCH_SHAPES = [(1, 64, 64), (16, 256, 256), (64, 512, 512), (128, 1024, 1024)]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "matmul", help="run a Matmul API call (C = A @ B) on the emulator and report error and perf",
        description="Random int8 A (M,K) and B (K,N) run as a 1x1 convolution through the compiler and "
        "the emulator; prints the max error of the dequantized C against numpy's float result, the "
        "cycles, DDR bytes and MAC usage. --bench sweeps sizes and prints GOPS at the chip clock.")
    parser.add_argument("-M", type=int, default=4)
    parser.add_argument("-K", type=int, default=64)
    parser.add_argument("-N", type=int, default=32)
    parser.add_argument("--type", default="int8xint8->int8")
    parser.add_argument("-t", "--target", default="rk3588", help="chip (default rk3588)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bench", action="store_true", help="sweep sizes and print GOPS")
    parser.set_defaults(func=run)


def _one(M, K, N, args):
    from npuemu.platforms import load_platform
    from npuemu.tools.matmul import MatmulContext

    rng = np.random.default_rng(args.seed)
    A = rng.integers(-128, 128, (M, K)).astype(np.int8)
    B = rng.integers(-128, 128, (K, N)).astype(np.int8)
    a_s, b_s = 1.0 / 128, 1.0 / 128
    ctx = MatmulContext(M, K, N, args.type, chip=args.target, a_scale=a_s, b_scale=b_s)
    ctx.run(A, B)
    ref = (A.astype(np.float32) * a_s) @ (B.astype(np.float32) * b_s)
    err = float(np.abs(ctx.last_float - ref).max())
    mhz = load_platform(ctx.chip).clock.npu_mhz if hasattr(load_platform(ctx.chip), "clock") else 1000
    return ctx, err, float(np.abs(ref).max()), mhz


def run(args: argparse.Namespace) -> int:
    shapes = BENCH_SHAPES if args.bench else [(args.M, args.K, args.N)]
    for M, K, N in shapes:
        ctx, err, peak, mhz = _one(M, K, N, args)
        p = ctx.perf
        line = (f"M={M} K={K} N={N} {ctx.type} on {ctx.chip}: max |C - numpy| = {err:.4g} (|C| <= {peak:.4g}); "
                f"{p.cycles} cycles, DDR {p.ddr_read_bytes} B read / {p.ddr_write_bytes} B written, "
                f"MAC usage {p.mac_usage if p.mac_usage is None else round(p.mac_usage, 1)}%")
        if args.bench:
            gops = 2 * M * K * N / (p.cycles / (mhz * 1e6)) / 1e9 if p.cycles else float("nan")
            line += f", {gops:.2f} GOPS at {mhz} MHz"
        print(line)
    return 0
