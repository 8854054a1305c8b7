"""Deleting old decisions: the decision log's retention (``fastslow db prune``, docs/store.md).

A decision goes together with the rows that belong only to it, its ``answers``, ``outcomes`` and
``reviews`` (with their webhook events); the hourly rollups, which hold counts only, stay.
Idempotency keys go once they expire (``store.idempotency_ttl_s``), whatever the decisions' cut.
Learned examples are not the log's to delete: one that was learned from a pruned decision stays,
with its ``decision_id`` cleared (the foreign key's ``SET NULL``, done here explicitly). API keys
are never touched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from fastslow.router.settings import StoreSettings

from ._idempotency import prune_expired_keys
from ._models import AnswerRow, DecisionRow, LearnedExampleRow, OutcomeRow, ReviewEventRow, ReviewRow

__all__ = [
    "DEFAULT_PRUNE_BATCH",
    "MAX_PRUNE_BATCH",
    "Cutoff",
    "PruneCounts",
    "PruneReport",
    "as_cutoff",
    "prune",
    "retention_cutoff",
]

DEFAULT_PRUNE_BATCH = 500
"""Decisions deleted per transaction: each batch is one short transaction, never the whole cut."""

MAX_PRUNE_BATCH = 5_000
"""Most ids in one batch's ``IN (...)`` lists, well under SQLite's limit on bound parameters."""

REVIEW_EVENT_TTL = timedelta(days=7)
"""A webhook event is kept this long: far past its last retry, and long enough to look into a failed one."""

Cutoff = Callable[[str], datetime | None]
"""A tenant's cut: its decisions made before it go; ``None`` keeps all of them."""


@dataclass(slots=True, kw_only=True)
class PruneCounts:
    """Rows one tenant lost (or, in a dry run, would lose), per table."""

    decisions: int = 0
    answers: int = 0
    outcomes: int = 0
    learned_unlinked: int = 0
    """Learned examples kept but no longer linked to their (deleted) decision."""

    def add(self, other: PruneCounts) -> None:
        self.decisions += other.decisions
        self.answers += other.answers
        self.outcomes += other.outcomes
        self.learned_unlinked += other.learned_unlinked


@dataclass(slots=True, kw_only=True)
class PruneReport:
    """What ``DecisionStore.prune`` did, per tenant that had decisions to consider."""

    dry_run: bool
    cutoffs: dict[str, datetime | None] = field(default_factory=dict)
    """Each tenant's cut; ``None`` where its retention keeps everything."""
    tenants: dict[str, PruneCounts] = field(default_factory=dict)
    expired_keys: int = 0
    """Idempotency keys deleted (or, in a dry run, that would be) because they had expired."""
    old_review_events: int = 0
    """Review webhook events older than ``REVIEW_EVENT_TTL`` deleted (or that would be)."""

    @property
    def total(self) -> PruneCounts:
        total = PruneCounts()
        for counts in self.tenants.values():
            total.add(counts)
        return total


def retention_cutoff(settings: StoreSettings, now: datetime) -> Cutoff:
    """Each tenant's cut from ``retention_days`` and ``tenant_retention_days`` (0 or unset: keep forever)."""

    def cutoff(tenant: str) -> datetime | None:
        days = settings.tenant_retention_days.get(tenant, settings.retention_days)
        return None if not days else now - timedelta(days=days)

    return cutoff


def _rowcount(result: Any) -> int:
    # DML results are CursorResults; the session's signature only promises a Result.
    return int(cast(CursorResult[Any], result).rowcount)


async def _count(session: AsyncSession, tenant: str, cut: datetime) -> PruneCounts:
    old = select(DecisionRow.id).where(DecisionRow.tenant == tenant, DecisionRow.created_at < cut)
    decisions = await session.scalar(select(func.count()).select_from(old.subquery()))
    answers = await session.scalar(select(func.count()).where(AnswerRow.decision_id.in_(old)))
    outcomes = await session.scalar(select(func.count()).where(OutcomeRow.decision_id.in_(old)))
    learned = await session.scalar(select(func.count()).where(LearnedExampleRow.decision_id.in_(old)))
    return PruneCounts(
        decisions=int(decisions or 0),
        answers=int(answers or 0),
        outcomes=int(outcomes or 0),
        learned_unlinked=int(learned or 0),
    )


