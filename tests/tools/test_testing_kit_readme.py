"""The README's testing-kit example, run as it is printed there.

The code between the two marker comments is the README's code block (section "Property-
testing your own layers"); ``test_readme_block_is_this_code`` keeps the two the same once the
section is in README.md.
"""

from __future__ import annotations

import re
from pathlib import Path


# --- README example start ---
from hypothesis import given, settings
from npuemu.tools import testing


@settings(max_examples=10, deadline=None)
@given(testing.conv_configs(chip="rk3588", max_channels=16))
def test_my_conv_layers(config):
    report = testing.check_layer(config, chip="rk3588")
    assert report.ok, report.text()


def test_a_changed_register_field_shows_up():
    config = testing.ConvConfig(in_channels=3, out_channels=8, height=6, width=7, activation="relu")
    report = testing.check_layer(config, patch=lambda model: testing.set_register_field(
        model, "DPU", "OUT_CVT_SCALE", "OUT_CVT_SCALE", 20000))
    assert not report.ok
    print(report.text())  # which values differ: emulator vs reference
# --- README example end ---

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## Property-testing your own layers"


def _example() -> str:
    text = Path(__file__).read_text(encoding="utf-8")
    return text.split("# --- README example start ---\n")[1].split("# --- README example end ---")[0]


def test_readme_block_is_this_code():
    readme = README.read_text(encoding="utf-8")
    assert HEADING in readme, f"README.md has no '{HEADING}' section"
    section = readme.split(HEADING, 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block is not None, "the section has no python code block"
    assert block.group(1).strip() == _example().strip()
