"""Graceful shutdown: on SIGTERM, `fastslow serve` answers the checks in flight, commits them, then exits."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from test_api_kill import CALLS

from fakes.api_server import api_client
from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.jev_server import running_jev_server
from fakes.serving import cli, serve_env, serving

IN_FLIGHT = 6
SLOW_ENGINE_S = 1.5


def _distinct(n: int) -> dict[str, Any]:
    call = CALLS[n % len(CALLS)]
    return {"name": call["name"], "arguments": {**call["arguments"], "request": n}}


@pytest.mark.slow
async def test_sigterm_drains_the_checks_in_flight_and_keeps_their_decisions(
    tmp_path: Path,
    database_url: str,  # noqa: F811
) -> None:
    async with running_jev_server("jev") as engine:
        engine.compute_delay_s = SLOW_ENGINE_S  # every check is still waiting on System 1 at SIGTERM
        env = serve_env(tmp_path, database_url)
        env.update(FASTSLOW_ENGINE="jev", FASTSLOW_JEV__BASE_URL=engine.url, FASTSLOW_JEV__PROFILE="jev")
        created = cli(env, "keys", "create", "--tenant", "acme")
        assert created.returncode == 0, created.stderr
        key = created.stdout.strip()
        log = tmp_path / "serve.log"
        with serving(env, log) as (process, url):
            async with api_client(url, key, timeout=30.0) as http:
                asked = len(engine.requests)
                # Distinct calls: identical ones would share one engine request (coalescing).
                bodies = [{"policies": ["tool_safety"], "tool_call": _distinct(n)} for n in range(IN_FLIGHT)]
                checks = [asyncio.create_task(http.post("/v1/policy-check", json=body)) for body in bodies]
                deadline = time.monotonic() + 30
                while len(engine.requests) < asked + IN_FLIGHT:  # every check has reached System 1
                    assert time.monotonic() < deadline, f"{len(engine.requests) - asked} checks reached System 1"
                    await asyncio.sleep(0.01)
                os.kill(process.pid, signal.SIGTERM)
                responses = await asyncio.gather(*checks)
                code = await asyncio.to_thread(process.wait, 30)
                with pytest.raises(httpx2.TransportError):  # gone once drained: no new work taken
                    await http.post("/v1/policy-check", json={"policies": ["tool_safety"], "tool_call": CALLS[0]})
        assert code in (0, -signal.SIGTERM), log.read_text()  # uvicorn re-raises the signal it drained on
        assert [r.status_code for r in responses] == [200] * IN_FLIGHT, [r.text for r in responses]
        acknowledged = [rule["decision_id"] for r in responses for rule in r.json()["rules"]]
        engine.compute_delay_s = 0.0
        with serving(env, log) as (_process, url):
            async with api_client(url, key) as http:
                statuses = [(await http.get(f"/v1/decisions/{d}")).status_code for d in acknowledged]
    assert statuses == [200] * len(acknowledged)
