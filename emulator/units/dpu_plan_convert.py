"""A task program's step for a flying integer DPU task with an fp16 output (issue 20,
emulator/task_plan.py): the int -> fp16 conversions an int8 build runs into its float islands
(PROC_PRECISION int8, OUT_PRECISION fp16; NUMERICS.md 26) - ppocr_rec int8's three a run, the
last one 265k elements. Without a step every replay of their chains took core.py ``_replay``'s
per-task loop, not ``_run_steps``.

``run_dpu``'s integer path with ``converting`` (units/dpu.py ``_run_integer``) for one decoded state
pair and one memory, with what does not change from run to run worked out once: the stage settings
and per-channel operand matrices (a BRDMA blob held, as ``dpu_plan.prepare_dpu``'s), the MRDMA's
atom rows and the WDMA's rows located. A run is one ``kernels.dpu_int_to_fp16_step`` pass from the
region's atoms into float32 planes (the same per-element functions as the full path) and the
fp16 rounding as the planes are stored into the WDMA's atoms (``fp16_atoms.planes_to_fp16_atoms``,
through ``dpu_plan_fp._writer``), then the drop of the derived values the write covered. A small task (its
arrays kept) without an EW stage is also a batch's op (``step.batch``: kernels/step_batch_fp16.py CONVERT), so
that it joins the fp16 steps after it.

Forms taken: a plain MRDMA read (COMB_USE 0) of a signed integer type; BS (no CPEND: a flying task
has no window sums), BN with register operands, EW with a register operand; plain or interleaved
writes. Not: the LUT, ERDMA or NRDMA operands, reductions, transposes, lane padding, packed writes;
``prepare_int_to_fp16`` hands back None for those and the core runs the task the full way.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npuemu.emulator.kernels import dpu as kernels
from npuemu.emulator.kernels import dpu_int32, dpu_transpose
from npuemu.emulator.kernels.convert_stores import convert_store
from npuemu.emulator.memory import Memory, TaskDma
from npuemu.emulator.numerics import ROUND_HALF_AWAY, out_cvt_round_mode
from npuemu.emulator.units import dpu
from npuemu.emulator.units.cna_core import drop_after_calls
from npuemu.emulator.units.dpu_plan import _held_blob
from npuemu.emulator.units.dpu_plan_fp import _KEPT_ELEMENTS, _NO_STORE, _writer
from npuemu.emulator.units.state import FP16, PRECISION_DTYPES, DpuRdmaState, DpuState, c2_of


def prepare_int_to_fp16(state: DpuState, rdma: DpuRdmaState | None, memory: Memory, where: str,
                        lut_tables: np.ndarray | None = None) -> Callable | None:
    """``run(cbuf)`` (the CBUF unused): what ``run_dpu(state, rdma, None, ...)`` does to memory and
    the derived cache for a flying integer task with an fp16 output, not the DMA counts; ``run.held``
    as ``dpu_plan.prepare_dpu``'s. None for forms it does not take (the module docstring); an
    EmulationError where the full path raises it too."""
    if not _takes(state, rdma):
        return None
    fixed = dpu._fixed_settings(state, where)  # (raises for NRDMA operands, as the full path)
    if fixed.lut or fixed.bs is not None and fixed.bs.cpend_enable:
        return None
    dtype = PRECISION_DTYPES[rdma.in_precision]
    lanes = c2_of(rdma.in_precision, rdma.atom_bytes)
    channels, height, width = state.channels, state.height, state.width
    surfaces, pixels = -(-channels // lanes), height * width
    starts = dpu._SURFACE_ROWS(rdma.src_address, rdma.surface_stride, rdma.line_stride, surfaces, height)
    located = memory.locate_fixed(starts, width * lanes * dtype.itemsize,
                                  lambda: f"{where}: DPU_RDMA main cube read")
    source = located.elements(dtype)
    stored, _, invalidate = _writer(state, memory, where, (channels, height, width), scaled=True)
    if source is None or stored is None or stored is _NO_STORE:
        return None
    stages, tail = dpu._integer_settings(state, fixed, rdma, None, TaskDma(memory, where), where)
    if any(isinstance(stages.get(name), np.ndarray) and stages[name].flags.writeable
           for name in ("bs_alu", "bs_cpend", "bs_mul")):
        return None  # an operand that may change in place
    bs, bn, ew = stages.get("bs"), stages.get("bn"), tail.get("ew")
    # kernels.dpu.int_stages' settings and operands, as it builds them
    bs_operands = kernels._OPERAND_MATRICES.get(channels, () if bs is None else (
        (stages["bs_alu"], "BS ALU operand"), (stages["bs_cpend"], "CPEND operand"),
        (stages["bs_mul"], "BS MUL operand")), 3)
    bn_operands = kernels._OPERAND_MATRICES.get(channels, () if bn is None else (
        (stages["bn_alu"], "BN ALU operand"), (stages["bn_mul"], "BN MUL operand")), 2)
    operand = kernels._zero_row(pixels, np.int32) if ew is None \
        else kernels._operand_planes(tail["ew_operand"], (channels, height, width))
    settings = (None if bs is None else kernels._x_params(bs), bs_operands,
                None if bn is None else kernels._x_params(bn), bn_operands, operand,
                None if ew is None else kernels._ew_params(ew))
    cvt = state.out_cvt  # (dpu_convert.int_to_fp16's arguments)
    conversion = (np.int64(cvt.scale), int(cvt.shift), out_cvt_round_mode(cvt.round_bit) == ROUND_HALF_AWAY,
                  np.float32(2.0 ** -cvt.minus_exp), bool(cvt.minus_exp))
    region, offsets = source[0], np.ascontiguousarray(source[1], np.int64)
    planes, c2, out_offsets, written = stored[0], stored[3], stored[4], stored[5]
    shape = stored[:3]  # (the stored planes: [C][H*W][1] for an interleaved write)
    kept = np.empty((channels, pixels), np.float32) if channels * pixels <= _KEPT_ELEMENTS else None

    def run(cbuf: object) -> None:
        out = kept if kept is not None else np.empty((channels, pixels), np.float32)
        bits = out.reshape(-1)[:planes * shape[1] * shape[2]].view(np.uint32).reshape(shape)
        convert_store(region, offsets, height, lanes, *settings, *conversion, out, bits, c2, out_offsets, written)
        invalidate()

    run.held = _held_blob(state, rdma, memory, where)
    if kept is not None:  # (its arrays the same every run: a batch's op, kernels/step_batch_fp16.py CONVERT)
        bits = kept.reshape(-1)[:planes * shape[1] * shape[2]].view(np.uint32).reshape(shape)
        run.batch = _batch((region, offsets, height, lanes, *settings, *conversion, kept, bits, c2, out_offsets,
                            written), invalidate)
    return run


def _batch(arguments: tuple, invalidate) -> tuple:
    """``run``'s ``step.batch`` (task_batches.StepBatch): its Python part the drop of the derived values over the
    rows it stores (after its kernels, as ``run``: ``drop_after_calls``), its call ``convert_store``'s."""
    drop = drop_after_calls(invalidate)

    def pre(cbuf: object) -> None:
        drop()

    return pre, ((convert_store, arguments),), None, None, "fp16"


def _takes(state: DpuState, rdma: DpuRdmaState | None) -> bool:
    """The forms ``prepare_int_to_fp16`` takes (the module docstring), as far as the states tell."""
    if not state.flying or rdma is None or rdma.unpool is not None or rdma.comb_use != 0 or not rdma.main_enabled \
            or state.proc_precision not in dpu.INTEGER_PROCESSING or state.out_precision != FP16 \
            or rdma.in_precision != state.in_precision or rdma.in_precision not in PRECISION_DTYPES \
            or PRECISION_DTYPES[rdma.in_precision].kind != "i":
        return False
    if state.minmax_ctl or state.offset_pend or state.transpose is not None or state.pads_lanes \
            or dpu_transpose.is_notched_copy(state, rdma) or dpu_int32.pads_past_orig(state) \
            or isinstance(state, dpu_int32.PackedDpuState):
        return False
    ew = state.ew
    return ew.bypass or ew.op_bypass or not ew.op_from_dma  # (ERDMA operands: the full path)
