"""Escalation over HTTP: System 2 (a fake OpenAI-compatible server on loopback) settles what System 1 could not.

The response says System 2 was consulted, the log keeps it as a System-2 decision, "System 2 was
right" can be recorded for it, and the model's thoughts appear in no response body.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import SecretStr

from fastslow.api.store import DecisionStore, database_url_for
from fastslow.router.settings import System2Settings

from fakes.api_server import SEEN_RESPONSES, api_client, new_key, running_api, test_policy, test_settings
from fakes.openai_server import openai_server, structured

AMBIGUOUS = "My invoice page crashes when I log in"  # billing, technical or account: System 1 is unsure
THOUGHT = "CANARY-THOUGHT-7f3a: the customer sounds vague"


async def test_an_unsure_route_is_settled_by_system_2_and_can_be_judged(tmp_path: Path) -> None:
    with openai_server(respond=lambda _body: structured({"answer": "technical"}, reasoning=THOUGHT)) as (url, server):
        system2 = System2Settings(openai_api_key=SecretStr("sk-test"), openai_base_url=url)
        settings = test_settings(tmp_path, system2=system2)
        with running_api(settings) as api:
            key = await new_key(settings, "acme")
            async with api_client(api.url, key) as client:
                seen_before = len(SEEN_RESPONSES.responses)
                routed = await client.post(
                    "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": AMBIGUOUS}]}
                )
                decision = routed.json()["decision"]
                stored = await client.get(f"/v1/decisions/{decision['id']}")
                judged = await client.post(f"/v1/decisions/{decision['id']}/outcome", json={"system2_correct": True})
                metrics = await client.get("/metrics")
    assert routed.status_code == 200, routed.text
    assert routed.json()["system2"] is True and routed.json()["route"] == "technical"
    assert decision["system"] == 2 and decision["reason"] in ("low_confidence", "small_margin")
    assert server.requests, "System 2 was never asked"
    assert stored.json()["system"] == 2 and stored.json()["outcome"] == "technical"
    assert judged.status_code == 201 and judged.json()["system2_correct"] is True
    assert 'fastslow_escalations_total{result="system2",task="support"} 1.0' in metrics.text
    assert not any(b"CANARY-THOUGHT" in r.body for r in SEEN_RESPONSES.responses[seen_before:])


async def test_a_learning_task_learns_system_2s_answer_and_an_outcome_relabels_it(tmp_path: Path) -> None:
    policy = yaml.safe_load(test_policy(tmp_path).read_text(encoding="utf-8"))
    policy["tasks"]["support"].update(store_state=True, learn={"retrain_after": 1})
    path = tmp_path / "learning.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    with openai_server(respond=lambda _body: structured({"answer": "technical"})) as (url, _server):
        system2 = System2Settings(openai_api_key=SecretStr("sk-test"), openai_base_url=url)
        settings = test_settings(tmp_path, system2=system2, policy_file=path)
        with running_api(settings) as api:
            key = await new_key(settings, "acme")
            async with api_client(api.url, key) as client:
                routed = await client.post(
                    "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": AMBIGUOUS}]}
                )
                decision = routed.json()["decision"]
                store = await DecisionStore.open(database_url_for(settings))
                try:
                    learned = await store.learned.list()
                    relabelled = await client.post(f"/v1/decisions/{decision['id']}/outcome", json={"label": "billing"})
                    after = await store.learned.list(withdrawn=True)
                finally:
                    await store.aclose()
                metrics = await client.get("/metrics")
    assert decision["system"] == 2 and decision["examples_version"] == ""
    assert [(e.text, e.option, e.source) for e in learned] == [(AMBIGUOUS, "technical", "system2")]
    assert relabelled.status_code == 201, relabelled.text
    assert [(e.option, e.source, e.retracted_at) for e in after] == [("billing", "outcome", None)]
    assert 'fastslow_learned_examples_total{result="added",task="support"} 2.0' in metrics.text
