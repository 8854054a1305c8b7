"""``fastslow keys``: API keys for the HTTP API (create, list, revoke)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from ._base import EXIT_BAD_INPUT, fail, load_settings, run_store, when, write_line

if TYPE_CHECKING:
    from fastslow.api.store import ApiKey, DecisionStore

__all__ = ["keys_app"]

keys_app = typer.Typer(help="API keys for the HTTP API.", no_args_is_help=True)


_SCOPE_HELP = (
    "What the key may do, repeatable (or comma-separated): check (decide: policy checks, routes, the "
    "gateway), read (the decision log, signing in to the console) or review (settle reviews in the "
    "console). Default: check and read."
)


def _scopes(given: list[str] | None) -> frozenset[str]:
    # The store's import waits until a key is made: `keys --help` stays as fast as typer.
    from fastslow.api.store import DEFAULT_SCOPES, SCOPES

    if not given:
        return frozenset(DEFAULT_SCOPES)
    names = {name.strip().lower() for value in given for name in value.split(",")}
    unknown = sorted(names - set(SCOPES))
    if unknown:
        fail(f"--scope: unknown scope {unknown[0]!r}; use {', '.join(SCOPES)}", EXIT_BAD_INPUT)
    return frozenset(names)


def _ordered(scopes: frozenset[str]) -> list[str]:
    from fastslow.api.store import SCOPES

    return [s for s in SCOPES if s in scopes]


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant whose decisions the key may see.")],
    name: Annotated[str | None, typer.Option(help="A label for people, such as the service using it.")] = None,
    scope: Annotated[list[str] | None, typer.Option("--scope", help=_SCOPE_HELP)] = None,
) -> None:
    """Create an API key and print it once: it is not kept and cannot be shown again."""
    if not tenant.strip():
        fail("--tenant: must not be empty", EXIT_BAD_INPUT)
    scopes = _scopes(scope)
    key, record = run_store(load_settings(), lambda store: store.create_key(tenant, name=name, scopes=scopes))
    sys.stdout.write(f"{key}\n")
    sys.stderr.write(
        f"created key {record.prefix}... (id {record.id}) for tenant {record.tenant!r} "
        f"with scopes {', '.join(_ordered(record.scopes))}; store it now, it is shown only once\n"
    )


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option("--tenant", help="Only this tenant's keys.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line instead of a table.")] = False,
) -> None:
    """List the API keys, oldest first: id, tenant, name, prefix, scopes, created, revoked (never the key)."""
    from rich.console import Console
    from rich.table import Table

    records = run_store(load_settings(), lambda store: store.list_keys(tenant))
    if as_json:
        for r in records:
            row = {"id": r.id, "tenant": r.tenant, "name": r.name, "prefix": r.prefix, "scopes": _ordered(r.scopes)}
            write_line(row | {"created_at": when(r.created_at), "revoked_at": when(r.revoked_at) or None})
        return
    table = Table("id", "tenant", "name", "prefix", "scopes", "created", "revoked", box=None)
    for r in records:
        scopes = ",".join(_ordered(r.scopes))
        table.add_row(r.id, r.tenant, r.name or "", f"{r.prefix}...", scopes, when(r.created_at), when(r.revoked_at))
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
