"""The kill test: every decision the API acknowledged survives `kill -9` of `fastslow serve`.

The server runs as its own process on a free loopback port with its log on a real database (a
SQLite file in a temporary directory, and a fresh PostgreSQL schema when one is reachable). Policy
checks stream in from several clients, the process is killed mid-stream, a new one starts on the
same database, and every decision id any response carried is read back.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import httpx2
import pytest

from fakes.api_server import api_client
from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.serving import cli, serve_env, serving

ACKNOWLEDGED_BEFORE_KILL = 30
CALLS = [
    {"name": "shell", "arguments": {"command": "rm -rf /var/lib/postgresql/data"}},
    {"name": "kubectl", "arguments": {"args": "get pods -n production"}},
    {"name": "git", "arguments": {"args": "push --force origin main"}},
]


@pytest.mark.slow
async def test_acknowledged_decisions_survive_kill_9(tmp_path: Path, database_url: str) -> None:  # noqa: F811
    env = serve_env(tmp_path, database_url)
    created = cli(env, "keys", "create", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    acknowledged: list[str] = []
    log = tmp_path / "serve.log"

    with serving(env, log) as (process, url):

        async def client(n: int) -> None:
            async with api_client(url, key, timeout=30.0) as http:
                i = n
                while True:
                    body = {"policies": ["tool_safety"], "tool_call": CALLS[i % len(CALLS)]}
                    try:
                        response = await http.post("/v1/policy-check", json=body)
                    except httpx2.TransportError:
                        return  # the server is gone
                    assert response.status_code == 200, response.text
                    acknowledged.extend(rule["decision_id"] for rule in response.json()["rules"])
                    i += 1

        async def killer() -> None:
            while len(acknowledged) < 2 * ACKNOWLEDGED_BEFORE_KILL:
                await asyncio.sleep(0.01)
            os.kill(process.pid, signal.SIGKILL)  # mid-stream: several requests are in flight

        await asyncio.wait_for(asyncio.gather(killer(), *(client(n) for n in range(6))), timeout=300)
        assert process.wait(timeout=30) == -signal.SIGKILL

    assert len(acknowledged) >= 2 * ACKNOWLEDGED_BEFORE_KILL
    # The server said at start which policy file it runs.
    assert f"policy: {env['FASTSLOW_POLICY_FILE']} (FASTSLOW_POLICY_FILE)" in log.read_text()
    with serving(env, log) as (_process, url):
        async with api_client(url, key) as http:
            statuses = [(await http.get(f"/v1/decisions/{decision_id}")).status_code for decision_id in acknowledged]
    missing = [d for d, status in zip(acknowledged, statuses, strict=True) if status != 200]
    assert missing == [], f"{len(missing)} of {len(acknowledged)} acknowledged decisions were lost"
