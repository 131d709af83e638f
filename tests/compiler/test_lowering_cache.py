"""Issue 20's compile-time caches (compiler/lower/lowering_cache.py, lut_upload.py and
driver.cached_conv_constants): a cached answer is the answer a fresh computation gives, and a
change of any input the lowering read makes it compute afresh."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from npuemu.compiler import build as build_module
from npuemu.compiler.build import build_model
from npuemu.compiler.layer_records import layer_records
from npuemu.compiler.lower import driver, lut, lut_upload
from npuemu.compiler.lower.fields import RegisterBuilder
from npuemu.compiler.lower.lower_conv import conv_constants
from npuemu.compiler.lower.lowering_cache import LoweringCache, ReadPlacements
from npuemu.compiler.lower.placement import TensorPlacement
from npuemu.compiler.memory_plan import plan_memory
from npuemu.compiler.passes.output_readout import strip_readouts
from npuemu.compiler.tensor_plan import plan_tensors
from npuemu.isa import lut_format
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform
from tests.compiler.test_build_e2e import Net, compile_graph


def lut_cnn():
    """Tiled convs with fused LUT activations (Sigmoid, Elu), a depthwise conv and a
    standalone Tanh: every task kind that uploads a LUT, several tasks per layer."""
    net = Net(11)
    net.conv("c1", "x", "a", 3, 32, stride=2)
    net.node("Sigmoid", ["a"], ["a1"], "sig")
    net.conv("c2", "a1", "b", 32, 64)
    net.conv("dw", "b", "c", 64, 64, group=64)
    net.node("Elu", ["c"], ["c1"], "elu")
    net.node("MaxPool", ["c1"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2])
    net.node("Tanh", ["p"], ["t"], "tanh")
    net.conv("c3", "t", "y", 64, 16, kernel=1)
    return net.model([1, 3, 160, 320], "y"), (1, 3, 160, 320)


@pytest.fixture(scope="module")
def graph():
    model, shape = lut_cnn()
    return compile_graph(model, shape)


@pytest.fixture(scope="module")
def planned(graph):
    spec = load_platform("rk3588")
    stripped, _ = strip_readouts(graph)
    records = layer_records(stripped, spec)
    tensors = plan_tensors(records, spec, elide_copies=True, pack_inputs=True, sram=False)
    placements = tensors.placements(plan_memory(tensors.constant_sizes, tensors.lifetimes), spec)
    return spec, load_regmap(spec.register_map.family), records.layers, placements


def fresh(layer, placements, spec, regmap, op_idx):
    """A lowering with nothing cached: the conv blobs packed again from the layer."""
    layer_as_conv = driver.as_conv(layer)
    constants = conv_constants(layer_as_conv, spec) if isinstance(layer_as_conv, driver.ConvLayer) else None
    return driver.lower_layer(layer, placements, spec, regmap, op_idx=op_idx, constants=constants)


def test_a_cached_lowering_is_the_fresh_lowering(planned) -> None:
    spec, regmap, layers, placements = planned
    cache = LoweringCache()
    firsts = [cache.lower(layer, placements, spec, regmap, op_idx=i) for i, layer in enumerate(layers)]
    again = [cache.lower(layer, dict(placements), spec, regmap, op_idx=i) for i, layer in enumerate(layers)]
    assert (cache.misses, cache.hits) == (len(layers), len(layers))
    assert all(a is b for a, b in zip(firsts, again))
    uploads = 0
    for i, (layer, cached) in enumerate(zip(layers, again)):
        expected = fresh(layer, placements, spec, regmap, i)
        assert cached.tasks == expected.tasks, layer.name  # every register write (descriptions hold
        assert len(cached.descriptions) == len(expected.descriptions)  # LUT programs compared by identity)
        uploads += sum(w.register == "LUT_ACCESS_DATA" and w.value != 0 for t in cached.tasks for w in t.writes) > 0
    assert uploads >= 3, "the model should upload LUTs in several layers"
    assert sum(len(lowered.tasks) > 1 for lowered in again) >= 2, "the model should have tiled layers"


def moved(placement: TensorPlacement, by: int = 4096) -> TensorPlacement:
    return dataclasses.replace(placement, address=placement.address + by)


def test_a_changed_placement_the_layer_read_lowers_afresh(planned) -> None:
    spec, regmap, layers, placements = planned
    layer = next(layer for layer in layers if isinstance(layer, driver.ConvLayer))
    cache = LoweringCache()
    before = cache.lower(layer, placements, spec, regmap, op_idx=0)
    changed = dict(placements) | {layer.output: moved(placements[layer.output])}
    after = cache.lower(layer, changed, spec, regmap, op_idx=0)
    assert cache.misses == 2 and after is not before
    assert after.tasks == fresh(layer, changed, spec, regmap, 0).tasks
    assert after.tasks != before.tasks  # the output address is in the DPU's registers
    unrelated = next(name for name in placements if name not in (layer.input, layer.output, layer.weight_tensor,
                                                                 layer.bias_tensor))
    elsewhere = dict(changed) | {unrelated: dataclasses.replace(placements[unrelated],
                                                                address=placements[unrelated].address + 64)}
    assert cache.lower(layer, elsewhere, spec, regmap, op_idx=0) is after and cache.hits == 1


def test_other_inputs_of_a_lowering_invalidate_it(planned) -> None:
    spec, regmap, layers, placements = planned
    layer = layers[0]
    cache = LoweringCache()
    first = cache.lower(layer, placements, spec, regmap, op_idx=0)
    assert cache.lower(layer, placements, spec, regmap, op_idx=5).tasks[0].op_idx == 5
    other_spec = dataclasses.replace(spec)  # an equal platform, another object: not trusted
    assert cache.lower(layer, placements, other_spec, regmap, op_idx=5) is not first
    missing = {name: value for name, value in placements.items() if name != layer.output}
    with pytest.raises(Exception, match="no feature-map placement"):
        cache.lower(layer, missing, spec, regmap, op_idx=5)
    assert cache.misses == 4 and cache.hits == 0


def test_read_placements_records_lookups_and_misses() -> None:
    seen = ReadPlacements({"a": 1, "b": 2})
    assert seen["a"] == 1 and seen.get("zz") is None
    assert set(seen.read) == {"a", "zz"} and seen.read["a"] == 1
    assert sorted(seen) == ["a", "b"] and seen.read is None  # iteration: everything counts as read


def test_a_build_with_the_cache_equals_one_without(graph, monkeypatch) -> None:
    cached = build_model(graph, "rk3588").to_bytes()

    class NoCache(LoweringCache):
        def lower(self, layer, placements, platform, regmap, *, op_idx=None, cores=1):
            self.misses += 1
            return fresh(layer, placements, platform, regmap, op_idx)

    monkeypatch.setattr(build_module, "LoweringCache", NoCache)
    assert build_model(graph, "rk3588").to_bytes() == cached


def per_word_upload(program: lut.LutProgram, regmap) -> tuple:
    """The upload as one checked write per word (rep10's order: CFG, 513 LE words, CFG, 513 LO)."""
    b = RegisterBuilder(regmap, "t")
    for table_id, values in ((0, program.le), (1, program.lo)):
        b.write("DPU", "LUT_ACCESS_CFG", LUT_ACCESS_TYPE=1, LUT_TABLE_ID=table_id, LUT_ADDR=0)
        for value in values:
            b.write("DPU", "LUT_ACCESS_DATA", LUT_ACCESS_DATA=int(value) & 0xFFFF)
    return b.done()


@pytest.mark.parametrize("family", ["rk3588", "rk3576"])
def test_the_lut_upload_block_is_the_per_word_upload(family) -> None:
    regmap = load_regmap(family)
    int8, _, _ = lut.lut_program("silu", input_unit=0.05, output_scale=0.03, output_zero_point=-20)
    programs = [int8, lut.lut_fp16_program("hard_swish").program, lut.lut_fp16_program("elu").program]
    edges = lut.LutProgram(le=np.full(513, -32768, np.int16), lo=np.arange(513, dtype=np.int16) * 63 - 16000,
                           domain=1.0, input_unit=1.0, output_unit=1.0)
    for program in [*programs, edges]:
        block = lut_upload.upload_writes(program, regmap, "t")
        assert len(block) == 2 * (lut_format.LUT_ENTRIES + 1)
        assert block == per_word_upload(program, regmap)
        assert lut_upload.upload_writes(program, regmap, "t") is block  # kept per table contents
        twin = dataclasses.replace(program, le=program.le.copy(), lo=program.lo.copy())
        assert lut_upload.upload_writes(twin, regmap, "t") is block
    other = lut.LutProgram(le=edges.le.copy(), lo=edges.lo[::-1].copy(), domain=1.0, input_unit=1.0, output_unit=1.0)
    assert lut_upload.upload_writes(other, regmap, "t") == per_word_upload(other, regmap)
    swapped = lut.LutProgram(le=edges.lo.copy(), lo=edges.le.copy(), domain=1.0, input_unit=1.0, output_unit=1.0)
    assert lut_upload.upload_writes(swapped, regmap, "t") == per_word_upload(swapped, regmap)


def test_conv_constants_are_packed_once_per_layer_and_platform(planned) -> None:
    spec, _, layers, _ = planned
    conv = next(layer for layer in layers if isinstance(layer, driver.ConvLayer))
    first = driver.cached_conv_constants(conv, spec)
    assert driver.cached_conv_constants(conv, spec) is first
    expected = conv_constants(conv, spec)
    assert (first.weights, first.bias, first.dpu_channels) == (expected.weights, expected.bias, expected.dpu_channels)
    other = dataclasses.replace(spec)
    assert driver.cached_conv_constants(conv, other) is not first
    assert driver.cached_conv_constants(next(l for l in layers if not isinstance(l, driver.ConvLayer)), spec) is None
