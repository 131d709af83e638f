"""Chips whose MAC array makes fewer kernels per pass than RK3588's 32 (int8): RK3562 16,
RK3566/68 16 and RV1106 8 (Platform.atom_k). The compiler groups output channels and packs weights by that figure
(compiler/weight_pack.py conv_blocking) and the emulator reads them back by the same figure
(emulator/units/cna_core.py _weight_layout) - a shared, documented choice: the weight order is
RK3588's with smaller output groups (REGISTER_SEMANTICS.md 2.5). The testing kit's reference is
chip-independent, so a layout disagreement or a wrong channel grouping shows up as a mismatch.
RK3566/68 also store 8-byte NC1HWC2 atoms (C2 int8 8): every stride register counts them
(REGISTER_SEMANTICS.md 9)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npuemu.tools import testing

SMALL_GROUP_CHIPS = ["rk3562", "rv1106", "rk3568"]
# RK3576 keeps RK3588's 32 kernels but its register map is a partial delta (RK3588 positions
# where undocumented, isa/REGISTERS.md): the same layers must run on it too
OTHER_CHIPS = [*SMALL_GROUP_CHIPS, "rk3576"]


@pytest.mark.parametrize("chip", SMALL_GROUP_CHIPS)
@settings(max_examples=10, deadline=None, derandomize=True)
@given(data=st.data())
def test_generated_convs_are_bit_exact(chip, data):
    # up to 40 output channels: several 8/16-kernel groups and a partial last one
    config = data.draw(testing.conv_configs(chip, max_channels=40, max_size=9))
    report = testing.check_layer(config, chip=chip)
    assert report.ok, report.text()


@pytest.mark.parametrize("chip", OTHER_CHIPS)
@settings(max_examples=8, deadline=None, derandomize=True)
@given(data=st.data())
def test_generated_layers_of_every_kind_are_bit_exact(chip, data):
    config = data.draw(testing.layer_configs(chip))
    report = testing.check_layer(config, chip=chip)
    assert report.ok, report.text()


def test_a_residual_conv_reads_its_residual_through_the_erdma_alone():
    # one surface per MAC pass (SIZE_E 0) on RK3562: the split MRDMA/ERDMA read of rep12 does
    # not apply; the conv + residual Add must still be exact
    config = testing.ConvConfig(in_channels=8, out_channels=48, height=5, width=6, residual=True,
                                activation="relu")
    report = testing.check_layer(config, chip="rk3562")
    assert report.ok, report.text()

