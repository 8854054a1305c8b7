"""``fastslow decide``: answer a Jev request body (or a stream of them, as JSON Lines) with System 1."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._base import EXIT_BAD_INPUT, EXIT_ENGINE, check_engine, fail, load_settings
from ._observe import observed

if TYPE_CHECKING:
    from fastslow.router import Settings

__all__ = ["decide"]


def _read_body(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    path = Path(source)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read {source}: {exc.strerror}", EXIT_BAD_INPUT)


async def _decide(settings: Settings, body: str) -> dict[str, Any]:
    from fastslow.engines import build_engine
    from fastslow.router.engine_api import parse_systemone_request, render_systemone_reply

    request = parse_systemone_request(body, max_state_chars=settings.max_state_chars, limits=settings.limits)
    engine = build_engine(settings)
    try:
        reply = await engine.decide(request.state, request.questions, options=request.options)
    finally:
        await engine.aclose()
    return render_systemone_reply(reply, request.questions)


def decide(
    source: Annotated[
        str, typer.Argument(help="Jev /v1/systemone request body: a file, or - for stdin; *.jsonl: JSON Lines.")
    ] = "-",
    engine: Annotated[
        str | None,
        typer.Option(help="Engine to use: embedded, sparrow, examples, jev, openai-decisions, logprob, or a plugin's."),
    ] = None,
    examples: Annotated[
        Path | None, typer.Option(help="Examples file (JSON/YAML) for the example-trained engine.")
    ] = None,
    pretty: Annotated[bool, typer.Option(help="Indent the JSON output (not with JSON Lines).")] = False,
    jsonl: Annotated[
        bool | None,
        typer.Option(
            "--jsonl/--no-jsonl",
            help="Read JSON Lines: one request per line, one response per line. Default: on for a *.jsonl file.",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="JSON Lines: how many lines are answered at once.")] = 4,
) -> None:
    """Answer a Jev request body with the configured engine and print Jev's response body.

    With JSON Lines (--jsonl, or a source file named *.jsonl) each line is a
    request, all answered by one engine (the models load once), up to
    --concurrency at a time. The responses come one per line, in the order of
    the requests, each as soon as it and those before it are done. Blank lines
    are skipped. A line that is not a valid request, or that the engine could
    not answer, gets an error line and the lines after it go on:
    {"error": {"line": N, "type": "invalid_request" or "engine_error",
    "message": ..., "field": ...}}, N being its line in the file (blank lines
    count).

    Exit status: 0 when every request was answered; 1 with JSON Lines when any
    line got an error line; 2 for a bad option, request or configuration; 3
    when the engine could not answer a single request.
    """
    engine_name = check_engine(engine)
    lines = jsonl if jsonl is not None else source.lower().endswith(".jsonl")
    if lines and pretty:
        fail("--pretty: JSON Lines are one response per line; drop --pretty", EXIT_BAD_INPUT)
    if concurrency < 1:
        fail(f"--concurrency: must be at least 1, not {concurrency}", EXIT_BAD_INPUT)
    settings = load_settings(engine_name, examples)
    if lines:
        from ._jsonl import decide_jsonl

        with observed(settings):  # one trace per line
            decide_jsonl(settings, source, concurrency)
        return
    from fastslow.router import ConfigError, EngineError, InvalidRequest

    body = _read_body(source)
    try:
        with observed(settings, span="fastslow decide"):
            result = asyncio.run(_decide(settings, body))
    except InvalidRequest as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except ConfigError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    except EngineError as exc:
        fail(str(exc), EXIT_ENGINE)
    sys.stdout.write(json.dumps(result, indent=2 if pretty else None, ensure_ascii=False) + "\n")
