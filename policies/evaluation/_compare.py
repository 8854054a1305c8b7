"""``fastslow eval --compare A B``: two runs over the same rows, their differences and significance.

Two report directories (two engines, two policies, two models) are matched prediction by
prediction on (row id, question). Each difference is A − B with a paired bootstrap over rows
(``_metrics.paired_bootstrap``): a resample draws rows with replacement once and applies them to
both runs, so what the two runs share (the rows' difficulty) cancels out. The resampling unit is
the row, so a row's questions move together and the overall interval is not made narrower by
questions that are not independent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
from numpy.typing import NDArray

from fastslow.router import ConfigError

from ._metrics import ece, paired_bootstrap, percentiles
from ._predictions import Prediction, RunInfo, read_predictions, read_run
from ._report_metrics import ECE_BINS, clean
from ._scoring import dedupe, has_distribution, is_correct, is_kept, latency_per_row

__all__ = ["COMPARISON_FILE", "COMPARISON_SUMMARY", "Comparison", "Difference", "GroupComparison", "compare_reports"]

F64: TypeAlias = NDArray[np.float64]
I64: TypeAlias = NDArray[np.int64]
Key: TypeAlias = tuple[str, str]

COMPARISON_FILE = "comparison.json"
COMPARISON_SUMMARY = "comparison.md"
_SHOWN = 5
"""How many differing ids an error names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Difference:
    """One figure in both runs, A − B, and the paired bootstrap's interval and p-value.

    NaN where the figure is undefined (nothing kept in a run, say); the interval and p-value are
    NaN then too.
    """

    a: float
    b: float
    difference: float
    low: float
    high: float
    p_value: float


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupComparison:
    """A question's (or all questions') figures in both runs."""

    rows: int
    """Scored (row, question) pairs compared."""
    accuracy: Difference
    kept_share: Difference
    kept_accuracy: Difference
    """Accuracy of the predictions each run kept (the two runs may keep different rows)."""
    ece_a: float
    ece_b: float
    latency_p50_a: float
    latency_p50_b: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Two runs over the same rows: overall and per question, every difference A − B."""

    a: Path
    b: Path
    run_a: RunInfo
    run_b: RunInfo
    pairs: int
    """(row, question) pairs in both runs, labelled or not."""
    overall: GroupComparison
    questions: Mapping[str, GroupComparison]
    resamples: int
    seed: int
    level: float

    def to_json(self) -> str:
        """``comparison.json``: the figures with NaN as ``null``, floats rounded to 6 decimals."""

        def side(directory: Path, run: RunInfo) -> dict[str, Any]:
            return {
                "directory": str(directory),
                "engine": run.engine,
                "model": run.model,
                "policy": run.policy,
                "policy_version": run.policy_version,
            }

        def group(g: GroupComparison) -> dict[str, Any]:
            return {
                "rows": g.rows,
                "accuracy": _difference_json(g.accuracy),
                "kept_share": _difference_json(g.kept_share),
                "kept_accuracy": _difference_json(g.kept_accuracy),
                "ece": {"a": g.ece_a, "b": g.ece_b},
                "latency_p50_ms": {"a": g.latency_p50_a, "b": g.latency_p50_b},
            }

        body = {
            "a": side(self.a, self.run_a),
            "b": side(self.b, self.run_b),
            "data": self.run_a.data,
            "data_sha256": self.run_a.data_sha256,
            "pairs": self.pairs,
            "bootstrap": {"resamples": self.resamples, "seed": self.seed, "level": self.level, "unit": "row"},
            "overall": group(self.overall),
            "questions": {name: group(g) for name, g in self.questions.items()},
        }
        return json.dumps(clean(body), ensure_ascii=False, indent=1, allow_nan=False)

    def markdown(self) -> str:
        """A table of every difference, then calibration and latency side by side."""
        level = f"{100 * self.level:g} %"
        groups = [("**overall**", self.overall), *self.questions.items()]
        lines = [
            "# Comparison of two runs",
            "",
            f"- **A**: `{self.a}`: {_describe(self.run_a)}",
            f"- **B**: `{self.b}`: {_describe(self.run_b)}",
            f"- **data**: `{self.run_a.data}` (sha256 `{self.run_a.data_sha256[:12]}`…), {self.pairs} (row, question) "
            "pairs in both runs",
            "",
            f"Differences are A − B. Intervals ({level}) and two-sided p-values (for no difference) come from a paired "
            f"bootstrap over rows: {self.resamples} resamples, seed {self.seed}, the same rows drawn for both runs.",
            "",
            f"| | scored | figure | A | B | A − B | {level} interval | p |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, g in groups:
            for label, d in (("accuracy", g.accuracy), ("kept", g.kept_share), ("accuracy of kept", g.kept_accuracy)):
                lines.append(
                    f"| {name} | {g.rows} | {label} | {_pct(d.a)} | {_pct(d.b)} | {_points(d.difference)} | "
                    f"{_points(d.low)} … {_points(d.high)} | {_p(d.p_value)} |"
                )
        lines += ["", "| | ECE-15 A | ECE-15 B | latency p50 A (ms) | latency p50 B (ms) |", "|---|---|---|---|---|"]
        for name, g in groups:
            lines.append(
                f"| {name} | {_num(g.ece_a)} | {_num(g.ece_b)} | {_num(g.latency_p50_a, 0)} | "
                f"{_num(g.latency_p50_b, 0)} |"
            )
        return "\n".join([*lines, ""])

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``comparison.json`` and ``comparison.md`` into ``directory`` (created if needed)."""
        directory.mkdir(parents=True, exist_ok=True)
        paths = (directory / COMPARISON_FILE, directory / COMPARISON_SUMMARY)
        paths[0].write_text(self.to_json() + "\n", encoding="utf-8")
        paths[1].write_text(self.markdown(), encoding="utf-8")
        return paths


