"""What the decision log says about a tenant's tasks over a time range, from the hourly rollups.

``log_summary`` is the one place these figures are counted: the console's overview shows them and
the metrics and reports that follow read them, rather than each counting the log its own way. It
reads ``decision_rollups`` and ``latency_rollups`` (kept as decisions are written, ``_rollup``) and
the learned examples' index, never the decisions themselves, so its cost follows the hours shown,
not the size of the log. ``tenant=None`` sums every tenant's: the metrics ``fastslow serve`` exports
carry no tenant.

The saving is the tuning loop's definition of cost saved (``fastslow tune``'s
``cost_saved_per_1000_usd``): each decision System 1 kept is a System-2 call not made, priced at
what the log's System-2 calls cost on average over the same range.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ._models import LatencyRollupRow, LearnedExampleRow, RollupRow
from ._rollup import bucket_upper_ms

__all__ = ["HourFigures", "LatencyFigures", "LogSummary", "PolicyVersionSeen", "log_summary", "summary_tasks"]


@dataclass(frozen=True, slots=True)
class HourFigures:
    hour: datetime
    decisions: int
    kept: int

    @property
    def kept_share(self) -> float | None:
        return self.kept / self.decisions if self.decisions else None


@dataclass(frozen=True, slots=True)
class LatencyFigures:
    """One engine's latency, from the histogram: each quantile is its bucket's upper edge (within 20 %)."""

    engine: str
    decisions: int
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True, slots=True)
class PolicyVersionSeen:
    version: str
    first_hour: datetime
    last_hour: datetime
    decisions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LogSummary:
    """A tenant's decisions (every tenant's when ``tenant`` is ``None``) over ``[since, until)``, one task or all."""

    tenant: str | None
    task: str | None
    since: datetime
    until: datetime
    decisions: int = 0
    kept: int = 0
    hours: list[HourFigures] = field(default_factory=list)
    """Decisions and kept per hour with any decision, oldest first."""
    escalations: dict[str, int] = field(default_factory=dict)
    """Decisions System 1 did not keep, by reason, most first."""
    system2_calls: int = 0
    system2_cost_usd: float = 0.0
    """What the System-2 calls that recorded a cost cost, together."""
    system2_costed: int = 0
    latency: list[LatencyFigures] = field(default_factory=list)
    policy_versions: list[PolicyVersionSeen] = field(default_factory=list)
    """Each policy version decisions were made under, by when it was first seen."""
    learned_added: int = 0
    learned_withdrawn: int = 0

    @property
    def kept_share(self) -> float | None:
        return self.kept / self.decisions if self.decisions else None

    @property
    def system2_cost_per_call(self) -> float | None:
        """Mean cost of a System-2 call that recorded one; ``None`` when none did (no prices set)."""
        return self.system2_cost_usd / self.system2_costed if self.system2_costed else None

    @property
    def saved_usd(self) -> float | None:
        """Kept decisions times a System-2 call's mean cost: what sending everything to System 2 would have added."""
        per_call = self.system2_cost_per_call
        return None if per_call is None else self.kept * per_call

    @property
    def policy_version(self) -> str | None:
        """The version of the newest decisions."""
        return self.policy_versions[-1].version if self.policy_versions else None


def _quantile(buckets: list[tuple[int, int]], q: float) -> float:
    total = sum(n for _, n in buckets)
    target = q * total
    seen = 0
    for bucket, n in buckets:
        seen += n
        if seen >= target:
            return bucket_upper_ms(bucket)
    return bucket_upper_ms(buckets[-1][0])


