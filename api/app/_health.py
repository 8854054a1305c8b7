"""``/healthz`` (the process is up), ``/readyz`` (this replica can answer) and ``/metrics``.

Readiness is judged per policy task, by the paths that can answer it now:

* ``system1``: an engine of its System-1 chain (the task's engine, then ``engine_fallbacks``) is
  built, its server accepts a connection, and its circuit breaker is not open;
* ``system2``: System 1 cannot, but the task escalates on failure (``on_failure: escalate``) and a
  model of its System-2 chain (``escalate_to``, then ``system2.fallbacks``) is configured, allowed
  by the task's egress rule, and not behind an open breaker (frontier APIs are not probed: a probe
  would cost a call and reach outside);
* ``none``: no path can answer; a check would fail closed, a route escalate to nobody.

The replica is ready (200) when the decision log answers and every task has a path; ``degraded``
says some task is served by a fallback or by System 2 only. A network engine whose breaker is open
counts as unreachable: this replica fails its calls fast until a probe closes it again.

``/readyz`` also says whether the policy file on disk is the policy in force, and whether a change
is settling or readying. A file that failed to load is reported there (and counted in
``/metrics``) but does not make the replica unready: the last good policy is still in force.

None of them needs a key: probes and Prometheus scrapers carry none, and nothing here is
tenant data (see ``_metrics`` for what labels may hold).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from fastslow.engines import EnginePool
from fastslow.engines.chat import Frontier, ModelRef, Provider, provider_configured
from fastslow.policies import PolicyStore
from fastslow.router import ConfigError, EngineError, PolicySet, Router
from fastslow.router.engine_api import DecisionEngine
from fastslow.router.settings import System2Settings

from ._metrics import breaker_states
from .deps import ServicesDep

__all__ = ["router"]

router = APIRouter(tags=["operations"])

PROBE_TIMEOUT_S = 2.0

Path_: TypeAlias = Literal["system1", "system2", "none"]


class Health(BaseModel):
    status: str = Field(description="Always ok while the process serves requests.")


class PolicyFileState(BaseModel):
    in_force: bool = Field(
        description="False when the last change to the policy file failed to load (true while a change settles)."
    )
    error: str | None = Field(
        default=None, description="Why the file on disk is not in force: the first line of the error, no paths."
    )
    change: Literal["settling", "readying"] | None = Field(
        default=None,
        description="A change on its way in: settling (loaded once read unchanged again), readying (its engines "
        "training while the policy in force serves).",
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
    system2: dict[str, str] = Field(
        default_factory=dict,
        description="Each System-2 model asked so far on this replica, by reference: its breaker's state.",
    )
    system2_status: str = Field(
        description="Whether the System-2 models the policy escalates to are configured, in words: 'configured: "
        "REFS', 'partly configured: ...' or 'not configured: ...', saying what then happens to decisions that "
        "need System 2 and which setting configures each. Not configured is not unready."
    )
    paths: dict[str, Path_] = Field(
        default_factory=dict, description="Each policy task: what can answer it now (system1, system2 or none)."
    )
    degraded: bool = Field(default=False, description="Some task is answered by a fallback engine or by System 2 only.")
    policy_version: str
    policy_file: PolicyFileState = Field(description="Whether the policy file on disk is the policy in force.")


def _policy_file_state(store: PolicyStore) -> PolicyFileState:
    error = store.last_error
    if error is None:
        return PolicyFileState(in_force=True, change=store.change)
    # Unauthenticated probes name no file or folder of the server.
    line = error.strip().splitlines()[0] if error.strip() else "unknown error"
    for name in (str(store.path), store.path.name):
        line = line.replace(name, "<policy file>")
    return PolicyFileState(in_force=False, error=line, change=store.change)


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
    """Ready when the decision log answers and every policy task has a path that can answer it now.

    See the module docstring for the paths. A policy file that failed to load is reported in
    ``policy_file`` without making the replica unready: the last good policy is in force.
    """
    runtime = services.runtime
    policy = runtime.router.policy
    settings = services.settings
    default = settings.engine
    chains: dict[str, list[str]] = {
        name: [name, *settings.engine_fallbacks.get(name, [])]
        for name in {task.engine or default for task in policy.tasks.values()} | {default}
    }
    breakers: dict[str, str] = {name: snap.state for name, snap in runtime.engines.breakers().items()}
    engines: dict[str, bool] = {}
    for engine in sorted({n for chain in chains.values() for n in chain}):
        engines[engine] = await _engine_up(runtime.engines, engine, policy, breakers)
    paths: dict[str, Path_] = {}
    for task_name, task in sorted(policy.tasks.items()):
        if any(engines[n] for n in chains[task.engine or default]):
            paths[task_name] = "system1"
        elif task.on_failure == "escalate" and _system2_up(runtime.router, runtime.chats, task_name):
            paths[task_name] = "system2"
        else:
            paths[task_name] = "none"
    system2: dict[str, str] = {ref: snap.state for ref, snap in runtime.chats.breakers().items()}
    store = await services.decisions.ping()
    ready = store and all(path != "none" for path in paths.values())
    body: dict[str, Any] = Readiness(
        status="ready" if ready else "not_ready",
        store=store,
        engines=engines,
        breakers=breakers,
        system2=system2,
        system2_status=_system2_status(policy, settings.system2),
        paths=paths,
        degraded=not all(engines.values()) or any(path != "system1" for path in paths.values()),
        policy_version=policy.version,
        policy_file=_policy_file_state(runtime.store),
    ).model_dump()
    return JSONResponse(body, status_code=200 if ready else 503)


async def _engine_up(engines: EnginePool, name: str, policy: PolicySet, breakers: dict[str, str]) -> bool:
    if breakers.get(name) == "open":  # failing fast: this replica's engine cannot answer now
        return False
    try:
        return await _reachable(engines.single_engine(name, policy))
    except (ConfigError, EngineError):
        return False


def _system2_up(router: Router, chats: Frontier, task: str) -> bool:
    chat, _why_not = router.system2_for(task)  # configured at all, and allowed by the task's egress rule
    policy = router.policy
    return chat is not None and chats.answerable(policy.tasks[task].escalate_to or policy.default_escalate_to)


_HOW: dict[Provider, str] = {
    "openai": "set OPENAI_API_KEY (or FASTSLOW_SYSTEM2__OPENAI_BASE_URL for an OpenAI-compatible server) for openai: "
    "models",
    "anthropic": "set ANTHROPIC_API_KEY for anthropic: models",
    "local": "set FASTSLOW_SYSTEM2__LOCAL_BASE_URL (a self-hosted OpenAI-compatible server) for local: models",
}

_UNSETTLED = (
    "what System 1 does not settle stays unsettled (a route comes back without one, which a graph hands to its "
    "frontier node; a classification comes back without an answer; a check rule that would escalate denies the call)"
)


def _system2_status(policy: PolicySet, settings: System2Settings) -> str:
    """``Readiness.system2_status``: are the models the policy's tasks escalate to configured, and if not, so what."""
    tasks_by_ref: dict[str, list[str]] = {}
    for name, task in sorted(policy.tasks.items()):
        tasks_by_ref.setdefault(task.escalate_to or policy.default_escalate_to or settings.default, []).append(name)
    # Keyed as Frontier keys them (it parsed them when the app started: they are valid).
    fallbacks = {str(ModelRef.parse(ref)): chain for ref, chain in settings.fallbacks.items()}
    configured: dict[str, bool] = {}
    how: dict[str, str] = {}
    for ref in sorted(tasks_by_ref):
        try:
            model = ModelRef.parse(ref, key="escalate_to")
            chain = [model, *(ModelRef.parse(f) for f in fallbacks.get(str(model), ()))]
        except ConfigError:  # a provider fastslow does not know: the router cannot ask it either
            configured[ref], how[ref] = False, "name a provider openai, anthropic or local in escalate_to"
            continue
        # Read from the settings rather than asked of Frontier: asking it builds the engine, and a
        # probe would pay for importing the provider's SDK (seconds) on the event loop.
        configured[ref] = any(provider_configured(m.provider, settings) for m in chain)
        how[ref] = _HOW[model.provider]
    missing = [ref for ref, ok in configured.items() if not ok]
    if not missing:
        return f"configured: {', '.join(configured) or 'no task escalates'}"
    unconfigured = "; ".join(f"{ref} for {', '.join(tasks_by_ref[ref])}" for ref in missing)
    to_do = "; ".join(dict.fromkeys(how[ref] for ref in missing))
    if settings.default in missing and not policy.default_escalate_to:
        to_do += "; FASTSLOW_SYSTEM2__DEFAULT=PROVIDER:MODEL names the model of tasks whose policy names none"
    if len(missing) == len(configured):
        return (
            f"not configured: no key or server for any System-2 model the policy escalates to ({unconfigured}). "
            f"Nothing is escalated: {_UNSETTLED}. That alone does not make the replica unready. "
            f"To configure System 2: {to_do}."
        )
    ready = ", ".join(ref for ref, ok in configured.items() if ok)
    return (
        f"partly configured: {ready} configured; no key or server for {unconfigured}. Those tasks escalate "
        f"nothing: {_UNSETTLED}. To configure them: {to_do}."
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text."}},
)
async def metrics(services: ServicesDep) -> Response:
    """Prometheus metrics: decisions, escalations, engine latency and errors, breakers, policy reloads."""
    services.metrics.observe_breakers(breaker_states(services.runtime))
    return Response(services.metrics.render(), media_type=services.metrics.content_type)
