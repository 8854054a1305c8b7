"""The learned examples' table: what tasks learned from escalations and outcomes, shared by replicas.

Every rule that keeps a wrong example out is enforced here, inside the transaction that writes it,
so that replicas learning at once agree: one row per task, question and text; a recorded outcome
outranks System 2; a text System 2 answered two ways is withdrawn; an example whose decision has
an outcome saying it was wrong is never added, and is withdrawn when that outcome comes later; a
question holds at most ``max_examples``, the oldest System-2 ones leaving first.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, TypeAlias

from sqlalchemy import Exists, and_, case, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ._codec import clean
from ._models import LearnedExampleRow, OutcomeRow

__all__ = ["LearnOutcome", "LearnSource", "LearnedExample", "LearnedExamples"]

LearnSource: TypeAlias = Literal["system2", "outcome"]
LearnOutcome: TypeAlias = Literal["added", "relabelled", "duplicate", "refused", "withdrawn"]
"""What ``add`` did: a new (or revived) example, a new label for a known text, nothing (already
known, or refused: outranked or contradicted), or the text withdrawn (System 2 answered it two ways)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedExample:
    id: str
    task: str
    question: str
    option: str
    text: str
    source: LearnSource
    decision_id: str | None
    tenant: str
    created_at: datetime
    updated_at: datetime
    retracted_at: datetime | None
    retracted_why: str | None


_EVICTED = "over max_examples"


def _now() -> datetime:
    return datetime.now(UTC)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _example(row: LearnedExampleRow) -> LearnedExample:
    return LearnedExample(
        id=row.id,
        task=row.task,
        question=row.question,
        option=row.option,
        text=row.text,
        source="outcome" if row.source == "outcome" else "system2",
        decision_id=row.decision_id,
        tenant=row.tenant,
        created_at=row.created_at,
        updated_at=row.updated_at,
        retracted_at=row.retracted_at,
        retracted_why=row.retracted_why,
    )


def _contradicted(decision_id: str, option: str) -> Exists:
    """An outcome of ``decision_id`` saying ``option`` is wrong: another label, or System 2 judged wrong."""
    return (
        select(OutcomeRow.id)
        .where(
            OutcomeRow.decision_id == decision_id,
            or_(and_(OutcomeRow.label.is_not(None), OutcomeRow.label != option), OutcomeRow.system2_correct.is_(False)),
        )
        .exists()
    )


