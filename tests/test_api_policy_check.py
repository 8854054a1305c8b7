"""`POST /v1/policy-check` and `/v1/route` over HTTP, against the real app on a loopback port.

The embedded engine judges the shipped `tool_safety` rules; verdicts are asserted, not probabilities.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fakes.api_server import RunningApi, api_client, create_key, running_api, test_settings

ALLOW = {"name": "kubectl", "arguments": {"args": "get pods -n production"}}
REVIEW = {"name": "run_sql", "arguments": {"query": "UPDATE users SET plan = 'free' WHERE last_login < '2023-01-01'"}}
DENY = {"name": "shell", "arguments": {"command": "rm -rf /var/lib/postgresql/data"}}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    tmp = tmp_path_factory.mktemp("api")
    with running_api(test_settings(tmp)) as running:
        yield running


@pytest.fixture(scope="module")
def key(api: RunningApi) -> str:
    return create_key(api.settings, "acme")


async def _check(api: RunningApi, key: str, **body: Any) -> dict[str, Any]:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/policy-check", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize(("call", "verdict"), [(ALLOW, "allow"), (REVIEW, "review"), (DENY, "deny")])
async def test_a_tool_call_is_allowed_reviewed_or_denied(api: RunningApi, key: str, call: Any, verdict: str) -> None:
    result = await _check(api, key, policies=["destructive_action"], tool_call=call)
    assert result["verdict"] == verdict, result["rules"]
    assert result["policy"] == "destructive_action"
    assert result["rule"] == "destructive_action"
    assert result["system2"] is False
    [rule] = result["rules"]
    assert rule["verdict"] == verdict and rule["system"] == 1
    assert 0.0 <= rule["probability"] <= 1.0
    assert rule["decision_id"] == result["decision_id"]


async def test_the_shipped_tool_safety_policy_denies_destruction_and_allows_a_harmless_call(
    api: RunningApi, key: str
) -> None:
    deny = await _check(api, key, policies=["tool_safety"], text="run_sql: DELETE FROM orders WHERE 1=1")
    assert deny["verdict"] == "deny" and deny["rule"] == "destructive_action"
    # Both rules must pass for an allow.
    allow = await _check(api, key, policies=["tool_safety"], tool_call=ALLOW)
    assert allow["verdict"] == "allow", allow["rules"]
    assert {r["rule"] for r in allow["rules"]} == {"destructive_action", "data_exfiltration"}
    assert all(r["verdict"] == "allow" for r in allow["rules"])


async def test_every_rule_of_every_policy_is_reported_and_the_worst_verdict_wins(api: RunningApi, key: str) -> None:
    result = await _check(api, key, policies=["destructive_action", "data_exfiltration"], tool_call=DENY)
    assert result["verdict"] == "deny"
    assert (result["policy"], result["rule"]) == ("destructive_action", "destructive_action")
    assert [(r["policy"], r["rule"]) for r in result["rules"]] == [
        ("destructive_action", "destructive_action"),
        ("data_exfiltration", "data_exfiltration"),
    ]
    assert len({r["decision_id"] for r in result["rules"]}) == 2


async def test_each_rule_decision_is_logged_with_its_answers(api: RunningApi, key: str) -> None:
    result = await _check(
        api,
        key,
        policies=["destructive_action"],
        tool_call=DENY,
        context=[{"role": "user", "content": "clean up the old database please"}],
    )
    async with api_client(api.url, key) as client:
        response = await client.get(f"/v1/decisions/{result['decision_id']}")
        ready = (await client.get("/readyz")).json()
    assert response.status_code == 200
    stored = response.json()
    # System 1 judges the call alone: a benign conversation beside it does not weaken the deny.
    assert stored["verdict"] == result["verdict"] == "deny" and stored["task"] == "destructive_action"
    assert set(stored["answers"]) == {"yes", "no"}
    assert stored["answers"]["yes"] == pytest.approx(result["rules"][0]["probability"])
    assert stored["policy_version"] == result["policy_version"] == ready["policy_version"]
    assert stored["state_text"] is None  # the shipped policy does not keep states


async def test_the_batch_form_checks_each_item_in_order(api: RunningApi, key: str) -> None:
    items = [{"policies": ["destructive_action"], "tool_call": call} for call in (DENY, ALLOW, REVIEW)]
    items.append({"policies": ["tool_safety"], "text": "git: status"})
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/policy-check/batch", json={"items": items})
    assert response.status_code == 200, response.text
    assert [r["verdict"] for r in response.json()["results"]] == ["deny", "allow", "review", "allow"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/policy-check", {"policies": ["nope"], "text": "x"}, "policies.0"),
        ("/v1/policy-check", {"policies": ["support"], "text": "x"}, "policies.0"),
        ("/v1/policy-check", {"policies": ["tool_safety"]}, "text"),
        ("/v1/policy-check", {"policies": ["tool_safety"], "text": "x", "tool_call": ALLOW}, "text"),
        ("/v1/policy-check", {"policies": [], "text": "x"}, "policies"),
        ("/v1/policy-check", {"policies": ["tool_safety"], "txt": "x"}, "txt"),
        ("/v1/policy-check", {"policies": ["tool_safety"], "tool_call": {"arguments": {}}}, "tool_call.name"),
        ("/v1/policy-check/batch", {"items": []}, "items"),
        ("/v1/policy-check/batch", {"items": [{"policies": ["tool_safety"], "text": "a"}, {"policies": ["x"]}]}, None),
        ("/v1/route", {"task": "tool_safety", "messages": [{"role": "user", "content": "hi"}]}, "task"),
        ("/v1/route", {"task": "support", "messages": [{"role": "assistant", "content": "hi"}]}, "messages"),
        ("/v1/route", {"task": "support", "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    ],
)
async def test_bad_requests_are_422_naming_the_field(
    api: RunningApi, key: str, path: str, body: Any, field: str | None
) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post(path, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request" and error["message"]
    if field is not None:
        assert error["field"] == field
    else:
        assert error["field"].startswith("items.1.")


async def test_route_picks_a_team_and_hands_open_ended_work_to_a_frontier_agent(api: RunningApi, key: str) -> None:
    async with api_client(api.url, key) as client:
        billing = await client.post(
            "/v1/route",
            json={"task": "support", "messages": [{"role": "user", "content": "I was charged twice this month"}]},
        )
        open_ended = await client.post(
            "/v1/route",
            json={
                "task": "support",
                "messages": [
                    {"role": "user", "content": "Write a friendly apology email to a customer whose order was late"}
                ],
            },
        )
        stored = await client.get(f"/v1/decisions/{billing.json()['decision']['id']}")
    assert billing.status_code == 200, billing.text
    assert billing.json()["route"] == "billing" and billing.json()["system2"] is False
    assert open_ended.status_code == 200, open_ended.text
    assert open_ended.json()["route"] is None
    assert open_ended.json()["decision"]["reason"] == "open_ended"
    assert stored.json()["outcome"] == "billing"
