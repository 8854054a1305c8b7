"""``fastslow calibrate`` and ``fastslow tune``: fit a task's numbers on labelled data, write them into its YAML.

Both run the task over an evaluation file exactly as ``fastslow eval`` does (resumable, in a report
directory), never on the file's test split; split the labelled decisions into a fit split and a
held-out split (by row, stratified by label, seeded); fit on the first and report on the second;
and write the result into the policy file with a ``fitted:`` record beside it, through
``fastslow.policies.tuning.PolicyEditor`` (comments, order and formatting of everything else
kept). The service's policy store hot-reloads the file; the policy version every decision records
is the file's hash, so it names the fit too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeAlias

from fastslow.policies import load_policy
from fastslow.policies.evaluation import RUN_FILE, Prediction, RunInfo, read_predictions, read_rows, read_run
from fastslow.policies.tuning import (
    ISOTONIC_MIN_ROWS,
    PLATT_MIN_ROWS,
    BandChoice,
    CalibrationFit,
    Labelled,
    Method,
    PolicyEditor,
    ThresholdChoice,
    TooFewLabels,
    fit_calibration,
    reexpress,
    tune_bands,
    tune_thresholds,
)
from fastslow.router import (
    Calibration,
    CheckTask,
    ConfigError,
    Isotonic,
    ModelPrice,
    Platt,
    PolicySet,
    Settings,
    Task,
)

from ._compose import embedder_name
from ._evaluate import evaluate

__all__ = [
    "MAP_KEYS",
    "REMOVE",
    "SAMPLE_WORDS",
    "Collected",
    "Fit",
    "Sample",
    "apply",
    "calibrate_task",
    "collect",
    "collect_from_log",
    "load_task",
    "logged_label",
    "plot",
    "sample_weight",
    "system2_cost_per_call",
    "tune_task",
]

HELD_OUT = 0.5
MAP_KEYS = ("platt", "isotonic")
"""The policy file's keys of a confidence map; a calibration has at most one."""


class _Remove:
    def __repr__(self) -> str:
        return "REMOVE"


REMOVE: Any = _Remove()
"""An edit's value that takes its key out of the policy file (``apply``)."""
OUTPUT_TOKENS = 16
"""Tokens a System-2 answer to a typed question takes (an option name and a little JSON)."""
PROMPT_TOKENS = 150
"""Tokens of instructions and option descriptions around the state in a System-2 prompt (an estimate)."""


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


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """What a command fitted: the edits to make, the record written beside them, and lines for people."""

    edits: list[tuple[tuple[str, ...], Any]]
    record: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    curve: ThresholdChoice | None = None


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


async def collect(
    data: Path,
    out_dir: Path,
    *,
    settings: Settings,
    policy: Path,
    task: str,
    split: str | None = None,
    held_out: float = HELD_OUT,
    seed: int = 0,
    concurrency: int = 4,
    progress: bool = True,
) -> Collected:
    """Run ``task`` over ``data`` (not its test split) and split its labelled decisions.

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
        info = await evaluate(
            data,
            folder,
            overwrite=_stale(folder, policy_set.version),
            settings=settings,
            policy=policy,
            task=task,
            split=part,
            concurrency=concurrency,
            progress=progress,
            system2=False,
        )
        predictions += read_predictions(folder)
    usable = [p for p in predictions if p.split != "test" and p.label is not None]
    answered = [p for p in usable if p.answer is not None and p.probabilities]
    if info is None or not answered:
        raise ConfigError(
            f"no labelled decision outside the test split in {data} ({test_rows} test rows are never used for fitting)",
            path=str(data),
        )
    fit, held = _split(answered, held_out, seed)
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


Sample: TypeAlias = Literal["weighted", "audit", "all"]
SAMPLE_WORDS: dict[str, str] = {
    "weighted": "the audit sample weighted by 1 / audit_rate, with the escalations and reviews",
    "audit": "the audit sample alone: decisions System 1 kept, drawn at random",
    "all": "every recorded outcome, unweighted (no audit sample: weighted towards escalations and reviews)",
}
LOG_LIMIT = 100_000
"""The most logged outcomes one fit reads."""
_VERDICT_LABELS = ("allow", "deny")


async def collect_from_log(
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

    Raises:
        ConfigError: an unknown task, no labelled decision, or a label the task has no option for
            (the message names the decision).
    """
    from .store import DecisionStore, database_url_for

    policy_set = load_task(policy, task, settings)
    the_task = policy_set.tasks[task]
    store = await DecisionStore.open(database_url_for(settings))
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
        top = max(decision.probabilities, key=lambda o: decision.probabilities[o])
        predictions.append(
            Prediction(
                row=decision.id,
                question=decision.question,
                kind="noul" if set(options) == {"yes", "no"} else "choice",
                options=options,
                label=label,
                answer=top,
                probabilities=dict(decision.probabilities),
                confidence=decision.probabilities[top],
                kept=decision.system == 1 and not decision.escalate,
                reason=decision.reason,
                outcome=decision.outcome,
                system=decision.system,
                latency_ms=decision.latency_ms,
                threshold=decision.threshold,
                task=task,
                weight=weight,
                none_option=getattr(the_task, "none_option", None),
                violation=_violation(the_task, decision.question),
            )
        )
    if not predictions:
        who = f" of tenant {tenant!r}" if tenant else ""
        raise ConfigError(f"the decision log has no labelled decision of task {task!r}{who}", key="task")
    fit, held = _split(predictions, held_out, seed)
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


