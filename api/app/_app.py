"""The app factory: ``create_app(settings)`` wires the API over a runtime, the decision log and metrics.

Everything with a lifetime is opened in the app's ``lifespan`` and closed when it ends; requests
reach it through the lifespan state, so nothing lives in module globals and several apps can run in
one process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import AsyncExitStack, asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import RedirectResponse

from fastslow.api._compose import build_runtime
from fastslow.api._learning import Learner
from fastslow.api._monitor import LogMonitor
from fastslow.api._reviews import ReviewWorker
from fastslow.api.store import DecisionStore, database_url_for
from fastslow.router import Settings, get_settings

from . import _decisions, _health, _policy_check, _reviews, _route, _systemone, _tasks
from ._admission import GatedEngines
from ._body import RequestGuardMiddleware
from ._docs import DOCS_URL, install_docs
from ._errors import install_error_handlers
from ._jev_schemas import jev_components
from ._keycache import KeyCache
from ._metrics import ApiMetrics, breaker_states
from ._ratelimit import RateLimit, RateLimiter
from ._revocations import revocation_watch
from ._services import Services
from ._throttle import AuthThrottle

__all__ = ["create_app"]

log = logging.getLogger("fastslow.api")

POLICY_WATCH_INTERVAL_S = 1.0


def _version() -> str:
    try:
        return version("fastslow")
    except PackageNotFoundError:
        return "0+unknown"


def _lifespan(settings: Settings, limit: RateLimit) -> Callable[[FastAPI], Any]:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        async with AsyncExitStack() as stack:
            # Migrations first: a replica must not serve against a schema it does not know.
            decisions = await DecisionStore.open(
                database_url_for(settings), migrate=True, queue=settings.store.queue, batch=settings.store.batch
            )
            # Closed last: its writer commits what the requests before shutdown queued.
            stack.push_async_callback(decisions.aclose)
            revocations = revocation_watch(database_url_for(settings))
            await stack.enter_async_context(revocations.running())
            # Loading the policy trains the embedded engine on its examples: blocking work, off the loop.
            runtime = await asyncio.to_thread(build_runtime, settings)
            stack.push_async_callback(runtime.aclose)
            metrics = ApiMetrics()
            stack.callback(runtime.store.add_listener(lambda _old, _new: metrics.policy_reloads.inc()))
            stack.callback(runtime.store.add_failure_listener(lambda _error: metrics.policy_reload_failures.inc()))
            limiter = RateLimiter(decisions.engine, limit)
            await stack.enter_async_context(runtime.store.watching(interval_s=POLICY_WATCH_INTERVAL_S))
            engines = GatedEngines(runtime.engines, settings.limits, default=settings.engine)
            learner = Learner(
                decisions,
                runtime.engines,
                lambda: runtime.store.current,
                max_wait_s=settings.learning.max_wait_s,
                observe=lambda task, result: metrics.learned.labels(task=task, result=result).inc(),
                on_retrain=metrics.retrains.inc,
            )
            # Trained on what was learned before this replica started, before it takes requests.
            await learner.refresh(force=True)
            await stack.enter_async_context(learner.running(poll_s=settings.learning.poll_s))
            # Expires due reviews and sends the tenants' review webhooks (docs/reviews.md).
            await stack.enter_async_context(ReviewWorker(decisions, settings.reviews).running())
            # The shared log's figures and the drift check as gauges, refreshed in the background.
            monitor = LogMonitor(
                decisions,
                metrics.log_figures,
                settings=settings,
                policy=lambda: runtime.store.current,
                policy_path=runtime.policy_source.path,
            )
            await stack.enter_async_context(monitor.running())
            services = Services(
                settings=settings,
                runtime=runtime,
                decisions=decisions,
                metrics=metrics,
                limiter=limiter,
                engines=engines,
                learner=learner,
                keys=KeyCache(settings.auth_cache_s, watch=revocations),
                throttle=AuthThrottle(settings.auth_throttle, on_refused=metrics.auth_throttled.inc),
            )
            await stack.enter_async_context(metrics.observing_breakers(lambda: breaker_states(runtime)))
            log.info("fastslow API ready: policy %s, engine %s", runtime.store.version, settings.engine)
            yield {"services": services}

    return lifespan


_UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})


def _untraced(scope: MutableMapping[str, Any]) -> bool:
    path, root = str(scope.get("path", "")), str(scope.get("root_path", ""))
    return (path[len(root) :] if root and path.startswith(root) else path) in _UNTRACED


def _redirect_to(path: str) -> Callable[[Request], Awaitable[RedirectResponse]]:
    async def home(request: Request) -> RedirectResponse:
        """``GET /``: a 307 to ``path``, under the root path a proxy mounts the API at."""
        root = str(request.scope.get("root_path", "")).rstrip("/")
        return RedirectResponse(f"{root}{path}", status_code=307)

    return home


def create_app(settings: Settings | None = None, *, rate_limit: RateLimit | None = None) -> FastAPI:
    """Build the HTTP API; nothing is opened until the server runs the app's lifespan.

    Args:
        settings: fastslow's settings; ``get_settings()`` when omitted.
        rate_limit: requests per key and window; from the settings when omitted.

    Returns:
        The FastAPI app, with OpenAPI at ``/openapi.json`` and its docs at ``/docs`` and ``/redoc``.
    """
    settings = settings if settings is not None else get_settings()
    app = FastAPI(
        title="fastslow",
        version=_version(),
        summary="Typed System-1 decisions with escalation to System 2: policy checks, routing, a Jev gateway.",
        lifespan=_lifespan(settings, rate_limit if rate_limit is not None else RateLimit.from_settings(settings)),
        # FastAPI's own docs pages load their scripts from a CDN; install_docs serves them from the API.
        docs_url=None,
        redoc_url=None,
        # FastAPI's own OpenTelemetry: under the global tracer provider (fastslow serve installs one when
        # the OTEL_* variables ask), a SERVER span per request that continues the caller's W3C trace
        # context, the decisions' spans inside it. Exporters are fastslow's to set up (configure_tracing),
        # its telemetry logs are off (a validation error's record quotes the request), and probes and
        # scrapes, a trace each every few seconds, are not traced.
        telemetry={"auto_configure": False, "logs": False, "exclude": _untraced},
    )
    app.add_middleware(
        RequestGuardMiddleware, max_bytes=settings.max_body_bytes, body_timeout_s=settings.server.body_timeout_s
    )
    install_error_handlers(app)
    install_docs(app)
    for module in (_policy_check, _route, _systemone, _decisions, _reviews, _tasks, _health):
        app.include_router(module.router)
    home = DOCS_URL
    if settings.console.enabled:
        # Imported here: the console's modules import this package's, and an app without it loads none.
        from fastslow.api.console import CONSOLE_URL, install_console

        install_console(app, settings)
        home = CONSOLE_URL
    # Someone who opens the server's address in a browser lands on the console (on the API's docs
    # when the console is off). A page, not an operation: it stays out of the OpenAPI document.
    app.add_api_route("/", _redirect_to(home), methods=["GET"], include_in_schema=False)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes, tags=app.openapi_tags
            )
            # The gateway reads its own body (JSON or multipart), so FastAPI cannot see its request model.
            schema.setdefault("components", {}).setdefault("schemas", {}).update(jev_components())
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
