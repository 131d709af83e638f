"""Plots of the ``plot`` extra (matplotlib): the Pareto front of a sweep's results
(``npuemu sweep plot``) and the roofline of one model's layers (``npuemu perf --roofline``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from npuemu.isa.errors import ConfigError

#: results columns that are not swept values
_NOT_SWEPT = {"point", "target"}


def pareto_front(pairs: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both (smaller is better on both axes), by x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(set(pairs)):
        if not front or y < front[-1][1]:
            front.append((x, y))
    return front


def swept_columns(header: list[str]) -> list[str]:
    """The swept columns of a results CSV: those between ``point`` and the first total."""
    from npuemu.tools.sweep_worker import TOTALS

    end = header.index(TOTALS[0]) if TOTALS[0] in header else len(header)
    return [name for name in header[:end] if name not in _NOT_SWEPT]


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ConfigError('plots need matplotlib: pip install -e ".[plot]"') from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_plot(results: Path, output: Path, x: str, y: str) -> str:
    """Every point in grey, and per swept column with several values one Pareto line per value."""
    from npuemu.tools.sweep_rows import read_rows

    rows = [row for row in read_rows(results) if not row.get("error")]
    if not rows:
        raise ConfigError(f"{results}: no point without an error to plot")
    for column in (x, y):
        if column not in rows[0]:
            raise ConfigError(f"{results}: no column {column!r}; columns: {', '.join(rows[0])}")
    plt = _matplotlib()
    figure, axes = plt.subplots(figsize=(8, 5.5))
    pairs = [(float(row[x]), float(row[y])) for row in rows]
    axes.scatter(*zip(*pairs), s=12, color="0.7", label="points", zorder=1)
    lines = 0
    for column in swept_columns(list(rows[0])):
        values = sorted({row[column] for row in rows})
        if len(values) < 2:
            continue
        for value in values:
            front = pareto_front([(float(r[x]), float(r[y])) for r in rows if r[column] == value])
            axes.plot(*zip(*front), marker="o", markersize=3, label=f"{column}={value}", zorder=2)
            lines += 1
    _save(plt, figure, output, (x, y), f"Pareto fronts of {y} vs {x} ({len(rows)} points)", legend_size=7)
    return f"wrote {output}: {len(rows)} points, {lines} Pareto line(s)"


def _save(plt, figure, output: Path, labels: tuple[str, str], title: str, legend_size: int) -> None:
    """Axis labels, title and legend on the figure's one axes, then the PNG written and closed."""
    axes = figure.axes[0]
    axes.set_xlabel(labels[0])
    axes.set_ylabel(labels[1])
    axes.set_title(title)
    axes.legend(fontsize=legend_size)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)


def roofline_points(report) -> list[dict[str, Any]]:
    """Per NPU layer with MACs: arithmetic intensity (MACs per DDR byte) and attained MAC/s."""
    points = []
    for layer in report.layers:
        moved = layer.ddr_read_bytes + layer.ddr_write_bytes
        seconds = report.layer_time_us(layer) * 1e-6
        if layer.macs and moved and seconds:
            points.append({"name": layer.full_name, "intensity": layer.macs / moved, "macs_per_s": layer.macs / seconds,
                           "rate": layer.mac_rate, "cores": len(set(layer.cores)) or 1})
    return points


def roofline_plot(report, platform, output: Path) -> str:
    """Each layer as attained MAC/s vs MACs per DDR byte, under the compute roof (the MAC rate of the
    layers' precision on the cores used) and the DDR roof (read bytes per cycle at the NPU clock)."""
    points = roofline_points(report)
    if not points:
        raise ConfigError(f"{report.model}: no layer with MACs and DDR traffic to place on a roofline")
    hertz = platform.clock.npu_mhz * 1e6
    peak = max(p["rate"] * p["cores"] for p in points) * hertz
    bandwidth = platform.ddr.read_bytes_per_cycle * hertz
    plt = _matplotlib()
    figure, axes = plt.subplots(figsize=(8, 5.5))
    low = min(p["intensity"] for p in points) / 2
    high = max(max(p["intensity"] for p in points) * 2, 2 * peak / bandwidth)
    ridge = peak / bandwidth
    axes.plot([low, ridge, high], [low * bandwidth, peak, peak], color="black", label=(
        f"roofs: {peak / 1e9:.0f} GMAC/s, DDR {bandwidth / 1e9:.1f} GB/s"))
    axes.scatter([p["intensity"] for p in points], [p["macs_per_s"] for p in points], s=14, zorder=3,
                 label=f"{len(points)} layers")
    axes.set_xscale("log")
    axes.set_yscale("log")
    _save(plt, figure, output, ("arithmetic intensity (MACs per DDR byte)", "attained MAC/s"),
          f"roofline of {Path(str(report.model)).name} on {report.platform} @ {platform.clock.npu_mhz:g} MHz",
          legend_size=8)
    return f"wrote {output}: {len(points)} layers under the compute and DDR roofs"
