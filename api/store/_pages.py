"""The decision log a page at a time, newest first, for the console's list.

Pages are cut by a keyset, ``(created_at, id)`` of the last row shown, not an offset, so page 1,000
costs what page 1 does: the database walks ``ix_decisions_tenant_created_at_id`` (or the task's
index) from the cursor and stops after one page of matches.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import and_, exists, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ._codec import stored_decision
from ._models import DecisionRow, OutcomeRow
from ._values import StoredDecision

__all__ = ["DecisionFilter", "DecisionPage", "decision_page", "decode_cursor", "encode_cursor"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionFilter:
    """Which decisions a page shows; ``None`` leaves a field open."""

    task: str | None = None
    system: int | None = None
    reason: str | None = None
    verdict: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    has_outcome: bool | None = None
    audit: bool | None = None


@dataclass(frozen=True, slots=True)
class DecisionPage:
    decisions: list[StoredDecision]
    """Without their distributions: a list shows none."""
    with_outcome: frozenset[str]
    """Ids of the decisions on the page that have an outcome recorded."""
    next_cursor: str | None
    """Where the next page starts; ``None`` on the last page."""


def encode_cursor(decision: StoredDecision) -> str:
    raw = f"{decision.created_at.isoformat()}|{decision.id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The ``(created_at, id)`` a cursor holds.

    Raises:
        ValueError: not a cursor ``encode_cursor`` made.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        moment, _, decision_id = raw.partition("|")
        created_at = datetime.fromisoformat(moment)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise ValueError("not a page cursor") from exc
    if created_at.tzinfo is None or not decision_id:
        raise ValueError("not a page cursor")
    return created_at.astimezone(UTC), decision_id


async def decision_page(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenant: str,
    where: DecisionFilter,
    after: str | None,
    limit: int,
) -> DecisionPage:
    """One page of ``tenant``'s decisions matching ``where``, newest first, after the cursor ``after``.

    Raises:
        ValueError: ``after`` is not a cursor.
    """
    has_outcome = exists().where(OutcomeRow.decision_id == DecisionRow.id)
    query = select(DecisionRow, has_outcome.label("has_outcome")).where(DecisionRow.tenant == tenant)
    if where.task is not None:
        query = query.where(DecisionRow.task == where.task)
    if where.system is not None:
        query = query.where(DecisionRow.system == where.system)
    if where.reason is not None:
        query = query.where(DecisionRow.reason == where.reason)
    if where.verdict is not None:
        query = query.where(DecisionRow.verdict == where.verdict)
    if where.since is not None:
        query = query.where(DecisionRow.created_at >= where.since)
    if where.until is not None:
        query = query.where(DecisionRow.created_at < where.until)
    if where.has_outcome is not None:
        query = query.where(has_outcome if where.has_outcome else ~has_outcome)
    if where.audit is not None:
        query = query.where(DecisionRow.audit.is_(where.audit))
    if after is not None:
        created_at, decision_id = decode_cursor(after)
        # Spelled out rather than a row-value comparison, so the timestamp is bound through the column's type.
        query = query.where(
            or_(
                DecisionRow.created_at < created_at,
                and_(DecisionRow.created_at == created_at, DecisionRow.id < decision_id),
            )
        )
    query = query.order_by(DecisionRow.created_at.desc(), DecisionRow.id.desc()).limit(limit + 1)
    async with sessions() as session:
        rows = (await session.execute(query)).all()
    decisions = [stored_decision(row, {}) for row, _ in rows[:limit]]
    outcomes = frozenset(row.id for row, has in rows[:limit] if has)
    more = len(rows) > limit
    return DecisionPage(decisions, outcomes, encode_cursor(decisions[-1]) if more and decisions else None)
