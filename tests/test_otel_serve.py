"""``fastslow serve`` exports its traces over OTLP/HTTP, continuing the caller's trace into System 1.

A real ``fastslow serve`` subprocess, configured by the standard ``OTEL_*`` variables alone, decides
a policy check with the Jev engine against a loopback System-1 server. The caller sends a W3C
``traceparent``; the spans reach an OTLP receiver on loopback (protobuf decoded here) when the server
stops, and they, the ``traceparent`` System 1 received and the JSON log lines share its trace id.
Without the variables (or with ones that say no) the provider stays OpenTelemetry's no-op one; a
``fastslow graph run`` is one trace, exported before the command ends.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fakes.api_server import REPO, api_client, new_key, test_settings
from fakes.embedded import child_env
from fakes.jev_server import running_jev_server
from fakes.otlp import ExportedSpan, running_otlp_receiver
from fakes.processes import wait_until_answering
from fakes.serving import free_port

STARTUP_S = 120.0
SERVER, CLIENT = 2, 3  # OTLP's Span.SpanKind
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
STATE_MARKER = "rm -rf /srv/otel-state-marker"
"""In the tool call checked: no span may carry it (no state text in spans by default)."""
TOOL_CALL = {"name": "shell", "arguments": {"command": STATE_MARKER}}

POLICY = """
version: 1
defaults:
  engine: jev
  engine_options: {timeout_s: 30}
tasks:
  support:
    kind: route
    routes:
      billing: Charges, invoices and refunds.
      technical: Errors and crashes.
    none_of_these: other
  tool_safety:
    kind: check
    rules:
      destructive:
        instructions: Would this tool call delete or overwrite data?
        deny_at: 0.8
        allow_at: 0.2
"""


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A ``fastslow serve`` environment with none of this process's ``OTEL_*`` variables, ``extra`` added."""
    policy = tmp_path / "otel-policy.yaml"
    policy.write_text(POLICY)
    settings = test_settings(tmp_path, policy_file=policy)  # a migrated log in tmp_path/data
    env = child_env(
        FASTSLOW_DATA_DIR=str(settings.data_dir),
        FASTSLOW_POLICY_FILE=str(policy),
        FASTSLOW_SETTINGS_FILE=str(tmp_path / "none.toml"),
    )
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")} | extra


