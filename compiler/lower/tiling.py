"""CBUF planning: how a convolution is cut into tasks so its data and weights fit the CBUF.

The rules are the vendor compiler's, measured on RK3588 (vendor-corpus README 4.4 and
tasks.csv; ``tests/compiler/test_lower_tiling.py`` scores them on every corpus conv layer):

- **Units.** The CBUF is ``banks`` banks of ``bank_bytes`` (12 x 32 KB on RK3588, platform
  ``cbuf``), DATA_BANK + WEIGHT_BANK = banks in every task. Input data is counted in 64-byte
  *entries*: one input row takes ``ceil(W * A / 4)`` entries, where A is the row's 16-byte
  atoms per pixel, 1 up to 16 bytes of channels, else an even count (C = 48 int8 takes 4).
  This is the CNA's DATA_ENTRIES register, and it predicts every measured split: e.g. 150 x
  150 x 16 needs 150 x 38 = 5700 entries > 11 x 512, so it splits at 148 rows, while 75 x 75
  x 64 (5625 entries) fits in 11 banks. A packed first-layer image takes ``align(W, 16) / 4``
  entries per row for 3 channels (rep03: 100 rows of 224 in 11 banks; 150-wide: 140 rows)
  and ``align(W, 16) / 16`` for 1 channel [I] (one corpus layer, conv_025).
- **Whole input fits** next to the weights: one task, DATA_BANK = ceil(entries / bank entries).
- **Input fits, weights do not, and the weights need at least as many banks as the input**
  (FC 512 -> 1000, rep11): one task with that DATA_BANK; the weights stream through the rest.
- **Otherwise split along H**: WEIGHT_BANK = ceil(weight bytes / bank); the rest holds data;
  rows per task = floor(DATA_BANK entries / entries per row); neighbouring tasks overlap by
  kernel - stride rows; pad-top belongs to the first task. Weights stay resident: tasks 2..n
  set WEIGHT_REUSE (rep06: banks 10/2, 34 rows, 5 tasks).
- **Small CBUFs stream big weights on an H split**: with at most ``SMALL_CBUF_BANKS`` banks,
  weights needing more than ``STREAMED_WEIGHT_BANKS`` banks are not kept: WEIGHT_BANK = 2,
  the rest holds data, every task fetches the weights again (no WEIGHT_REUSE), so there are
  fewer, taller tasks. The one-task streaming case above also leaves the weights at least 2
  banks there (conv_015, 8 x 112 x 112, 7 banks of weights: 2 tasks, not 1). Inferred from
  task counts only (no decoded RK3562 registers): on the rk3562 corpus it predicts 152 of 175
  conv-type layers (148 with the resident rule), among the 40 normal convs with weights over
  one bank 38 (34): conv_023 14 tasks, conv_133 10, conv_090 1, conv_015 2 all match;
  conv_121 (7 weight banks, input 17 banks), which the resident rule cannot place, runs in 4
  tasks (vendor 5). RK3588's 12 banks keep up to 10 weight banks resident (corpus conv_022),
  so large CBUFs keep the resident rule. rk3566 (also 8 x 32 KB) fits 1 streamed bank better
  (148 of 175 layers against 137): the figure belongs in the platform's ``cbuf`` group once it
  has a field for it.
- **Depthwise too big for the CBUF**: tasks take as many whole 64-channel groups with full H
  as fit (960 ch at 28 x 28: 448 + 448 + 64), DATA_BANK from that many groups; if one group
  does not fit, H is split with the rows of one group and the groups alternate inside each
  row block (rep05). WEIGHT_REUSE only when consecutive tasks use the same channels.

Each task's input rows are trimmed to what its output rows need, ``(n - 1) * stride +
max(kernel, stride) - pad_top`` (a 1x1 stride-2 task of 8 output rows reads 16 rows); the last task's output rows imply the bottom padding (there is no
pad-bottom register; rknpu-isa.md 3).
"""

from __future__ import annotations

from dataclasses import dataclass

from npuemu.isa.errors import CompileError

