"""``/healthz`` (the process is up), ``/readyz`` (store and engines reachable) and ``/metrics``.

A network engine whose circuit breaker is open counts as unreachable: this replica fails its calls
fast, so it is not ready to answer System-1 questions until a probe closes the breaker again.

``/readyz`` also says whether the policy file on disk is the policy in force. A file that failed to
load is reported there (and counted in ``/metrics``) but does not make the replica unready: the last
good policy is still in force and serving.

None of them needs a key: probes and Prometheus scrapers carry none, and nothing here is
tenant data (see ``_metrics`` for what labels may hold).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from fastslow.policies import PolicyStore
from fastslow.router import ConfigError, EngineError
from fastslow.router.engine_api import DecisionEngine

from .deps import ServicesDep

__all__ = ["router"]

router = APIRouter(tags=["operations"])

PROBE_TIMEOUT_S = 2.0


class Health(BaseModel):
    status: str = Field(description="Always ok while the process serves requests.")


class PolicyFileState(BaseModel):
    in_force: bool = Field(
        description="False when the last change to the policy file failed to load (true while a change settles)."
    )
    error: str | None = Field(
        default=None, description="Why the file on disk is not in force: the first line of the error, no paths."
    )


class Readiness(BaseModel):
    status: str = Field(description="ready, or not_ready (with status 503).")
    store: bool = Field(description="The decision log answered a query.")
    engines: dict[str, bool] = Field(
        description="Each System-1 engine in use: built, its server reachable, and its circuit breaker not open."
    )
    breakers: dict[str, str] = Field(
        default_factory=dict,
        description="Each network engine's circuit breaker on this replica: closed, half_open, open.",
    )
    policy_version: str
    policy_file: PolicyFileState = Field(description="Whether the policy file on disk is the policy in force.")


def _policy_file_state(store: PolicyStore) -> PolicyFileState:
    error = store.last_error
    if error is None:
        return PolicyFileState(in_force=True)
    # Unauthenticated probes name no file or folder of the server.
    line = error.strip().splitlines()[0] if error.strip() else "unknown error"
    for name in (str(store.path), store.path.name):
        line = line.replace(name, "<policy file>")
    return PolicyFileState(in_force=False, error=line)


async def _reachable(engine: DecisionEngine) -> bool:
    # Network engines name their server; a TCP connect is enough to tell "down" from "up" without
    # spending a decision. In-process engines are ready once built.
    url = getattr(engine, "url", None) or getattr(engine, "base_url", None)
    if not isinstance(url, str):
        return True
    parts = urlsplit(url)
    if not parts.hostname:
        return True
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(parts.hostname, port), PROBE_TIMEOUT_S)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": Readiness, "description": "Not ready."}})
async def readyz(services: ServicesDep) -> JSONResponse:
    """Ready when the decision log answers and every engine the policy uses is built and reachable.

    A policy file that failed to load is reported in ``policy_file`` without making the replica
    unready: the last good policy is in force and serving.
    """
    runtime = services.runtime
    policy = runtime.router.policy
    names = {task.engine or services.settings.engine for task in policy.tasks.values()} | {services.settings.engine}
    breakers: dict[str, str] = {name: snap.state for name, snap in runtime.engines.breakers().items()}
    engines: dict[str, bool] = {}
    for name in sorted(names):
        if breakers.get(name) == "open":  # failing fast: this replica's System 1 cannot answer now
            engines[name] = False
            continue
        try:
            engines[name] = await _reachable(runtime.engines.engine_for(name, policy))
        except (ConfigError, EngineError):
            engines[name] = False
    store = await services.decisions.ping()
    ready = store and all(engines.values())
    body: dict[str, Any] = Readiness(
        status="ready" if ready else "not_ready",
        store=store,
        engines=engines,
        breakers=breakers,
        policy_version=policy.version,
        policy_file=_policy_file_state(runtime.store),
    ).model_dump()
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text."}},
)
async def metrics(services: ServicesDep) -> Response:
    """Prometheus metrics: decisions, escalations, engine latency and errors, breakers, policy reloads."""
    services.metrics.observe_breakers({name: snap.state for name, snap in services.runtime.engines.breakers().items()})
    return Response(services.metrics.render(), media_type=services.metrics.content_type)
