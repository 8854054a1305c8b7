"""Every error status the API promises, each a clear JSON error, and never a 500 for bad input or outages.

401 missing or unknown key, 403 revoked key, 404 unknown decision or path, 413 oversized body
(plain or zstd), 415 a JSON body without Content-Type: application/json, 422 invalid request, 429
per-key rate limit (shared by replicas through the database), 503 when the decision log fails; an
engine outage makes decisions fail closed or escalate.
"""

from __future__ import annotations

import json
import socket
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard

from fastslow.api.app import RateLimit
from fastslow.api.store import DecisionStore, database_url_for
from fastslow.router.settings import JevSettings

from fakes.api_server import RunningApi, api_client, create_key, new_key, running_api, test_settings

MAX_BODY = 64 * 1024
CHECK = {"policies": ["tool_safety"], "text": "git: status"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(test_settings(tmp_path_factory.mktemp("api"), max_body_bytes=MAX_BODY)) as running:
        yield running


@pytest.fixture(scope="module")
def key(api: RunningApi) -> str:
    return create_key(api.settings, "acme")


def _error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] and error["message"]
    return error


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer fs_unknown"}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Bearer"}],
)
async def test_401_without_a_valid_key(api: RunningApi, headers: dict[str, str]) -> None:
    async with api_client(api.url, headers=headers) as client:
        response = await client.post("/v1/policy-check", json=CHECK)
    assert _error(response, 401)["type"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"


async def test_403_with_a_revoked_key(api: RunningApi) -> None:
    async with await DecisionStore.open(database_url_for(api.settings), migrate=False) as store:
        key, record = await store.create_key("acme", name="leaked")
        await store.revoke_key(record.id)
    async with api_client(api.url, key) as client:
        response = await client.get("/v1/decisions/anything")
    assert _error(response, 403)["type"] == "forbidden"
    assert "revoked" in response.json()["error"]["message"]


async def test_404_for_unknown_decisions_and_paths(api: RunningApi, key: str) -> None:
    async with api_client(api.url, key) as client:
        decision = await client.get("/v1/decisions/0123456789abcdef0123456789abcdef")
        path = await client.get("/v1/nothing-here")
        method = await client.delete("/v1/policy-check")
    assert _error(decision, 404)["type"] == "not_found"
    assert _error(path, 404)["type"] == "not_found"
    assert _error(method, 405)["type"] == "method_not_allowed"


async def _stream(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:  # sent chunked: no Content-Length to refuse up front
        yield chunk


async def test_413_for_bodies_over_the_limit_plain_or_compressed(api: RunningApi, key: str) -> None:
    big = {**CHECK, "text": "x" * MAX_BODY}
    bomb = zstandard.ZstdCompressor().compress(b'{"state": "' + b" " * (4 * MAX_BODY) + b'"}')
    assert len(bomb) < MAX_BODY // 10
    async with api_client(api.url, key) as client:
        plain = await client.post("/v1/policy-check", json=big)
        chunked = await client.post("/v1/policy-check", content=_stream(b"{" + b" " * MAX_BODY, b"}"))
        compressed = await client.post(
            "/v1/systemone", content=bomb, headers={"content-type": "application/json", "content-encoding": "zstd"}
        )
        after = await client.post("/v1/policy-check", json=CHECK)
    for response in (plain, chunked, compressed):
        assert _error(response, 413)["type"] == "payload_too_large"
    assert after.status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b'{"policies": "tool_safety", "text": "x"}', "policies"),
        (b'{"policies": ["tool_safety"], "text": 7}', "text"),
        (b'{"policies": ["tool_safety"], "tool_call": {"name": "x", "arguments": []}}', "tool_call.arguments"),
        (b"[]", "body"),
        (b"\xff\xfe", "body"),
    ],
)
async def test_422_names_the_field(api: RunningApi, key: str, body: bytes, field: str) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/policy-check", content=body, headers={"content-type": "application/json"})
    error = _error(response, 422)
    assert error["type"] == "invalid_request"
    assert error["field"] == field


JSON_BODIES = {
    "/v1/policy-check": CHECK,
    "/v1/policy-check/batch": {"items": [CHECK]},
    "/v1/route": {"task": "support", "messages": [{"role": "user", "content": "refund please"}]},
    "/v1/decisions/0123456789abcdef0123456789abcdef/outcome": {"label": "allow"},
}


@pytest.mark.parametrize("path", list(JSON_BODIES))
@pytest.mark.parametrize(
    ("headers", "named"),
    [({}, "(no Content-Type was given)"), ({"content-type": "text/plain; charset=utf-8"}, "'text/plain'")],
)
async def test_415_names_the_content_type_a_json_body_needs(
    api: RunningApi, key: str, path: str, headers: dict[str, str], named: str
) -> None:
    # A valid body: only its Content-Type is wrong, or missing (curl -d sends form-urlencoded, a
    # hand-written client often sends none).
    async with api_client(api.url, key) as client:
        response = await client.post(path, content=json.dumps(JSON_BODIES[path]).encode(), headers=headers)
    error = _error(response, 415)
    assert error["type"] == "unsupported_media_type" and "field" not in error
    assert "send the JSON body with the header Content-Type: application/json" in error["message"]
    assert named in error["message"]


