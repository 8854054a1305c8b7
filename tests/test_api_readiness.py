"""``/readyz`` judges each task by the paths that can answer it: System 1, a fallback, or System 2.

System 1 here is a dead Jev server (every call a 500, its breaker opening). With a System-1
fallback (``engine_fallbacks``), checks are answered by the embedded engine and the replica stays
ready, degraded. Without one, tasks that escalate on failure are served by System 2 (a loopback
OpenAI-compatible server), checks that fail closed have no path, and the replica is not ready.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import SecretStr

from fastslow.policies import PolicyStore, load_policy
from fastslow.router.settings import BreakerSettings, JevSettings, System2Settings

from fakes.api_server import api_client, running_api, test_policy, test_settings
from fakes.jev_server import running_jev_server
from fakes.openai_server import openai_server, structured

FAILURES = 2
CHECK = {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "ls"}}}


def _dead_jev_settings(tmp_path: Path, url: str, **updates: Any) -> Any:
    return test_settings(
        tmp_path,
        engine="jev",
        jev=JevSettings(base_url=url, profile="jev", max_retries=0),
        breaker=BreakerSettings(failures=FAILURES, open_s=600),
        **updates,
    )


async def test_a_system1_fallback_answers_and_the_replica_stays_ready_degraded(tmp_path: Path) -> None:
    async with running_jev_server(None) as dead:
        settings = _dead_jev_settings(tmp_path, dead.url, engine_fallbacks={"jev": ["embedded"]})
        with running_api(settings) as api:
            key = await api.key("acme")
            async with api_client(api.url, key) as client:
                checks = [(await client.post("/v1/policy-check", json=CHECK)) for _ in range(FAILURES + 3)]
                ready = await client.get("/readyz")
                rules = [rule for r in checks for rule in r.json()["rules"]]
                stored = [(await client.get(f"/v1/decisions/{rule['decision_id']}")).json() for rule in rules]
    assert {r.status_code for r in checks} == {200}
    assert all(rule["probability"] is not None and rule["reason"] != "engine_error" for rule in rules)
    assert {d["engine"] for d in stored} == {"embedded"}  # the chain moved on; the decision names who answered
    assert len(dead.requests) == FAILURES  # and the breaker spared the dead engine the rest
    body = ready.json()
    assert ready.status_code == 200 and body["status"] == "ready" and body["degraded"] is True
    assert body["engines"] == {"embedded": True, "jev": False} and body["breakers"] == {"jev": "open"}
    assert set(body["paths"].values()) == {"system1"}


async def test_without_a_fallback_system2_serves_what_escalates_and_fail_closed_checks_have_no_path(
    tmp_path: Path,
) -> None:
    with openai_server(respond=lambda _body: structured({"answer": "billing"})) as (frontier_url, _server):
        async with running_jev_server(None) as dead:
            system2 = System2Settings(
                openai_base_url=frontier_url, openai_api_key=SecretStr("sk-test"), openai_api="chat", max_retries=0
            )
            settings = _dead_jev_settings(tmp_path, dead.url, system2=system2)
            policy = load_policy(settings.policy_file)
            with running_api(settings) as api:
                async with api_client(api.url, await api.key("acme")) as client:
                    await client.post("/v1/policy-check", json=CHECK)  # opens nothing yet: FAILURES calls
                    await client.post("/v1/policy-check", json=CHECK)
                    ready = await client.get("/readyz")
    body = ready.json()
    assert ready.status_code == 503 and body["status"] == "not_ready"
    assert body["breakers"] == {"jev": "open"}
    for name, task in policy.tasks.items():
        # Only OpenAI is configured here: a task escalating to Anthropic has no System-2 path either.
        configured = (task.escalate_to or policy.default_escalate_to or "").startswith("openai:")
        escalates = task.on_failure == "escalate" and not task.egress.local_only and configured
        assert body["paths"][name] == ("system2" if escalates else "none"), name
    assert "system2" in body["paths"].values() and "none" in body["paths"].values()
    # Only OpenAI has a key: the status names the model that has none, its tasks and the variable to set.
    status = body["system2_status"]
    assert status.startswith("partly configured: ") and "anthropic:claude-sonnet-4-6 for triage" in status
    assert "set ANTHROPIC_API_KEY" in status and "OPENAI_API_KEY" not in status


async def test_an_open_system2_breaker_leaves_a_task_without_a_path(tmp_path: Path) -> None:
    policy_file = test_policy(tmp_path / "p")
    async with running_jev_server(None) as dead:
        # A frontier that is configured but refuses every call: its breaker opens after FAILURES.
        system2 = System2Settings(
            openai_base_url=dead.url,
            openai_api_key=SecretStr("sk-test"),
            openai_api="chat",
            max_retries=0,
            breaker=BreakerSettings(failures=1, open_s=600),
        )
        settings = _dead_jev_settings(tmp_path, dead.url, system2=system2, policy_file=policy_file)
        with running_api(settings) as api:
            async with api_client(api.url, await api.key("acme")) as client:
                for text in ("I was charged twice", "My login fails", "Close my account"):
                    response = await client.post(
                        "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": text}]}
                    )
                    assert response.status_code == 200, response.text
                ready = await client.get("/readyz")
                metrics = (await client.get("/metrics")).text
    body = ready.json()
    assert body["system2"] == {"openai:gpt-5.5": "open"}
    assert 'fastslow_engine_breaker_state{engine="system2:openai:gpt-5.5"} 2.0' in metrics
    assert body["paths"]["support"] == "none" and ready.status_code == 503


def test_a_change_is_settling_until_read_unchanged_then_in_force(tmp_path: Path) -> None:
    path = test_policy(tmp_path)
    store = PolicyStore(path, loader=load_policy)
    assert store.change is None
    path.write_text(path.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    first = store.check(settle=True)
    assert first.settling and store.change == "settling"
    second = store.check(settle=True)
    assert second.changed and store.change is None
