"""The review queue over HTTP, against the real app on loopback (SQLite and PostgreSQL): a reviewed check
waits in the queue and is settled over the API (idempotent, a different settlement a 409), scopes and
tenants are kept apart, the tenant's webhook hears of it, and an in-process graph paused at its gate
waits in the same queue and resumes with the settled value.

System 1 is a Jev fake; the policy's bands make every answer a review (``review_me``) or an allow
(``let_through``), so the verdicts are certain without training anything.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from pydantic import SecretStr
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from fastslow.api.store import DecisionStore
from fastslow.graphs import resume_reviewed
from fastslow.router.settings import JevSettings, ReviewSettings, WebhookSettings

from fakes.api_server import RunningApi, api_client, create_key, running_api, test_settings
from fakes.databases import postgres_server, postgres_url_in_schema
from fakes.jev_server import JevFakeServer
from fakes.review_graphs import REVIEW_POLICY, gated_graph, scripted_router
from fakes.webhooks import WebhookReceiver, signed_by, webhook_receiver

SECRET = "whsec-api-test"
CALL = {"name": "run_sql", "arguments": {"query": "UPDATE users SET plan = 'free' WHERE id = '<1>'"}}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The module's decision log: a SQLite file, or a fresh PostgreSQL schema (one server per database)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('log') / 'fastslow.sqlite3'}"
        return
    schema = f"fastslow_reviews_{uuid.uuid4().hex[:12]}"
    admin = create_engine(make_url(postgres_server()).set(drivername="postgresql+psycopg"))
    try:
        with admin.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield postgres_url_in_schema(schema)
    finally:
        with admin.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="module")
def hook() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory, database_url: str, hook: WebhookReceiver) -> Iterator[RunningApi]:
    engine = JevFakeServer("jev")
    engine.start()
    tmp: Path = tmp_path_factory.mktemp("api")
    policy = tmp / "policy.yaml"
    policy.write_text(REVIEW_POLICY, encoding="utf-8")
    reviews = ReviewSettings(webhooks={"acme": WebhookSettings(url=hook.url, secret=SecretStr(SECRET))}, sweep_s=0.05)
    settings = test_settings(
        tmp,
        policy_file=policy,
        engine="jev",
        jev=JevSettings(base_url=engine.url, profile="jev", max_retries=0),
        database_url=database_url,
        reviews=reviews,
    )
    try:
        with running_api(settings) as running:
            yield running
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def keys(api: RunningApi) -> dict[str, str]:
    return {
        "reviewer": create_key(api.settings, "acme", scopes=("review", "read")),
        "checker": create_key(api.settings, "acme", scopes=("check",)),
        "reader": create_key(api.settings, "acme", scopes=("read",)),
        "other": create_key(api.settings, "globex", scopes=("check", "review", "read")),
    }


async def _review(api: RunningApi, key: str, review_id: str) -> dict[str, Any]:
    async with api_client(api.url, key) as client:
        response = await client.get(f"/v1/reviews/{review_id}")
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def test_a_reviewed_check_is_queued_settled_over_the_api_and_read_back(
    api: RunningApi, keys: dict[str, str], hook: WebhookReceiver
) -> None:
    async with api_client(api.url, keys["checker"]) as client:
        checked = (await client.post("/v1/policy-check", json={"policies": ["review_me"], "tool_call": CALL})).json()
    assert checked["verdict"] == "review" and checked["review_id"] is not None
    review_id = checked["review_id"]

    async with api_client(api.url, keys["reader"]) as client:
        queue = (await client.get("/v1/reviews", params={"status": "pending"})).json()
    waiting = next(r for r in queue["reviews"] if r["id"] == review_id)
    assert (waiting["status"], waiting["verdict"], waiting["source"], waiting["resume"]) == (
        "pending",
        None,
        "api",
        None,
    )
    assert (waiting["task"], waiting["rule"], waiting["decision_id"]) == ("review_me", "risky", checked["decision_id"])
    assert waiting["subject"] == {"tool_call": {"name": "run_sql", "args": CALL["arguments"]}}
    assert waiting["probabilities"] == {"risky": pytest.approx(checked["rules"][0]["probability"])}
    assert waiting["policy_version"] == checked["policy_version"]

    body = {"verdict": "allow", "note": "the user asked for it", "label": "deny"}
    async with api_client(api.url, keys["reviewer"]) as client:
        settled = await client.post(f"/v1/reviews/{review_id}", json=body)
        again = await client.post(f"/v1/reviews/{review_id}", json={"verdict": "allow"})
        different = await client.post(f"/v1/reviews/{review_id}", json={"verdict": "deny"})
    assert settled.status_code == 200, settled.text
    assert again.status_code == 200 and again.json() == settled.json()  # idempotent: the first settlement
    assert different.status_code == 409
    conflict = different.json()
    assert conflict["error"]["type"] == "conflict" and conflict["review"] == settled.json()

    read = await _review(api, keys["reader"], review_id)
    assert (read["status"], read["verdict"], read["note"]) == ("allowed", "allow", "the user asked for it")
    assert read["settled_by"] is not None and read["settled_at"] is not None and read["resume"] is None
    # The label, given on purpose, is the rule decision's outcome; allowing alone would not have been.
    async with await DecisionStore.open(api.settings.database_url or "", migrate=False) as store:
        outcomes = [o for d, o in await store.outcomes(tenant="acme") if d.id == checked["decision_id"]]
    assert [o.label for o in outcomes] == ["deny"]

    events = hook.wait_for(2, where=lambda d: d.event["review"]["id"] == review_id)
    # Sent concurrently when both are due in one sweep, so either may arrive first (docs/reviews.md:
    # a receiver trusts the review's status, not the order of its events).
    assert sorted(d.headers["x-fastslow-event"] for d in events) == ["review.opened", "review.settled"]
    assert all(signed_by(SECRET, d) for d in events)


async def test_only_a_review_verdict_opens_a_review_in_checks_and_batches(
    api: RunningApi, keys: dict[str, str]
) -> None:
    items = [{"policies": ["let_through"], "tool_call": CALL}, {"policies": ["review_me"], "text": "rotate the keys"}]
    async with api_client(api.url, keys["checker"]) as client:
        allowed = (await client.post("/v1/policy-check", json=items[0])).json()
        batch = (await client.post("/v1/policy-check/batch", json={"items": items})).json()
    assert allowed["verdict"] == "allow" and allowed["review_id"] is None
    first, second = batch["results"]
    assert first["review_id"] is None and second["verdict"] == "review"
    review = await _review(api, keys["reviewer"], second["review_id"])
    assert review["subject"] == {"text": "rotate the keys"} and review["status"] == "pending"


async def test_scopes_and_tenants_keep_reviews_apart(api: RunningApi, keys: dict[str, str]) -> None:
    async with api_client(api.url, keys["checker"]) as client:
        checked = (await client.post("/v1/policy-check", json={"policies": ["review_me"], "tool_call": CALL})).json()
        path = f"/v1/reviews/{checked['review_id']}"
        by_checker = await client.post(path, json={"verdict": "allow"})
        listed_by_checker = await client.get("/v1/reviews")
    assert by_checker.status_code == 403 and "'review'" in by_checker.json()["error"]["message"]
    assert listed_by_checker.status_code == 403
    async with api_client(api.url, keys["reader"]) as client:
        assert (await client.post(path, json={"verdict": "allow"})).status_code == 403  # reading is not settling
    async with api_client(api.url, keys["other"]) as client:
        assert (await client.get(path)).status_code == 404
        assert (await client.post(path, json={"verdict": "deny"})).status_code == 404
        assert checked["review_id"] not in {r["id"] for r in (await client.get("/v1/reviews")).json()["reviews"]}
    async with api_client(api.url, keys["reviewer"]) as client:
        assert (await client.get("/v1/reviews/not-a-review-id")).status_code == 404
        assert (await client.post(path, json={"verdict": "maybe"})).status_code == 422
        assert (await client.get(path)).json()["status"] == "pending"  # nothing above settled it


executed: list[str] = []


@pytest.fixture(autouse=True)
def _clear_executed() -> None:
    executed.clear()


@tool
def run_sql(query: str) -> str:
    """Run a SQL statement."""
    executed.append(query)
    return "1 row"


async def test_a_graph_paused_in_process_waits_in_the_same_queue_and_resumes_with_the_settled_value(
    api: RunningApi, keys: dict[str, str]
) -> None:
    async with await DecisionStore.open(api.settings.database_url or "", migrate=False) as store:
        assert api.settings.policy_file is not None
        # The server's policy; System 1 a script, 0.6 sure of harm: review_me's band.
        router = scripted_router(api.settings.policy_file).with_sink(store.sink("acme", write_behind=True))
        app = gated_graph(router, run_sql, {"name": "run_sql", "args": {"query": "DELETE FROM carts"}, "id": "c1"})
        config = {"configurable": {"thread_id": f"graph-{uuid.uuid4().hex}"}}
        paused = await app.ainvoke({"messages": [HumanMessage("empty the carts table")]}, config)
        review_id = paused["__interrupt__"][0].value["review_id"]

        async with api_client(api.url, keys["reviewer"]) as client:
            queue = (await client.get("/v1/reviews", params={"status": "pending"})).json()["reviews"]
            waiting = next(r for r in queue if r["id"] == review_id)
            assert (waiting["source"], waiting["thread_id"], waiting["tool_call_id"]) == (
                "graph",
                config["configurable"]["thread_id"],
                "c1",
            )
            assert (await client.post(f"/v1/reviews/{review_id}", json={"verdict": "allow"})).status_code == 200

        async def over_http(found_id: str) -> Any:  # what a client holding a key reads
            return SimpleNamespace(**await _review(api, keys["reviewer"], found_id))

        assert (await _review(api, keys["reviewer"], review_id))["resume"] == "allow"
        out = await resume_reviewed(app, config, over_http)
    assert executed == ["DELETE FROM carts"]
    assert out["messages"][-1].content == "done"
