"""Matmul API on the emulator (issue 6).

C = A @ B is built as a 1x1 convolution (A (M,K) -> input [1,K,M,1], rows = M as in MTX's
matmul; B (K,N) -> weights [N,K,1,1]) and goes through the real compiler (its driver: import, passes,
calibration + quantization, lowering and build with the core mask) and the emulator Runtime:
the result comes from register-command tasks, not numpy. Fully connected with M > 1 is sent to
the CPU partition by the compiler, hence the 1x1 conv.

Each type runs on one of three paths (tools/MATMUL.md, "Types"): int8 x int8 and fp16 x fp16
through the compiler driver and the Runtime; int4 B (int4 x int4 -> int16, int8 x int4 -> int32) and
fp16 x int8/int4 natively: the compiler's conv lowering of a stand-in layer with the real int4 /
int8 weight blob, tasks with CNA IN_PRECISION = A's and PROC_PRECISION = B's precision, run as
chains on the Machine (int4 at the int4 MAC rate, the mixed path's b_scale in the DPU's BS MUL).
The DPU writes C as int8 (requantized, per-layer or per-channel C scale), int16, int32, fp16 or
fp32. When K exceeds the chip's B segment (``matmul.b_segment_k`` of its platform YAML), each K
segment runs on its own and the int32/fp32 partial C are added on the host (int64 then saturated; fp32 in segment
order).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npuemu.isa.errors import CompileError, InputError
from npuemu.emulator.units.state import PRECISION_DTYPES, PRECISION_NAMES
from npuemu.tools.matmul_layout import (
    INT4_HIGH_FIRST, a_from_native, a_to_native, b_from_native, b_segments, c_to_native, pack_int4,
)
from npuemu.tools.matmul_limits import MatmulLimitError, check_shape
from npuemu.tools.matmul_types import check_type_on_chip, get_type, normalize_chip

#: CNA/CORE/DPU precision codes of the native paths (rknpu-isa.md 3, the emulator's table),
#: element bits, and the placement dtype the stand-in layer's C takes (int16 C is read from an
#: int32 one)
_CODE = {name: code for code, name in PRECISION_NAMES.items()}
_BITS = {"int4": 4, "int8": 8}
_OUT_PLACEMENT = {"int16": "int32", "int32": "int32", "fp16": "float16", "fp32": "float32"}
#: numpy element type of each stored tensor dtype the model file may name
_STORED = {"int8": np.int8, "float16": np.float16, "int32": np.int32, "float32": np.float32}
_RANGES = {"int4": (-8, 7), "int8": (-128, 127)}
#: C element types with a native layout in table 3-5; an int8 / fp16 C is returned normal
C_NATIVE_TYPES = ("int16", "int32", "fp32")


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
                 a_scale: float = 1.0, b_scale=1.0, c_scale=None, c_zero_point: int = 0,
                 a_zero_point: int = 0, b_zero_point=0):
        from npuemu.platforms import load_platform
        from npuemu.compiler.core_mask import parse_core_mask

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
        self.shape = (M, K, N)
        self.a_scale, self.b_scale = float(a_scale), b_scale
        for name, value in (("b_scale", b_scale), ("b_zero_point", b_zero_point), ("c_scale", c_scale)):
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
        if c_scale is not None and np.any(np.asarray(c_scale, np.float64) <= 0):
            raise InputError(f"matmul c_scale must be positive, got {c_scale}")
        if np.ndim(c_zero_point) > 0:
            raise InputError("matmul c_zero_point is per layer (one value): the DPU's OUT_CVT offset is one "
                             "register (tools/MATMUL.md, per-channel C)")
        self.c_scale_given, self.c_zero_given = c_scale, c_zero_point
        self._c_per_channel = self.t.c == "int8" and np.ndim(c_scale) > 0
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
        # the MAC path: native for an int4 B or a mixed fp16 x int type, else A's own path
        self.path = "native" if self._native_path() else "fp16" if self.t.a == "fp16" else "int8"
        runner = {"native": self._run_native, "fp16": self._run_fp16, "int8": self._run_int8}[self.path]
        for start, length in b_segments(K, self.chip):
            parts.append(runner(A[:, start:start + length], B[start:start + length], bs))
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
            scale = np.asarray(self.c_scale, np.float32)  # per layer, or per column of C
            self.last_float = (scale * (c.astype(np.float32) - self.c_zero_point)).astype(np.float32)
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
    def _front(self, B, precision: str, samples=None):
        """The ONNX 1x1 convolution computing A @ B with B's values as weights, through the
        compiler driver's front half (level 1: no vendor rewrites) for the chip: imported,
        optimized and quantized (int8 on ``samples``, or fp16)."""
        from onnx import TensorProto, helper, numpy_helper

        from npuemu.compiler.driver import CompileOptions, prepare

        M, (K, N) = self.shape[0], B.shape
        w = np.asarray(B, np.float32).T.reshape(N, K, 1, 1)
        graph_def = helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["out"], name="matmul", kernel_shape=[1, 1])], "matmul",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K, M, 1])],
            [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(np.ascontiguousarray(w), "w")])
        onnx_model = helper.make_model(graph_def, opset_imports=[helper.make_opsetid("", 17)])
        onnx_model.ir_version = 8
        options = CompileOptions(precision=precision, dataset=samples, optimization_level=1,
                                 core_mask=self.core_mask, name="matmul")
        return prepare(onnx_model, self.platform, options)

    def _execute(self, front, x: np.ndarray, N: int) -> np.ndarray:
        """Build (on the core mask's cores), run on the emulator, record .perf; C (M, N) as stored."""
        from npuemu.compiler.driver import build
        from npuemu.emulator.runtime import Runtime
        from npuemu.emulator.timing.report import report_npu

        model = build(front)
        host = [step["op"] for step in model.trailer["schedule"] if step["kind"] != "npu"]
        if host:  # the partition gave the conv to the CPU: that would be a numpy result, not the NPU's
            raise MatmulNotLoweredError(f"matmul M,K,N={self.shape} on {self.chip}: the compiler runs "
                                        f"{', '.join(host)} on the CPU for this shape, not on the NPU")
        runtime = Runtime(model)
        runtime.set_input("x", x)
        runtime.run()
        self.perf = _perf(report_npu(model, runtime.runs, runtime.machine.platform, "board"))
        self.last_model, self.last_model_runs = model, runtime.runs
        return _read_output(runtime, front.graph.outputs[0], x.shape[2], N)

    def _run_fp16(self, A, B, bs):
        """fp16 A on the fp16 MAC path; an int8/int4 B becomes fp16 weights B * b_scale
        (rounded to fp16 once; exact for fp16 B and for int B with power-of-two scales)."""
        from npuemu.compiler.ir import QuantParams

        K, N = B.shape
        weights = B.astype(np.float32) if self.t.b == "fp16" else (B.astype(np.float32) - self._bzp) * bs[None, :]
        front = self._front(weights, "fp16")
        if self.t.c == "fp32":  # the DPU writes its fp32 result without the fp16 rounding (OUT_PRECISION fp32)
            front.graph.tensors[front.graph.outputs[0]].quant = QuantParams("float32", np.float32(1.0), 0)
        out = self._execute(front, np.ascontiguousarray(A.astype(np.float32).T.reshape(1, K, -1, 1)), N)
        return out.astype(np.float32)

    def _set_given_scales(self, graph, bs):
        """Replace the quantizer's A and B parameters by the caller's (symmetric, zero point 0), so
        the stored int8 A and B are exactly the caller's; C keeps the calibrated scale unless
        c_scale was given."""
        from npuemu.compiler.ir import QuantParams

        if "x" not in graph.tensors or "w" not in graph.tensors or graph.outputs[0] not in graph.tensors:
            raise CompileError("matmul: the compiled graph lost its x/w tensors; cannot set the given scales")
        graph.tensors["x"].quant = QuantParams("int8", np.float32(self.a_scale), self.a_zero_point)
        c_per_channel = self._c_per_channel
        per_channel = np.ndim(self.b_scale) > 0 or np.ndim(self.b_zero_point) > 0 or c_per_channel
        graph.tensors["w"].quant = (QuantParams("int8", bs, self._bzp, 0) if per_channel
                                    else QuantParams("int8", bs[0], int(self._bzp[0])))
        out = graph.tensors[graph.outputs[0]]
        if c_per_channel:
            out.quant = QuantParams("int8", np.float32(1.0), int(self.c_zero_given))
            self.c_scale = np.asarray(self.c_scale_given, np.float32)
            self.c_zero_point = int(self.c_zero_given)
            return
        if self.t.c != "int8":  # C = the exact int32 sums A @ B (units a_scale * b_scale[n]): no requantization
            out.quant = QuantParams("int32", np.float32(self.a_scale * bs.max()), 0)
            return
        if self.c_scale_given is not None:
            out.quant = QuantParams("int8", np.float32(self.c_scale_given), int(self.c_zero_given))
        self.c_scale, self.c_zero_point = float(out.quant.scale), int(out.quant.zero_point)

    def _run_int8(self, A, B, bs):
        """int8 (or int4, held in int8) A and B on the int8 MAC path."""
        K, N = B.shape
        if self._c_per_channel:
            # per-channel C: the DPU's per-channel factor a_s b_s[n] / c_s[n] goes through the BS
            # MUL operands (BRDMA) as a weight scale r[n] = b_s[n] / c_s[n] with C's scale 1
            # (tools/MATMUL.md, "Per-channel C")
            bs = (bs / np.asarray(self.c_scale_given, np.float32)).astype(np.float32)
        xf = ((A.astype(np.float32) - self.a_zero_point) * self.a_scale).T.reshape(1, K, -1, 1)
        front = self._front((B.astype(np.float32) - self._bzp) * bs[None, :], "int8", [{"x": xf}, {"x": -xf}])
        self._set_given_scales(front.graph, bs)
        return self._execute(front, np.ascontiguousarray(A.T.reshape(1, K, -1, 1)), N)

    def _native_path(self) -> bool:
        """int4 B with an integer A, and fp16 A with an integer B (the mixed path) run natively;
        a mixed type with a B zero point takes the fp16-weights path: the fp DPU path has no
        CPEND term to remove it (tools/MATMUL.md)."""
        if self.t.b == "fp16":
            return False
        if self.t.a == "fp16":
            return not np.any(self._bzp)
        return self.t.b == "int4"

    def _run_native(self, A, B, bs) -> np.ndarray:
        """The native int4 and mixed fp16 x int paths (tools/MATMUL.md "Native int4", "Mixed"):
        the compiler's conv lowering (tiling, cores, DPU stages) of a stand-in layer whose input
        has A's bytes per row, given the real weight blob and BS operands; the tasks then get
        the real precisions (CNA IN_PRECISION = A's, PROC_PRECISION = B's) and run as
        register-command chains on the machine."""
        from npuemu.compiler.lower.placement import ConstPlacement, align, feature_placement

        (M, K), N = A.shape, B.shape[1]
        layer, constants, in_dtype = self._stand_in(A, B, bs)
        page = 4096
        inp = feature_placement("x", page, (layer.input_shape[0], M, 1), in_dtype, self.platform)
        w_at = align(inp.address + inp.size, page)
        b_at = align(w_at + len(constants.weights), page)
        out_at = align(b_at + len(constants.bias), page)
        out = feature_placement("c", out_at, (N, M, 1), _OUT_PLACEMENT[self.t.c], self.platform, channel_align=32)
        placements = {"x": inp, "c": out,
                      layer.weight_tensor: ConstPlacement(layer.weight_tensor, w_at, len(constants.weights)),
                      layer.bias_tensor: ConstPlacement(layer.bias_tensor, b_at, len(constants.bias))}
        tasks = self._native_tasks(layer, constants, placements, K)
        loads = {inp.address: _feature_bytes(A, inp, self.type, self.chip, self.t.a),
                 w_at: constants.weights, b_at: constants.bias}
        machine = self._run_chains(tasks, loads, align(out_at + out.size, page))
        dtype = np.dtype(PRECISION_DTYPES[_CODE[self.t.c]])
        c2 = out.pixel_bytes // dtype.itemsize
        c1 = -(-N // c2)
        raw = machine.memory.dump(out_at, c1 * out.surface_stride * c2 * dtype.itemsize).view(dtype)
        return _from_surfaces(raw, c1, out.surface_stride, c2, M, N)

    def _native_tasks(self, layer, constants, placements, K: int) -> list:
        """lower_conv's tasks of the stand-in layer with the real precisions, channel count and
        weight bytes per kernel (the MAC runs at A's precision, REGISTER_SEMANTICS 2.7)."""
        import dataclasses

        from npuemu.compiler.lower.lower_conv import lower_conv

        mac, stand_in = _CODE[self.t.a], layer.input_shape[0]
        tasks = []
        for task in lower_conv(layer, placements, self.platform, constants, cores=len(self.cores)):
            stages = task.stages
            if self.t.a == "fp16":  # B's per-channel scale: BS MUL from the BRDMA blob, fp16 bits
                stages = dataclasses.replace(stages, bs=dataclasses.replace(stages.bs, mul_bypass=False,
                                                                            mul_from_dma=True))
            cube = dataclasses.replace(task.cube, precision=mac, out_precision=_CODE[self.t.c])
            tasks.append(dataclasses.replace(
                task, precision=mac, in_channels=task.in_channels * K // stand_in,
                in_channels_real=task.in_channels_real * K // stand_in,
                weight_bytes_per_kernel=K * _BITS[self.t.b] // 8, cube=cube, stages=stages))
        return tasks

    def _run_chains(self, tasks: list, loads: dict[int, bytes], chain_at: int):
        """Emit the tasks (PROC_PRECISION = B's), one chain per core from ``chain_at`` on, load the
        operands and run the chains on a Machine; sets .perf and .last_records."""
        from npuemu.compiler.lower.emit_conv import emit_conv_task
        from npuemu.compiler.lower.placement import align
        from npuemu.emulator.machine import Machine
        from npuemu.isa.chain import encode_chain
        from npuemu.isa.regmap_loader import load_regmap
        from npuemu.isa.task import Chain

        regmap = load_regmap(self.platform.register_map.family)
        chains: dict[int, list] = {}
        for task in tasks:
            chains.setdefault(task.core, []).append(emit_conv_task(task, regmap, weight_precision=_CODE[self.t.b]))
        encoded = []
        for core, chain in sorted(chains.items()):
            encoded.append((self.cores[core], chain_at, encode_chain(Chain(tuple(chain)), regmap, base_addr=chain_at)))
            chain_at = align(chain_at + len(encoded[-1][2].data), 4096)
        machine = Machine.for_platform(self.platform, ddr_size=chain_at + 4096)
        for address, data in loads.items():
            machine.memory.load(address, data)
        records, cores = [], []
        for core, address, chain in encoded:
            machine.memory.load(address, chain.data)
            run = machine.run_chain(address, chain.first_amount, core)
            records += run.tasks
            cores += [core] * len(run.tasks)
        self.perf = _perf(_chain_report(records, cores, self.platform, self.t.a.upper()))
        self.last_records = records  # the machine's task records (precisions, DMA traffic)
        return machine

    def _stand_in(self, A, B, bs):
        """The layer lower_conv tiles (its input has A's bytes per row: K/2 int8 channels for an
        int4 A), the real constants (int4/int8 weight blob, BS operands) and its input dtype."""
        from npuemu.compiler import quant_regs, weight_pack
        from npuemu.compiler.lower.layers import FLOAT16, ConvLayer, Quant
        from npuemu.compiler.lower.lower_conv import ConvConstants

        (M, K), N = A.shape, B.shape[1]
        weights = np.ascontiguousarray(B.T.reshape(N, K, 1, 1))
        if self.t.b == "int4":  # the int4 blob order, two values per byte in the guide's native B nibble order
            blob = pack_int4(weight_pack.pack_conv_weights(weights, 0, weight_pack.INT4_CONV).reshape(-1),
                             INT4_HIGH_FIRST["B"]).tobytes()
        else:
            blob = weight_pack.pack_conv_weights(weights, 0, weight_pack.conv_blocking(
                "int8", self.platform.atom_k("int8"))).astype(np.int8).tobytes()
        if self.t.a == "fp16":
            # fp path: ALU 0, MUL = fp16(b_scale[n]) in the blob's 16-bit MUL slot (REGISTER_SEMANTICS 2.7)
            mul = np.asarray(bs, np.float32).astype(np.float16).view(np.int16)
            bias = weight_pack.bias_blob(np.zeros(N, np.int32), np.zeros(N, np.int16), mul, N)
            layer = ConvLayer(name="matmul", input="x", output="c", input_shape=(K, M, 1),
                              weights=np.zeros((N, K, 1, 1), np.float16), dtype=FLOAT16,
                              output_dtype="float32" if self.t.c == "fp32" else "")
            return layer, ConvConstants(blob, bias, None, N), "float16"
        requant = quant_regs.conv_requant(
            input_scale=1.0, input_zero_point=self.a_zero_point, weights=weights, weight_scale=np.ones(N),
            weight_zero_point=self._bzp.astype(np.int64), bias=None, output_scale=1.0, output_zero_point=0,
            layer="matmul")
        bias = weight_pack.bias_blob(requant.alu, requant.cpend, requant.mul, N)
        k_bytes = K // 2 if self.t.a == "int4" else K
        layer = ConvLayer(name="matmul", input="x", output="c", input_shape=(k_bytes, M, 1),
                          weights=np.zeros((N, k_bytes, 1, 1), np.int8), weight_scale=np.ones(N),
                          weight_zero_point=np.zeros(N, np.int64), input_quant=Quant(1.0, self.a_zero_point),
                          output_dtype="int32")
        return layer, ConvConstants(blob, bias, requant, N), "int8"


def _feature_bytes(A: np.ndarray, placement, type_name: str, chip: str, element: str) -> bytes:
    """A (M, K) as the CNA reads it: the guide's native A layout (matmul_layout.a_to_native:
    [K/a][M][a], int4 packed two per byte) in the placement's NC1HWC2 surfaces."""
    M, K = A.shape
    data = a_to_native(A, M, K, type_name, chip, packed=element == "int4")
    data = data if element == "int4" else data.view(np.uint8)
    out = np.zeros((placement.c1, placement.surface_stride, placement.pixel_bytes), np.uint8)
    out[:data.shape[0], :M] = data
    return out.tobytes()


def _chain_report(records, cores, platform, dtype: str):
    """The timing model's report of one layer's task records (one chain per core)."""
    from npuemu.emulator.timing.report import LayerTime, PerfReport
    from npuemu.emulator.timing.task_time import time_task

    layer = LayerTime(0, "MatMul", dtype, "NPU", "", "", "matmul", [time_task(r, platform) for r in records],
                      int(getattr(platform.macs, dtype.lower())), cores=cores,
                      shared_ddr_rate=platform.ddr.shared_bytes_per_cycle)
    return PerfReport("matmul", platform.name, platform.clock.npu_mhz, [layer], [], ddr_model="board",
                      host_submit_overhead_us=platform.launch.host_submit_overhead_us,
                      batch={"size": 1, "contexts": 1}, core_count=platform.cores.count)


def _perf(report) -> MatmulPerf:
    t = report.totals()
    usages = [u for u in (layer.mac_usage() for layer in report.layers) if u is not None]
    return MatmulPerf(t["cycles"], t["ddr_read_bytes"], t["ddr_write_bytes"],
                      sum(task.macs for task in report.all_tasks), max(usages) if usages else None, t["time_us"])


def _read_output(runtime, name: str, M: int, N: int) -> np.ndarray:
    """C (M, N) from the output tensor's NC1HWC2 bytes [1][N/C2][M][1][C2] in emulated memory
    (int8, fp16, or the wide int32 / fp32 a matmul writes; the Runtime reads int8/fp16 only)."""
    info = runtime.tensor_info(name)
    _, c1, height, width, c2 = info["native_shape"]
    dtype = np.dtype(_STORED[info["dtype"]])
    surface = int(info["surface_stride"])
    raw = runtime.machine.memory.dump(int(info["address"]), c1 * surface * c2 * dtype.itemsize).view(dtype)
    return _from_surfaces(raw, c1, surface, c2, height * width, N).reshape(M, N)


def _from_surfaces(raw: np.ndarray, c1: int, surface: int, c2: int, pixels: int, N: int) -> np.ndarray:
    """(pixels, N) from C1 surfaces of ``surface`` pixels of C2 channels (NC1HWC2, isa/tensor_layout)."""
    from npuemu.isa.tensor_layout import from_native

    return np.ascontiguousarray(from_native(raw, N, 1, pixels, c1, c2, surface).reshape(N, pixels).T)
