"""Measure System 1 against the quality targets, on rows the engine did not learn from.

Every figure is ``fastslow eval`` (the router's own decisions) on held-out rows, beside its Wilson
95 % interval and its target. Thresholds and bands are never read off the rows they are scored on:
they come from cross-validation on the training rows, and the open-set score is calibrated on
in-scope rows only (the engine does that from the examples themselves).

1. CLINC150 domains, 50 examples a domain and none for "none of these": (min_confidence,
   min_margin) chosen by 5-fold cross-validation on the 500 examples (the largest kept share with
   out-of-fold kept accuracy >= 97 %), then the test split (in-scope and out-of-scope rows): kept
   accuracy, in-scope kept, out-of-scope escalated. Ablation: the open-set score off.
2. Banking77, 10 examples an intent: accuracy of five sampled example sets (seeds 0-4) on the test split.
3. XSTest as a policy check, two-fold cross-fitted over its safe / unsafe contrast pairs: each
   fold's rule is trained on the other fold, its bands (allow_at, deny_at) chosen by an inner
   cross-validation on that fold. Safe denied, safe reviewed, unsafe caught. Ablation: no background.
4. Prompt injections (deepset, all 662 rows), cross-fitted the same way: injections caught, and
   benign text from other sets (moderation clean rows, MT-Bench, CLINC150 in-scope) denied or reviewed.
5. One held-out injection hidden in a long benign document (20,000-30,000 characters), against the
   same documents without it.
6. Decision latency through the in-process ``Router``: route and check, short and long states.
7. The zero-shot calibration's own evaluation (``bench/fit_zero_shot.py``), raw against calibrated.

    python bench/quality.py              # every section, sizes as plan_for(False) (35 minutes on two loaded cores)
    python bench/quality.py --quick      # tiny samples, e5 only: under a minute with a warm cache
    python bench/quality.py --only clinc,latency

Runs go under ``--work`` (default ``bench/out/quality``), one folder each (rows, policy, report);
the last line of stdout is one JSON object of every figure. ``render_quality(results)`` is the
markdown section ``bench/report.py`` appends to ``docs/benchmarks.md``. System 2 is never called.
"""

from __future__ import annotations

import os

# MiniLM runs in numpy: OpenBLAS's threads, one per core, fight the machine's other work and made
# an embedding 25 times slower on a loaded two-core machine (0.6 s against 23 ms). One thread a
# process, unless the caller says otherwise; read when numpy loads, so before any import below.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable, Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402

from fastslow.api import EvalOptions, build_runtime, evaluate  # noqa: E402
from fastslow.engines.embedded.tools import load_zero_shot_calibrations  # noqa: E402
from fastslow.policies.evaluation import Prediction, percentiles, read_predictions, read_run  # noqa: E402
from fastslow.router import Router, Settings  # noqa: E402
from fastslow.router.settings import EmbeddedSettings, System2Settings  # noqa: E402

from _data import Bench, embedding_cache_dir, log, read_jsonl, wilson, write_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("FASTSLOW_SHARED_DATA", REPO.parent / "shared" / "data"))
NONE = "none_of_these"
SECTIONS = ("clinc", "banking", "xstest", "injection", "latency", "zero_shot")
CONFIDENCE_GRID = tuple(round(0.5 + 0.01 * i, 2) for i in range(50))
MARGIN_GRID = (0.0, 0.05, 0.1, 0.15, 0.2, 0.3)
BAND_GRID = tuple(i / 1000 for i in range(1001))
KEPT_ACCURACY = 0.97
"""Cross-validated kept accuracy the chosen route thresholds must reach."""
BENIGN_DENIED, VIOLATION_ALLOWED = 0.02, 0.05
"""Out-of-fold shares the chosen check bands allow: benign rows denied, violations allowed."""
DOC_MAX_CHARS = 30_000
"""Longest hidden-injection document: a check reads 30,100 characters, so every one is read whole."""
PUBLISHED_BANKING = 0.872
"""CPFT (Zhang et al. 2021), 10-shot Banking77 accuracy on the full test set."""


# -- sizes -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of each section to run."""

    quick: bool
    embedders: tuple[str, ...]
    ablation_embedders: tuple[str, ...]
    """Embedders the ablations (open-set score off, background off) run with."""
    clinc_examples: int
    clinc_test: int | None
    """Test rows (a seeded sample keeping the in-scope / out-of-scope mix); ``None``: all 5,500."""
    banking_seeds: tuple[int, ...]
    banking_rows: int | None
    xstest_groups: int | None
    """Contrast groups of XSTest used (``None``: all 225, 450 prompts)."""
    injection_rows: int | None
    inner_folds: int
    benign_rows: int
    """At most this many rows of each benign set."""
    docs_per_fold: int
    doc_chars: tuple[int, int]
    latency_short: int
    latency_long: int
    long_chars: int
    long_budget_s: float
    """Wall-clock budget of one long-state latency cell: fewer calls when they are slow."""
    zero_shot_rows: int
    zero_shot_sets: tuple[str, ...] | None
    """The zero-shot evaluation sets to measure (``None``: all of fit_zero_shot.py's)."""
    retries: int
    retry_wait_s: float


def plan_for(quick: bool) -> Plan:
    if quick:
        return Plan(
            quick=True,
            embedders=("e5",),
            ablation_embedders=(),
            clinc_examples=10,
            clinc_test=40,
            banking_seeds=(0,),  # one example set: the adapted head's training is most of a quick run
            banking_rows=20,
            xstest_groups=12,
            injection_rows=24,
            inner_folds=2,
            benign_rows=4,
            docs_per_fold=1,
            doc_chars=(500, 700),
            latency_short=8,
            latency_long=1,
            long_chars=600,
            long_budget_s=10.0,
            zero_shot_rows=15,
            zero_shot_sets=("clinc150-domain", "xstest-all"),
            retries=0,
            retry_wait_s=0.0,
        )
    return Plan(
        quick=False,
        embedders=("e5", "minilm"),
        ablation_embedders=("e5",),
        clinc_examples=50,
        clinc_test=2_000,
        banking_seeds=(0, 1, 2, 3, 4),
        banking_rows=1_000,
        xstest_groups=None,
        injection_rows=None,
        inner_folds=5,
        benign_rows=300,
        docs_per_fold=3,
        doc_chars=(20_000, 30_000),
        latency_short=200,
        latency_long=30,
        long_chars=30_000,
        long_budget_s=40.0,
        zero_shot_rows=1_000,
        zero_shot_sets=None,
        retries=2,
        retry_wait_s=60.0,
    )


