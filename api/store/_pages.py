"""The decision log a page at a time, newest first, for the console's list.

Pages are cut by a keyset, ``(created_at, id)`` of the last row shown, not an offset, so page 1,000
costs what page 1 does: the database walks ``ix_decisions_tenant_created_at_id`` (or the task's,
or the audit sample's partial index) from the cursor, and at most ``SEARCH_WINDOW`` rows of it per
page view, however rarely the other filters match.
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

__all__ = ["SEARCH_WINDOW", "DecisionFilter", "DecisionPage", "decision_page", "decode_cursor", "encode_cursor"]

SEARCH_WINDOW = 20_000
"""Decisions one page view searches at most for matches of the filters no index selects."""


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
    window_ended: bool = False
    """The page stopped at the end of the decisions one page view searches (``window``), not
    because it was full: more matches may lie further back, from ``next_cursor`` on."""


def encode_cursor(decision: StoredDecision) -> str:
    """Where a page after ``decision`` starts."""
    return _cursor(decision.created_at, decision.id)


def _cursor(created_at: datetime, decision_id: str) -> str:
    raw = f"{created_at.isoformat()}|{decision_id}".encode()
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
    window: int = SEARCH_WINDOW,
) -> DecisionPage:
    """One page of ``tenant``'s decisions matching ``where``, newest first, after the cursor ``after``.

    Raises:
        ValueError: ``after`` is not a cursor.
    """
    if after is not None:
        created_at, decision_id = decode_cursor(after)
    # What the indexes select: tenant, task, time range, the audit sample (its partial index, whose
    # predicate is the bare column), and the cursor.
    walk = [DecisionRow.tenant == tenant]
    if where.task is not None:
        walk.append(DecisionRow.task == where.task)
    if where.since is not None:
        walk.append(DecisionRow.created_at >= where.since)
    if where.until is not None:
        walk.append(DecisionRow.created_at < where.until)
    if where.audit is True:
        walk.append(DecisionRow.audit.expression)
    if after is not None:
        # Spelled out rather than a row-value comparison, so the timestamp is bound through the column's type.
        walk.append(
            or_(
                DecisionRow.created_at < created_at,
                and_(DecisionRow.created_at == created_at, DecisionRow.id < decision_id),
            )
        )
    has_outcome = exists().where(OutcomeRow.decision_id == DecisionRow.id)
    rest = []
    if where.system is not None:
        rest.append(DecisionRow.system == where.system)
    if where.reason is not None:
        rest.append(DecisionRow.reason == where.reason)
    if where.verdict is not None:
        rest.append(DecisionRow.verdict == where.verdict)
    if where.has_outcome is not None:
        rest.append(has_outcome if where.has_outcome else ~has_outcome)
    if where.audit is False:
        rest.append(~DecisionRow.audit)
    newest_first = (DecisionRow.created_at.desc(), DecisionRow.id.desc())
    async with sessions() as session:
        edge = None
        if rest:
            # The other filters are searched for within a window: the newest ``window`` decisions
            # the indexes select. Its last row is found first (an index-only walk of ``window``
            # entries); bounded by it, the page's query stops there at the latest, so a filter that
            # matches nothing costs one window, never a walk of the whole log. The page then ends
            # at the window's edge and the next searches on from there.
            edge = (
                await session.execute(
                    select(DecisionRow.created_at, DecisionRow.id)
                    .where(*walk)
                    .order_by(*newest_first)
                    .offset(window - 1)
                    .limit(1)
                )
            ).first()
        query = select(DecisionRow, has_outcome.label("has_outcome")).where(*walk, *rest)
        if edge is not None:
            query = query.where(
                or_(
                    DecisionRow.created_at > edge.created_at,
                    and_(DecisionRow.created_at == edge.created_at, DecisionRow.id >= edge.id),
                )
            )
        rows = (await session.execute(query.order_by(*newest_first).limit(limit + 1))).all()
    decisions = [stored_decision(row, {}) for row, _ in rows[:limit]]
    outcomes = frozenset(row.id for row, has in rows[:limit] if has)
    if len(rows) > limit:
        return DecisionPage(decisions, outcomes, encode_cursor(decisions[-1]))
    if edge is not None:  # the window ended before the page filled: search on from its edge
        return DecisionPage(decisions, outcomes, _cursor(edge.created_at, edge.id), window_ended=True)
    return DecisionPage(decisions, outcomes, None)
