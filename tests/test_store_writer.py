"""The decision log's writer: batches, write-behind and group commit, flush and close, back-pressure, failures.

Against real databases (a SQLite file, and PostgreSQL when one is reachable). Commits are counted
with a SQLAlchemy event listener on the engine, and commits are held up with a real lock taken by
another connection, so nothing in the store is patched.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, replace
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from fastslow.api.store import DecisionStore, DecisionWriter, WriterClosed, upgrade
from fastslow.api.store._engine import create_store_engine
from fastslow.router import Decision

from fakes.databases import commits_blocked, database_url, postgres_schema_url  # noqa: F401  (fixtures)


def a_decision(**changes: Any) -> Decision:
    fields: dict[str, Any] = {
        "task": "triage",
        "question": "triage",
        "outcome": "billing",
        "system": 1,
        "reason": "confident",
        "confidence": 0.875,
        "threshold": 0.7,
        "probabilities": {"billing": 0.875, "tech": 0.1, "other": 0.025},
        "policy_version": "v3",
        "engine": "embedded",
        "model": "minilm",
        "latency_ms": 12.5,
    }
    fields.update(changes)
    return Decision(**fields)


def count_commits(store: DecisionStore) -> list[int]:
    """A one-item list holding how many transactions the store's engine committed since this call."""
    commits = [0]

    def on_commit(_connection: Any) -> None:
        commits[0] += 1

    event.listen(store.engine.sync_engine, "commit", on_commit)
    return commits


