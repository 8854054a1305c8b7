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
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest

from fakes.api_server import REPO, api_client, test_policy
from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.embedded import child_env
from fakes.processes import wait_until_answering

STARTUP_S = 120.0
ACKNOWLEDGED_BEFORE_KILL = 30
CALLS = [
    {"name": "shell", "arguments": {"command": "rm -rf /var/lib/postgresql/data"}},
    {"name": "kubectl", "arguments": {"args": "get pods -n production"}},
    {"name": "git", "arguments": {"args": "push --force origin main"}},
]


def _env(tmp_path: Path, url: str) -> dict[str, str]:
    return child_env(
        FASTSLOW_DATA_DIR=str(tmp_path / "data"),
        FASTSLOW_DATABASE_URL=url,
        FASTSLOW_POLICY_FILE=str(test_policy(tmp_path)),
        FASTSLOW_SETTINGS_FILE=str(tmp_path / "none.toml"),
    )


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fastslow.api.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextmanager
def _serving(env: dict[str, str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = _free_port()
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "fastslow.api.cli", "serve", "--port", str(port), "--log-level", "warning"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(process, f"{url}/readyz", log=log, timeout_s=STARTUP_S)
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


@pytest.mark.slow
async def test_acknowledged_decisions_survive_kill_9(tmp_path: Path, database_url: str) -> None:  # noqa: F811
    env = _env(tmp_path, database_url)
    created = _cli(env, "keys", "create", "--tenant", "acme")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    acknowledged: list[str] = []
    log = tmp_path / "serve.log"

    with _serving(env, log) as (process, url):

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
    with _serving(env, log) as (_process, url):
        async with api_client(url, key) as http:
            statuses = [(await http.get(f"/v1/decisions/{decision_id}")).status_code for decision_id in acknowledged]
    missing = [d for d, status in zip(acknowledged, statuses, strict=True) if status != 200]
    assert missing == [], f"{len(missing)} of {len(acknowledged)} acknowledged decisions were lost"
