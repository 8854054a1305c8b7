"""The decision log: every decision the router makes, per tenant, with its outcomes and the API keys.

Every direct write (``record``, ``record_outcome``, ...) is committed before its method returns, so
a caller that answers a client only after ``record`` returned never acknowledges a decision a crash
could lose. Sinks go through the store's one ``DecisionWriter``: group commit by default (still
committed on return), or write-behind (queued on return) for in-process graphs. The store keeps no
state of its own beyond the connection pool and that queue: several API replicas can share one
PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import hmac
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from sqlalchemy import func, insert, select, text, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from fastslow.router import Decision, DecisionSink, State

from ._codec import (
    KEY_PREFIX,
    answer_rows,
    api_key,
    canonical_state,
    clean,
    decision_row,
    hash_key,
    new_key,
    stored_decision,
    stored_outcome,
)
from ._engine import create_store_engine, upgrade
from ._learned import LearnedExamples
from ._models import AnswerRow, ApiKeyRow, DecisionRow, OutcomeRow
from ._prune import DEFAULT_PRUNE_BATCH, Cutoff, PruneCounts, PruneReport, as_cutoff, prune
from ._revocations import announce_in, touch_marker
from ._values import ApiKey, StoredDecision, StoredOutcome
from ._writer import DEFAULT_BATCH, DEFAULT_QUEUE, DecisionWriter

__all__ = ["DecisionStore"]

_IN_CHUNK = 500
"""Ids per ``IN (...)`` list, well under SQLite's limit on bound parameters."""


def _now() -> datetime:
    return datetime.now(UTC)


def _check_tenant(tenant: str) -> str:
    if not isinstance(tenant, str) or not tenant.strip():
        raise ValueError("tenant must be a non-empty string")
    return tenant


