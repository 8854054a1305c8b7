"""`fastslow keys create`, `db upgrade`, `init`, `graph list` and `fastslow serve`'s start-up errors."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.store import DecisionStore, database_url_for
from fastslow.policies import BUILTIN_POLICY, POLICY_FILE_NAME, locate_policy
from fastslow.router import Settings, get_settings

runner = CliRunner()


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_db_upgrade_migrates_and_is_idempotent(tmp_path: Path) -> None:
    for _ in range(2):
        result = runner.invoke(app, ["db", "upgrade"])
        assert result.exit_code == 0, result.output
    assert "is up to date" in result.stderr
    assert {"decisions", "answers", "outcomes", "api_keys"} <= _tables(tmp_path / "data" / "fastslow.sqlite3")


def test_keys_create_prints_the_key_once_and_it_authenticates(tmp_path: Path) -> None:
    result = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--name", "billing-bot"])
    assert result.exit_code == 0, result.output
    key = result.stdout.strip()
    assert key.startswith("fs_") and "\n" not in key
    assert "acme" in result.stderr and key not in result.stderr

    async def who() -> str | None:
        async with await DecisionStore.open(database_url_for(Settings()), migrate=False) as store:
            record = await store.authenticate(key)
        return None if record is None else record.tenant

    assert asyncio.run(who()) == "acme"


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["keys", "create", "--tenant", " "], {}, "--tenant: must not be empty"),
        (["db", "upgrade"], {"FASTSLOW_DATABASE_URL": "mysql://db/fastslow"}, "unsupported database 'mysql'"),
        (["serve", "--port", "0"], {"FASTSLOW_POLICY_FILE": "/no/such/policy.yaml"}, "/no/such/policy.yaml"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.output


def test_init_writes_the_starter_policy_where_fastslow_then_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init"])
    assert result.exit_code == 0, result.output
    written = tmp_path / POLICY_FILE_NAME
    assert written.read_bytes() == BUILTIN_POLICY.read_bytes()
    assert written.read_text().startswith("# fastslow policy file")  # commented, for editing
    assert "tasks: support, triage, tool_safety" in result.stderr and "from this folder" in result.stderr
    assert locate_policy(Settings()).path == written

    again = runner.invoke(app, ["init"])
    assert again.exit_code == 2 and "exists; pass --force" in again.stderr
    written.write_text("edited\n")
    forced = runner.invoke(app, ["init", "--force"])
    assert forced.exit_code == 0 and written.read_bytes() == BUILTIN_POLICY.read_bytes()


def test_init_elsewhere_says_how_to_use_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["init", "conf/policy.yaml"])
    assert result.exit_code == 2 and "cannot write conf/policy.yaml" in result.stderr
    (tmp_path / "conf").mkdir()
    result = runner.invoke(app, ["init", "conf/policy.yaml"])
    assert result.exit_code == 0, result.output
    assert f"FASTSLOW_POLICY_FILE={tmp_path / 'conf' / 'policy.yaml'}" in result.stderr


def test_graph_list_names_the_graphs_and_the_policy_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["graph", "list"])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["support-triage", "guarded-tools", "draft-validate"]
    assert result.stderr == f"policy: {locate_policy(Settings()).describe()}\n"
    assert str(BUILTIN_POLICY) in result.stderr
    mine = tmp_path / "mine.yaml"
    mine.write_bytes(BUILTIN_POLICY.read_bytes())
    monkeypatch.setenv("FASTSLOW_POLICY_FILE", str(mine))
    get_settings.cache_clear()
    result = runner.invoke(app, ["graph", "list"])
    assert result.stderr == f"policy: {mine} (FASTSLOW_POLICY_FILE)\n"
