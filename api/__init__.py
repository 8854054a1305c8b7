"""fastslow's composition root: settings in, a wired router out; the HTTP app; the command line.

``build_runtime(settings)`` loads the policy and wires engines and System 2 to a ``Router``;
``create_app(settings)`` is the HTTP API (it imports FastAPI and the database layer, so only
when asked for); ``evaluate(data, out_dir, settings=..., options=EvalOptions(...))`` runs an evaluation file through the
engines and the router and writes its report (``fastslow eval``); ``Learner`` learns from
escalations into the decision log (``docs/learning.md``); ``fastslow.api.cli`` is the ``fastslow``
command. ``Server(server_config(app, settings))`` runs an ASGI app under the guarded uvicorn server
``fastslow serve`` uses, for benchmarks that measure an app of their own under it.
``configure_tracing()`` installs the tracer provider the standard ``OTEL_*`` variables ask for, as
``fastslow serve`` does; an application running graphs in process calls it (or installs its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._compose import Runtime, build_runtime
    from ._evaluate import EvalOptions, evaluate
    from ._learning import Learner
    from ._server import Server, server_config
    from ._telemetry import Tracing, configure_tracing
    from .app import create_app

__all__ = [
    "EvalOptions",
    "Learner",
    "Runtime",
    "Server",
    "Tracing",
    "build_runtime",
    "configure_tracing",
    "create_app",
    "evaluate",
    "server_config",
]


def __getattr__(name: str) -> object:
    # PEP 562: FastAPI and SQLAlchemy load with the HTTP app, not with the runtime; the engines and
    # the kernel with the runtime, not with the package, so that the command line (fastslow.api.cli,
    # which imports this package first) starts without them.
    if name in ("Runtime", "build_runtime"):
        from . import _compose

        return getattr(_compose, name)
    if name == "create_app":
        from .app import create_app

        return create_app
    if name in ("EvalOptions", "evaluate"):
        from . import _evaluate

        return getattr(_evaluate, name)
    if name == "Learner":
        from ._learning import Learner

        return Learner
    if name in ("Server", "server_config"):
        from . import _server

        return getattr(_server, name)
    if name in ("Tracing", "configure_tracing"):
        from . import _telemetry

        return getattr(_telemetry, name)
    raise AttributeError(f"module 'fastslow.api' has no attribute {name!r}")