class LearnedExamples:
    """The ``learned_examples`` table (``DecisionStore.learned``)."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], dialect: str) -> None:
        self._sessions = sessions
        self._dialect = dialect

    async def add(
        self,
        *,
        task: str,
        question: str,
        option: str,
        text: str,
        source: LearnSource,
        tenant: str,
        decision_id: str | None,
        max_examples: int,
    ) -> LearnOutcome:
        """Learn that ``text`` is ``option`` for ``question``; committed when this returns."""
        text, option = clean(text), clean(option)
        digest, now = text_hash(text), _now()
        values: dict[str, object] = {
            "id": uuid.uuid4().hex,
            "task": task,
            "question": question,
            "option": option,
            "text": text,
            "text_hash": digest,
            "source": source,
            "decision_id": decision_id,
            "tenant": clean(tenant),
            "created_at": now,
            "updated_at": now,
        }
        insert = postgresql.insert if self._dialect == "postgresql" else sqlite.insert
        # Write first: on SQLite a transaction that reads before it writes can fail outright when
        # another writer commits in between; a write first waits for the lock instead.
        statement = insert(LearnedExampleRow).values(values).on_conflict_do_nothing().returning(LearnedExampleRow.id)
        async with self._sessions() as session:
            try:
                inserted = (await session.execute(statement)).scalar() is not None
            except IntegrityError:  # a decision the log does not hold: nothing to tie the example to
                await session.rollback()
                return "refused"
            result: LearnOutcome = "added"
            if not inserted:
                result = await self._known(session, values, source)
            if result in ("added", "relabelled") and source == "system2" and decision_id is not None:
                if await session.scalar(select(_contradicted(decision_id, option))):
                    await session.rollback()
                    return "refused"
            if result in ("added", "relabelled"):
                await self._bound(session, task, question, max_examples, now)
            await session.commit()
        return result

    async def _known(self, session: AsyncSession, values: dict[str, object], source: LearnSource) -> LearnOutcome:
        """The rules for a text already in the table (its row is locked by the write that follows)."""
        key = (
            LearnedExampleRow.task == values["task"],
            LearnedExampleRow.question == values["question"],
            LearnedExampleRow.text_hash == values["text_hash"],
        )
        row = await session.scalar(select(LearnedExampleRow).where(*key).with_for_update())
        if row is None:  # withdrawn and deleted in between: nothing to add to
            return "refused"
        option, now = values["option"], values["updated_at"]
        relabel = {"option": option, "source": source, "decision_id": values["decision_id"], "updated_at": now}
        if row.retracted_at is not None:
            evicted = (row.retracted_why or "").startswith(_EVICTED)
            if source == "system2" and not evicted:
                return "refused"  # withdrawn as wrong or as answered two ways: only a label brings it back
            await session.execute(
                update(LearnedExampleRow)
                .where(*key)
                .values(**relabel, tenant=values["tenant"], retracted_at=None, retracted_why=None)
            )
            return "added"
        if row.option == option:
            if source == "outcome" and row.source != "outcome":
                await session.execute(update(LearnedExampleRow).where(*key).values(source="outcome", updated_at=now))
            return "duplicate"
        if source == "outcome":
            await session.execute(update(LearnedExampleRow).where(*key).values(**relabel))
            return "relabelled"
        if row.source == "outcome":
            return "refused"  # a recorded label outranks System 2
        why = f"System 2 answered this text both {row.option!r} and {option!r}"
        await session.execute(update(LearnedExampleRow).where(*key).values(retracted_at=now, retracted_why=why))
        return "withdrawn"

    async def _bound(self, session: AsyncSession, task: str, question: str, max_examples: int, now: datetime) -> None:
        """Withdraw the question's examples beyond ``max_examples``: System 2's before outcomes, oldest first."""
        active = (
            LearnedExampleRow.task == task,
            LearnedExampleRow.question == question,
            LearnedExampleRow.retracted_at.is_(None),
        )
        count = await session.scalar(select(func.count()).select_from(LearnedExampleRow).where(*active))
        excess = int(count or 0) - max_examples
        if excess <= 0:
            return
        order = (case((LearnedExampleRow.source == "outcome", 1), else_=0), LearnedExampleRow.updated_at)
        ids = list(await session.scalars(select(LearnedExampleRow.id).where(*active).order_by(*order).limit(excess)))
        why = f"{_EVICTED} ({max_examples})"
        await session.execute(
            update(LearnedExampleRow).where(LearnedExampleRow.id.in_(ids)).values(retracted_at=now, retracted_why=why)
        )

    async def withdraw_from(self, decision_id: str, *, why: str, keep_option: str | None = None) -> int:
        """Withdraw what was learned from ``decision_id`` (its outcome says it was wrong); how many were.

        ``keep_option``: an example with this option stays (the outcome's own label).
        """
        query = update(LearnedExampleRow).where(
            LearnedExampleRow.decision_id == decision_id, LearnedExampleRow.retracted_at.is_(None)
        )
        if keep_option is not None:
            query = query.where(LearnedExampleRow.option != keep_option)
        async with self._sessions.begin() as session:
            result = await session.execute(query.values(retracted_at=_now(), retracted_why=clean(why)))
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def withdraw(self, example_id: str, *, why: str) -> bool:
        """Withdraw one example by its id (an operator's call); ``True`` when it was in force."""
        async with self._sessions.begin() as session:
            result = await session.execute(
                update(LearnedExampleRow)
                .where(LearnedExampleRow.id == example_id, LearnedExampleRow.retracted_at.is_(None))
                .values(retracted_at=_now(), retracted_why=clean(why))
            )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def list(
        self, tasks: Iterable[str] | None = None, *, withdrawn: bool = False, limit: int = 1_000_000
    ) -> list[LearnedExample]:
        """The examples in force (and the withdrawn ones too, with ``withdrawn``), oldest first."""
        query = select(LearnedExampleRow)
        if tasks is not None:
            query = query.where(LearnedExampleRow.task.in_(sorted(set(tasks))))
        if not withdrawn:
            query = query.where(LearnedExampleRow.retracted_at.is_(None))
        query = query.order_by(LearnedExampleRow.created_at, LearnedExampleRow.id).limit(limit)
        async with self._sessions() as session:
            return [_example(row) for row in await session.scalars(query)]
