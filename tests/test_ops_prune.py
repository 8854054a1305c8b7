"""Retention of the decision log: ``DecisionStore.prune`` and ``fastslow db prune``, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select, update
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.store import DecisionStore, PruneCounts, retention_cutoff
from fastslow.api.store._models import AnswerRow, DecisionRow, LearnedExampleRow, OutcomeRow
from fastslow.router import Decision, Settings
from fastslow.router.settings import StoreSettings

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

runner = CliRunner()
NOW = datetime.now(UTC)


def a_decision(decision_id: str) -> Decision:
    return Decision(
        id=decision_id,
        task="triage",
        question="triage",
        outcome="billing",
        system=1,
        reason="confident",
        confidence=0.875,
        threshold=0.7,
        probabilities={"billing": 0.875, "tech": 0.125},
        policy_version="v1",
        engine="embedded",
        model="minilm",
        latency_ms=1.0,
    )


async def seed(store: DecisionStore, tenant: str, ages_days: dict[str, float], *, outcomes: bool = True) -> None:
    """One decision per id, made ``ages_days[id]`` days ago, each with two answers and (by default) an outcome."""
    for decision_id, age in ages_days.items():
        await store.record(a_decision(decision_id), tenant=tenant, state=f"text of {decision_id}", store_state=True)
        if outcomes:
            assert await store.record_outcome(decision_id, tenant=tenant, label="billing") is not None
        async with store.engine.begin() as connection:
            await connection.execute(
                update(DecisionRow).where(DecisionRow.id == decision_id).values(created_at=NOW - timedelta(days=age))
            )


async def counts(store: DecisionStore) -> dict[str, int]:
    async with store.engine.connect() as connection:
        return {
            row.__tablename__: int(await connection.scalar(select(func.count()).select_from(row)) or 0)
            for row in (DecisionRow, AnswerRow, OutcomeRow, LearnedExampleRow)
        }


async def ids(store: DecisionStore) -> set[str]:
    async with store.engine.connect() as connection:
        return set((await connection.scalars(select(DecisionRow.id))).all())


async def test_decisions_before_the_cut_go_with_their_answers_and_outcomes(store: DecisionStore) -> None:
    await seed(store, "acme", {"old-1": 40, "old-2": 31, "new": 1})
    learned = await store.learned.add(
        task="triage",
        question="triage",
        option="billing",
        text="text of old-1",
        source="outcome",
        tenant="acme",
        decision_id="old-1",
        max_examples=100,
    )
    assert learned == "added"
    key, _ = await store.create_key("acme")

    report = await store.prune(NOW - timedelta(days=30))

    assert await ids(store) == {"new"}
    total = report.total
    assert (total.decisions, total.answers, total.outcomes, total.learned_unlinked) == (2, 4, 2, 1)
    assert await counts(store) == {"decisions": 1, "answers": 2, "outcomes": 1, "learned_examples": 1}
    # The learned example and the API key are not the log's to delete; the example is only unlinked.
    (example,) = await store.learned.list(None)
    assert example.text == "text of old-1" and example.decision_id is None
    assert await store.authenticate(key) is not None
    assert await store.get("new", tenant="acme") is not None


async def test_retention_is_per_tenant_with_an_override(store: DecisionStore) -> None:
    ages = {"40d": 40, "10d": 10, "1d": 1}
    for tenant in ("acme", "beta", "gamma"):
        await seed(store, tenant, {f"{tenant}-{name}": age for name, age in ages.items()}, outcomes=False)
    retention = StoreSettings(retention_days=30, tenant_retention_days={"acme": 7, "gamma": 0})

    report = await store.prune(retention_cutoff(retention, NOW))

    assert await ids(store) == {"acme-1d", "beta-10d", "beta-1d", "gamma-40d", "gamma-10d", "gamma-1d"}
    assert {tenant: c.decisions for tenant, c in report.tenants.items()} == {"acme": 2, "beta": 1, "gamma": 0}
    assert report.cutoffs["gamma"] is None  # 0 days: that tenant's decisions are kept forever


async def test_tenant_limits_the_prune_to_that_tenant(store: DecisionStore) -> None:
    await seed(store, "acme", {"acme-old": 40}, outcomes=False)
    await seed(store, "beta", {"beta-old": 40}, outcomes=False)

    report = await store.prune(NOW, tenant="beta")

    assert await ids(store) == {"acme-old"}
    assert list(report.tenants) == ["beta"]


async def test_a_dry_run_counts_what_would_go_and_deletes_nothing(store: DecisionStore) -> None:
    await seed(store, "acme", {"old": 40, "new": 1})
    before = await counts(store)

    report = await store.prune(NOW - timedelta(days=30), dry_run=True)

    assert report.dry_run
    assert (report.total.decisions, report.total.answers, report.total.outcomes) == (1, 2, 1)
    assert await counts(store) == before


async def test_deletion_goes_in_bounded_batches_each_committed(store: DecisionStore) -> None:
    await seed(store, "acme", {f"old-{n}": 40 + n for n in range(5)}, outcomes=False)
    batches: list[tuple[str, PruneCounts]] = []

    report = await store.prune(NOW, batch=2, on_batch=lambda tenant, c: batches.append((tenant, c)))

    assert [c.decisions for _, c in batches] == [2, 2, 1]
    assert {tenant for tenant, _ in batches} == {"acme"}
    assert report.total.decisions == 5 and await ids(store) == set()
    with pytest.raises(ValueError, match="batch"):
        await store.prune(NOW, batch=0)


# -- the command ---------------------------------------------------------------------------------------


def _seed_through_settings(url: str) -> None:
    async def go() -> None:
        async with await DecisionStore.open(url) as opened:
            await seed(opened, "acme", {"acme-old": 40, "acme-new": 1})
            await seed(opened, "beta", {"beta-old": 40})

    asyncio.run(go())


def _left(url: str) -> set[str]:
    async def go() -> set[str]:
        async with await DecisionStore.open(url, migrate=False) as opened:
            return await ids(opened)

    return asyncio.run(go())


def test_db_prune_before_a_date_with_dry_run_and_tenant(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    _seed_through_settings(database_url)
    cut = (NOW - timedelta(days=30)).date().isoformat()

    dry = runner.invoke(app, ["db", "prune", "--before", cut, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would delete 2 decision(s), 4 answer(s), 2 outcome(s)" in dry.stderr
    assert _left(database_url) == {"acme-old", "acme-new", "beta-old"}

    only_beta = runner.invoke(app, ["db", "prune", "--before", cut, "--tenant", "beta"])
    assert only_beta.exit_code == 0, only_beta.output
    assert "deleted 1 decision(s), 2 answer(s), 1 outcome(s)" in only_beta.stderr
    assert "beta" in only_beta.stdout and "acme" not in only_beta.stdout
    assert _left(database_url) == {"acme-old", "acme-new"}


def test_db_prune_uses_each_tenants_retention(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    monkeypatch.setenv("FASTSLOW_STORE__RETENTION_DAYS", "30")
    monkeypatch.setenv("FASTSLOW_STORE__TENANT_RETENTION_DAYS", json.dumps({"beta": 0}))
    _seed_through_settings(database_url)

    result = runner.invoke(app, ["db", "prune"])

    assert result.exit_code == 0, result.output
    assert _left(database_url) == {"acme-new", "beta-old"}
    assert "kept forever" in result.stdout  # beta's row of the summary


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["db", "prune", "--before", "last tuesday"], {}, "--before: not a date or an ISO 8601 time"),
        (["db", "prune", "--before", "2026-01-01", "--tenant", " "], {}, "--tenant: must not be empty"),
        (["db", "prune"], {"FASTSLOW_STORE__RETENTION_DAYS": "-1"}, "settings:"),
    ],
)
def test_db_prune_mistakes_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]


def test_retention_settings_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_STORE__RETENTION_DAYS", "90")
    monkeypatch.setenv("FASTSLOW_STORE__TENANT_RETENTION_DAYS", '{"Acme": 7, "archive": 0}')
    store = Settings().store
    assert store.retention_days == 90 and store.tenant_retention_days == {"Acme": 7, "archive": 0}
    cutoff = retention_cutoff(store, NOW)
    assert cutoff("Acme") == NOW - timedelta(days=7)
    assert cutoff("other") == NOW - timedelta(days=90)
    assert cutoff("archive") is None
    assert retention_cutoff(StoreSettings(), NOW)("anyone") is None  # the default keeps everything
