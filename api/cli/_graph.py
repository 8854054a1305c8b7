"""``fastslow graph``: the ready agent graphs, and running one on a message."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from ._base import EXIT_BAD_INPUT, EXIT_ENGINE, fail, load_settings, read_policy, say_policy
from ._observe import observed

if TYPE_CHECKING:
    from fastslow.router import Settings

__all__ = ["graph_app"]

graph_app = typer.Typer(help="Ready agent graphs.", no_args_is_help=True)


@graph_app.command("list")
def graph_list() -> None:
    """Name the ready graphs, one per line, and the policy file they would run with (checked first)."""
    from fastslow.graphs import GRAPHS

    source, _ = read_policy(load_settings(None, None))
    sys.stdout.write("".join(f"{name}\n" for name in GRAPHS))
    say_policy(source)


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
            engines=runtime.engines,  # guarded-tools' offline planner asks System 1 when no chat model is configured
        )
    finally:
        await runtime.aclose()


_SYSTEM2_HOWTO = (
    "set FASTSLOW_SYSTEM2__DEFAULT (openai:MODEL with OPENAI_API_KEY, anthropic:MODEL with ANTHROPIC_API_KEY, "
    "or local:MODEL with FASTSLOW_SYSTEM2__LOCAL_BASE_URL for a self-hosted server; README, 'Using the router "
    "in a graph')"
)


def summary(result: dict[str, Any]) -> list[str]:
    """What a run did, for a person: System 1's decision, the gate's verdicts, and what comes next."""
    from fastslow.graphs import call_text

    lines: list[str] = []
    decision = result.get("decision")
    if isinstance(decision, dict):
        how = f"p={decision['confidence']:.2f}, {decision['reason']}; {decision['engine']} engine"
        if decision["system"] == 1 and not decision["escalate"] and decision["outcome"] is not None:
            lines.append(f"System 1 routed the message to {decision['outcome']} ({how}).")
        elif decision["outcome"] is not None:
            lines.append(f"System 2 routed the message to {decision['outcome']} ({decision['reason']}).")
        else:
            lines.append(f"System 1 left the message to System 2 ({how}): it goes to the frontier agent.")
    calls = {c["id"]: c for m in result.get("messages", []) if isinstance(m, dict) for c in m.get("tool_calls", [])}
    for verdict in result.get("gate", []):
        call = calls.get(verdict["tool_call_id"], {"name": "?"})
        lines.append(
            f"Policy gate: {verdict['verdict']} {call_text(call)} (rule {verdict['rule']}, by {verdict['by']})."
        )
    for paused in result.get("interrupts", []):
        value = paused.get("value") or {}
        if isinstance(value, dict) and "tool_call" in value:
            lines.append(
                f"Policy gate: review {call_text(value['tool_call'])} (rule {value.get('rule')}, "
                f"p={value.get('probability', 0):.2f}): paused for a person to allow or deny."
            )
    skipped = [s["node"] for s in result.get("steps", []) if s.get("status") == "skipped"]
    if result.get("outcome") == "needs_system2":
        where = f"the {skipped[-1]} step" if skipped else "the next step"
        lines.append(
            f"Done offline: System 1's part is done; {where} needs a System-2 model to write its reply, and "
            f"none is configured. To run it, {_SYSTEM2_HOWTO}."
        )
    elif result.get("outcome") == "engine_error":
        failed = next((s for s in result.get("steps", []) if s.get("status") == "failed"), None)
        lines.append(f"A model failed: {failed['detail'] if failed else 'see the steps'}")
    return lines


@graph_app.command("run")
def graph_run(
    name: Annotated[str, typer.Argument(help="A graph from `fastslow graph list`.")],
    input: Annotated[str, typer.Option("--input", help="The user's message.")],
    pretty: Annotated[bool, typer.Option(help="Indent the JSON output.")] = False,
) -> None:
    """Run a ready graph on one message: its final state as JSON on stdout, what happened in words on stderr.

    Offline (no System-2 model configured) a run that did System 1's part exits 0 with outcome
    ``needs_system2``; a model that failed exits 3.
    """
    from fastslow.graphs import GRAPHS
    from fastslow.router import ConfigError, EngineError

    if name not in GRAPHS:
        fail(f"unknown graph {name!r}; expected one of {', '.join(GRAPHS)}", EXIT_BAD_INPUT)
    settings = load_settings(None, None)
    try:
        with observed(settings, span=f"fastslow graph run {name}"):
            result = asyncio.run(_run_graph(settings, name, input))
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except EngineError as exc:
        fail(str(exc), EXIT_ENGINE)
    sys.stdout.write(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False, default=str) + "\n")
    # For a person, on stderr: stdout stays the final state as JSON, for scripts.
    sys.stderr.write("".join(f"{line}\n" for line in summary(result)))
    if result.get("outcome") == "engine_error":
        raise typer.Exit(EXIT_ENGINE)
