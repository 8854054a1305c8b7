"""``Idempotency-Key`` over HTTP: a retry records nothing twice, and a failed commit stores nothing.

Against the real app on loopback, System 1 a Jev fake that counts its calls, on SQLite and
PostgreSQL; the decision log's tables are counted directly.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from alembic import command
from pydantic import SecretStr
from sqlalchemy import create_engine, inspect, text
from typer.testing import CliRunner

from fastslow.api.cli import app as cli
from fastslow.api.store import (
    DecisionStore,
    IdempotencyKeyTaken,
    IdempotentRequest,
    Record,
    database_url_for,
    request_hash,
    upgrade,
)
from fastslow.api.store._engine import VERSION_TABLE, alembic_config, sync_url
from fastslow.router import Decision, Settings
from fastslow.router.settings import JevSettings, StoreSettings, System2Settings

from fakes.api_server import RunningApi, api_client, new_key, running_api, test_policy, test_settings
from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.jev_server import JevFakeServer, running_jev_server
from fakes.openai_server import openai_server, structured

CHECK = {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "ls /tmp"}}}
"""Two rules (destructive_action, data_exfiltration): two decisions, one engine call."""
TWO_POLICIES = {**CHECK, "policies": ["destructive_action", "data_exfiltration"]}
"""Two policies: two router calls, each recording its own decision, and still one commit."""
ROUTE = {"task": "support", "messages": [{"role": "user", "content": "my invoice is wrong"}]}


def _count(url: str, table: str, tenant: str) -> int:
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            query = f'SELECT count(*) FROM "{table}" WHERE tenant = :tenant'  # noqa: S608 - fixed names
            return int(connection.execute(text(query), {"tenant": tenant}).scalar_one())
    finally:
        engine.dispose()


def _outcomes(url: str, decision_id: str) -> int:
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            query = text("SELECT count(*) FROM outcomes WHERE decision_id = :id")
            return int(connection.execute(query, {"id": decision_id}).scalar_one())
    finally:
        engine.dispose()


def _engine_calls(engine: JevFakeServer) -> int:
    return sum(1 for r in engine.requests if r.method == "POST")


def _settings(tmp_path: Path, engine: JevFakeServer, url: str, **updates: Any) -> Settings:
    jev = JevSettings(base_url=engine.url, profile="jev", max_retries=0)
    return test_settings(tmp_path, engine="jev", jev=jev, database_url=url, **updates)


@asynccontextmanager
async def _served(tmp_path: Path, url: str, **updates: Any) -> AsyncIterator[tuple[RunningApi, JevFakeServer]]:
    async with running_jev_server("jev") as engine:
        with running_api(_settings(tmp_path, engine, url, **updates)) as api:
            yield api, engine


def _key() -> dict[str, str]:
    return {"Idempotency-Key": f"retry-{uuid.uuid4()}"}


async def test_a_check_retried_with_the_same_key_records_once_and_asks_once(tmp_path: Path, database_url: str) -> None:  # noqa: F811
    async with _served(tmp_path, database_url) as (api, engine):
        key = await api.key("acme")
        headers = _key()
        async with api_client(api.url, key) as client:
            first = await client.post("/v1/policy-check", json=CHECK, headers=headers)
            calls = _engine_calls(engine)
            again = await client.post("/v1/policy-check", json=CHECK, headers=headers)
    assert first.status_code == again.status_code == 200, first.text
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content  # the stored bytes: the same decision ids, verdicts and probabilities
    assert calls >= 1 and _engine_calls(engine) == calls  # the retry asked nobody
    assert _count(database_url, "decisions", "acme") == 2  # two rules, recorded once
    assert _count(database_url, "idempotency_keys", "acme") == 1


@pytest.mark.parametrize(
    ("path", "body", "decisions"),
    [("/v1/policy-check/batch", {"items": [CHECK, {**CHECK, "text": None}]}, 4), ("/v1/route", ROUTE, 1)],
)
async def test_the_batch_and_route_endpoints_take_a_key_too(
    tmp_path: Path, path: str, body: dict[str, Any], decisions: int
) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'log.sqlite3'}"
    async with _served(tmp_path, url) as (api, _engine):
        key = await api.key("acme")
        headers = _key()
        async with api_client(api.url, key) as client:
            first = await client.post(path, json=body, headers=headers)
            again = await client.post(path, json=body, headers=headers)
    assert first.status_code == 200, first.text
    assert again.status_code == 200 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert _count(url, "decisions", "acme") == decisions


async def test_an_outcome_retried_with_the_same_key_records_once(tmp_path: Path, database_url: str) -> None:  # noqa: F811
    async with _served(tmp_path, database_url) as (api, _engine):
        key = await api.key("acme")
        headers = _key()
        async with api_client(api.url, key) as client:
            check = (await client.post("/v1/policy-check", json=CHECK)).json()
            path = f"/v1/decisions/{check['decision_id']}/outcome"
            first = await client.post(path, json={"label": "deny", "note": "a person said so"}, headers=headers)
            again = await client.post(path, json={"label": "deny", "note": "a person said so"}, headers=headers)
            other = await client.post(path, json={"label": "allow"}, headers=headers)
    assert first.status_code == again.status_code == 201, first.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content  # the same outcome id
    assert _outcomes(database_url, check["decision_id"]) == 1
    assert other.status_code == 422 and other.json()["error"]["field"] == "Idempotency-Key"


async def test_a_key_reused_with_another_body_a_malformed_key_and_no_key(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'log.sqlite3'}"
    async with _served(tmp_path, url) as (api, _engine):
        key = await api.key("acme")
        headers = _key()
        async with api_client(api.url, key) as client:
            assert (await client.post("/v1/policy-check", json=CHECK, headers=headers)).status_code == 200
            reused = await client.post(
                "/v1/policy-check", json={**CHECK, "policies": ["destructive_action"]}, headers=headers
            )
            # Too long, not ASCII (sent as raw UTF-8 bytes), a control character.
            malformed: list[bytes] = [b"k" * 256, b"cl\xc3\xa9", b"tab\there"]
            bad = [
                await client.post("/v1/policy-check", json=CHECK, headers=[(b"Idempotency-Key", value)])
                for value in malformed
            ]
            plain = [await client.post("/v1/policy-check", json=CHECK) for _ in range(2)]
            # Another tenant's key space is its own: the same key is a new request there.
            other_key = await api.key("globex")
            async with api_client(api.url, other_key) as other:
                elsewhere = await other.post("/v1/policy-check", json=CHECK, headers=headers)
    assert reused.status_code == 422
    assert reused.json()["error"]["field"] == "Idempotency-Key"
    assert "reused with a different request" in reused.json()["error"]["message"]
    for response in bad:
        assert response.status_code == 422, response.text
        assert response.json()["error"]["field"] == "Idempotency-Key"
    assert all(r.status_code == 200 and "idempotent-replayed" not in r.headers for r in plain)
    assert plain[0].json()["decision_id"] != plain[1].json()["decision_id"]  # no key: two requests, two records
    assert _count(url, "decisions", "acme") == 2 + 2 * 2
    assert elsewhere.status_code == 200 and "idempotent-replayed" not in elsewhere.headers


@contextmanager
def _two_replicas(tmp_path: Path, engine: JevFakeServer, url: str) -> Iterator[tuple[RunningApi, RunningApi]]:
    with (
        running_api(_settings(tmp_path / "a", engine, url)) as one,
        running_api(_settings(tmp_path / "b", engine, url)) as two,
    ):
        yield one, two


async def test_concurrent_requests_with_one_key_on_two_replicas_record_once(tmp_path: Path, database_url: str) -> None:  # noqa: F811
    async with running_jev_server("jev") as engine:
        with _two_replicas(tmp_path, engine, database_url) as replicas:
            key = await new_key(replicas[0].settings, "acme")
            headers = _key()
            clients = [api_client(r.url, key) for r in replicas]
            try:
                responses = await asyncio.gather(
                    *(clients[n % 2].post("/v1/policy-check", json=CHECK, headers=headers) for n in range(8))
                )
            finally:
                for client in clients:
                    await client.aclose()
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    assert len({r.json()["decision_id"] for r in responses}) == 1  # every client got the one recorded answer
    assert len({tuple(rule["decision_id"] for rule in r.json()["rules"]) for r in responses}) == 1
    assert sum("idempotent-replayed" not in r.headers for r in responses) == 1
    assert _count(database_url, "decisions", "acme") == 2
    assert _count(database_url, "idempotency_keys", "acme") == 1
    # Within a replica the others waited for the first; across replicas both may have decided.
    assert 1 <= _engine_calls(engine) <= len(replicas)


_SQLITE_TRIGGER = """
CREATE TRIGGER fail_second_rule BEFORE INSERT ON decisions
WHEN EXISTS (SELECT 1 FROM decisions WHERE tenant = NEW.tenant)
BEGIN SELECT RAISE(ABORT, 'injected: the tenant''s second decision'); END
"""
_PG_TRIGGER = [
    """
    CREATE FUNCTION fail_second_rule() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM decisions WHERE tenant = NEW.tenant) THEN
            RAISE EXCEPTION 'injected: the tenant''s second decision';
        END IF;
        RETURN NEW;
    END $$
    """,
    "CREATE TRIGGER fail_second_rule BEFORE INSERT ON decisions FOR EACH ROW EXECUTE FUNCTION fail_second_rule()",
]


@contextmanager
def _second_decision_fails(url: str) -> Iterator[None]:
    """Inserting a tenant's second decision fails: the first row is written, and must be rolled back with it."""
    engine = create_engine(sync_url(url))
    postgres = engine.dialect.name == "postgresql"
    try:
        with engine.begin() as connection:
            for statement in _PG_TRIGGER if postgres else [_SQLITE_TRIGGER]:
                connection.execute(text(statement))
        yield
    finally:
        with engine.begin() as connection:
            connection.execute(text("DROP TRIGGER fail_second_rule" + (" ON decisions" if postgres else "")))
            if postgres:
                connection.execute(text("DROP FUNCTION fail_second_rule()"))
        engine.dispose()


