"""The decision log over HTTP: reading decisions, recording outcomes, and tenants kept apart."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fastslow.api.store import DecisionStore, database_url_for

from fakes.api_server import RunningApi, api_client, create_key, running_api, test_settings

DROP = {"name": "sql", "arguments": {"query": "DROP TABLE customers;"}}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(test_settings(tmp_path_factory.mktemp("api"))) as running:
        yield running


@pytest.fixture(scope="module")
def keys(api: RunningApi) -> dict[str, str]:
    return {tenant: create_key(api.settings, tenant) for tenant in ("acme", "globex")}


async def _route(api: RunningApi, key: str, text: str) -> dict[str, Any]:
    async with api_client(api.url, key) as client:
        response = await client.post(
            "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": text}]}
        )
    assert response.status_code == 200, response.text
    decision: dict[str, Any] = response.json()["decision"]
    return decision


async def test_an_outcome_is_recorded_for_calibration(api: RunningApi, keys: dict[str, str]) -> None:
    decision = await _route(api, keys["acme"], "My card keeps getting declined when I pay")
    async with api_client(api.url, keys["acme"]) as client:
        response = await client.post(
            f"/v1/decisions/{decision['id']}/outcome", json={"label": "billing", "note": "confirmed by the agent"}
        )
    assert response.status_code == 201, response.text
    outcome = response.json()
    assert outcome["decision_id"] == decision["id"]
    assert (outcome["label"], outcome["system2_correct"], outcome["note"]) == (
        "billing",
        None,
        "confirmed by the agent",
    )
    async with await DecisionStore.open(database_url_for(api.settings), migrate=False) as store:
        pairs = await store.outcomes(tenant="acme")
    assert [(d.id, o.id) for d, o in pairs if d.id == decision["id"]] == [(decision["id"], outcome["id"])]


async def test_a_check_decision_takes_a_verdict_or_an_option_as_its_label(
    api: RunningApi, keys: dict[str, str]
) -> None:
    async with api_client(api.url, keys["acme"]) as client:
        check = (await client.post("/v1/policy-check", json={"policies": ["tool_safety"], "tool_call": DROP})).json()
        as_verdict = await client.post(f"/v1/decisions/{check['decision_id']}/outcome", json={"label": "allow"})
        as_option = await client.post(f"/v1/decisions/{check['decision_id']}/outcome", json={"label": "no"})
    assert as_verdict.status_code == 201 and as_option.status_code == 201


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "label"),
        ({"note": "only a note"}, "label"),
        ({"label": "weather"}, "label"),
        ({"system2_correct": True}, "system2_correct"),  # System 1 settled it: there is no System-2 answer to judge
        ({"label": "billing", "extra": 1}, "extra"),
        ({"label": ""}, "label"),
    ],
)
async def test_bad_outcomes_are_422(api: RunningApi, keys: dict[str, str], body: Any, field: str) -> None:
    decision = await _route(api, keys["acme"], "Where do I download last month's invoice?")
    async with api_client(api.url, keys["acme"]) as client:
        response = await client.post(f"/v1/decisions/{decision['id']}/outcome", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field


async def test_each_key_sees_only_its_tenants_decisions(api: RunningApi, keys: dict[str, str]) -> None:
    mine = await _route(api, keys["acme"], "The app crashes every time I open the reports page")
    async with api_client(api.url, keys["acme"]) as acme, api_client(api.url, keys["globex"]) as globex:
        assert (await acme.get(f"/v1/decisions/{mine['id']}")).status_code == 200
        seen = await globex.get(f"/v1/decisions/{mine['id']}")
        judged = await globex.post(f"/v1/decisions/{mine['id']}/outcome", json={"label": "technical"})
        never = await globex.get("/v1/decisions/0123456789abcdef0123456789abcdef")
    # Another tenant's decision looks exactly like one that does not exist.
    assert seen.status_code == judged.status_code == never.status_code == 404
    assert seen.json()["error"]["type"] == "not_found"
    assert seen.json()["error"]["message"].replace(mine["id"], "ID") == never.json()["error"]["message"].replace(
        "0123456789abcdef0123456789abcdef", "ID"
    )
    async with await DecisionStore.open(database_url_for(api.settings), migrate=False) as store:
        assert await store.outcomes(tenant="globex") == []
        stored = await store.get(mine["id"], tenant="acme")
    assert stored is not None and stored.tenant == "acme"


async def test_a_decision_reads_back_with_its_answers(api: RunningApi, keys: dict[str, str]) -> None:
    decision = await _route(api, keys["acme"], "I forgot my password and the reset email never arrives")
    async with api_client(api.url, keys["acme"]) as client:
        stored = (await client.get(f"/v1/decisions/{decision['id']}")).json()
    assert stored["outcome"] == decision["outcome"] == "account"
    assert set(stored["answers"]) >= {"billing", "technical", "account"}
    assert stored["answers"] == pytest.approx(decision["probabilities"])
    assert len(stored["state_digest"]) == 64 and stored["created_at"].endswith("Z")
