"""Channel Concat on the NPU: one DPU-only requantizing copy per input into its channel slice
(compiler/lower/lower_eltwise.py); inputs that do not fill whole C2 groups become placement convs at
level 3 (passes/concat_as_convs.py), a CPU step below."""

from __future__ import annotations

import numpy as np
import pytest

from npuemu.compiler.lower import ConcatLayer, Quant, feature_placement, lower_layer
from npuemu.isa.container import ModelFile
from npuemu.isa.errors import CompileError
from npuemu.isa.regmap_loader import load_regmap
from npuemu.platforms import load_platform
from tests.compiler.test_build_e2e import Net, compare


def concat_net(channels: tuple[int, ...], relu_after: bool = True):
    """Branches conv(x) -> c_i channels each (different ranges: different scales), Concat,
    then a conv reading the whole concatenation."""
    def make():
        net = Net(21)
        names = []
        for index, count in enumerate(channels):
            net.conv(f"b{index}", "x", f"t{index}", 3, count)
            net.const(f"k{index}", np.float32(index + 1))
            net.node("Mul", [f"t{index}", f"k{index}"], [f"m{index}"], f"scale{index}")  # folded into the conv
            names.append(f"m{index}")
        net.node("Concat", names, ["cat"], "concat", axis=1)
        net.conv("head", "cat", "y", sum(channels), 8)
        return net.model([1, 3, 6, 10], "y"), (1, 3, 6, 10)
    return make


@pytest.mark.parametrize("channels", [(16, 24), (32, 16, 5), (16, 16, 16, 16)])
def test_aligned_concat_runs_on_the_npu(channels, tmp_path) -> None:
    model, shape = concat_net(channels)()
    within, cos, stored, graph = compare(model, shape, tmp_path / "cat.npu")
    built = ModelFile.read(tmp_path / "cat.npu")
    assert [step.kind for step in built.schedule()] == ["npu"]
    concat = [info for info in built.layers() if info.op_type == "Concat"]
    assert len(concat) == 1 and concat[0].task_count == len(channels)
    assert within >= 0.99, f"only {within:.4f} within 1 LSB of fake-quant"
    assert cos >= 0.999, f"cosine {cos:.5f} against onnxruntime float"


def test_unaligned_concat_runs_as_placement_convs(tmp_path) -> None:
    """An input off a C2 boundary: 1x1 placement convs chained by residual adds (passes/concat_as_convs.py;
    the host-step fallback below level 3 is tested in test_data_movement_npu.py)."""
    model, shape = concat_net((8, 24))()
    within, cos, stored, graph = compare(model, shape, tmp_path / "cat.npu")
    ops = [getattr(step, "op", None) for step in ModelFile.read(tmp_path / "cat.npu").schedule()]
    assert ops == [None], ops
    assert within >= 0.99 and cos >= 0.999


def test_concat_lowering_refuses_a_slice_inside_a_surface() -> None:
    platform = load_platform("rk3588")
    q = Quant(0.1, 0)
    layer = ConcatLayer("cat", ("a", "b"), "y", ((8, 4, 4), (16, 4, 4)), (q, q), q)
    places = {"a": feature_placement("a", 0x1000, (8, 4, 4), "int8", platform),
              "b": feature_placement("b", 0x2000, (16, 4, 4), "int8", platform),
              "y": feature_placement("y", 0x3000, (24, 4, 4), "int8", platform)}
    with pytest.raises(CompileError, match="input 1 starts at channel 8, not on a 16-channel surface"):
        lower_layer(layer, places, platform, load_regmap("rk3588"))


def test_concat_of_different_sizes_is_refused() -> None:
    q = Quant(0.1, 0)
    with pytest.raises(CompileError, match="differ in height/width"):
        ConcatLayer("cat", ("a", "b"), "y", ((16, 4, 4), (16, 4, 5)), (q, q), q)
