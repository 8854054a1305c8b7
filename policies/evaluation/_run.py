"""Answering an evaluation file's rows as production would, one prediction per (row, question).

An explicit row is asked of the engine, a task row (or every row, with ``task``) of the policy's
router, escalation included. Each row's predictions are appended to ``predictions.jsonl`` and
flushed as it finishes, so an interrupted run resumes where it stopped; the report is written from
that file and ``run.json`` alone (``write_report``). What answers the rows comes from the
composition root (``Deciders``): ``fastslow.api.evaluate`` passes the engines its settings build.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import IO, Any, cast

from langchain_core.messages import HumanMessage

from fastslow.router import (
    Choice,
    ClassifyTask,
    Decision,
    EngineError,
    EngineFailure,
    EngineTimeout,
    InvalidRequest,
    PolicySet,
    Question,
    RouteTask,
    Settings,
    Task,
    decide_answer,
)

from ._decided import prediction
from ._deciders import Deciders, RowEngine, TaskRouter
from ._options import EvalOptions
from ._plan import EXPLICIT_THRESHOLDS, NONE_OF_THESE, Job, plan
from ._predictions import PREDICTIONS_FILE, Prediction, RunInfo, write_prediction, write_run
from ._report import write_report
from ._resume import now
from ._rows import EvalRow

__all__ = ["evaluate"]


async def evaluate(
    data: Path,
    out_dir: Path,
    *,
    settings: Settings,
    deciders: Deciders,
    options: EvalOptions | None = None,
) -> RunInfo:
    """Answer every row of ``data`` and write ``predictions.jsonl``, ``run.json`` and the report to ``out_dir``.

    Args:
        data: the evaluation file (JSON Lines, ``docs/evaluation.md``).
        out_dir: the report directory; a run there of the same data, engine, policy, task and
            split is resumed (its predicted rows are skipped).
        settings: the engine is ``settings.engine``, trained on ``settings.embedded.examples``.
        deciders: what answers the rows, built from ``settings`` (``fastslow.api.evaluate`` passes
            the engines' own).
        options: which rows, as which task, how many at once, and how (``EvalOptions``; its
            defaults when omitted).

    Returns:
        The run record as written to ``run.json``; its ``problems`` list the rows left out.

    Raises:
        ConfigError: a bad argument, policy, examples or data file (``strict``: a bad row), or an
            ``out_dir`` holding another run; the message names the file, line or key.
    """
    options = options if options is not None else EvalOptions()
    # Reading, checking and hashing a large file blocks: off the event loop, which may be a caller's.
    planned = await asyncio.to_thread(plan, data, out_dir, settings=settings, deciders=deciders, options=options)
    info = planned.info
    runner = _Runner(deciders, planned.policy_path, planned.policy, system2=options.system2)
    try:
        await runner.start(jobs=[job for job, _ in planned.todo])
        with (
            (out_dir / PREDICTIONS_FILE).open("a", encoding="utf-8") as fh,
            _progress(options.progress, total=info.rows, done=info.rows - len(planned.todo)) as advance,
        ):
            await _run_all(runner, planned.todo, fh, concurrency=options.concurrency, advance=advance)
    finally:
        await runner.aclose()
    models = sorted({*runner.models, *(m for m in planned.prior_model.split(", ") if m)})
    info = replace(info, model=", ".join(models), finished_at=now())
    write_run(out_dir, info)
    await asyncio.to_thread(_write_report, out_dir)
    return info


class _Runner:
    """Runs one row: through the engine for an explicit row, through the router for a task row."""

    def __init__(
        self, deciders: Deciders, policy_path: Path | None, policy: PolicySet | None, *, system2: bool = True
    ) -> None:
        self._deciders = deciders
        self._system2 = system2
        self._policy_path = policy_path
        self._policy = policy
        self._router: TaskRouter | None = None
        self._engine: RowEngine | None = None
        self.models: set[str] = set()
        """System 1's models, as its answers name them."""

    async def start(self, *, jobs: Sequence[Job]) -> None:
        """Build (and train) what ``jobs`` need, before the first row, so no row waits for training."""
        if any(job.task is not None for job in jobs) and self._policy_path is not None:
            assert self._policy is not None, "a policy path is read into a policy when the run is planned"
            self._router = await self._deciders.router(self._policy_path, self._policy, system2=self._system2)
        if any(job.task is None for job in jobs):
            self._engine = await self._deciders.engine()

    async def aclose(self) -> None:
        await self._deciders.aclose()

    async def run(self, job: Job) -> list[Prediction]:
        if job.task is None:
            return await self._explicit(job)
        try:
            return await self._task(job, job.task)
        except InvalidRequest as exc:
            # A state no engine can take: this row has no answer, the run goes on.
            return [_failed(job, name, question, f"invalid request: {exc}") for name, question in job.questions.items()]

    async def _explicit(self, job: Job) -> list[Prediction]:
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

    async def _task(self, job: Job, task: Task) -> list[Prediction]:
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
        job: Job,
        name: str,
        question: Question,
        decision: Decision,
        *,
        none_option: str | None = None,
        violation: str | None = None,
        check: bool = False,
    ) -> Prediction:
        if decision.system == 1 and decision.model:
            self.models.add(decision.model)
        return _predicted(job, name, question, decision, none_option=none_option, violation=violation, check=check)


def _predicted(
    job: Job,
    name: str,
    question: Question,
    decision: Decision,
    *,
    none_option: str | None = None,
    violation: str | None = None,
    check: bool = False,
) -> Prediction:
    return prediction(
        decision,
        row=job.row.id,
        question=name,
        kind=question.kind,
        options=question.options,
        label=job.labels.get(name),
        weight=job.row.weight,
        split=job.row.split,
        task=job.task.name if job.task is not None else None,
        none_option=none_option,
        violation=violation,
        check=check,
        meta=_meta(job.row),
    )


def _failed(job: Job, name: str, question: Question, message: str) -> Prediction:
    """The prediction of a question whose row no engine could be asked: System 1 failed on it."""
    task = job.task.name if job.task is not None else name
    failed = Decision(task=task, question=name, outcome=None, system=1, reason="engine_error", detail=message)
    return _predicted(job, name, question, failed)


def _meta(row: EvalRow) -> dict[str, Any]:
    # The split has its own field; the rest (RouteLLM's outcomes, XSTest's type) the report may use.
    return {key: value for key, value in row.meta.items() if key != "split"}


async def _run_all(
    runner: _Runner,
    todo: Sequence[tuple[Job, Sequence[str]]],
    fh: IO[str],
    *,
    concurrency: int,
    advance: Any,
) -> None:
    """Run ``todo`` with at most ``concurrency`` rows in flight, writing each row's lines as it finishes."""
    slots = asyncio.Semaphore(concurrency)

    async def one(job: Job, missing: Sequence[str]) -> None:
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
