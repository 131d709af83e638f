"""The fixed cost per task (issue 20): what a compiled step keeps between runs so as not to redo it
must leave every result as the full path's.

- CNA steps keep their feature in an array of their own, refilled by each run, and take the
  Cbuf's bookkeeping (kernels/cbuf_reuse.py) the short way where nothing is kept beside the slots;
  a chain whose loads change the bank split - older weight sets kept, evicted by a large
  feature, reused by WEIGHT_REUSE, a feature reused by DATA_REUSE - replays equal to the full
  path, CBUF contents included, and the outputs equal the references of test_machine_conv.
- The DPU stage kernel's ``direct`` form (kernels/dpu_pixel_plan.py: one Numba call, the register
  EW operand converted once) writes the words ``planned_to_atoms`` writes.
- ``remember``'s early returns keep the module note's rule (a reference of it here).
"""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.emulator.kernels import cbuf_reuse, dpu_pixel_plan
from npuemu.emulator.kernels.dpu_pixel import plan_stages, planned_to_atoms
from npuemu.emulator.kernels.dpu_pixel_plan import prepare_planned_to_atoms
from npuemu.emulator.machine import Machine
from npuemu.emulator.units import cna_core
from npuemu.isa.chain import encode_chain
from npuemu.isa.errors import EmulationError
from npuemu.isa.task import Chain
from tests.emulator.test_machine_conv import choose_out_cvt, random_layer, reference_accumulators
from tests.emulator.test_machine_support import (
    MASK_CONV, REGMAP, ConvSpec, bias_blob, conv_task, load_cube, out_cvt_reference, read_cube,
)
from tests.emulator.test_task_plans import HELD_CONFIGS, Counting, _held_case, paired_runs

ADDRESS = 0xF0_0000
RUNS = 6


# ---------------------------------------------------------------------------------------------
# CNA steps: the CBUF's contents across bank splits
# ---------------------------------------------------------------------------------------------
def _layer(spec: ConvSpec, seed: int):
    spec = replace(spec, bs_shift=14, out_scale=23000, out_offset=-5)
    x, w, blob, bs = random_layer(spec, seed)
    return replace(spec, out_shift=choose_out_cvt(reference_accumulators(spec, x, w, bs))), (w, blob, bs)


def _bank_chain():
    """Five conv tasks (their specs, weight layers, and the task list). Banks are 32 KiB: A's
    weights sit in bank 1 (DATA_BANK 1); B loads at bank 4, so A's stay beside it; C's feature
    (40x55x16, 35200 bytes) fills banks 0-1 and evicts A's, and C's weights replace B's in the
    slot while B's stay in bank 4; D reuses B's weights there (WEIGHT_REUSE); E reuses D's
    feature (DATA_REUSE) with B's weights loaded again."""
    a, layer_a = _layer(ConvSpec(in_c=16, in_h=4, in_w=5, kernels=16, banks=(1, 11), feature=0x10000,
                                 weights=0x200000, bias=0x280000, output=0x300000), 1)
    b, layer_b = _layer(ConvSpec(in_c=16, in_h=3, in_w=6, kernels=24, banks=(4, 8), feature=0x20000,
                                 weights=0x220000, bias=0x288000, output=0x310000), 2)
    c, layer_c = _layer(ConvSpec(in_c=16, in_h=40, in_w=55, kernels=8, banks=(1, 11), feature=0x40000,
                                 weights=0x240000, bias=0x290000, output=0x320000), 3)
    d = replace(b, weight_reuse=True, output=0x360000)
    e = replace(b, output=0x370000)
    data_reuse = conv_task(e).set("CNA", "CBUF_CON0", WEIGHT_BANK=8, DATA_BANK=4, DATA_REUSE=1)
    tasks = [conv_task(a), conv_task(b), conv_task(c), conv_task(d), data_reuse]
    return (a, b, c, d, e), (layer_a, layer_b, layer_c), tasks


