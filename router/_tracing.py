"""OpenTelemetry spans for decisions and the engine calls behind them, on ``opentelemetry-api`` alone.

fastslow never installs a tracer provider on its own (``fastslow serve`` does when the ``OTEL_*``
variables ask for one, ``fastslow.api.configure_tracing``): with none installed, every tracer here is
OpenTelemetry's no-op one, a span costs a context switch and no attribute is computed (each
helper asks ``is_recording()`` first), and nothing is exported.

The attribute names live here and nowhere else. Engine and System-2 calls follow OpenTelemetry's
GenAI semantic conventions at ``SEMCONV_VERSION`` (experimental: names may change in later
versions, so they are pinned, and the tracer carries the version's schema URL); what the
conventions do not cover is ``fastslow.*``.

Nothing a user typed goes into a span or an event by default: no state text, no tool arguments,
no thoughts, no error text from an upstream (which may quote the request). ``Router(...,
trace_state_text=True)`` opts in to the state text of decisions; thoughts never.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Final

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from ._answers import EngineReply, Usage
    from ._decisions import Decision

__all__ = [
    "SCHEMA_URL",
    "SEMCONV_VERSION",
    "STATE_TEXT_CHARS",
    "Attr",
    "Event",
    "GenAI",
    "add_event",
    "annotate_decision",
    "annotate_reply",
    "annotate_usage",
    "call_span",
    "current_span_context",
    "decision_spans",
    "enabled",
    "inject_trace_headers",
    "link_current",
    "now_ns",
    "operation_span",
    "trace_headers",
    "tracer",
]

SEMCONV_VERSION: Final = "1.37.0"
"""The OpenTelemetry semantic conventions (GenAI attributes included) these spans follow."""

SCHEMA_URL: Final = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"


class GenAI:
    """Attribute names from OpenTelemetry's GenAI (and general) semantic conventions, v1.37.0."""

    OPERATION_NAME: Final = "gen_ai.operation.name"
    PROVIDER_NAME: Final = "gen_ai.provider.name"
    REQUEST_MODEL: Final = "gen_ai.request.model"
    RESPONSE_MODEL: Final = "gen_ai.response.model"
    USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
    USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
    ERROR_TYPE: Final = "error.type"
    SERVER_ADDRESS: Final = "server.address"
    SERVER_PORT: Final = "server.port"
    # ``gen_ai.operation.name`` values: System 2 and the language-model System-1 engines "chat", the
    # embedded encoder "embeddings" (it embeds the state and reads trained heads over the vectors).
    CHAT: Final = "chat"
    EMBEDDINGS: Final = "embeddings"


class Attr:
    """fastslow's own attribute names (what the GenAI conventions have no name for)."""

    OPERATION: Final = "fastslow.operation"
    """``route``, ``classify`` or ``check``."""
    TASK: Final = "fastslow.task"
    QUESTION: Final = "fastslow.question"
    DECISION_ID: Final = "fastslow.decision.id"
    SYSTEM: Final = "fastslow.decision.system"
    REASON: Final = "fastslow.decision.reason"
    OUTCOME: Final = "fastslow.decision.outcome"
    VERDICT: Final = "fastslow.decision.verdict"
    CONFIDENCE: Final = "fastslow.decision.confidence"
    THRESHOLD: Final = "fastslow.decision.threshold"
    ESCALATED: Final = "fastslow.decision.escalated"
    RULE: Final = "fastslow.check.rule"
    """The rule that decided a check's verdict."""
    POLICY_VERSION: Final = "fastslow.policy.version"
    EXAMPLES_VERSION: Final = "fastslow.examples.version"
    ENGINE: Final = "fastslow.engine"
    COST_USD: Final = "fastslow.cost_usd"
    """What a System-2 call cost, in US dollars (the conventions have no cost attribute)."""
    STATE_TEXT: Final = "fastslow.state.text"
    """Only with ``trace_state_text`` on."""
    BATCH_SIZE: Final = "fastslow.batch.callers"
    ATTEMPT: Final = "fastslow.attempt"
    STATUS_CODE: Final = "http.response.status_code"
    NEXT_ENGINE: Final = "fastslow.fallback.next"
    RETRY_AFTER_S: Final = "fastslow.breaker.retry_after_s"