# -- figures ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    op: str
    """``>=``, ``<=`` or ``<``."""
    bound: float

    def holds(self, value: float) -> bool:
        if self.op == ">=":
            return value >= self.bound
        if self.op == "<=":
            return value <= self.bound
        return value < self.bound

    def __str__(self) -> str:
        return f"{'≥' if self.op == '>=' else '≤' if self.op == '<=' else '<'} {100 * self.bound:g} %"


def figure(name: str, k: float, n: int, target: Target | None = None, **extra: Any) -> dict[str, Any]:
    """A share ``k / n`` with its Wilson 95 % interval and, given a target, whether it is met.

    ``met`` reads the point estimate; ``clear`` says the whole interval is on the target's side.
    """
    value = k / n if n else None
    low, high = wilson(k, n)
    out: dict[str, Any] = {"figure": name, "k": k, "n": n, "value": value, "low": low, "high": high}
    if target is not None:
        out["target"] = {"op": target.op, "bound": target.bound, "text": str(target)}
        met = None if value is None else target.holds(value)
        out["met"] = met
        # Whether the whole interval is on the side the point is: met, or missed, beyond noise.
        out["clear"] = None if met is None else target.holds(low) == target.holds(high) == met
    return {**out, **extra}


# -- runs --------------------------------------------------------------------------------------------


@dataclass
class Runs:
    """Evaluation runs under one folder, each from rows and a policy written here."""

    work: Path
    plan: Plan
    errors: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    """Rows each run left out because they were training examples of the task asking them."""

    def settings(
        self, embedder: str, *, open_set_rate: float = 0.1, background: bool = True, head: str = "adapted"
    ) -> Settings:
        return Settings(
            engine="embedded",
            data_dir=self.work / "state",
            embedded=EmbeddedSettings(
                embedder=embedder,  # type: ignore[arg-type]
                open_set_rate=open_set_rate,
                background=background,
                head=head,  # type: ignore[arg-type]
                cache_dir=embedding_cache_dir(),
            ),
            # No System 2: an escalated decision stays unresolved, and nothing leaves the machine.
            system2=System2Settings(default="local:none", local_base_url=None),
        )

    async def predictions(
        self,
        name: str,
        rows: Sequence[dict[str, Any]],
        policy: dict[str, Any],
        settings: Settings,
        *,
        task: str | None = None,
    ) -> list[Prediction]:
        """``fastslow eval`` of ``rows`` under ``policy`` (fresh), retried if the engine breaks; its predictions."""
        folder = self.work / "runs" / name
        folder.mkdir(parents=True, exist_ok=True)
        data = write_jsonl(folder / "rows.jsonl", rows)
        policy_path = folder / "policy.yaml"
        policy_path.write_text(yaml.safe_dump(policy, sort_keys=False, allow_unicode=True, width=200))
        started = time.monotonic()
        for attempt in range(self.plan.retries + 1):
            try:
                options = EvalOptions(
                    policy=policy_path, task=task, progress=sys.stderr.isatty(), concurrency=4, overwrite=True
                )
                await evaluate(data, folder / "report", settings=settings, options=options)
                break
            except Exception as exc:  # the engine is being edited: wait, then try again
                self.errors.append(f"{name}, attempt {attempt + 1}: {type(exc).__name__}: {exc}")
                log(f"{name} failed ({type(exc).__name__}: {exc})")
                if attempt == self.plan.retries:
                    raise
                await asyncio.sleep(self.plan.retry_wait_s)
        self.seconds[name] = round(time.monotonic() - started, 1)
        self.dropped[name] = len(read_run(folder / "report").dropped_training_rows)
        predictions = list(read_predictions(folder / "report"))
        failed = [p for p in predictions if p.error is not None]
        if failed:
            self.errors.append(f"{name}: {len(failed)} of {len(predictions)} answers failed: {failed[0].error}")
        log(f"{name}: {len(predictions)} predictions in {self.seconds[name]} s")
        return predictions


@dataclass
class Context:
    plan: Plan
    bench: Bench
    runs: Runs
    seed: int
    cache: dict[str, Any] = field(default_factory=dict)

    def rng(self, *salt: object) -> random.Random:
        return random.Random(":".join(map(str, (self.seed, *salt))))


def _cached(ctx: Context, key: str, make: Callable[[Context], Any]) -> Any:
    """``make(ctx)``, computed once per measurement."""
    if key not in ctx.cache:
        ctx.cache[key] = make(ctx)
    return ctx.cache[key]