async def test_the_jev_gateway_still_reads_a_body_without_content_type_as_json(api: RunningApi, key: str) -> None:
    body = {"state": "refund please", "questions": {"q": {"type": "noul", "instructions": "A refund?"}}}
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", content=json.dumps(body).encode())
    assert response.status_code == 200, response.text  # as Jev's own /v1/systemone does


async def test_429_per_key_and_shared_by_replicas(tmp_path: Path) -> None:
    settings = test_settings(tmp_path)
    limit = RateLimit(requests=3, window_s=3600)
    hasty, patient = await new_key(settings, "acme"), await new_key(settings, "acme")
    # Two replicas on one database: the limit is counted there, not in either process.
    with running_api(settings, rate_limit=limit) as one, running_api(settings, rate_limit=limit) as two:
        async with api_client(one.url, hasty) as a, api_client(two.url, hasty) as b:
            statuses = [(await c.get("/v1/decisions/x")).status_code for c in (a, b, a)]
            limited = await b.get("/v1/decisions/x")
        async with api_client(one.url, patient) as other:
            unaffected = await other.get("/v1/decisions/x")
        async with api_client(two.url) as anyone:
            metrics = (await anyone.get("/metrics")).text
    assert statuses == [404, 404, 404]
    assert _error(limited, 429)["type"] == "rate_limited"
    assert 1 <= int(limited.headers["retry-after"]) <= 3600
    assert unaffected.status_code == 404
    assert "fastslow_rate_limited_requests_total 1.0" in metrics


async def test_a_batch_counts_each_item_against_the_rate_limit(tmp_path: Path) -> None:
    settings = test_settings(tmp_path)
    key = await new_key(settings, "acme")
    with running_api(settings, rate_limit=RateLimit(requests=4, window_s=3600)) as api:
        async with api_client(api.url, key) as client:
            three = await client.post("/v1/policy-check/batch", json={"items": [CHECK] * 3})
            two = await client.post("/v1/policy-check/batch", json={"items": [CHECK] * 2})  # 5 > 4
            one = await client.post("/v1/policy-check", json=CHECK)  # refused calls count too, as ever
    assert three.status_code == 200 and len(three.json()["results"]) == 3
    assert _error(two, 429)["type"] == "rate_limited"
    assert _error(one, 429)["type"] == "rate_limited"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_an_engine_outage_fails_closed_or_escalates_never_500(tmp_path: Path) -> None:
    down = JevSettings(base_url=f"http://127.0.0.1:{_closed_port()}", profile="jev", timeout_s=2.0, max_retries=0)
    policy = tmp_path / "policy.yaml"
    text = test_settings(tmp_path).policy_file.read_text(encoding="utf-8")  # type: ignore[union-attr]
    policy.write_text(text.replace("engine: embedded", "engine: jev"), encoding="utf-8")
    settings = test_settings(tmp_path, engine="jev", jev=down, policy_file=policy)
    with running_api(settings) as api:
        key = await api.key("acme")
        async with api_client(api.url, key) as client:
            check = await client.post("/v1/policy-check", json=CHECK)
            route = await client.post(
                "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": "refund please"}]}
            )
            gateway = await client.post(
                "/v1/systemone", json={"state": "x", "questions": {"q": {"type": "noul", "instructions": "y"}}}
            )
            ready = await client.get("/readyz")
            metrics = (await client.get("/metrics")).text
    assert check.status_code == 200 and check.json()["verdict"] == "deny"  # tool_safety fails closed
    assert {r["reason"] for r in check.json()["rules"]} == {"engine_error"}
    assert route.status_code == 200 and route.json()["route"] is None  # escalated; no System 2 configured
    assert route.json()["decision"]["reason"] == "engine_error"
    assert _error(gateway, 503)["type"] == "engine_unavailable"
    assert ready.status_code == 503 and ready.json()["engines"] == {"jev": False}
    # One error per engine call made (the check's one call for all its rules, the route's and the
    # gateway's), under the engine's own name: not one per decision.
    assert 'fastslow_engine_errors_total{engine="jev:jev",kind="error"} 3.0' in metrics


async def test_a_store_outage_is_503_and_nothing_is_acknowledged(tmp_path: Path) -> None:
    settings = test_settings(tmp_path)
    path = Path(database_url_for(settings).split("///", 1)[1])
    with running_api(settings) as api:
        key = await api.key("acme")
        async with api_client(api.url, key) as client:
            with sqlite3.connect(path) as db:  # the decision table goes away under the running server
                db.execute("ALTER TABLE decisions RENAME TO decisions_away")
            down = await client.post("/v1/policy-check", json=CHECK)
            with sqlite3.connect(path) as db:
                db.execute("ALTER TABLE decisions_away RENAME TO decisions")
            back = await client.post("/v1/policy-check", json=CHECK)
    assert _error(down, 503)["type"] == "store_unavailable"
    assert back.status_code == 200
