"""API key scopes: ``check`` decides, ``read`` reads the log, either records an outcome; ``keys create --scope``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.store import ApiKey, DecisionStore, database_url_for

from fakes.api_server import RunningApi, api_client, running_api, test_settings

runner = CliRunner()

DROP = {"name": "sql", "arguments": {"query": "DROP TABLE customers;"}}
CHECK = ("POST", "/v1/policy-check", {"policies": ["tool_safety"], "tool_call": DROP})
BATCH = ("POST", "/v1/policy-check/batch", {"items": [{"policies": ["tool_safety"], "tool_call": DROP}]})
ROUTE = ("POST", "/v1/route", {"task": "support", "messages": [{"role": "user", "content": "my card was declined"}]})
GATEWAY = ("POST", "/v1/systemone", {"state": "a", "questions": {"q": {"kind": "noul", "criteria": "is it?"}}})
TASKS = ("GET", "/v1/tasks", None)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(test_settings(tmp_path_factory.mktemp("api"))) as running:
        yield running


@pytest.fixture(scope="module")
def decision_id(api: RunningApi) -> str:
    """One of acme's decisions, made with a default key."""

    async def check() -> str:
        async with api_client(api.url, await api.key("acme")) as client:
            response = await client.post(CHECK[1], json=CHECK[2])
        assert response.status_code == 200, response.text
        found: str = response.json()["decision_id"]
        return found

    return asyncio.run(check())


async def _statuses(api: RunningApi, key: str, *calls: tuple[str, str, Any]) -> list[tuple[int, str]]:
    async with api_client(api.url, key) as client:
        responses = [await client.request(method, path, json=body) for method, path, body in calls]
    return [(r.status_code, r.json()["error"]["message"] if r.status_code >= 400 else "") for r in responses]


async def test_a_read_key_reads_and_reports_but_cannot_decide(api: RunningApi, decision_id: str) -> None:
    key = await api.key("acme", scopes=["read"])
    refused = await _statuses(api, key, CHECK, BATCH, ROUTE, GATEWAY)
    allowed = await _statuses(
        api,
        key,
        ("GET", f"/v1/decisions/{decision_id}", None),
        TASKS,
        ("POST", f"/v1/decisions/{decision_id}/outcome", {"label": "deny"}),
    )

    assert [status for status, _ in refused] == [403] * 4
    assert all("lacks the 'check' scope (it has: read)" in message for _, message in refused)
    assert [status for status, _ in allowed] == [200, 200, 201], allowed


async def test_a_check_key_decides_and_reports_but_cannot_read_the_log(api: RunningApi, decision_id: str) -> None:
    key = await api.key("acme", scopes=["check"])
    allowed = await _statuses(api, key, CHECK, ROUTE, ("POST", f"/v1/decisions/{decision_id}/outcome", {"label": "no"}))
    refused = await _statuses(api, key, ("GET", f"/v1/decisions/{decision_id}", None), TASKS)

    assert [status for status, _ in allowed] == [200, 200, 201], allowed
    assert [status for status, _ in refused] == [403, 403]
    assert all("lacks the 'read' scope (it has: check)" in message for _, message in refused)


async def test_a_review_key_can_neither_decide_nor_read_nor_report(api: RunningApi, decision_id: str) -> None:
    key = await api.key("acme", scopes=["review"])
    answers = await _statuses(
        api,
        key,
        CHECK,
        ("GET", f"/v1/decisions/{decision_id}", None),
        ("POST", f"/v1/decisions/{decision_id}/outcome", {"label": "deny"}),
    )

    assert [status for status, _ in answers] == [403, 403, 403]
    assert "needs the 'check' or 'read' scope (it has: review)" in answers[2][1]


async def test_keys_made_without_scopes_do_what_every_key_did_before(api: RunningApi, decision_id: str) -> None:
    answers = await _statuses(
        api,
        await api.key("acme"),
        CHECK,
        BATCH,
        ROUTE,
        ("GET", f"/v1/decisions/{decision_id}", None),
        TASKS,
        ("POST", f"/v1/decisions/{decision_id}/outcome", {"label": "deny"}),
    )

    assert [status for status, _ in answers] == [200, 200, 200, 200, 200, 201], answers


def test_keys_create_takes_scopes_and_keys_list_shows_them(api: RunningApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_DATA_DIR", str(api.settings.data_dir))
    made = runner.invoke(app, ["keys", "create", "--tenant", "scoped", "--scope", "review", "--scope", "READ"])
    default = runner.invoke(app, ["keys", "create", "--tenant", "scoped", "--name", "agent"])
    bad = runner.invoke(app, ["keys", "create", "--tenant", "scoped", "--scope", "check,admin"])
    listed = runner.invoke(app, ["keys", "list", "--tenant", "scoped", "--json"])
    table = runner.invoke(app, ["keys", "list", "--tenant", "scoped"])

    assert made.exit_code == 0 and default.exit_code == 0, made.output + default.output
    assert "with scopes review, read" in made.stderr and "with scopes check, read" in default.stderr
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: --scope: unknown scope 'admin'; use check, review, read"
    assert [json.loads(line)["scopes"] for line in listed.stdout.splitlines()] == [
        ["review", "read"],
        ["check", "read"],
    ]
    rows = [line.split() for line in table.stdout.splitlines()[1:] if line.strip()]
    assert [row[4] if row[2] == "agent" else row[3] for row in rows] == ["review,read", "check,read"]


def test_a_key_made_by_the_cli_is_held_to_its_scopes(api: RunningApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_DATA_DIR", str(api.settings.data_dir))
    made = runner.invoke(app, ["keys", "create", "--tenant", "acme", "--scope", "read"])
    key = made.stdout.strip()

    async def record() -> ApiKey | None:
        async with await DecisionStore.open(database_url_for(api.settings), migrate=False) as store:
            return await store.authenticate(key)

    found = asyncio.run(record())
    assert found is not None and found.scopes == {"read"}
    assert [status for status, _ in asyncio.run(_statuses(api, key, CHECK, TASKS))] == [403, 200]
