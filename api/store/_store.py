"""The decision log: every decision the router makes, per tenant, with its outcomes and the API keys.

Every direct write (``record``, ``record_outcome``, ...) is committed before its method returns, so
a caller that answers a client only after ``record`` returned never acknowledges a decision a crash
could lose. Sinks go through the store's one ``DecisionWriter``: group commit by default (still
committed on return), or write-behind (queued on return) for in-process graphs. The store keeps no
state of its own beyond the connection pool and that queue: several API replicas can share one
PostgreSQL database.

``DecisionStore`` is the facade; the work is in modules of their own: reading the log back
(``_reads``), API keys (``_keys``), the tenant sink (``_sink``), retention (``_prune``) and
idempotency keys (``_idempotency``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from sqlalchemy import Table, insert, select, text
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from fastslow.router import Decision, DecisionSink, State, Verdict

from . import _keys, _pages, _reads, _reviews, _summary
from ._codec import answer_rows, canonical_state, clean, decision_row, stored_outcome
from ._engine import create_store_engine, upgrade
from ._idempotency import (
    Claims,
    IdempotencyKeyTaken,
    IdempotentRequest,
    StoredResponse,
    find_response,
    key_taken,
    response_row,
)
from ._learned import LearnedExamples
from ._models import AnswerRow, DecisionRow, IdempotencyKeyRow, OutcomeRow
from ._pages import SEARCH_WINDOW, DecisionFilter, DecisionPage
from ._prune import DEFAULT_PRUNE_BATCH, Cutoff, PruneCounts, PruneReport, as_cutoff, prune
from ._reviews import ReviewDraft, Settled
from ._rollup import add_rollups
from ._sink import ReviewingSink, TenantSink
from ._summary import LogSummary
from ._values import DEFAULT_SCOPES, ApiKey, Review, ReviewStatus, StoredDecision, StoredOutcome
from ._writer import DEFAULT_BATCH, DEFAULT_QUEUE, DecisionWriter, Record

__all__ = ["DecisionStore"]


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
        self.claims = Claims()
        """The idempotency keys this process's requests are working on (one request per key at a time)."""

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
        # Off the loop too: for SQLite it may create the file's directory.
        engine = await asyncio.to_thread(create_store_engine, url)
        return cls(engine, queue=queue, batch=batch)

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
            await add_rollups(session, rows)
            if answers:
                await session.execute(insert(AnswerRow), answers)

    async def record_unit(
        self,
        records: Sequence[Record],
        *,
        tenant: str,
        idempotent: IdempotentRequest | None = None,
        response: tuple[int, bytes] | None = None,
        extra: Sequence[tuple[Table, Mapping[str, Any]]] = (),
    ) -> None:
        """Commit one request's decisions, its ``extra`` rows (the reviews it opened, ``review_rows``)
        and its idempotency key with ``response``, in one transaction.

        Committed when this returns; on any failure nothing of it is stored.

        Raises:
            IdempotencyKeyTaken: another request with ``idempotent``'s key committed first.
        """
        _check_tenant(tenant)
        also: list[tuple[Table, dict[str, Any]]] = [(table, dict(row)) for table, row in extra]
        if idempotent is not None:
            if response is None:
                raise ValueError("an idempotent request is stored with its response")
            status, body = response
            keys: Table = IdempotencyKeyRow.__table__  # type: ignore[assignment]
            also.append((keys, response_row(idempotent, status=status, body=body, now=_now())))
        try:
            await self.writer.record_unit(records, tenant=tenant, also=also)
        except IntegrityError as exc:
            if idempotent is not None and await key_taken(self._sessions, idempotent):
                raise IdempotencyKeyTaken(idempotent.key) from exc
            raise

    async def idempotent_response(self, request: IdempotentRequest) -> StoredResponse | None:
        """The response stored for ``request``'s key (tenant, endpoint and key), unless there is none or it expired."""
        return await find_response(self._sessions, request, _now())

    def sink(
        self,
        tenant: str,
        *,
        store_state: Callable[[str], bool] | bool = False,
        write_behind: bool = False,
        review_ttl_s: float | None = 86_400.0,
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
            review_ttl_s: the sink is also a ``fastslow.router.ReviewRecorder``: a graph's policy
                gate opens its reviews in this log's review queue, expiring this long after
                (``settings.reviews.ttl_s``). ``None``: it opens none (LangGraph's own server,
                which keeps reviews in its interrupts).
        """
        tenant = _check_tenant(tenant)
        if review_ttl_s is None:
            return TenantSink(self.writer, tenant, store_state, write_behind)
        ttl_s = review_ttl_s

        async def open_review(draft: ReviewDraft) -> Review:
            return await self.open_review(draft, ttl_s=ttl_s)

        return ReviewingSink(self.writer, tenant, store_state, write_behind, open_review=open_review)

    async def flush(self) -> None:
        """Wait until every decision the sinks queued so far is committed (or given up on and logged)."""
        await self.writer.flush()

    async def get(self, decision_id: str, *, tenant: str) -> StoredDecision | None:
        """The decision with this id, or ``None`` when there is none for ``tenant``."""
        return await _reads.decision(self._sessions, decision_id, tenant=tenant)

    # -- outcomes --------------------------------------------------------------------------------

    async def record_outcome(
        self,
        decision_id: str,
        *,
        tenant: str,
        label: str | None = None,
        system2_correct: bool | None = None,
        note: str | None = None,
        idempotent: IdempotentRequest | None = None,
        respond: Callable[[StoredOutcome], tuple[int, bytes]] | None = None,
    ) -> StoredOutcome | None:
        """Record what turned out to be right for a decision; committed when this returns.

        With ``idempotent``, its key and the response ``respond`` makes of the outcome are stored in
        the same transaction.

        Returns:
            The outcome, or ``None`` when ``tenant`` has no decision with this id.

        Raises:
            ValueError: neither ``label`` nor ``system2_correct`` was given.
            IdempotencyKeyTaken: another request with ``idempotent``'s key committed first.
        """
        if (idempotent is None) != (respond is None):
            raise ValueError("give idempotent and respond together")
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
            owner = (
                await session.execute(select(DecisionRow.tenant, DecisionRow.task).where(DecisionRow.id == decision_id))
            ).first()
            if owner is None or owner.tenant != tenant:
                await session.rollback()
                return None
            # Copied onto the outcome so calibration walks a task's outcomes by their own index.
            row.tenant, row.task = owner.tenant, owner.task
            outcome = stored_outcome(row)
            if idempotent is not None and respond is not None:
                status, body = respond(outcome)
                session.add(IdempotencyKeyRow(**response_row(idempotent, status=status, body=body, now=_now())))
                try:
                    await session.flush()
                except IntegrityError as exc:  # the key's primary key: another request committed it first
                    await session.rollback()
                    raise IdempotencyKeyTaken(idempotent.key) from exc
            await session.commit()
        return outcome

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
        return await _reads.with_outcomes(self._sessions, tenant=tenant, task=task, since=since, limit=limit)

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
        return await _reads.task_decisions(
            self._sessions, task=task, tenant=tenant, since=since, reason=reason, limit=limit
        )

    async def kept_counts(
        self, *, task: str, tenant: str | None = None, since: datetime | None = None
    ) -> tuple[int, int]:
        """(decisions, of which System 1 kept) for ``task``: what its coverage was, labelled or not."""
        return await _reads.kept_counts(self._sessions, task=task, tenant=tenant, since=since)

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

        Idempotency keys expired by now go too (``PruneReport.expired_keys``), whatever ``before`` is.
        Learned examples stay (unlinked from their decision); API keys are never touched.
        """
        return await prune(
            self._sessions,
            as_cutoff(before),
            tenant=tenant,
            dry_run=dry_run,
            batch=batch,
            on_batch=on_batch,
            now=_now(),
        )

    # -- API keys --------------------------------------------------------------------------------

    async def create_key(
        self, tenant: str, *, name: str | None = None, scopes: Iterable[str] = DEFAULT_SCOPES
    ) -> tuple[str, ApiKey]:
        """Make an API key for ``tenant`` that may do ``scopes`` (``check`` and ``read`` unless told).

        Returns:
            The key itself, which is not kept and cannot be shown again, and its record.

        Raises:
            ValueError: an unknown scope, or none.
        """
        return await _keys.create_key(self._sessions, _check_tenant(tenant), name=name, now=_now(), scopes=scopes)

    async def authenticate(self, key: str, *, include_revoked: bool = False) -> ApiKey | None:
        """The record of a live key, or ``None`` for an unknown one (and a revoked one, unless
        ``include_revoked``: the API answers 403 rather than 401 for a key that was revoked)."""
        return await _keys.authenticate(self._sessions, key, include_revoked=include_revoked)

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key by its id; ``True`` when the key exists (revoking twice is harmless)."""
        return await _keys.revoke_key(self._sessions, self._engine, key_id, now=_now())

    async def get_key(self, key_id: str) -> ApiKey | None:
        """The record of the key with this id (never the key), revoked or not; ``None`` when there is none."""
        return await _keys.get_key(self._sessions, key_id)

    async def list_keys(self, tenant: str | None = None) -> list[ApiKey]:
        """Every key's record (never the key), oldest first; only ``tenant``'s when given."""
        return await _keys.list_keys(self._sessions, tenant)

    # -- the console's reads -----------------------------------------------------------------------

    async def decision_page(
        self,
        *,
        tenant: str,
        where: DecisionFilter | None = None,
        after: str | None = None,
        limit: int = 50,
        window: int = SEARCH_WINDOW,
    ) -> DecisionPage:
        """One page of ``tenant``'s decisions, newest first, from the cursor ``after`` (``DecisionPage.next_cursor``).

        Raises:
            ValueError: ``after`` is not a cursor this method made.
        """
        return await _pages.decision_page(
            self._sessions, tenant=tenant, where=where or DecisionFilter(), after=after, limit=limit, window=window
        )

    async def summary(
        self, *, tenant: str | None, task: str | None = None, since: datetime, until: datetime | None = None
    ) -> LogSummary:
        """The figures of ``tenant``'s decisions (every tenant's when ``None``) over ``[since, until)``
        (``fastslow.api.store.LogSummary``)."""
        return await _summary.log_summary(self._sessions, tenant=tenant, task=task, since=since, until=until or _now())

    async def summary_tasks(self, *, tenant: str | None, since: datetime | None = None) -> list[str]:
        """The tasks ``tenant`` (every tenant when ``None``) has decisions for, since ``since``'s hour if given."""
        return await _summary.summary_tasks(self._sessions, tenant=tenant, since=since)

    # -- reviews -----------------------------------------------------------------------------------

    async def open_review(self, draft: ReviewDraft, *, ttl_s: float) -> Review:
        """Open a review on its own (a graph's gate), expiring ``ttl_s`` from now; committed on return."""
        now = _now()
        return await _reviews.open_review(self._sessions, draft, now=now, expires_at=now + timedelta(seconds=ttl_s))

    def review_rows(self, draft: ReviewDraft, *, ttl_s: float) -> tuple[Review, list[tuple[Table, dict[str, Any]]]]:
        """A review to open with a request's decisions: pass the rows as ``record_unit``'s ``extra``."""
        now = _now()
        return _reviews.review_rows(draft, now=now, expires_at=now + timedelta(seconds=ttl_s))

    async def get_review(self, review_id: str, *, tenant: str) -> Review | None:
        """``tenant``'s review with this id, or ``None``."""
        return await _reviews.get_review(self._sessions, review_id, tenant=tenant)

    async def reviews(
        self, *, tenant: str, status: ReviewStatus | None = None, limit: int = 50, offset: int = 0
    ) -> list[Review]:
        """``tenant``'s reviews: pending ones most uncertain first, the others newest first."""
        return await _reviews.list_reviews(self._sessions, tenant=tenant, status=status, limit=limit, offset=offset)

    async def settle_review(
        self, review_id: str, *, tenant: str, verdict: Verdict, by: str, note: str | None = None
    ) -> Settled | None:
        """Settle a pending review (``Settled.now_settled`` false: it was settled before); ``None``: no such review."""
        return await _reviews.settle_review(
            self._sessions, review_id, tenant=tenant, verdict=verdict, note=note, by=by, now=_now()
        )

    async def expire_reviews(self, *, verdict: Verdict = "deny", tenant: str | None = None) -> int:
        """Settle every pending review past its expiry with ``verdict``, as ``expired``; how many."""
        return await _reviews.expire_due(self._sessions, now=_now(), verdict=verdict, tenant=tenant)