def sample_weight(sample: Sample, decision: Any) -> float | None:
    """How much a labelled decision counts under ``sample`` (``collect_from_log``); ``None``: not at all."""
    kept = decision.system == 1 and not decision.escalate and decision.verdict != "review"
    if sample == "all":
        return 1.0
    if decision.audit:
        return 1.0 / decision.audit_rate if sample == "weighted" and decision.audit_rate > 0 else 1.0
    if sample == "weighted" and not kept:
        return 1.0
    return None


def _violation(task: Task, question: str) -> str | None:
    if isinstance(task, CheckTask) and question in task.rules:
        return task.rules[question].action.violation
    return None


def logged_label(task: Task, question: str, decided: str | None, system: int, outcome: Any) -> str | None:
    """The option an outcome says was right, or ``None`` when it does not say."""
    label: str | None = outcome.label
    if label is None and outcome.system2_correct is True and system == 2:
        label = decided
    violation = _violation(task, question)
    if violation is not None and label in _VERDICT_LABELS:
        other = [o for o in task.rules[question].question.options if o != violation]  # type: ignore[union-attr]
        return violation if label == "deny" else (other[0] if other else None)
    if violation is not None and label == "review":
        return None
    return label


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


def _split(predictions: Sequence[Prediction], held_out: float, seed: int) -> tuple[list[Prediction], list[Prediction]]:
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


def _labelled(predictions: Sequence[Prediction]) -> list[Labelled]:
    return [
        Labelled(
            probabilities=dict(p.probabilities),
            label=str(p.label),
            none_option=p.none_option,
            weight=p.weight,
        )
        for p in predictions
    ]


def _base_record(command: str, c: Collected, data: str | Path) -> dict[str, Any]:
    record: dict[str, Any] = {
        "by": f"fastslow {command}",
        "date": _now(),
        "data": str(data),
        "data_sha256": c.info.data_sha256[:16],
        "rows_fit": len({p.row for p in c.fit}),
        "rows_held_out": len({p.row for p in c.held_out}),
        "engine": c.info.engine,
        "model": c.info.model,
        "embedder": c.embedder,
        "policy_version": c.info.policy_version,
    }
    if c.source == "log":
        del record["data_sha256"]
        record["sample"] = SAMPLE_WORDS[c.sample or "all"]
    return record


def system2_cost_per_call(settings: Settings, task: Task, mean_state_chars: float) -> tuple[str, float | None]:
    """The task's System-2 model and its estimated cost of one call (``None`` without a price in the settings).

    Input tokens: the state at four characters a token plus ``PROMPT_TOKENS``; output: ``OUTPUT_TOKENS``.
    """
    from fastslow.engines.chat._cost import call_cost

    ref = task.escalate_to or settings.system2.default
    price: ModelPrice | None = settings.system2.prices.get(ref)
    tokens = int(round(mean_state_chars / 4.0)) + PROMPT_TOKENS
    return ref, call_cost(price, input_tokens=tokens, output_tokens=OUTPUT_TOKENS)


def _money(x: float) -> str:
    return f"${x:,.4f}" if x < 1 else f"${x:,.2f}"


