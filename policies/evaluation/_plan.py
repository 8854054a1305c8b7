"""What an evaluation run will do: its rows checked, each with the task it runs as, training rows left out.

``plan`` reads the evaluation file, pairs every row with how it runs (a policy task, or the engine
directly for an explicit row), drops the rows an engine was trained on, and opens the run's record
in the report directory, resuming a run there of the same data, engine, policy, task and split.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from fastslow.policies._locate import BUILTIN_POLICY, locate_policy
from fastslow.router import (
    CheckTask,
    ClassifyTask,
    ConfigError,
    PolicySet,
    Question,
    RouteTask,
    Settings,
    Task,
    Thresholds,
)

from ._deciders import Deciders, TrainingTexts
from ._options import EvalOptions
from ._predictions import RunInfo, write_run
from ._resume import now, resume, sha256
from ._rows import EvalRow, RowProblem, normalise_label, read_rows

__all__ = ["EXPLICIT_THRESHOLDS", "NONE_OF_THESE", "Job", "Plan", "plan"]

NONE_OF_THESE = "none_of_these"
"""The option name that means "out of scope" in explicit rows (what every converter writes)."""


def _shipped_thresholds() -> Thresholds:
    """The built-in policy's default thresholds: what a task without its own would be held to."""
    shipped = yaml.safe_load(BUILTIN_POLICY.read_text(encoding="utf-8"))["defaults"]["thresholds"]
    return Thresholds(min_confidence=float(shipped["min_confidence"]), min_margin=float(shipped["min_margin"]))


EXPLICIT_THRESHOLDS = _shipped_thresholds()
"""Explicit rows have no policy: they are held to the built-in policy's defaults (0.7 / 0.15), fixed
before the run, so *kept* means what it would in production rather than "every answer"."""


class _Skip(Exception):
    """A row that cannot be run as asked (reported with its line, like a row the reader refused)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One row and how to run it."""

    row: EvalRow
    task: Task | None
    """The policy task it runs as; ``None``: an explicit row, asked of the engine directly."""
    questions: Mapping[str, Question]
    """Question name (as the row's labels and the predictions name it) -> question."""
    labels: Mapping[str, str]
    trained_names: tuple[str, ...]
    """The names the engine knows these questions by (``task.rule``), for its examples."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What a run will do: its record (already written) and the rows still to predict."""

    info: RunInfo
    policy_path: Path | None
    policy: PolicySet | None
    todo: list[tuple[Job, list[str]]]
    """Each row to run, with the questions it still lacks a prediction for."""
    prior_model: str
    """The models of the run this one resumes."""


