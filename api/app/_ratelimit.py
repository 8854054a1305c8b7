"""Per-key rate limit: a fixed-window counter kept in the decision log's database.

Why the database: every replica already shares it, so the limit holds across replicas with no
process state and no extra service to run (Redis is not on users' machines). One upsert per
request is cheap next to the decision the request makes, which is written to the same database
anyway. A fixed window can let up to twice the limit through around a window edge; that is the
usual price for one row per key and window, and acceptable for a guard against runaway clients.

The table is a cache of counters, not records: rows older than the current window are deleted
when a key opens a new one, and losing the table loses nothing but the current counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, delete
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from fastslow.api.store import RateWindowRow
from fastslow.router import Settings

from ._errors import StoreUnavailable

__all__ = ["RateLimit", "RateLimiter"]

DEFAULT_REQUESTS_PER_MINUTE = 600

WINDOWS: Table = RateWindowRow.__table__  # type: ignore[assignment]  # created by the store's migrations

# Both dialects spell "insert, or add one to the existing row" the same way, from different modules.
_UPSERTS: dict[str, Callable[[Table], Any]] = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    """How many requests one API key may make per window."""

    requests: int = DEFAULT_REQUESTS_PER_MINUTE
    """Requests per window; 0 turns the limit off."""
    window_s: int = 60

    def __post_init__(self) -> None:
        if self.requests < 0 or self.window_s < 1:
            raise ValueError("need requests >= 0 and window_s >= 1")

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimit:
        """The limit ``settings`` asks for (``rate_limit_per_minute``)."""
        return cls(requests=settings.rate_limit_per_minute, window_s=60)


class RateLimiter:
    """Counts each key's requests per fixed window in the shared database.

    Args:
        engine: the decision log's engine (``DecisionStore.engine``).
        limit: the limit to enforce.
    """

    def __init__(self, engine: AsyncEngine, limit: RateLimit) -> None:
        self._engine = engine
        self.limit = limit
        self._upsert = _UPSERTS[engine.dialect.name]

    async def hit(self, key_id: str, *, now: float | None = None) -> float | None:
        """Count one request; the seconds to wait when it is over the limit, else ``None``.

        Raises:
            StoreUnavailable: the database could not count it.
        """
        if self.limit.requests == 0:
            return None
        now = time.time() if now is None else now
        window = int(now // self.limit.window_s) * self.limit.window_s
        statement = (
            self._upsert(WINDOWS)
            .values(key_id=key_id, window_start=window, hits=1)
            .on_conflict_do_update(
                index_elements=[WINDOWS.c.key_id, WINDOWS.c.window_start], set_={"hits": WINDOWS.c.hits + 1}
            )
            .returning(WINDOWS.c.hits)
        )
        try:
            async with self._engine.begin() as connection:
                hits = (await connection.execute(statement)).scalar_one()
                if hits == 1:  # a new window: the key's older ones are done with
                    old = (WINDOWS.c.key_id == key_id) & (WINDOWS.c.window_start < window)
                    await connection.execute(delete(WINDOWS).where(old))
        except (SQLAlchemyError, OSError) as exc:
            raise StoreUnavailable("the rate limiter's database is unavailable") from exc
        if hits <= self.limit.requests:
            return None
        return max(1.0, math.ceil(window + self.limit.window_s - now))