async def test_a_failed_commit_stores_nothing_of_the_request_and_its_retry_records_once(
    tmp_path: Path,
    database_url: str,  # noqa: F811
) -> None:
    async with _served(tmp_path, database_url) as (api, _engine):
        key = await api.key("acme")
        headers = _key()
        async with api_client(api.url, key) as client:
            with _second_decision_fails(database_url):
                failed = await client.post("/v1/policy-check", json=TWO_POLICIES, headers=headers)
                assert _count(database_url, "decisions", "acme") == 0
                assert _count(database_url, "idempotency_keys", "acme") == 0
            retried = await client.post("/v1/policy-check", json=TWO_POLICIES, headers=headers)
            replayed = await client.post("/v1/policy-check", json=TWO_POLICIES, headers=headers)
    assert failed.status_code == 503, failed.text
    assert failed.json()["error"]["type"] == "store_unavailable"
    assert "nothing was recorded" in failed.json()["error"]["message"]
    assert retried.status_code == 200 and "idempotent-replayed" not in retried.headers
    assert replayed.headers["idempotent-replayed"] == "true" and replayed.json() == retried.json()
    assert _count(database_url, "decisions", "acme") == 2
    assert _count(database_url, "idempotency_keys", "acme") == 1


async def test_an_expired_key_is_a_new_request(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'log.sqlite3'}"
    async with _served(tmp_path, url, store=StoreSettings(idempotency_ttl_s=0.2)) as (api, _engine):
        key = await api.key("acme")
        headers = _key()
        async with api_client(api.url, key) as client:
            first = await client.post("/v1/policy-check", json=CHECK, headers=headers)
            await asyncio.sleep(0.3)
            later = await client.post("/v1/policy-check", json=CHECK, headers=headers)
    assert first.status_code == later.status_code == 200
    assert "idempotent-replayed" not in later.headers
    assert later.json()["decision_id"] != first.json()["decision_id"]
    assert _count(url, "decisions", "acme") == 4
    assert _count(url, "idempotency_keys", "acme") == 1  # the expired one was replaced


