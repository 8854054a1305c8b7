"""``fastslow calibrate`` and ``fastslow tune``: fit a task on labelled decisions, show the diff, rewrite the policy.

Both read labelled decisions the same way (an evaluation file, or the outcomes in the decision log),
so their shared options become one ``FitOptions``, checked once by ``run_fit``; each command adds only
its own options, checked before, and the fit that uses them.
"""

# The commands' shared parameters are declared for typer and read back by FitOptions.given from the
# command's context, so the function bodies do not name them.
# ruff: noqa: ARG001

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import typer

from ._base import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    POLICY_OPT,
    TASK_OPT,
    check_engine,
    fail,
    load_settings,
)

if TYPE_CHECKING:
    from fastslow.router import Settings

__all__ = ["FitOptions", "calibrate_command", "run_fit", "tune_command"]

Fitter = Callable[[Any, "Settings"], Any]
"""The command's fit: the collected decisions and the settings in, a fit to apply out. (``Any``, as
before: the command line relies on ``fastslow.api._tune``'s functions only, not on its types.)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitOptions:
    """What calibrate and tune share, as given on the command line."""

    command: Literal["calibrate", "tune"]
    """Names the default report directory and the plot."""
    policy: Path
    task: str
    data: Path | None
    """An evaluation file; ``None`` with ``from_log``."""
    from_log: bool
    tenant: str | None
    sample: str | None
    out: Path | None
    """The report directory; ``None`` for ``DATA_DIR/fits/COMMAND-TASK``."""
    engine: str | None
    examples: Path | None
    split: str | None
    held_out: float
    seed: int
    dry_run: bool
    progress: bool

    @classmethod
    def given(cls, command: Literal["calibrate", "tune"], ctx: typer.Context) -> FitOptions:
        """The shared options as the running command was given them (its parameters carry their names)."""
        return cls(command=command, **{f.name: ctx.params[f.name] for f in fields(cls) if f.name != "command"})


def _check(options: FitOptions, samples: tuple[str, ...]) -> Settings:
    # In a fixed order, so that of two mistakes the same one is named every time.
    o = options
    if not o.policy.is_file():
        fail(f"--policy: no such file {o.policy}", EXIT_BAD_INPUT)
    if (o.data is None) == (not o.from_log):
        fail(
            "--data: give an evaluation file, or --from-log for the decision log's outcomes (not both)", EXIT_BAD_INPUT
        )
    if o.data is not None and not o.data.is_file():
        fail(f"--data: no such file {o.data}", EXIT_BAD_INPUT)
    if o.tenant is not None and not o.from_log:
        fail("--tenant: filters the decision log; it needs --from-log", EXIT_BAD_INPUT)
    if o.sample is not None and (not o.from_log or o.sample not in samples):
        fail(f"--sample: with --from-log, one of {', '.join(samples)}, not {o.sample!r}", EXIT_BAD_INPUT)
    if o.from_log and o.split is not None:
        fail("--split: the decision log has no splits; drop --split with --from-log", EXIT_BAD_INPUT)
    engine = check_engine(o.engine)
    if not 0.0 < o.held_out < 1.0:
        fail(f"--held-out: must lie strictly between 0 and 1, not {o.held_out}", EXIT_BAD_INPUT)
    if o.split is not None and o.split not in ("train", "validation"):
        fail(f"--split: fit on train or validation rows, not {o.split!r} (the test split judges a fit)", EXIT_BAD_INPUT)
    return load_settings(engine, o.examples)


async def _collect(options: FitOptions, settings: Settings, out_dir: Path) -> Any:
    from fastslow.api._tune import Sample, collect, collect_from_log

    o = options
    if o.data is not None:
        return await collect(
            o.data,
            out_dir,
            settings=settings,
            policy=o.policy,
            task=o.task,
            split=o.split,
            held_out=o.held_out,
            seed=o.seed,
            progress=o.progress,
        )
    return await collect_from_log(
        settings=settings,
        policy=o.policy,
        task=o.task,
        tenant=o.tenant,
        sample=cast("Sample | None", o.sample),
        held_out=o.held_out,
        seed=o.seed,
    )


def _say_collected(collected: Any, sample_words: dict[str, str]) -> None:
    left = collected.test_rows_left_out
    sys.stdout.write(
        f"{len({p.row for p in collected.fit})} fit rows, {len({p.row for p in collected.held_out})} held-out rows"
        + (f"; {left} test rows left out (never fitted on)" if left else "")
        + (f"; {collected.unanswered} decisions System 1 did not answer left out" if collected.unanswered else "")
        + "\n"
    )
    if collected.source == "log":
        sys.stdout.write(
            f"from the decision log ({collected.sample}): {sample_words[collected.sample or 'all']} "
            f"(policy versions: {collected.info.policy_version})\n"
        )


def run_fit(options: FitOptions, fit: Fitter) -> None:
    """Check the options, gather the task's labelled decisions, fit, show the diff, and write the policy."""
    from fastslow.api._tune import SAMPLE_WORDS, apply, plot
    from fastslow.policies import parse_policy
    from fastslow.policies.tuning import PolicyEditor, TooFewLabels
    from fastslow.router import ConfigError

    settings = _check(options, tuple(SAMPLE_WORDS))
    policy, task = options.policy, options.task
    out_dir = (
        options.out if options.out is not None else settings.resolved_data_dir() / "fits" / f"{options.command}-{task}"
    )
    try:
        # Read (and check) the file first: a file that cannot be rewritten faithfully fails before the run.
        editor = PolicyEditor(policy)
        editor.task(task)
        collected = asyncio.run(_collect(options, settings, out_dir))
        result = fit(collected, settings)
        apply(editor, result)
        # The edited file must load as a policy before anything is shown as its new form.
        parse_policy(editor.text(), source=str(policy), default_engine=settings.engine)
    except TooFewLabels as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        fail(f"interrupted; run the same command again to resume the run in {out_dir}", EXIT_INTERRUPTED)
    _say_collected(collected, SAMPLE_WORDS)
    for line in result.lines:
        sys.stdout.write(line + "\n")
    for warning in result.warnings:  # on stderr, as every warning: stdout stays the fit and its diff
        sys.stderr.write(f"warning: {warning}\n")
    picture = out_dir / f"{options.command}.png"
    if plot(result, picture, task):
        sys.stdout.write(f"accuracy-coverage plot: {picture}\n")
    diff = editor.diff()
    sys.stdout.write(diff or "(no change to the policy file)\n")
    if options.dry_run:
        sys.stdout.write(f"dry run: {policy} not written\n")
        return
    try:
        editor.write()
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    sys.stdout.write(f"wrote {policy}; a running service reloads it\n")