class DecisionStore:
    """The decision log on SQLite or PostgreSQL; open with ``await DecisionStore.open(url)``."""

    def __init__(self, engine: AsyncEngine, *, queue: int = DEFAULT_QUEUE, batch: int = DEFAULT_BATCH) -> None:
        self._engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self.learned = LearnedExamples(self._sessions, engine.dialect.name)
        """What tasks learned from escalations and outcomes (``fastslow.api.learning``)."""
        self.writer = DecisionWriter(engine, queue=queue, batch=batch)
        """The one writer the sinks record through: batches, write-behind and group commit."""

    @classmethod
    async def open(
        cls, url: str, *, migrate: bool = True, queue: int = DEFAULT_QUEUE, batch: int = DEFAULT_BATCH
    ) -> DecisionStore:
        """Connect to the log at ``url``, first running its migrations unless ``migrate`` is false.

        SQLite connections use WAL with ``synchronous=NORMAL``, foreign keys and a busy timeout.
        ``queue`` and ``batch`` size the writer (``Settings.store``, docs/store.md).
        """
        if migrate:
            # Alembic is synchronous; a thread keeps the event loop free while it runs.
            await asyncio.to_thread(upgrade, url)
        return cls(create_store_engine(url), queue=queue, batch=batch)

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine underneath (for diagnostics and tests)."""
        return self._engine

    async def aclose(self) -> None:
        """Commit what the writer holds, then close every pooled connection."""
        try:
            await self.writer.aclose()
        finally:
            await self._engine.dispose()

    async def __aenter__(self) -> DecisionStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def ping(self, *, timeout_s: float = 5.0) -> bool:
        """Whether the database answers a trivial query within ``timeout_s`` (for ``/readyz``)."""
        try:
            async with asyncio.timeout(timeout_s), self._engine.connect() as connection:
                await connection.execute(text("SELECT 1"))
        except (SQLAlchemyError, OSError, TimeoutError):
            return False
        return True

    # -- decisions -------------------------------------------------------------------------------

    async def record(self, decision: Decision, *, tenant: str, state: State, store_state: bool = False) -> None:
        """Log one decision for ``tenant``; it is committed when this returns.

        The state is kept as a sha256 digest, and as text only when ``store_state`` is true (the
        task's ``store_state`` policy). A decision id can be recorded once.
        """
        await self.record_many([decision], tenant=tenant, state=state, store_state=store_state)

    async def record_many(
        self, decisions: Sequence[Decision], *, tenant: str, state: State, store_state: bool = False
    ) -> None:
        """Log several decisions about one state (a policy check's rules) in one transaction."""
        _check_tenant(tenant)
        if not decisions:
            return
        state_json, digest = canonical_state(state)
        kept = state_json if store_state else None
        created_at = _now()
        rows = [
            decision_row(d, tenant=tenant, digest=digest, state_text=kept, created_at=created_at) for d in decisions
        ]
        answers = [row for d in decisions for row in answer_rows(d)]
        # Inserts only: on SQLite a transaction whose first statement writes waits for the write
        # lock (busy_timeout) instead of failing the way a read-then-write transaction can.
        async with self._sessions.begin() as session:
            await session.execute(insert(DecisionRow), rows)
            if answers:
                await session.execute(insert(AnswerRow), answers)

    def sink(
        self, tenant: str, *, store_state: Callable[[str], bool] | bool = False, write_behind: bool = False
    ) -> DecisionSink:
        """A ``fastslow.router.DecisionSink`` that records into this log for ``tenant``, through ``writer``.

        Args:
            tenant: whose decisions these are.
            store_state: whether to keep the state text; a function of the task name (the task's
                ``store_state`` policy) or one answer for all tasks.
            write_behind: return once a decision is queued, not committed (for in-process graphs,
                where nobody is acknowledged); ``flush()`` or ``aclose()`` the store to commit the
                rest. Decisions System 2 answered are still committed before ``record`` returns.
                Off (the default), ``record`` returns once committed, in a group commit.
        """
        return _TenantSink(self, _check_tenant(tenant), store_state, write_behind)

    async def flush(self) -> None:
        """Wait until every decision the sinks queued so far is committed (or given up on and logged)."""
        await self.writer.flush()

    async def get(self, decision_id: str, *, tenant: str) -> StoredDecision | None:
        """The decision with this id, or ``None`` when there is none for ``tenant``."""
        async with self._sessions() as session:
            row = await session.scalar(
                select(DecisionRow).where(DecisionRow.id == decision_id, DecisionRow.tenant == tenant)
            )
            if row is None:
                return None
            answers = await self._answers(session, [row.id])
        return stored_decision(row, answers.get(row.id, {}))

    async def _answers(self, session: AsyncSession, ids: Sequence[str]) -> dict[str, dict[str, float]]:
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

    # -- outcomes --------------------------------------------------------------------------------

    async def record_outcome(
        self,
        decision_id: str,
        *,
        tenant: str,
        label: str | None = None,
        system2_correct: bool | None = None,
        note: str | None = None,
    ) -> StoredOutcome | None:
        """Record what turned out to be right for a decision; committed when this returns.

        Returns:
            The outcome, or ``None`` when ``tenant`` has no decision with this id.

        Raises:
            ValueError: neither ``label`` nor ``system2_correct`` was given.
        """
        if label is None and system2_correct is None:
            raise ValueError("an outcome needs a label or system2_correct")
        row = OutcomeRow(
            id=uuid.uuid4().hex,
            decision_id=decision_id,
            label=None if label is None else clean(label),
            system2_correct=system2_correct,
            note=None if note is None else clean(note),
            created_at=_now(),
        )
        # Write first, then check the owner inside the same transaction: on SQLite a transaction
        # that reads before writing can fail outright when another writer committed in between.
        # The foreign key rejects unknown decisions; another tenant's decision rolls back.
        async with self._sessions() as session:
            session.add(row)
            try:
                await session.flush()
            except IntegrityError:
                await session.rollback()
                return None
            owner = await session.scalar(select(DecisionRow.tenant).where(DecisionRow.id == decision_id))
            if owner != tenant:
                await session.rollback()
                return None
            await session.commit()
        return stored_outcome(row)

    async def outcomes(
        self,
        *,
        tenant: str | None = None,
        task: str | None = None,
        since: datetime | None = None,
        limit: int = 10_000,
    ) -> list[tuple[StoredDecision, StoredOutcome]]:
        """Decisions with their recorded outcomes, newest outcome first (for calibration).

        Args:
            tenant: only this tenant's; every tenant's when ``None`` (operators, not API clients).
            task: only this task's.
            since: only decisions made at or after this time.
            limit: at most this many pairs.
        """
        query = select(DecisionRow, OutcomeRow).join(OutcomeRow, OutcomeRow.decision_id == DecisionRow.id)
        if tenant is not None:
            query = query.where(DecisionRow.tenant == tenant)
        if task is not None:
            query = query.where(DecisionRow.task == task)
        if since is not None:
            query = query.where(DecisionRow.created_at >= since)
        query = query.order_by(OutcomeRow.created_at.desc(), OutcomeRow.id).limit(limit)
        async with self._sessions() as session:
            pairs = [(d, o) for d, o in (await session.execute(query)).all()]
            answers = await self._answers(session, sorted({d.id for d, _ in pairs}))
        return [(stored_decision(d, answers.get(d.id, {})), stored_outcome(o)) for d, o in pairs]

    async def decisions(
        self,
        *,
        task: str,
        tenant: str | None = None,
        since: datetime | None = None,
        reason: str | None = None,
        limit: int = 100_000,
    ) -> list[StoredDecision]:
        """A task's decisions, newest first, with their distributions (``fastslow report shadow``)."""
        query = select(DecisionRow).where(DecisionRow.task == task)
        if tenant is not None:
            query = query.where(DecisionRow.tenant == tenant)
        if since is not None:
            query = query.where(DecisionRow.created_at >= since)
        if reason is not None:
            query = query.where(DecisionRow.reason == reason)
        query = query.order_by(DecisionRow.created_at.desc(), DecisionRow.id).limit(limit)
        async with self._sessions() as session:
            rows = list((await session.scalars(query)).all())
            answers = await self._answers(session, [r.id for r in rows])
        return [stored_decision(r, answers.get(r.id, {})) for r in rows]

    async def kept_counts(
        self, *, task: str, tenant: str | None = None, since: datetime | None = None
    ) -> tuple[int, int]:
        """(decisions, of which System 1 kept) for ``task``: what its coverage was, labelled or not."""
        kept = (DecisionRow.system == 1) & ~DecisionRow.escalate & (func.coalesce(DecisionRow.verdict, "") != "review")
        query = select(func.count(), func.count().filter(kept)).where(DecisionRow.task == task)
        if tenant is not None:
            query = query.where(DecisionRow.tenant == tenant)
        if since is not None:
            query = query.where(DecisionRow.created_at >= since)
        async with self._sessions() as session:
            total, kept_n = (await session.execute(query)).one()
        return int(total), int(kept_n)

    async def prune(
        self,
        before: datetime | Cutoff,
        *,
        tenant: str | None = None,
        dry_run: bool = False,
        batch: int = DEFAULT_PRUNE_BATCH,
        on_batch: Callable[[str, PruneCounts], None] | None = None,
    ) -> PruneReport:
        """Delete decisions made before a cut, with their answers and outcomes (``fastslow db prune``).

        Args:
            before: the cut for every tenant, or a function giving each tenant's (``None``: keep
                all of that tenant's), such as ``retention_cutoff(settings.store, now)``.
            tenant: only this tenant's decisions; every tenant's when ``None``.
            dry_run: count what would go, delete nothing.
            batch: decisions per transaction: each batch commits on its own, so a prune of
                millions of rows never holds one long transaction (or SQLite's write lock) for long.
            on_batch: called after each committed batch with its tenant and counts.

        Learned examples stay (unlinked from their decision); API keys are never touched.
        """
        return await prune(
            self._sessions, as_cutoff(before), tenant=tenant, dry_run=dry_run, batch=batch, on_batch=on_batch
        )

    # -- API keys --------------------------------------------------------------------------------

    async def create_key(self, tenant: str, *, name: str | None = None) -> tuple[str, ApiKey]:
        """Make an API key for ``tenant``.

        Returns:
            The key itself, which is not kept and cannot be shown again, and its record.
        """
        key, prefix, digest = new_key()
        row = ApiKeyRow(
            id=uuid.uuid4().hex,
            tenant=clean(_check_tenant(tenant)),
            name=None if name is None else clean(name),
            prefix=prefix,
            key_hash=digest,
            created_at=_now(),
            revoked_at=None,
        )
        async with self._sessions.begin() as session:
            session.add(row)
        return key, api_key(row)

    async def authenticate(self, key: str, *, include_revoked: bool = False) -> ApiKey | None:
        """The record of a live key, or ``None`` for an unknown one (and a revoked one, unless
        ``include_revoked``: the API answers 403 rather than 401 for a key that was revoked)."""
        if not isinstance(key, str) or not key.startswith(KEY_PREFIX) or len(key) > 200:
            return None  # not shaped like one of our keys; the shape is public, no timing to hide
        digest = hash_key(key)
        # The index lookup by hash is not constant-time, but what it could leak is about the hash
        # of the caller's own guess, which says nothing about any key of 256 random bits; the final
        # comparison is constant-time all the same.
        async with self._sessions() as session:
            row = await session.scalar(select(ApiKeyRow).where(ApiKeyRow.key_hash == digest))
        if row is None or not hmac.compare_digest(row.key_hash, digest):
            return None
        if row.revoked_at is not None and not include_revoked:
            return None
        return api_key(row)

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key by its id; ``True`` when the key exists (revoking twice is harmless)."""
        async with self._sessions.begin() as session:
            live = ApiKeyRow.revoked_at.is_(None)
            await session.execute(update(ApiKeyRow).where(ApiKeyRow.id == key_id, live).values(revoked_at=_now()))
            found = await session.scalar(select(ApiKeyRow.id).where(ApiKeyRow.id == key_id))
            if found is not None:
                await announce_in(session)  # every replica drops its cached keys at commit
        database = self._engine.url.database if self._engine.dialect.name == "sqlite" else None
        if found is not None and database:
            await asyncio.to_thread(touch_marker, Path(database))
        return found is not None

    async def get_key(self, key_id: str) -> ApiKey | None:
        """The record of the key with this id (never the key), revoked or not; ``None`` when there is none."""
        async with self._sessions() as session:
            row = await session.scalar(select(ApiKeyRow).where(ApiKeyRow.id == key_id))
        return None if row is None else api_key(row)

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """Every key's record (never the key), oldest first; only ``tenant``'s when given."""
        query = select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id)
        if tenant is not None:
            query = query.where(ApiKeyRow.tenant == tenant)
        async with self._sessions() as session:
            return [api_key(row) for row in await session.scalars(query)]


class _TenantSink:
    """The router's ``DecisionSink`` for one tenant."""

    def __init__(
        self, store: DecisionStore, tenant: str, store_state: Callable[[str], bool] | bool, write_behind: bool
    ) -> None:
        self._store = store
        self._tenant = tenant
        self._store_state = store_state
        self._write_behind = write_behind

    def _keeps_state(self, decisions: Iterable[Decision]) -> bool:
        if callable(self._store_state):
            return all(self._store_state(d.task) for d in decisions)
        return bool(self._store_state)

    async def record(self, decision: Decision, *, state: State) -> None:
        await self.record_many((decision,), state=state)

    def record_from_thread(self, decisions: Sequence[Decision], *, state: State) -> bool:
        """Queue ``decisions`` from a sync caller's thread (``DecisionWriter.record_from_thread``).

        Only what ``record_many`` would not wait for: ``False`` for a durable sink and for System-2
        answers, which are committed before the router returns.
        """
        if not self._write_behind or any(d.system == 2 for d in decisions):
            return False
        return self._store.writer.record_from_thread(
            decisions, tenant=self._tenant, state=state, store_state=self._keeps_state(decisions)
        )

    async def record_many(self, decisions: Sequence[Decision], *, state: State) -> None:
        """All of one call's decisions in one transaction (one commit instead of several)."""
        # A System-2 answer cost a frontier model call, next to which its commit is free, and what
        # learns from it (``Learner.sink``) needs its row in the log: it is never left behind.
        durable = not self._write_behind or any(d.system == 2 for d in decisions)
        await self._store.writer.record(
            decisions, tenant=self._tenant, state=state, store_state=self._keeps_state(decisions), durable=durable
        )