def _decision(task: str) -> Decision:
    return Decision(
        task=task,
        question=task,
        outcome="no",
        system=1,
        reason="confident",
        escalate=False,
        confidence=0.9,
        threshold=0.8,
        probabilities={"yes": 0.1, "no": 0.9},
        verdict="allow",
        policy_version="v1",
        engine="jev",
        model="fake",
        latency_ms=1.0,
    )


async def test_prune_removes_expired_keys(database_url: str) -> None:  # noqa: F811
    store = await DecisionStore.open(database_url)
    try:
        for name, ttl_s in (("soon", 0.01), ("later", 3600.0)):
            request = IdempotentRequest(
                tenant="acme", endpoint="policy-check", key=name, request_hash=request_hash({"n": name}), ttl_s=ttl_s
            )
            await store.record_unit(
                [Record(decisions=[_decision("tool_safety")], state={"text": name})],
                tenant="acme",
                idempotent=request,
                response=(200, b"{}"),
            )
        await asyncio.sleep(0.05)
        long_ago = datetime(2000, 1, 1, tzinfo=UTC)  # no decision is that old: only keys go
        dry = await store.prune(long_ago, dry_run=True)
        report = await store.prune(long_ago)
        again = await store.prune(long_ago)
    finally:
        await store.aclose()
    assert dry.expired_keys == 1 and report.expired_keys == 1 and again.expired_keys == 0
    assert report.total.decisions == 0
    assert _count(database_url, "idempotency_keys", "acme") == 1
    assert _count(database_url, "decisions", "acme") == 2


