"""Reading the decision log back: one decision, a task's decisions, decisions with their outcomes.

Each decision comes back with its distribution, read from ``answers`` in chunks of ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ._codec import stored_decision, stored_outcome
from ._models import AnswerRow, DecisionRow, OutcomeRow
from ._values import StoredDecision, StoredOutcome

__all__ = ["decision", "kept_counts", "task_decisions", "with_outcomes"]

_IN_CHUNK = 500
"""Ids per ``IN (...)`` list, well under SQLite's limit on bound parameters."""


async def _answers(session: AsyncSession, ids: Sequence[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for start in range(0, len(ids), _IN_CHUNK):
        chunk = ids[start : start + _IN_CHUNK]
        result = await session.execute(
            select(AnswerRow.decision_id, AnswerRow.option, AnswerRow.probability).where(
                AnswerRow.decision_id.in_(chunk)
            )
        )
        for decision_id, option, probability in result:
            out.setdefault(decision_id, {})[option] = probability
    return out


async def decision(
    sessions: async_sessionmaker[AsyncSession], decision_id: str, *, tenant: str
) -> StoredDecision | None:
    """``tenant``'s decision with this id, or ``None``."""
    async with sessions() as session:
        row = await session.scalar(
            select(DecisionRow).where(DecisionRow.id == decision_id, DecisionRow.tenant == tenant)
        )
        if row is None:
            return None
        answers = await _answers(session, [row.id])
    return stored_decision(row, answers.get(row.id, {}))


async def with_outcomes(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenant: str | None,
    task: str | None,
    since: datetime | None,
    limit: int,
) -> list[tuple[StoredDecision, StoredOutcome]]:
    """Decisions with their recorded outcomes, newest outcome first (``DecisionStore.outcomes``)."""
    # Driven from the outcomes (their tenant and task are copies of the decision's), newest first by
    # ix_outcomes_tenant_task_created_at: the cost follows the outcomes read, not the decisions logged.
    query = select(DecisionRow, OutcomeRow).join(DecisionRow, OutcomeRow.decision_id == DecisionRow.id)
    if tenant is not None:
        query = query.where(OutcomeRow.tenant == tenant)
    if task is not None:
        query = query.where(OutcomeRow.task == task)
    if since is not None:
        query = query.where(DecisionRow.created_at >= since)
    query = query.order_by(OutcomeRow.created_at.desc(), OutcomeRow.id).limit(limit)
    async with sessions() as session:
        pairs = [(d, o) for d, o in (await session.execute(query)).all()]
        answers = await _answers(session, sorted({d.id for d, _ in pairs}))
    return [(stored_decision(d, answers.get(d.id, {})), stored_outcome(o)) for d, o in pairs]


async def task_decisions(
    sessions: async_sessionmaker[AsyncSession],
    *,
    task: str,
    tenant: str | None,
    since: datetime | None,
    reason: str | None,
    limit: int,
) -> list[StoredDecision]:
    """A task's decisions, newest first (``DecisionStore.decisions``)."""
    query = select(DecisionRow).where(DecisionRow.task == task)
    if tenant is not None:
        query = query.where(DecisionRow.tenant == tenant)
    if since is not None:
        query = query.where(DecisionRow.created_at >= since)
    if reason is not None:
        query = query.where(DecisionRow.reason == reason)
    query = query.order_by(DecisionRow.created_at.desc(), DecisionRow.id).limit(limit)
    async with sessions() as session:
        rows = list((await session.scalars(query)).all())
        answers = await _answers(session, [r.id for r in rows])
    return [stored_decision(r, answers.get(r.id, {})) for r in rows]


async def kept_counts(
    sessions: async_sessionmaker[AsyncSession], *, task: str, tenant: str | None, since: datetime | None
) -> tuple[int, int]:
    """(decisions, of which System 1 kept) for ``task`` (``DecisionStore.kept_counts``)."""
    kept = (DecisionRow.system == 1) & ~DecisionRow.escalate & (func.coalesce(DecisionRow.verdict, "") != "review")
    query = select(func.count(), func.count().filter(kept)).where(DecisionRow.task == task)
    if tenant is not None:
        query = query.where(DecisionRow.tenant == tenant)
    if since is not None:
        query = query.where(DecisionRow.created_at >= since)
    async with sessions() as session:
        total, kept_n = (await session.execute(query)).one()
    return int(total), int(kept_n)
