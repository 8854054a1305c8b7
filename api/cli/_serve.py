"""``fastslow serve``: the HTTP API, after checking the policy file and migrating the decision log.

The ``OTEL_*`` variables may ask for traces (``_observe``): the provider is installed before the app
is built and shut down, exporting what is queued, after the server has stopped.
``logging.format: json`` gives uvicorn a configuration of JSON lines (``fastslow.api._logs``).

``--workers N`` (N > 1) runs N worker processes behind one listening socket under uvicorn's own
supervisor (``uvicorn.supervisors.Multiprocess``): it starts them, replaces one that dies or stops
answering its health check, and on SIGTERM or SIGINT stops each gracefully (in-flight requests
finish, each worker's writer commits what it queued) before it exits. Each worker is a replica of
its own, as several API processes on one database are (docs/deploy.md): its own engines, writer,
key cache and auth throttle, the rate limit and the trained-head cache shared through the database
and the disk. Its metrics are summed across workers (``fastslow.api.app``'s metrics module).
Workers need PostgreSQL: on a SQLite log, whose writers take turns on one lock, they stalled each
other (``_refuse_sqlite``), so ``--workers`` above 1 refuses it.
"""

from __future__ import annotations

import os
import secrets
import signal
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._base import EXIT_BAD_INPUT, fail, load_settings, read_policy, say_policy
from ._observe import start_tracing

if TYPE_CHECKING:
    from fastapi import FastAPI

    from fastslow.api._telemetry import Tracing
    from fastslow.router import Settings

__all__ = ["serve", "worker_app"]

