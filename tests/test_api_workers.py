"""``fastslow serve --workers 2``: two worker processes behind one socket under uvicorn's supervisor.

One server on PostgreSQL (workers refuse SQLite) goes through what workers must do, in one run
because each start costs two engine loads: decisions stream in from several
clients while one worker is killed with SIGKILL and replaced; every scrape of ``/metrics``, whichever
worker answers it, reports the sum over the workers, the dead one's counts included; the rate limit
holds across workers as across replicas (leases from one row in the database) and so does the auth
throttle (each worker counts its own failures); SIGTERM stops every worker gracefully; and every
decision any response acknowledged is in the log.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy import create_engine, text

from fastslow.api.store._engine import sync_url
from fastslow.router import Settings

from fakes.api_server import api_client, new_key
from fakes.databases import postgres_schema_url  # noqa: F401  (fixture)
from fakes.serving import STARTUP_S, cli, serve_env, serving, worker_pids
from fakes.tls import TLS

WORKERS = 2
CLIENTS = 6
RATE_LIMIT = 150
"""Requests per key and minute: a lease is 8 tokens (5 %), so one worker can strand at most 8."""
LEASE = 8
THROTTLE_FAILURES = 5
STARTED = "Application startup complete."
CHECK = {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "ls -la /tmp"}}}


def _started(log: Path) -> int:
    return log.read_text(errors="replace").count(STARTED)


async def _until(condition: Callable[[], bool], what: str, log: Path, timeout_s: float = STARTUP_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}:\n{log.read_text(errors='replace')}"
        await asyncio.sleep(0.1)


def _decision_totals(metrics: str) -> float:
    return sum(float(v) for v in re.findall(r"^fastslow_decisions_total\{[^}]*\} (\S+)$", metrics, re.MULTILINE))


def _per_worker_decisions(directory: Path) -> dict[str, float]:
    """Each worker's own decision count, from its file in the metrics directory."""
    counts: dict[str, float] = {}
    for path in directory.glob("counter_*.db"):
        total = 0.0
        for metric in MultiProcessCollector.merge([str(path)]):  # type: ignore[no-untyped-call]
            total += sum(s.value for s in metric.samples if s.name == "fastslow_decisions_total")
        counts[path.stem] = total
    return counts


async def _fresh_get(url: str, path: str, key: str) -> int:
    # A connection per request: each is accepted by whichever worker gets there first.
    async with api_client(url, key) as http:
        return (await http.get(path)).status_code


