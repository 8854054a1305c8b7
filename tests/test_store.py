"""The decision log against real databases: a SQLite file, and PostgreSQL when one is reachable."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import subprocess
import sys
import sysconfig
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import IntegrityError

from fastslow import api
from fastslow.api.store import DecisionStore, StoredDecision, database_url_for, upgrade
from fastslow.api.store._engine import HEAD_REVISION, VERSION_TABLE, alembic_config, sqlite_path, sync_url
from fastslow.api.store._models import Base
from fastslow.router import ConfigError, Decision, Settings, get_settings

from fakes.databases import database_url, dump_rows, postgres_schema_url  # noqa: F401  (fixtures)

REPO_ROOT = Path(__file__).resolve().parent.parent
TABLES = {"decisions", "answers", "outcomes", "api_keys"}


def a_decision(**changes: object) -> Decision:
    fields: dict[str, object] = {
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
    return Decision(**fields)  # type: ignore[arg-type]


def raw_bytes(url: str) -> bytes:
    """Everything the database keeps, as bytes: the SQLite files, or every row on PostgreSQL."""
    path = sqlite_path(url)
    if path is None:
        return dump_rows(url).encode()
    files = [path, path.with_name(path.name + "-wal")]
    return b"".join(f.read_bytes() for f in files if f.exists()) + dump_rows(url).encode()


# -- schema ------------------------------------------------------------------------------------------


def test_migrations_create_the_schema_and_upgrade_is_idempotent(database_url: str) -> None:  # noqa: F811
    upgrade(database_url)
    upgrade(database_url)
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    # A database at HEAD_REVISION is never handed to Alembic: a new migration must move it too.
    assert head == HEAD_REVISION
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            assert TABLES | {VERSION_TABLE} <= set(inspect(connection).get_table_names())
            assert connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all() == [head]
    finally:
        engine.dispose()


def test_the_models_match_the_migrations(database_url: str) -> None:  # noqa: F811
    upgrade(database_url)
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"version_table": VERSION_TABLE, "compare_type": True}
            )
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


@pytest.mark.slow
def test_replicas_starting_together_migrate_once(postgres_schema_url: str) -> None:  # noqa: F811
    script = "import sys; from api.store import upgrade; upgrade(sys.argv[1])"
    replicas = [
        subprocess.Popen([sys.executable, "-c", script, postgres_schema_url], cwd=REPO_ROOT, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    for replica in replicas:
        _, err = replica.communicate(timeout=120)
        assert replica.returncode == 0, err.decode()
    test_migrations_create_the_schema_and_upgrade_is_idempotent(postgres_schema_url)


async def test_stores_opened_together_in_one_process_migrate_once(database_url: str) -> None:  # noqa: F811
    stores = await asyncio.gather(*(DecisionStore.open(database_url) for _ in range(4)))
    for store in stores:
        assert await store.ping()
        await store.aclose()


# -- decisions ---------------------------------------------------------------------------------------


async def test_a_decision_comes_back_with_its_distribution(store: DecisionStore) -> None:
    decision = a_decision(verdict="allow", cost_usd=0.0042, escalate=True, system=2, reason="low_confidence")
    before = datetime.now(UTC)
    await store.record(decision, tenant="acme", state="Where is my invoice?")

    stored = await store.get(decision.id, tenant="acme")

    assert isinstance(stored, StoredDecision)
    assert stored.to_decision() == decision
    assert stored.answers == {"billing": 0.875, "tech": 0.1, "other": 0.025}
    assert stored.tenant == "acme"
    assert stored.created_at.tzinfo is UTC
    assert before - timedelta(seconds=1) <= stored.created_at <= datetime.now(UTC) + timedelta(seconds=1)


async def test_a_decision_without_a_distribution_has_no_answers(store: DecisionStore) -> None:
    decision = a_decision(probabilities={}, outcome=None, escalate=True, reason="engine_error", detail="timeout")
    await store.record(decision, tenant="acme", state={})
    stored = await store.get(decision.id, tenant="acme")
    assert stored is not None and stored.answers == {} and stored.outcome is None


async def test_thoughts_never_reach_the_log(store: DecisionStore, database_url: str) -> None:  # noqa: F811
    detail = "<|channel>thought the user is angry<channel|>System 2 chose billing <think>hidden</think>"
    decision = a_decision(detail=detail)
    await store.record(decision, tenant="acme", state="s")
    stored = await store.get(decision.id, tenant="acme")
    assert stored is not None and stored.detail == "System 2 chose billing"
    assert b"the user is angry" not in raw_bytes(database_url)


async def test_text_neither_database_accepts_is_made_safe_not_fatal(store: DecisionStore) -> None:
    # A JSON body can carry a NUL or a lone surrogate; recording must not fail after the decision.
    decision = a_decision(detail="nul\x00 and lone \ud800 surrogate")
    await store.record(decision, tenant="acme", state={"text": "a\x00b \udfff"}, store_state=True)
    stored = await store.get(decision.id, tenant="acme")
    assert stored is not None and stored.detail == "nul\ufffd and lone ? surrogate"
    assert stored.state_text is not None and "\\u0000" in stored.state_text


async def test_each_tenant_sees_only_its_decisions(store: DecisionStore) -> None:
    decision = a_decision()
    await store.record(decision, tenant="acme", state="s")

    assert await store.get(decision.id, tenant="globex") is None
    assert await store.record_outcome(decision.id, tenant="globex", label="tech") is None
    assert await store.outcomes(tenant="globex") == []
    assert await store.outcomes(tenant="acme") == []  # globex's attempt left nothing behind
    assert await store.get(decision.id, tenant="acme") is not None


async def test_the_state_is_a_hash_unless_the_policy_keeps_it(store: DecisionStore, database_url: str) -> None:  # noqa: F811
    hashed, kept = a_decision(), a_decision()
    secret = {"ticket": "my card 4242-4242 was charged twice", "n": 1}
    await store.record(hashed, tenant="acme", state=secret)
    assert secret["ticket"].encode() not in raw_bytes(database_url)
    await store.record(kept, tenant="acme", state={"n": 1, "ticket": secret["ticket"]}, store_state=True)

    first, second = await store.get(hashed.id, tenant="acme"), await store.get(kept.id, tenant="acme")
    assert first is not None and second is not None
    canonical = json.dumps(secret, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert first.state_text is None
    assert first.state_digest == second.state_digest == hashlib.sha256(canonical.encode()).hexdigest()
    assert second.state_text == canonical


async def test_the_sink_records_for_its_tenant_and_asks_the_policy_about_state(store: DecisionStore) -> None:
    sink = store.sink("acme", store_state=lambda task: task == "keep")
    kept, hashed = a_decision(task="keep"), a_decision(task="hash")
    await sink.record(kept, state="hello")
    await sink.record(hashed, state="hello")

    first, second = await store.get(kept.id, tenant="acme"), await store.get(hashed.id, tenant="acme")
    assert first is not None and first.state_text == '"hello"'
    assert second is not None and second.state_text is None


async def test_record_many_is_all_or_nothing(store: DecisionStore) -> None:
    first = a_decision()
    await store.record(first, tenant="acme", state="s")
    fresh = a_decision()
    with pytest.raises(IntegrityError):
        await store.record_many([fresh, first], tenant="acme", state="s")  # first's id is taken
    assert await store.get(fresh.id, tenant="acme") is None
    await store.record_many([fresh, a_decision()], tenant="acme", state="s")
    assert await store.get(fresh.id, tenant="acme") is not None


async def test_concurrent_records_all_land(store: DecisionStore) -> None:
    decisions = [a_decision(latency_ms=float(i)) for i in range(200)]
    await asyncio.gather(*(store.record(d, tenant=f"t{i % 3}", state={"i": i}) for i, d in enumerate(decisions)))
    for i, decision in enumerate(decisions):
        stored = await store.get(decision.id, tenant=f"t{i % 3}")
        assert stored is not None and stored.latency_ms == float(i) and len(stored.answers) == 3


async def test_two_stores_share_one_database_like_replicas(store: DecisionStore, database_url: str) -> None:  # noqa: F811
    async with await DecisionStore.open(database_url) as replica:
        decision = a_decision()
        await store.record(decision, tenant="acme", state="s")
        assert await replica.get(decision.id, tenant="acme") is not None
        key, _ = await replica.create_key("acme")
        assert await store.authenticate(key) is not None


async def test_ping(store: DecisionStore) -> None:
    assert await store.ping() is True


async def test_ping_says_false_when_the_database_is_gone() -> None:
    pytest.importorskip("psycopg")
    gone = await DecisionStore.open("postgresql+psycopg://postgres@127.0.0.1:1/nothing", migrate=False)
    async with gone:
        assert await gone.ping(timeout_s=5) is False


# -- outcomes ----------------------------------------------------------------------------------------


async def test_outcomes_for_calibration(store: DecisionStore) -> None:
    kept, escalated, other_task = a_decision(), a_decision(system=2), a_decision(task="spam")
    for d in (kept, escalated, other_task):
        await store.record(d, tenant="acme", state="s")

    first = await store.record_outcome(kept.id, tenant="acme", label="billing", note="checked by Ann")
    second = await store.record_outcome(escalated.id, tenant="acme", system2_correct=False)
    await store.record_outcome(other_task.id, tenant="acme", label="ham")

    assert first is not None and first.label == "billing" and first.note == "checked by Ann"
    assert second is not None and second.system2_correct is False and second.label is None
    pairs = await store.outcomes(tenant="acme", task="triage")
    assert [(d.id, o.id) for d, o in pairs] == [(escalated.id, second.id), (kept.id, first.id)]
    assert pairs[0][0].answers == dict(escalated.probabilities)
    assert len(await store.outcomes()) == 3
    assert len(await store.outcomes(tenant="acme", limit=1)) == 1


async def test_an_outcome_needs_a_known_decision_and_something_to_say(store: DecisionStore) -> None:
    assert await store.record_outcome("no-such-decision", tenant="acme", label="x") is None
    decision = a_decision()
    await store.record(decision, tenant="acme", state="s")
    with pytest.raises(ValueError, match="label or system2_correct"):
        await store.record_outcome(decision.id, tenant="acme", note="just a note")


# -- API keys ----------------------------------------------------------------------------------------


async def test_keys_authenticate_until_revoked(store: DecisionStore) -> None:
    key, record = await store.create_key("acme", name="ci")
    assert key.startswith("fs_") and len(key) >= 3 + 32
    assert key.startswith(record.prefix) and len(record.prefix) < 16
    assert record.tenant == "acme" and record.name == "ci" and not record.revoked

    assert await store.authenticate(key) == record
    assert await store.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert await store.authenticate("not a key") is None

    assert await store.revoke_key(record.id) is True
    assert await store.authenticate(key) is None
    assert await store.revoke_key(record.id) is True
    assert await store.revoke_key("no-such-key") is False


async def test_keys_are_listed_per_tenant(store: DecisionStore) -> None:
    _, acme = await store.create_key("acme")
    _, globex = await store.create_key("globex")
    assert [k.id for k in await store.list_keys("acme")] == [acme.id]
    assert {k.id for k in await store.list_keys()} == {acme.id, globex.id}


async def test_the_plaintext_key_is_never_stored(store: DecisionStore, database_url: str) -> None:  # noqa: F811
    key, record = await store.create_key("acme")
    held = raw_bytes(database_url)
    assert key.encode() not in held
    assert key[len(record.prefix) :].encode() not in held
    assert hashlib.sha256(key.encode()).hexdigest().encode() in held


# -- SQLite and the data directory -------------------------------------------------------------------


async def test_sqlite_runs_in_wal_mode_with_synchronous_normal(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'log.sqlite3'}"
    async with await DecisionStore.open(url) as store:
        async with store.engine.connect() as connection:

            async def pragma(name: str) -> object:
                return (await connection.exec_driver_sql(f"PRAGMA {name}")).scalar()

            assert await pragma("journal_mode") == "wal"
            assert await pragma("synchronous") == 1  # NORMAL
            assert await pragma("foreign_keys") == 1
            assert await pragma("busy_timeout") == 30_000
    with sqlite3.connect(tmp_path / "log.sqlite3") as raw:  # WAL is a property of the file itself
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    raw.close()


def test_the_default_database_is_a_file_under_the_data_dir(tmp_path: Path) -> None:
    url = database_url_for(get_settings())  # the autouse fixture points FASTSLOW_DATA_DIR at tmp_path/data
    path = sqlite_path(url)
    assert url.startswith("sqlite+aiosqlite:///")
    assert path == (tmp_path / "data" / "fastslow.sqlite3").resolve()
    assert path.parent.is_dir()
    _never_inside_the_package(path)


def test_without_a_data_dir_the_database_goes_to_the_users_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FASTSLOW_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home" / ".local" / "share"))
    path = sqlite_path(database_url_for(Settings()))
    assert path is not None and path.is_relative_to((tmp_path / "home").resolve())
    _never_inside_the_package(path)


def _never_inside_the_package(path: Path) -> None:
    assert not path.is_relative_to(Path(api.__file__).resolve().parent)
    assert not path.is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve())


def test_a_configured_url_is_used_as_it_is() -> None:
    url = "postgresql+psycopg://fastslow@db.internal:5432/fastslow"
    assert database_url_for(Settings(database_url=url)) == url


@pytest.mark.parametrize("url", ["sqlite+aiosqlite://", "sqlite:///:memory:", "mysql://u@h/db", "not a url"], ids=str)
def test_urls_the_log_cannot_use_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError, match="database_url"):
        upgrade(url)
