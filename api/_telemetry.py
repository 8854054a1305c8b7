"""OpenTelemetry's tracer provider for the processes fastslow runs, configured by the standard ``OTEL_*`` variables.

fastslow's spans (``fastslow.router``'s decisions, the engines' calls, the API's requests) use
``opentelemetry-api`` alone, and a library never installs the global provider on its own: an
application that embeds the router installs its own, or calls ``configure_tracing()``.
``fastslow serve`` and the commands that decide (``decide``, ``graph run``, ``eval``) call it at
start and ``Tracing.shutdown()`` at exit, which exports what is still queued.

``configure_tracing`` installs a provider only when the variables ask for traces: an OTLP endpoint
(``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER``
naming an exporter, and ``OTEL_SDK_DISABLED`` not ``true``. Everything else is the SDK's own reading
of the variables, not fastslow's: the resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``;
``service.name`` is ``fastslow`` when neither names one), the sampler (``OTEL_TRACES_SAMPLER``,
``OTEL_TRACES_SAMPLER_ARG``), the batch processor (``OTEL_BSP_*``) and the exporter's endpoint,
headers, compression, timeout and certificates (``OTEL_EXPORTER_OTLP_*``).

The SDK and the OTLP/HTTP exporter are the ``otel`` extra (``pip install 'fastslow[otel]'``); when
the variables ask for traces without it, ``TracingUnavailable`` says so in one line.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, entry_points, version
from types import TracebackType
from typing import TYPE_CHECKING, Final

from opentelemetry import trace

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["INSTALL_HINT", "Tracing", "TracingUnavailable", "configure_tracing", "provider_installed", "traces_asked"]

log = logging.getLogger("fastslow.telemetry")

INSTALL_HINT: Final = "pip install 'fastslow[otel]'"
DEFAULT_SERVICE_NAME: Final = "fastslow"

_ENDPOINTS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS: Final = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
# What OpenTelemetry's own distro (opentelemetry-instrument) registers "otlp" as, per protocol.
_OTLP_ENTRY_POINTS: Final = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_OTLP_PACKAGES: Final = {"http/protobuf": INSTALL_HINT, "grpc": "pip install opentelemetry-exporter-otlp-proto-grpc"}

_LOCK = threading.Lock()


class TracingUnavailable(Exception):
    """The ``OTEL_*`` variables ask for traces that the installed packages cannot send (the message says how)."""


def _set(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def traces_asked(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], str]:
    """The exporters the variables ask for, and the variable that asked; ``((), "")`` for none.

    ``OTEL_TRACES_EXPORTER`` (comma-separated; ``none`` turns traces off) wins; without it an OTLP
    endpoint asks for ``otlp``. ``OTEL_SDK_DISABLED=true`` asks for nothing.
    """
    env = os.environ if environ is None else environ
    if _set(env, "OTEL_SDK_DISABLED").lower() == "true":
        return (), ""
    named = _set(env, "OTEL_TRACES_EXPORTER")
    if named:
        exporters = tuple(dict.fromkeys(part.strip().lower() for part in named.split(",") if part.strip()))
        return ((), "") if "none" in exporters or not exporters else (exporters, "OTEL_TRACES_EXPORTER")
    for name in _ENDPOINTS:
        if _set(env, name):
            return ("otlp",), name
    return (), ""


def provider_installed() -> bool:
    """Whether a real tracer provider is installed globally (not OpenTelemetry's proxy or no-op one)."""
    return not isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


@dataclass(eq=False)
class Tracing:
    """The provider ``configure_tracing`` installed; ``shutdown()`` (or ending a ``with``) exports what is queued."""

    provider: TracerProvider
    exporters: tuple[str, ...]
    _done: bool = field(default=False, init=False, repr=False)

    def shutdown(self) -> None:
        """Flush every span processor and shut the provider down; later calls do nothing."""
        if self._done:
            return
        self._done = True
        self.provider.shutdown()

    def __enter__(self) -> Tracing:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.shutdown()


def configure_tracing(*, service_name: str = DEFAULT_SERVICE_NAME) -> Tracing | None:
    """Install the global tracer provider the ``OTEL_*`` variables ask for, with a batch processor per exporter.

    Call it once, at the start of a process (a library never should). Nothing is installed, and
    ``None`` returned, when the variables ask for no traces or a provider is installed already
    (the application's own is kept).

    Args:
        service_name: ``service.name`` when neither ``OTEL_SERVICE_NAME`` nor ``OTEL_RESOURCE_ATTRIBUTES`` names one.

    Returns:
        The installed provider's handle: call ``shutdown()`` at exit, so that queued spans are exported.

    Raises:
        TracingUnavailable: the variables ask for traces, but the SDK or an exporter is not installed,
            or they name a protocol or exporter fastslow cannot build.
    """
    exporters, asked_by = traces_asked()
    if not exporters:
        return None
    with _LOCK:
        if provider_installed():
            log.debug("a tracer provider is installed already; %s is left to it", asked_by)
            return None
        try:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise TracingUnavailable(
                f"{asked_by} asks for traces, but the OpenTelemetry SDK is not installed: {INSTALL_HINT}"
            ) from None
        built = [_exporter(name, asked_by) for name in exporters]
        provider = TracerProvider(resource=_resource(service_name))  # the sampler: OTEL_TRACES_SAMPLER
        for exporter in built:
            provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* tune it
        trace.set_tracer_provider(provider)
    log.info("traces go to %s (%s)", ", ".join(exporters), asked_by)
    return Tracing(provider, exporters)


def _resource(service_name: str) -> Resource:
    from opentelemetry.sdk.resources import Resource

    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (the latter wins), and
    # falls back to "unknown_service:<executable>": fastslow's name replaces only that fallback.
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service_name}))
    if "service.version" not in resource.attributes:
        resource = resource.merge(Resource({"service.version": _version()}))
    return resource


def _version() -> str:
    try:
        return version("fastslow")
    except PackageNotFoundError:
        return "0+unknown"


def _exporter(name: str, asked_by: str) -> SpanExporter:
    """The exporter ``OTEL_TRACES_EXPORTER`` names, built with no arguments: it reads its own variables."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr: the commands' stdout is their result, for scripts.
        return ConsoleSpanExporter(out=sys.stderr)
    hint = f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides; {INSTALL_HINT} has otlp"
    if name == "otlp":
        named = next((variable for variable in _PROTOCOLS if _set(os.environ, variable)), "")
        protocol = _set(os.environ, named).lower() if named else "http/protobuf"
        if protocol not in _OTLP_ENTRY_POINTS:
            raise TracingUnavailable(f"{named}={protocol!r}: fastslow exports http/protobuf (or grpc)")
        name = _OTLP_ENTRY_POINTS[protocol]
        hint = f"{asked_by} asks for OTLP traces over {protocol}, but its exporter is not installed: "
        hint += _OTLP_PACKAGES[protocol]
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        raise TracingUnavailable(hint)
    try:
        exporter_type = next(iter(found)).load()
    except ImportError as exc:
        raise TracingUnavailable(f"{hint} ({exc})") from None
    exporter: SpanExporter = exporter_type()
    return exporter
