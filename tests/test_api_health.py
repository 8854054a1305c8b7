"""Probes, Prometheus metrics and the OpenAPI document."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from fastslow.api.app._health import _system2_status
from fastslow.engines.chat import Frontier
from fastslow.router import PolicySet, Route, RouteTask
from fastslow.router.settings import System2Settings

from fakes.api_server import api_client, new_key, running_api, test_settings

ROUTES = {name: Route(name=name, description=f"{name} questions") for name in ("billing", "technical")}
DROP = {"policies": ["tool_safety"], "tool_call": {"name": "sql", "arguments": {"query": "DROP TABLE customers;"}}}


def _sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    for line in metrics.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and found == labels:
            return float(value)
    return 0.0


async def test_probes_need_no_key_and_report_each_dependency(tmp_path: Path) -> None:
    with running_api(test_settings(tmp_path)) as api:
        async with api_client(api.url) as client:
            health = await client.get("/healthz")
            ready = await client.get("/readyz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready" and ready.json()["store"] is True
    assert ready.json()["engines"] == {"embedded": True}
    # No System-2 model configured: said in words, and still ready.
    status = ready.json()["system2_status"]
    assert status.startswith("not configured: ") and "openai:gpt-5.5 for support" in status
    assert "a check rule that would escalate denies the call" in status
    assert "set OPENAI_API_KEY" in status and "set ANTHROPIC_API_KEY" in status
    # Unauthenticated probes name no file or folder of the server.
    policy = test_settings(tmp_path).policy_file
    assert policy is not None
    for body in (health.text, ready.text):
        assert str(tmp_path) not in body and policy.name not in body


async def test_metrics_count_decisions_escalations_latency_and_reloads(tmp_path: Path) -> None:
    settings = test_settings(tmp_path)
    policy = settings.policy_file
    assert policy is not None
    with running_api(settings) as api, running_api(test_settings(tmp_path / "other")) as other:
        key = await new_key(settings, "acme")
        async with api_client(api.url, key) as client:
            assert (await client.post("/v1/policy-check", json=DROP)).status_code == 200
            open_ended = {"role": "user", "content": "Draft a migration plan for moving our team to the new dashboard"}
            await client.post("/v1/route", json={"task": "support", "messages": [open_ended]})
            before = (await client.get("/readyz")).json()["policy_version"]
            policy.write_text(policy.read_text(encoding="utf-8") + "\n# reviewed\n", encoding="utf-8")
            for _ in range(100):  # the app watches its policy file once a second
                metrics = (await client.get("/metrics")).text
                if _sample(metrics, "fastslow_policy_reloads_total"):
                    break
                await asyncio.sleep(0.1)
            after = (await client.get("/readyz")).json()["policy_version"]
        async with api_client(other.url) as client:
            elsewhere = (await client.get("/metrics")).text
    assert _sample(metrics, "fastslow_decisions_total", task="tool_safety", system="1", verdict="deny") == 1
    # The check's other rule (data exfiltration) is counted too, whatever its verdict.
    verdicts = ("allow", "review", "deny")
    assert (
        sum(_sample(metrics, "fastslow_decisions_total", task="tool_safety", system="1", verdict=v) for v in verdicts)
        == 2
    )
    assert _sample(metrics, "fastslow_escalations_total", task="support", result="unresolved") == 1
    assert _sample(metrics, "fastslow_engine_latency_seconds_count", engine="embedded") == 2
    assert _sample(metrics, "fastslow_policy_reloads_total") == 1
    assert after != before
    # Each app has its own registry: nothing leaks between apps in one process.
    assert _sample(elsewhere, "fastslow_decisions_total", task="tool_safety", system="1", verdict="deny") == 0


async def test_the_openapi_document_and_docs_are_served_and_the_root_leads_to_the_console(tmp_path: Path) -> None:
    with running_api(test_settings(tmp_path)) as api:
        async with api_client(api.url) as client:
            schema = (await client.get("/openapi.json")).json()
            docs = await client.get("/docs")
            root = await client.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/console"
    assert "/" not in schema["paths"]  # a page for people, not an operation
    assert {
        "/v1/policy-check",
        "/v1/policy-check/batch",
        "/v1/route",
        "/v1/systemone",
        "/v1/decisions/{decision_id}",
        "/v1/decisions/{decision_id}/outcome",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(schema["paths"])
    assert schema["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["ApiKey"]["description"],
    }
    assert "SystemOneRequest" in schema["components"]["schemas"]
    body = schema["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


@pytest.mark.parametrize(
    ("settings", "env"),
    [
        (System2Settings(), {}),
        (System2Settings(openai_api_key=SecretStr("sk-test")), {}),
        (System2Settings(), {"OPENAI_API_KEY": "sk-test"}),
        (System2Settings(), {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}),
        (System2Settings(anthropic_api_key=SecretStr("sk-test")), {}),
        (System2Settings(), {"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"}),
        (System2Settings(local_base_url="http://127.0.0.1:9/v1"), {}),
        (System2Settings(fallbacks={"openai:gpt-5.5": ["local:qwen"]}, local_base_url="http://127.0.0.1:9/v1"), {}),
    ],
)
async def test_system2_status_says_configured_exactly_when_frontier_has_a_model(
    settings: System2Settings, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    frontier = Frontier(settings)
    try:
        for ref in ("openai:gpt-5.5", "anthropic:claude-sonnet-4-6", "local:qwen"):
            task = RouteTask(name="support", routes=ROUTES, escalate_to=ref)
            policy = PolicySet(tasks={"support": task}, version="v")
            status = _system2_status(policy, settings)
            built = frontier.chat_for(ref) is not None  # what the router would escalate to
            assert status.startswith("configured: " if built else "not configured: "), (ref, status)
    finally:
        await frontier.aclose()
