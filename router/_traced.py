"""Engines with a span per call: ``TracedEngine`` (System 1) and ``TracedChatEngine`` (System 2).

The engine pool and the frontier registry put these innermost, right around the engine that does
the work (inside breakers, gates and coalescing), so one span stands for one call made: a breaker's
refusal makes none (it is an event on the caller's span), and a call that coalescing shares is one
span in the trace of the caller that opened it (``publish_call_span`` tells the coalescer which).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry.trace import Span, SpanContext

from ._answers import EngineReply, Usage
from ._chat import ChatEngine, ChatResult, ToolRunner, ToolSpec
from ._engine import DecisionEngine, ReadOptions, SyncDecide
from ._questions import Image, Question, State
from ._tracing import GenAI, annotate_reply, annotate_usage, call_span, enabled

__all__ = [
    "CallRecord",
    "TracedChatEngine",
    "TracedEngine",
    "collecting_call_span",
    "observe_calls",
    "publish_call_span",
    "receive_call_span",
]

_RECEIVER: ContextVar[Callable[[SpanContext], None] | None] = ContextVar("fastslow_call_span", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    """One engine or model call as a traced wrapper saw it, for observers other than OpenTelemetry (LangSmith)."""

    system: Literal[1, 2]
    engine: str
    provider: str
    operation: str
    request_model: str
    response_model: str = ""
    started_ns: int
    ended_ns: int
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    error: str = ""
    """The failure's type name (never its text); empty when the call answered."""


_OBSERVER: ContextVar[Callable[[CallRecord], None] | None] = ContextVar("fastslow_call_observer", default=None)


@contextmanager
def observe_calls(observer: Callable[[CallRecord], None]) -> Iterator[None]:
    """Within the block (and tasks it starts), every traced engine and model call is reported to ``observer``.

    Observers nest: the inner one sees the calls made inside it, then hands each on to the outer one.
    """
    outer = _OBSERVER.get()

    def both(record: CallRecord) -> None:
        observer(record)
        if outer is not None:
            outer(record)

    token = _OBSERVER.set(both if outer is not None else observer)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


@contextmanager
def _observed(system: Literal[1, 2], engine: str, provider: str, operation: str, model: str) -> Iterator[_Seen]:
    """Report the call made in the block to the observer, if there is one."""
    observer = _OBSERVER.get()
    seen = _Seen()
    if observer is None:
        yield seen
        return
    started = time.time_ns()
    try:
        yield seen
    except BaseException as exc:
        seen.error = type(exc).__qualname__
        raise
    finally:
        observer(
            CallRecord(
                system=system,
                engine=engine,
                provider=provider,
                operation=operation,
                request_model=model,
                response_model=seen.model,
                started_ns=started,
                ended_ns=time.time_ns(),
                usage=seen.usage,
                cost_usd=seen.cost_usd,
                error=seen.error,
            )
        )


@dataclass(slots=True)
class _Seen:
    model: str = ""
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None
    error: str = ""


@contextmanager
def collecting_call_span(receive: Callable[[SpanContext], None]) -> Iterator[None]:
    """Within the block, the engine call's span context goes to ``receive`` (the coalescer's ``Call``)."""
    token = _RECEIVER.set(receive)
    try:
        yield
    finally:
        _RECEIVER.reset(token)


def receive_call_span(receive: Callable[[SpanContext], None]) -> None:
    """``collecting_call_span`` for a context made for one task (``Context.run``): nothing to reset."""
    _RECEIVER.set(receive)


def publish_call_span(span: Span) -> None:
    """Hand ``span``'s context to whoever collects it (``collecting_call_span``), when it is recorded."""
    receive = _RECEIVER.get()
    if receive is not None and span.is_recording():
        receive(span.get_span_context())


