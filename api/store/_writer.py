"""One writer per decision log: a bounded queue committed in batches, write-behind or group commit.

    writer = store.writer
    await writer.record(decisions, tenant="acme", state=state)                # queued: write-behind
    await writer.record(decisions, tenant="acme", state=state, durable=True)  # committed: group commit
    await writer.flush()                                                      # everything queued so far
    await writer.record_unit([Record(decisions=d, state=s)], tenant="acme", also=[(IdempotencyKeyRow, row)])

Callers put entries (the decisions of one call, about one state) on a bounded queue. One task
takes whatever is queued, up to ``batch`` decisions, and commits it in one transaction with
multi-row inserts. Nothing waits for company: an entry that finds the writer idle is committed at
once, and batches form only from what queued while a commit was in flight.

``record_unit`` is the API's way in: every decision one request made (several calls, about
several states) and the rows that go with them (its idempotency key's) are one entry, so they
commit together or not at all, and it returns once they did.

Failures (docs/store.md):

* a batch the database refuses as a whole (a decision id recorded twice) is retried entry by
  entry, so only the entry at fault fails;
* any other failure (the database is unreachable) is raised at once to the batch's durable
  waiters, who did not get an acknowledgement; its write-behind entries are retried after each of
  ``retry_delays_s``, then dropped, counted in ``dropped`` and logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from fastslow.router import Decision, State

from ._codec import answer_rows, canonical_state, decision_row
from ._models import AnswerRow, Base, DecisionRow
from ._rollup import add_rollups

__all__ = ["DEFAULT_BATCH", "DEFAULT_QUEUE", "AlsoRow", "DecisionWriter", "Record", "WriterClosed"]

log = logging.getLogger("fastslow.store")

DEFAULT_QUEUE = 10_000
"""Entries waiting for the writer; a producer beyond it waits for room."""
DEFAULT_BATCH = 500
"""Decisions in one transaction at most."""
DEFAULT_RETRY_DELAYS_S = (0.1, 0.5, 2.0)


class WriterClosed(RuntimeError):
    """The writer was closed (or its event loop ended): nothing more can be recorded through it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """One call's decisions about one state, as a part of ``record_unit``."""

    decisions: Sequence[Decision]
    state: State
    store_state: bool = False
    """Keep the state's text (the task's ``store_state`` policy), not only its digest."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Part:
    decisions: tuple[Decision, ...]
    digest: str
    state_text: str | None


AlsoRow = tuple[type[Base] | Table, dict[str, Any]]
"""A row of another table committed with an entry's decisions (an idempotency key's)."""


@dataclass(slots=True, kw_only=True)
class _Entry:
    parts: tuple[_Part, ...]
    tenant: str
    created_at: datetime
    done: asyncio.Future[None] | None
    """Set once the entry is committed (or failed), for a durable caller; ``None`` for write-behind."""
    also: tuple[AlsoRow, ...] = ()
    decisions: tuple[Decision, ...] = ()
    """Every part's decisions, in order (set from ``parts``)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.decisions = tuple(d for part in self.parts for d in part.decisions)


def _part(record: Record) -> _Part:
    # The state is serialised now: the caller may change it once the record call returns.
    state_json, digest = canonical_state(record.state)
    return _Part(
        decisions=tuple(record.decisions), digest=digest, state_text=state_json if record.store_state else None
    )


def _entry(
    decisions: Sequence[Decision], tenant: str, state: State, store_state: bool, done: asyncio.Future[None] | None
) -> _Entry:
    part = _part(Record(decisions=decisions, state=state, store_state=store_state))
    return _Entry(parts=(part,), tenant=tenant, created_at=datetime.now(UTC), done=done)


def _succeed(entry: _Entry) -> None:
    # A durable caller that gave up (its deadline passed) cancelled the future; the commit stands.
    if entry.done is not None and not entry.done.done():
        entry.done.set_result(None)


def _fail(entry: _Entry, exc: BaseException) -> None:
    if entry.done is not None and not entry.done.done():
        entry.done.set_exception(exc)


