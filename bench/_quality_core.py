"""What every section of ``bench/quality.py`` shares: its sizes, a figure beside its interval, the runs, the folds.

Its own module so that each section's module stays small; ``quality.py`` re-exports these names, so
other scripts keep reading them from there. Import it through ``quality.py``, which limits OpenBLAS
to one thread before numpy loads.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fastslow.api import EvalOptions, evaluate
from fastslow.policies.evaluation import Prediction, read_predictions, read_run
from fastslow.router import Settings
from fastslow.router.settings import EmbeddedSettings, System2Settings

from _data import Bench, embedding_cache_dir, log, wilson, write_jsonl

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("FASTSLOW_SHARED_DATA", REPO.parent / "shared" / "data"))


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