def tune_task(
    c: Collected,
    data: str | Path,
    settings: Settings,
    *,
    target: float,
    level: float,
    max_false_deny: float,
    max_miss: float,
    seed: int = 0,
) -> Fit:
    """Thresholds (a route or classification) or bands (a check) for ``c.task``.

    Raises:
        TooFewLabels: the message names the number of labelled decisions needed.
    """
    if isinstance(c.task, CheckTask):
        return _tune_check(c, data, max_false_deny=max_false_deny, max_miss=max_miss, level=level, seed=seed)
    choice = tune_thresholds(_labelled(c.fit), _labelled(c.held_out), target=target, level=level, seed=seed)
    h = choice.held_out
    ref, per_call = system2_cost_per_call(settings, c.task, c.mean_state_chars)
    record = {
        **_base_record("tune", c, data),
        "target_accuracy": target,
        "level": level,
        "held_out": {
            "kept": round(h.kept, 4),
            "escalated": round(1.0 - h.kept, 4),
            "accuracy": round(h.accuracy, 4),
            "lower_bound": round(h.lower, 4),
            "kept_decisions": h.n_kept,
            "decisions": choice.n_held_out,
        },
    }
    lines = [
        f"thresholds for {c.task.name}: min_confidence {choice.min_confidence}, min_margin {choice.min_margin}",
        f"held out ({choice.n_held_out} decisions): System 1 keeps {h.kept:.1%} (escalates {1 - h.kept:.1%}) at "
        f"{h.accuracy:.2%} accuracy; the {level:.0%} lower bound {h.lower:.2%} clears the {target:.1%} target by "
        f"{100 * (h.lower - target):.2f} points ({choice.tested} of {len(choice.curve)} points of the path tested)",
        _savings(h.kept, ref, per_call),
    ]
    edits: list[tuple[tuple[str, ...], Any]] = [
        (("tasks", c.task.name, "thresholds", "min_confidence"), choice.min_confidence),
        (("tasks", c.task.name, "thresholds", "min_margin"), choice.min_margin),
    ]
    if per_call is not None:
        record["cost_saved_per_1000_usd"] = round(1000 * h.kept * per_call, 6)
    record["system2"] = ref
    edits.append((("tasks", c.task.name, "fitted", "thresholds"), record))
    return Fit(edits=edits, record=record, lines=lines, curve=choice)


def _savings(kept: float, ref: str, per_call: float | None) -> str:
    if per_call is None:
        return (
            f"cost saved: {kept:.1%} of decisions need no System-2 call; {ref} has no price in the settings "
            "(FASTSLOW_SYSTEM2__PRICES) to put a figure on it"
        )
    return (
        f"cost saved: {_money(1000 * kept * per_call)} per 1,000 decisions against sending all to {ref} "
        f"(an estimated {_money(per_call)} a call; System 1 runs here at no per-call cost)"
    )


def _tune_check(
    c: Collected, data: str | Path, *, max_false_deny: float, max_miss: float, level: float, seed: int
) -> Fit:
    # The bands' candidates are ordered before any data is seen, so both splits take part in the test.
    everything = c.fit + c.held_out
    assert isinstance(c.task, CheckTask)
    record: dict[str, Any] = {
        **_base_record("tune", c, data),
        "max_false_deny": max_false_deny,
        "max_miss": max_miss,
        "level": level,
        "rules": {},
    }
    edits: list[tuple[tuple[str, ...], Any]] = []
    lines: list[str] = []
    for name, rule in c.task.rules.items():
        rows = [p for p in everything if p.question == name]
        if not rows:
            lines.append(f"rule {name}: no labelled decisions, bands left as they are")
            continue
        violation = rule.action.violation
        try:
            bands = tune_bands(
                [p.probabilities.get(violation, 0.0) for p in rows],
                [p.label == violation for p in rows],
                max_false_deny=max_false_deny,
                max_miss=max_miss,
                level=level,
                weights=[p.weight for p in rows],
                seed=seed,
            )
        except TooFewLabels as exc:
            raise TooFewLabels(f"rule {name}: {exc}") from exc
        record["rules"][name] = _band_record(bands)
        edits += [
            (("tasks", c.task.name, "rules", name, "allow_at"), bands.allow_at),
            (("tasks", c.task.name, "rules", name, "deny_at"), bands.deny_at),
        ]
        lines.append(
            f"rule {name}: allow_at {bands.allow_at}, deny_at {bands.deny_at}: benign denied {bands.false_deny:.1%} "
            f"(bound {bands.false_deny_upper:.1%} <= {max_false_deny:.1%}), violations allowed {bands.miss:.1%} "
            f"(bound {bands.miss_upper:.1%} <= {max_miss:.1%}); sent to review: {bands.review_benign:.1%} of benign, "
            f"{bands.review_violations:.1%} of violations ({bands.n_benign} benign, {bands.n_violations} violations)"
        )
    if not record["rules"]:
        raise TooFewLabels(f"no rule of {c.task.name} has labelled decisions in {data}")
    edits.append((("tasks", c.task.name, "fitted", "bands"), record))
    return Fit(edits=edits, record=record, lines=lines)