class DecisionWriter:
    """Commits decisions in batches from a bounded queue, with one task per database.

    Args:
        engine: the decision log's engine.
        queue: entries (one ``record`` call each) waiting at most; beyond it ``record`` waits for room.
        batch: decisions committed in one transaction at most.
        retry_delays_s: pauses before each retry of write-behind entries whose commit failed.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        queue: int = DEFAULT_QUEUE,
        batch: int = DEFAULT_BATCH,
        retry_delays_s: Sequence[float] = DEFAULT_RETRY_DELAYS_S,
    ) -> None:
        if queue < 1 or batch < 1:
            raise ValueError("queue and batch must be at least 1")
        self._engine = engine
        self._queue: asyncio.Queue[_Entry] = asyncio.Queue(maxsize=queue)
        self._batch = batch
        self._retry_delays_s = tuple(retry_delays_s)
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop the writer's task runs on, once it has started."""
        self._from_threads: set[asyncio.Task[None]] = set()
        self._closed = False
        self._queued = 0
        self._settled = 0
        """Entries committed, failed or dropped; the writer works in queue order, so a prefix."""
        self._waiting_for_room = 0
        self._in_flight: list[_Entry] = []
        self._progress = asyncio.Event()
        """Set and replaced whenever entries settle (an event per step needs no lock, unlike a Condition)."""
        self.commits = 0
        """Transactions committed (for metrics and tests)."""
        self.committed = 0
        """Decisions committed."""
        self.dropped = 0
        """Write-behind decisions given up on after their retries (each one is logged)."""

    @property
    def pending(self) -> int:
        """Entries queued and not yet committed, failed or dropped (the one in flight included)."""
        return self._queued - self._settled

    @property
    def closed(self) -> bool:
        return self._closed

    async def record(
        self,
        decisions: Sequence[Decision],
        *,
        tenant: str,
        state: State,
        store_state: bool = False,
        durable: bool = False,
    ) -> None:
        """Queue decisions about one ``state`` for ``tenant``, waiting for room when the queue is full.

        Args:
            durable: return only once the batch holding them is committed, raising its error when
                it failed (group commit); otherwise return once they are queued (write-behind).

        Raises:
            WriterClosed: the writer was closed.
        """
        if self._closed:
            raise WriterClosed("the decision writer is closed")
        if not decisions:
            return
        done = asyncio.get_running_loop().create_future() if durable else None
        entry = _entry(decisions, tenant, state, store_state, done)
        self._start()
        await self._put(entry)
        if done is not None:
            await done

    async def record_unit(self, records: Sequence[Record], *, tenant: str, also: Sequence[AlsoRow] = ()) -> None:
        """Commit ``records`` and the ``also`` rows in one transaction, all or nothing; return once committed.

        One entry however many records: a batch the database refuses is retried entry by entry,
        so the unit fails whole (its error raised here), never in part.

        Raises:
            WriterClosed: the writer was closed.
        """
        if self._closed:
            raise WriterClosed("the decision writer is closed")
        parts = tuple(_part(record) for record in records if record.decisions)
        if not parts and not also:
            return
        done = asyncio.get_running_loop().create_future()
        entry = _Entry(parts=parts, tenant=tenant, created_at=datetime.now(UTC), done=done, also=tuple(also))
        self._start()
        await self._put(entry)
        await done

    def record_from_thread(
        self, decisions: Sequence[Decision], *, tenant: str, state: State, store_state: bool = False
    ) -> bool:
        """Queue write-behind decisions from a thread outside the writer's event loop, without waiting.

        For sync callers (``Router.route_sync``). Returns ``False``, having queued nothing, before
        the writer has started on a loop, once it is closed, and while its queue is full: the
        caller then awaits ``record`` on that loop, which waits for room (back-pressure holds).
        """
        loop = self._loop
        if loop is None or self._closed or self._queue.full():
            return False
        if not decisions:
            return True
        entry = _entry(decisions, tenant, state, store_state, None)
        try:
            loop.call_soon_threadsafe(self._put_from_thread, entry)
        except RuntimeError:  # the loop closed since the check
            return False
        return True

    def _put_from_thread(self, entry: _Entry) -> None:
        if self._task is None or self._task.done() or self._task.cancelling():
            # Closed (``aclose`` past its wait) between the caller's check and now: nothing takes it.
            self.dropped += len(entry.decisions)
            log.error("the decision writer was closed before %d queued decision(s) reached it", len(entry.decisions))
            return
        if not self._queue.full():
            self._queue.put_nowait(entry)
            self._queued += 1
            return
        # Full since the caller looked: wait for room like any producer. Only threads racing the
        # check get here, so these waiters are as many as the threads at most.
        task = asyncio.get_running_loop().create_task(self._put(entry))
        self._from_threads.add(task)
        task.add_done_callback(self._from_threads.discard)

    async def _put(self, entry: _Entry) -> None:
        # ``_queued`` is counted in the same step as the put (no await in between): ``flush`` and
        # ``aclose`` rely on entries being counted in queue order.
        if not self._queue.full():
            self._queue.put_nowait(entry)
            self._queued += 1
            return
        self._waiting_for_room += 1
        try:
            await self._queue.put(entry)
            self._queued += 1
        finally:
            self._waiting_for_room -= 1
        if self._task is not None and self._task.done():
            self._abandon()  # the writer stopped while this waited: fail it rather than strand it

    async def flush(self) -> None:
        """Wait until everything queued before this call is committed, failed or dropped."""
        target = self._queued
        while self._settled < target:
            await self._progress.wait()

    async def aclose(self) -> None:
        """Refuse new records, commit everything queued (and every producer waiting for room), then stop."""
        self._closed = True
        if self._task is None:
            return
        # Producers waiting for room got past the closed check: they are committed too.
        while self._waiting_for_room or self._settled < self._queued:
            await self._progress.wait()
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None

    def _start(self) -> None:
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._run(), name="fastslow-decision-writer")

    async def _run(self) -> None:
        try:
            while True:
                first = await self._queue.get()
                batch, size = [first], len(first.decisions)
                while size < self._batch and not self._queue.empty():
                    entry = self._queue.get_nowait()
                    batch.append(entry)
                    size += len(entry.decisions)
                self._in_flight = batch
                try:
                    await self._write(batch)
                except Exception:  # a bug here must not stop every later commit
                    log.exception("the decision writer failed on a batch of %d decisions", size)
                    for entry in batch:
                        _fail(entry, WriterClosed("the decision writer failed"))
                self._in_flight = []
                self._settle(len(batch))
        finally:
            self._abandon()

    def _settle(self, entries: int) -> None:
        self._settled += entries
        self._progress.set()
        self._progress = asyncio.Event()

    def _abandon(self) -> None:
        """What is still queued when the task stops without ``aclose`` (its event loop ended)."""
        self._closed = True
        left = self._in_flight
        self._in_flight = []
        while not self._queue.empty():
            left.append(self._queue.get_nowait())
        lost = 0
        for entry in left:
            lost += len(entry.decisions)
            _fail(entry, WriterClosed("the decision writer stopped before this was committed"))
        self._settle(len(left))
        if lost:
            self.dropped += lost
            log.error("the decision writer stopped with %d decision(s) not committed", lost)

    async def _write(self, batch: list[_Entry]) -> None:
        batch = [entry for entry in batch if self._rows(entry)]
        delays = iter(self._retry_delays_s)
        while batch:
            try:
                await self._commit(batch)
            except IntegrityError as exc:
                if len(batch) > 1:
                    # One entry's rows were refused (its id was recorded already): the others are not at fault.
                    for entry in batch:
                        await self._write([entry])
                    return
                self._give_up(batch, exc)
                return
            except Exception as exc:  # the database is unreachable, or failed the commit
                for entry in batch:
                    _fail(entry, exc)
                batch = [entry for entry in batch if entry.done is None]
                delay = next(delays, None)
                if delay is None:
                    self._give_up(batch, exc)
                    return
                if batch:
                    log.warning("committing %d decision(s) failed (%s); retrying", len(batch), type(exc).__name__)
                    await asyncio.sleep(delay)
            else:
                self.commits += 1
                for entry in batch:
                    self.committed += len(entry.decisions)
                    _succeed(entry)
                return

    def _rows(self, entry: _Entry) -> bool:
        """Build the entry's rows here, off the caller's path; whether they could be built."""
        if entry.rows or (entry.also and not entry.decisions):
            return True
        if not entry.decisions:  # nothing to write (``record`` and ``record_unit`` queue none such)
            _succeed(entry)
            return False
        try:
            entry.rows = [
                decision_row(
                    d,
                    tenant=entry.tenant,
                    digest=part.digest,
                    state_text=part.state_text,
                    created_at=entry.created_at,
                )
                for part in entry.parts
                for d in part.decisions
            ]
            entry.answers = [row for d in entry.decisions for row in answer_rows(d)]
        except Exception as exc:  # a malformed decision fails its own caller, never its batch
            entry.rows = []
            self._give_up([entry], exc)
            return False
        return True

    def _give_up(self, entries: list[_Entry], exc: BaseException) -> None:
        for entry in entries:
            _fail(entry, exc)
        lost = [d.id for entry in entries if entry.done is None for d in entry.decisions]
        if lost:
            self.dropped += len(lost)
            # The error's name only: a database error's text carries the statement's parameters, the state among them.
            log.error(
                "dropped %d decision(s) the log could not commit (%s): %s",
                len(lost),
                type(exc).__name__,
                ", ".join(lost),
            )

    async def _commit(self, batch: list[_Entry]) -> None:
        rows = [row for entry in batch for row in entry.rows]
        answers = [row for entry in batch for row in entry.answers]
        # Inserts only: on SQLite a transaction whose first statement writes waits for the write
        # lock (busy_timeout) instead of failing the way a read-then-write transaction can.
        also = [row for entry in batch for row in entry.also]
        async with self._engine.begin() as connection:
            if rows:
                await connection.execute(insert(DecisionRow), rows)
                await add_rollups(connection, rows)
            if answers:
                await connection.execute(insert(AnswerRow), answers)
            for table, row in also:  # after the decisions: when theirs fail, none of these is stored
                await connection.execute(insert(table), [row])