def plan(
    data: Path,
    out_dir: Path,
    *,
    settings: Settings,
    deciders: Deciders,
    options: EvalOptions,
) -> Plan:
    """Read and check the rows, leave out training rows, and open (or resume) the run in ``out_dir``."""
    policy, task, split, limit, strict = options.policy, options.task, options.split, options.limit, options.strict
    policy_path = _policy_path(settings, policy)
    loaded: list[PolicySet] = []

    def load() -> PolicySet:
        # Only a run that needs the policy (--task, or a row naming a task) reads it.
        if not loaded:
            loaded.append(deciders.load_policy(policy_path))
        return loaded[0]

    if task is not None and task not in (tasks := load().tasks):
        raise ConfigError(
            f"no task {task!r} in the policy; its tasks are {', '.join(tasks)}", path=str(policy_path), key="task"
        )
    read = read_rows(data, policy=load, strict=strict)
    policy_set = loaded[0] if loaded else None
    problems = [(p.line, str(p)) for p in read.problems]
    rows = [row for row in read.rows if split is None or row.split == split]
    if limit is not None:
        rows = rows[:limit]
    jobs: list[Job] = []
    for row in rows:
        try:
            jobs.append(_job(row, policy_set, task))
        except _Skip as skip:
            if strict:
                raise ConfigError(skip.message, path=str(data), line=row.line, key=skip.key) from None
            problems.append((row.line, str(RowProblem(line=row.line, message=skip.message, key=skip.key))))
    training = _Training(settings, deciders, policy_set)
    jobs, dropped = training.drop_overlap(jobs, data=data, strict=strict)
    info = RunInfo(
        data=str(data),
        data_sha256=sha256(data),
        engine=_engine_name(settings, policy_set, task),
        policy=str(policy_path) if policy_set is not None else None,
        policy_version=policy_set.version if policy_set is not None else None,
        task=task,
        split=split,
        rows=len(jobs),
        problems=tuple(text for _, text in sorted(problems, key=lambda p: p[0])),
        examples=training.counts(jobs),
        dropped_training_rows=tuple(job.row.id for job in dropped),
        started_at=now(),
        settings=_settings_record(settings, jobs, concurrency=options.concurrency, limit=limit, strict=strict),
    )
    done, prior = resume(out_dir, info, overwrite=options.overwrite)
    if prior is not None:
        info = replace(info, started_at=prior.started_at or info.started_at)
    write_run(out_dir, info)
    todo = [(job, missing) for job in jobs if (missing := [q for q in job.questions if (job.row.id, q) not in done])]
    return Plan(
        info=info,
        policy_path=policy_path if policy_set is not None else None,
        policy=policy_set,
        todo=todo,
        prior_model=prior.model if prior is not None else "",
    )


def _policy_path(settings: Settings, policy: Path | None) -> Path:
    """``--policy``, else the file every command uses (``locate_policy``): one rule, as ``serve`` has."""
    if policy is not None:
        if not policy.is_file():
            raise ConfigError(f"no such policy file: {policy}", key="policy")
        return policy
    return locate_policy(settings).path


def _task_questions(task: Task) -> dict[str, Question]:
    """A task's questions by the names rows label them with (``docs/evaluation.md``)."""
    if isinstance(task, RouteTask):
        return {task.name: task.question}
    if isinstance(task, ClassifyTask):
        return dict(task.questions)
    return {rule.name: rule.question for rule in task.rules.values()}


def _trained_names(task: Task | None, questions: Iterable[str]) -> tuple[str, ...]:
    """The names the engine learns these questions' examples under (``PolicySet.question_examples``)."""
    if task is None:
        return tuple(questions)
    if isinstance(task, RouteTask):
        return (task.name, f"{task.name}.open_ended") if task.open_ended is not None else (task.name,)
    return tuple(f"{task.name}.{name}" for name in questions)


def _job(row: EvalRow, policy: PolicySet | None, forced: str | None) -> Job:
    name = forced or row.task
    if name is None or policy is None:
        return Job(
            row=row,
            task=None,
            questions=row.questions,
            labels=row.labels,
            trained_names=_trained_names(None, row.questions),
        )
    if row.task is not None and row.task != name:
        raise _Skip(f"the row names task {row.task!r}, but every row runs as task {name!r}", "task")
    task = policy.tasks[name]
    questions = _task_questions(task)
    labels = dict(row.labels)
    if row.task is None:
        # An explicit row run as a task: its labels must be answers to the task's own questions.
        for question, label in row.labels.items():
            if question not in questions:
                raise _Skip(
                    f"label for question {question!r}, which task {name!r} does not ask; "
                    f"its questions are {', '.join(questions)}",
                    f"labels.{question}",
                )
            option = normalise_label(questions[question], label)
            if option is None:
                raise _Skip(
                    f"label {label!r} of question {question!r} is not one of task {name!r}'s options "
                    f"({', '.join(questions[question].options)})",
                    f"labels.{question}",
                )
            labels[question] = option
    if isinstance(task, RouteTask) and not isinstance(row.state, str):
        raise _Skip(f"task {name!r} routes a user's message: the state must be text", "state")
    return Job(row=row, task=task, questions=questions, labels=labels, trained_names=_trained_names(task, questions))


