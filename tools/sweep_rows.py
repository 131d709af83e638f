"""The results CSV of a sweep (and the optional per-layer CSV): one row per point, appended and
flushed as each point finishes, so an interrupted sweep keeps every finished row; a rerun reads
them back and skips those points."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from npuemu.isa.errors import ConfigError

#: the bookkeeping columns after the totals
TRAILING = ("build", "build_s", "emulate_s", "timing_s", "error")


class CsvRows:
    """A CSV file of fixed columns, opened for appending; rows of a previous run are kept when the
    header matches (a partial last line, from an interrupted write, is dropped)."""

    def __init__(self, path: Path, columns: list[str], keep: set[str] | None = None) -> None:
        self.path, self.columns = Path(path), list(columns)
        self.previous = self._read_previous(keep)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # the kept rows go to a new file first: a kill now still leaves the old file whole
        partial = self.path.with_name(self.path.name + ".part")
        with partial.open("w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, self.columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(self.previous)
        partial.replace(self.path)
        self._file = self.path.open("a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, self.columns, extrasaction="raise", lineterminator="\n")

    def _read_previous(self, keep: set[str] | None) -> list[dict[str, str]]:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return []
        with self.path.open(newline="", encoding="utf-8") as source:
            reader = csv.reader(source)
            header = next(reader, [])
            if header != self.columns:
                raise ConfigError(f"{self.path}: holds the rows of another sweep (columns {', '.join(header[:8])}"
                                  f"{', ...' if len(header) > 8 else ''}); give another output file or delete it")
            rows = [dict(zip(header, line)) for line in reader if len(line) == len(header)]
        return [row for row in rows if keep is None or row["point"] in keep]

    def write(self, row: dict[str, Any]) -> None:
        self._writer.writerow({key: _cell(row.get(key)) for key in self.columns})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # no rounding: a row compares equal to `npuemu perf`'s figures
    return value


def results_columns(swept: list[str], totals: tuple[str, ...]) -> list[str]:
    return ["point", *swept, *totals, *TRAILING]


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a results CSV (for plots and tests)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such results file")
    with path.open(newline="", encoding="utf-8") as source:
        return list(csv.DictReader(source))