_WORKER_APP = f"{__name__}:worker_app"
"""What each worker process imports and calls to build its app (uvicorn pickles no app)."""
_METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def _flush_on_sigterm(tracing: Tracing) -> None:
    """On SIGTERM, export the queued spans before the process ends as it would have."""
    # uvicorn stops on SIGTERM, then raises it again with the handler it found: Python's default,
    # which ends the process at once, with no finally and no atexit to export what is queued.
    if threading.current_thread() is not threading.main_thread():
        return

    def flush_then_end(signum: int, _frame: FrameType | None) -> None:
        tracing.shutdown()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    signal.signal(signal.SIGTERM, flush_then_end)


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.", min=0, max=65535)] = 8000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level: debug, info, warning, error.")] = "info",
    workers: Annotated[
        int,
        typer.Option(
            help="Worker processes behind one socket, each a replica with its own engines (docs/deploy.md).", min=1
        ),
    ] = 1,
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs); migrations run first, API keys come from `fastslow keys create`."""
    from fastslow.api._logs import serve_log_config

    from ._db import migrate

    settings = load_settings(None, None)
    if workers > 1:
        _refuse_sqlite(settings, workers)
    # Check what a person can get wrong before the server starts, so a mistake is one line, not
    # a lifespan traceback: the OTEL_* variables, the policy file, and the database (which also migrates it).
    tracing = start_tracing()
    if workers > 1 and tracing is not None:
        tracing.shutdown()  # checked; each worker installs its own provider for its own spans
        tracing = None
    if tracing is not None:
        _flush_on_sigterm(tracing)
    try:
        source, _ = read_policy(settings)
        say_policy(source)
        migrate(settings)
        log_config = serve_log_config(settings.logging.format, log_level)
        logs = {} if log_config is None else {"log_config": log_config}  # none: uvicorn's own
        if workers > 1:
            started = _supervise(settings, host=host, port=port, log_level=log_level, workers=workers, **logs)
        else:
            started = _serve_here(settings, host=host, port=port, log_level=log_level, **logs)
    finally:
        if tracing is not None:
            tracing.shutdown()  # after the server stopped: what its last requests queued is exported
    if not started:
        fail("the API did not start; see the log above", EXIT_BAD_INPUT)


def _refuse_sqlite(settings: Settings, workers: int) -> None:
    from fastslow.api.store import database_url_for, sqlite_path

    path = sqlite_path(database_url_for(settings))
    if path is not None:
        # Measured (bench/workers.py, docs/benchmarks.md): nothing was lost, but SQLite takes one
        # writer at a time and a writer that finds it locked sleeps in growing steps (up to 100 ms)
        # before it tries again, so two workers' group commits stalled each other: p99 0.86 s at 32
        # callers against 0.14 s for one worker.
        fail(
            f"--workers {workers}: the decision log is a SQLite file ({path}), which takes one writer at a time, "
            "and several workers' writers stall each other on its lock. Set FASTSLOW_DATABASE_URL to a PostgreSQL "
            "database (docs/deploy.md), or run one worker.",
            EXIT_BAD_INPUT,
        )


def _serve_here(settings: Settings, **config: Any) -> bool:
    from fastslow.api._server import Server, server_config
    from fastslow.api.app import create_app

    # The connection limits of settings.server (timeouts, header size, framing) come with the config.
    server = Server(server_config(create_app(settings), settings, **config))
    server.run()
    return server.started


def _supervise(settings: Settings, *, workers: int, **config: Any) -> bool:
    """Run ``workers`` worker processes under uvicorn's supervisor; whether they started."""
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    from fastslow.api._server import server_config

    # The workers are spawned (a fresh interpreter each), so what they must share reaches them
    # through the environment they inherit.
    shared: dict[str, str] = {}
    if settings.console.enabled and settings.console.secret is None:
        # Each worker would make a secret of its own, and a session signed by one would be refused
        # by the next worker a browser's request reached.
        shared["FASTSLOW_CONSOLE__SECRET"] = secrets.token_urlsafe(32)
        typer.echo(
            "console.secret is not set: the workers share a random secret made for this run, so console sessions "
            "end when fastslow serve restarts and no other replica accepts them (set FASTSLOW_CONSOLE__SECRET)",
            err=True,
        )
    with _metrics_dir() as path:
        # prometheus-client reads this variable when a worker first imports it.
        shared[_METRICS_DIR_VARIABLE] = str(path)
        os.environ.update(shared)
        try:
            guarded = server_config(_WORKER_APP, settings, factory=True, workers=workers, **config)
            supervisor = Multiprocess(guarded, sockets=[guarded.bind_socket()])
            supervisor.run()
        finally:
            for name in shared:
                del os.environ[name]
    # The supervisor stops everything when a worker fails before it serves (a broken app would
    # fail the same way on every restart) and leaves that worker in its list.
    return not any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes)


@contextmanager
def _metrics_dir() -> Iterator[Path]:
    """Where the workers keep their metrics: ``PROMETHEUS_MULTIPROC_DIR`` emptied, else a temporary folder."""
    given = os.environ.get(_METRICS_DIR_VARIABLE)
    if not given:
        with tempfile.TemporaryDirectory(prefix="fastslow-metrics-") as made:
            yield Path(made)
        return
    path = Path(given)
    path.mkdir(parents=True, exist_ok=True)
    # prometheus-client's rule: files of an earlier run would be summed with this run's figures.
    for stale in path.glob("*.db"):
        stale.unlink()
    yield path


def worker_app() -> FastAPI:
    """The app of one worker process, built from the environment the supervisor was started in.

    uvicorn's supervisor imports this in each worker (``factory=True``): settings, policy and
    database are the ones ``fastslow serve`` checked before it started the workers.
    """
    from fastslow.api._server import freeze_started_heap
    from fastslow.api.app import create_app

    settings = load_settings(None, None)
    tracing = start_tracing()
    app = create_app(settings)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(running: Any) -> AsyncIterator[Any]:
        try:
            async with inner(running) as state:
                # What fastslow.api.Server does after startup; a worker runs uvicorn's own server.
                freeze_started_heap()
                yield state
        finally:
            # A worker ends on the SIGTERM uvicorn raises again after shutdown, with no atexit:
            # export what the last requests queued while the process still runs.
            if tracing is not None:
                tracing.shutdown()

    app.router.lifespan_context = lifespan
    return app
