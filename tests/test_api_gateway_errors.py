"""What the Jev gateway and decisions say when System 1 fails: the kind, the right status, never the upstream's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastslow.router.settings import JevSettings

from fakes.api_server import api_client, running_api, test_settings
from fakes.jev_server import Reply, running_jev_server

SECRET = "internal-host.corp:8443 said: bad key sk-live-0000"
BODY = {
    "state": "I was charged twice",
    "questions": {"topic": {"type": "choice", "criteria": {"billing": None, "technical": None}}},
}


@pytest.mark.parametrize(
    ("reply", "status", "kind", "retry_after"),
    [
        (Reply(401, {"error": SECRET}), 502, "upstream_error", None),
        (Reply(404, {"detail": SECRET}), 502, "upstream_error", None),
        (Reply(429, {"error": SECRET}, headers={"Retry-After": "7"}), 503, "engine_unavailable", "7"),
        (Reply(503, {"error": SECRET}), 503, "engine_unavailable", "1"),
        (Reply(200, "not json " + SECRET), 502, "upstream_error", None),
    ],
)
async def test_the_gateway_names_the_kind_of_failure_and_keeps_the_upstream_s_text_to_the_log(
    tmp_path: Path, reply: Reply, status: int, kind: str, retry_after: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_jev_server("jev") as engine:
        engine.script(reply)
        settings = test_settings(
            tmp_path, engine="jev", jev=JevSettings(base_url=engine.url, profile="jev", max_retries=0)
        )
        with running_api(settings) as running:
            key = await running.key("acme")
            async with api_client(running.url, key) as client:
                response = await client.post("/v1/systemone", json=BODY)
    assert response.status_code == status, response.text
    assert response.json()["error"]["type"] == kind
    assert response.headers.get("retry-after") == retry_after
    assert "sk-live" not in response.text and engine.url not in response.text and "internal-host" not in response.text
    assert "sk-live" in caplog.text  # the operator still sees what the upstream said


async def test_a_failed_check_s_decisions_carry_the_kind_not_the_upstream_s_text(tmp_path: Path) -> None:
    async with running_jev_server("jev") as engine:
        engine.script(*[Reply(500, {"error": SECRET})] * 4)
        settings = test_settings(
            tmp_path, engine="jev", jev=JevSettings(base_url=engine.url, profile="jev", max_retries=0)
        )
        with running_api(settings) as running:
            key = await running.key("acme")
            async with api_client(running.url, key) as client:
                body = {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "ls"}}}
                response = await client.post("/v1/policy-check", json=body)
                stored = [
                    (await client.get(f"/v1/decisions/{r['decision_id']}")).text for r in response.json()["rules"]
                ]
    assert response.status_code == 200 and response.json()["verdict"] in ("deny", "review")
    for text in (response.text, *stored):
        assert "sk-live" not in text and engine.url not in text
    assert all("System 1 answered HTTP 500" in text for text in stored)  # the kind, kept in the log
