"""Per-key rate limit: fixed windows counted in the decision log's database, spent from local leases.

Why the database: every replica already shares it, so the limit holds across replicas with no
process state that must be shared and no extra service to run (Redis is not on users' machines).

Why leases: one upsert per request cost a database round trip on every call (about a millisecond
of CPU, and a write on SQLite's single writer). A replica instead takes a *lease* of tokens from
the key's window row in one upsert (adding the lease's size to the row's count) and spends it in
memory; only when it is spent does the next request for that key go to the database. A lease is
``lease_share`` of the limit (5 %, at most ``MAX_LEASE`` tokens, at least 1), and shrinks as the
window fills (at most half of what the row had left when last read), so small limits are counted
exactly, request by request.

What that gives with N replicas (docs/deploy.md):

* never more than the limit per key and window across all replicas: every token is taken from the
  shared row inside a transaction, so there is no overshoot;
* a request may be refused while other replicas still hold unspent tokens of the same window: at
  most (N - 1) leases, that is (N - 1) x 5 % of the limit, are stranded that way;
* a fixed window can still let up to twice the limit through around a window edge, as before.

Refused requests are counted as they always were (a client hammering past its limit keeps its
window full). A batch counts its items (``hit(key, n=...)``). The table is a cache of counters,
not records: rows older than the current window are deleted when a key opens a new one.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Table, delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from fastslow.api.store import RateWindowRow
from fastslow.router import Settings

from ._errors import StoreUnavailable

__all__ = ["MAX_LEASE", "RateLimit", "RateLimiter"]

DEFAULT_REQUESTS_PER_MINUTE = 600
MAX_LEASE = 100
"""The most tokens one lease takes from the shared row."""
_KEYS = 10_000
"""Keys whose leases a replica keeps; beyond it the oldest are dropped (their unspent tokens stranded)."""

WINDOWS: Table = RateWindowRow.__table__  # type: ignore[assignment]  # created by the store's migrations

# Both dialects spell "insert, or add to the existing row" the same way, from different modules.
_UPSERTS: dict[str, Callable[[Table], Any]] = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """How many requests one API key may make per window."""

    requests: int = DEFAULT_REQUESTS_PER_MINUTE
    """Requests per window; 0 turns the limit off."""
    window_s: int = 60
    lease_share: float = 0.05
    """The share of the limit one lease takes from the shared count (see the module docstring)."""

    def __post_init__(self) -> None:
        if self.requests < 0 or self.window_s < 1 or not 0.0 < self.lease_share <= 1.0:
            raise ValueError("need requests >= 0, window_s >= 1 and 0 < lease_share <= 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimit:
        """The limit ``settings`` asks for (``rate_limit_per_minute``)."""
        return cls(requests=settings.rate_limit_per_minute, window_s=60)

    @property
    def lease(self) -> int:
        """Tokens a lease takes while the window has plenty left."""
        return max(1, min(MAX_LEASE, math.ceil(self.requests * self.lease_share)))


@dataclass(slots=True)
class _Key:
    """One key's lease on this replica."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One database trip per key at a time: concurrent requests for a key wait for its next lease."""
    window: int = -1
    left: int = 0
    """Tokens taken from the shared row for ``window`` and not yet spent."""
    row_left: int = 0
    """What the shared row had left for ``window`` when this replica last took from it."""

    def spend(self, window: int, n: int) -> bool:
        if self.window != window or self.left < n:
            return False
        self.left -= n
        return True


class RateLimiter:
    """Counts each key's requests per fixed window, in leases taken from the shared database.

    Args:
        engine: the decision log's engine (``DecisionStore.engine``).
        limit: the limit to enforce.
    """

    def __init__(self, engine: AsyncEngine, limit: RateLimit) -> None:
        self._engine = engine
        self.limit = limit
        self._upsert = _UPSERTS[engine.dialect.name]
        self._keys: dict[str, _Key] = {}
        self.trips = 0
        """Database round trips made (for metrics and tests)."""

    async def hit(self, key_id: str, *, now: float | None = None, n: int = 1) -> float | None:
        """Count ``n`` requests (a batch's items); the seconds to wait when over the limit, else ``None``.

        Raises:
            StoreUnavailable: the database could not count them.
        """
        if self.limit.requests == 0:
            return None
        now = time.time() if now is None else now
        window = int(now // self.limit.window_s) * self.limit.window_s
        key = self._keys.get(key_id)
        if key is None:
            key = self._keys[key_id] = _Key()
            if len(self._keys) > _KEYS:
                self._forget()
        elif key.spend(window, n):
            return None
        async with key.lock:
            # Another request's lease may have come in while this one waited for the lock.
            if key.spend(window, n) or await self._take(key_id, key, window, n):
                return None
        return max(1.0, math.ceil(window + self.limit.window_s - now))

    def _forget(self) -> None:
        """Drop the oldest idle keys (their unspent tokens stay counted in the row: stranded)."""
        for key_id in [k for k, v in self._keys.items() if not v.lock.locked()][: len(self._keys) - _KEYS]:
            del self._keys[key_id]

    async def _take(self, key_id: str, key: _Key, window: int, n: int) -> bool:
        """Take a lease of at least ``n`` tokens from the shared row; whether ``n`` of them were granted."""
        size = self.limit.lease
        if key.window == window:
            size = min(size, max(1, key.row_left // 2))  # the window is filling: take less
        else:
            key.window, key.left = window, 0
        want = max(n, size)
        statement = (
            self._upsert(WINDOWS)
            .values(key_id=key_id, window_start=window, hits=want)
            .on_conflict_do_update(
                index_elements=[WINDOWS.c.key_id, WINDOWS.c.window_start], set_={"hits": WINDOWS.c.hits + want}
            )
            .returning(WINDOWS.c.hits)
        )
        try:
            async with self._engine.begin() as connection:
                hits = (await connection.execute(statement)).scalar_one()
                if hits == want:  # a new window: the key's older ones are done with
                    old = (WINDOWS.c.key_id == key_id) & (WINDOWS.c.window_start < window)
                    await connection.execute(delete(WINDOWS).where(old))
        except (SQLAlchemyError, OSError) as exc:
            raise StoreUnavailable("the rate limiter's database is unavailable") from exc
        self.trips += 1
        # Tokens past the limit are never granted; they stay counted, as refused requests always were.
        granted = max(0, min(want, self.limit.requests - (hits - want)))
        key.row_left = max(0, self.limit.requests - hits)
        key.left += granted
        return key.spend(window, n)
