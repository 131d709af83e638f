"""Matmul API on the emulator (issue 6).

C = A @ B is built as a 1x1 convolution (A (M,K) -> input [1,K,M,1], rows = M as in MTX's
matmul; B (K,N) -> weights [N,K,1,1]) and goes through the real compiler (import, passes,
calibration + quantization, lowering, build_model with the core mask) and the emulator Runtime:
the result comes from register-command tasks, not numpy. Fully connected with M > 1 is sent to
the CPU partition by the compiler, hence the 1x1 conv.

Each type runs on one of the two MAC paths the emulator models (tools/MATMUL.md, "Types"):
int8 (int8/int4 operands; int4 values widened to int8 when B/A are packed, exact) or fp16
(fp16 A; int8/int4 B converted to fp16 weights times b_scale). The DPU writes C as int8
(requantized), int32 (exact sums), fp16 or fp32 (DATA_FORMAT OUT_PRECISION). int4xint4->int16
saturates the int32 sums to int16 on the host. When K exceeds the chip's B segment
(RK3588 8192, RK3562 4096), each K segment runs as its own build and the int32/fp32 partial C
are added on the host (int64 then saturated to int32; fp32 in segment order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError, InputError
from npuemu.tools.matmul_layout import a_from_native, b_from_native, b_segments, c_to_native
from npuemu.tools.matmul_limits import MatmulLimitError, check_shape
from npuemu.tools.matmul_types import check_type_on_chip, get_type, normalize_chip

#: element type of A -> the MAC path that runs it
_MAC_PATH = {"int8": "int8", "int4": "int8", "fp16": "fp16"}
#: numpy element type of each stored tensor dtype the model file may name
_STORED = {"int8": np.int8, "float16": np.float16, "int32": np.int32, "float32": np.float32}
_RANGES = {"int4": (-8, 7), "int8": (-128, 127)}
#: C element types with a native layout in table 3-5; an int8 / fp16 C is returned normal
C_NATIVE_TYPES = ("int16", "int32", "fp32")
#: chips whose runs the emulator cannot do yet, and why
_NOT_RUNNABLE = {
    c: "the emulator's CNA/DPU read and write 16-byte NC1HWC2 atoms, but RK3566/RK3568 store int8/fp16 "
       "features in 8-byte atoms (C2 8/4, hardware.md 1); lowering works, running does not"
    for c in ("rk3566", "rk3568")
}


class MatmulNotLoweredError(CompileError):
    """The Matmul type or chip is valid but cannot be run on the emulator."""


@dataclass
class MatmulPerf:
    cycles: int
    ddr_read_bytes: int
    ddr_write_bytes: int
    macs: int
    mac_usage: float | None
    time_us: float

    def __add__(self, other: "MatmulPerf") -> "MatmulPerf":
        usages = [u for u in (self.mac_usage, other.mac_usage) if u is not None]
        return MatmulPerf(self.cycles + other.cycles, self.ddr_read_bytes + other.ddr_read_bytes,
                          self.ddr_write_bytes + other.ddr_write_bytes, self.macs + other.macs,
                          max(usages) if usages else None, self.time_us + other.time_us)


class MatmulContext:
    """One Matmul API context: type, chip, layouts, cores and quantization fixed at creation;
    ``run(A, B)`` returns C and sets ``perf`` and ``last_float`` (tools/MATMUL.md)."""

    def __init__(self, M: int, K: int, N: int, type: str = "int8xint8->int8", *, chip: str = "rk3588",
                 b_layout: str = "normal", ac_layout: str = "normal", core_mask: str = "auto",
                 shapes: list[tuple[int, int, int]] | None = None,
                 a_scale: float = 1.0, b_scale=1.0, c_scale: float | None = None, c_zero_point: int = 0,
                 a_zero_point: int = 0, b_zero_point=0):
        from npuemu.platforms import load_platform
        from npuemu.tools.core_mask import parse_core_mask

        self.chip = normalize_chip(chip)
        self.type = check_type_on_chip(type, self.chip).name
        self.t = get_type(self.type)
        for layout, what in ((b_layout, "b_layout"), (ac_layout, "ac_layout")):
            if layout not in ("normal", "native"):
                raise CompileError(f"matmul {what}={layout!r}: expected 'normal' or 'native'")
        self.b_layout, self.ac_layout = b_layout, ac_layout
        self.platform = load_platform(self.chip)
        self.core_mask = core_mask
        self.cores = parse_core_mask(core_mask, self.platform.cores.count, self.chip)
        self.shapes = list(shapes) if shapes else [(M, K, N)]
        if (M, K, N) not in self.shapes:
            self.shapes.insert(0, (M, K, N))
        for m, k, n in self.shapes:
            check_shape(m, k, n, self.type, self.chip)
            segments = b_segments(k, self.chip)
            if len(segments) > 1 and self.t.c in ("int8", "fp16"):
                raise MatmulLimitError(
                    f"matmul K={k} splits B into {len(segments)} segments on {self.chip} "
                    f"(K > {segments[0][1]}); their partial C must be added, which a {self.t.c} C "
                    f"cannot hold: use the ->int32 / ->fp32 type (tools/MATMUL.md)")
        if self.chip in _NOT_RUNNABLE:
            raise MatmulNotLoweredError(f"matmul on {self.chip}: {_NOT_RUNNABLE[self.chip]}")
        self.shape = (M, K, N)
        self.a_scale, self.b_scale = float(a_scale), b_scale
        for name, value in (("b_scale", b_scale), ("b_zero_point", b_zero_point)):
            for n in {n for _, _, n in self.shapes}:
                if np.ndim(value) > 0 and np.shape(value) != (n,):
                    raise InputError(f"matmul {name} has shape {np.shape(value)}; per-channel needs ({n},)")
        for name, value, element in (("a_zero_point", a_zero_point, self.t.a), ("b_zero_point", b_zero_point, self.t.b)):
            low, high = _RANGES.get(element, (0, 0))  # fp16 operands take no zero point
            if np.any(np.asarray(value) < low) or np.any(np.asarray(value) > high):
                raise InputError(f"matmul {name}={value} is outside [{low}, {high}] for {element} operands of {self.type}")
        self.a_zero_point, self.b_zero_point = int(a_zero_point), b_zero_point
        if self.t.c != "int8" and c_scale is not None:
            raise InputError(f"matmul c_scale applies to an int8 C only, not {self.type}")
        self.c_scale_given, self.c_zero_given = c_scale, c_zero_point
        self.perf: MatmulPerf | None = None
        self.c_scale = self.c_zero_point = None

    def set_shape(self, M: int, K: int, N: int) -> None:
        """Dynamic shapes: switch to one of the shapes fixed at creation."""
        if (M, K, N) not in self.shapes:
            raise InputError(f"matmul shape {(M, K, N)} was not given at creation; shapes: {self.shapes}")
        self.shape = (M, K, N)

    # ---- inputs ---------------------------------------------------------------------------
    def _operand(self, x, element: str, name: str) -> np.ndarray:
        """Check A or B against its element type: float for fp16, int8 arrays within range for
        int8/int4 (int4 held one value per int8 element)."""
        if element == "fp16":
            if not np.issubdtype(x.dtype, np.floating):
                raise InputError(f"{self.type} needs float {name}, got {x.dtype}")
            return x.astype(np.float16)
        if x.dtype != np.int8:
            raise InputError(f"{self.type} needs {name} as int8 arrays ({element} values), got {x.dtype}")
        low, high = _RANGES[element]
        if x.size and (x.min() < low or x.max() > high):
            raise InputError(f"{self.type}: {name} holds values outside the {element} range [{low}, {high}]")
        return x

    def run(self, A, B) -> np.ndarray:
        M, K, N = self.shape
        A, B = np.asarray(A), (np.asarray(B) if self.b_layout == "normal" else B)
        if self.ac_layout == "native":
            A = a_from_native(A, M, K, self.type, self.chip)
        if self.b_layout == "native":
            B = b_from_native(B, K, N, self.type, self.chip)
        if A.shape != (M, K) or B.shape != (K, N):
            raise InputError(f"matmul inputs A{A.shape}, B{B.shape} do not match M,K,N={self.shape}")
        A, B = self._operand(A, self.t.a, "A"), self._operand(B, self.t.b, "B")
        bs = np.broadcast_to(np.asarray(self.b_scale, np.float32), (N,))
        self._bzp = np.broadcast_to(np.asarray(self.b_zero_point, np.int32), (N,))
        perf, parts = None, []
        for start, length in b_segments(K, self.chip):
            a, b = A[:, start:start + length], B[start:start + length]
            part = self._run_fp16(a, b, bs) if _MAC_PATH[self.t.a] == "fp16" else self._run_int8(a, b, bs)
            parts.append(part)
            perf = self.perf if perf is None else perf + self.perf
        self.perf = perf
        C = self._combine(parts, bs)
        if self.ac_layout == "native" and self.t.c in C_NATIVE_TYPES:
            return c_to_native(C, M, N, self.type, self.chip)
        return C

    def _combine(self, parts: list[np.ndarray], bs: np.ndarray) -> np.ndarray:
        """C from the segments' partial C (one part unless K was split), with last_float."""
        if self.t.c == "int8":
            (c,) = parts
            self.last_float = (self.c_scale * (c.astype(np.float32) - self.c_zero_point)).astype(np.float32)
            return c
        if self.t.c in ("fp16", "fp32"):
            c = parts[0]
            for part in parts[1:]:
                c = c + part
            self.last_float = c.astype(np.float32)
            return np.ascontiguousarray(c.astype(np.float16 if self.t.c == "fp16" else np.float32))
        total = np.sum([p.astype(np.int64) for p in parts], axis=0)
        info = np.iinfo(np.int16 if self.t.c == "int16" else np.int32)
        c = np.clip(total, info.min, info.max).astype(info.dtype)
        self.last_float = (c.astype(np.float64) * (self.a_scale * bs.astype(np.float64))[None, :]).astype(np.float32)
        return np.ascontiguousarray(c)

    # ---- build and run ----------------------------------------------------------------------
    def _graph(self, B):
        """The ONNX 1x1 convolution computing A @ B with B's values as weights, imported and
        optimized (level 1: no vendor rewrites) for the chip."""
        from onnx import TensorProto, helper, numpy_helper

        from npuemu.compiler.onnx_import import import_onnx
        from npuemu.compiler.passes import PassContext, optimize

        M, (K, N) = self.shape[0], B.shape
        w = np.asarray(B, np.float32).T.reshape(N, K, 1, 1)
        graph_def = helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["out"], name="matmul", kernel_shape=[1, 1])], "matmul",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K, M, 1])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(np.ascontiguousarray(w), "w")])
        onnx_model = helper.make_model(graph_def, opset_imports=[helper.make_opsetid("", 17)])
        onnx_model.ir_version = 8
        graph = import_onnx(onnx_model)
        optimize(graph, PassContext(self.platform, 1))
        return graph

    def _execute(self, graph, x: np.ndarray, N: int) -> np.ndarray:
        """Build (on the core mask's cores), run on the emulator, record .perf; C (M, N) as stored."""
        from npuemu.compiler.build import build_model
        from npuemu.emulator.runtime import Runtime
        from npuemu.emulator.timing.report import report_npu

        model = build_model(graph, self.platform, name="matmul", cores=self.cores)
        host = [step["op"] for step in model.trailer["schedule"] if step["kind"] != "npu"]
        if host:  # the partition gave the conv to the CPU: that would be a numpy result, not the NPU's
            raise MatmulNotLoweredError(f"matmul M,K,N={self.shape} on {self.chip}: the compiler runs "
                                        f"{', '.join(host)} on the CPU for this shape, not on the NPU")
        runtime = Runtime(model)
        runtime.set_input("x", x)
        runtime.run()
        report = report_npu(model, runtime.runs, runtime.machine.platform, "board")
        t = report.totals()
        usages = [u for u in (layer.mac_usage() for layer in report.layers) if u is not None]
        self.perf = MatmulPerf(t["cycles"], t["ddr_read_bytes"], t["ddr_write_bytes"],
                               sum(task.macs for task in report.all_tasks), max(usages) if usages else None,
                               t["time_us"])
        self.last_model = model
        return _read_output(runtime, graph.outputs[0], x.shape[2], N)

    def _run_fp16(self, A, B, bs):
        """fp16 A on the fp16 MAC path; an int8/int4 B becomes fp16 weights B * b_scale
        (rounded to fp16 once; exact for fp16 B and for int B with power-of-two scales)."""
        from npuemu.compiler.ir import QuantParams
        from npuemu.compiler.quant import float16_graph

        K, N = B.shape
        weights = B.astype(np.float32) if self.t.b == "fp16" else (B.astype(np.float32) - self._bzp) * bs[None, :]
        graph = self._graph(weights)
        float16_graph(graph)
        if self.t.c == "fp32":  # the DPU writes its fp32 result without the fp16 rounding (OUT_PRECISION fp32)
            graph.tensors[graph.outputs[0]].quant = QuantParams("float32", np.float32(1.0), 0)
        out = self._execute(graph, np.ascontiguousarray(A.astype(np.float32).T.reshape(1, K, -1, 1)), N)
        return out.astype(np.float32)

    def _set_given_scales(self, graph, bs):
        """Replace the quantizer's A and B parameters by the caller's (symmetric, zero point 0), so
        the stored int8 A and B are exactly the caller's; C keeps the calibrated scale unless
        c_scale was given."""
        from npuemu.compiler.ir import QuantParams

        if "x" not in graph.tensors or "w" not in graph.tensors or graph.outputs[0] not in graph.tensors:
            raise CompileError("matmul: the compiled graph lost its x/w tensors; cannot set the given scales")
        graph.tensors["x"].quant = QuantParams("int8", np.float32(self.a_scale), self.a_zero_point)
        per_channel = np.ndim(self.b_scale) > 0 or np.ndim(self.b_zero_point) > 0
        graph.tensors["w"].quant = (QuantParams("int8", bs, self._bzp, 0) if per_channel
                                    else QuantParams("int8", bs[0], int(self._bzp[0])))
        out = graph.tensors[graph.outputs[0]]
        if self.t.c != "int8":  # C = the exact int32 sums A @ B (units a_scale * b_scale[n]): no requantization
            out.quant = QuantParams("int32", np.float32(self.a_scale * bs.max()), 0)
            return
        if self.c_scale_given is not None:
            out.quant = QuantParams("int8", np.float32(self.c_scale_given), int(self.c_zero_given))
        self.c_scale, self.c_zero_point = float(out.quant.scale), int(out.quant.zero_point)

    def _run_int8(self, A, B, bs):
        """int8 (or int4, held in int8) A and B on the int8 MAC path."""
        from npuemu.compiler.quant import calibrate, quantize_graph

        K, N = B.shape
        graph = self._graph((B.astype(np.float32) - self._bzp) * bs[None, :])
        xf = ((A.astype(np.float32) - self.a_zero_point) * self.a_scale).T.reshape(1, K, -1, 1)
        ranges = calibrate(graph, [{"x": xf}, {"x": -xf}], "normal", progress=False).ranges
        quantize_graph(graph, ranges)
        self._set_given_scales(graph, bs)
        return self._execute(graph, np.ascontiguousarray(A.T.reshape(1, K, -1, 1)), N)


def _read_output(runtime, name: str, M: int, N: int) -> np.ndarray:
    """C (M, N) from the output tensor's NC1HWC2 bytes [1][N/C2][M][1][C2] in emulated memory
    (int8, fp16, or the wide int32 / fp32 a matmul writes; the Runtime reads int8/fp16 only)."""
    info = runtime.tensor_info(name)
    _, c1, height, width, c2 = info["native_shape"]
    dtype = np.dtype(_STORED[info["dtype"]])
    surface = int(info["surface_stride"])
    raw = runtime.machine.memory.dump(int(info["address"]), c1 * surface * c2 * dtype.itemsize).view(dtype)
    grouped = raw.reshape(c1, surface, c2)[:, :height * width, :].transpose(0, 2, 1)
    return np.ascontiguousarray(grouped.reshape(c1 * c2, height * width)[:N].T.reshape(M, N))
