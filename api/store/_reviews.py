"""The review queue: ``review`` verdicts waiting for a person, settled over the API or the console.

A review is opened in the transaction that records its decision (``review_rows`` as extra rows of
``DecisionStore.record_unit``) or, for a graph paused at its gate, on its own (``open_review``).
Settling is one conditional ``UPDATE ... WHERE status = 'pending'``: of two replicas settling the
same review at once, one wins and the other reads the winner's settlement back. Every opening and
settlement also writes an event to ``review_events``, the webhook outbox, in the same transaction.
A review past ``expires_at`` is settled by its expiry with the configured verdict, never by another
model call.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast

from sqlalchemy import Table, insert, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from fastslow.router import Verdict

from ._codec import clean
from ._models import ReviewEventRow, ReviewRow
from ._values import Review, ReviewStatus

__all__ = [
    "ReviewDraft",
    "Settled",
    "expire_due",
    "get_review",
    "list_reviews",
    "open_review",
    "review_event_body",
    "review_rows",
    "settle_review",
]

_STATUS_OF: dict[str, ReviewStatus] = {"allow": "allowed", "deny": "denied"}


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewDraft:
    """What a review is opened with; the store adds the id, status and times."""

    tenant: str
    decision_id: str
    source: Literal["api", "graph", "agent"]
    task: str
    rule: str
    subject: Mapping[str, Any]
    probabilities: Mapping[str, float]
    probability: float
    policy_version: str
    thread_id: str | None = None
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """What settling asked for got: the review, and whether it was this request that settled it."""

    review: Review
    now_settled: bool
    """``False``: it was settled before (or expired); ``review`` is that first settlement."""


def _json(value: Any) -> str:
    return clean(json.dumps(value, ensure_ascii=False, sort_keys=True, default=str))


def _review(row: ReviewRow) -> Review:
    return Review(
        id=row.id,
        tenant=row.tenant,
        decision_id=row.decision_id,
        source=row.source,
        thread_id=row.thread_id,
        tool_call_id=row.tool_call_id,
        task=row.task,
        rule=row.rule,
        subject=json.loads(row.subject),
        probabilities=json.loads(row.probabilities),
        probability=row.probability,
        uncertainty=row.uncertainty,
        policy_version=row.policy_version,
        status=cast(ReviewStatus, row.status),
        verdict=cast(Verdict | None, row.verdict),
        note=row.note,
        settled_by=row.settled_by,
        settled_at=row.settled_at,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


def review_event_body(review: Review, event: str) -> dict[str, Any]:
    """What a webhook receives for ``event``: the review's state, without the checked text or arguments.

    The subject stays out on purpose: a receiver learns that a review waits and fetches it with a
    key (``GET /v1/reviews/{id}``), so no tool argument leaves through a webhook.
    """
    return {
        "event": event,
        "review": {
            "id": review.id,
            "status": review.status,
            "verdict": review.verdict,
            "task": review.task,
            "rule": review.rule,
            "probability": review.probability,
            "policy_version": review.policy_version,
            "decision_id": review.decision_id,
            "source": review.source,
            "thread_id": review.thread_id,
            "tool_call_id": review.tool_call_id,
            "created_at": review.created_at.isoformat(),
            "expires_at": review.expires_at.isoformat(),
            "settled_at": None if review.settled_at is None else review.settled_at.isoformat(),
            "settled_by": review.settled_by,
        },
    }


def _event_row(review: Review, event: str, now: datetime) -> dict[str, Any]:
    return {
        "id": uuid.uuid4().hex,
        "tenant": review.tenant,
        "review_id": review.id,
        "event": event,
        "body": _json(review_event_body(review, event)),
        "created_at": now,
        "next_attempt_at": now,
        "attempts": 0,
        "delivered_at": None,
        "last_error": None,
    }


def review_rows(
    draft: ReviewDraft, *, now: datetime, expires_at: datetime
) -> tuple[Review, list[tuple[Table, dict[str, Any]]]]:
    """The review a draft opens, and its rows (the review and its ``review.opened`` event) to insert."""
    p = float(draft.probability)
    row: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "tenant": clean(draft.tenant),
        "decision_id": draft.decision_id,
        "source": draft.source,
        "thread_id": None if draft.thread_id is None else clean(draft.thread_id),
        "tool_call_id": None if draft.tool_call_id is None else clean(draft.tool_call_id),
        "task": clean(draft.task),
        "rule": clean(draft.rule),
        "subject": _json(dict(draft.subject)),
        "probabilities": _json({k: float(v) for k, v in draft.probabilities.items()}),
        "probability": p,
        "uncertainty": 1.0 - abs(2.0 * p - 1.0),
        "policy_version": clean(draft.policy_version),
        "status": "pending",
        "verdict": None,
        "note": None,
        "settled_by": None,
        "settled_at": None,
        "created_at": now,
        "expires_at": expires_at,
    }
    review = _review(ReviewRow(**row))
    review_table: Table = ReviewRow.__table__  # type: ignore[assignment]
    event_table: Table = ReviewEventRow.__table__  # type: ignore[assignment]
    return review, [(review_table, row), (event_table, _event_row(review, "review.opened", now))]


async def open_review(
    sessions: async_sessionmaker[AsyncSession], draft: ReviewDraft, *, now: datetime, expires_at: datetime
) -> Review:
    """Open a review on its own (a graph's gate); committed when this returns."""
    review, rows = review_rows(draft, now=now, expires_at=expires_at)
    async with sessions.begin() as session:
        for table, row in rows:
            await session.execute(insert(table), [row])
    return review


async def get_review(sessions: async_sessionmaker[AsyncSession], review_id: str, *, tenant: str) -> Review | None:
    """``tenant``'s review with this id, or ``None``."""
    async with sessions() as session:
        row = await session.scalar(select(ReviewRow).where(ReviewRow.id == review_id, ReviewRow.tenant == tenant))
    return None if row is None else _review(row)


async def list_reviews(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenant: str,
    status: ReviewStatus | None,
    limit: int,
    offset: int = 0,
) -> list[Review]:
    """A tenant's reviews: pending ones most uncertain first, settled ones last settled first."""
    query = select(ReviewRow).where(ReviewRow.tenant == tenant)
    if status is not None:
        query = query.where(ReviewRow.status == status)
    if status == "pending":
        query = query.order_by(ReviewRow.uncertainty.desc(), ReviewRow.created_at, ReviewRow.id)
    else:
        query = query.order_by(ReviewRow.created_at.desc(), ReviewRow.id)
    async with sessions() as session:
        rows = (await session.scalars(query.limit(limit).offset(offset))).all()
    return [_review(row) for row in rows]


async def settle_review(
    sessions: async_sessionmaker[AsyncSession],
    review_id: str,
    *,
    tenant: str,
    verdict: Verdict,
    note: str | None,
    by: str,
    now: datetime,
) -> Settled | None:
    """Settle a pending review with ``verdict`` (``allow`` or ``deny``); ``None`` when ``tenant`` has none.

    A review already settled (or expired) is left as it is and comes back with ``now_settled=False``.
    """
    if verdict not in _STATUS_OF:
        raise ValueError("a review is settled with allow or deny")
    async with sessions.begin() as session:
        # The write comes first: on SQLite a transaction that reads before it writes can fail
        # outright when another writer committed in between.
        result = cast(
            CursorResult[Any],
            await session.execute(
                update(ReviewRow)
                .where(ReviewRow.id == review_id, ReviewRow.tenant == tenant, ReviewRow.status == "pending")
                .values(
                    status=_STATUS_OF[verdict],
                    verdict=verdict,
                    note=None if note is None else clean(note),
                    settled_by=by,
                    settled_at=now,
                )
            ),
        )
        row = await session.scalar(select(ReviewRow).where(ReviewRow.id == review_id, ReviewRow.tenant == tenant))
        if row is None:
            return None
        review = _review(row)
        if result.rowcount == 1:
            await session.execute(insert(ReviewEventRow), [_event_row(review, "review.settled", now)])
    return Settled(review, result.rowcount == 1)


async def expire_due(
    sessions: async_sessionmaker[AsyncSession], *, now: datetime, verdict: Verdict, tenant: str | None = None
) -> int:
    """Settle every pending review past its expiry with ``verdict``, recorded as ``expired``; how many."""
    due = [ReviewRow.status == "pending", ReviewRow.expires_at <= now]
    if tenant is not None:
        due.append(ReviewRow.tenant == tenant)
    async with sessions.begin() as session:
        ids = list(
            (
                await session.scalars(
                    update(ReviewRow)
                    .where(*due)
                    .values(status="expired", verdict=verdict, settled_by="expiry", settled_at=now)
                    .returning(ReviewRow.id)
                )
            ).all()
        )
        if ids:
            rows = (await session.scalars(select(ReviewRow).where(ReviewRow.id.in_(ids)))).all()
            await session.execute(insert(ReviewEventRow), [_event_row(_review(r), "review.expired", now) for r in rows])
    return len(ids)