async def wait_until(condition: Any, *, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def comparable(stored: Any) -> dict[str, Any]:
    fields = asdict(stored)
    del fields["id"], fields["created_at"]
    return fields


# -- batches -----------------------------------------------------------------------------------------


async def test_concurrent_write_behind_records_share_few_commits(store: DecisionStore) -> None:
    commits = count_commits(store)
    decisions = [a_decision(latency_ms=float(i)) for i in range(200)]

    await asyncio.gather(*(store.writer.record([d], tenant="acme", state={"i": i}) for i, d in enumerate(decisions)))
    await store.flush()

    assert commits[0] == store.writer.commits
    assert 1 <= commits[0] <= 10  # batches, not 200 commits
    assert store.writer.committed == 200 and store.writer.pending == 0
    for i, decision in enumerate(decisions):
        stored = await store.get(decision.id, tenant="acme")
        assert stored is not None and stored.latency_ms == float(i)


async def test_batches_never_exceed_the_batch_size(database_url: str) -> None:  # noqa: F811
    async with await DecisionStore.open(database_url, batch=8) as store:
        commits = count_commits(store)
        await asyncio.gather(*(store.writer.record([a_decision()], tenant="acme", state=i) for i in range(40)))
        await store.flush()
        assert commits[0] >= 5 and store.writer.committed == 40


async def test_a_lone_durable_record_is_committed_alone_and_readable_on_return(store: DecisionStore) -> None:
    commits = count_commits(store)
    decision = a_decision()

    await store.writer.record([decision], tenant="acme", state="s", durable=True)

    assert commits[0] == 1 and store.writer.pending == 0
    assert await store.get(decision.id, tenant="acme") is not None


async def test_each_durable_caller_returns_once_its_own_decision_is_committed(store: DecisionStore) -> None:
    commits = count_commits(store)

    async def caller(i: int) -> bool:
        decision = a_decision(latency_ms=float(i))
        await store.writer.record([decision], tenant="acme", state={"i": i}, durable=True)
        stored = await store.get(decision.id, tenant="acme")  # readable at once: committed, not queued
        return stored is not None and stored.latency_ms == float(i)

    readable = await asyncio.gather(*(caller(i) for i in range(50)))

    assert all(readable)
    assert commits[0] < 25  # group commit: callers shared transactions


# -- content -----------------------------------------------------------------------------------------


async def test_every_field_round_trips_as_a_direct_record_does(store: DecisionStore) -> None:
    full = a_decision(
        system=2,
        reason="escalated",
        escalate=True,
        verdict="review",
        detail="asked System 2",
        cost_usd=0.0125,
        audit=True,
        audit_rate=0.05,
        examples_version="ex-7",
        probabilities={"billing": 0.5, "tech": 0.5},
    )
    direct, written = full, replace(full, id="written-" + full.id)
    state = {"ticket": "t-1", "text": "ünïcode"}

    await store.record(direct, tenant="acme", state=state, store_state=True)
    await store.writer.record([written], tenant="acme", state=state, store_state=True)
    await store.flush()

    first, second = await store.get(direct.id, tenant="acme"), await store.get(written.id, tenant="acme")
    assert first is not None and second is not None
    assert comparable(second) == comparable(first)
    assert second.state_text is not None and second.answers == {"billing": 0.5, "tech": 0.5}


async def test_write_behind_keeps_order_and_the_state_as_it_was_when_recorded(store: DecisionStore) -> None:
    state: dict[str, Any] = {"n": 0}
    decisions = [a_decision(latency_ms=float(i)) for i in range(30)]
    for i, decision in enumerate(decisions):
        state["n"] = i
        await store.writer.record([decision], tenant="acme", state=state, store_state=True)
    state["n"] = "changed after recording"
    await store.flush()

    stored = [await store.get(d.id, tenant="acme") for d in decisions]
    assert all(s is not None for s in stored)
    assert [s.state_text for s in stored if s is not None] == [f'{{"n":{i}}}' for i in range(30)]
    times = [s.created_at for s in stored if s is not None]
    assert times == sorted(times)


async def test_a_checks_decisions_commit_together(store: DecisionStore) -> None:
    commits = count_commits(store)
    rules = [a_decision(task="tool_safety", question=q) for q in ("secrets", "egress", "shell")]

    await store.sink("acme").record_many(rules, state="git status")  # type: ignore[attr-defined]

    assert commits[0] == 1
    assert [await store.get(d.id, tenant="acme") is not None for d in rules] == [True, True, True]


async def test_the_write_behind_sink_queues_system_1_and_commits_system_2_before_returning(
    store: DecisionStore,
) -> None:
    sink = store.sink("acme", write_behind=True)
    fast, escalated = a_decision(), a_decision(system=2, reason="escalated", model="gpt")

    await sink.record(fast, state="s")
    assert store.writer.pending == 1  # queued; nothing awaited the commit

    await sink.record(escalated, state="s")  # waits for its batch, and so for everything before it
    assert store.writer.pending == 0
    assert await store.get(escalated.id, tenant="acme") is not None
    assert await store.get(fast.id, tenant="acme") is not None


# -- flush and close ---------------------------------------------------------------------------------


async def test_aclose_commits_everything_queued_then_refuses_more(database_url: str) -> None:  # noqa: F811
    store = await DecisionStore.open(database_url)
    sink = store.sink("acme", write_behind=True)
    decisions = [a_decision(latency_ms=float(i)) for i in range(300)]
    for i, decision in enumerate(decisions):
        await sink.record(decision, state={"i": i})
    assert store.writer.pending > 0

    await store.aclose()

    with pytest.raises(WriterClosed):
        await sink.record(a_decision(), state="late")
    async with await DecisionStore.open(database_url, migrate=False) as reopened:
        found = [await reopened.get(d.id, tenant="acme") for d in decisions]
    assert all(f is not None for f in found)


# -- back-pressure -----------------------------------------------------------------------------------


async def test_producers_beyond_the_queue_wait_for_room_while_commits_are_blocked(
    database_url: str,  # noqa: F811
) -> None:
    async with await DecisionStore.open(database_url, queue=4, batch=1) as store:
        decisions = [a_decision() for _ in range(10)]
        with commits_blocked(database_url):
            producers = [asyncio.create_task(store.writer.record([d], tenant="acme", state="s")) for d in decisions]
            # One entry is in flight (its insert waits for the lock) and four fill the queue.
            await wait_until(lambda: sum(p.done() for p in producers) == 5)
            await asyncio.sleep(0.2)  # time for a producer to get past the bound, were it not held
            assert sum(p.done() for p in producers) == 5
            assert store.writer.pending == 5  # the queue's 4 and the 1 in flight: memory stays bounded
            assert await store.get(decisions[0].id, tenant="acme") is None
        await asyncio.gather(*producers)
        await store.flush()
        assert store.writer.committed == 10 and store.writer.dropped == 0


# -- failures ----------------------------------------------------------------------------------------


async def test_a_failed_batch_raises_to_every_durable_waiter_and_the_writer_carries_on(
    database_url: str,  # noqa: F811
) -> None:
    engine = create_store_engine(database_url)  # no migrations yet: every insert fails
    writer = DecisionWriter(engine, retry_delays_s=(0.01, 0.01))
    try:
        durable = [writer.record([a_decision()], tenant="acme", state=i, durable=True) for i in range(5)]
        behind = writer.record([a_decision()], tenant="acme", state="behind")
        results = await asyncio.gather(*durable, behind, return_exceptions=True)
        assert all(isinstance(r, SQLAlchemyError) for r in results[:5])
        assert results[5] is None  # write-behind: queued, then retried and dropped
        await writer.flush()
        assert writer.dropped == 1 and writer.committed == 0

        await asyncio.to_thread(upgrade, database_url)
        decision = a_decision()
        await writer.record([decision], tenant="acme", state="after", durable=True)
        assert writer.committed == 1
    finally:
        await writer.aclose()
        await engine.dispose()
    async with await DecisionStore.open(database_url, migrate=False) as store:
        assert await store.get(decision.id, tenant="acme") is not None


async def test_a_refused_decision_fails_only_its_own_caller(store: DecisionStore) -> None:
    taken = a_decision()
    await store.record(taken, tenant="acme", state="s")
    innocent = [a_decision() for _ in range(4)]

    results = await asyncio.gather(
        store.writer.record([replace(taken)], tenant="acme", state="s", durable=True),
        *(store.writer.record([d], tenant="acme", state="s", durable=True) for d in innocent),
        return_exceptions=True,
    )

    assert isinstance(results[0], IntegrityError)  # its id was recorded already
    assert results[1:] == [None] * 4
    assert all([await store.get(d.id, tenant="acme") is not None for d in innocent])


# -- sync callers, from their own threads ------------------------------------------------------------


async def test_threads_queue_without_waiting_once_the_writer_runs(store: DecisionStore) -> None:
    writer = store.writer
    # Before the writer has a loop, a thread cannot reach it: the caller records through the loop.
    assert not writer.record_from_thread([a_decision()], tenant="acme", state="early")
    await writer.record([a_decision()], tenant="acme", state="first")
    decisions = [a_decision(latency_ms=float(i)) for i in range(50)]
    queued = await asyncio.gather(
        *(
            asyncio.to_thread(writer.record_from_thread, [d], tenant="acme", state={"i": i})
            for i, d in enumerate(decisions)
        )
    )
    assert all(queued)
    await store.flush()
    for i, decision in enumerate(decisions):
        stored = await store.get(decision.id, tenant="acme")
        assert stored is not None and stored.latency_ms == float(i)


async def test_a_full_queue_or_a_closed_writer_sends_threads_back_to_the_loop(database_url: str) -> None:  # noqa: F811
    store = await DecisionStore.open(database_url, queue=2, batch=1)
    writer = store.writer
    with commits_blocked(database_url):
        await writer.record([a_decision()], tenant="acme", state="in flight")
        await wait_until(lambda: writer.pending == 1 and writer._queue.empty())
        await writer.record([a_decision()], tenant="acme", state="queued 1")
        await writer.record([a_decision()], tenant="acme", state="queued 2")
        # Full: a thread would have to wait for room, which only the loop's ``record`` does.
        assert not await asyncio.to_thread(writer.record_from_thread, [a_decision()], tenant="acme", state="x")
    await store.flush()
    assert writer.committed == 3
    await store.aclose()
    assert not writer.record_from_thread([a_decision()], tenant="acme", state="late")


async def test_the_sink_queues_from_threads_only_what_it_would_not_wait_for(store: DecisionStore) -> None:
    await store.writer.record([a_decision()], tenant="acme", state="start")
    behind, durable = store.sink("acme", write_behind=True), store.sink("acme")
    assert await asyncio.to_thread(behind.record_from_thread, [a_decision()], state="s")
    assert not await asyncio.to_thread(behind.record_from_thread, [a_decision(system=2)], state="s")
    assert not await asyncio.to_thread(durable.record_from_thread, [a_decision()], state="s")
