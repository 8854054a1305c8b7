"""Durable and shared: no response before its commit, and one rate limit across replicas on one PostgreSQL.

A real server on loopback records into a real database (a SQLite file, and PostgreSQL when one is
reachable). Another connection holds the lock every insert into ``decisions`` needs: the check's
response must wait for it, and once the lock goes, the decision the response names is in the log.
Were the commit moved after the response, the response would arrive while the lock is held.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fastslow.api.app import RateLimit
from fastslow.api.store import DecisionStore, database_url_for

from fakes.api_server import api_client, new_key, running_api, test_settings
from fakes.databases import commits_blocked, database_url, postgres_schema_url  # noqa: F401  (fixtures)

CHECK = {"policies": ["tool_safety"], "text": "git: status"}


async def test_a_check_is_answered_only_after_its_commit(tmp_path: Path, database_url: str) -> None:  # noqa: F811
    settings = test_settings(tmp_path, database_url=database_url)
    key = await new_key(settings, "acme")
    with running_api(settings) as api:
        async with api_client(api.url, key) as client:
            # The first call takes the key's rate-limit lease and caches the key: later calls need
            # no write but their decisions' (nor a read of the key table).
            assert (await client.post("/v1/policy-check", json=CHECK)).status_code == 200
            with commits_blocked(database_url):
                pending = asyncio.ensure_future(client.post("/v1/policy-check", json=CHECK))
                await asyncio.sleep(1.0)  # System 1 answers in milliseconds; the commit is what waits
                assert not pending.done(), "a response left before its decisions were committed"
            response = await pending
    assert response.status_code == 200
    decision_id = response.json()["decision_id"]
    async with await DecisionStore.open(database_url_for(settings), migrate=False) as store:
        assert await store.get(decision_id, tenant="acme") is not None


@pytest.mark.xdist_group("timing")  # counts requests in a time window under load
async def test_two_replicas_on_postgresql_hold_the_rate_limit_within_one_lease(
    tmp_path: Path,
    postgres_schema_url: str,  # noqa: F811
) -> None:
    settings = test_settings(tmp_path, database_url=postgres_schema_url)
    limit = RateLimit(requests=60, window_s=3600)
    key = await new_key(settings, "acme")
    with running_api(settings, rate_limit=limit) as one, running_api(settings, rate_limit=limit) as two:
        async with api_client(one.url, key) as a, api_client(two.url, key) as b:
            statuses = await asyncio.gather(*(c.get("/v1/decisions/x") for c in [a, b] * 75))
    allowed = sum(s.status_code == 404 for s in statuses)
    refused = sum(s.status_code == 429 for s in statuses)
    assert allowed + refused == 150
    # Never over the limit; short of it by at most the other replica's unspent lease (docs/limits.md).
    assert limit.requests - limit.lease <= allowed <= limit.requests, allowed
