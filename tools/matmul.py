"""Matmul API on the emulator (issue 6, first slice).

C = A @ B is built as a 1x1 convolution (A (M,K) -> input [1,K,1,M], B (K,N) -> weights [N,K,1,1])
and goes through the real compiler (import, passes, calibration + quantization, lowering,
build_model) and the emulator Runtime: the result comes from register-command tasks, not numpy.
Fully connected with M > 1 is sent to the CPU partition by the compiler, hence the 1x1 conv.

Status: int8xint8->int8 and fp16xfp16->fp16 run. int8: A and B use the caller's scales
(symmetric); C uses c_scale / c_zero_point if given, else the calibrated ones (then in
.c_scale/.c_zero_point). fp16: a float16 build (fp16 operands, fp32 accumulation in the MAC
array and DPU, C rounded to fp16 at the output, NUMERICS.md 4.6). Other types raise
MatmulNotLoweredError.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError, InputError
from npuemu.tools.matmul_layout import a_from_native, b_from_native
from npuemu.tools.matmul_limits import check_shape
from npuemu.tools.matmul_types import check_type_on_chip, normalize_chip

RUNNABLE_TYPES = ("int8xint8->int8", "fp16xfp16->fp16")


class MatmulNotLoweredError(CompileError):
    """The Matmul type is valid for the chip but the compiler cannot lower it yet."""


@dataclass
class MatmulPerf:
    cycles: int
    ddr_read_bytes: int
    ddr_write_bytes: int
    macs: int
    mac_usage: float | None
    time_us: float


class MatmulContext:
    def __init__(self, M: int, K: int, N: int, type: str = "int8xint8->int8", *, chip: str = "rk3588",
                 b_layout: str = "normal", ac_layout: str = "normal", core_mask=None,
                 shapes: list[tuple[int, int, int]] | None = None,
                 a_scale: float = 1.0, b_scale=1.0, c_scale: float | None = None, c_zero_point: int = 0):
        self.chip = normalize_chip(chip)
        self.type = check_type_on_chip(type, self.chip).name
        for layout, what in ((b_layout, "b_layout"), (ac_layout, "ac_layout")):
            if layout not in ("normal", "native"):
                raise CompileError(f"matmul {what}={layout!r}: expected 'normal' or 'native'")
        self.b_layout, self.ac_layout, self.core_mask = b_layout, ac_layout, core_mask
        self.shapes = list(shapes) if shapes else [(M, K, N)]
        if (M, K, N) not in self.shapes:
            self.shapes.insert(0, (M, K, N))
        for m, k, n in self.shapes:
            check_shape(m, k, n, self.type, self.chip)
        if self.type not in RUNNABLE_TYPES:
            raise MatmulNotLoweredError(
                f"matmul type {self.type} is not lowered yet (runs: {', '.join(RUNNABLE_TYPES)})")
        self.shape = (M, K, N)
        self.a_scale, self.b_scale = float(a_scale), b_scale
        if np.ndim(b_scale) > 0 and np.shape(b_scale) != (N,):
            raise InputError(f"matmul b_scale has shape {np.shape(b_scale)}; per-channel needs ({N},)")
        self.c_scale_given, self.c_zero_given = c_scale, c_zero_point
        self.perf: MatmulPerf | None = None
        self.c_scale = self.c_zero_point = None

    def set_shape(self, M: int, K: int, N: int) -> None:
        """Dynamic shapes: switch to one of the shapes fixed at creation."""
        if (M, K, N) not in self.shapes:
            raise InputError(f"matmul shape {(M, K, N)} was not given at creation; shapes: {self.shapes}")
        self.shape = (M, K, N)

    def run(self, A, B) -> np.ndarray:
        M, K, N = self.shape
        A, B = np.asarray(A), np.asarray(B) if self.b_layout == "normal" else B
        if self.ac_layout == "native":
            A = a_from_native(A, M, K, self.type, self.chip)
        if self.b_layout == "native":
            B = b_from_native(B, K, N, self.type, self.chip)
        if A.shape != (M, K) or B.shape != (K, N):
            raise InputError(f"matmul inputs A{A.shape}, B{B.shape} do not match M,K,N={self.shape}")
        if self.type == "fp16xfp16->fp16":
            if not (np.issubdtype(A.dtype, np.floating) and np.issubdtype(B.dtype, np.floating)):
                raise InputError(f"{self.type} needs float A and B, got {A.dtype} and {B.dtype}")
            return self._run_fp16(A.astype(np.float16), B.astype(np.float16))
        if A.dtype != np.int8 or B.dtype != np.int8:
            raise InputError(f"{self.type} needs int8 A and B, got {A.dtype} and {B.dtype}")
        return self._run_int8(A, B)

    def _graph(self, B):
        """The ONNX 1x1 convolution computing A @ B with B's values as weights, imported and
        optimized (level 1: no vendor rewrites) for the chip."""
        from onnx import TensorProto, helper, numpy_helper

        from npuemu.compiler.onnx_import import import_onnx
        from npuemu.compiler.passes import PassContext, optimize
        from npuemu.platforms import load_platform

        M, K, N = self.shape
        w = np.asarray(B, np.float32).T.reshape(N, K, 1, 1)
        graph_def = helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["out"], name="matmul", kernel_shape=[1, 1])], "matmul",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K, 1, M])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(np.ascontiguousarray(w), "w")])
        onnx_model = helper.make_model(graph_def, opset_imports=[helper.make_opsetid("", 17)])
        onnx_model.ir_version = 8
        platform = load_platform(self.chip)
        graph = import_onnx(onnx_model)
        optimize(graph, PassContext(platform, 1))
        return graph, platform

    def _execute(self, graph, platform, x: np.ndarray) -> tuple:
        """Build, run on the emulator, record .perf; (runtime, model)."""
        from npuemu.compiler.build import build_model
        from npuemu.emulator.runtime import Runtime
        from npuemu.emulator.timing.report import report_npu

        model = build_model(graph, platform, name="matmul")
        runtime = Runtime(model)
        runtime.set_input("x", x)
        runtime.run()
        report = report_npu(model, runtime.runs, runtime.machine.platform, "board")
        t = report.totals()
        usages = [u for u in (layer.mac_usage() for layer in report.layers) if u is not None]
        self.perf = MatmulPerf(t["cycles"], t["ddr_read_bytes"], t["ddr_write_bytes"],
                               sum(task.macs for task in report.all_tasks), max(usages) if usages else None,
                               t["time_us"])
        return runtime, model

    def _run_fp16(self, A, B):
        from npuemu.compiler.quant import float16_graph

        M, K, N = self.shape
        graph, platform = self._graph(B.astype(np.float32))
        float16_graph(graph)
        runtime, _ = self._execute(graph, platform, np.ascontiguousarray(A.astype(np.float32).T.reshape(1, K, 1, M)))
        out = np.asarray(runtime.output(graph.outputs[0], dequantize=False)).reshape(N, M).T
        self.last_float = out.astype(np.float32)
        return np.ascontiguousarray(out.astype(np.float16))

    def _set_given_scales(self, graph, bs):
        """Replace the quantizer's A and B parameters by the caller's (symmetric, zero point 0), so
        the stored int8 A and B are exactly the caller's; C keeps the calibrated scale unless
        c_scale was given."""
        from npuemu.compiler.ir import QuantParams

        if "x" not in graph.tensors or "w" not in graph.tensors or graph.outputs[0] not in graph.tensors:
            raise CompileError("matmul: the compiled graph lost its x/w tensors; cannot set the given scales")
        graph.tensors["x"].quant = QuantParams("int8", np.float32(self.a_scale), 0)
        per_channel = np.ndim(self.b_scale) > 0
        graph.tensors["w"].quant = (QuantParams("int8", bs, np.zeros(bs.shape, np.int32), 0) if per_channel
                                    else QuantParams("int8", bs[0], 0))
        out = graph.tensors[graph.outputs[0]]
        if self.c_scale_given is not None:
            out.quant = QuantParams("int8", np.float32(self.c_scale_given), int(self.c_zero_given))
        self.c_scale, self.c_zero_point = float(out.quant.scale), int(out.quant.zero_point)

    def _run_int8(self, A, B):
        from npuemu.compiler.quant import calibrate, quantize_graph

        M, K, N = self.shape
        bs = np.broadcast_to(np.asarray(self.b_scale, np.float32), (N,))
        graph, platform = self._graph(B.astype(np.float32) * bs[None, :])
        xf = (A.astype(np.float32) * self.a_scale).T.reshape(1, K, 1, M)
        ranges = calibrate(graph, [{"x": xf}, {"x": -xf}], "normal", progress=False).ranges
        quantize_graph(graph, ranges)
        self._set_given_scales(graph, bs)
        runtime, _ = self._execute(graph, platform, np.ascontiguousarray(A.T.reshape(1, K, 1, M)))
        self._input_quant = runtime.quantization("x")
        out = np.asarray(runtime.output(graph.outputs[0], dequantize=False)).reshape(N, M).T
        self.last_float = np.asarray(runtime.output(graph.outputs[0])).reshape(N, M).T.astype(np.float32)
        return np.ascontiguousarray(out)
