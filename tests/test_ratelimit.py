"""The rate limiter's leases: few database trips, never over the limit across replicas, a bounded shortfall.

Two ``RateLimiter`` instances on one real database stand for two replicas (a SQLite file, and
PostgreSQL when one is reachable). Time is passed in (``now=``), so windows are exact.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from fastslow.api.app._ratelimit import MAX_LEASE, RateLimit, RateLimiter
from fastslow.api.store import DecisionStore

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

NOW = 1_800_000_000.0
"""A moment at the start of a 60 s window."""


async def _allowed(limiter: RateLimiter, key: str, count: int, *, now: float = NOW) -> int:
    return sum([await limiter.hit(key, now=now) is None for _ in range(count)])


async def test_a_replica_counts_many_requests_in_one_trip(store: DecisionStore) -> None:
    limiter = RateLimiter(store.engine, RateLimit(requests=100_000))
    assert await _allowed(limiter, "k1", 500) == 500
    assert limiter.trips == 500 // MAX_LEASE  # a lease of MAX_LEASE tokens per trip


async def test_a_small_limit_is_counted_request_by_request(store: DecisionStore) -> None:
    limiter = RateLimiter(store.engine, RateLimit(requests=3))
    assert [await limiter.hit("k1", now=NOW) for _ in range(3)] == [None, None, None]
    wait = await limiter.hit("k1", now=NOW + 10)
    assert wait == 50.0  # to the end of the window
    assert limiter.trips == 4


@pytest.mark.parametrize("limit", [7, 100, 1_000, 5_000])
async def test_two_replicas_never_let_more_than_the_limit_through(store: DecisionStore, limit: int) -> None:
    rate = RateLimit(requests=limit)
    replicas = [RateLimiter(store.engine, rate), RateLimiter(store.engine, rate)]
    rng = random.Random(limit)
    allowed = 0
    for _ in range(limit * 2):
        allowed += await rng.choice(replicas).hit("shared", now=NOW) is None
    # Never over; short of it by at most what the other replica holds unspent (one lease).
    assert limit - rate.lease <= allowed <= limit


async def test_concurrent_requests_for_one_key_share_a_trip(store: DecisionStore) -> None:
    limiter = RateLimiter(store.engine, RateLimit(requests=100_000))
    results = await asyncio.gather(*(limiter.hit("k1", now=NOW) for _ in range(50)))
    assert results == [None] * 50
    assert limiter.trips == 1


async def test_a_new_window_starts_a_new_count(store: DecisionStore) -> None:
    limiter = RateLimiter(store.engine, RateLimit(requests=10))
    assert await _allowed(limiter, "k1", 15) == 10
    assert await _allowed(limiter, "k1", 15, now=NOW + 60) == 10


async def test_a_batch_counts_its_items(store: DecisionStore) -> None:
    limiter = RateLimiter(store.engine, RateLimit(requests=10))
    assert await limiter.hit("k1", now=NOW, n=8) is None
    assert await limiter.hit("k1", now=NOW, n=3) is not None  # 11 > 10
    assert await limiter.hit("k1", now=NOW, n=2) is None  # what is left still serves a smaller call


async def test_keys_are_counted_apart_and_zero_turns_the_limit_off(store: DecisionStore) -> None:
    limiter = RateLimiter(store.engine, RateLimit(requests=2))
    assert await _allowed(limiter, "k1", 3) == 2
    assert await _allowed(limiter, "k2", 3) == 2
    off = RateLimiter(store.engine, RateLimit(requests=0))
    assert await _allowed(off, "k1", 50) == 50 and off.trips == 0
