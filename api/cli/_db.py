"""``fastslow db``: the decision log's schema (``upgrade``) and retention (``prune``)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from ._base import EXIT_BAD_INPUT, EXIT_STORE, fail, load_settings, run_store, when

if TYPE_CHECKING:
    from fastslow.api.store import DecisionStore, PruneReport
    from fastslow.router import Settings

__all__ = ["db_app", "migrate"]


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def migrate(settings: Settings) -> str:
    """Run the decision log's migrations; the URL (password hidden) on success, one line on failure."""
    from sqlalchemy.exc import SQLAlchemyError

    from fastslow.api.store import database_url_for, upgrade
    from fastslow.router import ConfigError

    try:
        url = database_url_for(settings)
        upgrade(url)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except (SQLAlchemyError, OSError) as exc:
        fail(f"decision log: cannot migrate the database: {type(exc).__name__}: {exc}", EXIT_STORE)
    return _safe_url(url)


db_app = typer.Typer(help="The decision log's database.", no_args_is_help=True)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Migrate the decision log to the newest schema (`fastslow serve` also does this on start)."""
    url = migrate(load_settings())
    sys.stderr.write(f"decision log at {url} is up to date\n")


def _parse_before(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(f"--before: not a date or an ISO 8601 time: {text!r} (for example 2026-01-31)", EXIT_BAD_INPUT)
    # A date, or a time without an offset, is UTC: the log keeps every time in UTC.
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@db_app.command("prune")
def db_prune(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's decisions.")] = None,
    before: Annotated[
        str | None,
        typer.Option(
            "--before",
            help="Delete decisions made before this date or time (ISO 8601, UTC unless it says otherwise); "
            "default: each tenant's retention (FASTSLOW_STORE__RETENTION_DAYS, ...TENANT_RETENTION_DAYS).",
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")] = False,
) -> None:
    """Delete old decisions with their answers and outcomes, and expired idempotency keys, in short batches.

    Learned examples and API keys stay.
    """
    from rich.console import Console
    from rich.table import Table

    from fastslow.api.store import PruneCounts, retention_cutoff

    if tenant is not None and not tenant.strip():
        fail("--tenant: must not be empty", EXIT_BAD_INPUT)
    settings = load_settings()
    retention = settings.store
    keep_all = before is None and not retention.retention_days and not any(retention.tenant_retention_days.values())
    if keep_all:
        # Said first, so nobody takes a run that deleted no decision for one that applied a retention.
        sys.stderr.write(
            "no retention is set (FASTSLOW_STORE__RETENTION_DAYS, FASTSLOW_STORE__TENANT_RETENTION_DAYS) "
            "and no --before given: every decision is kept; only expired idempotency keys go\n"
        )
    cut = _parse_before(before) if before is not None else retention_cutoff(retention, datetime.now(UTC))
    done = PruneCounts()

    # A status line on stderr, drawn only on a terminal: stdout stays the summary, for scripts.
    status = Console(stderr=True).status("pruning the decision log ...")

    def on_batch(name: str, counts: PruneCounts) -> None:
        done.add(counts)
        status.update(f"pruning the decision log: {done.decisions} decision(s) deleted (now: {name}) ...")

    async def work(store: DecisionStore) -> PruneReport:
        with status:
            return await store.prune(cut, tenant=tenant, dry_run=dry_run, on_batch=on_batch)

    report = run_store(settings, work)
    verb = "would delete" if dry_run else "deleted"
    table = Table("tenant", "before", "decisions", "answers", "outcomes", "learned unlinked", box=None)
    for name, counts in report.tenants.items():
        moment = report.cutoffs[name]
        table.add_row(
            name,
            "kept forever" if moment is None else when(moment),
            *(str(n) for n in (counts.decisions, counts.answers, counts.outcomes, counts.learned_unlinked)),
        )
    Console(width=max(120, Console().width), soft_wrap=True).print(table)
    total = report.total
    sys.stderr.write(
        f"{verb} {total.decisions} decision(s), {total.answers} answer(s), {total.outcomes} outcome(s), "
        f"{report.expired_keys} expired idempotency key(s), {report.old_review_events} old review webhook event(s); "
        f"{total.learned_unlinked} learned example(s) kept, unlinked from their decision\n"
    )
