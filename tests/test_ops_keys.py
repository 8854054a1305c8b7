"""`fastslow keys list` and `fastslow keys revoke`, through the command line, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.store import ApiKey, DecisionStore

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

runner = CliRunner()


@pytest.fixture
def keys(database_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[str, ApiKey]]:  # noqa: F811
    """Three keys made through the store: acme's ``bot`` and ``ops``, and beta's unnamed one."""
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)

    async def make() -> dict[str, tuple[str, ApiKey]]:
        async with await DecisionStore.open(database_url) as store:
            return {
                "bot": await store.create_key("acme", name="bot"),
                "ops": await store.create_key("acme", name="ops"),
                "beta": await store.create_key("beta"),
            }

    return asyncio.run(make())


def _authenticates(url: str, key: str) -> ApiKey | None:
    async def go() -> ApiKey | None:
        async with await DecisionStore.open(url, migrate=False) as store:
            return await store.authenticate(key)

    return asyncio.run(go())


def test_list_as_json_lines_shows_each_record_never_the_key(keys: dict[str, tuple[str, ApiKey]]) -> None:
    result = runner.invoke(app, ["keys", "list", "--json"])

    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["id"] for row in rows] == [keys[name][1].id for name in ("bot", "ops", "beta")]
    assert set(rows[0]) == {"id", "tenant", "name", "prefix", "scopes", "created_at", "revoked_at"}
    assert rows[0]["tenant"] == "acme" and rows[0]["name"] == "bot" and rows[0]["revoked_at"] is None
    assert rows[2]["name"] is None and rows[0]["prefix"] == keys["bot"][1].prefix
    for secret, record in keys.values():
        assert secret not in result.output
        assert record.prefix != secret


def test_list_as_a_table_filtered_by_tenant(keys: dict[str, tuple[str, ApiKey]]) -> None:
    result = runner.invoke(app, ["keys", "list", "--tenant", "acme"])

    assert result.exit_code == 0, result.output
    header, *lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert header.split() == ["id", "tenant", "name", "prefix", "scopes", "created", "revoked"]
    assert [line.split()[0] for line in lines] == [keys["bot"][1].id, keys["ops"][1].id]
    assert "2 key(s) for tenant 'acme'" in result.stderr
    assert all(secret not in result.output for secret, _ in keys.values())


def test_revoke_refuses_the_key_and_says_so_the_second_time(
    keys: dict[str, tuple[str, ApiKey]],
    database_url: str,  # noqa: F811
) -> None:
    secret, record = keys["ops"]

    first = runner.invoke(app, ["keys", "revoke", record.id])

    assert first.exit_code == 0, first.output
    assert f"revoked key {record.prefix}..." in first.stderr and "at once" in first.stderr
    assert _authenticates(database_url, secret) is None
    assert _authenticates(database_url, keys["bot"][0]) is not None  # the tenant's other key still works

    second = runner.invoke(app, ["keys", "revoke", record.id])
    assert second.exit_code == 0, second.output
    assert "was already revoked at" in second.stderr

    listed = runner.invoke(app, ["keys", "list", "--json", "--tenant", "acme"])
    revoked = {row["id"]: row["revoked_at"] for row in map(json.loads, listed.stdout.splitlines())}
    assert revoked[keys["bot"][1].id] is None and revoked[record.id] is not None


def test_revoking_an_unknown_id_is_one_line_and_exit_2(keys: dict[str, tuple[str, ApiKey]]) -> None:
    assert keys
    result = runner.invoke(app, ["keys", "revoke", "no-such-id"])

    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no API key with id 'no-such-id'")


def test_an_unreachable_database_exits_4(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 on loopback: nothing listens, so the connection is refused at once.
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:9/none")
    result = runner.invoke(app, ["keys", "list"])
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith("error: decision log: ")
