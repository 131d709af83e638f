"""The graph passes as ordered lists, per optimization level - the table of contents of the
middle of the compiler.

Each :class:`Stage` is a list of small pass functions ``(graph, ctx) -> number of changes``,
applied in order and repeated until a whole sweep changes nothing (a fixpoint), followed by
the graph health check (``health.check_health``). A stage runs when the optimization level
is at least its ``level``:

======  =======================================================================================
level   what runs
======  =======================================================================================
0       nothing: the imported graph is partitioned as it is (no fusion; only what correctness
        needs, which import already did: constants folded, inference no-ops removed); with
        ``--prune`` (any level) all-zero conv output channels are removed first (``prune``)
1       folding and the hardware fusions: activation subgraphs (hard-swish, SiLU, GELU), GLU
        and LayerNorm matches; Gemm/MatMul -> FullyConnected, BatchNormalization and
        per-channel Mul/Add folded into conv weights, Conv+BiasAdd; 1-D Conv/pool/BN regions
        on [1, C, L] lifted to [1, C, 1, L] (``lift_1d``); channel Pads, Slices and Gathers,
        Pow(x, 2), ReduceMean and wide convs over a signal vector as NPU layers, in int8 a
        magnitude sqrt(sum x^2) as a float16 island (LOWERING.md 32); [1, T, C] token regions as
        [1, C, 1, T] (``tokens_as_channels``) and, in float16 builds, their multi-head
        attention as one HeadAttention layer (``attention_npu``), other MatMuls of two
        activations as ActMatMul layers (``matmul_act_npu``, LOWERING.md 37), a [1, T, C] graph input's
        entry as the runtime's readin (``input_readin``); Pow(x, -0.5), 1/Sqrt and
        float16 Sqrt as DPU look-up tables (``lower_rsqrt``); left-over BN and affine chains as
        1x1 depthwise scale+bias convs; Pad+Conv, Conv+Act, Conv+Add
2       + clean-up: identities removed, Reshape/Transpose chains merged or cancelled (at 3 also
        around a one-input element-wise op, LOWERING.md 32)
3       + vendor rewrites: the Focus block (4 stride-2 Slices + Concat) as one 2x2 stride-2
        conv (``focus_as_conv``), FC as conv, GlobalAveragePool as depthwise convs,
        input-channel tiling for the CBUF, identity conv on odd-sized graph inputs, channel
        Concats and Splits off C2 boundaries as placement/selection convs (``concat_as_convs``,
        ``split_as_convs``), standalone zero Pads as identity convs (``pad_as_conv``),
        DepthToSpace as a 0/1 ConvTranspose written interleaved (``depth_to_space``),
        SpaceToDepth as a 0/1 stride-b conv (``space_to_depth``) (the
        default, as the vendor's ``optimization_level`` 3)
======  =======================================================================================

Clean-up runs first (level 2), so exporter debris such as ``Mul(x, 1)`` does not hide a
subgraph; the subgraph matches run before folding, which could otherwise eat their
constants; fusion comes after folding and again after the rewrites.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from npuemu.isa.errors import CompileError

from ..ir import Graph
from . import cleanup, fold_bn, fold_const_affine, fuse_activation, fuse_add, fuse_glu, fuse_layer_norm
from . import fuse_linear, fuse_pad, fuse_patterns, lift_1d, prune, rewrite_channel_tiling, rewrites
from . import attention_npu, gru_npu, lower_rsqrt, lstm_npu, recurrent_rnn, tokens_as_channels
from . import recurrent_state_io, sequence_fc
from . import average_pool_vendor
from . import channel_slice, gather_index, magnitude_island, pad_channels, pow_as_mul, reduce_mean_npu, signal_frames
from .concat_as_convs import concat_as_placement_convs
from .depth_to_space import depth_to_space_as_conv_transpose
from .flat_concat import flat_concat_tail
from .input_readin import readin_token_inputs
from .matmul_act_npu import matmul_activations_on_npu
from .focus_as_conv import focus_as_conv
from .pad_as_conv import pad_as_identity_conv
from .space_to_depth import space_to_depth_as_conv
from .split_as_convs import split_as_selection_convs
from .transpose_npu import transposes_as_lowered_pairs
from .context import PassContext
from .health import check_health

log = logging.getLogger(__name__)

Pass = Callable[[Graph, PassContext], int]
LEVELS = (0, 1, 2, 3)
DEFAULT_LEVEL = 3
MAX_SWEEPS = 64  # a stage that still changes the graph after this many sweeps has a bug


@dataclass(frozen=True)
class Stage:
    name: str
    level: int
    passes: tuple[Pass, ...]


_CLEANUP = (cleanup.remove_identities, cleanup.merge_reshapes, cleanup.merge_transposes,
            cleanup.transpose_as_reshape, cleanup.remove_dead_nodes)
_FUSE = (fuse_pad.fuse_pad_into_conv, fuse_activation.fuse_activation, fuse_add.fuse_residual_add)

STAGES: tuple[Stage, ...] = (
    Stage("pruning (--prune)", 0, (prune.prune_zero_channels,)),  # only with --prune: on the graph as imported
    Stage("clean-up", 2, _CLEANUP),
    Stage("subgraphs", 1, (fuse_patterns.hard_swish_subgraph, fuse_patterns.hard_sigmoid_times_input,
                           fuse_patterns.silu_subgraph, fuse_patterns.gelu_erf_subgraph,
                           fuse_patterns.gelu_tanh_subgraph, fuse_glu.glu_subgraph,
                           fuse_layer_norm.layer_norm_subgraph)),
    Stage("folding", 1, (fuse_linear.gemm_as_fully_connected, fuse_linear.matmul_as_fully_connected,
                         fuse_linear.flatten_into_fully_connected, fold_bn.fold_batch_norm,
                         fold_const_affine.fold_bias_add, fold_const_affine.fold_scale_into_producer,
                         fold_const_affine.fold_scale_into_consumer, fold_const_affine.fold_shift_into_consumer)),
    Stage("1-D as 2-D", 1, (lift_1d.lift_1d_layers,)),
    Stage("signal frames, channel pads and slices, squares", 1, (  # LOWERING.md 32
        pad_channels.pad_channels_as_copies, signal_frames.conv_as_frames, gather_index.gather_as_channel_pick,
        channel_slice.slice_channels, pow_as_mul.pow_square_as_mul, reduce_mean_npu.reduce_mean_on_npu)),
    Stage("tokens as channels", 1, (tokens_as_channels.tokens_as_channels,  # [1,T,C] -> [1,C,1,T]
                                    attention_npu.attention_as_head_convs)),  # LOWERING.md 22.3
    Stage("MatMul of two activations", 1, (matmul_activations_on_npu,)),  # LOWERING.md 37
    Stage("detector tail", 1, (flat_concat_tail,)),  # Reshapes + Concat + Transpose: LOWERING.md 29
    Stage("graph-input readin", 1, (readin_token_inputs,)),  # token inputs: LOWERING.md 33.4
    Stage("1/sqrt as look-up tables", 1, (lower_rsqrt.rsqrt_on_npu,)),  # LOWERING.md 24
    Stage("int8: magnitudes in float16", 1, (magnitude_island.magnitude_as_float16_island,)),  # LOWERING.md 32
    Stage("recurrent layers unrolled", 1, (recurrent_state_io.state_input_as_channels,  # LOWERING.md 38.1
                                         lstm_npu.lstm_as_npu_layers, gru_npu.gru_as_npu_layers,  # LOWERING.md 30, 31
                                         recurrent_rnn.rnn_as_npu_layers,
                                         recurrent_state_io.state_output_as_channels,
                                         sequence_fc.fc_rows_as_convs)),  # LOWERING.md 38.2
    Stage("scale+bias layers", 1, (fold_bn.batch_norm_as_depthwise_conv,
                                   fold_const_affine.affine_chain_as_depthwise_conv)),
    Stage("fusion", 1, _FUSE),
    Stage("vendor rewrites", 3, (focus_as_conv, rewrites.fully_connected_as_conv,
                                 rewrites.global_average_pool_as_depthwise_convs,
                                 average_pool_vendor.average_pool_as_depthwise_conv,  # LOWERING.md 51.2
                                 rewrite_channel_tiling.tile_input_channels, rewrites.input_identity_conv,
                                 concat_as_placement_convs, split_as_selection_convs, pad_as_identity_conv,
                                 depth_to_space_as_conv_transpose, space_to_depth_as_conv)),
    Stage("clean-up after rewrites", 3, _CLEANUP),
    Stage("element-wise ops between inverse reshapes", 3, (lift_1d.elementwise_between_reshapes,)),  # LOWERING.md 32
    Stage("fusion after rewrites", 3, _FUSE),
    Stage("transposes as two DPU perms", 1, (transposes_as_lowered_pairs,)),  # LOWERING.md 36; after the clean-ups
)


def describe(item: Pass) -> str:
    """A pass's one-line description (its docstring's first line)."""
    return (inspect.getdoc(item) or item.__name__).splitlines()[0]


@dataclass
class PassLog:
    """How often each pass changed the graph, by stage."""

    counts: Counter[tuple[str, str]]

    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        return [f"{stage}: {name} x{count}" for (stage, name), count in self.counts.items()]


def check_level(level: int) -> int:
    if level not in LEVELS:
        raise CompileError(f"optimization level {level} is not one of {', '.join(map(str, LEVELS))}")
    return level


def run_passes(graph: Graph, ctx: PassContext, *, check_every_pass: bool = False) -> PassLog:
    """Run the stages ``ctx.level`` enables on ``graph`` (in place) and return what changed.
    ``check_every_pass`` runs the health check after every pass (tests), not only per stage."""
    check_level(ctx.level)
    counts: Counter[tuple[str, str]] = Counter()
    check_health(graph, "import")
    for stage in STAGES:
        if ctx.level < stage.level:
            continue
        _run_stage(graph, ctx, stage, counts, check_every_pass)
        graph.remove_dead()
        check_health(graph, f"stage '{stage.name}'")
    log.info("%s: passes at level %d made %d changes", graph.name, ctx.level, sum(counts.values()))
    return PassLog(counts)


def _run_stage(graph: Graph, ctx: PassContext, stage: Stage, counts: Counter, check_every_pass: bool) -> None:
    for _ in range(MAX_SWEEPS):
        changed = 0
        for item in stage.passes:
            count = item(graph, ctx)
            if count:
                counts[(stage.name, item.__name__)] += count
                log.debug("%s / %s: %d changes", stage.name, item.__name__, count)
            if check_every_pass:
                check_health(graph, f"pass '{item.__name__}'")
            changed += count
        if not changed:
            return
    raise CompileError(f"stage '{stage.name}' did not reach a fixpoint in {MAX_SWEEPS} sweeps (a pass keeps rewriting)")
