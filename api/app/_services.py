"""What one running app holds: the wired runtime, the decision log, metrics and the rate limiter.

Built by the app's lifespan and handed to requests through the lifespan state (``request.state``),
never through module globals, so several apps can live in one process (as they do in the tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy.exc import SQLAlchemyError

from fastslow.api._compose import Runtime, keeps_state
from fastslow.api._learning import Learner
from fastslow.api.store import DecisionStore, WriterClosed
from fastslow.router import Decision, DecisionSink, Router, Settings, State

from ._admission import GatedEngines
from ._errors import StoreUnavailable
from ._keycache import KeyCache
from ._metrics import ApiMetrics
from ._ratelimit import RateLimiter
from ._throttle import AuthThrottle

__all__ = ["Services"]

_TENANT_ROUTERS = 4096
"""Tenants whose routers are kept; past it they are made again (a router is cheap, only not free)."""


class _CommittedSink:
    """A tenant's sink whose failures become ``StoreUnavailable`` (503), so nothing unrecorded is acknowledged.

    The router records before it returns, and the store's sink (not write-behind) returns only
    once the writer committed the batch holding the decision (group commit with the other
    requests' decisions): when the handler gets a result back, every decision in it is durable.
    """

    def __init__(self, inner: DecisionSink) -> None:
        self._inner = inner

    async def record(self, decision: Decision, *, state: State) -> None:
        await self.record_many((decision,), state=state)

    async def record_many(self, decisions: Sequence[Decision], *, state: State) -> None:
        """A policy check's rules in one entry, so one commit."""
        record_many = getattr(self._inner, "record_many", None)
        try:
            if record_many is not None:
                await record_many(decisions, state=state)
            else:
                for decision in decisions:
                    await self._inner.record(decision, state=state)
        except (SQLAlchemyError, OSError, WriterClosed) as exc:  # WriterClosed: shutting down
            raise StoreUnavailable() from exc


@dataclass(frozen=True, slots=True, kw_only=True)
class Services:
    """Everything a request handler may use."""

    settings: Settings
    runtime: Runtime
    decisions: DecisionStore
    metrics: ApiMetrics
    limiter: RateLimiter
    engines: GatedEngines
    """The runtime's engines behind their admission gates: what every request decides with."""
    learner: Learner
    """Learning from escalations: System 2's answers and outcomes become examples (``learn:`` tasks)."""
    keys: KeyCache
    """Live API keys found in the last ``auth_cache_s`` seconds."""
    throttle: AuthThrottle = field(default_factory=AuthThrottle)
    """Failed API keys and sign-ins per client address and key prefix (``settings.auth_throttle``)."""

    routers: dict[str, Router] = field(default_factory=dict)
    """Each tenant's router, made once: it holds no state but its sink, and every request needs one."""

    def router_for(self, tenant: str) -> Router:
        """The router recording into ``tenant``'s decision log; state is kept where the task's policy says."""
        router = self.routers.get(tenant)
        if router is None:
            if len(self.routers) >= _TENANT_ROUTERS:
                self.routers.clear()
            router = self.routers[tenant] = self._router_for(tenant)
        return router

    def _router_for(self, tenant: str) -> Router:
        runtime = self.runtime
        router = Router(
            lambda: runtime.store.current,
            self.engines,
            runtime.chats,
            trace_state_text=runtime.settings.tracing.state_text,
        )
        committed = _CommittedSink(self.decisions.sink(tenant, store_state=keeps_state(router)))
        return router.with_sink(self.learner.sink(committed, tenant=tenant))

    async def key_revoked(self, key: str) -> bool:
        """Whether ``key`` is one of ours that was revoked (so the answer is 403, not 401)."""
        try:
            record = await self.decisions.authenticate(key, include_revoked=True)
        except (SQLAlchemyError, OSError) as exc:
            raise StoreUnavailable() from exc
        return record is not None and record.revoked
