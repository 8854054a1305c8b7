"""The ``fastslow`` command line.

Bad input ends with one line on stderr naming the field, and a non-zero exit: 2 for a bad request
or configuration, 3 when the engine could not answer. Never a traceback for a user mistake.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn, cast

import typer

from router import (
    ConfigError,
    EngineError,
    EngineName,
    InvalidRequest,
    Settings,
    get_settings,
    parse_systemone_request,
    render_systemone_reply,
)

__all__ = ["app"]

app = typer.Typer(
    name="fastslow",
    help="System-1 / System-2 router for agent graphs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """System-1 / System-2 router for agent graphs."""


EXIT_BAD_INPUT = 2
EXIT_ENGINE = 3


def _fail(message: str, code: int) -> NoReturn:
    # One line, no traceback: a person (or a script) reads it.
    sys.stderr.write(f"error: {' '.join(message.split())}\n")
    raise typer.Exit(code)


def _read_body(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        _fail(f"cannot read {source}: {exc.strerror}", EXIT_BAD_INPUT)


def _settings(engine: str | None, examples: Path | None) -> Settings:
    try:
        settings = get_settings()
    except Exception as exc:  # pydantic's ValidationError: a bad FASTSLOW_* variable or file
        _fail(f"settings: {exc}", EXIT_BAD_INPUT)
    updates: dict[str, Any] = {}
    if engine is not None:
        updates["engine"] = engine
    if examples is not None:
        if not examples.is_file():
            _fail(f"--examples: no such file {examples}", EXIT_BAD_INPUT)
        updates["embedded"] = settings.embedded.model_copy(update={"examples": examples})
    return settings.model_copy(update=updates)


async def _decide(settings: Settings, body: str) -> dict[str, Any]:
    from engines import build_engine

    request = parse_systemone_request(body, max_state_chars=settings.max_state_chars)
    engine = build_engine(settings)
    try:
        reply = await engine.decide(request.state, request.questions, options=request.options)
    finally:
        await engine.aclose()
    return render_systemone_reply(reply, request.questions)


@app.command()
def decide(
    source: Annotated[str, typer.Argument(help="Jev /v1/systemone request body: a file, or - for stdin.")] = "-",
    engine: Annotated[
        str | None, typer.Option(help="Engine to use: embedded, sparrow, examples, jev, openai-decisions, logprob.")
    ] = None,
    examples: Annotated[
        Path | None, typer.Option(help="Examples file (JSON/YAML) for the example-trained engine.")
    ] = None,
    pretty: Annotated[bool, typer.Option(help="Indent the JSON output.")] = False,
) -> None:
    """Answer a Jev request body with the configured engine and print Jev's response body."""
    if engine is not None and engine not in ENGINE_NAMES:
        _fail(f"--engine: unknown engine {engine!r}; expected one of {', '.join(ENGINE_NAMES)}", EXIT_BAD_INPUT)
    settings = _settings(engine, examples)
    body = _read_body(source)
    try:
        result = asyncio.run(_decide(settings, body))
    except InvalidRequest as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except EngineError as exc:
        _fail(str(exc), EXIT_ENGINE)
    sys.stdout.write(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False) + "\n")


graph_app = typer.Typer(help="Ready agent graphs.", no_args_is_help=True)
app.add_typer(graph_app, name="graph")


@graph_app.command("list")
def graph_list() -> None:
    """Name the ready graphs, one per line."""
    from graphs import GRAPHS

    sys.stdout.write("".join(f"{name}\n" for name in GRAPHS))


async def _run_graph(settings: Settings, name: str, text: str) -> dict[str, Any]:
    from graphs import GraphName, run_graph

    from ._compose import build_runtime

    runtime = build_runtime(settings)
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
    from graphs import GRAPHS

    if name not in GRAPHS:
        _fail(f"unknown graph {name!r}; expected one of {', '.join(GRAPHS)}", EXIT_BAD_INPUT)
    settings = _settings(None, None)
    try:
        result = asyncio.run(_run_graph(settings, name, input))
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except EngineError as exc:
        _fail(str(exc), EXIT_ENGINE)
    sys.stdout.write(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False, default=str) + "\n")


ENGINE_NAMES: tuple[str, ...] = EngineName.__args__  # type: ignore[attr-defined]


def main() -> None:
    """Entry point for ``python -m api.cli``."""
    app()


if __name__ == "__main__":
    main()
