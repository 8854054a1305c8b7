"""The labelled decisions a fit is made on: from an evaluation file run as ``fastslow eval`` runs it, or the log.

Both split them by row into a fit split and a held-out split (stratified by label, seeded). An
evaluation file's test split is never answered: it judges a fit, never makes one.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastslow.policies._load import load_policy
from fastslow.policies.evaluation import (
    RUN_FILE,
    EvalOptions,
    Prediction,
    RunInfo,
    read_predictions,
    read_rows,
    read_run,
)
from fastslow.router import ConfigError, PolicySet, Settings, Task

from ._fitted import embedder_name
from ._log import LOG_LIMIT, OutcomeLog, Sample, logged_label, logged_prediction, sample_weight

__all__ = ["HELD_OUT", "Collected", "Evaluate", "collect", "collect_from_log", "load_task"]

HELD_OUT = 0.5
"""The share of labelled rows held out to judge a fit, unless a command says otherwise."""


class Evaluate(Protocol):
    """Runs an evaluation file into a report directory: ``fastslow.api.evaluate`` with its engines."""

    async def __call__(
        self, data: Path, out_dir: Path, *, settings: Settings, options: EvalOptions = ...
    ) -> RunInfo: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Collected:
    """The task's labelled decisions on the evaluation file, split into fit and held-out rows."""

    info: RunInfo
    task: Task
    policy: PolicySet
    fit: list[Prediction]
    held_out: list[Prediction]
    test_rows_left_out: int
    unanswered: int
    mean_state_chars: float
    embedder: str
    """The embedder the embedded engines used (``fit_mismatches`` compares it at load)."""
    source: str = "data"
    """``data`` (an evaluation file) or ``log`` (outcomes in the decision log)."""
    sample: Sample | None = None
    """With ``log``: which labelled decisions counted, and how (``collect_from_log``)."""


async def collect(
    data: Path,
    out_dir: Path,
    *,
    settings: Settings,
    policy: Path,
    task: str,
    evaluate: Evaluate,
    split: str | None = None,
    held_out: float = HELD_OUT,
    seed: int = 0,
    concurrency: int = 4,
    progress: bool = True,
) -> Collected:
    """Run ``task`` over ``data`` (not its test split) and split its labelled decisions.

    Each split the file has (train, validation; or the whole file without splits) is run into its
    own folder of ``out_dir`` by ``evaluate``, resumably, without System 2.

    Raises:
        ConfigError: an unknown task, a bad row (labels outside the task's options included: the
            message names the line), ``split`` "test", or no labelled decision outside the test split.
    """
    if split == "test":
        raise ConfigError("--split: the test split is for judging a fit, never for making one", key="split")
    policy_set = load_task(policy, task, settings)
    rows = read_rows(data, policy=policy_set)
    if rows.problems:
        # A bad row (say, a label the task has no option for) is an error here, not a row to skip:
        # a fit on what is left would silently describe other data.
        first = rows.problems[0]
        raise ConfigError(
            f"line {first.line}: {first.message} ({len(rows.problems)} bad rows in all)",
            path=str(data),
            line=first.line,
        )
    splits_present = {r.split for r in rows.rows}
    test_rows = sum(r.split == "test" for r in rows.rows)
    # Run only what may be fitted on: the test split is never even answered.
    runs: list[str | None] = (
        [split] if split is not None else (["train", "validation"] if "test" in splits_present else [None])
    )
    info: RunInfo | None = None
    predictions: list[Prediction] = []
    for part in runs:
        if part is not None and part not in splits_present:
            continue
        folder = out_dir if part is None else out_dir / part
        options = EvalOptions(
            policy=policy,
            task=task,
            split=part,
            concurrency=concurrency,
            progress=progress,
            overwrite=_stale(folder, policy_set.version),
            system2=False,
        )
        info = await evaluate(data, folder, settings=settings, options=options)
        predictions += read_predictions(folder)
    usable = [p for p in predictions if p.split != "test" and p.label is not None]
    answered = [p for p in usable if p.answer is not None and p.probabilities]
    if info is None or not answered:
        raise ConfigError(
            f"no labelled decision outside the test split in {data} ({test_rows} test rows are never used for fitting)",
            path=str(data),
        )
    fit, held = split_held_out(answered, held_out, seed)
    states = [len(str(r.state)) for r in rows.rows if r.split != "test" and (split is None or r.split == split)]
    return Collected(
        info=info,
        task=policy_set.tasks[task],
        policy=policy_set,
        fit=fit,
        held_out=held,
        test_rows_left_out=test_rows,
        unanswered=len(usable) - len(answered),
        mean_state_chars=sum(states) / len(states) if states else 0.0,
        embedder=embedder_name(settings),
    )


