"""Sections 1 and 2 of ``bench/quality.py``: CLINC150 domains, thresholds by cross-validation, and Banking77."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from _quality_core import Context, Target, _only_task, _sample, _slug, _split, _yaml, figure, stratified_folds

from fastslow.policies.evaluation import Prediction

from _data import log, read_jsonl

NONE = "none_of_these"
CONFIDENCE_GRID = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))
MARGIN_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
KEPT_ACCURACY = 0.97
"""Cross-validated kept accuracy the chosen route thresholds must reach."""


# -- 1. CLINC150 domains -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Thresholds:
    min_confidence: float
    min_margin: float
    kept: float
    """Out-of-fold kept share at these thresholds."""
    kept_accuracy: float | None
    reached: bool
    """Whether the out-of-fold kept accuracy reached the target (else the strictest point is used)."""


def route_kept(probabilities: dict[str, float], min_confidence: float, min_margin: float) -> str | None:
    """The route the router keeps under these thresholds (``decide_answer``), or ``None`` when it escalates."""
    top = max(probabilities, key=probabilities.__getitem__)
    ranked = sorted(probabilities.values(), reverse=True)
    margin = ranked[0] - (ranked[1] if len(ranked) > 1 else 0.0)
    if top == NONE or ranked[0] < min_confidence or margin < min_margin:
        return None
    return top


Scored = tuple[dict[str, float], str, bool]
"""A row's distribution, its label, and whether an engine signal escalated it whatever the thresholds."""


def _kept_point(scored: Sequence[Scored], c: float, m: float) -> tuple[float, float | None]:
    """Kept share and kept accuracy of ``scored`` under (``c``, ``m``)."""
    kept = [(None if vetoed else route_kept(p, c, m), label) for p, label, vetoed in scored]
    right = [k == label for k, label in kept if k is not None]
    return (len(right) / len(scored) if scored else 0.0), (sum(right) / len(right) if right else None)


def choose_thresholds(scored: Sequence[Scored], target: float = KEPT_ACCURACY) -> Thresholds:
    """The grid point with the largest kept share at kept accuracy >= ``target``; ties to higher thresholds.

    When no point reaches ``target`` the strictest one (0.99, 0.3) is used, marked ``reached=False``.
    """
    best: Thresholds | None = None
    for c in CONFIDENCE_GRID:
        for m in MARGIN_GRID:
            share, accuracy = _kept_point(scored, c, m)
            # The grid ascends, so ``>=`` moves a tie to the higher thresholds.
            if accuracy is not None and accuracy >= target and (best is None or share >= best.kept):
                best = Thresholds(c, m, share, accuracy, True)
    if best is not None:
        return best
    c, m = CONFIDENCE_GRID[-1], MARGIN_GRID[-1]
    return Thresholds(c, m, *_kept_point(scored, c, m), False)


def _clinc_examples(ctx: Context) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """The examples fragment's route task without "none of these" examples, and the examples per domain."""
    _full, policy = ctx.bench.converted("clinc150-domain", ctx.plan.clinc_examples)
    assert policy is not None
    _name, task = _only_task(_yaml(policy))
    task["routes"][NONE].pop("examples", None)
    examples = {r: list(spec["examples"]) for r, spec in task["routes"].items() if r != NONE}
    return task, examples


def _route_task(
    template: dict[str, Any],
    examples: dict[str, list[str]],
    thresholds: Thresholds | None = None,
    *,
    agreement: bool = False,
) -> Any:
    """The route task on ``examples``; with ``agreement``, escalating whenever the encoders disagree."""
    task = json.loads(json.dumps(template))
    for route, texts in examples.items():
        task["routes"][route]["examples"] = texts
    if thresholds is not None:
        task["thresholds"] = {"min_confidence": thresholds.min_confidence, "min_margin": thresholds.min_margin}
    if agreement:
        task["thresholds"] = {**task.get("thresholds", {}), "min_agreement": 1.0}
    return task


def _clinc_cv(
    template: dict[str, Any], examples: dict[str, list[str]], ctx: Context, *, agreement: bool = False
) -> tuple[Any, list[Any]]:
    """A policy of one task per fold (the other folds' examples) and each fold's held-out rows."""
    items = [(route, text) for route, texts in examples.items() for text in texts]
    folds = stratified_folds([route for route, _ in items], 5, ctx.rng("clinc-cv"))
    tasks: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for f in range(5):
        train: dict[str, list[str]] = {route: [] for route in examples}
        for (route, text), fold in zip(items, folds, strict=True):
            if fold != f:
                train[route].append(text)
            else:
                rows.append({"id": f"cv{f}-{len(rows)}", "task": f"cv{f}", "state": text, "label": route})
        tasks[f"cv{f}"] = _route_task(template, train, agreement=agreement)
    return {"tasks": tasks}, rows


def _clinc_test(ctx: Context, split: str = "test") -> list[dict[str, Any]]:
    """The test split (or ``split``), or a seeded sample of it keeping the in-scope / out-of-scope mix."""
    key = f"clinc_{split}"
    if key not in ctx.cache:
        full, _ = ctx.bench.converted("clinc150-domain", None)
        test = _split(read_jsonl(full), split)
        oos = [r for r in test if NONE in r["labels"].values()]
        in_scope = [r for r in test if NONE not in r["labels"].values()]
        n = ctx.plan.clinc_test
        rng = ctx.rng(f"clinc-{split}")
        if n is not None and n < len(test):
            n_oos = round(n * len(oos) / len(test))
            oos, in_scope = rng.sample(oos, n_oos), rng.sample(in_scope, n - n_oos)
        ctx.cache[key] = in_scope + oos
    rows: list[dict[str, Any]] = ctx.cache[key]
    return rows


