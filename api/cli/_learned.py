"""``fastslow learned``: what tasks learned from escalations, and withdrawing an example by hand."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ._base import EXIT_BAD_INPUT, fail, load_settings, run_store

__all__ = ["learned_app"]

learned_app = typer.Typer(help="Examples tasks learned from escalations and outcomes.", no_args_is_help=True)


@learned_app.command("list")
def learned_list(
    task: Annotated[str | None, typer.Option(help="Only this task's examples.")] = None,
    withdrawn: Annotated[bool, typer.Option("--withdrawn", help="Also the withdrawn ones, with why.")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, oldest first.")] = 1000,
) -> None:
    """The learned examples in force (one line each: id, task, question, option, source, text)."""
    wanted = None if task is None else [task]
    examples = run_store(load_settings(), lambda store: store.learned.list(wanted, withdrawn=withdrawn, limit=limit))
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
    found = run_store(load_settings(), lambda store: store.learned.withdraw(example_id, why=why))
    if not found:
        fail(f"no learned example {example_id!r} in force", EXIT_BAD_INPUT)
    sys.stderr.write(f"withdrew {example_id}\n")