async def log_summary(
    sessions: async_sessionmaker[AsyncSession],
    *,
    tenant: str | None,
    task: str | None,
    since: datetime,
    until: datetime,
) -> LogSummary:
    """The figures of ``tenant``'s decisions (every tenant's when ``None``; ``task``'s, or every task's)
    made in ``[since, until)``.

    Hours are whole: a range that starts or ends inside an hour counts that hour whole.
    """
    since_hour = since.replace(minute=0, second=0, microsecond=0)
    where = [RollupRow.hour >= since_hour, RollupRow.hour < until]
    lwhere = [LatencyRollupRow.hour >= since_hour, LatencyRollupRow.hour < until]
    learned: list[ColumnElement[bool]] = []
    if tenant is not None:
        where.append(RollupRow.tenant == tenant)
        lwhere.append(LatencyRollupRow.tenant == tenant)
        learned.append(LearnedExampleRow.tenant == tenant)
    if task is not None:
        where.append(RollupRow.task == task)
        lwhere.append(LatencyRollupRow.task == task)
    n = func.sum(RollupRow.decisions)
    kept_n = func.sum(RollupRow.decisions).filter(RollupRow.kept)
    async with sessions() as session:
        hours = [
            HourFigures(hour, int(d), int(k or 0))
            for hour, d, k in await session.execute(
                select(RollupRow.hour, n, kept_n).where(*where).group_by(RollupRow.hour).order_by(RollupRow.hour)
            )
        ]
        escalations = {
            reason: int(c)
            for reason, c in await session.execute(
                select(RollupRow.reason, n).where(*where, ~RollupRow.kept).group_by(RollupRow.reason).order_by(n.desc())
            )
        }
        calls, cost, costed = (
            await session.execute(
                select(n, func.sum(RollupRow.cost_usd), func.sum(RollupRow.costed)).where(*where, RollupRow.system == 2)
            )
        ).one()
        versions = [
            PolicyVersionSeen(v, first, last, int(c))
            for v, first, last, c in await session.execute(
                select(RollupRow.policy_version, func.min(RollupRow.hour), func.max(RollupRow.hour), n)
                .where(*where)
                .group_by(RollupRow.policy_version)
                .order_by(func.min(RollupRow.hour), func.max(RollupRow.hour))
            )
        ]
        histogram: dict[str, list[tuple[int, int]]] = {}
        for engine, bucket, c in await session.execute(
            select(LatencyRollupRow.engine, LatencyRollupRow.bucket, func.sum(LatencyRollupRow.decisions))
            .where(*lwhere)
            .group_by(LatencyRollupRow.engine, LatencyRollupRow.bucket)
            .order_by(LatencyRollupRow.engine, LatencyRollupRow.bucket)
        ):
            histogram.setdefault(engine, []).append((int(bucket), int(c)))
        if task is not None:
            learned.append(LearnedExampleRow.task == task)
        added = await session.scalar(
            select(func.count()).where(
                *learned, LearnedExampleRow.created_at >= since, LearnedExampleRow.created_at < until
            )
        )
        withdrawn = await session.scalar(
            select(func.count()).where(
                and_(*learned, LearnedExampleRow.retracted_at >= since, LearnedExampleRow.retracted_at < until)
            )
        )
    latency = [
        LatencyFigures(engine, sum(c for _, c in b), _quantile(b, 0.5), _quantile(b, 0.99))
        for engine, b in histogram.items()
    ]
    return LogSummary(
        tenant=tenant,
        task=task,
        since=since,
        until=until,
        decisions=sum(h.decisions for h in hours),
        kept=sum(h.kept for h in hours),
        hours=hours,
        escalations=escalations,
        system2_calls=int(calls or 0),
        system2_cost_usd=float(cost or 0.0),
        system2_costed=int(costed or 0),
        latency=latency,
        policy_versions=versions,
        learned_added=int(added or 0),
        learned_withdrawn=int(withdrawn or 0),
    )


async def summary_tasks(
    sessions: async_sessionmaker[AsyncSession], *, tenant: str | None, since: datetime | None = None
) -> list[str]:
    """The tasks ``tenant`` (every tenant when ``None``) has decisions for (from the rollups), by name;
    with ``since``, only those with decisions in its hour or later."""
    where: list[ColumnElement[bool]] = [] if tenant is None else [RollupRow.tenant == tenant]
    if since is not None:
        where.append(RollupRow.hour >= since.replace(minute=0, second=0, microsecond=0))
    async with sessions() as session:
        return list(
            (
                await session.scalars(
                    select(RollupRow.task).where(*where).group_by(RollupRow.task).order_by(RollupRow.task)
                )
            ).all()
        )
