"""``fastslow eval``: answer every row of an evaluation file and keep one prediction per question.

Each row is answered as it would be in production: an explicit row by the configured engine, a
task row (or every row, with ``task``) by the policy's ``Router``, escalation included. Every
(row, question) becomes one ``Prediction`` line in ``predictions.jsonl``, appended and flushed as
rows finish, and ``run.json`` records what was run on what. An interrupted run resumes: rows
already predicted are skipped. The report is computed from those two files alone
(``fastslow.policies.evaluation.write_report``).

Thresholds are fixed before the run (the policy task's, or the kernel's defaults for explicit
rows), and an engine trained on examples is never scored on them: rows whose state is one of its
training texts are dropped and counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import IO, Any, cast

from langchain_core.messages import HumanMessage

from fastslow.engines import LEARNS_FROM_EXAMPLES, EnginePool, examples_for, needs_examples
from fastslow.policies import load_policy, locate_policy
from fastslow.policies.evaluation import (
    PREDICTIONS_FILE,
    RUN_FILE,
    SPLITS,
    EvalRow,
    Prediction,
    RowProblem,
    RunInfo,
    normalise_label,
    read_predictions,
    read_rows,
    read_run,
    write_prediction,
    write_report,
    write_run,
)
from fastslow.router import (
    CheckTask,
    Choice,
    ClassifyTask,
    ConfigError,
    Decision,
    EngineError,
    EngineFailure,
    EngineTimeout,
    InvalidRequest,
    PolicySet,
    Question,
    Router,
    RouteTask,
    Settings,
    Task,
    Thresholds,
    decide_answer,
)
from fastslow.router.engine_api import DecisionEngine

from ._compose import Runtime, build_runtime

__all__ = ["EXPLICIT_THRESHOLDS", "NONE_OF_THESE", "Headline", "evaluate", "headline"]

NONE_OF_THESE = "none_of_these"
"""The option name that means "out of scope" in explicit rows (what every converter writes)."""


def _shipped_thresholds() -> Thresholds:
    """The built-in policy's default thresholds: what a task without its own would be held to."""
    import yaml

    from fastslow.policies import BUILTIN_POLICY

    shipped = yaml.safe_load(BUILTIN_POLICY.read_text(encoding="utf-8"))["defaults"]["thresholds"]
    return Thresholds(min_confidence=float(shipped["min_confidence"]), min_margin=float(shipped["min_margin"]))


EXPLICIT_THRESHOLDS = _shipped_thresholds()
"""Explicit rows have no policy: they are held to the built-in policy's defaults (0.7 / 0.15), fixed
before the run, so *kept* means what it would in production rather than "every answer"."""

_FAILED = frozenset({"engine_error", "timeout", "no_answer"})
# Sparrow is in LEARNS_FROM_EXAMPLES for its limits only: it is zero-shot and learns nothing.
_TRAINED_ENGINES = LEARNS_FROM_EXAMPLES - {"sparrow"}
# The explicit rows' engine is trained on the settings' examples file alone, not on a policy.
_NO_POLICY = PolicySet(tasks={}, version="")
# What must match for a run to resume another: otherwise its predictions would be of other rows,
# another engine or other thresholds.
_SAME_RUN = ("data_sha256", "engine", "policy_version", "task", "split")