def _band_record(b: BandChoice) -> dict[str, Any]:
    return {
        "false_deny": round(b.false_deny, 4),
        "false_deny_bound": round(b.false_deny_upper, 4),
        "miss": round(b.miss, 4),
        "miss_bound": round(b.miss_upper, 4),
        "review_benign": round(b.review_benign, 4),
        "review_violations": round(b.review_violations, 4),
        "benign": b.n_benign,
        "violations": b.n_violations,
    }


def calibrate_task(c: Collected, data: str | Path, *, method: Method = "auto") -> Fit:
    """A calibration for each of the task's questions with labelled decisions, and for the task as a whole.

    Each is a temperature and, where ``method`` and the number of decisions allow, a Platt or
    isotonic map of the top probability (``fit_calibration``). It replaces the current one, map
    and all: the decisions are first restated without the current map (``reexpress``).

    Raises:
        TooFewLabels: no question has decisions in both splits, or ``method`` asks for a map the
            task's fit split is too small for (a question too small for it gets a temperature alone).
    """
    current = c.task.calibration
    name = c.task.name
    record: dict[str, Any] = {**_base_record("calibrate", c, data), "method": "temperature", "questions": {}}
    edits: list[tuple[tuple[str, ...], Any]] = []
    lines: list[str] = []
    questions = sorted({p.question for p in c.fit} & {p.question for p in c.held_out})
    if not questions:
        raise TooFewLabels("calibration needs labelled decisions of one question in both the fit and held-out split")

    def fit_under(fit: Sequence[Prediction], held: Sequence[Prediction], under: float, asked: Method) -> CalibrationFit:
        return fit_calibration(
            _restated(fit, current, under),
            _restated(held, current, under),
            method=asked,
            base_temperature=under,
            decided=_labelled(held),
        )

    whole = fit_under(c.fit, c.held_out, current.temperature, method)
    here = ("tasks", name, "calibration")
    edits += [(here + ("temperature",), whole.calibration.temperature), *_map_edits(here, whole.calibration)]
    record.update(method=whole.method, asked=method, held_out=_figures_record(whole))
    if whole.scores:
        record["cv_brier"] = {m: round(v, 5) for m, v in whole.scores.items()}
    lines += [_fit_line(name, whole), f"  {whole.reason}"]
    own: dict[str, Calibration] = {}
    if len(questions) > 1:
        for q in questions:
            fit_q = [p for p in c.fit if p.question == q]
            held_q = [p for p in c.held_out if p.question == q]
            try:
                one = fit_under(fit_q, held_q, current.for_question(q).temperature, method)
            except TooFewLabels:
                needed = PLATT_MIN_ROWS if method == "platt" else ISOTONIC_MIN_ROWS
                one = fit_under(fit_q, held_q, current.for_question(q).temperature, "temperature")
                one = replace(one, reason=f"temperature alone: {len(fit_q)} fit decisions, {method} needs {needed}")
            own[q] = one.calibration
            record["questions"][q] = {"method": one.method, **_figures_record(one)}
            lines += [_fit_line(f"{name}.{q}", one), f"  {one.reason}"]
    else:
        record.pop("questions")
        if questions[0] in current.questions:
            # The question's own entry would hide the task-wide fit from it: it gets the same fit.
            own[questions[0]] = whole.calibration
    if own:
        edits.append((here + ("questions",), {q: _calibration_yaml(cal) for q, cal in own.items()}))
    edits.append((("tasks", name, "fitted", "calibration"), record))
    return Fit(edits=edits, record=record, lines=lines)


