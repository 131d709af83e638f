"""The shipped platform files and register maps are read with libyaml's loader (a fresh
process's Runtime() spends most of its time parsing them otherwise); user files keep the strict
pure-Python loader. Here every shipped file is read both ways: the strict loader accepts it (no
duplicate key) and both give the same data."""

import pytest
import yaml

from npuemu.isa.regmap_loader import REGMAP_DIR
from npuemu.platforms.loader import PLATFORM_DIR, SHIPPED_LOADER, _StrictLoader

SHIPPED = sorted(PLATFORM_DIR.glob("*.yaml")) + sorted(REGMAP_DIR.glob("*.yaml"))


def test_there_are_shipped_files() -> None:
    assert len(SHIPPED) >= 8


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_file_reads_the_same_strictly(path) -> None:
    text = path.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=SHIPPED_LOADER) == yaml.load(text, Loader=_StrictLoader)  # noqa: S506


def test_a_duplicate_key_in_a_user_file_is_still_refused(tmp_path) -> None:
    from npuemu.isa.errors import ConfigError
    from npuemu.platforms.loader import read_yaml

    path = tmp_path / "p.yaml"
    path.write_text("a: 1\na: 2\n")
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        read_yaml(path, "p.yaml")