class _Skip(Exception):
    """A row that cannot be run as asked (reported with its line, like a row the reader refused)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


@dataclass(frozen=True, slots=True, kw_only=True)
class _Job:
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
class Headline:
    """The one-line summary of a run, from its predictions (weighted by the rows' weights)."""

    rows: int
    labelled: int
    """Predictions with a label (the scored ones)."""
    accuracy: float | None
    """System 1's answer against the label, over labelled predictions (no answer counts as wrong)."""
    kept_share: float | None
    """Share of labelled predictions whose System-1 answer was kept under the run's thresholds."""
    kept_accuracy: float | None
    """Accuracy over the kept ones."""
    predictions: int
    errors: int
    """Predictions without an answer because System 1 failed."""
    first_error: str | None = None

    def __str__(self) -> str:
        def share(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1%}"

        text = (
            f"rows {self.rows}, labelled {self.labelled}: accuracy {share(self.accuracy)}, "
            f"kept {share(self.kept_share)} (accuracy {share(self.kept_accuracy)})"
        )
        return text + (f", {self.errors} engine errors" if self.errors else "")


def headline(out_dir: Path) -> Headline:
    """Accuracy, kept share and kept accuracy of the run in ``out_dir``."""
    rows: set[str] = set()
    labelled = errors = predictions = 0
    first_error: str | None = None
    total = right = kept = kept_right = 0.0
    for p in read_predictions(out_dir):
        rows.add(p.row)
        predictions += 1
        if p.error is not None:
            errors += 1
            first_error = first_error or p.error
        if p.label is None:
            continue
        labelled += 1
        total += p.weight
        right += p.weight * (p.correct is True)
        if p.kept:
            kept += p.weight
            kept_right += p.weight * (p.correct is True)
    return Headline(
        rows=len(rows),
        labelled=labelled,
        accuracy=right / total if total else None,
        kept_share=kept / total if total else None,
        kept_accuracy=kept_right / kept if kept else None,
        predictions=predictions,
        errors=errors,
        first_error=first_error,
    )


async def evaluate(
    data: Path,
    out_dir: Path,
    *,
    settings: Settings,
    policy: Path | None = None,
    task: str | None = None,
    split: str | None = None,
    concurrency: int = 4,
    strict: bool = False,
    limit: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    system2: bool = True,
) -> RunInfo:
    """Answer every row of ``data`` and write ``predictions.jsonl``, ``run.json`` and the report to ``out_dir``.

    Args:
        data: the evaluation file (JSON Lines, ``docs/evaluation.md``).
        out_dir: the report directory; a run there of the same data, engine, policy, task and
            split is resumed (its predicted rows are skipped).
        settings: the engine is ``settings.engine``, trained on ``settings.embedded.examples``.
        policy: the policy file whose tasks task rows name; with ``task`` and no ``policy``, the
            policy fastslow would use (``FASTSLOW_POLICY_FILE``, ``./fastslow-policy.yaml``, the
            built-in one).
        task: run every row as this policy task (explicit rows' labels must name its questions).
        split: only rows whose ``meta.split`` is this.
        concurrency: rows in flight at once.
        strict: refuse the file at its first bad row, and refuse rows that are training examples,
            instead of reporting and skipping them.
        limit: only the first ``limit`` rows (after ``split``), for quick runs.
        progress: show a progress bar on stderr.
        overwrite: start over, discarding a run already in ``out_dir``.
        system2: whether escalated decisions go to System 2 (off: they stay escalated; fitting
            System 1's numbers needs only its distributions, and costs nothing this way).

    Returns:
        The run record as written to ``run.json``; its ``problems`` list the rows left out.

    Raises:
        ConfigError: a bad argument, policy, examples or data file (``strict``: a bad row), or an
            ``out_dir`` holding another run; the message names the file, line or key.
    """
    # Reading, checking and hashing a large file blocks: off the event loop, which may be a caller's.
    plan = await asyncio.to_thread(
        _plan,
        data,
        out_dir,
        settings=settings,
        policy=policy,
        task=task,
        split=split,
        concurrency=concurrency,
        strict=strict,
        limit=limit,
        overwrite=overwrite,
    )
    info = plan.info
    runner = _Runner(settings, plan.policy_path, plan.policy, system2=system2)
    try:
        await runner.start(jobs=[job for job, _ in plan.todo])
        with (
            (out_dir / PREDICTIONS_FILE).open("a", encoding="utf-8") as fh,
            _progress(progress, total=info.rows, done=info.rows - len(plan.todo)) as advance,
        ):
            await _run_all(runner, plan.todo, fh, concurrency=concurrency, advance=advance)
    finally:
        await runner.aclose()
    models = sorted({*runner.models, *(m for m in plan.prior_model.split(", ") if m)})
    info = replace(info, model=", ".join(models), finished_at=_now())
    write_run(out_dir, info)
    await asyncio.to_thread(_write_report, out_dir)
    return info


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """What a run will do: its record (already written) and the rows still to predict."""

    info: RunInfo
    policy_path: Path | None
    policy: PolicySet | None
    todo: list[tuple[_Job, list[str]]]
    """Each row to run, with the questions it still lacks a prediction for."""
    prior_model: str
    """The models of the run this one resumes."""


def _plan(
    data: Path,
    out_dir: Path,
    *,
    settings: Settings,
    policy: Path | None,
    task: str | None,
    split: str | None,
    concurrency: int,
    strict: bool,
    limit: int | None,
    overwrite: bool,
) -> _Plan:
    """Read and check the rows, leave out training rows, and open (or resume) the run in ``out_dir``."""
    _check_arguments(split=split, concurrency=concurrency, limit=limit)
    policy_path = _policy_path(settings, policy, task)
    policy_set = _load_policy(policy_path, settings) if policy_path is not None else None
    if task is not None and policy_set is not None and task not in policy_set.tasks:
        raise ConfigError(
            f"no task {task!r} in the policy; its tasks are {', '.join(policy_set.tasks)}",
            path=str(policy_path),
            key="task",
        )
    read = read_rows(data, policy=policy_set, strict=strict)
    problems = [(p.line, str(p)) for p in read.problems]
    rows = [row for row in read.rows if split is None or row.split == split]
    if limit is not None:
        rows = rows[:limit]
    jobs: list[_Job] = []
    for row in rows:
        try:
            jobs.append(_job(row, policy_set, task))
        except _Skip as skip:
            if strict:
                raise ConfigError(skip.message, path=str(data), line=row.line, key=skip.key) from None
            problems.append((row.line, str(RowProblem(line=row.line, message=skip.message, key=skip.key))))
    training = _Training(settings, policy_set)
    jobs, dropped = training.drop_overlap(jobs, data=data, strict=strict)
    info = RunInfo(
        data=str(data),
        data_sha256=_sha256(data),
        engine=_engine_name(settings, policy_set, task),
        policy=str(policy_path) if policy_path is not None else None,
        policy_version=policy_set.version if policy_set is not None else None,
        task=task,
        split=split,
        rows=len(jobs),
        problems=tuple(text for _, text in sorted(problems, key=lambda p: p[0])),
        examples=training.counts(jobs),
        dropped_training_rows=tuple(job.row.id for job in dropped),
        started_at=_now(),
        settings=_settings_record(settings, jobs, concurrency=concurrency, limit=limit, strict=strict),
    )
    done, prior = _resume(out_dir, info, overwrite=overwrite)
    if prior is not None:
        info = replace(info, started_at=prior.started_at or info.started_at)
    write_run(out_dir, info)
    todo = [(job, missing) for job in jobs if (missing := [q for q in job.questions if (job.row.id, q) not in done])]
    return _Plan(
        info=info,
        policy_path=policy_path,
        policy=policy_set,
        todo=todo,
        prior_model=prior.model if prior is not None else "",
    )


def _check_arguments(*, split: str | None, concurrency: int, limit: int | None) -> None:
    if split is not None and split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}, not {split!r}", key="split")
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, not {concurrency}", key="concurrency")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be at least 1, not {limit}", key="limit")


