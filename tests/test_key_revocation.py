"""A revoked key is refused at once on every replica, though each keeps live keys cached for minutes.

Two API replicas share one decision log (a SQLite file, or a PostgreSQL schema); both have the key
cached; another process's ``revoke_key`` (what ``fastslow keys revoke`` runs) must reach both long
before the cache entry would expire: on SQLite at the very next request, on PostgreSQL as soon as
the notification is delivered (milliseconds; polled here with a bound far below the cache's TTL).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

from fastslow.api.app._keycache import KeyCache
from fastslow.api.app._revocations import FileRevocations, PostgresRevocations
from fastslow.api.store import ApiKey, DecisionStore
from fastslow.api.store._revocations import touch_marker

from fakes.api_server import api_client, new_key, running_api, test_settings
from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

CACHE_S = 300.0
"""Far longer than any test: a refusal can only come from the revocation reaching the replica."""
DELIVERY_BOUND_S = 5.0

RECORD = ApiKey(id="k1", tenant="acme", name=None, prefix="fs_abcdefgh", created_at=datetime.now(UTC), revoked_at=None)


class Watch:
    def __init__(self) -> None:
        self.value: object | None = 0

    def generation(self) -> object | None:
        return self.value

    def running(self) -> object:  # not entered by these unit tests
        raise NotImplementedError


def test_a_revocation_empties_the_cache_and_an_unknown_generation_trusts_nothing() -> None:
    watch = Watch()
    cache = KeyCache(CACHE_S, watch=watch)
    cache.put("fs_a", RECORD, seen=cache.generation())
    assert cache.get("fs_a") == RECORD
    watch.value = 1
    assert cache.get("fs_a") is None
    cache.put("fs_a", RECORD, seen=cache.generation())
    assert cache.get("fs_a") == RECORD
    watch.value = None  # the listener lost its connection
    assert cache.get("fs_a") is None
    cache.put("fs_a", RECORD, seen=None)
    watch.value = 2
    assert cache.get("fs_a") is None


def test_a_key_read_before_a_revocation_is_not_cached_after_it() -> None:
    watch = Watch()
    cache = KeyCache(CACHE_S, watch=watch)
    seen = cache.generation()
    watch.value = 1  # revoked while the key was being read from the table
    cache.put("fs_a", RECORD, seen=seen)
    assert cache.get("fs_a") is None


def test_the_sqlite_marker_changes_on_every_revocation(tmp_path: Path) -> None:
    database = tmp_path / "fastslow.sqlite3"
    watch = FileRevocations(database)
    before = watch.generation()
    assert before == 0
    seen = {before}
    for _ in range(5):  # within one clock tick too: the marker is replaced, so its inode changes
        touch_marker(database)
        seen.add(watch.generation())
    assert len(seen) == 6


async def test_a_revoked_key_is_refused_at_once_by_every_replica(tmp_path: Path, database_url: str) -> None:  # noqa: F811
    settings = test_settings(tmp_path, database_url=database_url, auth_cache_s=CACHE_S)
    key = await new_key(settings, "acme")
    with running_api(settings) as first, running_api(settings) as second:
        async with api_client(first.url, key) as one, api_client(second.url, key) as two:
            for client in (one, two):  # both replicas find the key live, and cache it
                assert (await client.get("/v1/decisions/x")).status_code == 404
                assert (await client.get("/v1/decisions/x")).status_code == 404
            async with await DecisionStore.open(database_url, migrate=False) as store:
                (record,) = await store.list_keys("acme")
                assert await store.revoke_key(record.id)
            for client in (one, two):
                if database_url.startswith("sqlite"):
                    assert (await client.get("/v1/decisions/x")).status_code == 403
                    continue
                deadline = time.monotonic() + DELIVERY_BOUND_S
                status = (await client.get("/v1/decisions/x")).status_code
                while status != 403 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                    status = (await client.get("/v1/decisions/x")).status_code
                assert status == 403


async def test_the_postgres_listener_trusts_nothing_until_it_listens(postgres_schema_url: str) -> None:  # noqa: F811
    url = postgres_schema_url
    watch = PostgresRevocations(url)
    assert watch.generation() is None  # not listening yet: nothing cached may be trusted
    async with watch.running():
        await asyncio.wait_for(watch.connected.wait(), DELIVERY_BOUND_S)
        listening = watch.generation()
        assert listening is not None
        async with await DecisionStore.open(url) as store:
            key, record = await store.create_key("acme")
            del key
            assert await store.revoke_key(record.id)
        deadline = time.monotonic() + DELIVERY_BOUND_S
        while watch.generation() == listening and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert watch.generation() not in (None, listening)
    assert watch.generation() is None