def _restated(predictions: Sequence[Prediction], current: Calibration, temperature: float) -> list[Labelled]:
    """The decisions as ``temperature`` alone gives them, each undone from the calibration it was decided under."""
    return [
        replace(row, probabilities=reexpress(p.probabilities, current.for_question(p.question), temperature))
        for p, row in zip(predictions, _labelled(predictions), strict=True)
    ]


def _calibration_yaml(calibration: Calibration) -> dict[str, Any]:
    """A question's calibration as its policy-file mapping (``temperature`` and ``platt`` or ``isotonic``)."""
    out: dict[str, Any] = {"temperature": calibration.temperature}
    g = calibration.confidence_map
    if isinstance(g, Platt):
        out["platt"] = {"a": g.a, "b": g.b}
    elif isinstance(g, Isotonic):
        out["isotonic"] = [[x, y] for x, y in zip(g.x, g.y, strict=True)]
    return out


def _map_edits(at: tuple[str, ...], calibration: Calibration) -> list[tuple[tuple[str, ...], Any]]:
    """Write the map ``calibration`` has under ``at``, removing the other one (or both, when it has none)."""
    written = _calibration_yaml(calibration)
    return [(at + (key,), written.get(key, REMOVE)) for key in MAP_KEYS]


def _figures_record(f: CalibrationFit) -> dict[str, Any]:
    def one(x: Any) -> dict[str, float]:
        return {"ece": round(x.ece, 4), "brier": round(x.brier, 4), "log_loss": round(x.log_loss, 4)}

    return {"decisions": f.after.n, "before": one(f.before), "after": one(f.after)}


def _fit_line(name: str, f: CalibrationFit) -> str:
    b, a, g = f.before, f.after, f.calibration.confidence_map
    what = f"temperature {f.calibration.temperature} (x{f.factor:.3f})"
    if isinstance(g, Platt):
        what += f", platt a {g.a}, b {g.b}"
    elif isinstance(g, Isotonic):
        what += f", isotonic through {len(g.x)} points"
    return (
        f"{name}: {f.method}: {what}; held out ({a.n}): ECE {b.ece:.3f} -> {a.ece:.3f}, "
        f"Brier {b.brier:.4f} -> {a.brier:.4f}, log loss {b.log_loss:.3f} -> {a.log_loss:.3f}"
    )


def plot(fit: Fit, path: Path, task: str) -> bool:
    """Draw tune's accuracy-coverage path (held out) to ``path``; ``False`` when there is none to draw."""
    from fastslow.policies.evaluation import plot_tuning

    choice = fit.curve
    if choice is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    curve = choice.curve
    chosen = next(
        i for i, p in enumerate(curve) if (p.min_confidence, p.min_margin) == (choice.min_confidence, choice.min_margin)
    )
    plot_tuning(
        path,
        [p.kept for p in curve],
        [p.accuracy for p in curve],
        [p.lower for p in curve],
        target=choice.target,
        chosen=chosen,
        title=f"fastslow tune: {task}, held out ({choice.n_held_out} decisions, {choice.level:.0%} bound)",
    )
    return True


def apply(editor: PolicyEditor, fit: Fit) -> None:
    """Make ``fit``'s edits; a rule written as a bare question becomes a mapping to take its bands.

    An edit whose value is ``REMOVE`` takes its key out. A task calibration left without a map of
    its own while the file's ``defaults`` give one gets ``null`` for it, so that it runs as fitted.
    """
    removed: dict[tuple[str, ...], set[str]] = {}
    for keys, value in fit.edits:
        if value is REMOVE:
            editor.remove(keys)
            removed.setdefault(keys[:-1], set()).add(keys[-1])
            continue
        if len(keys) == 5 and keys[2] == "rules":
            editor.expand(keys[:4], "instructions")
        editor.set(keys, value)
    for at, gone in removed.items():
        if at[:1] == ("tasks",) and at[-1:] == ("calibration",) and gone >= set(MAP_KEYS):
            for key in MAP_KEYS:
                node = editor.get(("defaults", "calibration", key))
                if node is not None and node.tag != "tag:yaml.org,2002:null":
                    editor.set((*at, key), None)