class _Training:
    """The example texts each engine learned from, by the engine's question names."""

    def __init__(self, settings: Settings, deciders: Deciders, policy: PolicySet | None) -> None:
        self._settings = settings
        self._deciders = deciders
        self._explicit = _texts(deciders.training_texts(None)) if deciders.learns(settings.engine) else {}
        self._policy = _texts(deciders.training_texts(policy)) if policy is not None else {}

    def _for(self, job: Job) -> Mapping[str, tuple[int, frozenset[str]]]:
        if job.task is None:
            return self._explicit
        return self._policy if self._deciders.learns(job.task.engine or self._settings.engine) else {}

    def drop_overlap(self, jobs: Sequence[Job], *, data: Path, strict: bool) -> tuple[list[Job], list[Job]]:
        """The jobs to run, and those whose state is a training text of a question they ask."""
        kept: list[Job] = []
        dropped: list[tuple[Job, str]] = []
        for job in jobs:
            trained = self._for(job)
            # Only a text state is compared. A tool-call mapping reaches the engine as the router
            # renders it (`shell: rm -rf x`), and that rendering is the router's own, not public.
            state = _plain(job.row.state) if isinstance(job.row.state, str) else None
            hit = next((n for n in job.trained_names if n in trained and state in trained[n][1]), None)
            if hit is None:
                kept.append(job)
            else:
                dropped.append((job, hit))
        if dropped and strict:
            job, name = dropped[0]
            raise ConfigError(
                f"row {job.row.id!r}: its state is one of the engine's training examples for {name!r} "
                f"({len(dropped)} such row(s) in all); an engine is evaluated only on rows it did not learn from",
                path=str(data),
                line=job.row.line,
                key="state",
            )
        return kept, [job for job, _ in dropped]

    def counts(self, jobs: Iterable[Job]) -> dict[str, int]:
        """Question name -> examples the engine learned it from, for the questions these jobs ask."""
        out: dict[str, int] = {}
        for job in jobs:
            trained = self._for(job)
            for name in job.trained_names:
                if name in trained:
                    out[name] = trained[name][0]
        return dict(sorted(out.items()))


def _texts(examples: TrainingTexts) -> dict[str, tuple[int, frozenset[str]]]:
    """Question name -> (how many examples, their texts compared as ``_plain``)."""
    return {name: (len(texts), frozenset(_plain(text) for text in texts)) for name, texts in examples.items()}


def _plain(text: str) -> str:
    # Spacing does not change what the engine embeds, so it does not make a training text new.
    return " ".join(text.split())


def _engine_name(settings: Settings, policy: PolicySet | None, task: str | None) -> str:
    if task is not None and policy is not None:
        return policy.tasks[task].engine or settings.engine
    return settings.engine


def _settings_record(
    settings: Settings, jobs: Sequence[Job], *, concurrency: int, limit: int | None, strict: bool
) -> dict[str, Any]:
    """What else shaped the run: the thresholds in force, the examples file, the version."""
    from importlib.metadata import version

    thresholds: dict[str, Any] = {}
    for job in jobs:
        task = job.task
        if task is None:
            thresholds.setdefault("explicit rows", asdict(EXPLICIT_THRESHOLDS))
        elif task.name not in thresholds:
            entry: dict[str, Any] = {"calibration": asdict(task.calibration)}
            if isinstance(task, CheckTask):
                entry["rules"] = {name: asdict(rule.action) for name, rule in task.rules.items()}
            else:
                entry["thresholds"] = asdict(task.thresholds)
            thresholds[task.name] = entry
    examples = settings.embedded.examples
    return {
        "concurrency": concurrency,
        "limit": limit,
        "strict": strict,
        "thresholds": thresholds,
        "examples_file": str(examples) if examples is not None else None,
        "examples_sha256": sha256(examples) if examples is not None else None,
        "system2": settings.system2.default,
        "fastslow_version": version("fastslow"),
    }
