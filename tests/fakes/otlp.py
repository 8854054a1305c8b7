"""An OTLP/HTTP trace receiver on loopback, where a ``fastslow serve`` subprocess exports its spans.

``running_otlp_receiver()`` is a real HTTP server taking ``POST /v1/traces`` as an OpenTelemetry
collector does (protobuf ``ExportTraceServiceRequest``, plain or gzip), decoding each export with
``opentelemetry-proto`` and answering an empty ``ExportTraceServiceResponse``. A ``fastslow serve``
subprocess exports to it with ``OTEL_EXPORTER_OTLP_ENDPOINT=<receiver.url>``. Spans made in the test
process itself are recorded with ``fakes.otel.recorded_spans``; ``span_texts`` reads either kind.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

__all__ = [
    "ExportedSpan",
    "OtlpReceiver",
    "running_otlp_receiver",
    "span_texts",
]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


@dataclass(frozen=True)
class ExportedSpan:
    """One span as a collector received it, ids as lower-case hex."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    """Empty for a root span (or one whose parent is in another process, as a caller's)."""
    kind: int
    """OTLP's ``Span.SpanKind``: 1 internal, 2 server, 3 client."""
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]
    status_code: int
    """OTLP's ``Status.StatusCode``: 0 unset, 1 ok, 2 error."""


@dataclass
class OtlpReceiver:
    """The exports received: each request's headers and decoded body, in order (thread-safe)."""

    url: str = ""
    exports: list[ExportTraceServiceRequest] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, headers: dict[str, str], export: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.headers.append(headers)
            self.exports.append(export)

    def spans(self) -> list[ExportedSpan]:
        """Every span received so far."""
        with self._lock:
            exports = list(self.exports)
        spans = []
        for export in exports:
            for resource_spans in export.resource_spans:
                resource = _attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        spans.append(
                            ExportedSpan(
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                kind=span.kind,
                                attributes=_attributes(span.attributes),
                                resource=resource,
                                scope=scope_spans.scope.name,
                                events=[(e.name, _attributes(e.attributes)) for e in span.events],
                                links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                                status_code=span.status.code,
                            )
                        )
        return spans

    def raw(self) -> bytes:
        """Every export as received (decoded protobuf, serialised again): for scans of what left the process."""
        with self._lock:
            return b"".join(export.SerializeToString() for export in self.exports)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        del format, args

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
        if self.path != "/v1/traces":
            self._reply(404, b"")
            return
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        export = ExportTraceServiceRequest()
        try:
            export.ParseFromString(body)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError; the exporter sees a 400, as from a collector
            self._reply(400, b"")
            return
        self.server.receiver.add({k.lower(): v for k, v in self.headers.items()}, export)
        self._reply(200, ExportTraceServiceResponse().SerializeToString())

    def _reply(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    receiver: OtlpReceiver


@contextmanager
def running_otlp_receiver() -> Iterator[OtlpReceiver]:
    """An OTLP/HTTP trace receiver on a free loopback port; ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes its ``url``."""
    server = _Server(("127.0.0.1", 0), _Handler)
    host, port = server.server_address[:2]
    server.receiver = OtlpReceiver(url=f"http://{host!s}:{port}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield server.receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def span_texts(spans: Sequence[Any]) -> str:
    """Everything SDK spans (``fakes.otel``) carry to a collector: names, attributes, events, status, as text."""
    parts = []
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v!r}" for k, v in (span.attributes or {}).items())
        for event in span.events:
            parts.append(event.name)
            parts.extend(f"{k}={v!r}" for k, v in (event.attributes or {}).items())
        parts.append(str(span.status.description or ""))
    return "\n".join(parts)