def _machine(specs, layers, tasks, full: bool):
    machine = Machine.for_platform("rk3588", ddr_size=16 << 20)
    for spec, (_, blob, bs) in zip(specs, layers):
        machine.memory.load(spec.weights, blob.tobytes())
        machine.memory.load(spec.bias, bias_blob(bs.alu, bs.cpend, bs.mul))
    encoded = encode_chain(Chain(tuple(t.task(MASK_CONV) for t in tasks)), REGMAP, base_addr=ADDRESS)
    machine.memory.load(ADDRESS, encoded.data)
    if full:
        machine.cores[0].regfile.matches = lambda snapshot: False
    return machine, encoded.first_amount


def _cbuf(machine: Machine):
    """What the CBUF holds: each slot's key and contents, and the older weight sets' keys."""
    cbuf = machine.cores[0].cbuf
    return ([(r.key, r.array.tobytes()) for r in (cbuf.feature, cbuf.weights)],
            [key for key, _, _ in cbuf._older_weights])


def _bank_outputs(monkeypatch) -> int:
    """The bank chain on a replaying and a full-path machine: records, register state, CBUF
    contents and outputs compared run by run; the number of compiled steps run."""
    specs, layers, tasks = _bank_chain()
    counting = Counting(monkeypatch)
    fast, amount = _machine(specs, layers[:3], tasks, False)
    slow, _ = _machine(specs, layers[:3], tasks, True)
    rng = np.random.default_rng(5)
    inputs = [tuple(rng.integers(-128, 128, (s.in_c, s.in_h, s.in_w)).astype(np.int8) for s in specs[:3])
              for _ in range(RUNS)]

    def load(machine, x):
        for spec, cube in zip(specs, x):
            load_cube(machine, spec.feature, cube)

    def read(machine):
        return [read_cube(machine, s.output, s.kernels, s.out_h, s.out_w) for s in specs], _cbuf(machine)

    weights = [layers[0], layers[1], layers[2], layers[1], layers[1]]
    sources = [0, 1, 2, 1, 1]  # the input each task convolves
    for (got, got_cbuf), (want, want_cbuf), x in paired_runs(fast, slow, amount, inputs, load, read):
        assert got_cbuf == want_cbuf
        for spec, (w, _, bs), source, out, full in zip(specs, weights, sources, got, want):
            reference = out_cvt_reference(reference_accumulators(spec, x[source], w, bs), spec.out_scale,
                                          spec.out_shift, spec.out_offset)
            np.testing.assert_array_equal(out, reference)
            np.testing.assert_array_equal(full, reference)
    return counting.steps


def test_bank_splits_replay_as_the_full_path(monkeypatch):
    assert _bank_outputs(monkeypatch) >= 5 * (RUNS - 3)  # (every task a step once the program runs)


def test_the_checks_catch_weights_evicted_by_a_step(monkeypatch):
    # broken on purpose: C's step takes B's weights as evicted (banks said to overlap), so D's
    # WEIGHT_REUSE finds nothing where the full path reuses B's weights
    monkeypatch.setattr(cna_core, "_covers", lambda banks, resident: True)
    with pytest.raises(EmulationError, match="WEIGHT_REUSE=1 but the CBUF holds"):
        _bank_outputs(monkeypatch)


