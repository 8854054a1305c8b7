"""``fastslow keys`` and ``fastslow db``: API keys, and the decision log's schema and retention."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from fastslow.router import ConfigError, Settings

from ._cli_base import EXIT_BAD_INPUT, EXIT_STORE, fail, load_settings, run_store, when, write_line

if TYPE_CHECKING:
    from .store import ApiKey, DecisionStore, PruneReport

__all__ = ["db_app", "keys_app", "migrate"]


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def migrate(settings: Settings) -> str:
    """Run the decision log's migrations; the URL (password hidden) on success, one line on failure."""
    from sqlalchemy.exc import SQLAlchemyError

    from .store import database_url_for, upgrade

    try:
        url = database_url_for(settings)
        upgrade(url)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except (SQLAlchemyError, OSError) as exc:
        fail(f"decision log: cannot migrate the database: {type(exc).__name__}: {exc}", EXIT_STORE)
    return _safe_url(url)


keys_app = typer.Typer(help="API keys for the HTTP API.", no_args_is_help=True)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant whose decisions the key may see.")],
    name: Annotated[str | None, typer.Option(help="A label for people, such as the service using it.")] = None,
) -> None:
    """Create an API key and print it once: it is not kept and cannot be shown again."""
    if not tenant.strip():
        fail("--tenant: must not be empty", EXIT_BAD_INPUT)
    key, record = run_store(load_settings(), lambda store: store.create_key(tenant, name=name))
    sys.stdout.write(f"{key}\n")
    sys.stderr.write(
        f"created key {record.prefix}... (id {record.id}) for tenant {record.tenant!r}; "
        "store it now, it is shown only once\n"
    )


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's keys.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False,
) -> None:
    """List the API keys, oldest first: id, tenant, name, prefix, created, revoked (never the key)."""
    from rich.console import Console
    from rich.table import Table

    records = run_store(load_settings(), lambda store: store.list_keys(tenant))
    if as_json:
        for r in records:
            row = {"id": r.id, "tenant": r.tenant, "name": r.name, "prefix": r.prefix}
            write_line(row | {"created_at": when(r.created_at), "revoked_at": when(r.revoked_at) or None})
        return
    table = Table("id", "tenant", "name", "prefix", "created", "revoked", box=None)
    for r in records:
        table.add_row(r.id, r.tenant, r.name or "", f"{r.prefix}...", when(r.created_at), when(r.revoked_at))
    # Wide enough for a whole id: a person copies it into `keys revoke`.
    Console(width=max(160, Console().width), soft_wrap=True).print(table)
    sys.stderr.write(f"{len(records)} key(s){'' if tenant is None else f' for tenant {tenant!r}'}\n")


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id, from `fastslow keys list`.")],
) -> None:
    """Revoke an API key: every replica refuses it within FASTSLOW_AUTH_CACHE_S (5 s; 0: at once)."""
    settings = load_settings()

    async def revoke(store: DecisionStore) -> tuple[ApiKey | None, bool]:
        record = await store.get_key(key_id)
        if record is None or record.revoked_at is not None:
            return record, False
        return record, await store.revoke_key(key_id)

    record, revoked = run_store(settings, revoke)
    if record is None:
        fail(f"no API key with id {key_id!r}; `fastslow keys list` shows the ids", EXIT_BAD_INPUT)
    if not revoked:
        sys.stderr.write(f"key {record.prefix}... (id {key_id}) was already revoked at {when(record.revoked_at)}\n")
        return
    sys.stderr.write(
        f"revoked key {record.prefix}... (id {key_id}) of tenant {record.tenant!r}; every replica refuses it at once\n"
    )


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

    from .store import PruneCounts, retention_cutoff

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
        f"{report.expired_keys} expired idempotency key(s); "
        f"{total.learned_unlinked} learned example(s) kept, unlinked from their decision\n"
    )