_DATA_OPT = typer.Option("--data", help="Labelled evaluation file (JSON Lines); its test split is never used.")
_LOG_OPT = typer.Option("--from-log", help="Fit on outcomes recorded in the decision log instead of --data.")
_TENANT_OPT = typer.Option("--tenant", help="With --from-log: only this tenant's decisions (the fit is shared).")
_SAMPLE_OPT = typer.Option(
    "--sample", help="With --from-log: weighted (audit sample by 1/rate, plus escalations), audit, or all."
)
_OUT_OPT = typer.Option("--out", help="Report directory of the run (default DATA_DIR/fits/COMMAND-TASK; resumable).")
_HELD_OUT_OPT = typer.Option("--held-out", help="Share of labelled rows held out to judge the fit.")
_SPLIT_OPT = typer.Option("--split", help="Only rows of this split: train or validation (default: both).")
_DRY_OPT = typer.Option("--dry-run", help="Show the fit and the diff; write nothing.")


def calibrate_command(
    ctx: typer.Context,
    policy: Annotated[Path, POLICY_OPT],
    task: Annotated[str, TASK_OPT],
    data: Annotated[Path | None, _DATA_OPT] = None,
    from_log: Annotated[bool, _LOG_OPT] = False,
    tenant: Annotated[str | None, _TENANT_OPT] = None,
    sample: Annotated[str | None, _SAMPLE_OPT] = None,
    out: Annotated[Path | None, _OUT_OPT] = None,
    engine: Annotated[str | None, typer.Option(help="System-1 engine (the settings' when omitted).")] = None,
    examples: Annotated[Path | None, typer.Option(help="Examples file for the example-trained engine.")] = None,
    split: Annotated[str | None, _SPLIT_OPT] = None,
    held_out: Annotated[float, _HELD_OUT_OPT] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the fit / held-out split.")] = 0,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="auto (by cross-validation on the fit split), temperature, platt (200+ fit decisions) or "
            "isotonic (1,000+).",
        ),
    ] = "auto",
    dry_run: Annotated[bool, _DRY_OPT] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Fit the task's calibration (task-wide and per question) and write it into the policy file.

    A temperature always; a Platt or isotonic map of the top probability on top of it where the
    fit split is large enough and, with --method auto, where it scores better out of fold.
    """
    from fastslow.api._tune import calibrate_task
    from fastslow.policies.tuning import METHODS, Method

    if method != "auto" and method not in METHODS:
        fail(f"--method: one of auto, {', '.join(METHODS)}, not {method!r}", EXIT_BAD_INPUT)
    run_fit(
        FitOptions.given("calibrate", ctx),
        lambda c, _settings: calibrate_task(c, c.info.data, method=cast(Method, method)),
    )


def tune_command(
    ctx: typer.Context,
    policy: Annotated[Path, POLICY_OPT],
    task: Annotated[str, TASK_OPT],
    data: Annotated[Path | None, _DATA_OPT] = None,
    from_log: Annotated[bool, _LOG_OPT] = False,
    tenant: Annotated[str | None, _TENANT_OPT] = None,
    sample: Annotated[str | None, _SAMPLE_OPT] = None,
    target_accuracy: Annotated[
        float,
        typer.Option("--target-accuracy", help="Accuracy the kept decisions must show (routes, classifications)."),
    ] = 0.97,
    level: Annotated[float, typer.Option(help="Confidence level of the lower bound.")] = 0.95,
    max_false_deny: Annotated[
        float, typer.Option("--max-false-deny", help="Checks: the most benign states denied (a share).")
    ] = 0.02,
    max_miss: Annotated[
        float, typer.Option("--max-miss", help="Checks: the most violations allowed (a share).")
    ] = 0.05,
    out: Annotated[Path | None, _OUT_OPT] = None,
    engine: Annotated[str | None, typer.Option(help="System-1 engine (the settings' when omitted).")] = None,
    examples: Annotated[Path | None, typer.Option(help="Examples file for the example-trained engine.")] = None,
    split: Annotated[str | None, _SPLIT_OPT] = None,
    held_out: Annotated[float, _HELD_OUT_OPT] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the fit / held-out split and the bootstrap.")] = 0,
    dry_run: Annotated[bool, _DRY_OPT] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on stderr.")] = True,
) -> None:
    """Choose the task's thresholds (or a check's bands) to keep the most decisions at a stated accuracy."""
    from fastslow.api._tune import tune_task

    for name, value in (
        ("--target-accuracy", target_accuracy),
        ("--max-false-deny", max_false_deny),
        ("--max-miss", max_miss),
    ):
        if not 0.0 < value < 1.0:
            fail(f"{name}: must lie strictly between 0 and 1, not {value}", EXIT_BAD_INPUT)
    if not 0.5 <= level < 1.0:
        fail(f"--level: must be at least 0.5 and below 1, not {level}", EXIT_BAD_INPUT)
    run_fit(
        FitOptions.given("tune", ctx),
        lambda c, settings: tune_task(
            c,
            c.info.data,
            settings,
            target=target_accuracy,
            level=level,
            max_false_deny=max_false_deny,
            max_miss=max_miss,
            seed=seed,
        ),
    )