class Event:
    """Span event names."""

    RETRY: Final = "fastslow.retry"
    """An engine call is tried again (on the call's span)."""
    BREAKER_REFUSED: Final = "fastslow.breaker.refused"
    """An open breaker refused a call before it was made."""
    FALLBACK: Final = "fastslow.fallback"
    """An engine of a fallback chain failed and the next one is asked."""
    COALESCED: Final = "fastslow.coalesced"
    """A decision was answered by an engine call another caller opened (linked)."""


STATE_TEXT_CHARS: Final = 4096
"""Opted-in state text is cut here: span attributes are not a log."""

_TRACER: Final = trace.get_tracer("fastslow", schema_url=SCHEMA_URL)
# A ProxyTracer until a provider is installed, then the provider's: calls made before
# ``set_tracer_provider`` are no-ops, later ones are recorded, with no re-import needed.

_UNKNOWN: Final = object()
trace.get_tracer_provider()  # loads a provider named by OTEL_PYTHON_TRACER_PROVIDER, as the API does lazily


def enabled() -> bool:
    """Whether spans can be recorded now: a tracer provider is installed and does not say it records nothing.

    Every span helper asks this first: with no provider, making even a no-op span costs several
    microseconds a span, and a decision makes two or more; skipping them leaves the decision's
    cost as it was before tracing existed. A provider may have a ``recording`` attribute that is
    false while it records nothing (``bench/overhead.py`` switches one off between forms).
    """
    # The global provider is read from the API module's own variable: ``get_tracer_provider()``
    # looks an environment variable up on every call while none is set (about 2 µs). Should the
    # API ever move it, the public call answers instead.
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
    if provider is None or isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return False
    return bool(getattr(provider, "recording", True))


def tracer() -> trace.Tracer:
    """fastslow's tracer (the global provider's; OpenTelemetry's no-op one until a provider is set)."""
    return _TRACER


_NO_SPAN: Final[AbstractContextManager[Span]] = nullcontext(trace.INVALID_SPAN)
"""What the span helpers give while ``enabled()`` is false: reusable, and cheaper than a generator."""


def operation_span(operation: str, task: str) -> AbstractContextManager[Span]:
    """The current span for one router call (``route``, ``classify``, ``check``) of ``task``."""
    if not enabled():
        return _NO_SPAN
    return _TRACER.start_as_current_span(
        f"fastslow.{operation} {task}", attributes={Attr.OPERATION: operation, Attr.TASK: task}
    )


def annotate_decision(span: Span, decision: Decision, *, state_text: str | None = None) -> None:
    """Set ``decision``'s attributes on ``span`` (nothing when the span is not recorded)."""
    if not span.is_recording():
        return
    span.set_attributes(_decision_attributes(decision))
    if state_text is not None:
        span.set_attribute(Attr.STATE_TEXT, state_text[:STATE_TEXT_CHARS])


def _decision_attributes(decision: Decision) -> dict[str, str | bool | int | float]:
    attributes: dict[str, str | bool | int | float] = {
        Attr.TASK: decision.task,
        Attr.QUESTION: decision.question,
        Attr.DECISION_ID: decision.id,
        Attr.SYSTEM: decision.system,
        Attr.REASON: decision.reason,
        Attr.CONFIDENCE: round(decision.confidence, 6),
        Attr.THRESHOLD: decision.threshold,
        Attr.ESCALATED: decision.escalate,
        Attr.POLICY_VERSION: decision.policy_version,
        Attr.EXAMPLES_VERSION: decision.examples_version,
        Attr.ENGINE: decision.engine,
    }
    if decision.outcome is not None:
        attributes[Attr.OUTCOME] = decision.outcome
    if decision.verdict is not None:
        attributes[Attr.VERDICT] = decision.verdict
    if decision.cost_usd is not None:
        attributes[Attr.COST_USD] = decision.cost_usd
    return attributes