async def collect_from_log(
    open_log: Callable[[], Awaitable[OutcomeLog]],
    *,
    settings: Settings,
    policy: Path,
    task: str,
    tenant: str | None = None,
    sample: Sample | None = None,
    held_out: float = HELD_OUT,
    seed: int = 0,
) -> Collected:
    """The task's decisions with recorded outcomes in the decision log, split like ``collect``'s.

    Outcomes are what people and System 2 recorded (``POST /v1/decisions/{id}/outcome``): mostly
    escalations and reviews, not a random sample of what System 1 decides. ``sample`` says which
    labelled decisions count and how much:

    * ``weighted`` (the default when the task has an audit sample): the audited decisions System 1
      kept, each weighing ``1 / audit_rate``, and the decisions it did not keep (escalations and
      reviews, labelled anyway), each weighing 1; kept decisions labelled outside the audit are
      left out. This stands for all traffic when every escalation gets its outcome recorded.
    * ``audit``: the audited decisions alone, unweighted: a fair sample of what System 1 kept.
    * ``all``: every labelled decision, unweighted, biased towards escalations (the default
      without an audit sample; the summary says so).

    A decision's newest outcome counts. A check's ``deny`` / ``allow`` label means its rule was /
    was not violated; ``review`` says neither and is left out.

    ``open_log`` opens the log once the task is known to be in the policy (``DecisionStore.open``
    with its URL); it is closed before the decisions are split.

    Raises:
        ConfigError: an unknown task, no labelled decision, or a label the task has no option for
            (the message names the decision).
    """
    policy_set = load_task(policy, task, settings)
    the_task = policy_set.tasks[task]
    store = await open_log()
    try:
        pairs = await store.outcomes(tenant=tenant, task=task, limit=LOG_LIMIT)
    finally:
        await store.aclose()
    if sample is None:
        sample = "weighted" if any(d.audit for d, _ in pairs) else "all"
    seen: set[str] = set()
    predictions: list[Prediction] = []
    unanswered = 0
    versions: set[str] = set()
    models: set[str] = set()
    for decision, outcome in pairs:
        if decision.id in seen:
            continue
        seen.add(decision.id)
        options = tuple(decision.probabilities)
        if not options:
            unanswered += 1
            continue
        label = logged_label(the_task, decision.question, decision.outcome, decision.system, outcome)
        weight = sample_weight(sample, decision)
        if label is None or weight is None:
            continue
        if label not in options:
            raise ConfigError(
                f"decision {decision.id}: outcome label {label!r} is not an option of {task}.{decision.question} "
                f"({', '.join(options)})",
                key="label",
            )
        versions.add(decision.policy_version)
        models.add(decision.model)
        predictions.append(logged_prediction(decision, the_task, label=label, weight=weight))
    if not predictions:
        who = f" of tenant {tenant!r}" if tenant else ""
        raise ConfigError(f"the decision log has no labelled decision of task {task!r}{who}", key="task")
    fit, held = split_held_out(predictions, held_out, seed)
    return Collected(
        info=RunInfo(
            data=f"decision log ({tenant or 'every tenant'})",
            data_sha256="",
            engine=the_task.engine or settings.engine,
            model=", ".join(sorted(models)),
            policy=str(policy),
            policy_version=", ".join(sorted(versions)),
            task=task,
            rows=len(predictions),
        ),
        task=the_task,
        policy=policy_set,
        fit=fit,
        held_out=held,
        test_rows_left_out=0,
        unanswered=unanswered,
        mean_state_chars=0.0,
        embedder=embedder_name(settings),
        source="log",
        sample=sample,
    )


def load_task(policy: Path, task: str, settings: Settings) -> PolicySet:
    """The policy file, loaded as the service would, which must have ``task``.

    Raises:
        ConfigError: a bad policy file, or no task of that name (the message lists the tasks).
    """
    policy_set = load_policy(policy, default_engine=settings.engine)
    if task not in policy_set.tasks:
        raise ConfigError(
            f"no task {task!r} in the policy (tasks: {', '.join(policy_set.tasks)})", path=str(policy), key="tasks"
        )
    return policy_set


def _stale(folder: Path, version: str) -> bool:
    """Whether ``folder`` holds a run under another policy version: a fit written since, say; run afresh."""
    if not (folder / RUN_FILE).is_file():
        return False
    try:
        return read_run(folder).policy_version != version
    except ConfigError:
        return True


def split_held_out(
    predictions: Sequence[Prediction], held_out: float, seed: int
) -> tuple[list[Prediction], list[Prediction]]:
    """By row (a row's questions stay together), stratified by the row's first label; seeded."""
    if not 0.0 < held_out < 1.0:
        raise ConfigError(f"--held-out must lie strictly between 0 and 1, not {held_out}", key="held_out")
    by_row: dict[str, list[Prediction]] = {}
    for p in predictions:
        by_row.setdefault(p.row, []).append(p)
    strata: dict[str, list[str]] = {}
    for row, ps in by_row.items():
        strata.setdefault(str(ps[0].label), []).append(row)
    rng = random.Random(seed)
    held_rows: set[str] = set()
    carry = 0.0
    for label in sorted(strata):
        rows = sorted(strata[label])
        rng.shuffle(rows)
        # Carry the rounding from stratum to stratum, so the split is held_out of the rows overall.
        want = held_out * len(rows) + carry
        take = int(want)
        carry = want - take
        held_rows.update(rows[:take])
    fit = [p for p in predictions if p.row not in held_rows]
    held = [p for p in predictions if p.row in held_rows]
    return fit, held
