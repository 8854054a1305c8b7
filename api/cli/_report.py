"""``fastslow report``: what the service decided, read back from the decision log (drift, shadow)."""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from ._base import EXIT_BAD_INPUT, POLICY_OPT, TASK_OPT, fail, load_settings

__all__ = ["EXIT_DRIFT", "report_app"]

EXIT_DRIFT = 1
"""``report drift``: the recent outcomes say the task should be refitted (for CI or cron)."""

report_app = typer.Typer(help="Reports on what the service decided.", no_args_is_help=True)


@report_app.command("drift")
def report_drift(
    policy: Annotated[Path, POLICY_OPT],
    task: Annotated[str, TASK_OPT],
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's decisions.")] = None,
    since_days: Annotated[float, typer.Option("--since-days", help="Only decisions of the last N days.")] = 7.0,
    level: Annotated[float, typer.Option(help="Confidence level of the accuracy bounds.")] = 0.95,
) -> None:
    """Compare recent logged outcomes with the task's fit; exit 1 when it should be refitted (for CI or cron)."""
    from fastslow.api._drift import drift
    from fastslow.router import ConfigError

    if not policy.is_file():
        fail(f"--policy: no such file {policy}", EXIT_BAD_INPUT)
    if not since_days > 0:
        fail(f"--since-days: must be positive, not {since_days}", EXIT_BAD_INPUT)
    if not 0.5 <= level < 1.0:
        fail(f"--level: must be at least 0.5 and below 1, not {level}", EXIT_BAD_INPUT)
    settings = load_settings(None, None)
    since = datetime.now(UTC) - timedelta(days=since_days)
    try:
        result = asyncio.run(
            drift(settings=settings, policy=policy, task=task, tenant=tenant, since=since, level=level)
        )
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    sys.stdout.write("".join(f"{line}\n" for line in result.lines))
    if result.refit:
        raise typer.Exit(EXIT_DRIFT)


@report_app.command("shadow")
def report_shadow(
    policy: Annotated[Path, POLICY_OPT],
    task: Annotated[str, TASK_OPT],
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's decisions.")] = None,
    since_days: Annotated[float, typer.Option("--since-days", help="Only decisions of the last N days.")] = 7.0,
) -> None:
    """For a task in shadow mode: agreement with the incumbent, what System 1 would have kept, the savings."""
    from fastslow.api._shadow import shadow_report
    from fastslow.router import ConfigError

    if not policy.is_file():
        fail(f"--policy: no such file {policy}", EXIT_BAD_INPUT)
    if not since_days > 0:
        fail(f"--since-days: must be positive, not {since_days}", EXIT_BAD_INPUT)
    since = datetime.now(UTC) - timedelta(days=since_days)
    try:
        result = asyncio.run(
            shadow_report(settings=load_settings(None, None), policy=policy, task=task, tenant=tenant, since=since)
        )
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    sys.stdout.write("".join(f"{line}\n" for line in result.lines))
