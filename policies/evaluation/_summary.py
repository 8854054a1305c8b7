"""``summary.md`` of an evaluation run: what was run, the headline, then the details, in Markdown.

Rendered from the cleaned metrics (``_report_metrics``), so it says nothing ``metrics.json`` does
not; RouteLLM runs are set beside the published routers' figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._metrics import Confusion
from ._predictions import Prediction, RunInfo
from ._report_metrics import CONFUSION_FILE, TARGETS
from ._scoring import Json

__all__ = ["benchmark", "render_summary"]


# -- summary.md ------------------------------------------------------------------------------------------

# Ong et al., "RouteLLM: Learning to Route LLMs with Preference Data", arXiv 2406.18665 v4, Tables
# 1-3 (as ../shared/reference/routellm-published.md gives them): router, training data, CPT(50 %)
# and CPT(80 %) in percent of strong calls, APGR. Evaluated on the whole set with 10 quantiles.
_PUBLISHED: dict[str, tuple[tuple[str, str, float, float, float], ...]] = {
    "MMLU": (
        ("random", "-", 50.07, 79.93, 0.500),
        ("BERT", "Arena only", 49.43, 77.80, 0.502),
        ("causal LLM", "Arena only", 48.88, 77.93, 0.499),
        ("matrix factorization", "Arena only", 45.00, 76.86, 0.524),
        ("SW ranking", "Arena only", 55.82, 80.25, 0.473),
        ("BERT", "Arena + golden labels", 41.30, 72.20, 0.572),
        ("causal LLM", "Arena + golden labels", 35.49, 70.31, 0.600),
        ("matrix factorization", "Arena + golden labels", 35.46, 71.40, 0.597),
        ("SW ranking", "Arena + golden labels", 35.40, 71.55, 0.603),
    ),
    "GSM8K": (
        ("random", "-", 50.00, 80.08, 0.497),
        ("BERT", "Arena only", 58.78, 83.84, 0.438),
        ("causal LLM", "Arena only", 56.09, 83.56, 0.461),
        ("matrix factorization", "Arena only", 53.59, 85.24, 0.475),
        ("SW ranking", "Arena only", 54.43, 82.11, 0.475),
        ("BERT", "Arena + judge", 44.76, 79.09, 0.531),
        ("causal LLM", "Arena + judge", 33.64, 63.26, 0.622),
        ("matrix factorization", "Arena + judge", 38.82, 72.62, 0.565),
        ("SW ranking", "Arena + judge", 41.21, 72.20, 0.568),
    ),
}
# The same source: the oracle's CPT(50 %) in percent and APGR, the limit any router has on these labels.
_ORACLE = {"MMLU": (6.25, 1.29), "GSM8K": (11.02, 1.13)}


def benchmark(run: RunInfo, predictions: Sequence[Prediction]) -> str | None:
    """``MMLU`` or ``GSM8K`` when the run's data is RouteLLM's, from its name, task, settings or rows."""
    said = [run.data, run.task or "", *(str(v) for v in run.settings.values())]
    said += [str(p.meta.get(key, "")) for p in predictions[:1] for key in ("benchmark", "data_set", "converter")]
    text = " ".join(said).lower()
    if "gsm8k" in text:
        return "GSM8K"
    if "mmlu" in text or any("subject" in p.meta for p in predictions[:1]):
        return "MMLU"
    return None


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


def _pct(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{100 * value:.{digits}f} %"


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ms(latency: Json) -> str:
    if latency["p50"] is None:
        return "–"
    return f"{latency['p50']:.0f} / {latency['p99']:.0f}"


def _what_was_run(run: RunInfo, metrics: Json) -> list[str]:
    counts = metrics["counts"]
    examples = ", ".join(f"{name}: {count}" for name, count in sorted(run.examples.items())) or "none (zero-shot)"
    policy = f"`{run.policy}`, version `{run.policy_version}`" if run.policy else "none: the rows' own questions"
    rows = [
        ("data", f"`{run.data}` (sha256 `{run.data_sha256[:12]}`…)"),
        ("split", run.split or "all rows of the file"),
        ("engine", f"`{run.engine}`" + (f", model `{run.model}`" if run.model else "")),
        ("policy", policy),
        ("task", run.task or "–"),
        (
            "rows",
            f"{run.rows} run; {len(run.dropped_training_rows)} dropped as the engine's training examples; "
            f"{len(run.problems)} unreadable in the file",
        ),
        ("examples per question", examples),
        (
            "predictions",
            f"{counts['predictions']} over {counts['questions']} question(s): {counts['scored']} scored "
            f"(labelled), {counts['unlabelled']} unlabelled",
        ),
        ("started / finished", f"{run.started_at or '–'} / {run.finished_at or 'not finished'}"),
    ]
    return ["## What was run", "", *_table(("", ""), rows)]


def _headline_row(name: str, body: Json) -> list[str]:
    if not body["n"]:
        return [name, "0", *["–"] * 8]
    calibration, kept = body["calibration"], body["kept"]
    return [
        name,
        str(body["n"]),
        _pct(body["accuracy"]),
        _num(body["macro_f1"]),
        _pct(kept["share"]),
        _pct(kept["accuracy"]),
        _num(calibration["ece"]),
        _num(calibration["brier"]),
        _num(calibration["log_loss"]),
        _ms(body["latency_ms"]),
    ]


def _headline(metrics: Json) -> list[str]:
    header = (
        "",
        "scored",
        "accuracy",
        "macro-F1",
        "kept",
        "accuracy of kept",
        "ECE-15",
        "Brier",
        "log loss",
        "latency p50 / p99 (ms)",
    )
    rows = [_headline_row("**overall**", metrics["overall"])]
    rows += [_headline_row(name, body) for name, body in metrics["questions"].items()]
    lines = [
        "## Headline",
        "",
        "What System 1 kept is what the run's own thresholds kept (each prediction's `kept`: thresholds fixed "
        "before the run, by the policy or fitted on other rows), so *kept* and *accuracy of kept* are the "
        "operating point these thresholds give on new data.",
        "",
        *_table(header, rows),
        '"Overall" pools every scored (row, question) pair of the run: a row with several labelled questions '
        "counts once per question, and its macro-F1 averages over every (question, option) class. Accuracy "
        "counts an unanswered prediction (an engine error) as wrong; calibration uses only the predictions with "
        "a distribution; latency is per row (a row's questions share one engine call).",
        "",
    ]
    if metrics["counts"]["weighted"]:
        lines += [
            "Rows carry weights: accuracy, kept share and accuracy, escalations and calibration are "
            "weighted; macro-F1, curves, AUROC, RouteLLM figures and confusion counts count rows.",
            "",
        ]
    return lines


def _escalations(metrics: Json) -> list[str]:
    groups = [("**overall**", metrics["overall"]), *metrics["questions"].items()]
    rows = [
        (
            name,
            _pct(body["escalation"]["share"]),
            ", ".join(f"{reason} {_pct(item['share'])}" for reason, item in body["escalation"]["by_reason"].items())
            or "–",
        )
        for name, body in groups
        if body["n"]
    ]
    return [
        "## Escalations",
        "",
        "Shares of the scored predictions that System 1 did not keep, by the router's reason.",
        "",
        *_table(("", "escalated", "by reason"), rows),
    ]


def _coverage_md(metrics: Json) -> list[str]:
    def point(body: Json, target: float) -> str:
        at = body["coverage"]["at"][f"{target:.2f}"]
        if at["threshold"] is None:
            return "not reached"
        return f"{_pct(at['coverage'])} (confidence ≥ {at['threshold']:.3f})"

    groups = [("**overall**", metrics["overall"]), *metrics["questions"].items()]
    rows = [(name, *(point(body, t) for t in TARGETS)) for name, body in groups if body["n"]]
    return [
        "## Coverage at a target accuracy (descriptive only)",
        "",
        "> **Descriptive, not a result.** These thresholds are read off the very rows they are scored on, "
        "so the coverage they show is optimistic for new data. The headline uses thresholds fixed before "
        "the run. The overall line applies one threshold to every question.",
        "",
        *_table(("", *(f"at {t:.0%} accuracy" for t in TARGETS)), rows),
    ]


def _out_of_scope_md(metrics: Json) -> list[str]:
    groups = [("**overall**", metrics["overall"]), *metrics["questions"].items()]
    rows = [
        (
            name,
            ", ".join(oos["none_options"]),
            oos["rows"],
            oos["positives"],
            _num(oos["auroc_p_none"]),
            _num(oos["auroc_not_max_in_scope"]),
        )
        for name, body in groups
        if body["n"] and (oos := body["out_of_scope"]) is not None
    ]
    if not rows:
        return []
    return [
        "## Out-of-scope detection",
        "",
        'Positives: rows whose label is the "none of these" option.',
        "",
        *_table(("", "none option", "rows", "out of scope", "AUROC of P(none)", "AUROC of 1 − max in-scope"), rows),
    ]


def _verdicts_md(metrics: Json) -> list[str]:
    lines: list[str] = []
    for name, body in [("overall (all rules)", metrics["overall"]), *metrics["questions"].items()]:
        verdicts = body["verdicts"] if body["n"] else None
        if verdicts is None:
            continue
        # A yes/no rule's labels are its violation / ok split again; a choice rule's say which option.
        by_label = verdicts["by_label"] if body["kind"] != "noul" else None
        shares = {**(verdicts["by_violation"] or {}), **(by_label or {})}
        rows = [
            (cls, s["rows"], _pct(s["allowed"]), _pct(s["reviewed"]), _pct(s["denied"])) for cls, s in shares.items()
        ]
        lines += [f"**{name}**", "", *_table(("true class", "rows", "allowed", "reviewed", "denied"), rows)]
    if not lines:
        return []
    return [
        "## Check verdicts",
        "",
        "Per true class, the share of its rows allowed, reviewed and denied "
        "(`violation` / `ok` from each rule's violating option, then a choice rule's own labels).",
        "",
        *lines,
    ]


def _routellm_md(run: RunInfo, metrics: Json, bench: str | None) -> list[str]:
    found = [
        (name, body["routellm"])
        for name, body in metrics["questions"].items()
        if body["n"] and body["routellm"] is not None and body["routellm"]["every_threshold"] is not None
    ]
    if not found:
        return []
    rows = []
    for name, r in found:
        for procedure, key in (("10 quantiles (RouteLLM's)", "quantiles_10"), ("every threshold", "every_threshold")):
            f = r[key]
            rows.append(
                (
                    name,
                    procedure,
                    r["rows"],
                    _pct(r["weak_accuracy"]),
                    _pct(r["strong_accuracy"]),
                    _pct(f["cpt_50"], 2),
                    _pct(f["cpt_80"], 2),
                    _num(f["apgr"]),
                )
            )
    lines = [
        "## RouteLLM routing figures",
        "",
        'Router score: System 1\'s P(no) for "will the weak model answer correctly?", the probability that the '
        "prompt needs the strong model. CPT(x %) is the share of strong calls that recovers x % of the gap "
        "between the models (lower is better); APGR the area under the gap-recovered curve (random ≈ 0.5).",
        "",
        *_table(
            ("question", "thresholds", "rows", "weak correct", "strong correct", "CPT(50 %)", "CPT(80 %)", "APGR"), rows
        ),
    ]
    if bench is None:
        return lines
    oracle_cpt, oracle_apgr = _ORACLE[bench]
    published = [
        (router, data, f"{c50:.2f} %", f"{c80:.2f} %", f"{a:.3f}") for router, data, c50, c80, a in _PUBLISHED[bench]
    ]
    ours = found[0][1]["quantiles_10"]
    scope = f"the `{run.split}` split only" if run.split else "every row of the file"
    return lines + [
        f"### Beside the published {bench} figures",
        "",
        *_table(
            ("router", "trained on", "CPT(50 %)", "CPT(80 %)", "APGR"),
            [
                (
                    "**this run** (System 1)",
                    f"{sum(run.examples.values())} labelled example(s) from this data",
                    _pct(ours["cpt_50"], 2),
                    _pct(ours["cpt_80"], 2),
                    _num(ours["apgr"]),
                ),
                *published,
                ("oracle (the limit on these labels)", "-", f"{oracle_cpt:.2f} %", "-", f"{oracle_apgr:.2f}"),
            ],
        ),
        "How far these compare: the published routers (Ong et al., arXiv 2406.18665, Tables 1–3) were trained on "
        "Chatbot Arena preferences (some with golden labels or a judge's) and scored on the whole set; this run "
        f"is System 1 scored on {scope}, with RouteLLM's procedure (10 quantiles of the score, contaminated "
        "prompts dropped by the converter). On a subset, differences of a few points may be sampling noise; "
        f"{len(run.dropped_training_rows)} row(s) were left out because they were training examples.",
        "",
    ]


def _confusions_md(confusions: Mapping[str, Confusion], metrics: Json) -> list[str]:
    worst = metrics["overall"]["worst_confusions"]
    if not worst:
        return ["## Confusions", "", "No scored prediction was wrong.", ""]
    lines = [
        "## Confusions",
        "",
        f"The most frequent mistakes (true → predicted); every count is in `{CONFUSION_FILE}`.",
        "",
        *_table(
            ("question", "true", "predicted", "rows"),
            [(w["question"], w["true"], w["predicted"], w["count"]) for w in worst],
        ),
    ]
    for name, matrix in confusions.items():
        if len(matrix.labels) <= 10:
            labels = [str(label) for label in matrix.labels]
            rows = [(f"**{t}**", *row) for t, row in zip(labels, matrix.counts.tolist(), strict=True)]
            lines += [f"**{name}** (rows true, columns predicted)", "", *_table(("true \\ predicted", *labels), rows)]
    return lines


def render_summary(
    run: RunInfo,
    metrics: Json,
    confusions: Mapping[str, Confusion],
    *,
    benchmark: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    """``summary.md`` from the cleaned metrics: what was run, the headline, then the details."""
    lines = ["# Evaluation report", ""]
    if not metrics["run"]["complete"]:
        lines += ["> **The run is not finished**: these figures cover the predictions written so far.", ""]
    lines += _what_was_run(run, metrics)
    lines += _headline(metrics)
    if metrics["overall"]["n"]:
        lines += _escalations(metrics) + _coverage_md(metrics)
        lines += _out_of_scope_md(metrics) + _verdicts_md(metrics) + _routellm_md(run, metrics, benchmark)
        lines += _confusions_md(confusions, metrics)
    lines += ["## Files", "", *(f"- `{name}`" for name in metrics["files"]), ""]
    if notes:
        lines += ["## Notes", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(lines)
