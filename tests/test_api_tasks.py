"""``GET /v1/tasks``: the policy in force, task by task, as ``fastslow policy check`` describes it."""

from __future__ import annotations

from pathlib import Path

from fastslow.policies import describe_policy, load_policy

from fakes.api_server import api_client, new_key, running_api, test_settings


async def test_tasks_describe_the_policy_in_force_to_a_key_holder(tmp_path: Path) -> None:
    settings = test_settings(tmp_path)
    key = await new_key(settings, "acme")
    with running_api(settings) as api:
        async with api_client(api.url) as anonymous:
            refused = await anonymous.get("/v1/tasks")
        async with api_client(api.url, key) as client:
            answer = await client.get("/v1/tasks")
            ready = (await client.get("/readyz")).json()
    assert refused.status_code == 401
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["policy_version"] == ready["policy_version"]
    assert settings.policy_file is not None
    policy = load_policy(settings.policy_file)
    expected = describe_policy(policy, default_engine=settings.engine)
    assert set(body["tasks"]) == set(expected)
    support = body["tasks"]["support"]
    assert support["kind"] == "route" and support["none_of_these"] == "other"
    assert support["routes"] == expected["support"]["routes"] and "billing" in support["routes"]
    assert support["thresholds"] == expected["support"]["thresholds"]
    assert support["rules"] is None and support["escalate_to"] == "openai:gpt-5.5"
    triage = body["tasks"]["triage"]["questions"]
    assert triage["urgency"] == {"kind": "score", "options": ["0", "1", "2", "3"]}
    rule = body["tasks"]["tool_safety"]["rules"]["destructive_action"]
    expected_rule = expected["tool_safety"]["rules"]["destructive_action"]
    assert (rule["deny_at"], rule["allow_at"], rule["violation"]) == (
        expected_rule["deny_at"],
        expected_rule["allow_at"],
        "yes",
    )
    assert rule["examples"] > 0 and body["tasks"]["tool_safety"]["thresholds"] is None