def _difference_json(d: Difference) -> dict[str, float]:
    return {"a": d.a, "b": d.b, "difference": d.difference, "low": d.low, "high": d.high, "p_value": d.p_value}


def _describe(run: RunInfo) -> str:
    parts = [f"engine `{run.engine}`"]
    if run.model:
        parts.append(f"model `{run.model}`")
    if run.policy:
        parts.append(f"policy `{run.policy}` version `{run.policy_version}`")
    return ", ".join(parts)


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f} %"


def _points(value: float) -> str:
    # A difference of shares is in percentage points, not percent.
    return "–" if math.isnan(value) else f"{100 * value:+.1f} pp"


def _p(value: float) -> str:
    if math.isnan(value):
        return "–"
    # The bootstrap's p-value is never 0; its floor is 1 / (resamples + 1).
    return "< 0.001" if value < 0.001 else f"{value:.3f}"


def _num(value: float, digits: int = 3) -> str:
    return "–" if math.isnan(value) else f"{value:.{digits}f}"


# -- matching -------------------------------------------------------------------------------------------


def _shown(keys: set[Key]) -> str:
    first = sorted(keys)[:_SHOWN]
    more = ", …" if len(keys) > _SHOWN else ""
    return ", ".join(f"{row}/{question}" for row, question in first) + more


