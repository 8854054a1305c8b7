"""The report of an evaluation run: ``metrics.json``, ``confusion.json``, two plots and ``summary.md``.

Everything is computed from the directory's ``run.json`` and ``predictions.jsonl`` (see
``_predictions``), so a report is rebuilt, or two runs compared, without an engine. The figures
are ``_report_metrics``', the Markdown ``_summary``'s; this module draws the plots and writes the files.
Every key of ``metrics.json`` is documented in docs/evaluation.md ("The report").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastslow.router import ConfigError

from ._metrics import Confusion, Reliability, coverage_curve, reliability
from ._plots import CoverageSeries, plot_coverage, plot_reliability, plotting_available
from ._predictions import PREDICTIONS_FILE, RUN_FILE, Prediction, RunInfo, read_predictions, read_run
from ._report_metrics import (
    CONFUSION_FILE,
    COVERAGE_PLOT,
    ECE_BINS,
    METRICS_FILE,
    RELIABILITY_PLOT,
    SUMMARY_FILE,
    TARGETS,
    clean,
    compute_metrics,
    curve_inputs,
)
from ._scoring import Json, by_question, dedupe, has_distribution, is_correct, unit
from ._summary import benchmark, render_summary

__all__ = ["Report", "write_report"]

PLOT_QUESTIONS = 6
"""Questions drawn one line each; a run with more draws one overall line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What ``write_report`` wrote: the metrics (as in ``metrics.json``) and the files' names."""

    directory: Path
    run: RunInfo
    metrics: Mapping[str, Any]
    files: tuple[str, ...]
    """The report's files in ``directory``, ``predictions.jsonl`` and ``run.json`` included."""
    notes: tuple[str, ...] = ()
    """What could not be produced and why (also in ``summary.md``)."""


def _confusion_json(confusions: Mapping[str, Confusion]) -> Json:
    return {
        name: {
            "labels": [str(label) for label in matrix.labels],
            "counts": matrix.counts.tolist(),
            "worst": [{"true": t, "predicted": p, "count": c} for t, p, c in matrix.worst],
        }
        for name, matrix in confusions.items()
    }


# -- plots -------------------------------------------------------------------------------------------------


def _plotted(predictions: Sequence[Prediction]) -> dict[str, list[Prediction]]:
    """Up to ``PLOT_QUESTIONS`` questions drawn one line each; more than that, one overall line."""
    groups = {name: [p for p in group if p.label is not None] for name, group in by_question(predictions).items()}
    groups = {name: group for name, group in groups.items() if group}
    if 0 < len(groups) <= PLOT_QUESTIONS:
        return groups
    return {"overall": [p for p in predictions if p.label is not None]}


def _plots(directory: Path, predictions: Sequence[Prediction], metrics: Json) -> list[str]:
    series = _plotted(predictions)
    bins: dict[str, Reliability] = {}
    lines: dict[str, CoverageSeries] = {}
    for name, scored in series.items():
        body = metrics["overall"] if name == "overall" else metrics["questions"][name]
        calibrated = [p for p in scored if has_distribution(p)]
        if calibrated:
            correct = np.array([is_correct(p) for p in calibrated], dtype=np.float64)
            label = f"{name} (ECE {body['calibration']['ece']:.3f}, {len(calibrated)} rows)"
            bins[label] = reliability(unit(p.confidence for p in calibrated), correct, bins=ECE_BINS)
        lines[name] = CoverageSeries(
            coverage_curve(*curve_inputs(scored)), body["kept"]["share"], body["kept"]["accuracy"]
        )
    written = []
    if bins:
        plot_reliability(directory / RELIABILITY_PLOT, bins)
        written.append(RELIABILITY_PLOT)
    if lines:
        plot_coverage(directory / COVERAGE_PLOT, lines, TARGETS)
        written.append(COVERAGE_PLOT)
    return written


# -- the report --------------------------------------------------------------------------------------------


def _write_json(path: Path, body: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, ensure_ascii=False, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_report(directory: Path) -> Report:
    """Compute the report of a run directory and write its files beside the predictions.

    Writes ``metrics.json``, ``confusion.json``, ``reliability.png`` and ``coverage.png`` (when
    matplotlib is installed and there is something to draw) and ``summary.md``; an earlier report
    in the directory is replaced. It may run while the run is still going: it reports on the
    predictions written so far, and ``summary.md`` says the run is incomplete.

    Raises:
        ConfigError: the directory has no readable ``run.json``, a bad prediction line, or no
            predictions at all.
    """
    run = read_run(directory)
    predictions, duplicates = dedupe(read_predictions(directory))
    if not predictions:
        raise ConfigError(f"no predictions to report on: {PREDICTIONS_FILE} is empty or missing", path=str(directory))
    metrics, confusions = compute_metrics(run, predictions, duplicates)
    notes: list[str] = []
    files = [RUN_FILE, PREDICTIONS_FILE, METRICS_FILE, CONFUSION_FILE]
    if plotting_available():
        files += _plots(directory, predictions, metrics)
    else:
        notes.append("plots not drawn: matplotlib is not installed (`pip install matplotlib`)")
    files.append(SUMMARY_FILE)
    metrics["files"] = files
    cleaned = clean(metrics)
    _write_json(directory / CONFUSION_FILE, _confusion_json(confusions))
    _write_json(directory / METRICS_FILE, cleaned)
    summary = render_summary(run, cleaned, confusions, benchmark=benchmark(run, predictions), notes=notes)
    (directory / SUMMARY_FILE).write_text(summary, encoding="utf-8")
    return Report(directory=directory, run=run, metrics=cleaned, files=tuple(files), notes=tuple(notes))
