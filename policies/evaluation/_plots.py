"""The report's two figures: the reliability diagram and the accuracy–coverage curve.

matplotlib is imported inside the functions, never at module level: it takes about a second to
import and only a report draws. The figures are drawn on an Agg canvas directly, without
``pyplot``, so writing a report neither needs a display nor changes the backend of a program that
uses matplotlib itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ._metrics import CoverageCurve, Reliability

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CoverageSeries", "plot_coverage", "plot_reliability", "plot_tuning", "plotting_available"]

_DPI = 110


class CoverageSeries(NamedTuple):
    """One line of the coverage plot and the operating point the run's thresholds gave."""

    curve: CoverageCurve
    kept_coverage: float
    kept_accuracy: float
    """NaN when nothing was kept (the point is then not drawn)."""


def plotting_available() -> bool:
    """Whether matplotlib can be imported (a dependency of fastslow; an environment may have removed it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself to the figure: savefig renders with Agg
    return figure


def plot_reliability(path: Path, series: Mapping[str, Reliability]) -> None:
    """Mean accuracy against mean confidence per bin (top) and the rows in each bin (bottom).

    ``series`` maps a legend label to its bins; empty bins are left out of the line. With one
    series the counts are bars labelled with their value, with several they are outlines.
    """
    figure = _figure(7.0, 6.5)
    top, bottom = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    for label, bins in series.items():
        filled = bins.rows > 0
        top.plot(bins.confidence[filled], bins.accuracy[filled], marker="o", markersize=4, label=label)
        edges = np.append(bins.lower, bins.upper[-1])
        if len(series) == 1:
            bars = bottom.bar(bins.lower, bins.rows, width=bins.upper - bins.lower, align="edge", alpha=0.6)
            bottom.bar_label(bars, fontsize=7)
        else:
            bottom.stairs(bins.rows, edges, label=label)
    top.set(xlim=(0, 1), ylim=(0, 1.02), ylabel="accuracy", title="Reliability (System 1's confidence)")
    top.legend(fontsize=8, loc="upper left")
    top.grid(alpha=0.3)
    bottom.set(xlabel="confidence of the answer", ylabel="rows")
    counts = np.concatenate([bins.rows for bins in series.values()])
    positive = counts[counts > 0]
    # A few crowded bins (confident engines) would flatten the others to nothing on a linear axis.
    if positive.size and positive.max() > 50 * positive.min():
        bottom.set_yscale("log")
    bottom.grid(alpha=0.3)
    figure.savefig(path, format="png")


def plot_coverage(path: Path, series: Mapping[str, CoverageSeries], targets: Sequence[float]) -> None:
    """Accuracy of the kept rows against the share kept, as the confidence threshold falls.

    Each series' point at the run's own thresholds is a star; ``targets`` are dotted lines.
    """
    figure = _figure(7.0, 5.0)
    axes = figure.subplots()
    lowest = 1.0
    marked = False
    for label, item in series.items():
        (line,) = axes.plot(item.curve.coverage, item.curve.accuracy, linewidth=1.5, label=label)
        lowest = min(lowest, float(np.min(item.curve.accuracy)))
        if np.isfinite(item.kept_accuracy):
            axes.plot(
                [item.kept_coverage],
                [item.kept_accuracy],
                marker="*",
                markersize=13,
                linestyle="none",
                color=line.get_color(),
                markeredgecolor="black",
                label=None if marked else "kept at the run's thresholds",
            )
            lowest = min(lowest, item.kept_accuracy)
            marked = True
    for target in targets:
        axes.axhline(target, linestyle=":", color="grey", linewidth=1)
        axes.annotate(
            f"{target:.0%}", (1.0, target), xytext=(3, 0), textcoords="offset points", va="center", fontsize=8
        )
    axes.set(
        xlim=(0, 1),
        ylim=(max(0.0, lowest - 0.05), 1.005),
        xlabel="coverage (share of rows answered by System 1)",
        ylabel="accuracy of the answered rows",
        title="Accuracy–coverage (descriptive: thresholds read off these rows)",
    )
    axes.legend(fontsize=8, loc="lower left")
    axes.grid(alpha=0.3)
    figure.savefig(path, format="png")


def plot_tuning(
    path: Path,
    kept: Sequence[float],
    accuracy: Sequence[float],
    lower: Sequence[float],
    *,
    target: float,
    chosen: int,
    title: str,
) -> None:
    """``fastslow tune``'s path on held-out decisions: accuracy and its lower bound against the share kept.

    ``chosen`` indexes the point tune picked (a star); the target is a dotted line.
    """
    figure = _figure(7.0, 5.0)
    axes = figure.subplots()
    axes.plot(kept, accuracy, marker="o", markersize=3, linewidth=1.5, label="accuracy of kept decisions")
    axes.plot(kept, lower, linestyle="--", linewidth=1.2, label="lower confidence bound")
    axes.plot(
        [kept[chosen]],
        [accuracy[chosen]],
        marker="*",
        markersize=14,
        linestyle="none",
        markeredgecolor="black",
        label="chosen thresholds",
    )
    axes.axhline(target, linestyle=":", color="grey", linewidth=1)
    axes.annotate(f"{target:.1%}", (0.0, target), xytext=(3, 3), textcoords="offset points", fontsize=8)
    finite = [v for v in (*accuracy, *lower) if np.isfinite(v)]
    axes.set(
        xlim=(0, 1),
        ylim=(max(0.0, min([*finite, target]) - 0.02), 1.005),
        xlabel="coverage (share of held-out decisions System 1 keeps)",
        ylabel="accuracy",
        title=title,
    )
    axes.legend(fontsize=8, loc="lower left")
    axes.grid(alpha=0.3)
    figure.savefig(path, format="png")
