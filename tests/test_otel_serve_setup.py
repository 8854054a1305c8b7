"""``configure_tracing``: the provider the standard ``OTEL_*`` variables ask for, read by the SDK itself.

Each case runs in a fresh interpreter (a global provider is set once per process), with the console
exporter, which writes each span as JSON on stderr, so that the variables' effect is seen in what a
span carries rather than in the SDK's internals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from fastslow.api import configure_tracing
from fastslow.api._telemetry import traces_asked

from fakes.api_server import REPO

_PROBE = """
import json, sys
from opentelemetry import trace
if sys.argv[1] == "app-installed":
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
from fastslow.api import configure_tracing
from fastslow.api._telemetry import TracingUnavailable
try:
    tracing = configure_tracing()
except TracingUnavailable as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(0)
with trace.get_tracer("probe").start_as_current_span("probe span"):
    pass
if tracing is not None:
    tracing.shutdown()
    tracing.shutdown()  # a second call does nothing
print(json.dumps({"configured": tracing is not None, "exporters": list(tracing.exporters) if tracing else []}))
"""


def _probe(mode: str = "plain", **variables: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What ``configure_tracing`` did under ``variables`` (and no other ``OTEL_*``), and the spans the console got."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | variables
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    decoder, spans, text = json.JSONDecoder(), [], done.stderr.strip()
    while text:  # the console exporter's spans: indented JSON objects, one after another
        span, end = decoder.raw_decode(text)
        spans.append(span)
        text = text[end:].strip()
    result: dict[str, Any] = json.loads(done.stdout)
    return result, spans


def test_the_console_exporter_gets_spans_named_fastslow_unless_a_service_name_is_given() -> None:
    result, spans = _probe(OTEL_TRACES_EXPORTER="console")
    assert result == {"configured": True, "exporters": ["console"]}
    (span,) = spans
    assert span["name"] == "probe span"
    assert span["resource"]["attributes"]["service.name"] == "fastslow"
    assert span["resource"]["attributes"]["service.version"]

    _, spans = _probe(
        OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="checkout-agent", OTEL_RESOURCE_ATTRIBUTES="team=payments"
    )
    attributes = spans[0]["resource"]["attributes"]
    assert (attributes["service.name"], attributes["team"]) == ("checkout-agent", "payments")


def test_the_sampler_is_the_sdks_reading_of_otel_traces_sampler() -> None:
    result, spans = _probe(OTEL_TRACES_EXPORTER="console", OTEL_TRACES_SAMPLER="always_off")
    assert result["configured"] and spans == []


def test_an_application_that_installed_its_own_provider_keeps_it() -> None:
    result, spans = _probe("app-installed", OTEL_TRACES_EXPORTER="console")
    assert result == {"configured": False, "exporters": []} and spans == []


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "zipkin_json"},
            "OTEL_TRACES_EXPORTER names 'zipkin_json', which no installed package provides; "
            "pip install 'fastslow[otel]' has otlp",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_ENDPOINT asks for OTLP traces over grpc, but its exporter is not installed: "
            "pip install opentelemetry-exporter-otlp-proto-grpc",
        ),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json': fastslow exports http/protobuf (or grpc)",
        ),
    ],
)
def test_what_cannot_be_built_is_one_message_saying_what_to_install(variables: dict[str, str], message: str) -> None:
    result, _ = _probe(**variables)
    assert result == {"error": message}


@pytest.mark.parametrize(
    ("variables", "asked"),
    [
        ({}, ((), "")),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, ((), "")),  # no exporter, no endpoint
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, (("otlp",), "OTEL_EXPORTER_OTLP_ENDPOINT")),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/v1/traces"},
            (("otlp",), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        ),
        ({"OTEL_TRACES_EXPORTER": "console, otlp"}, (("console", "otlp"), "OTEL_TRACES_EXPORTER")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ((), "")),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ((), "")),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, (("otlp",), "OTEL_TRACES_EXPORTER")),
    ],
)
def test_which_variables_ask_for_traces(variables: dict[str, str], asked: tuple[tuple[str, ...], str]) -> None:
    assert traces_asked(variables) == asked


def test_nothing_is_installed_in_this_process_when_nothing_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    assert configure_tracing() is None