# ---------------------------------------------------------------------------------------------
# cbuf_reuse.remember against the module note's rule
# ---------------------------------------------------------------------------------------------
def _reference_remember(older: list, slot: str, key: tuple, nbytes: int, previous) -> list:
    """A load evicts every kept weight set whose banks it overlaps (a feature fills banks from 0,
    weights from their DATA_BANK, each ceil(bytes / 32768) banks, at least one) and keeps the
    weight set it replaces unless that one has its key or overlaps too."""
    def banks(first: int, size: int) -> set:
        return set(range(first, first + max(1, -(-size // 32768))))

    def first_bank(k: tuple) -> int:
        return int(dict(k)["banks"].split("/")[0])

    covered = banks(0 if slot == "feature" else first_bank(key), nbytes)
    candidates = older + ([previous] if previous is not None else [])
    return [(k, a) for k, a in candidates if k != key and not covered & banks(first_bank(k), a.nbytes)]


LOADS = st.lists(st.tuples(st.sampled_from(["feature", "weights"]), st.integers(0, 11), st.integers(0, 3),
                           st.integers(1, 3 * 32768)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(LOADS)
def test_remember_keeps_the_module_rule(loads):
    cbuf, want, weights = cna_core.Cbuf(), [], None
    for slot, bank, address, nbytes in loads:
        key = (("address", address), ("banks", f"{bank}/{12 - bank}"))
        array = np.zeros(nbytes, np.int8)
        previous = None if slot == "feature" or weights is None else weights
        want = _reference_remember(want, slot, key, nbytes, None if previous is None else previous[:2])
        cbuf_reuse.remember(cbuf, slot, key, array, previous)
        assert [(k, a.nbytes) for k, a, _ in cbuf._older_weights] == [(k, a.nbytes) for k, a in want]
        if slot == "weights":
            weights = (key, array, cbuf_reuse.weight_banks(key, nbytes))


# ---------------------------------------------------------------------------------------------
# The DPU stage kernel's direct form
# ---------------------------------------------------------------------------------------------
def _direct_mismatches(config: str, channels: int, surfaces: int, per_tensor: bool, constant: bool) -> list[int]:
    """Runs in which ``direct`` wrote other words than ``planned_to_atoms`` on the same inputs;
    ``constant``: the first run's per-tensor EW operand is the plan's ``ew_constant``, passed
    on runs 0 and 3 (the others pass operands of their own)."""
    plan, runs, (pixels, width, offsets, c2, surfaces) = _held_case(config, channels, surfaces, per_tensor, 7)
    words = np.zeros(surfaces * pixels * 2, np.uint64)
    fixed = runs[0][2] if constant else None
    store = prepare_planned_to_atoms(plan, pixels, width, words, offsets, c2, surfaces, fixed)
    assert store is not None and store.direct is not None
    wrong = []
    for index, (data, sums, operand) in enumerate(runs):
        operand = fixed if constant and index in (0, 3) else operand
        words[:] = 0
        store.direct(data, sums, operand)
        want = np.zeros_like(words)
        planned_to_atoms(plan, data, width, want, offsets, c2, surfaces, sums, operand)
        assert want.any()
        if not np.array_equal(words, want):
            wrong.append(index)
    return wrong


@pytest.mark.parametrize("config, per_tensor, constant", [(name, False, False) for name in sorted(HELD_CONFIGS)
                                                           if name != "stages"]
                         + [("ew", True, False), ("ew", True, True)])
@pytest.mark.parametrize("channels, surfaces", [(40, 2), (48, 3)])
def test_direct_store_equals_planned_to_atoms(config, channels, surfaces, per_tensor, constant):
    assert _direct_mismatches(config, channels, surfaces, per_tensor, constant) == []


def test_the_checks_catch_a_constant_operand_taken_for_another(monkeypatch):
    # broken on purpose: the converted constant used whatever operand a run passes
    convert, kept = dpu_pixel_plan._operand, []

    def once(ew_operand, channels, pixels):
        kept.append(ew_operand)
        return convert(kept[0], channels, pixels)

    monkeypatch.setattr(dpu_pixel_plan, "_operand", once)
    assert _direct_mismatches("ew", 48, 3, True, True) == [1, 4]  # (run 2: past the bound, saturated alike)


@pytest.mark.parametrize("config, channels, surfaces", [("chain", 40, 3),  # 48 lanes for 40 channels
                                                       ("stages", 48, 3)])  # no float64 chain
def test_no_direct_form_where_the_run_takes_another_kernel(config, channels, surfaces):
    plan, _, (pixels, width, offsets, c2, surfaces) = _held_case(config, channels, surfaces, False, 0)
    store = prepare_planned_to_atoms(plan, pixels, width, np.zeros(surfaces * pixels * 2, np.uint64), offsets, c2,
                                     surfaces)
    assert store is not None and store.direct is None