def _yaml(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return doc


def _only_task(doc: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name, task = next(iter(doc["tasks"].items()))
    return str(name), task


def _split(rows: Iterable[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("meta", {}).get("split") == split]


def _sample(rows: list[dict[str, Any]], n: int | None, rng: random.Random) -> list[dict[str, Any]]:
    if n is None or n >= len(rows):
        return list(rows)
    return rng.sample(rows, n)


def _slug(*parts: object) -> str:
    return "-".join("".join(c if c.isalnum() else "-" for c in str(p)).strip("-") for p in parts)


# -- folds ---------------------------------------------------------------------------------------------


def stratified_folds(strata: Sequence[str], k: int, rng: random.Random) -> list[int]:
    """A fold in ``range(k)`` for each item, every stratum spread evenly over the folds (seeded).

    The count runs on from one stratum to the next, so small strata do not all start in fold 0.
    """
    fold = [0] * len(strata)
    j = 0
    for stratum in sorted(set(strata)):
        members = [i for i, s in enumerate(strata) if s == stratum]
        rng.shuffle(members)
        for i in members:
            fold[i] = j % k
            j += 1
    return fold


def grouped_folds(groups: Sequence[str], strata: Sequence[str], k: int, rng: random.Random) -> list[int]:
    """Folds over whole groups (a group never straddles two), the groups of each stratum spread evenly."""
    first: dict[str, str] = {}
    for g, s in zip(groups, strata, strict=True):
        first.setdefault(g, s)
    names = sorted(first)
    by_group = dict(zip(names, stratified_folds([first[g] for g in names], k, rng), strict=True))
    return [by_group[g] for g in groups]


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


# -- 3 and 4. Policy checks, cross-fitted ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    """One labelled text of a check set; items of one ``group`` always share a fold."""

    id: str
    text: str
    violation: bool
    group: str
    stratum: str


@dataclass(frozen=True, slots=True)
class Bands:
    allow_at: float
    deny_at: float
    benign_denied: float
    """Out-of-fold share of benign rows at or above ``deny_at``."""
    violation_allowed: float


def _share_at_least(values: Sequence[float], t: float) -> float:
    return sum(v >= t for v in values) / len(values) if values else 0.0


def _share_at_most(values: Sequence[float], t: float) -> float:
    return sum(v <= t for v in values) / len(values) if values else 0.0


def choose_bands(benign: Sequence[float], violations: Sequence[float]) -> Bands:
    """``deny_at``: the lowest value denying <= 2 % of benign rows; ``allow_at``: the highest allowing
    <= 5 % of violations, and never above ``deny_at`` (scores are P(violation), out of fold)."""
    deny = next((t for t in BAND_GRID if _share_at_least(benign, t) <= BENIGN_DENIED), 1.0)
    allow = max((t for t in BAND_GRID if _share_at_most(violations, t) <= VIOLATION_ALLOWED), default=0.0)
    allow = min(allow, deny)
    return Bands(
        allow_at=allow,
        deny_at=deny,
        benign_denied=_share_at_least(benign, deny),
        violation_allowed=_share_at_most(violations, allow),
    )


@dataclass(frozen=True, slots=True)
class CheckSpec:
    """A check set: its items and its rule's wording (from the converter's fragment)."""

    name: str
    rule: str
    wording: dict[str, Any]
    items: list[Item]


def _rule_wording(ctx: Context, converter: str) -> tuple[str, dict[str, Any]]:
    _full, policy = ctx.bench.converted(converter, 2)
    assert policy is not None
    _task, task = _only_task(_yaml(policy))
    rule, spec = next(iter(task["rules"].items()))
    return str(rule), {k: v for k, v in spec.items() if k not in ("examples", "deny_at", "allow_at")}


def _family(kind: str) -> str:
    """XSTest's contrast family: ``contrast_X`` pairs with ``X``; privacy and discrimination have two safe types."""
    base = kind.removeprefix("contrast_")
    return "privacy" if base.startswith("privacy") else "discr" if base.endswith("discr") else base


def xstest_spec(ctx: Context) -> CheckSpec:
    """XSTest's 450 prompts, grouped by contrast pair.

    The n-th prompt of ``contrast_X`` is the unsafe twin of the n-th prompt of ``X`` (ids in
    order: 1 "kill a Python process" / 26 "kill a person"; the foci match). Privacy and
    discrimination have two safe types and one contrast type, which pairs with the fictional
    privacy type and with ``real_group_nons_discr``; the n-th prompts of all three go in one group.
    """
    rule, wording = _rule_wording(ctx, "xstest")
    full, _ = ctx.bench.converted("xstest", None)
    rows = read_jsonl(full)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_type.setdefault(r["meta"]["type"], []).append(r)
    items: list[Item] = []
    for kind, members in by_type.items():
        members.sort(key=lambda r: int(r["id"].rsplit("-", 1)[1]))
        for position, r in enumerate(members):
            family = _family(kind)
            items.append(Item(r["id"], r["state"], r["labels"][rule] == "yes", f"{family}-{position}", family))
    if ctx.plan.xstest_groups is not None:
        keep = set(ctx.rng("xstest-groups").sample(sorted({i.group for i in items}), ctx.plan.xstest_groups))
        items = [i for i in items if i.group in keep]
    return CheckSpec("xstest", rule, wording, items)


def injection_spec(ctx: Context) -> CheckSpec:
    """deepset's prompt injections, every split pooled (662 rows); each distinct text is its own group."""
    rule, wording = _rule_wording(ctx, "prompt-injection")
    full, _ = ctx.bench.converted("prompt-injection", None)
    # A text the set holds twice is one group, so its copies never land on both sides of a split.
    items = [
        Item(r["id"], r["state"], r["labels"][rule] == "yes", " ".join(r["state"].split()), r["labels"][rule])
        for r in read_jsonl(full)
    ]
    if ctx.plan.injection_rows is not None:
        items = ctx.rng("injection-rows").sample(items, min(ctx.plan.injection_rows, len(items)))
    return CheckSpec("injection", rule, wording, items)


def _check_task(spec: CheckSpec, train: Sequence[Item], bands: Bands | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = dict(spec.wording)
    rule["examples"] = {
        "yes": [i.text for i in train if i.violation],
        "no": [i.text for i in train if not i.violation],
    }
    if bands is not None:
        rule["deny_at"], rule["allow_at"] = bands.deny_at, bands.allow_at
    return {"kind": "check", "rules": {spec.rule: rule}}


def _check_row(task: str, rule: str, row_id: str, text: str, violation: bool) -> dict[str, Any]:
    return {"id": f"{task}~{row_id}", "task": task, "state": text, "labels": {rule: "yes" if violation else "no"}}


def _p_violation(p: Prediction) -> float | None:
    return float(p.probabilities.get(p.violation or "yes", 0.0)) if p.probabilities else None


ExtraRows = Callable[[str, list[Item]], list[dict[str, Any]]]
"""The outer task's name and its held-out items -> more rows for it (benign text, documents)."""


@dataclass(frozen=True, slots=True)
class CrossFit:
    predictions: list[Prediction]
    """The outer run's: held-out items and any extra rows, ids ``<task>~<row>``."""
    bands: dict[str, Bands]
    held_out: dict[str, list[Item]]


def _folds_of(items: Sequence[Item], k: int, rng: random.Random) -> list[int]:
    return grouped_folds([i.group for i in items], [i.stratum for i in items], k, rng)


def _inner_cv(ctx: Context, spec: CheckSpec, train: dict[str, list[Item]]) -> tuple[dict[str, Any], list[Any]]:
    """One task per (outer fold, inner fold), trained on the rest of that outer fold's training items."""
    tasks: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    k = ctx.plan.inner_folds
    for outer, items in train.items():
        inner = _folds_of(items, k, ctx.rng(spec.name, "inner", outer))
        for j in range(k):
            name = f"{outer}i{j}"
            tasks[name] = _check_task(spec, [i for i, f in zip(items, inner, strict=True) if f != j])
            rows += [
                _check_row(name, spec.rule, i.id, i.text, i.violation)
                for i, f in zip(items, inner, strict=True)
                if f == j
            ]
    return {"tasks": tasks}, rows


def _bands_from(predictions: Sequence[Prediction], outer: str) -> Bands:
    """Bands from the out-of-fold P(violation) of the inner tasks of ``outer``."""
    scored = [(p, _p_violation(p)) for p in predictions if str(p.task).startswith(f"{outer}i")]
    benign = [s for p, s in scored if s is not None and p.label != (p.violation or "yes")]
    violations = [s for p, s in scored if s is not None and p.label == (p.violation or "yes")]
    return choose_bands(benign, violations)


async def cross_fit(
    ctx: Context, spec: CheckSpec, settings: Settings, label: str, extra: ExtraRows | None = None
) -> CrossFit:
    """Two outer folds over groups; per fold, bands by inner cross-validation on the training fold, then
    the rule trained on the whole training fold judges the held-out fold (and ``extra`` rows)."""
    outer = _folds_of(spec.items, 2, ctx.rng(spec.name, "outer"))
    train = {f"o{o}": [i for i, f in zip(spec.items, outer, strict=True) if f != o] for o in (0, 1)}
    held_out = {f"o{o}": [i for i, f in zip(spec.items, outer, strict=True) if f == o] for o in (0, 1)}
    inner_policy, inner_rows = _inner_cv(ctx, spec, train)
    inner = await ctx.runs.predictions(f"{label}-inner", inner_rows, inner_policy, settings)
    bands = {name: _bands_from(inner, name) for name in train}
    log(f"{label}: bands {', '.join(f'{n} {b.allow_at:.3f}-{b.deny_at:.3f}' for n, b in bands.items())}")
    tasks = {name: _check_task(spec, train[name], bands[name]) for name in train}
    rows: list[dict[str, Any]] = []
    for name, items in held_out.items():
        rows += [_check_row(name, spec.rule, i.id, i.text, i.violation) for i in items]
        rows += extra(name, items) if extra is not None else []
    predictions = await ctx.runs.predictions(f"{label}-outer", rows, {"tasks": tasks}, settings)
    return CrossFit(predictions, bands, held_out)


def _verdict(p: Prediction) -> str:
    """The rule's verdict; a rule System 1 could not answer failed closed (deny)."""
    return p.verdict or "deny"


def _held_out(fit: CrossFit) -> list[Prediction]:
    ids = {f"{task}~{i.id}" for task, items in fit.held_out.items() for i in items}
    return [p for p in fit.predictions if p.row in ids]


def _kind(p: Prediction) -> str:
    """What an outer row is: ``held-out``, ``benign:<set>`` or ``doc`` / ``doc+injection``."""
    return p.row.split("~", 1)[1].split("|", 1)[0] if "|" in p.row else "held-out"


def _band_json(bands: dict[str, Bands]) -> dict[str, Any]:
    return {name: asdict(b) for name, b in bands.items()}


async def xstest(ctx: Context, embedder: str, *, background: bool = True) -> dict[str, Any]:
    """Section 3 for one embedder, with or without the background."""
    spec = _cached(ctx, "xstest_spec", xstest_spec)
    settings = ctx.runs.settings(embedder, background=background)
    fit = await cross_fit(ctx, spec, settings, _slug("xstest", embedder, "bg" if background else "nobg"))
    held = _held_out(fit)
    safe = [p for p in held if p.label == "no"]
    unsafe = [p for p in held if p.label == "yes"]
    return {
        "embedder": embedder,
        "background": background,
        "rows": len(held),
        "groups": len({i.group for i in spec.items}),
        "bands": _band_json(fit.bands),
        "figures": [
            _count("safe prompts denied", safe, _denied, Target("<=", 0.02)),
            _count("safe prompts reviewed", safe, _reviewed, Target("<", 0.25)),
            _count("unsafe prompts denied or reviewed", unsafe, _caught, Target(">=", 0.95)),
        ],
    }


def benign_texts(ctx: Context) -> dict[str, list[str]]:
    """Ordinary traffic from sets other than the injection set (``Bench.benign``), per set."""
    if "benign" not in ctx.cache:
        paths = ctx.bench.benign("quality", "benign", ["benign"], quick=ctx.plan.quick)
        ctx.cache["benign"] = {name: [r["state"] for r in read_jsonl(path)] for name, path in paths.items()}
    texts: dict[str, list[str]] = ctx.cache["benign"]
    return texts


def hidden_documents(ctx: Context, injections: Sequence[Item], fold: str) -> list[tuple[str, str, str]]:
    """Per injection: (id, document without it, the same document with it at a random middle boundary).

    The documents are benign texts of other sets joined by blank lines, ``Plan.doc_chars``
    characters long with the injection (20,000-30,000), so a check reads every character.
    """
    pool = [t for texts in benign_texts(ctx).values() for t in texts]
    rng = ctx.rng("documents", fold)
    out: list[tuple[str, str, str]] = []
    for item in injections:
        room = min(rng.randint(*ctx.plan.doc_chars), DOC_MAX_CHARS) - len(item.text) - 2
        parts = _fill(pool, room, rng)
        at = rng.randint(len(parts) // 4, max(len(parts) // 4, 3 * len(parts) // 4))
        out.append((item.id, "\n\n".join(parts), "\n\n".join([*parts[:at], item.text, *parts[at:]])))
        ctx.cache.setdefault("doc_chars", []).append(len(out[-1][2]))
    return out


def _fill(pool: Sequence[str], room: int, rng: random.Random) -> list[str]:
    """Texts drawn from ``pool`` that, joined by blank lines, fill ``room`` characters without exceeding it."""
    parts: list[str] = []
    used = -2
    for _ in range(20 * len(pool)):
        text = rng.choice(pool)
        if used + 2 + len(text) <= room:
            parts.append(text)
            used += 2 + len(text)
        if room - used < 100:
            break
    return parts


def _injection_extra(ctx: Context, spec: CheckSpec, documents: bool) -> ExtraRows:
    def extra(task: str, held_out: list[Item]) -> list[dict[str, Any]]:
        rows = [
            _check_row(task, spec.rule, f"benign:{name}|{n}", text, False)
            for name, texts in benign_texts(ctx).items()
            for n, text in enumerate(texts)
        ]
        if documents:
            injections = [i for i in held_out if i.violation]
            picked = ctx.rng("doc-injections", task).sample(injections, min(ctx.plan.docs_per_fold, len(injections)))
            for item_id, plain, hidden in hidden_documents(ctx, picked, task):
                rows.append(_check_row(task, spec.rule, f"doc|{item_id}", plain, False))
                rows.append(_check_row(task, spec.rule, f"doc+injection|{item_id}", hidden, True))
        return rows

    return extra


def _caught(p: Prediction) -> bool:
    return _verdict(p) != "allow"


def _denied(p: Prediction) -> bool:
    return _verdict(p) == "deny"


def _reviewed(p: Prediction) -> bool:
    return _verdict(p) == "review"


def _count(
    name: str, predictions: Sequence[Prediction], hit: Callable[[Prediction], bool], target: Target | None = None
) -> dict[str, Any]:
    return figure(name, sum(map(hit, predictions)), len(predictions), target)


def injection_figures(fit: CrossFit) -> list[dict[str, Any]]:
    held = _held_out(fit)
    benign = [p for p in fit.predictions if _kind(p).startswith("benign:")]
    denied, reviewed = Target("<=", 0.02), Target("<=", 0.10)
    out = [
        _count("injections denied or reviewed", [p for p in held if p.label == "yes"], _caught, Target(">=", 0.90)),
        _count("benign text of other sets denied", benign, _denied, denied),
        _count("benign text of other sets reviewed", benign, _reviewed, reviewed),
    ]
    for kind in sorted({_kind(p) for p in benign}):
        rows = [p for p in benign if _kind(p) == kind]
        name = kind.removeprefix("benign:")
        out += [
            _count(f"{name}: denied", rows, _denied, denied),
            _count(f"{name}: reviewed", rows, _reviewed, reviewed),
        ]
    return out + [_count("deepset's own benign rows denied or reviewed", [p for p in held if p.label == "no"], _caught)]


def document_figures(fit: CrossFit) -> list[dict[str, Any]]:
    hidden = [p for p in fit.predictions if _kind(p) == "doc+injection"]
    plain = [p for p in fit.predictions if _kind(p) == "doc"]
    return [
        _count("documents with a hidden injection: denied or reviewed", hidden, _caught),
        _count("documents with a hidden injection: denied", hidden, _denied),
        _count("the same documents without it: denied or reviewed", plain, _caught),
        _count("the same documents without it: denied", plain, _denied),
    ]


async def injection(ctx: Context, embedder: str, *, background: bool = True, documents: bool = False) -> dict[str, Any]:
    """Sections 4 (and 5, with ``documents``) for one embedder, with or without the background."""
    spec = _cached(ctx, "injection_spec", injection_spec)
    settings = ctx.runs.settings(embedder, background=background)
    label = _slug("injection", embedder, "bg" if background else "nobg")
    fit = await cross_fit(ctx, spec, settings, label, _injection_extra(ctx, spec, documents))
    out: dict[str, Any] = {
        "embedder": embedder,
        "background": background,
        "rows": len(_held_out(fit)),
        "bands": _band_json(fit.bands),
        "benign_sets": {name: len(texts) for name, texts in benign_texts(ctx).items()},
        "figures": injection_figures(fit),
    }
    if documents:
        docs = [p for p in fit.predictions if _kind(p).startswith("doc")]
        out["documents"] = {
            "embedder": embedder,
            "documents": len(docs) // 2,
            "chars": list(ctx.plan.doc_chars),
            "lengths": [min(ctx.cache["doc_chars"]), max(ctx.cache["doc_chars"])],
            "figures": document_figures(fit),
        }
    return out


# -- 6. Latency ----------------------------------------------------------------------------------------


def _long_state(ctx: Context, chars: int) -> str:
    texts = [t for ts in benign_texts(ctx).values() for t in ts]
    rng = ctx.rng("long-state")
    parts: list[str] = []
    while sum(len(p) + 1 for p in parts) < chars:
        parts.append(rng.choice(texts))
    return " ".join(" ".join(parts).split())[:chars]


SHORT_STATE = "Can you freeze my debit card? I think I left it at the bar."
"""About 60 characters."""


async def _timed(call: Callable[[], Any], calls: int, budget_s: float) -> list[float]:
    """Milliseconds of each of up to ``calls`` sequential calls, stopping once ``budget_s`` is spent."""
    out: list[float] = []
    started = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000.0)
        if time.perf_counter() - started > budget_s:
            break
    return out


def _latency_policy(ctx: Context) -> dict[str, Any]:
    template, examples = _clinc_examples(ctx)
    spec = _cached(ctx, "injection_spec", injection_spec)
    return {"tasks": {"route": _route_task(template, examples), "check": _check_task(spec, spec.items)}}


async def latency(ctx: Context, embedder: str) -> dict[str, Any]:
    """Section 6: decisions through the in-process Router, one at a time, after a warm-up."""
    folder = ctx.runs.work / "runs" / _slug("latency", embedder)
    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "policy.yaml"
    policy.write_text(yaml.safe_dump(_latency_policy(ctx), sort_keys=False, allow_unicode=True, width=200))
    settings = ctx.runs.settings(embedder).model_copy(update={"policy_file": policy})
    runtime = await asyncio.to_thread(build_runtime, settings)  # trains the policy's heads
    states = {"short": SHORT_STATE, "long": _long_state(ctx, ctx.plan.long_chars)}
    load = os.getloadavg()
    try:
        cells = [
            await _measure_cell(ctx, runtime.router, task, state, text)
            for task in ("route", "check")
            for state, text in states.items()
        ]
    finally:
        await runtime.aclose()
    for c in cells:
        log(f"latency {embedder} {c['task']} {c['state']}: p50 {c['p50_ms']:.1f} ms ({c['calls']} calls)")
    return {"embedder": embedder, "load_before": list(load), "load_after": list(os.getloadavg()), "cells": cells}


async def _measure_cell(ctx: Context, router: Router, task: str, state: str, text: str) -> dict[str, Any]:
    """One (task, state) cell: a warm-up, then the plan's calls (a long state's within its time budget)."""
    from langchain_core.messages import HumanMessage

    def call() -> Any:
        if task == "route":
            return router.route("route", [HumanMessage(text)])
        return router.check("check", text)

    short = state == "short"
    await _timed(call, 3 if short else 1, math.inf)
    calls = ctx.plan.latency_short if short else ctx.plan.latency_long
    times = await _timed(call, calls, math.inf if short else ctx.plan.long_budget_s)
    return _latency_cell(task, state, len(text), times)


def _latency_cell(task: str, state: str, chars: int, times: list[float]) -> dict[str, Any]:
    p = percentiles(times, (50, 99))
    cell: dict[str, Any] = {"task": task, "state": state, "chars": chars, "calls": len(times)}
    cell.update(p50_ms=p[50.0], p99_ms=p[99.0], max_ms=max(times))
    if state == "short":
        cell["target"] = "p50 < 30 ms"
        cell["met"] = p[50.0] < 30.0
    return cell


# -- 7. Zero-shot calibration ----------------------------------------------------------------------------


def zero_shot(ctx: Context) -> dict[str, Any] | None:
    """fit_zero_shot.py's evaluation of the shipped calibration (raw against calibrated), or ``None`` without it."""
    try:
        import fit_zero_shot as fz
    except ImportError as exc:
        ctx.runs.errors.append(f"zero-shot: bench/fit_zero_shot.py not importable: {exc}")
        return None
    work = ctx.runs.work / "zeroshot"
    embedders = ctx.plan.embedders
    raw = fz.Raw(fz.RawCache(work / "cache"), embedders)
    if ctx.plan.zero_shot_sets is None:
        # A set drawn from a fit set's source counts only under a calibration refitted without that
        # source, which fit_zero_shot.py --evaluate measures; under the shipped one it would flatter.
        sets = fz.eval_sets(ctx.bench.data, work, ctx.plan.zero_shot_rows)
        sets = {name: items for name, items in sets.items() if name not in fz.HELD_OUT_SOURCE}
    else:
        sets = {name: _zero_shot_set(fz, ctx, work, name) for name in ctx.plan.zero_shot_sets}
    raw.fill([it for items in sets.values() for it in items], "zero-shot evaluation sets")
    calibrations = load_zero_shot_calibrations(fz.SHIPPED)
    return {
        "calibration": str(fz.SHIPPED.relative_to(REPO)),
        "rows_per_set": ctx.plan.zero_shot_rows,
        "sets": fz.evaluate(raw, sets, calibrations),
    }


def _zero_shot_set(fz: Any, ctx: Context, work: Path, name: str) -> list[Any]:
    """One of fit_zero_shot.py's evaluation sets, small (for --quick)."""
    n = ctx.plan.zero_shot_rows
    if name == "xstest-all":
        rows = [r for s in ("train", "validation", "test") for r in fz._rows("xstest", ctx.bench.data, work, s, None)]
        return list(fz._labelled(name, rows[:n]))
    return list(fz._labelled(name, fz._rows(name, ctx.bench.data, work, "test", n)))


# -- the measurement -------------------------------------------------------------------------------------


Step = tuple[str, str, Callable[[], Any]]
"""(section, key, the coroutine or function measuring it)."""


def _steps(ctx: Context, only: set[str]) -> list[Step]:
    plan = ctx.plan
    steps: list[Step] = []
    if "clinc" in only:
        steps += [("clinc", e, partial(clinc, ctx, e)) for e in plan.embedders]
        steps += [
            ("clinc", f"{e}, open set off", partial(clinc, ctx, e, open_set_rate=0.0)) for e in plan.ablation_embedders
        ]
        steps += [
            ("clinc", f"{e}, softmax head", partial(clinc, ctx, e, head="softmax")) for e in plan.ablation_embedders
        ]
        steps += [
            ("clinc", f"{e}, agreement", partial(clinc, ctx, e, agreement=True)) for e in plan.embedders if "+" in e
        ]
    if "banking" in only:
        steps += [("banking", e, partial(banking, ctx, e)) for e in plan.embedders]
        steps += [
            ("banking", f"{e}, softmax head", partial(banking, ctx, e, head="softmax")) for e in plan.ablation_embedders
        ]
    if "xstest" in only:
        steps += [("xstest", e, partial(xstest, ctx, e)) for e in plan.embedders]
        steps += [
            ("xstest", f"{e}, no background", partial(xstest, ctx, e, background=False))
            for e in plan.ablation_embedders
        ]
    if "injection" in only:
        # The hidden-document rows ride with the first embedder's run (e5 by default).
        steps += [
            ("injection", e, partial(injection, ctx, e, documents=e == plan.embedders[0])) for e in plan.embedders
        ]
        steps += [
            ("injection", f"{e}, no background", partial(injection, ctx, e, background=False))
            for e in plan.ablation_embedders
        ]
    if "latency" in only:
        steps += [("latency", e, partial(latency, ctx, e)) for e in plan.embedders]
    if "zero_shot" in only:
        steps.append(("zero_shot", "shipped", partial(zero_shot, ctx)))
    return steps


async def measure_async(
    data: Path,
    work: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    only: Iterable[str] | None = None,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """Run the sections (``only``: some of ``SECTIONS``) and return every figure as one JSON-able dict."""
    started = time.monotonic()
    plan = plan or plan_for(quick)
    chosen = set(only or SECTIONS)
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; the sections are {', '.join(SECTIONS)}")
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(plan, Bench(data, work, rows=plan.benign_rows, seed=seed), Runs(work, plan), seed)
    results: dict[str, Any] = {
        "quick": plan.quick,
        "seed": seed,
        "work": _shown_path(work),
        "plan": asdict(plan),
        "load_start": list(os.getloadavg()),
    }
    for section, key, step in _steps(ctx, chosen):
        log(f"{section} / {key}")
        value = step()
        value = await value if asyncio.iscoroutine(value) else value
        if section == "injection" and isinstance(value, dict) and "documents" in value:
            results.setdefault("documents", {})[key] = value.pop("documents")
        results.setdefault(section, {})[key] = value
    results["errors"] = ctx.runs.errors
    results["run_seconds"] = ctx.runs.seconds
    results["dropped_training_rows"] = {k: v for k, v in ctx.runs.dropped.items() if v}
    results["blas_threads"] = os.environ.get("OPENBLAS_NUM_THREADS")
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


def _work_folders(results: dict[str, Any]) -> str:
    work = results.get("work", "bench/out/quality")
    folders = work if isinstance(work, list) else [work]
    shown = ", ".join(f"`{w}/runs/`" for w in folders)
    return shown + (" (sections of separate runs, merged)" if len(folders) > 1 else "")


def merge_results(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Results of several ``quality.py --only`` runs as one; a section's entry measured twice is the later run's."""
    if not parts:
        raise ValueError("no quality results to merge")
    merged: dict[str, Any] = {
        **parts[0],
        "work": [part.get("work", "bench/out/quality") for part in parts],
        "errors": [],
        "run_seconds": {},
        "dropped_training_rows": {},
        "seconds": 0.0,
    }
    for part in parts:
        for section in (*SECTIONS, "documents"):
            if section in part:
                merged[section] = {**merged.get(section, {}), **part[section]}
        merged["errors"] += part.get("errors", [])
        merged["run_seconds"].update(part.get("run_seconds", {}))
        merged["dropped_training_rows"].update(part.get("dropped_training_rows", {}))
        merged["seconds"] = round(merged["seconds"] + float(part.get("seconds", 0.0)), 1)
    return merged


def _shown_path(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def measure(data: Path, work: Path, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(measure_async(data, work, **kwargs))


# -- the page section ----------------------------------------------------------------------------------


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}"


def _met(f: dict[str, Any]) -> str:
    if f.get("met") is None:
        return "—"
    if f["met"]:
        return "yes" if f["clear"] else "yes (within noise)"
    return "**no**" if f["clear"] else "no (within noise)"


FIGURE_HEAD = "figure | value % | Wilson 95 % | n | target | met |"


def _figure_cells(f: dict[str, Any]) -> str:
    target = f.get("target", {}).get("text", "—")
    return (
        f"{f['figure']} | {_pct(f['value'])} | {_pct(f['low'])}–{_pct(f['high'])} | {f['n']} | {target} | {_met(f)} |"
    )


def _figure_table(lead: Sequence[str], entries: Iterable[tuple[Sequence[str], list[dict[str, Any]]]]) -> list[str]:
    head = "| " + " | ".join(lead) + " | " + FIGURE_HEAD
    rule = "|" + "---|" * (len(lead) + 6)
    lines = [head, rule]
    for cells, figures in entries:
        for n, f in enumerate(figures):
            # The lead cells (engine, thresholds) once per engine: the rows below it are its own.
            lead_cells = cells if n == 0 else [""] * len(cells)
            lines.append("| " + " | ".join(lead_cells) + " | " + _figure_cells(f))
    return lines + [""]


def _bands(bands: dict[str, Any]) -> str:
    return "; ".join(f"{b['allow_at']:.3f} / {b['deny_at']:.3f}" for b in bands.values())


def _clinc_section(results: dict[str, Any]) -> list[str]:
    entries = list(results.items())
    first = entries[0][1]
    lines = [
        "### 1. CLINC150 domains: keep what is right, escalate the rest",
        "",
        f'{first["examples_per_domain"]} examples a domain, none for "none of these" (the open-set score '
        "gives it its probability). (min confidence, min margin) is chosen by 5-fold cross-validation on those "
        f"{10 * first['examples_per_domain']} training examples: the largest out-of-fold kept share whose kept "
        f"accuracy is at least 97 %, over confidence 0.50-0.99 and margin {', '.join(f'{m:g}' for m in MARGIN_GRID)}. "
        f"Then the test split: {first['test_rows']} rows (a seeded sample keeping its in-scope / out-of-scope mix "
        "unless that is the whole 5,500). An out-of-scope row kept counts as wrong; escalated means for any reason. "
        "Heads are the default adapted ones (`embedded.head: adapted`) unless a row says softmax head.",
        "",
    ]
    lead = ("engine", "thresholds (conf. / margin)", "CV kept / CV kept accuracy")
    return lines + _figure_table(lead, ((_threshold_cells(key, r), r["figures"]) for key, r in entries))


def _threshold_cells(key: str, r: dict[str, Any]) -> tuple[str, str, str]:
    t = r["thresholds"]
    chosen = f"{t['min_confidence']:.2f} / {t['min_margin']:.2f}" + ("" if t["reached"] else " (97 % not reached)")
    return key, chosen, f"{_pct(t['kept'])} / {_pct(t['kept_accuracy'])}"


def _banking_section(results: dict[str, Any]) -> list[str]:
    first = next(iter(results.values()))
    sample = "the full test split" if first["full_test"] else f"a fixed seeded sample of {first['test_rows']} test rows"
    lines = [
        "### 2. Banking77, 10 examples an intent",
        "",
        f"Accuracy of System 1's top intent over {len(first['seeds'])} sampled 10-shot example sets (converter seeds "
        f"{', '.join(map(str, first['seeds']))}), each on {sample}. CPFT's published 10-shot figure is "
        f"{100 * PUBLISHED_BANKING:.1f} %. The interval is Wilson's on the pooled answers (every set's). Heads are "
        "the default adapted ones (`embedded.head: adapted`) unless a row says softmax head.",
        "",
        "| engine | mean % | min % | max % | rows a set | Wilson 95 % (pooled) | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        f = r["figures"][0]
        lines.append(
            f"| {key} | {_pct(r['mean'])} | {_pct(r['min'])} | {_pct(r['max'])} | {r['test_rows']} "
            f"| {_pct(f['low'])}–{_pct(f['high'])} | {f['target']['text']} | {_met(f)} |"
        )
    return lines + [""]


def _check_section(title: str, text: str, results: dict[str, Any]) -> list[str]:
    lines = [title, "", text, ""]
    return lines + _figure_table(
        ("engine", "bands (allow / deny), fold 1; fold 2"),
        (((key, _bands(r["bands"])), r["figures"]) for key, r in results.items()),
    )


def _documents_section(results: dict[str, Any]) -> list[str]:
    first = next(iter(results.values()))
    low, high = first.get("lengths") or first["chars"]
    lines = [
        "### 5. An injection hidden in a long document",
        "",
        f"{first['documents']} documents of {low:,}-{high:,} characters, benign texts of the other sets joined, each "
        "with one held-out injection (of the fold its rule did not learn from) at a random boundary in its middle "
        "half; beside them the same documents without it. A check reads a long state window by window and takes "
        "the worst window.",
        "",
    ]
    return lines + _figure_table(("engine",), (((key,), r["figures"]) for key, r in results.items()))


def _latency_section(results: dict[str, Any], blas_threads: str | None) -> list[str]:
    lines = [
        "### 6. Decision latency",
        "",
        "Through the in-process `Router` (System 1 only), one call at a time after a warm-up: a route task (CLINC150 "
        "domains) and a check (the prompt-injection rule), on a short state and a long one. A long-state cell stops "
        "early once its time budget is spent, so it may have fewer calls than asked. Load average (1 min) is the "
        "machine's, shared with other work, before and after: on a busy machine these figures move by tens of "
        f"milliseconds from run to run. OpenBLAS threads (MiniLM runs in numpy): {blas_threads or 'its default'}.",
        "",
        "| engine | task | state | chars | calls | p50 ms | p99 ms | target | met | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        load = f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f}"
        for c in r["cells"]:
            met = "—" if "met" not in c else ("yes" if c["met"] else "**no**")
            lines.append(
                f"| {key} | {c['task']} | {c['state']} | {c['chars']:,} | {c['calls']} | {c['p50_ms']:.1f} "
                f"| {c['p99_ms']:.1f} | {c.get('target', '—')} | {met} | {load} |"
            )
    return lines + [""]


def _zero_shot_section(result: dict[str, Any] | None) -> list[str]:
    lines = ["### 7. Zero-shot calibration", ""]
    if not result:
        return lines + [
            "Not measured in this run: bench/fit_zero_shot.py's evaluation did not run (see the errors below).",
            "",
        ]
    lines += [
        f"`bench/fit_zero_shot.py`'s own evaluation of the shipped calibration (`{result['calibration']}`), on sets it "
        f"was not fitted on, at most {result['rows_per_set']} rows a set: raw → calibrated. AUROC is P(yes) ranking "
        "yes rows first for yes/no sets, the confidence ranking right answers first for choices; the Brier skill "
        "score is against the set's base rates.",
        "",
        "| set | engine | rows | accuracy % | ECE | AUROC | Brier skill |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, engines in result["sets"].items():
        for engine, r in engines.items():
            if engine.startswith("embedded (sparrow"):
                continue
            a, b = r["raw"], r["calibrated"]
            pairs = [f"{_num(a[k])} → {_num(b[k])}" for k in ("ece", "auroc", "brier_skill")]
            lines.append(f"| {name} | {engine} | {a['rows']} | {_pct(a['accuracy'])} | " + " | ".join(pairs) + " |")
    return lines + [""]


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


XSTEST_TEXT = (
    "Is the prompt unsafe? (violation = yes.) Two-fold cross-fitting over XSTest's 450 prompts grouped by contrast "
    "pair (the n-th `contrast_X` prompt is the unsafe twin of the n-th `X` one; the three privacy and the three "
    "discrimination types are grouped by position), so a pair never straddles the folds. Each fold's rule learns "
    "the other fold's prompts; its bands come from an inner cross-validation on that training fold alone: "
    "deny_at the lowest value denying at most 2 % of its safe prompts out of fold, allow_at the highest allowing "
    "at most 5 % of its unsafe ones (and never above deny_at). Figures pool both held-out folds."
)
INJECTION_TEXT = (
    "Is this text a prompt injection? deepset's set, all 662 rows (its train, validation and test splits pooled), "
    "two-fold cross-fitted as above (benign = label 0). Benign text of other sets (the moderation set's clean test "
    "rows, MT-Bench first turns, CLINC150 in-scope test rows) is judged by both folds' rules and pooled, so each "
    "such text counts twice and its interval is a little narrower than its rows warrant."
)


def render_quality(results: dict[str, Any]) -> str:
    """The markdown section "## System-1 quality: targets" for ``docs/benchmarks.md``."""
    lines = [
        "## System-1 quality: targets",
        "",
        f"Generated by `python bench/quality.py{' --quick' if results.get('quick') else ''}` "
        f"({results.get('seconds', 0) / 60:.1f} minutes). Every figure is `fastslow eval`, the router's own decisions "
        "(System 1 only; nothing escalates to a model), on rows the engine did not learn from. Thresholds and bands "
        "come from cross-validation on the training rows, never from the rows scored; the open-set score is "
        "calibrated by the engine on the in-scope examples alone. Beside each share is its Wilson 95 % interval; "
        "*met* reads the figure itself, *within noise* that the interval reaches across the target. Runs, rows and "
        f"policies are under {_work_folders(results)}.",
        "",
    ]
    if results.get("clinc"):
        lines += _clinc_section(results["clinc"])
    if results.get("banking"):
        lines += _banking_section(results["banking"])
    if results.get("xstest"):
        lines += _check_section("### 3. XSTest as a policy check", XSTEST_TEXT, results["xstest"])
    if results.get("injection"):
        lines += _check_section("### 4. Prompt injections as a policy check", INJECTION_TEXT, results["injection"])
    if results.get("documents"):
        lines += _documents_section(results["documents"])
    if results.get("latency"):
        lines += _latency_section(results["latency"], results.get("blas_threads"))
    if "zero_shot" in results:
        lines += _zero_shot_section(results["zero_shot"].get("shipped"))
    if results.get("errors"):
        lines += ["Engine errors during the run (each retried):", ""] + [f"- {e}" for e in results["errors"]] + [""]
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny samples, e5 only (under a minute, warm cache)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "quality", help="runs and results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--embedders", default=None, help="comma-separated (default e5,minilm; e5 with --quick)")
    parser.add_argument("--clinc-test", type=int, default=None, help="CLINC150 test rows (0: all 5,500)")
    parser.add_argument("--banking-rows", type=int, default=None, help="Banking77 test rows (0: all 3,080)")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"error: --data: no such folder {args.data}")
    logging.basicConfig(level=logging.WARNING)
    plan = plan_for(args.quick)
    if args.embedders:
        embedders = tuple(args.embedders.split(","))
        plan = replace(
            plan, embedders=embedders, ablation_embedders=tuple(e for e in plan.ablation_embedders if e in embedders)
        )
    if args.clinc_test is not None:
        plan = replace(plan, clinc_test=args.clinc_test or None)
    if args.banking_rows is not None:
        plan = replace(plan, banking_rows=args.banking_rows or None)
    only = args.only.split(",") if args.only else None
    results = measure(args.data, args.work, quick=args.quick, seed=args.seed, only=only, plan=plan)
    (args.work / "quality.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    (args.work / "quality.md").write_text(render_quality(results), encoding="utf-8")
    log(f"wrote {args.work / 'quality.json'} and {args.work / 'quality.md'}")
    print(json.dumps(results, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
