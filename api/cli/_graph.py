"""``fastslow graph``: the ready agent graphs, and running one on a message."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from ._base import EXIT_BAD_INPUT, EXIT_ENGINE, fail, load_settings, policy_source, say_policy

if TYPE_CHECKING:
    from fastslow.router import Settings

__all__ = ["graph_app"]

graph_app = typer.Typer(help="Ready agent graphs.", no_args_is_help=True)


@graph_app.command("list")
def graph_list() -> None:
    """Name the ready graphs, one per line, and the policy file they would run with."""
    from fastslow.graphs import GRAPHS

    sys.stdout.write("".join(f"{name}\n" for name in GRAPHS))
    say_policy(policy_source(load_settings(None, None)))


async def _run_graph(settings: Settings, name: str, text: str) -> dict[str, Any]:
    from fastslow.api import build_runtime
    from fastslow.graphs import GraphName, run_graph

    runtime = build_runtime(settings)
    say_policy(runtime.policy_source)  # the file the runtime loaded, not a second look-up
    try:
        return await run_graph(
            cast(GraphName, name),
            text,
            router=runtime.router,
            chats=runtime.chats,
            draft_model=settings.system2.draft,
        )
    finally:
        await runtime.aclose()


@graph_app.command("run")
def graph_run(
    name: Annotated[str, typer.Argument(help="A graph from `fastslow graph list`.")],
    input: Annotated[str, typer.Option("--input", help="The user's message.")],
    pretty: Annotated[bool, typer.Option(help="Indent the JSON output.")] = False,
) -> None:
    """Run a ready graph on one message and print its final state as JSON."""
    from fastslow.graphs import GRAPHS
    from fastslow.router import ConfigError, EngineError

    if name not in GRAPHS:
        fail(f"unknown graph {name!r}; expected one of {', '.join(GRAPHS)}", EXIT_BAD_INPUT)
    settings = load_settings(None, None)
    try:
        result = asyncio.run(_run_graph(settings, name, input))
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except EngineError as exc:
        fail(str(exc), EXIT_ENGINE)
    sys.stdout.write(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False, default=str) + "\n")
