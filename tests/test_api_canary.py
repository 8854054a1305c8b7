"""The thought canary, over HTTP: after routes, policy checks and gateway calls whose System 1 and
System 2 both think out loud, no thought is in any response body or header, in ``/metrics``, or in
the decision log (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import SecretStr

from fastslow.router.settings import System2Settings

from fakes.api_server import SEEN_RESPONSES, api_client, new_key, running_api, test_settings
from fakes.canary import CANARY, ThinkingChat, ThinkingJevServer
from fakes.databases import database_url, dump_rows, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.openai_server import openai_server


def _escalating_policy(path: Path) -> Path:
    """The test policy, with checks escalating to System 2 when System 1 gives no answer."""
    doc = yaml.safe_load(path.read_text())
    doc["tasks"]["tool_safety"]["on_failure"] = "escalate"
    doc["tasks"]["tool_safety"]["egress"] = {"local_only": False}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def test_no_thought_reaches_responses_metrics_or_the_decision_log(
    tmp_path: Path,
    database_url: str,  # noqa: F811
) -> None:
    jev = ThinkingJevServer()
    jev.start()
    chat = ThinkingChat()
    try:
        with openai_server(respond=chat) as (chat_url, chat_server):
            settings = test_settings(
                tmp_path,
                engine="jev",
                database_url=database_url,
                jev={"base_url": jev.url, "profile": "structured", "timeout_s": 10.0},
                system2=System2Settings(
                    default="openai:gpt-test", openai_api_key=SecretStr("sk-test"), openai_base_url=chat_url
                ),
            )
            settings = settings.model_copy(update={"policy_file": _escalating_policy(settings.policy_file)})
            # The shipped policy pins no engine, so every task asks the thinking structured server.
            with running_api(settings) as api:
                key = await new_key(settings, "acme")
                async with api_client(api.url, key) as client:
                    seen_before = len(SEEN_RESPONSES.responses)
                    routed = await client.post(
                        "/v1/route",
                        json={"task": "support", "messages": [{"role": "user", "content": "my invoice is odd"}]},
                    )
                    checked = await client.post(
                        "/v1/policy-check",
                        json={"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"c": "ls"}}},
                    )
                    gateway = await client.post(
                        "/v1/systemone",
                        json={"state": "hi", "questions": {"q": {"type": "noul", "instructions": "Is it a greeting?"}}},
                    )
                    fetched = await client.get(f"/v1/decisions/{routed.json()['decision']['id']}")
                    metrics = await client.get("/metrics")
                    seen = SEEN_RESPONSES.responses[seen_before:]
    finally:
        jev.stop()

    assert routed.status_code == 200, routed.text
    assert routed.json()["system2"] is True, "System 2 was never consulted: the scan would prove little"
    assert checked.status_code == 200 and checked.json()["system2"] is True, checked.text
    assert gateway.status_code == 200 and fetched.status_code == 200 and metrics.status_code == 200
    # The canary really went out, from both systems.
    assert jev.thoughts_served >= 3
    assert "reasoning" in chat.served and chat_server.requests
    assert len(seen) >= 5
    for response in seen:
        assert CANARY.encode() not in response.body, f"thought in the body of {response.method} {response.url}"
        assert CANARY not in str(response.headers), f"thought in the headers of {response.method} {response.url}"
    assert CANARY not in metrics.text
    assert CANARY not in dump_rows(database_url)
