"""The wrappers that put a circuit breaker (``_circuit``) in front of a System-1 or System-2 engine.

``BreakerEngine`` and ``BreakerChatEngine`` ask the breaker before each call, refuse with
``CircuitOpen`` while it is open, and tell it how each call ended. Both go through one helper,
``_guarded``, so System 1 and System 2 count alike.

One cancellation counts: a call cancelled once (nearly) all of its budget had passed is settled as
a timeout. The router, the coalescer and ``ask_system2`` stop waiting at a call's budget by
cancelling it, and their timers start a moment before the wrapper's (before an admission wait, or a
coalescing window), so they fire first: without this rule a hanging engine would never raise
``EngineTimeout`` to the breaker and would never be cut off. A call cancelled earlier (its caller
left) or without a budget is no news about the engine and counts for nothing.

The wrappers also tell the Jev wire client's retry loop, through ``may_retry()``, to stop retrying
once the breaker is no longer closed: one retry loop per call, never on an open breaker.

The state machine and its names (``CircuitBreaker``, ``CircuitOpen``, ``counts_as_failure``, ...)
are in ``_circuit`` and are re-exported here, where the rest of the router imports them from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from ._answers import EngineReply
from ._chat import ChatEngine, ChatResult, ToolRunner, ToolSpec
from ._circuit import (
    BreakerSnapshot,
    BreakerState,
    CircuitBreaker,
    CircuitOpen,
    OnChange,
    Permit,
    counts_as_failure,
)
from ._engine import DecisionEngine, ReadOptions, SyncDecide
from ._errors import EngineTimeout
from ._questions import Image, Question, State
from ._tracing import Attr, Event, add_event
from ._work import budget_s

__all__ = [
    "BreakerChatEngine",
    "BreakerEngine",
    "BreakerSnapshot",
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "OnChange",
    "Permit",
    "counts_as_failure",
    "failure_log_level",
    "may_retry",
]

_SPENT = 0.9
"""The share of its budget after which a cancelled call counts as timed out (see the module docstring).

Below 1 because the cancelling timer started a little before the wrapper's own clock; above any
share at which a caller plausibly gives up early for a reason of its own."""

_MAY_RETRY: ContextVar[Callable[[], bool] | None] = ContextVar("fastslow_may_retry", default=None)


def may_retry() -> bool:
    """Whether a retry loop running inside this call may try again (``False`` once its breaker left closed)."""
    check = _MAY_RETRY.get()
    return check is None or check()


def failure_log_level(error: BaseException) -> int:
    """The level to log a failed engine call at: debug for an open breaker's refusal, else warning.

    An open breaker refuses every call until its probe; the failures that opened it were logged as
    they came, and a line per refused request would flood the log for the whole outage.
    """
    return logging.DEBUG if isinstance(error, CircuitOpen) else logging.WARNING


@contextmanager
def _retries_while(check: Callable[[], bool]) -> Iterator[None]:
    outer = _MAY_RETRY.get()
    # Breakers nest (a fallback chain of guarded engines behind a guarded chain): every one must allow.
    combined = check if outer is None else (lambda: outer() and check())
    token = _MAY_RETRY.set(combined)
    try:
        yield
    finally:
        _MAY_RETRY.reset(token)


@dataclass(slots=True)
class _Call:
    asked: bool = True
    """Set to ``False`` when nothing was asked after all: the permit goes back, neither success nor failure."""


def _cut_off(name: str, budget: float | None, elapsed: float) -> EngineTimeout | None:
    """The timeout a call cancelled after ``elapsed`` seconds stands for; ``None`` when its caller left early."""
    if budget is None or budget <= 0.0 or elapsed < _SPENT * budget:
        return None
    return EngineTimeout(f"cancelled at its {budget:g} s budget with no answer", engine=name)


@contextmanager
def _guarded(breaker: CircuitBreaker, budget: float | None) -> Iterator[_Call]:
    """One call through ``breaker`` with ``budget`` seconds: admitted on entry, settled by how it ended.

    Raises:
        CircuitOpen: the breaker refused the call.
    """
    try:
        permit = breaker.admit()
    except CircuitOpen as refused:
        add_event(Event.BREAKER_REFUSED, {Attr.ENGINE: breaker.name, Attr.RETRY_AFTER_S: refused.retry_after_s})
        raise
    call = _Call()
    started = time.monotonic()
    try:
        with _retries_while(lambda: breaker.closed):
            yield call
    except asyncio.CancelledError as exc:
        breaker.settle(permit, _cut_off(breaker.name, budget, time.monotonic() - started) or exc)
        raise
    except BaseException as exc:
        breaker.settle(permit, exc)
        raise
    if call.asked:
        breaker.settle(permit, None)
    else:
        breaker.release(permit)


class BreakerEngine:
    """``inner`` behind ``breaker``: while it is open, calls fail at once with ``CircuitOpen``.

    Other attributes (``url``, ``model``, ``examples``) are read through to ``inner``.
    """

    def __init__(self, inner: DecisionEngine, breaker: CircuitBreaker) -> None:
        self.inner = inner
        self.breaker = breaker
        self.name = inner.name
        self.limits = inner.limits
        self.examples_versions: Mapping[str, str] = getattr(inner, "examples_versions", None) or {}

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet: no recursion through the lookup below
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """``inner.decide``, or ``CircuitOpen`` at once while the breaker is open."""
        with _guarded(self.breaker, budget_s(options.timeout_s if options is not None else None)):
            return await self.inner.decide(state, questions, images=images, options=options)

    def decide_sync(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply | None:
        """``inner.decide_sync`` behind the breaker; ``None`` when ``inner`` has none (or returns none)."""
        sync: SyncDecide | None = getattr(self.inner, "decide_sync", None)
        if sync is None:
            return None
        # Nothing cancels a sync call: it ends at its budget by itself, so no budget is needed here.
        with _guarded(self.breaker, None) as call:
            reply = sync(state, questions, images=images, options=options)
            call.asked = reply is not None  # None: the caller awaits ``decide`` instead
        return reply

    async def aclose(self) -> None:
        await self.inner.aclose()


class BreakerChatEngine:
    """A System-2 ``inner`` behind ``breaker``: while it is open, ``complete`` fails at once with ``CircuitOpen``."""

    def __init__(self, inner: ChatEngine, breaker: CircuitBreaker) -> None:
        self.inner = inner
        self.breaker = breaker
        self.name = inner.name
        self.model = inner.model

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def base_url(self) -> str | None:
        return self.inner.base_url

    async def complete(
        self,
        messages: Sequence[BaseMessage],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: ToolRunner | None = None,
    ) -> ChatResult:
        """``inner.complete``, or ``CircuitOpen`` at once while the breaker is open."""
        with _guarded(self.breaker, budget_s(timeout_s)):
            return await self.inner.complete(
                messages, tools=tools, schema=schema, timeout_s=timeout_s, tool_runner=tool_runner
            )

    async def aclose(self) -> None:
        await self.inner.aclose()
