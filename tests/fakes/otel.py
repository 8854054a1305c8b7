"""An in-process OpenTelemetry SDK for tests: spans recorded only inside ``recorded_spans()``.

OpenTelemetry takes one global tracer provider per process, so it is installed once, on first
use, and switched off outside ``recorded_spans()``: its sampler drops every span, and it says it is
not recording, so fastslow makes no spans at all for the other tests of the process (as with no
provider). Only a test inside ``recorded_spans()`` sees its spans in the in-memory exporter.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

__all__ = ["by_name", "children", "recorded_spans"]


class _Switch(Sampler):
    def __init__(self) -> None:
        self.on = False

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        del parent_context, trace_id, name, kind, links, trace_state
        return SamplingResult(Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP, attributes)

    def get_description(self) -> str:
        return "tests.fakes.otel switch"


class _Provider(TracerProvider):
    """The SDK's provider, saying it records nothing while the switch is off: fastslow then skips its
    spans, and sends no trace context, as in a process with no provider (``_tracing.enabled``)."""

    def __init__(self, switch: _Switch) -> None:
        super().__init__(sampler=switch)
        self._switch = switch

    @property
    def recording(self) -> bool:
        return self._switch.on


_lock = threading.Lock()
_installed: tuple[_Switch, InMemorySpanExporter] | None = None


def _install() -> tuple[_Switch, InMemorySpanExporter]:
    global _installed
    with _lock:
        if _installed is None:
            switch = _Switch()
            exporter = InMemorySpanExporter()
            provider = _Provider(switch)
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            trace.set_tracer_provider(provider)
            _installed = (switch, exporter)
        return _installed


@contextmanager
def recorded_spans() -> Iterator[InMemorySpanExporter]:
    """Spans started inside the block are recorded and exported to the exporter yielded (cleared first)."""
    switch, exporter = _install()
    exporter.clear()
    switch.on = True
    try:
        yield exporter
    finally:
        switch.on = False


def by_name(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    """The spans whose name starts with ``prefix``, in the order they ended."""
    return [s for s in spans if s.name.startswith(prefix)]


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    """``parent``'s direct children among ``spans``."""
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