def decision_spans(
    parent: Span, decisions: Sequence[Decision], *, started_ns: int, state_text: str | None = None
) -> None:
    """One child span of ``parent`` per decision of a check or a classification, from ``started_ns`` to now."""
    if not parent.is_recording():
        return
    context = trace.set_span_in_context(parent)
    for decision in decisions:
        span = _TRACER.start_span(
            f"fastslow.decision {decision.task}.{decision.question}", context=context, start_time=started_ns
        )
        annotate_decision(span, decision, state_text=state_text)
        span.end()


def call_span(
    operation: str,
    *,
    engine: str,
    provider: str,
    model: str,
    kind: SpanKind = SpanKind.CLIENT,
    links: Sequence[Link] = (),
    attributes: Mapping[str, str | int | float | bool] | None = None,
) -> AbstractContextManager[Span]:
    """The current span of one engine (System 1) or model (System 2) call, named as the GenAI conventions say.

    An exception leaving the block marks the span failed with its type as ``error.type``; its
    message is not recorded (an upstream's error text may quote the request).
    """
    if not enabled():
        return _NO_SPAN
    return _call_span(operation, engine, provider, model, kind, links, attributes)


@contextmanager
def _call_span(
    operation: str,
    engine: str,
    provider: str,
    model: str,
    kind: SpanKind,
    links: Sequence[Link],
    attributes: Mapping[str, str | int | float | bool] | None,
) -> Iterator[Span]:
    attrs: dict[str, str | int | float | bool] = {
        GenAI.OPERATION_NAME: operation,
        GenAI.PROVIDER_NAME: provider,
        Attr.ENGINE: engine,
    }
    if model:
        attrs[GenAI.REQUEST_MODEL] = model
    if attributes:
        attrs.update(attributes)
    name = f"{operation} {model or engine}"
    with _TRACER.start_as_current_span(
        name, kind=kind, attributes=attrs, links=links, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except BaseException as exc:
            if span.is_recording():
                span.set_attribute(GenAI.ERROR_TYPE, type(exc).__qualname__)
                span.set_status(Status(StatusCode.ERROR))
            raise


def annotate_reply(span: Span, reply: EngineReply) -> None:
    """An engine reply's model and token usage on its call's span."""
    if not span.is_recording():
        return
    if reply.model:
        span.set_attribute(GenAI.RESPONSE_MODEL, reply.model)
    annotate_usage(span, reply.usage)


def annotate_usage(span: Span, usage: Usage, *, cost_usd: float | None = None) -> None:
    """Token usage (and cost, for System 2) on a call's span."""
    if not span.is_recording():
        return
    if usage.input_tokens or usage.output_tokens:
        span.set_attribute(GenAI.USAGE_INPUT_TOKENS, usage.input_tokens)
        span.set_attribute(GenAI.USAGE_OUTPUT_TOKENS, usage.output_tokens)
    if cost_usd is not None:
        span.set_attribute(Attr.COST_USD, cost_usd)


def add_event(name: str, attributes: Mapping[str, str | int | float | bool] | None = None) -> None:
    """An event on the current span, when it is recorded."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, attributes=dict(attributes or {}))


def current_span_context() -> SpanContext | None:
    """The current span's context when it is a valid one (something to link to), else ``None``."""
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def link_current(target: SpanContext | None, *, event: str = Event.COALESCED) -> None:
    """Link the current span to ``target`` (an engine call another caller's trace owns), with an event."""
    if target is None:
        return
    span = trace.get_current_span()
    if span.is_recording() and span.get_span_context() != target:
        span.add_link(target)
        span.add_event(event, attributes={"trace_id": f"{target.trace_id:032x}", "span_id": f"{target.span_id:016x}"})


def inject_trace_headers(headers: MutableMapping[str, str]) -> bool:
    """Add W3C trace context (``traceparent``, ``tracestate``, ``baggage``) for the current span to ``headers``.

    Returns whether anything was added (nothing when there is no valid current span or baggage).
    """
    before = len(headers)
    propagate.inject(headers)
    return len(headers) != before


def trace_headers() -> dict[str, str] | None:
    """The current W3C trace context as headers for one SDK call (``extra_headers=``); ``None`` when there is none."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def now_ns() -> int:
    """A span timestamp for now."""
    return time.time_ns()
