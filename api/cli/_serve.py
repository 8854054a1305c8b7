"""``fastslow serve``: the HTTP API, after checking the policy file and migrating the decision log.

The ``OTEL_*`` variables may ask for traces (``_observe``): the provider is installed before the app
is built and shut down, exporting what is queued, after the server has stopped.
``logging.format: json`` gives uvicorn a configuration of JSON lines (``fastslow.api._logs``).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from ._base import EXIT_BAD_INPUT, fail, load_settings, read_policy, say_policy
from ._observe import start_tracing

if TYPE_CHECKING:
    from fastslow.api._telemetry import Tracing

__all__ = ["serve"]


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
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs); migrations run first, API keys come from `fastslow keys create`."""
    from fastslow.api._logs import serve_log_config
    from fastslow.api._server import Server, server_config
    from fastslow.api.app import create_app

    from ._db import migrate

    settings = load_settings(None, None)
    # Check what a person can get wrong before the server starts, so a mistake is one line, not
    # a lifespan traceback: the OTEL_* variables, the policy file, and the database (which also migrates it).
    tracing = start_tracing()
    if tracing is not None:
        _flush_on_sigterm(tracing)
    try:
        source, _ = read_policy(settings)
        say_policy(source)
        migrate(settings)
        log_config = serve_log_config(settings.logging.format, log_level)
        logs = {} if log_config is None else {"log_config": log_config}  # none: uvicorn's own
        # The connection limits of settings.server (timeouts, header size, framing) come with the config.
        app = create_app(settings)
        server = Server(server_config(app, settings, host=host, port=port, log_level=log_level, **logs))
        server.run()
    finally:
        if tracing is not None:
            tracing.shutdown()  # after the server stopped: what its last requests queued is exported
    if not server.started:
        fail("the API did not start; see the log above", EXIT_BAD_INPUT)