@contextmanager
def serving(env: dict[str, str], out: Path, err: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``fastslow serve`` on a free port until the block ends (then SIGTERM, as a container stop sends)."""
    port = free_port()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "fastslow.api.cli", "serve", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(process, f"{url}/readyz", log=err, timeout_s=STARTUP_S)
        yield process, url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _ancestors(span: ExportedSpan, by_id: dict[str, ExportedSpan]) -> list[str]:
    names = []
    while span.parent_span_id in by_id:
        span = by_id[span.parent_span_id]
        names.append(span.name)
    return names


async def test_a_policy_check_is_one_trace_from_the_caller_through_fastslow_into_system_one(tmp_path: Path) -> None:
    with running_otlp_receiver() as receiver:
        async with running_jev_server("structured") as jev:
            env = serve_env(
                tmp_path,
                FASTSLOW_ENGINE="jev",
                FASTSLOW_JEV__BASE_URL=jev.url,
                FASTSLOW_JEV__MAX_RETRIES="0",
                FASTSLOW_LOGGING__FORMAT="json",
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
                OTEL_SERVICE_NAME="fastslow-under-test",
                OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=test",
                # Longer than the test: what the server exports, it exports when it stops (the flush at exit).
                OTEL_BSP_SCHEDULE_DELAY="600000",
            )
            key = await new_key(test_settings(tmp_path, policy_file=tmp_path / "otel-policy.yaml"), "acme")
            out, err = tmp_path / "stdout.log", tmp_path / "stderr.log"
            with serving(env, out, err) as (process, url):
                async with api_client(url, key) as http:
                    answer = await http.post(
                        "/v1/policy-check",
                        json={"policies": ["tool_safety"], "tool_call": TOOL_CALL},
                        headers={"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"},
                    )
                assert answer.status_code == 200, answer.text
                assert receiver.spans() == []  # queued, not yet exported
            assert process.returncode == -signal.SIGTERM, err.read_text()  # ended by the signal, as before
            received = [r for r in jev.requests if r.path.endswith("/systemone")]

    exported = receiver.spans()
    assert {s.resource["service.name"] for s in exported} == {"fastslow-under-test"}, err.read_text()
    assert {s.resource["deployment.environment.name"] for s in exported} == {"test"}
    # The caller's trace, and nothing else: the readiness probes the test polled with are not traced.
    spans = [s for s in exported if s.trace_id == CALLER_TRACE]
    assert spans == exported
    by_id = {s.span_id: s for s in spans}

    # The request's SERVER span, a child of the caller's span, named and described by HTTP's conventions.
    (server,) = [s for s in spans if s.kind == SERVER]
    assert server.name == "POST /v1/policy-check"
    assert server.parent_span_id == CALLER_SPAN
    assert server.attributes["http.request.method"] == "POST"
    assert server.attributes["http.route"] == "/v1/policy-check"
    assert server.attributes["url.path"] == "/v1/policy-check"
    assert server.attributes["http.response.status_code"] == 200

    # The router's check under it, and System 1's call under the check.
    (check,) = [s for s in spans if s.name == "fastslow.check tool_safety"]
    assert server.name in _ancestors(check, by_id)
    decision_ids = {rule["decision_id"] for rule in answer.json()["rules"]}
    assert set(check.attributes["fastslow.decision.id"]) == decision_ids  # each rule's decision
    (call,) = [s for s in spans if s.kind == CLIENT and str(s.attributes.get("fastslow.engine")).startswith("jev")]
    assert check.name in _ancestors(call, by_id)

    # System 1 received the call span's context: the same trace crosses into it.
    assert len(received) == 1
    version, trace_id, parent_id, _flags = received[0].headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", CALLER_TRACE, call.span_id)

    # No state text by default: the tool call's command is in no span.
    assert STATE_MARKER.encode() not in receiver.raw()
    assert not any(STATE_MARKER in json.dumps(s.attributes) for s in spans)

    # JSON logs: the decision line and the access line carry the caller's trace id.
    lines = [json.loads(line) for line in err.read_text().splitlines() if line.startswith("{")]
    decided = [line for line in lines if line.get("decision_ids")]
    assert [set(line["decision_ids"]) for line in decided] == [decision_ids]
    assert decided[0]["trace_id"] == CALLER_TRACE
    access = [json.loads(line) for line in out.read_text().splitlines()]
    (checked,) = [line for line in access if "POST /v1/policy-check" in line["message"]]
    assert checked["trace_id"] == CALLER_TRACE and checked["span_id"] == server.span_id
    assert all(line["level"] for line in access + lines)


def _serve_under_probe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``fastslow serve`` up to the point it runs the server, which only prints the tracer provider in force."""
    probe = (
        "import sys\n"
        "from opentelemetry import trace\n"
        "import fastslow.api._server as server\n"
        "def run(self, sockets=None):\n"
        "    print(type(trace.get_tracer_provider()).__name__)\n"
        "    self.started = True\n"
        "server.Server.run = run\n"
        "from fastslow.api.cli import app\n"
        "app(['serve', '--port', '0'])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_without_otel_variables_serve_leaves_the_no_op_provider(tmp_path: Path) -> None:
    env = serve_env(tmp_path, FASTSLOW_ENGINE="jev")
    assert not any(name.startswith("OTEL_") for name in env)
    done = _serve_under_probe(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ProxyTracerProvider"]  # OpenTelemetry's default: nothing recorded


def test_variables_that_say_no_leave_the_no_op_provider_too(tmp_path: Path) -> None:
    for off in ({"OTEL_SDK_DISABLED": "true"}, {"OTEL_TRACES_EXPORTER": "none"}):
        env = serve_env(tmp_path, FASTSLOW_ENGINE="jev", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", **off)
        done = _serve_under_probe(env)
        assert (done.returncode, done.stdout.split()) == (0, ["ProxyTracerProvider"]), (off, done.stderr)
    env = serve_env(tmp_path, FASTSLOW_ENGINE="jev", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    done = _serve_under_probe(env)
    assert (done.returncode, done.stdout.split()) == (0, ["TracerProvider"]), done.stderr  # the SDK's


def test_asking_for_traces_without_the_sdk_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    env = serve_env(tmp_path, FASTSLOW_ENGINE="jev", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    # The SDK made unimportable, as where the otel extra is not installed.
    hide = "import sys; sys.modules['opentelemetry.sdk'] = None\nfrom fastslow.api.cli import app\napp(['serve'])\n"
    done = subprocess.run(
        [sys.executable, "-c", hide], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: OTEL_EXPORTER_OTLP_ENDPOINT asks for traces, but the OpenTelemetry SDK is not installed: "
        "pip install 'fastslow[otel]'"
    )


def test_a_graph_run_is_one_trace_exported_before_the_command_ends(tmp_path: Path) -> None:
    async def run() -> tuple[subprocess.CompletedProcess[str], list[str]]:
        async with running_jev_server("structured") as jev:
            env = serve_env(
                tmp_path,
                FASTSLOW_ENGINE="jev",
                FASTSLOW_JEV__BASE_URL=jev.url,
                FASTSLOW_JEV__MAX_RETRIES="0",
                OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
                OTEL_BSP_SCHEDULE_DELAY="600000",  # exported at the command's end, or never
            )
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "fastslow.api.cli", "graph", "run", "support-triage", "--input", "refund"],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            return done, [r.headers.get("traceparent", "") for r in jev.requests]

    with running_otlp_receiver() as receiver:
        done, traceparents = asyncio.run(run())
    assert done.returncode == 0, done.stderr
    spans = receiver.spans()
    (root,) = [s for s in spans if s.name == "fastslow graph run support-triage"]
    assert root.parent_span_id == "" and root.resource["service.name"] == "fastslow"
    assert {s.trace_id for s in spans} == {root.trace_id}  # the whole run is one trace
    by_id = {s.span_id: s for s in spans}
    (route,) = [s for s in spans if s.name == "fastslow.route support"]
    assert root.name in _ancestors(route, by_id)
    calls = [s for s in spans if s.kind == CLIENT]
    assert calls and all(route.name in _ancestors(call, by_id) for call in calls)
    assert traceparents and all(header.split("-")[1] == root.trace_id for header in traceparents)
