"""The cache of live API keys: a key is read from the table once per ``auth_cache_s``.

Revocation across replicas is in test_key_revocation.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from fastslow.api.app._keycache import KeyCache
from fastslow.api.store import ApiKey, DecisionStore, database_url_for

from fakes.api_server import api_client, new_key, running_api, test_settings

RECORD = ApiKey(id="k1", tenant="acme", name=None, prefix="fs_abcdefgh", created_at=datetime.now(UTC), revoked_at=None)


def test_a_key_is_kept_for_its_ttl_then_read_again() -> None:
    now = [100.0]
    cache = KeyCache(5.0, clock=lambda: now[0])
    assert cache.get("fs_secret") is None
    cache.put("fs_secret", RECORD)
    now[0] += 4.9
    assert cache.get("fs_secret") == RECORD
    now[0] += 0.2
    assert cache.get("fs_secret") is None


def test_the_cache_is_bounded_and_zero_turns_it_off() -> None:
    cache = KeyCache(60.0, entries=2)
    for key in ("fs_a", "fs_b", "fs_c"):
        cache.put(key, RECORD)
    assert cache.get("fs_a") is None and cache.get("fs_c") is not None
    off = KeyCache(0.0)
    off.put("fs_a", RECORD)
    assert off.get("fs_a") is None


def test_the_raw_key_is_never_held() -> None:
    cache = KeyCache(60.0)
    cache.put("fs_the-secret-itself", RECORD)
    assert "fs_the-secret-itself" not in repr(cache._keys)  # noqa: SLF001


async def test_a_revoked_key_is_refused_once_its_cache_entry_expires(tmp_path: Path) -> None:
    settings = test_settings(tmp_path).model_copy(update={"auth_cache_s": 0.5})
    key = await new_key(settings, "acme")
    with running_api(settings) as api:
        async with api_client(api.url, key) as client:
            assert (await client.get("/v1/decisions/x")).status_code == 404  # found live, now cached
            async with await DecisionStore.open(database_url_for(settings), migrate=False) as store:
                (record,) = await store.list_keys("acme")
                assert await store.revoke_key(record.id)
            statuses = []
            for _ in range(40):  # a revocation lands within auth_cache_s, polled
                statuses.append((await client.get("/v1/decisions/x")).status_code)
                if statuses[-1] == 403:
                    break
                await asyncio.sleep(0.05)
    assert statuses[-1] == 403