def _match(a: Path, b: Path, run_a: RunInfo, run_b: RunInfo) -> tuple[list[Prediction], list[Prediction]]:
    """Both runs' predictions in one order of (row, question); ``ConfigError`` naming what differs."""
    side_a = {(p.row, p.question): p for p in dedupe(read_predictions(a))[0]}
    side_b = {(p.row, p.question): p for p in dedupe(read_predictions(b))[0]}
    problems = []
    if run_a.data_sha256 != run_b.data_sha256:
        problems.append(
            f"different data: A ran {run_a.data!r} (sha256 {run_a.data_sha256[:12]}…), "
            f"B ran {run_b.data!r} (sha256 {run_b.data_sha256[:12]}…)"
        )
    only_a, only_b = set(side_a) - set(side_b), set(side_b) - set(side_a)
    if only_a or only_b:
        detail = [f"{len(only_a)} (row, question) pair(s) only in A" + (f" ({_shown(only_a)})" if only_a else "")]
        detail.append(f"{len(only_b)} only in B" + (f" ({_shown(only_b)})" if only_b else ""))
        problems.append("different rows: " + ", ".join(detail))
    relabelled = {key for key in set(side_a) & set(side_b) if side_a[key].label != side_b[key].label}
    if relabelled:
        problems.append(f"{len(relabelled)} pair(s) labelled differently ({_shown(relabelled)})")
    if not side_a and not side_b:
        problems.append("neither report has predictions")
    if problems:
        raise ConfigError(f"cannot compare {a} (A) with {b} (B): " + "; ".join(problems))
    keys = sorted(side_a)
    return [side_a[k] for k in keys], [side_b[k] for k in keys]


# -- figures ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Side:
    """One run's per-pair values of a group, aligned with the other run's."""

    correct: F64
    kept: F64
    weight: F64


def _side(predictions: Sequence[Prediction]) -> _Side:
    return _Side(
        correct=np.array([is_correct(p) for p in predictions], dtype=np.float64),
        kept=np.array([is_kept(p) for p in predictions], dtype=np.float64),
        weight=np.array([p.weight for p in predictions], dtype=np.float64),
    )


Figure: TypeAlias = Callable[[_Side, F64], float]
"""A figure of one run from its per-pair values and per-pair multiplicities (a resample's counts)."""


def _ratio(numerator: F64, denominator: F64) -> float:
    total = float(denominator.sum())
    return float(numerator.sum()) / total if total > 0 else math.nan


def _accuracy(side: _Side, m: F64) -> float:
    return _ratio(side.weight * m * side.correct, side.weight * m)


def _kept_share(side: _Side, m: F64) -> float:
    return _ratio(side.weight * m * side.kept, side.weight * m)


def _kept_accuracy(side: _Side, m: F64) -> float:
    return _ratio(side.weight * m * side.kept * side.correct, side.weight * m * side.kept)


def _bootstrap(
    figure: Figure, a: _Side, b: _Side, cluster: I64, *, resamples: int, seed: int, level: float
) -> Difference:
    """``paired_bootstrap`` over rows for any figure, ratios of sums included.

    ``paired_bootstrap`` resamples two arrays of per-row values with one set of indices and applies
    its statistic to each. Here the values are row indices (B's offset by the row count, so the
    statistic knows which run it is given), and the statistic turns a resample's indices into
    per-pair multiplicities, so a figure such as the accuracy of the kept predictions, which is not
    a mean of per-row values, is bootstrapped exactly.
    """
    rows = int(cluster.max()) + 1
    full = np.ones(len(cluster))
    observed_a, observed_b = figure(a, full), figure(b, full)
    if math.isnan(observed_a) or math.isnan(observed_b):
        return Difference(
            a=observed_a, b=observed_b, difference=math.nan, low=math.nan, high=math.nan, p_value=math.nan
        )

    def statistic(indices: F64) -> float:
        index = indices.astype(np.int64)
        is_b = bool(index[0] >= rows)
        side, observed = (b, observed_b) if is_b else (a, observed_a)
        multiplicity = np.bincount(index - rows if is_b else index, minlength=rows)[cluster].astype(np.float64)
        value = figure(side, multiplicity)
        # A resample with nothing kept has no kept accuracy; the run's own value stands in, so the
        # rare empty resample of a small set neither fails the bootstrap nor counts as extreme.
        return observed if math.isnan(value) else value

    row_index = np.arange(rows, dtype=np.float64)
    result = paired_bootstrap(row_index, row_index + rows, statistic=statistic, n=resamples, seed=seed, level=level)
    return Difference(
        a=observed_a,
        b=observed_b,
        difference=result.difference,
        low=result.low,
        high=result.high,
        p_value=result.p_value,
    )


