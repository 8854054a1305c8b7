"""``fastslow learned``: what tasks learned from escalations, and withdrawing an example by hand."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import typer

from fastslow.router import Settings

from .store import LearnedExample

__all__ = ["learned_app"]

learned_app = typer.Typer(help="Examples tasks learned from escalations and outcomes.", no_args_is_help=True)


async def _list(settings: Settings, task: str | None, withdrawn: bool, limit: int) -> list[LearnedExample]:
    from .store import DecisionStore, database_url_for

    store = await DecisionStore.open(database_url_for(settings))
    try:
        return await store.learned.list(None if task is None else [task], withdrawn=withdrawn, limit=limit)
    finally:
        await store.aclose()


async def _withdraw(settings: Settings, example_id: str, why: str) -> bool:
    from .store import DecisionStore, database_url_for

    store = await DecisionStore.open(database_url_for(settings))
    try:
        return await store.learned.withdraw(example_id, why=why)
    finally:
        await store.aclose()


@learned_app.command("list")
def learned_list(
    task: Annotated[str | None, typer.Option(help="Only this task's examples.")] = None,
    withdrawn: Annotated[bool, typer.Option("--withdrawn", help="Also the withdrawn ones, with why.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, oldest first.")] = 1000,
) -> None:
    """The learned examples in force (one line each: id, task, question, option, source, text)."""
    from sqlalchemy.exc import SQLAlchemyError

    from .cli import EXIT_STORE, _fail, _settings

    try:
        examples = asyncio.run(_list(_settings(None, None), task, withdrawn, limit))
    except (SQLAlchemyError, OSError) as exc:
        _fail(f"decision log: {type(exc).__name__}: {exc}", EXIT_STORE)
    for e in examples:
        state = "" if e.retracted_at is None else f"\twithdrawn: {e.retracted_why}"
        sys.stdout.write(f"{e.id}\t{e.task}\t{e.question}\t{e.option}\t{e.source}\t{e.text!r}{state}\n")
    sys.stderr.write(f"{len(examples)} learned example(s)\n")


@learned_app.command("withdraw")
def learned_withdraw(
    example_id: Annotated[str, typer.Argument(help="The example's id (from `fastslow learned list`).")],
    why: Annotated[str, typer.Option(help="Why, for the record.")] = "withdrawn by an operator",
) -> None:
    """Withdraw one learned example; every replica retrains without it at its next poll."""
    from sqlalchemy.exc import SQLAlchemyError

    from .cli import EXIT_BAD_INPUT, EXIT_STORE, _fail, _settings

    try:
        found = asyncio.run(_withdraw(_settings(None, None), example_id, why))
    except (SQLAlchemyError, OSError) as exc:
        _fail(f"decision log: {type(exc).__name__}: {exc}", EXIT_STORE)
    if not found:
        _fail(f"no learned example {example_id!r} in force", EXIT_BAD_INPUT)
    sys.stderr.write(f"withdrew {example_id}\n")
