"""Tracing in ``bench/overhead.py``: one process, spans recorded for one form and not for the others.

OpenTelemetry takes one global tracer provider per process. ``SwitchProvider`` is that provider
here: its tracers hand each span to the SDK's tracer (a ``SimpleSpanProcessor`` into an
``InMemorySpanExporter``, so export is paid in the call, an upper bound on a batch processor's
cost) while ``traced`` is on, and to OpenTelemetry's no-op tracer otherwise, which is what a
process without a provider gets. ``Traced`` wraps a compiled graph so that its calls run traced:
the forms still run interleaved. While the switch is off the provider says it is not recording,
and fastslow then skips its spans as it does with no provider at all: the untraced forms measure
what a process that configures no tracing pays.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider as SdkProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Span, SpanKind, Tracer, TracerProvider
from opentelemetry.util.types import Attributes

__all__ = ["SwitchProvider", "Traced", "install"]

_CLEAR_EVERY = 200
"""Spans kept in memory before the exporter is emptied (a bounded heap, as a real exporter's)."""


class _Flag:
    on = False


class _SwitchTracer(Tracer):
    def __init__(self, on: Tracer, flag: _Flag) -> None:
        self._on = on
        self._off = trace.NoOpTracer()
        self._flag = flag

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        tracer = self._on if self._flag.on else self._off
        return tracer.start_span(
            name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception
        )

    @contextmanager
    def start_as_current_span(self, name: str, *args: Any, **kwargs: Any) -> Iterator[Span]:  # type: ignore[override]
        tracer = self._on if self._flag.on else self._off
        with tracer.start_as_current_span(name, *args, **kwargs) as span:
            yield span


class SwitchProvider(TracerProvider):
    """The process's provider: the SDK's tracers while ``flag.on``, the no-op tracer otherwise."""

    @property
    def recording(self) -> bool:
        """Off: fastslow skips its spans, exactly as in a process with no provider (``_tracing.enabled``)."""
        return self.flag.on

    def __init__(self) -> None:
        self.flag = _Flag()
        self.exporter = InMemorySpanExporter()
        self._sdk = SdkProvider()
        self._sdk.add_span_processor(SimpleSpanProcessor(self.exporter))

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> Tracer:
        return _SwitchTracer(
            self._sdk.get_tracer(instrumenting_module_name, instrumenting_library_version, schema_url, attributes),
            self.flag,
        )


def install() -> SwitchProvider:
    """Install the switch as the global provider (once per process)."""
    provider = SwitchProvider()
    trace.set_tracer_provider(provider)
    return provider


class Traced:
    """A compiled graph whose ``invoke`` / ``ainvoke`` run with spans recorded."""

    def __init__(self, app: Any, provider: SwitchProvider) -> None:
        self._app = app
        self._provider = provider
        self.spans = 0

    def exporter_spans(self) -> tuple[Any, ...]:
        """The spans exported and not yet cleared."""
        return tuple(self._provider.exporter.get_finished_spans())

    def _done(self) -> None:
        self._provider.flag.on = False
        finished = len(self._provider.exporter.get_finished_spans())
        if finished >= _CLEAR_EVERY:
            self.spans += finished
            self._provider.exporter.clear()

    def invoke(self, state: Any) -> Any:
        self._provider.flag.on = True
        try:
            return self._app.invoke(state)
        finally:
            self._done()

    async def ainvoke(self, state: Any) -> Any:
        self._provider.flag.on = True
        try:
            return await self._app.ainvoke(state)
        finally:
            self._done()