def _policy_path(settings: Settings, policy: Path | None, task: str | None) -> Path | None:
    if policy is not None:
        if not policy.is_file():
            raise ConfigError(f"no such policy file: {policy}", key="policy")
        return policy
    # A task needs a policy; one configured on purpose is used even without a task, so task rows
    # read with the same file the router would use.
    if task is not None or settings.policy_file is not None:
        return locate_policy(settings).path
    return None


def _load_policy(path: Path, settings: Settings) -> PolicySet:
    # Loaded as build_runtime loads it, so the rows are read against the tasks that will run them.
    return load_policy(
        path,
        needs_examples=partial(needs_examples, default=settings.engine),
        default_engine=settings.engine,
    )


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


def _job(row: EvalRow, policy: PolicySet | None, forced: str | None) -> _Job:
    name = forced or row.task
    if name is None or policy is None:
        return _Job(
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
    return _Job(row=row, task=task, questions=questions, labels=labels, trained_names=_trained_names(task, questions))


def _learns(name: str) -> bool:
    return name in _TRAINED_ENGINES


class _Training:
    """The example texts each engine learned from, by the engine's question names."""

    def __init__(self, settings: Settings, policy: PolicySet | None) -> None:
        self._settings = settings
        self._explicit = _texts(examples_for(settings)) if _learns(settings.engine) else {}
        self._policy = _texts(examples_for(settings, policy)) if policy is not None else {}

    def _for(self, job: _Job) -> Mapping[str, tuple[int, frozenset[str]]]:
        if job.task is None:
            return self._explicit
        return self._policy if _learns(job.task.engine or self._settings.engine) else {}

    def drop_overlap(self, jobs: Sequence[_Job], *, data: Path, strict: bool) -> tuple[list[_Job], list[_Job]]:
        """The jobs to run, and those whose state is a training text of a question they ask."""
        kept: list[_Job] = []
        dropped: list[tuple[_Job, str]] = []
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

    def counts(self, jobs: Iterable[_Job]) -> dict[str, int]:
        """Question name -> examples the engine learned it from, for the questions these jobs ask."""
        out: dict[str, int] = {}
        for job in jobs:
            trained = self._for(job)
            for name in job.trained_names:
                if name in trained:
                    out[name] = trained[name][0]
        return dict(sorted(out.items()))


def _texts(examples: Any) -> dict[str, tuple[int, frozenset[str]]]:
    """Question name -> (how many examples, their texts compared as ``_plain``)."""
    if examples is None:
        return {}
    out: dict[str, tuple[int, frozenset[str]]] = {}
    for name, question in examples.questions.items():
        texts = [text for option in question.examples.values() for text in option]
        out[name] = (len(texts), frozenset(_plain(text) for text in texts))
    return out


def _plain(text: str) -> str:
    # Spacing does not change what the engine embeds, so it does not make a training text new.
    return " ".join(text.split())


def _engine_name(settings: Settings, policy: PolicySet | None, task: str | None) -> str:
    if task is not None and policy is not None:
        return policy.tasks[task].engine or settings.engine
    return settings.engine


def _settings_record(
    settings: Settings, jobs: Sequence[_Job], *, concurrency: int, limit: int | None, strict: bool
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
        "examples_sha256": _sha256(examples) if examples is not None else None,
        "system2": settings.system2.default,
        "fastslow_version": version("fastslow"),
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", path=str(path)) from None
    return digest.hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _resume(out_dir: Path, info: RunInfo, *, overwrite: bool) -> tuple[set[tuple[str, str]], RunInfo | None]:
    """The (row, question) pairs already predicted in ``out_dir``, and the run they belong to.

    Raises:
        ConfigError: ``out_dir`` holds predictions of another run (and ``overwrite`` is not set).
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError("the report directory is a file", path=str(out_dir))
    path = out_dir / PREDICTIONS_FILE
    if overwrite:
        path.unlink(missing_ok=True)
        (out_dir / RUN_FILE).unlink(missing_ok=True)
        return set(), None
    if not path.is_file() or path.stat().st_size == 0:
        return set(), None
    try:
        prior = read_run(out_dir)
    except ConfigError:
        raise ConfigError(
            f"holds {PREDICTIONS_FILE} but no readable {RUN_FILE}, so it cannot be resumed; "
            "start over with --fresh (overwrite=True)",
            path=str(out_dir),
        ) from None
    differ = [key for key in _SAME_RUN if getattr(prior, key) != getattr(info, key)]
    if prior.settings.get("examples_sha256") != info.settings.get("examples_sha256"):
        differ.append("examples file")
    if differ:
        raise ConfigError(
            f"holds a run with a different {', '.join(differ)}; resume it with the same arguments, "
            "use another directory, or start over with --fresh (overwrite=True)",
            path=str(out_dir),
        )
    _drop_cut_line(path)
    return {(p.row, p.question) for p in read_predictions(out_dir)}, prior


def _drop_cut_line(path: Path) -> None:
    """Cut a last line left incomplete by an interruption, so appended lines start on their own."""
    with path.open("rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        # Walk back to the last newline; a prediction line is small, so this stays cheap.
        position = size
        while position > 0:
            step = min(position, 1 << 16)
            fh.seek(position - step)
            chunk = fh.read(step)
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                fh.truncate(position - step + cut + 1)
                return
            position -= step
        fh.truncate(0)


class _NoSystem2:
    """A System 2 that is never there: escalated decisions stay escalated."""

    def chat_for(self, _ref: str | None) -> None:
        return None


class _Runner:
    """Runs one row: through the engine for an explicit row, through the router for a task row."""

    def __init__(
        self, settings: Settings, policy_path: Path | None, policy: PolicySet | None, *, system2: bool = True
    ) -> None:
        self._settings = settings
        self._system2 = system2
        self._policy_path = policy_path
        self._policy = policy
        self._runtime: Runtime | None = None
        self._pool: EnginePool | None = None
        self._router: Router | None = None
        self._engine: DecisionEngine | None = None
        self.models: set[str] = set()
        """System 1's models, as its answers name them."""

    async def start(self, *, jobs: Sequence[_Job]) -> None:
        """Build (and train) what ``jobs`` need, before the first row, so no row waits for training."""
        if any(job.task is not None for job in jobs) and self._policy_path is not None:
            settings = self._settings.model_copy(update={"policy_file": self._policy_path})
            # Blocking: build_runtime trains the policy's engines.
            self._runtime = await asyncio.to_thread(build_runtime, settings)
            if self._runtime.store.current.version != (self._policy.version if self._policy else None):
                raise ConfigError(
                    "the policy file changed while the run started; run it again", path=str(self._policy_path)
                )
            runtime = self._runtime
            self._router = (
                runtime.router
                if self._system2
                else Router(lambda: runtime.store.current, runtime.engines, _NoSystem2())
            )
            self._pool = self._runtime.engines
        if any(job.task is None for job in jobs):
            pool = self._pool or EnginePool(self._settings)
            self._pool = pool
            self._engine = await asyncio.to_thread(pool.engine_for, self._settings.engine, _NO_POLICY)

    async def aclose(self) -> None:
        if self._runtime is not None:
            await self._runtime.aclose()
        elif self._pool is not None:
            await self._pool.aclose()

    async def run(self, job: _Job) -> list[Prediction]:
        if job.task is None:
            return await self._explicit(job)
        try:
            return await self._task(job, job.task)
        except InvalidRequest as exc:
            # A state no engine can take: this row has no answer, the run goes on.
            return [_failed(job, name, question, f"invalid request: {exc}") for name, question in job.questions.items()]

    async def _explicit(self, job: _Job) -> list[Prediction]:
        assert self._engine is not None, "start() builds the engine for explicit rows"
        answers: Mapping[str, Any] = {}
        failure: EngineFailure | None = None
        try:
            reply = await self._engine.decide(job.row.state, job.questions)
            answers = reply.answers
        except (TimeoutError, EngineTimeout) as exc:
            failure = EngineFailure(message=f"System 1 timed out: {exc}".rstrip(": "), timeout=True)
        except (EngineError, InvalidRequest) as exc:
            failure = EngineFailure(message=str(exc))
        out: list[Prediction] = []
        for name, question in job.questions.items():
            none = NONE_OF_THESE if isinstance(question, Choice) and NONE_OF_THESE in question.options else None
            answer = answers.get(name) or failure or EngineFailure(message="the engine gave no answer to it")
            # The kernel's default thresholds: a question without a policy keeps every answer it
            # can, so coverage is the engine's own, and the report sweeps thresholds from there.
            decision = decide_answer(name, answer, thresholds=EXPLICIT_THRESHOLDS, none_option=none)
            out.append(self._prediction(job, name, question, decision, none_option=none))
        return out

    async def _task(self, job: _Job, task: Task) -> list[Prediction]:
        assert self._router is not None, "start() builds the router for task rows"
        state = job.row.state
        if isinstance(task, RouteTask):
            decision = await self._router.route(task.name, [HumanMessage(cast(str, state))])
            return [self._prediction(job, task.name, job.questions[task.name], decision, none_option=task.none_option)]
        if isinstance(task, ClassifyTask):
            decisions = await self._router.classify(task.name, state)
            return [self._prediction(job, name, q, decisions[name]) for name, q in job.questions.items()]
        # A check takes a text or a tool call ({"tool": ..., "arguments": ...}); other JSON states
        # go to System 1 as they are, as the router passes them.
        result = await self._router.check(task.name, cast(Any, state))
        return [
            self._prediction(
                job, name, q, result.decisions[name], violation=task.rules[name].action.violation, check=True
            )
            for name, q in job.questions.items()
        ]

    def _prediction(
        self,
        job: _Job,
        name: str,
        question: Question,
        decision: Decision,
        *,
        none_option: str | None = None,
        violation: str | None = None,
        check: bool = False,
    ) -> Prediction:
        probabilities = dict(decision.probabilities)
        answer = max(probabilities, key=probabilities.__getitem__) if probabilities else None
        # Kept: System 1 gave a distribution and the decision stayed with it. A check the router
        # could not settle (System 1 failed, no System 2) is denied by system 1 without escalating,
        # so the distribution is what tells a kept verdict from a fail-closed one.
        kept = decision.system == 1 and not decision.escalate and answer is not None
        outcome: str | None
        if check:
            # A check's decision is its verdict; None when nobody judged it (it failed closed).
            outcome = decision.verdict if kept or decision.system == 2 else None
        else:
            outcome = decision.outcome
        if decision.system == 1 and decision.model:
            self.models.add(decision.model)
        return Prediction(
            row=job.row.id,
            question=name,
            kind=question.kind,
            options=question.options,
            label=job.labels.get(name),
            answer=answer,
            probabilities=probabilities,
            confidence=probabilities[answer] if answer is not None else 0.0,
            kept=kept,
            reason=decision.reason,
            outcome=outcome,
            system=decision.system,
            latency_ms=decision.latency_ms,
            threshold=decision.threshold,
            weight=job.row.weight,
            split=job.row.split,
            task=job.task.name if job.task is not None else None,
            none_option=none_option,
            verdict=decision.verdict if check else None,
            violation=violation,
            meta=_meta(job.row),
            error=(decision.detail or decision.reason) if decision.reason in _FAILED else None,
        )


def _failed(job: _Job, name: str, question: Question, message: str) -> Prediction:
    """The prediction of a question whose row no engine could be asked."""
    return Prediction(
        row=job.row.id,
        question=name,
        kind=question.kind,
        options=question.options,
        label=job.labels.get(name),
        answer=None,
        probabilities={},
        confidence=0.0,
        kept=False,
        reason="engine_error",
        outcome=None,
        system=1,
        latency_ms=0.0,
        threshold=0.0,
        weight=job.row.weight,
        split=job.row.split,
        task=job.task.name if job.task is not None else None,
        meta=_meta(job.row),
        error=message,
    )


def _meta(row: EvalRow) -> dict[str, Any]:
    # The split has its own field; the rest (RouteLLM's outcomes, XSTest's type) the report may use.
    return {key: value for key, value in row.meta.items() if key != "split"}


async def _run_all(
    runner: _Runner,
    todo: Sequence[tuple[_Job, Sequence[str]]],
    fh: IO[str],
    *,
    concurrency: int,
    advance: Any,
) -> None:
    """Run ``todo`` with at most ``concurrency`` rows in flight, writing each row's lines as it finishes."""
    slots = asyncio.Semaphore(concurrency)

    async def one(job: _Job, missing: Sequence[str]) -> None:
        try:
            predictions = await runner.run(job)
            # No await between a row's lines: rows finishing together never interleave.
            for prediction in predictions:
                if prediction.question in missing:
                    write_prediction(fh, prediction)
            advance()
        finally:
            slots.release()

    try:
        async with asyncio.TaskGroup() as group:
            for job, missing in todo:
                # Acquired here, not in the task: a million-row file is not a million pending tasks.
                await slots.acquire()
                group.create_task(one(job, missing))
    except BaseExceptionGroup as failed:
        raise _first(failed) from None


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    error = group.exceptions[0]
    return _first(error) if isinstance(error, BaseExceptionGroup) else error


@contextmanager
def _progress(enabled: bool, *, total: int, done: int) -> Iterator[Any]:
    """A function that counts one row done: a rich progress bar on stderr, or nothing."""
    if not enabled:
        yield lambda: None
        return
    try:  # rich comes with typer; without it the run simply shows no bar
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Task as BarTask
        from rich.text import Text
    except ImportError:
        yield lambda: None
        return

    class Rate(ProgressColumn):
        def render(self, task: BarTask) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:.1f} rows/s" if speed else "- rows/s")

    bar = Progress(
        TextColumn("eval"),
        BarColumn(),
        MofNCompleteColumn(),
        Rate(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )
    with bar:
        task = bar.add_task("eval", total=total, completed=done)
        yield lambda: bar.advance(task)


def _write_report(out_dir: Path) -> None:
    # A run whose every row was left out has nothing to report on; run.json says why.
    if (out_dir / PREDICTIONS_FILE).stat().st_size > 0:
        write_report(out_dir)
