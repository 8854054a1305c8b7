"""The ``fastslow`` command line.

Bad input ends with one line on stderr naming the field, and a non-zero exit: 2 for a bad request
or configuration, 3 when the engine could not answer. Never a traceback for a user mistake.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn, cast, get_args

import typer

from fastslow.policies import BUILTIN_POLICY, POLICY_FILE_NAME, PolicySource, load_policy, locate_policy
from fastslow.router import ConfigError, EngineError, EngineName, InvalidRequest, Settings, get_settings
from fastslow.router.engine_api import parse_systemone_request, render_systemone_reply

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


def _settings(engine: EngineName | None, examples: Path | None) -> Settings:
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
    from fastslow.engines import build_engine

    request = parse_systemone_request(body, max_state_chars=settings.max_state_chars, limits=settings.limits)
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
    settings = _settings(cast(EngineName | None, engine), examples)
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


def _policy_source(settings: Settings) -> PolicySource:
    try:
        return locate_policy(settings)
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)


def _say_policy(source: PolicySource) -> None:
    # On stderr: stdout stays the command's result, for scripts.
    sys.stderr.write(f"policy: {source.describe()}\n")


@graph_app.command("list")
def graph_list() -> None:
    """Name the ready graphs, one per line, and the policy file they would run with."""
    from fastslow.graphs import GRAPHS

    sys.stdout.write("".join(f"{name}\n" for name in GRAPHS))
    _say_policy(_policy_source(_settings(None, None)))


async def _run_graph(settings: Settings, name: str, text: str) -> dict[str, Any]:
    from fastslow.graphs import GraphName, run_graph

    from ._compose import build_runtime

    runtime = build_runtime(settings)
    _say_policy(runtime.policy_source)  # the file the runtime loaded, not a second look-up
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


EXIT_STORE = 4
"""The decision log's database could not be reached or migrated."""


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def _migrate(settings: Settings) -> str:
    """Run the decision log's migrations; the URL (password hidden) on success, one line on failure."""
    from sqlalchemy.exc import SQLAlchemyError

    from .store import database_url_for, upgrade

    try:
        url = database_url_for(settings)
        upgrade(url)
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except (SQLAlchemyError, OSError) as exc:
        _fail(f"decision log: cannot migrate the database: {type(exc).__name__}: {exc}", EXIT_STORE)
    return _safe_url(url)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.", min=0, max=65535)] = 8000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level: debug, info, warning, error.")] = "info",
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs); migrations run first, API keys come from `fastslow keys create`."""
    import uvicorn

    from ._server import server_config
    from .app import create_app

    settings = _settings(None, None)
    # Check what a person can get wrong before the server starts, so a mistake is one line, not
    # a lifespan traceback: the policy file, and the database (which also migrates it).
    source = _policy_source(settings)
    try:
        load_policy(source.path)
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    _say_policy(source)
    _migrate(settings)
    # The connection limits of settings.server (timeouts, header size, framing) come with the config.
    server = uvicorn.Server(server_config(create_app(settings), settings, host=host, port=port, log_level=log_level))
    server.run()
    if not server.started:
        _fail("the API did not start; see the log above", EXIT_BAD_INPUT)


keys_app = typer.Typer(help="API keys for the HTTP API.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


async def _create_key(settings: Settings, tenant: str, name: str | None) -> tuple[str, Any]:
    from .store import DecisionStore, database_url_for

    store = await DecisionStore.open(database_url_for(settings))
    try:
        return await store.create_key(tenant, name=name)
    finally:
        await store.aclose()


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant whose decisions the key may see.")],
    name: Annotated[str | None, typer.Option(help="A label for people, such as the service using it.")] = None,
) -> None:
    """Create an API key and print it once: it is not kept and cannot be shown again."""
    from sqlalchemy.exc import SQLAlchemyError

    if not tenant.strip():
        _fail("--tenant: must not be empty", EXIT_BAD_INPUT)
    settings = _settings(None, None)
    try:
        key, record = asyncio.run(_create_key(settings, tenant, name))
    except ConfigError as exc:
        _fail(str(exc), EXIT_BAD_INPUT)
    except (SQLAlchemyError, OSError) as exc:
        _fail(f"decision log: {type(exc).__name__}: {exc}", EXIT_STORE)
    sys.stdout.write(f"{key}\n")
    sys.stderr.write(
        f"created key {record.prefix}... (id {record.id}) for tenant {record.tenant!r}; "
        "store it now, it is shown only once\n"
    )


db_app = typer.Typer(help="The decision log's database.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Migrate the decision log to the newest schema (`fastslow serve` also does this on start)."""
    url = _migrate(_settings(None, None))
    sys.stderr.write(f"decision log at {url} is up to date\n")


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the policy file.")] = Path(POLICY_FILE_NAME),
    force: Annotated[bool, typer.Option(help="Overwrite the file if it exists.")] = False,
) -> None:
    """Write a commented starter policy (the built-in example) for you to edit."""
    if path.exists() and not force:
        _fail(f"{path} exists; pass --force to overwrite it", EXIT_BAD_INPUT)
    try:
        path.write_bytes(BUILTIN_POLICY.read_bytes())
    except OSError as exc:
        _fail(f"cannot write {path}: {exc.strerror}", EXIT_BAD_INPUT)
    tasks = ", ".join(load_policy(path).tasks)
    found = path.resolve() == (Path.cwd() / POLICY_FILE_NAME).resolve()
    hint = (
        "fastslow uses it when run from this folder" if found else f"use it with FASTSLOW_POLICY_FILE={path.resolve()}"
    )
    sys.stderr.write(f"wrote {path} (tasks: {tasks}); edit it, {hint}; changes reload without a restart\n")


ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)


def main() -> None:
    """Entry point for ``python -m fastslow.api.cli``."""
    app()


if __name__ == "__main__":
    main()