async def test_a_second_commit_of_one_key_is_refused_whole(database_url: str) -> None:  # noqa: F811
    # What the replica that lost a race sees: its decisions are not stored, and it replays the winner's.
    request = IdempotentRequest(
        tenant="acme", endpoint="policy-check", key="k", request_hash=request_hash({"n": 1}), ttl_s=60.0
    )
    store = await DecisionStore.open(database_url)
    try:
        winner = [_decision("tool_safety"), _decision("tool_safety")]
        await store.record_unit(
            [Record(decisions=winner, state={"n": 1})], tenant="acme", idempotent=request, response=(200, b"{}")
        )
        with pytest.raises(IdempotencyKeyTaken):
            await store.record_unit(
                [Record(decisions=[_decision("tool_safety")], state={"n": 1})],
                tenant="acme",
                idempotent=request,
                response=(200, b'{"other": true}'),
            )
        stored = await store.idempotent_response(request)
    finally:
        await store.aclose()
    assert stored is not None and stored.body == b"{}" and stored.status == 200
    assert _count(database_url, "decisions", "acme") == 2


_REFUSE_EVERY_DECISION = """
CREATE TRIGGER refuse_decisions BEFORE INSERT ON decisions
BEGIN SELECT RAISE(ABORT, 'injected: no decision is stored'); END
"""
AMBIGUOUS = "My invoice page crashes when I log in"
"""System 1 is unsure of it (billing, technical or account): System 2 answers, and a learning task learns."""


@pytest.mark.slow  # the embedded engine embeds the policy's examples (cached for the session after)
async def test_what_system_2_answered_is_learned_once_after_the_commit(tmp_path: Path) -> None:
    policy = yaml.safe_load(test_policy(tmp_path).read_text(encoding="utf-8"))
    policy["tasks"]["support"].update(store_state=True, learn={"retrain_after": 1})
    path = tmp_path / "learning.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    route = {"task": "support", "messages": [{"role": "user", "content": AMBIGUOUS}]}
    with openai_server(respond=lambda _body: structured({"answer": "technical"})) as (url, _server):
        system2 = System2Settings(openai_api_key=SecretStr("sk-test"), openai_base_url=url)
        settings = test_settings(tmp_path, system2=system2, policy_file=path)
        database = database_url_for(settings)
        with running_api(settings) as api:
            key = await new_key(settings, "acme")
            headers = _key()
            async with api_client(api.url, key) as client:
                engine = create_engine(sync_url(database))
                try:
                    with engine.begin() as connection:
                        connection.execute(text(_REFUSE_EVERY_DECISION))
                    failed = await client.post("/v1/route", json=route, headers=headers)
                    learned_after_failure = _count(database, "learned_examples", "acme")
                    with engine.begin() as connection:
                        connection.execute(text("DROP TRIGGER refuse_decisions"))
                finally:
                    engine.dispose()
                first = await client.post("/v1/route", json=route, headers=headers)
                again = await client.post("/v1/route", json=route, headers=headers)
                metrics = await client.get("/metrics")
    assert failed.status_code == 503, failed.text
    assert learned_after_failure == 0
    assert first.status_code == 200 and first.json()["system2"] is True, first.text
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert _count(database, "learned_examples", "acme") == 1
    # One attempt to learn, after the commit: one from the failed request, or one before its
    # decision's row existed, would count as "refused" (the example links to its decision), and a
    # second one from the retry or the replay as "duplicate".
    learned = [line for line in metrics.text.splitlines() if line.startswith("fastslow_learned_examples_total{")]
    assert learned == ['fastslow_learned_examples_total{result="added",task="support"} 1.0']


