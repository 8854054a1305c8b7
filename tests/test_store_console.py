"""What the console reads from the log: hourly rollups kept as decisions are written, the summary
built from them, keyset pages of decisions, and migration 0006 both ways (with its backfill)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import func, select, text, update

from fastslow.api.store import DecisionFilter, DecisionStore, upgrade
from fastslow.api.store._engine import _sync_engine, alembic_config
from fastslow.api.store._models import DecisionRow, RollupRow
from fastslow.api.store._rollup import bucket_upper_ms, latency_bucket
from fastslow.router import Decision

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)


def a_decision(**changes: object) -> Decision:
    fields: dict[str, object] = {
        "task": "triage",
        "question": "triage",
        "outcome": "billing",
        "system": 1,
        "reason": "confident",
        "confidence": 0.875,
        "threshold": 0.7,
        "probabilities": {"billing": 0.875, "tech": 0.125},
        "policy_version": "v1",
        "engine": "embedded",
        "model": "e5",
        "latency_ms": 10.0,
    }
    fields.update(changes)
    return Decision(**fields)  # type: ignore[arg-type]


def test_latency_buckets_hold_their_values_within_twenty_percent() -> None:
    for ms in (0.05, 1.0, 7.3, 23.0, 250.0, 1999.0, 60_000.0):
        upper = bucket_upper_ms(latency_bucket(ms))
        assert ms <= upper < ms * 1.2 + 1e-9
    assert latency_bucket(0.0) == latency_bucket(-1.0) == latency_bucket(1e-9)


async def test_the_summary_counts_what_was_written_through_every_path(store: DecisionStore) -> None:
    since = datetime.now(UTC) - timedelta(hours=1)
    # Direct record, the group-commit sink and a request's unit: all three keep the rollups.
    await store.record(a_decision(latency_ms=10.0), tenant="acme", state="a")
    sink = store.sink("acme")
    await sink.record(a_decision(latency_ms=30.0), state="b")
    await sink.record(
        a_decision(system=2, reason="low_confidence", escalate=True, cost_usd=0.02, engine="openai", latency_ms=900.0),
        state="c",
    )
    await sink.record(a_decision(task="tool_safety", verdict="review", policy_version="v2"), state="d")
    await store.record(a_decision(), tenant="other", state="e")  # another tenant's never counts

    summary = await store.summary(tenant="acme", since=since)
    assert (summary.decisions, summary.kept) == (4, 2)
    assert summary.escalations == {"low_confidence": 1, "review": 1}  # a review verdict is its own reason
    assert (summary.system2_calls, summary.system2_costed) == (1, 1)
    assert summary.system2_cost_usd == pytest.approx(0.02)
    assert summary.saved_usd == pytest.approx(2 * 0.02)  # each kept decision is a System-2 call not made
    latency = {f.engine: f for f in summary.latency}
    assert latency["embedded"].decisions == 3 and latency["openai"].decisions == 1
    assert 10.0 <= latency["embedded"].p50_ms < 12.0 and 30.0 <= latency["embedded"].p99_ms < 36.0
    # Both versions were first seen this hour: the summary says which versions decided, and when.
    assert {v.version: v.decisions for v in summary.policy_versions} == {"v1": 3, "v2": 1}
    assert sum(h.decisions for h in summary.hours) == 4

    triage = await store.summary(tenant="acme", task="triage", since=since)
    assert (triage.decisions, triage.kept, triage.escalations) == (3, 2, {"low_confidence": 1})
    assert await store.summary_tasks(tenant="acme") == ["tool_safety", "triage"]
    assert (await store.summary(tenant="acme", since=datetime.now(UTC) + timedelta(hours=2))).decisions == 0


async def test_pages_walk_the_log_newest_first_by_cursor_and_filter(store: DecisionStore) -> None:
    ids = []
    for i in range(7):
        d = a_decision(reason="confident" if i % 2 else "low_confidence", audit=i == 3)
        ids.append(d.id)
        await store.record(d, tenant="acme", state=f"s{i}")
    await store.record(a_decision(), tenant="other", state="x")
    # Distinct times, so "newest first" has one answer.
    base = datetime(2026, 12, 1, tzinfo=UTC)
    async with store.engine.begin() as connection:
        for i, decision_id in enumerate(ids):
            await connection.execute(
                update(DecisionRow).where(DecisionRow.id == decision_id).values(created_at=base + timedelta(minutes=i))
            )
    await store.record_outcome(ids[5], tenant="acme", label="billing")

    seen: list[str] = []
    cursor = None
    while True:
        page = await store.decision_page(tenant="acme", after=cursor, limit=3)
        seen += [d.id for d in page.decisions]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == list(reversed(ids))

    confident = await store.decision_page(tenant="acme", where=DecisionFilter(reason="confident"), limit=10)
    assert [d.id for d in confident.decisions] == [ids[5], ids[3], ids[1]]
    labelled = await store.decision_page(tenant="acme", where=DecisionFilter(has_outcome=True), limit=10)
    assert [d.id for d in labelled.decisions] == [ids[5]] and labelled.with_outcome == {ids[5]}
    unlabelled = await store.decision_page(tenant="acme", where=DecisionFilter(has_outcome=False), limit=10)
    assert ids[5] not in {d.id for d in unlabelled.decisions} and len(unlabelled.decisions) == 6
    audited = await store.decision_page(tenant="acme", where=DecisionFilter(audit=True), limit=10)
    assert [d.id for d in audited.decisions] == [ids[3]]
    window = DecisionFilter(since=base + timedelta(minutes=2), until=base + timedelta(minutes=4))
    assert [d.id for d in (await store.decision_page(tenant="acme", where=window, limit=10)).decisions] == [
        ids[3],
        ids[2],
    ]
    with pytest.raises(ValueError, match="cursor"):
        await store.decision_page(tenant="acme", after="not-a-cursor")

    # A filter no index selects searches a bounded window per page, then goes on from its end.
    rare = DecisionFilter(has_outcome=True)
    first = await store.decision_page(tenant="acme", where=rare, limit=10, window=1)
    assert (first.decisions, first.window_ended) == ([], True) and first.next_cursor is not None
    walked, cursor, views = [], None, 0
    while True:
        page = await store.decision_page(tenant="acme", where=rare, after=cursor, limit=10, window=2)
        walked += [d.id for d in page.decisions]
        views += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert walked == [ids[5]] and views == 4  # 7 decisions, 2 a view


async def test_concurrent_writers_add_to_one_hour_without_losing_counts(store: DecisionStore) -> None:
    import asyncio

    sinks = [store.sink("acme") for _ in range(4)]
    await asyncio.gather(*(s.record(a_decision(), state=str(i)) for i, s in enumerate(sinks * 10)))
    async with store.engine.connect() as connection:
        total = await connection.scalar(select(func.sum(RollupRow.decisions)).where(RollupRow.tenant == "acme"))
    assert total == 40


def test_migration_0006_backfills_rollups_and_runs_both_ways(database_url: str) -> None:  # noqa: F811
    engine = _sync_engine(database_url)  # makes a SQLite file's folder, as the store does
    try:
        with engine.connect() as connection:
            command.upgrade(alembic_config(connection), "0005")
        with engine.begin() as connection:
            for i in range(3):
                connection.execute(
                    text(
                        "INSERT INTO decisions (id, tenant, task, question, system, reason, escalate, confidence,"
                        " threshold, policy_version, engine, model, latency_ms, detail, state_digest,"
                        " created_at, audit)"
                        " VALUES (:id, 'acme', 'triage', 'triage', 1, :reason, :esc, 0.9, 0.7, 'v1', 'embedded', 'e5',"
                        " 12.0, '', 'x', :at, false)"
                    ),
                    {
                        "id": f"{i:032x}",
                        "reason": "confident" if i else "low_confidence",
                        "esc": i == 0,
                        "at": datetime(2026, 12, 1, 10, 5 * i, tzinfo=UTC).replace(tzinfo=None)
                        if engine.dialect.name == "sqlite"
                        else datetime(2026, 12, 1, 10, 5 * i, tzinfo=UTC),
                    },
                )
        upgrade(database_url)
        with engine.connect() as connection:
            rows = connection.execute(
                text("SELECT kept, decisions FROM decision_rollups WHERE tenant = 'acme' ORDER BY kept")
            ).all()
            assert [(bool(k), n) for k, n in rows] == [(False, 1), (True, 2)]
            assert connection.execute(text("SELECT scopes FROM api_keys")).all() == []
        with engine.connect() as connection:
            command.downgrade(alembic_config(connection), "0005")
        with engine.connect() as connection:
            names = set(connection.dialect.get_table_names(connection))
            assert "reviews" not in names and "decision_rollups" not in names and "decisions" in names
        upgrade(database_url)
    finally:
        engine.dispose()


async def test_pruning_a_decision_takes_its_review_and_keeps_the_rollups(store: DecisionStore) -> None:
    from fastslow.api.store import ReviewDraft

    decision = a_decision(task="tool_safety", verdict="review")
    await store.record(decision, tenant="acme", state="rm -rf /")
    draft = ReviewDraft(
        tenant="acme",
        decision_id=decision.id,
        source="api",
        task="tool_safety",
        rule="destructive",
        subject={"text": "rm -rf /"},
        probabilities={"destructive": 0.4},
        probability=0.4,
        policy_version="v1",
    )
    review = await store.open_review(draft, ttl_s=60)
    assert (await store.get_review(review.id, tenant="acme")) is not None
    report = await store.prune(datetime.now(UTC) + timedelta(seconds=1))
    assert report.total.decisions == 1
    assert await store.get_review(review.id, tenant="acme") is None
    summary = await store.summary(tenant="acme", since=datetime.now(UTC) - timedelta(hours=1))
    assert summary.decisions == 1  # counts outlive the rows they count