@pytest.mark.slow
async def test_two_workers(tmp_path: Path, postgres_schema_url: str) -> None:  # noqa: F811
    database_url = postgres_schema_url
    metrics_dir = tmp_path / "metrics"
    env = serve_env(
        tmp_path,
        database_url,
        FASTSLOW_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT),
        FASTSLOW_AUTH_THROTTLE__FAILURES=str(THROTTLE_FAILURES),
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
    )
    settings = Settings(database_url=database_url, data_dir=tmp_path / "data")
    keys = [await new_key(settings, "acme") for _ in range(CLIENTS + 1)]
    log = tmp_path / "serve.log"
    acknowledged: list[str] = []

    with serving(env, log, "--workers", str(WORKERS), log_level="info") as (process, url):
        await _until(lambda: _started(log) == WORKERS, "both workers serving", log)
        first = worker_pids(process.pid)
        assert len(first) == WORKERS

        stop = asyncio.Event()

        async def client(key: str) -> None:
            # A connection per request: a burst of connections opened at once may all be accepted by
            # the worker that woke first (uvicorn's workers share one listening socket), and a
            # keep-alive connection stays with its worker, so only new connections reach them all.
            while not stop.is_set():
                try:
                    async with api_client(url, key, timeout=30.0) as http:
                        response = await http.post("/v1/policy-check", json=CHECK)
                except httpx2.TransportError:
                    continue  # its worker was killed mid-request: nothing acknowledged
                assert response.status_code == 200, response.text
                acknowledged.extend(rule["decision_id"] for rule in response.json()["rules"])

        clients = [asyncio.create_task(client(key)) for key in keys[:CLIENTS]]
        try:
            await _until(lambda: len(acknowledged) >= 60, "decisions before the kill", log, 120)
            victim = min(first)
            os.kill(victim, signal.SIGKILL)
            # The supervisor notices within its health-check loop and starts a replacement.
            await _until(lambda: _started(log) == WORKERS + 1, "a replacement worker serving", log)
            replaced = worker_pids(process.pid)
            assert victim not in replaced and len(replaced) == WORKERS and len(replaced - first) == 1
            served = len(acknowledged)
            await _until(lambda: len(acknowledged) >= served + 60, "decisions after the replacement", log, 120)
        finally:
            stop.set()
            await asyncio.gather(*clients)

        # Every scrape, whichever worker answers it, reports all the workers' decisions: the killed
        # worker's (which may have counted a few it never answered), the survivor's and the replacement's.
        scrapes = []
        for _ in range(4):
            async with httpx2.AsyncClient(base_url=url, verify=TLS) as http:
                scrapes.append(_decision_totals((await http.get("/metrics")).text))
        assert len(set(scrapes)) == 1
        assert len(acknowledged) <= scrapes[0] <= len(acknowledged) + CLIENTS * 2
        own = _per_worker_decisions(metrics_dir)
        assert sum(own.values()) == scrapes[0]
        assert sum(1 for count in own.values() if count > 0) >= 2, own

        # The rate limit across workers: one row per key and window in the database.
        limited = keys[CLIENTS]
        window = int(time.time() // 60)
        statuses = []
        for _ in range((RATE_LIMIT + 20) // 10):
            statuses += await asyncio.gather(
                *(_fresh_get(url, f"/v1/decisions/{acknowledged[0]}", limited) for _ in range(10))
            )
        allowed = statuses.count(200)
        assert set(statuses) == {200, 429}
        if int(time.time() // 60) == window:
            assert RATE_LIMIT - (WORKERS - 1) * LEASE <= allowed <= RATE_LIMIT
        else:  # a window edge passed mid-way: a fixed window lets up to twice the limit through
            assert allowed <= 2 * RATE_LIMIT

        # The auth throttle: each worker counts the failures it sees, as each replica does.
        failed = [
            await _fresh_get(url, "/v1/decisions", "fs_" + "x" * 43) for _ in range(WORKERS * THROTTLE_FAILURES + 3)
        ]
        assert set(failed) == {401, 429}
        assert failed.count(401) <= WORKERS * THROTTLE_FAILURES

        # SIGTERM: every worker stops gracefully, then the supervisor.
        workers = worker_pids(process.pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text(errors="replace")
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
        assert log.read_text(errors="replace").count("Finished server process") >= WORKERS

    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            logged = {row[0] for row in connection.execute(text("SELECT id FROM decisions"))}
    finally:
        engine.dispose()
    missing = [d for d in acknowledged if d not in logged]
    assert missing == [], f"{len(missing)} of {len(acknowledged)} acknowledged decisions were lost"


def test_workers_refuse_a_sqlite_log_and_a_count_below_one(tmp_path: Path) -> None:
    log = tmp_path / "log" / "fastslow.sqlite3"
    env = serve_env(tmp_path, f"sqlite+aiosqlite:///{log}")
    refused = cli(env, "serve", "--workers", "2")
    assert refused.returncode == 2
    assert f"--workers 2: the decision log is a SQLite file ({log})" in refused.stderr
    assert "FASTSLOW_DATABASE_URL to a PostgreSQL database" in refused.stderr
    assert not log.exists()  # refused before anything was opened or migrated
    zero = cli(env, "serve", "--workers", "0")
    assert zero.returncode == 2 and "--workers" in zero.stderr