def _ece(predictions: Sequence[Prediction]) -> float:
    rows = [p for p in predictions if has_distribution(p)]
    if not rows:
        return math.nan
    confidence = np.clip([p.confidence for p in rows], 0.0, 1.0)
    correct = np.array([is_correct(p) for p in rows], dtype=np.float64)
    w = np.array([p.weight for p in rows], dtype=np.float64)
    return ece(confidence, correct, bins=ECE_BINS, weight=w if w.sum() > 0 else None)


def _latency_p50(predictions: Sequence[Prediction]) -> float:
    values = latency_per_row(predictions)
    return percentiles(values, (50,))[50.0] if values.size else math.nan


def _group(
    pairs_a: Sequence[Prediction], pairs_b: Sequence[Prediction], *, resamples: int, seed: int, level: float
) -> GroupComparison | None:
    scored = [i for i, p in enumerate(pairs_a) if p.label is not None]
    if not scored:
        return None
    a, b = [pairs_a[i] for i in scored], [pairs_b[i] for i in scored]
    _, cluster = np.unique([p.row for p in a], return_inverse=True)
    side_a, side_b = _side(a), _side(b)
    side_b = _Side(correct=side_b.correct, kept=side_b.kept, weight=side_a.weight)  # one data set: A's weights
    options: dict[str, Any] = {"resamples": resamples, "seed": seed, "level": level}
    rows = cluster.astype(np.int64)
    return GroupComparison(
        rows=len(a),
        accuracy=_bootstrap(_accuracy, side_a, side_b, rows, **options),
        kept_share=_bootstrap(_kept_share, side_a, side_b, rows, **options),
        kept_accuracy=_bootstrap(_kept_accuracy, side_a, side_b, rows, **options),
        ece_a=_ece(a),
        ece_b=_ece(b),
        latency_p50_a=_latency_p50(pairs_a),
        latency_p50_b=_latency_p50(pairs_b),
    )


def compare_reports(a: Path, b: Path, *, resamples: int = 2000, seed: int = 0, level: float = 0.95) -> Comparison:
    """Compare two report directories over the same rows: accuracy, kept share and kept accuracy.

    Only the directories' ``run.json`` and ``predictions.jsonl`` are read (no report need have been
    written). Predictions are matched on (row id, question); a question with no labelled pair is
    left out of the figures.

    Raises:
        ConfigError: a directory is not a report directory, or the two differ in data (their
            ``data_sha256``), in their (row, question) pairs (the error says how many are only in
            A and only in B, and names the first few) or in a pair's label; or no pair is labelled.
    """
    run_a, run_b = read_run(a), read_run(b)
    pairs_a, pairs_b = _match(a, b, run_a, run_b)
    options: dict[str, Any] = {"resamples": resamples, "seed": seed, "level": level}
    overall = _group(pairs_a, pairs_b, **options)
    if overall is None:
        raise ConfigError(f"cannot compare {a} with {b}: no prediction is labelled, so there is nothing to score")
    questions: dict[str, GroupComparison] = {}
    names = sorted({p.question for p in pairs_a})
    if len(names) == 1:  # the one question is the overall: no second bootstrap of the same pairs
        names, questions = [], {names[0]: overall}
    for name in names:
        index = [i for i, p in enumerate(pairs_a) if p.question == name]
        group = _group([pairs_a[i] for i in index], [pairs_b[i] for i in index], **options)
        if group is not None:
            questions[name] = group
    return Comparison(
        a=a,
        b=b,
        run_a=run_a,
        run_b=run_b,
        pairs=len(pairs_a),
        overall=overall,
        questions=questions,
        resamples=resamples,
        seed=seed,
        level=level,
    )