def route_figures(predictions: Sequence[Prediction]) -> list[dict[str, Any]]:
    scored = [p for p in predictions if p.label is not None]
    kept = [p for p in scored if p.kept and p.answer is not None]
    in_scope = [p for p in scored if p.label != NONE]
    oos = [p for p in scored if p.label == NONE]
    return [
        figure(
            "accuracy of kept decisions (out-of-scope kept = wrong)",
            sum(p.answer == p.label for p in kept),
            len(kept),
            Target(">=", 0.97),
        ),
        figure("in-scope rows kept", sum(p.kept for p in in_scope), len(in_scope), Target(">=", 0.80)),
        figure("out-of-scope rows escalated", sum(not p.kept for p in oos), len(oos), Target(">=", 0.90)),
    ]


async def clinc(
    ctx: Context,
    embedder: str,
    *,
    open_set_rate: float = 0.1,
    head: str = "adapted",
    agreement: bool = False,
    split: str = "test",
) -> dict[str, Any]:
    """Section 1 for one embedder, open-set rate and head; with ``agreement`` (an ensemble), its
    tasks also escalate whenever the encoders disagree (``min_agreement: 1``), in the folds too.
    ``split``: the rows judged (``validation`` to choose a setting on, as ``bench/open_set_rate.py`` does)."""
    template, examples = _clinc_examples(ctx)
    settings = ctx.runs.settings(embedder, open_set_rate=open_set_rate, head=head)
    rate = [] if open_set_rate in (0.0, 0.1) else [f"rate-{open_set_rate:g}"]
    label = _slug(
        "clinc",
        embedder,
        "open-set" if open_set_rate else "no-open-set",
        *rate,
        head,
        *(["agree"] * agreement),
        *([] if split == "test" else [split]),
    )
    policy, rows = _clinc_cv(template, examples, ctx, agreement=agreement)
    cv = await ctx.runs.predictions(f"{label}-cv", rows, policy, settings)
    chosen = choose_thresholds(
        [(dict(p.probabilities), str(p.label), p.reason == "weak_signal") for p in cv if p.probabilities]
    )
    log(f"{label}: thresholds {chosen.min_confidence} / {chosen.min_margin} (CV kept {chosen.kept:.1%})")
    policy = {"tasks": {"clinc150-domain": _route_task(template, examples, chosen, agreement=agreement)}}
    test = await ctx.runs.predictions(
        f"{label}-test", _clinc_test(ctx, split), policy, settings, task="clinc150-domain"
    )
    reasons: dict[str, int] = {}
    for p in test:
        reasons[p.reason] = reasons.get(p.reason, 0) + 1
    return {
        "embedder": embedder,
        "open_set_rate": open_set_rate,
        "head": head,
        "min_agreement": 1.0 if agreement else None,
        "examples_per_domain": ctx.plan.clinc_examples,
        "thresholds": asdict(chosen),
        "cv_rows": len(cv),
        "test_rows": len(test),
        "reasons": reasons,
        "figures": route_figures(test),
    }


# -- 2. Banking77 ----------------------------------------------------------------------------------------


async def banking(ctx: Context, embedder: str, *, head: str = "adapted") -> dict[str, Any]:
    """Section 2: one task per sampled 10-shot set, every test row asked of each."""
    full, _ = ctx.bench.converted("banking77", None)
    test = _sample(_split(read_jsonl(full), "test"), ctx.plan.banking_rows, ctx.rng("banking-test"))
    tasks: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for seed in ctx.plan.banking_seeds:
        _full, policy = ctx.bench.converted("banking77", 10, seed=seed)
        assert policy is not None
        _name, task = _only_task(_yaml(policy))
        tasks[f"seed{seed}"] = task
        rows += [
            {
                "id": f"seed{seed}-{r['id']}",
                "task": f"seed{seed}",
                "state": r["state"],
                "label": r["labels"]["banking77"],
            }
            for r in test
        ]
    predictions = await ctx.runs.predictions(
        _slug("banking", embedder, head), rows, {"tasks": tasks}, ctx.runs.settings(embedder, head=head)
    )
    per_seed: dict[str, dict[str, int]] = {}
    for p in predictions:
        counts = per_seed.setdefault(str(p.task), {"right": 0, "n": 0})
        counts["right"] += p.answer == p.label
        counts["n"] += 1
    accuracies = [c["right"] / c["n"] for c in per_seed.values() if c["n"]]
    right, n = sum(c["right"] for c in per_seed.values()), sum(c["n"] for c in per_seed.values())
    mean = sum(accuracies) / len(accuracies) if accuracies else None
    target = Target(">=", 0.87)
    pooled = figure("accuracy, mean over the example sets", right, n, target)
    if mean is not None:  # the target is on the mean; the interval is the pooled answers'
        met = target.holds(mean)
        pooled.update(value=mean, met=met, clear=target.holds(pooled["low"]) == target.holds(pooled["high"]) == met)
    return {
        "embedder": embedder,
        "head": head,
        "test_rows": len(test),
        "full_test": ctx.plan.banking_rows is None or len(test) < ctx.plan.banking_rows,
        "seeds": list(ctx.plan.banking_seeds),
        "per_seed": {s: c["right"] / c["n"] for s, c in per_seed.items() if c["n"]},
        "mean": mean,
        "min": min(accuracies, default=None),
        "max": max(accuracies, default=None),
        "figures": [pooled],
    }
