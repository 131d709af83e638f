"""Shared helpers for the platform tests: raw shipped data and writing variants to disk."""

from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from npuemu.platforms.loader import PLATFORM_DIR


def _read_raw(name: str) -> dict[str, Any]:
    return yaml.safe_load((PLATFORM_DIR / f"{name}.yaml").read_text(encoding="utf-8"))


@pytest.fixture
def raw_platform() -> Callable[[str], dict[str, Any]]:
    """raw_platform(name) -> a fresh, mutable copy of a shipped YAML file's data."""
    return _read_raw


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[..., Path]:
    """write_yaml(data_or_text, name='chip.yaml') -> path of the written file."""

    def write(content: Any, name: str = "chip.yaml") -> Path:
        path = tmp_path / name
        text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
        path.write_text(text, encoding="utf-8")
        return path

    return write
