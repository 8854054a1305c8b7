"""The review outbox (``review_events``): the webhook events waiting to be sent, claimed one replica at a time.

Every opening, settlement and expiry of a review writes its event in the same transaction
(``_reviews``); ``fastslow serve`` sends them (``fastslow.api._reviews``). Any replica may:

    for event in await due_events(sessions, tenants=..., now=now, max_attempts=8):
        if await claim_event(sessions, event, now=now, lease_until=now + lease):
            ...send it...
            await delivered(sessions, event.id, now=...)   # or failed(..., retry_at=...)

A claim is one conditional ``UPDATE``: it counts the attempt and moves ``next_attempt_at`` to the
end of a lease, where the row's attempt count is still the one read. Of two replicas claiming the
same event one wins; a replica that dies mid-send leaves the event to be sent again when the lease
ends. So delivery is at least once: a receiver deduplicates on the event id.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ._codec import clean
from ._models import ReviewEventRow

__all__ = ["OutboxEvent", "claim_event", "delivered", "due_events", "failed"]

MAX_ERROR_CHARS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxEvent:
    """One event due to be sent."""

    id: str
    tenant: str
    review_id: str
    event: str
    """``review.opened``, ``review.settled`` or ``review.expired``."""
    body: str
    """The JSON the webhook receives, exactly as signed."""
    attempts: int
    """Tries made before this one."""


async def due_events(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenants: Collection[str],
    now: datetime,
    max_attempts: int,
    limit: int = 100,
) -> list[OutboxEvent]:
    """Undelivered events of ``tenants`` whose next attempt is due and that have tries left, oldest first."""
    if not tenants:
        return []
    query = (
        select(ReviewEventRow)
        .where(
            ReviewEventRow.tenant.in_(sorted(tenants)),
            ReviewEventRow.delivered_at.is_(None),
            ReviewEventRow.next_attempt_at <= now,
            ReviewEventRow.attempts < max_attempts,
        )
        .order_by(ReviewEventRow.next_attempt_at, ReviewEventRow.created_at, ReviewEventRow.id)
        .limit(limit)
    )
    async with sessions() as session:
        rows = (await session.scalars(query)).all()
    return [
        OutboxEvent(
            id=row.id, tenant=row.tenant, review_id=row.review_id, event=row.event, body=row.body, attempts=row.attempts
        )
        for row in rows
    ]


async def claim_event(
    sessions: async_sessionmaker[AsyncSession], event: OutboxEvent, *, now: datetime, lease_until: datetime
) -> bool:
    """Take ``event`` for one attempt, until ``lease_until``; ``False`` when another replica took it first."""
    async with sessions.begin() as session:
        result = cast(
            CursorResult[Any],
            await session.execute(
                update(ReviewEventRow)
                .where(
                    ReviewEventRow.id == event.id,
                    ReviewEventRow.attempts == event.attempts,
                    ReviewEventRow.delivered_at.is_(None),
                    ReviewEventRow.next_attempt_at <= now,
                )
                .values(attempts=ReviewEventRow.attempts + 1, next_attempt_at=lease_until)
            ),
        )
    return result.rowcount == 1


async def delivered(sessions: async_sessionmaker[AsyncSession], event_id: str, *, now: datetime) -> None:
    """Mark an event sent: its receiver answered 2xx."""
    async with sessions.begin() as session:
        await session.execute(
            update(ReviewEventRow).where(ReviewEventRow.id == event_id).values(delivered_at=now, last_error=None)
        )


async def failed(
    sessions: async_sessionmaker[AsyncSession], event_id: str, *, error: str, retry_at: datetime | None
) -> None:
    """Record a failed attempt; try again at ``retry_at``, or never (``None``: its tries are spent)."""
    values: dict[str, Any] = {"last_error": clean(error[:MAX_ERROR_CHARS])}
    if retry_at is not None:
        values["next_attempt_at"] = retry_at
    async with sessions.begin() as session:
        await session.execute(
            update(ReviewEventRow)
            .where(ReviewEventRow.id == event_id, ReviewEventRow.delivered_at.is_(None))
            .values(**values)
        )
