"""The API's System-1 breaker: a dead engine stops being called, checks fail closed, and it shows."""

from __future__ import annotations

from pathlib import Path

from fastslow.router.settings import BreakerSettings, JevSettings

from fakes.api_server import api_client, running_api, test_settings
from fakes.jev_server import Reply, running_jev_server

FAILURES = 3


async def test_a_dead_engine_opens_the_breaker_checks_fail_closed_and_readiness_says_so(tmp_path: Path) -> None:
    async with running_jev_server(None) as engine:  # no profile, nothing scripted: every call gets a 500
        settings = test_settings(
            tmp_path,
            engine="jev",
            jev=JevSettings(base_url=engine.url, profile="jev", max_retries=0),
            breaker=BreakerSettings(failures=FAILURES, open_s=600),
        )
        with running_api(settings) as running:
            key = await running.key("acme")
            async with api_client(running.url, key) as client:
                verdicts = []
                for n in range(12):
                    body = {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"n": n}}}
                    response = await client.post("/v1/policy-check", json=body)
                    assert response.status_code == 200, response.text
                    verdicts.append(response.json()["verdict"])
                ready = await client.get("/readyz")
                metrics = (await client.get("/metrics")).text
    assert set(verdicts) <= {"deny", "review"}  # nobody could judge: failed closed, never allowed
    assert len(engine.requests) == FAILURES  # then the breaker answered for the dead engine
    assert ready.status_code == 503
    assert ready.json()["breakers"] == {"jev": "open"} and ready.json()["engines"]["jev"] is False
    assert 'fastslow_engine_breaker_state{engine="jev"} 2.0' in metrics


async def test_the_breaker_closes_again_once_the_engine_answers(tmp_path: Path) -> None:
    async with running_jev_server("jev") as engine:
        engine.script(*[Reply(503, {"error": "warming up"})] * FAILURES)
        settings = test_settings(
            tmp_path,
            engine="jev",
            jev=JevSettings(base_url=engine.url, profile="jev", max_retries=0),
            breaker=BreakerSettings(failures=FAILURES, open_s=0.0),  # probe at once
        )
        with running_api(settings) as running:
            key = await running.key("acme")
            async with api_client(running.url, key) as client:
                for n in range(FAILURES + 2):
                    body = {"policies": ["tool_safety"], "tool_call": {"name": "ls", "arguments": {"n": n}}}
                    assert (await client.post("/v1/policy-check", json=body)).status_code == 200
                ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["breakers"] == {"jev": "closed"}
