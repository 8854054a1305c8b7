"""Hourly rollups of the decision log, kept in the transaction that writes the decisions.

The console's overview and the metrics read these instead of the log: a page view costs the rows of
the hours it shows, never a scan of millions of decisions. Rows are upserted in key order, so two
writers (replicas) adding to the same hour take its row locks in the same order and cannot deadlock.
Latency is kept as a histogram of log-spaced buckets (each 20 % wider than the last), so a p50 or
p99 read back is exact to within one bucket: within 20 %.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from ._models import LatencyRollupRow, RollupRow

__all__ = ["LATENCY_GROWTH", "add_rollups", "bucket_upper_ms", "hour_of", "is_kept", "latency_bucket", "rollups_of"]

LATENCY_GROWTH = 1.2
"""Each latency bucket's upper edge is this many times the last one's."""
_MIN_BUCKET = -26  # 1.2 ** -26 ≈ 0.009 ms: anything faster is one bucket
_MAX_BUCKET = 90  # 1.2 ** 90 ≈ 13 million ms (3.6 h): anything slower is one bucket

_ROLLUP_KEY = ("tenant", "task", "hour", "engine", "system", "reason", "kept", "policy_version")
_ROLLUP_SUMS = ("decisions", "cost_usd", "costed", "latency_ms")
_LATENCY_KEY = ("tenant", "task", "hour", "engine", "bucket")


def latency_bucket(latency_ms: float) -> int:
    """The histogram bucket of a latency: ``b`` holds ``(1.2 ** b, 1.2 ** (b + 1)]`` ms."""
    if not latency_ms > 0 or not math.isfinite(latency_ms):
        return _MIN_BUCKET if not latency_ms > 0 else _MAX_BUCKET
    b = math.ceil(math.log(latency_ms) / math.log(LATENCY_GROWTH)) - 1
    return max(_MIN_BUCKET, min(_MAX_BUCKET, b))


def bucket_upper_ms(bucket: int) -> float:
    """A bucket's upper edge in ms: what a quantile that falls in it is reported as."""
    return float(LATENCY_GROWTH ** (bucket + 1))


def hour_of(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def is_kept(system: int, escalate: bool, verdict: str | None) -> bool:
    """System 1 answered and nothing was left to anyone else: the kept share's numerator."""
    return system == 1 and not escalate and verdict != "review"


def rollups_of(rows: Iterable[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rollup and latency increments of ``decisions`` rows (as ``decision_row`` makes them), in key order."""
    sums: dict[tuple[Any, ...], dict[str, Any]] = {}
    latency: dict[tuple[Any, ...], int] = {}
    for row in rows:
        hour = hour_of(row["created_at"])
        kept = is_kept(row["system"], row["escalate"], row["verdict"])
        # A review verdict goes to a person, not to System 2: the overview counts it as its own reason.
        reason = "review" if row["verdict"] == "review" else row["reason"]
        key = (row["tenant"], row["task"], hour, row["engine"], row["system"], reason, kept, row["policy_version"])
        into = sums.get(key)
        if into is None:
            into = sums[key] = {**dict(zip(_ROLLUP_KEY, key, strict=True)), **dict.fromkeys(_ROLLUP_SUMS, 0)}
            into["cost_usd"] = 0.0
            into["latency_ms"] = 0.0
        into["decisions"] += 1
        if row["cost_usd"] is not None:
            into["cost_usd"] += row["cost_usd"]
            into["costed"] += 1
        into["latency_ms"] += row["latency_ms"]
        lkey = (row["tenant"], row["task"], hour, row["engine"], latency_bucket(row["latency_ms"]))
        latency[lkey] = latency.get(lkey, 0) + 1
    rollups = [sums[k] for k in sorted(sums, key=_sortable)]
    buckets = [
        {**dict(zip(_LATENCY_KEY, k, strict=True)), "decisions": n}
        for k, n in sorted(latency.items(), key=lambda item: _sortable(item[0]))
    ]
    return rollups, buckets


def _sortable(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(str(part) for part in key)


def _upsert(dialect: str, table: Table, keys: tuple[str, ...], sums: tuple[str, ...]) -> Any:
    # Both dialects spell the same ON CONFLICT ... DO UPDATE; SQLAlchemy has one class per dialect.
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(table)
    return statement.on_conflict_do_update(
        index_elements=list(keys), set_={name: table.c[name] + statement.excluded[name] for name in sums}
    )


async def add_rollups(connection: AsyncConnection | AsyncSession, rows: list[dict[str, Any]]) -> None:
    """Add ``decisions`` rows to their hours' rollups, inside the caller's transaction."""
    if not rows:
        return
    rollups, buckets = rollups_of(rows)
    dialect = connection.get_bind().dialect.name if isinstance(connection, AsyncSession) else connection.dialect.name
    rollup_table: Table = RollupRow.__table__  # type: ignore[assignment]
    latency_table: Table = LatencyRollupRow.__table__  # type: ignore[assignment]
    await connection.execute(_upsert(dialect, rollup_table, _ROLLUP_KEY, _ROLLUP_SUMS), rollups)
    await connection.execute(_upsert(dialect, latency_table, _LATENCY_KEY, ("decisions",)), buckets)