def _seed_keys(url: str, ttls_s: dict[str, float]) -> None:
    async def seed() -> None:
        async with await DecisionStore.open(url) as store:
            for name, ttl_s in ttls_s.items():
                request = IdempotentRequest(
                    tenant="acme", endpoint="route", key=name, request_hash=request_hash({"n": name}), ttl_s=ttl_s
                )
                await store.record_unit(
                    [Record(decisions=[_decision("support")], state={"n": name})],
                    tenant="acme",
                    idempotent=request,
                    response=(200, b"{}"),
                )

    asyncio.run(seed())


def test_db_prune_reports_the_expired_keys_it_deleted(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    _seed_keys(database_url, {"gone": 0.01, "also-gone": 0.01, "live": 3600.0})
    time.sleep(0.05)
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    runner = CliRunner()
    # No retention and no --before: every decision stays, only expired keys go.
    dry = runner.invoke(cli, ["db", "prune", "--dry-run"])
    done = runner.invoke(cli, ["db", "prune"])
    again = runner.invoke(cli, ["db", "prune"])
    assert dry.exit_code == done.exit_code == again.exit_code == 0, dry.output + done.output
    assert "no retention is set" in done.stderr and "every decision is kept" in done.stderr
    assert "kept forever" in done.stdout  # the tenant's row of the summary
    counts = "0 decision(s), 0 answer(s), 0 outcome(s), 2 expired idempotency key(s), 0 old review webhook event(s);"
    assert f"would delete {counts}" in dry.stderr
    assert f"deleted {counts}" in done.stderr
    assert ", 0 expired idempotency key(s), 0 old review webhook event(s);" in again.stderr
    assert _count(database_url, "idempotency_keys", "acme") == 1
    assert _count(database_url, "decisions", "acme") == 3


def _schema(url: str) -> tuple[set[str], set[str], list[str]]:
    """The tables, the idempotency table's indexes (none without it) and the version recorded."""
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            tables = set(inspect(connection).get_table_names())
            indexes = (
                {index["name"] or "" for index in inspect(connection).get_indexes("idempotency_keys")}
                if "idempotency_keys" in tables
                else set()
            )
            versions = list(connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
    finally:
        engine.dispose()
    return tables, indexes, versions


def _migrate(url: str, *, down_to: str | None = None, up_to: str = "head") -> None:
    engine = create_engine(sync_url(url))
    try:
        with engine.connect() as connection:
            if down_to is None:
                command.upgrade(alembic_config(connection), up_to)
            else:
                command.downgrade(alembic_config(connection), down_to)
    finally:
        engine.dispose()


def test_migration_0005_downgrades_and_upgrades_cleanly(database_url: str) -> None:  # noqa: F811
    upgrade(database_url)
    _seed_keys(database_url, {"k": 60.0})
    _migrate(database_url, down_to="0004")
    down = _schema(database_url)
    _migrate(database_url, up_to="0005")
    up = _schema(database_url)
    assert "idempotency_keys" not in down[0] and "decisions" in down[0] and down[2] == ["0004"]
    assert "idempotency_keys" in up[0] and up[1] == {"ix_idempotency_keys_expires_at"} and up[2] == ["0005"]
    assert _count(database_url, "idempotency_keys", "acme") == 0  # the downgrade dropped the table with its rows
    assert _count(database_url, "decisions", "acme") == 1  # and nothing else
