"""How ``bench/quality.py`` cross-fits a policy check (sections 3 to 5): the check sets, their folds, the bands.

Bands are chosen by an inner cross-validation on each outer fold's training items, never on the
rows they are scored on.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from _quality_core import Context, _only_task, _yaml, grouped_folds

from fastslow.policies.evaluation import Prediction
from fastslow.router import Settings

from _data import log, read_jsonl

BAND_GRID = tuple(i / 1000 for i in range(1001))
BENIGN_DENIED, VIOLATION_ALLOWED = 0.02, 0.05
"""Out-of-fold shares the chosen check bands allow: benign rows denied, violations allowed."""


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
