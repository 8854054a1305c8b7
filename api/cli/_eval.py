"""``fastslow eval``: run an evaluation file through System 1 and the router into a report, or compare two."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

from ._base import (
    EXIT_BAD_INPUT,
    EXIT_ENGINE,
    EXIT_INTERRUPTED,
    check_engine,
    fail,
    load_settings,
    policy_source,
    say_policy,
)
from ._observe import observed

__all__ = ["eval_command"]

PROBLEMS_SHOWN = 20
"""Row problems printed by `fastslow eval`; run.json lists them all."""


def _say_run_problems(problems: tuple[str, ...], dropped: int) -> None:
    # On stderr, one `line N: why` each: stdout stays the run's result.
    for problem in problems[:PROBLEMS_SHOWN]:
        sys.stderr.write(f"{' '.join(problem.split())}\n")
    if len(problems) > PROBLEMS_SHOWN:
        sys.stderr.write(f"... and {len(problems) - PROBLEMS_SHOWN} more bad row(s), all listed in run.json\n")
    if problems:
        sys.stderr.write(f"skipped {len(problems)} bad row(s); --strict refuses the file instead\n")
    if dropped:
        sys.stderr.write(
            f"left out {dropped} row(s) whose state is one of the engine's training examples "
            "(run.json: dropped_training_rows)\n"
        )


def _compare_reports(a: Path, b: Path, out: Path | None) -> None:
    from fastslow.policies.evaluation import compare_reports
    from fastslow.router import ConfigError

    for path in (a, b):
        if not path.is_dir():
            fail(f"--compare: no such report directory {path}", EXIT_BAD_INPUT)
    try:
        comparison = compare_reports(a, b)
    except ConfigError as exc:  # the two runs are not over the same rows, or a report is unreadable
        fail(str(exc), EXIT_BAD_INPUT)
    if out is not None:
        try:
            written = comparison.write(out)
        except OSError as exc:
            fail(f"--out: cannot write the comparison to {out}: {exc.strerror or exc}", EXIT_BAD_INPUT)
        sys.stderr.write(f"wrote {', '.join(str(path) for path in written)}\n")
    sys.stdout.write(comparison.markdown())


def eval_command(
    data: Annotated[Path | None, typer.Option("--data", help="The evaluation file (JSON Lines).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="The report directory to write (or resume).")] = None,
    policy: Annotated[Path | None, typer.Option(help="Policy file whose tasks the rows name.")] = None,
    task: Annotated[str | None, typer.Option(help="Run every row as this policy task.")] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="Engine to use: embedded, sparrow, examples, jev, openai-decisions, logprob, or a plugin's."),
    ] = None,
    examples: Annotated[
        Path | None, typer.Option(help="Examples file (JSON/YAML) for the example-trained engine.")
    ] = None,
    split: Annotated[str | None, typer.Option(help="Only rows of this split: train, validation or test.")] = None,
    concurrency: Annotated[int, typer.Option(help="Rows in flight at once.")] = 4,
    limit: Annotated[int | None, typer.Option(help="Only the first N rows, for a quick look.")] = None,
    strict: Annotated[
        bool, typer.Option(help="Refuse the file at a bad row or a training example instead of skipping it.")
    ] = False,
    fresh: Annotated[bool, typer.Option(help="Start over, discarding a run already in --out.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
    compare: Annotated[
        tuple[Path, Path] | None,
        typer.Option(help="Compare two report directories (REPORT_A REPORT_B) instead of running."),
    ] = None,
) -> None:
    """Run every row of an evaluation file and write a report directory (resumable), or compare two."""
    from fastslow.api._evaluate import EvalOptions, evaluate, headline
    from fastslow.router import ConfigError

    if compare is not None:
        if data is not None:
            fail("--compare: compares two report directories; it takes no --data", EXIT_BAD_INPUT)
        _compare_reports(compare[0], compare[1], out)
        return
    if data is None:
        fail("--data: the evaluation file is required (or --compare REPORT_A REPORT_B)", EXIT_BAD_INPUT)
    if out is None:
        fail("--out: the report directory is required", EXIT_BAD_INPUT)
    if not data.is_file():
        fail(f"--data: no such file {data}", EXIT_BAD_INPUT)
    engine_name = check_engine(engine)
    settings = load_settings(engine_name, examples)
    # One rule, as serve and graph have: --policy, else FASTSLOW_POLICY_FILE, ./fastslow-policy.yaml
    # or the built-in one. The run reads it only if --task or a row names a task.
    source = policy_source(settings, policy)
    try:  # checked here, once: the library takes the options whole
        options = EvalOptions(
            policy=source.path,
            task=task,
            split=split,
            concurrency=concurrency,
            strict=strict,
            limit=limit,
            progress=progress,
            overwrite=fresh,
        )
    except ConfigError as exc:
        fail(f"--{exc.key}: {exc.message}", EXIT_BAD_INPUT)

    try:
        with observed(settings):  # each row's decisions are a trace of their own (no root span)
            info = asyncio.run(evaluate(data, out, settings=settings, options=options))
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        fail(f"interrupted; run the same command again to resume the run in {out}", EXIT_INTERRUPTED)
    if info.policy is not None:
        say_policy(source)
    _say_run_problems(info.problems, len(info.dropped_training_rows))
    summary = headline(out)
    sys.stdout.write(f"report: {out}\n{summary}\n")
    if not summary.predictions:  # a run that answered nothing is no result, whatever the reason
        why = (
            f"every row was bad ({len(info.problems)} skipped; --strict stops at the first)"
            if info.problems
            else ("the file has no row to run" + (f" in split {split!r}" if split is not None else ""))
        )
        fail(f"no row was answered: {why}", EXIT_ENGINE)
    if summary.errors == summary.predictions:
        fail(f"System 1 answered no row: {summary.first_error}", EXIT_ENGINE)