async def _delete_batch(
    sessions: async_sessionmaker[AsyncSession], tenant: str, cut: datetime, batch: int
) -> PruneCounts:
    async with sessions() as session:
        ids = list(
            await session.scalars(
                select(DecisionRow.id)
                .where(DecisionRow.tenant == tenant, DecisionRow.created_at < cut)
                .order_by(DecisionRow.created_at, DecisionRow.id)
                .limit(batch)
            )
        )
    if not ids:
        return PruneCounts()
    # The ids were read in a transaction of their own: this one writes first, so on SQLite it
    # waits for the write lock (busy_timeout) instead of failing as a read-then-write one can.
    async with sessions.begin() as session:
        learned = await session.execute(
            update(LearnedExampleRow).where(LearnedExampleRow.decision_id.in_(ids)).values(decision_id=None)
        )
        answers = await session.execute(delete(AnswerRow).where(AnswerRow.decision_id.in_(ids)))
        outcomes = await session.execute(delete(OutcomeRow).where(OutcomeRow.decision_id.in_(ids)))
        # A review holds the checked text or arguments: it goes with its decision (and its events).
        # The hourly rollups stay: they hold counts, not what was decided about.
        reviews = select(ReviewRow.id).where(ReviewRow.decision_id.in_(ids))
        await session.execute(delete(ReviewEventRow).where(ReviewEventRow.review_id.in_(reviews)))
        await session.execute(delete(ReviewRow).where(ReviewRow.decision_id.in_(ids)))
        decisions = await session.execute(delete(DecisionRow).where(DecisionRow.id.in_(ids)))
    return PruneCounts(
        decisions=_rowcount(decisions),
        answers=_rowcount(answers),
        outcomes=_rowcount(outcomes),
        learned_unlinked=_rowcount(learned),
    )


async def prune(
    sessions: async_sessionmaker[AsyncSession],
    cutoff: Cutoff,
    *,
    tenant: str | None,
    dry_run: bool,
    batch: int,
    on_batch: Callable[[str, PruneCounts], None] | None,
    now: datetime,
) -> PruneReport:
    """``DecisionStore.prune``'s work, tenant by tenant and batch by batch."""
    if not 1 <= batch <= MAX_PRUNE_BATCH:
        raise ValueError(f"batch must be between 1 and {MAX_PRUNE_BATCH}")
    if tenant is not None:
        tenants = [tenant]
    else:
        async with sessions() as session:
            tenants = list(await session.scalars(select(DecisionRow.tenant).distinct().order_by(DecisionRow.tenant)))
    report = PruneReport(dry_run=dry_run)
    for name in tenants:
        cut = cutoff(name)
        report.cutoffs[name] = cut
        counts = report.tenants.setdefault(name, PruneCounts())
        if cut is None:
            continue
        if dry_run:
            async with sessions() as session:
                counts.add(await _count(session, name, cut))
            continue
        while True:
            done = await _delete_batch(sessions, name, cut, batch)
            if not done.decisions:
                break
            counts.add(done)
            if on_batch is not None:
                on_batch(name, done)
    report.expired_keys = await prune_expired_keys(sessions, now, tenant=tenant, dry_run=dry_run, batch=batch)
    report.old_review_events = await _prune_review_events(
        sessions, now - REVIEW_EVENT_TTL, tenant=tenant, dry_run=dry_run
    )
    return report


async def _prune_review_events(
    sessions: async_sessionmaker[AsyncSession], before: datetime, *, tenant: str | None, dry_run: bool
) -> int:
    """Delete (or count) webhook events made before ``before``: sent, given up on, or of a tenant with no webhook."""
    old = ReviewEventRow.created_at < before
    if tenant is not None:
        old = old & (ReviewEventRow.tenant == tenant)
    if dry_run:
        async with sessions() as session:
            return int(await session.scalar(select(func.count()).where(old)) or 0)
    async with sessions.begin() as session:
        return _rowcount(await session.execute(delete(ReviewEventRow).where(old)))


def as_cutoff(cut: datetime | Cutoff) -> Cutoff:
    """One time for every tenant (``--before``), or a cut per tenant as it is."""
    if isinstance(cut, datetime):
        return lambda _tenant: cut
    return cut
