"""``fastslow serve``: the HTTP API, after checking the policy file and migrating the decision log."""

from __future__ import annotations

from typing import Annotated

import typer

from ._base import EXIT_BAD_INPUT, fail, load_settings, read_policy, say_policy

__all__ = ["serve"]


def serve(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to listen on.", min=0, max=65535)] = 8000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level: debug, info, warning, error.")] = "info",
) -> None:
    """Run the HTTP API (OpenAPI docs at /docs); migrations run first, API keys come from `fastslow keys create`."""
    from fastslow.api._server import Server, server_config
    from fastslow.api.app import create_app

    from ._db import migrate

    settings = load_settings(None, None)
    # Check what a person can get wrong before the server starts, so a mistake is one line, not
    # a lifespan traceback: the policy file, and the database (which also migrates it).
    source, _ = read_policy(settings)
    say_policy(source)
    migrate(settings)
    # The connection limits of settings.server (timeouts, header size, framing) come with the config.
    server = Server(server_config(create_app(settings), settings, host=host, port=port, log_level=log_level))
    server.run()
    if not server.started:
        fail("the API did not start; see the log above", EXIT_BAD_INPUT)