ENTRY_BYTES = 64  # one CBUF data entry (DATA_ENTRIES unit; see the module docstring)
# Small-CBUF weight streaming (module docstring): fitted to the rk3562 corpus task counts.
SMALL_CBUF_BANKS = 8
STREAMED_WEIGHT_BANKS = 2


def atoms_per_pixel(channel_bytes: int) -> int:
    """16-byte atoms one input pixel occupies in the CBUF: 1, else an even count."""
    atoms = -(-channel_bytes // 16)
    return 1 if atoms <= 1 else -(-atoms // 2) * 2


def entries_per_row(width: int, channel_bytes: int, packed_channels: int = 0) -> int:
    """CBUF entries one input row takes (``packed_channels``: a packed first-layer image)."""
    if packed_channels:
        aligned = -(-width // 16) * 16
        return aligned // 4 if packed_channels > 1 else aligned // 16
    return -(-width * atoms_per_pixel(channel_bytes) // 4)


@dataclass(frozen=True)
class CbufRequest:
    """What the planner needs to know about one convolution (units: pixels, bytes)."""

    layer: str
    height: int
    width: int
    channels: int
    element_bytes: int  # 1 int8, 2 float16
    kernel_h: int  # effective (dilated) kernel height
    stride_y: int
    pad_top: int
    out_height: int
    weight_bytes: int  # the whole packed weight blob
    depthwise: bool = False
    depthwise_group: int = 64  # channels per depthwise channel group (64 int8; 32 fp16)
    packed_channels: int = 0  # > 0: a packed first-layer image of that many channels
    banks: int = 12
    bank_bytes: int = 32768

    @property
    def bank_entries(self) -> int:
        return self.bank_bytes // ENTRY_BYTES

    def row_entries(self, channels: int | None = None) -> int:
        count = self.channels if channels is None else channels
        return entries_per_row(self.width, count * self.element_bytes, self.packed_channels)


@dataclass(frozen=True)
class RowTile:
    """Input rows [in_start, in_start + in_rows) producing output rows [out_start, out_start + out_rows)."""

    in_start: int
    in_rows: int
    out_start: int
    out_rows: int
    pad_top: int


@dataclass(frozen=True)
class ChannelGroup:
    start: int
    count: int


@dataclass(frozen=True)
class TaskTile:
    rows: RowTile
    channels: ChannelGroup
    weight_reuse: bool


@dataclass(frozen=True)
class CbufPlan:
    data_bank: int
    weight_bank: int
    row_tiles: tuple[RowTile, ...]
    channel_groups: tuple[ChannelGroup, ...]
    weights_resident: bool  # later tasks may reuse the weights left in the CBUF
    weights_streamed: bool  # weights larger than WEIGHT_BANK (FC-like): fetched while computing

    @property
    def tasks(self) -> tuple[TaskTile, ...]:
        """Tasks in issue order: row blocks outer, channel groups inner (rep05)."""
        out: list[TaskTile] = []
        for rows in self.row_tiles:
            for group in self.channel_groups:
                reuse = self.weights_resident and bool(out) and out[-1].channels == group
                out.append(TaskTile(rows, group, reuse))
        return tuple(out)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def split_rows(request: CbufRequest, max_rows: int) -> tuple[RowTile, ...]:
    """Row blocks of at most ``max_rows`` input rows (see the module docstring)."""
    height, kernel, stride = request.height, request.kernel_h, request.stride_y
    tiles: list[RowTile] = []
    out_done, in_start = 0, 0
    while out_done < request.out_height:
        pad = request.pad_top if not tiles else 0
        if height - in_start <= max_rows:
            out_rows = request.out_height - out_done  # the rest; bottom padding is implied
        else:
            fit = (max_rows + pad - kernel) // stride + 1
            if fit < 1:
                raise CompileError(
                    f"layer {request.layer}: a task needs at least {kernel - pad} input rows of "
                    f"{request.width} pixels for the kernel, but the CBUF data banks hold only {max_rows}"
                )
            out_rows = min(fit, request.out_height - out_done)
        tiles.append(RowTile(in_start, rows_read(request, in_start, out_rows, pad), out_done, out_rows, pad))
        out_done += out_rows
        in_start = out_done * stride - request.pad_top
    return tuple(tiles)


def rows_read(request: CbufRequest, in_start: int, out_rows: int, pad: int) -> int:
    """Input rows from ``in_start`` that ``out_rows`` output rows need, ``pad`` of their top rows padding; with
    stride > kernel the vendor still takes whole strides."""
    stride = request.stride_y
    return min((out_rows - 1) * stride + max(request.kernel_h, stride) - pad, request.height - in_start)


def plan_cbuf(request: CbufRequest) -> CbufPlan:
    """The bank split and task tiles of one convolution (rules in the module docstring)."""
    banks, bank_entries = request.banks, request.bank_entries
    weight_banks = max(1, _ceil_div(request.weight_bytes, request.bank_bytes))
    data_banks = _ceil_div(request.height * request.row_entries(), bank_entries)
    whole_rows = split_rows(request, request.height)
    all_channels = (ChannelGroup(0, request.channels),)
    if data_banks + weight_banks <= banks:
        return CbufPlan(data_banks, banks - data_banks, whole_rows, all_channels, False, False)
    if request.depthwise:
        return _plan_depthwise(request, weight_banks)
    small_cbuf = banks <= SMALL_CBUF_BANKS
    stream_banks = STREAMED_WEIGHT_BANKS if small_cbuf else 1  # the least weights stream through
    if data_banks <= banks - stream_banks and weight_banks >= data_banks:
        # weights at least as big as the input: one task, the weights stream through the
        # banks left over (rep11 FC: 1/11; tasks.csv conv_000 5/7, conv_015 7/5)
        return CbufPlan(data_banks, banks - data_banks, whole_rows, all_channels, False, True)
    if small_cbuf and weight_banks > STREAMED_WEIGHT_BANKS:
        data_bank = banks - STREAMED_WEIGHT_BANKS
        rows = data_bank * bank_entries // request.row_entries()
        return CbufPlan(data_bank, STREAMED_WEIGHT_BANKS, split_rows(request, rows), all_channels, False, True)
    if weight_banks < banks:
        data_bank = banks - weight_banks
        rows = data_bank * bank_entries // request.row_entries()
        return CbufPlan(data_bank, weight_banks, split_rows(request, rows), all_channels, True, False)
    raise CompileError(
        f"layer {request.layer}: neither the input ({data_banks} banks) nor the weights "
        f"({request.weight_bytes} bytes, {weight_banks} banks) fit the CBUF ({banks} banks of "
        f"{request.bank_bytes} bytes) next to each other; split the input channels first"
    )


def _plan_depthwise(request: CbufRequest, weight_banks: int) -> CbufPlan:
    banks, bank_entries, group = request.banks, request.bank_entries, request.depthwise_group
    if weight_banks >= banks:
        raise CompileError(f"layer {request.layer}: depthwise weights ({request.weight_bytes} bytes) fill the whole CBUF")
    first_group = min(group, request.channels)
    group_entries = request.height * request.row_entries(first_group)
    budget = (banks - weight_banks) * bank_entries
    per_task = budget // group_entries
    if per_task >= 1:
        width = per_task * group
        groups = tuple(ChannelGroup(start, min(width, request.channels - start))
                       for start in range(0, request.channels, width))
        used = min(per_task, _ceil_div(request.channels, group))
        data_bank = _ceil_div(used * group_entries, bank_entries)
        return CbufPlan(data_bank, banks - data_bank, split_rows(request, request.height), groups, False, False)
    groups = tuple(ChannelGroup(start, min(group, request.channels - start))
                   for start in range(0, request.channels, group))
    data_bank = banks - weight_banks
    rows = data_bank * bank_entries // request.row_entries(first_group)
    return CbufPlan(data_bank, weight_banks, split_rows(request, rows), groups, True, False)