class TracedEngine:
    """``inner`` (a System-1 engine) with a GenAI client span per ``decide`` call.

    The span is ``{operation} {model}``: ``gen_ai.provider.name`` is the engine's ``provider``
    attribute where it has one, else its name before any ``:``; the operation is its
    ``gen_ai_operation`` (``chat`` by default, ``embeddings`` for the embedded encoders). Other
    attributes are read through to ``inner``.
    """

    def __init__(self, inner: DecisionEngine) -> None:
        self.inner = inner
        self.name = inner.name
        self.limits = inner.limits
        self.examples_versions: Mapping[str, str] = getattr(inner, "examples_versions", None) or {}
        self._provider = str(getattr(inner, "provider", "") or inner.name.split(":", 1)[0])
        self._operation = str(getattr(inner, "gen_ai_operation", "") or GenAI.CHAT)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet: no recursion through the lookup below
            raise AttributeError(name)
        return getattr(self.inner, name)

    @contextmanager
    def _span(self) -> Iterator[tuple[Span, _Seen]]:
        model = str(getattr(self.inner, "model", "") or "")
        with (
            _observed(1, self.name, self._provider, self._operation, model) as seen,
            call_span(self._operation, engine=self.name, provider=self._provider, model=model) as span,
        ):
            publish_call_span(span)
            yield span, seen

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        if _OBSERVER.get() is None and not enabled():
            return await self.inner.decide(state, questions, images=images, options=options)
        with self._span() as (span, seen):
            reply = await self.inner.decide(state, questions, images=images, options=options)
            annotate_reply(span, reply)
            seen.model, seen.usage = reply.model, reply.usage
            return reply

    def decide_sync(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply | None:
        """``inner.decide_sync`` in a span; ``None`` when ``inner`` has none (or returns none)."""
        sync: SyncDecide | None = getattr(self.inner, "decide_sync", None)
        if sync is None:
            return None
        if _OBSERVER.get() is None and not enabled():
            return sync(state, questions, images=images, options=options)
        with self._span() as (span, seen):
            reply = sync(state, questions, images=images, options=options)
            if reply is None:
                # Nothing was asked here: the caller awaits ``decide``, which has a span of its own.
                span.set_attribute("fastslow.deferred", True)
            else:
                annotate_reply(span, reply)
                seen.model, seen.usage = reply.model, reply.usage
            return reply

    async def aclose(self) -> None:
        await self.inner.aclose()


class TracedChatEngine:
    """``inner`` (a System-2 engine) with a GenAI ``chat`` client span per ``complete`` call.

    The span carries the provider, the requested and answering models, token usage and the cost
    (``fastslow.cost_usd``); never the messages, the tool arguments or any thought.
    """

    def __init__(self, inner: ChatEngine, *, provider: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.model = inner.model
        self._provider = provider

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def base_url(self) -> str | None:
        return self.inner.base_url

    async def complete(
        self,
        messages: Sequence[Any],
        *,
        tools: Sequence[ToolSpec] = (),
        schema: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
        tool_runner: ToolRunner | None = None,
    ) -> ChatResult:
        if _OBSERVER.get() is None and not enabled():
            return await self.inner.complete(
                messages, tools=tools, schema=schema, timeout_s=timeout_s, tool_runner=tool_runner
            )
        with (
            _observed(2, self.name, self._provider, GenAI.CHAT, self.model) as seen,
            call_span(GenAI.CHAT, engine=self.name, provider=self._provider, model=self.model) as span,
        ):
            result = await self.inner.complete(
                messages, tools=tools, schema=schema, timeout_s=timeout_s, tool_runner=tool_runner
            )
            seen.model, seen.usage, seen.cost_usd = result.model, result.usage, result.cost_usd
            if span.is_recording():
                if result.model:
                    span.set_attribute(GenAI.RESPONSE_MODEL, result.model)
                annotate_usage(span, result.usage, cost_usd=result.cost_usd)
            return result

    async def aclose(self) -> None:
        await self.inner.aclose()
