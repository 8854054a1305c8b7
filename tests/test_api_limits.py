"""Work limits and input that is what it claims, over the real API on loopback.

Every body is strict JSON (UTF-8 without a byte order mark, no duplicate keys, no lone surrogates,
no NaN, no deeper than ``limits.max_depth``); tool-call arguments, questions and options are
bounded; the gateway's engine call has a deadline; an id that cannot be a decision's never
reaches the database. Each refusal is a 4xx naming the field (and the limit), never a 500.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
import zstandard

from fastslow.router.settings import JevSettings, LimitsSettings

from fakes.api_server import RunningApi, api_client, create_key, running_api, test_policy, test_settings
from fakes.databases import postgres_schema_url  # noqa: F401  (fixture)
from fakes.jev_server import Reply, running_jev_server

# Wall-clock assertions: kept on one xdist worker (make test), away from each other.
pytestmark = pytest.mark.xdist_group("timing")

JSON = {"content-type": "application/json"}
NOUL = {"type": "noul", "instructions": "Does the customer ask for a refund?"}
DEPTH = LimitsSettings().max_depth


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    with running_api(test_settings(tmp_path_factory.mktemp("api"))) as running:
        yield running


@pytest.fixture(scope="module")
def key(api: RunningApi) -> str:
    return create_key(api.settings, "acme")


def _refused(response: httpx2.Response, status: int = 422) -> dict[str, Any]:
    """The error of a refusal: the status asked for, a JSON error body, and a field."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] and error["message"] and error["field"], error
    return error


def _nested_state(levels: int) -> bytes:
    """A gateway body whose state is ``levels`` arrays deep (the body one more)."""
    state = b"[" * levels + b"]" * levels
    return b'{"state": ' + state + b', "questions": {"refund": ' + json.dumps(NOUL).encode() + b"}}"


@pytest.mark.parametrize("levels", [480, 2_000, 100_000])
@pytest.mark.parametrize("encoding", ["identity", "zstd"])
async def test_deep_states_are_refused_naming_the_depth_limit(
    api: RunningApi, key: str, levels: int, encoding: str
) -> None:
    body = _nested_state(levels)
    headers = dict(JSON)
    if encoding == "zstd":
        body = zstandard.ZstdCompressor().compress(body)
        headers["content-encoding"] = "zstd"
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", content=body, headers=headers)
    error = _refused(response)
    assert "limits.max_depth" in error["message"] and str(DEPTH) in error["message"]
    # Named where the limit is passed: the state's 64th array, the body's 65th level.
    assert error["field"] == ".".join(["state"] + ["0"] * (DEPTH - 1))


async def test_a_megabyte_of_brackets_is_refused_quickly(api: RunningApi, key: str) -> None:
    started = time.monotonic()
    async with api_client(api.url, key) as client:
        for path in ("/v1/systemone", "/v1/policy-check", "/v1/route"):
            error = _refused(await client.post(path, content=b"[" * 1_000_000, headers=JSON))
            assert "limits.max_depth" in error["message"]
    assert time.monotonic() - started < 10


async def test_the_deepest_allowed_state_is_answered(api: RunningApi, key: str) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", content=_nested_state(DEPTH - 1), headers=JSON)
    assert response.status_code == 200, response.text
    assert response.json()["answers"]["refund"]["type"] == "noul"


def _storing_policy(directory: Path) -> Path:
    path = test_policy(directory)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["tasks"]["destructive_action"]["store_state"] = True
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _deep_call(levels: int) -> bytes:
    """A policy check of a tool call whose body nests ``levels`` deep (arguments are level 3)."""
    inner = b"[" * (levels - 3) + b"1" + b"]" * (levels - 3)
    return (
        b'{"policies": ["destructive_action"], "tool_call": {"name": "shell", "arguments": {"data": ' + inner + b"}}}"
    )


async def test_the_largest_allowed_depth_goes_through_and_is_stored(tmp_path: Path) -> None:
    # The most limits.max_depth allows: json.dumps (the check's state line, the log's canonical
    # JSON) must take everything that passed it.
    limits = LimitsSettings(max_depth=512)
    settings = test_settings(tmp_path, limits=limits, policy_file=_storing_policy(tmp_path / "policy"))
    with running_api(settings) as api:
        async with api_client(api.url, await api.key("acme")) as client:
            deepest = await client.post("/v1/policy-check", content=_deep_call(512), headers=JSON)
            assert deepest.status_code == 200, deepest.text
            stored = await client.get(f"/v1/decisions/{deepest.json()['decision_id']}")
            too_deep = await client.post("/v1/policy-check", content=_deep_call(513), headers=JSON)
            gateway = await client.post("/v1/systemone", content=_nested_state(511), headers=JSON)
    assert stored.status_code == 200, stored.text
    assert stored.json()["state_text"] == json.dumps("shell: data=" + "[" * 509 + "1" + "]" * 509)
    assert gateway.status_code == 200, gateway.text  # an engine takes a state that deep too
    error = _refused(too_deep)
    assert "limits.max_depth (512" in error["message"]
    assert error["field"].startswith("tool_call.arguments.data.0.0.")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        # Lone surrogates, from JSON escapes, in a question name, an option name, a level, the state.
        (rb'{"state": "x", "questions": {"\ud800": {"type": "noul", "instructions": "y"}}}', r"questions.\ud800"),
        (
            rb'{"state": "x", "questions": {"q": {"type": "choice", "criteria": {"\udc00": null, "b": null}}}}',
            r"questions.q.criteria.\udc00",
        ),
        (
            rb'{"state": "x", "questions": {"q": {"type": "score", "criteria": ["low", "\udfff"]}}}',
            "questions.q.criteria.1",
        ),
        (
            rb'{"state": {"ticket": "a \ud83d b"}, "questions": {"q": ' + json.dumps(NOUL).encode() + b"}}",
            "state.ticket",
        ),
        # Duplicate keys: the first is not silently replaced.
        (b'{"state": "x", "state": "y", "questions": {"q": ' + json.dumps(NOUL).encode() + b"}}", "state"),
        (
            b'{"state": "x", "questions": {"q": {"type": "noul", "type": "choice", "instructions": "y"}}}',
            "questions.q.type",
        ),
        # Not JSON numbers.
        (b'{"state": [NaN], "questions": {"q": ' + json.dumps(NOUL).encode() + b"}}", "state.0"),
        (b'{"state": {"n": -Infinity}, "questions": {"q": ' + json.dumps(NOUL).encode() + b"}}", "state.n"),
        (b'{"state": [1e999], "questions": {"q": ' + json.dumps(NOUL).encode() + b"}}", "state.0"),
    ],
)
async def test_what_is_not_json_text_is_refused_at_the_gateway(
    api: RunningApi, key: str, body: bytes, field: str
) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", content=body, headers=JSON)
    assert _refused(response)["field"] == field


async def test_a_multipart_request_part_is_just_as_strict(api: RunningApi, key: str) -> None:
    good = json.dumps({"state": "x", "questions": {"q": NOUL}}).encode()
    cases = {
        b"\xef\xbb\xbf" + good: "request",
        good.replace(b'"x"', b'"\\ud800"'): "state",
        _nested_state(300): ".".join(["state"] + ["0"] * (DEPTH - 1)),
    }
    async with api_client(api.url, key) as client:
        for part, field in cases.items():
            files = {"request": ("request.json", part, "application/json")}
            assert _refused(await client.post("/v1/systemone", files=files))["field"] == field


CHECK = {"policies": ["tool_safety"], "text": "git: status"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"\xef\xbb\xbf" + json.dumps(CHECK).encode(), "body"),
        (json.dumps(CHECK).encode("utf-16"), "body"),  # with its byte order mark
        (json.dumps(CHECK).encode("utf-16-le"), "body"),  # without one
        (json.dumps(CHECK).encode("utf-32"), "body"),
        (b'{"policies": ["tool_safety"], "text": "git: status", "text": "rm -rf /"}', "text"),
        (
            b'{"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "rm -rf /"}},'
            b' "tool_call": {"name": "git", "arguments": {"command": "status"}}}',
            "tool_call",
        ),
        (
            b'{"policies": ["tool_safety"], "tool_call": {"name": "x", "arguments": {"n": NaN}}}',
            "tool_call.arguments.n",
        ),
        (b'{"policies": ["tool_safety"], "text": "a \\udc00 b"}', "text"),
    ],
)
async def test_policy_check_bodies_must_be_strict_json(api: RunningApi, key: str, body: bytes, field: str) -> None:
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/policy-check", content=body, headers=JSON)
    assert _refused(response)["field"] == field


async def test_route_and_outcome_bodies_are_strict_too(api: RunningApi, key: str) -> None:
    route = b'{"task": "support", "task": "triage", "messages": [{"role": "user", "content": "hi"}]}'
    async with api_client(api.url, key) as client:
        routed = await client.post("/v1/route", content=route, headers=JSON)
        decided = await client.post(
            "/v1/route", json={"task": "support", "messages": [{"role": "user", "content": "refund please"}]}
        )
        outcome = await client.post(
            f"/v1/decisions/{decided.json()['decision']['id']}/outcome",
            content=b'{"label": "billing", "label": "technical"}',
            headers=JSON,
        )
    assert _refused(routed)["field"] == "task"
    assert _refused(outcome)["field"] == "label"


async def test_a_huge_tool_argument_is_refused_naming_the_limit(api: RunningApi, key: str) -> None:
    limit = LimitsSettings().max_argument_chars
    call = {"name": "write_file", "arguments": {"path": "a.txt", "content": "x" * 900_000}}
    started = time.monotonic()
    async with api_client(api.url, key) as client:
        one = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], "tool_call": call})
        batch = await client.post(
            "/v1/policy-check/batch", json={"items": [CHECK, {"policies": ["tool_safety"], "tool_call": call}]}
        )
        # One character over, as compact JSON (what the limit measures).
        over = {"name": "write_file", "arguments": {"c": "x" * (limit + 1 - len('{"c":""}'))}}
        just_over = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], "tool_call": over})
    elapsed = time.monotonic() - started
    for response, field in ((one, "tool_call.arguments"), (batch, "items.1.tool_call.arguments")):
        error = _refused(response)
        assert error["field"] == field
        assert "limits.max_argument_chars" in error["message"] and str(limit) in error["message"]
    assert f"{limit + 1} characters" in _refused(just_over)["message"]
    assert elapsed < 30  # refused before the embedder, which takes minutes over 900 KB


async def test_thousands_of_options_are_refused_before_any_engine_work(api: RunningApi, key: str) -> None:
    criteria = {f"option {i}": None for i in range(3_000)}
    body = {"state": "which one?", "questions": {"pick": {"type": "choice", "criteria": criteria}}}
    levels = {"state": "how much?", "questions": {"rate": {"type": "score", "criteria": [f"{i}" for i in range(300)]}}}
    async with api_client(api.url, key) as client:
        started_cpu, started = time.process_time(), time.monotonic()
        response = await client.post("/v1/systemone", json=body)
        cpu, elapsed = time.process_time() - started_cpu, time.monotonic() - started
        scored = await client.post("/v1/systemone", json=levels)
    error = _refused(response)
    assert error["field"] == "questions.pick.criteria"
    assert "limits.max_options" in error["message"] and "255" in error["message"]
    assert _refused(scored)["field"] == "questions.rate.criteria"
    # Embedding 3,000 options costs many CPU-seconds; refusing them, a few milliseconds (the
    # server runs in this process, so its CPU time is counted here).
    assert elapsed < 5 and cpu < 2


async def test_more_questions_than_the_limit_are_refused(api: RunningApi, key: str) -> None:
    questions = {f"q{i}": NOUL for i in range(LimitsSettings().max_questions + 1)}
    async with api_client(api.url, key) as client:
        response = await client.post("/v1/systemone", json={"state": "x", "questions": questions})
    error = _refused(response)
    assert error["field"] == "questions"
    assert "limits.max_questions" in error["message"] and "65 questions" in error["message"]


async def test_the_gateway_stops_its_engine_at_its_budget(tmp_path: Path) -> None:
    async with running_jev_server("jev") as jev:
        jev_settings = JevSettings(base_url=jev.url, profile="jev", timeout_s=60.0, max_retries=0)
        limits = LimitsSettings(gateway_timeout_s=0.5)
        with running_api(test_settings(tmp_path, engine="jev", jev=jev_settings, limits=limits)) as api:
            jev.script(Reply(body={"answers": {}}, delay_s=30.0))  # the next request to arrive waits
            async with api_client(api.url, await api.key("acme")) as client:
                started = time.monotonic()
                response = await client.post("/v1/systemone", json={"state": "x", "questions": {"q": NOUL}})
                elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert response.json()["error"]["type"] == "engine_timeout"
    assert elapsed < 20  # well before the engine's own 60 s and the reply's 30 s


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_an_id_that_cannot_be_a_decision_is_a_404_without_a_query(
    tmp_path: Path, request: pytest.FixtureRequest, database: str
) -> None:
    updates: dict[str, Any] = {}
    if database == "postgresql":
        updates["database_url"] = request.getfixturevalue("postgres_schema_url")
    with running_api(test_settings(tmp_path, **updates)) as api:
        async with api_client(api.url, await api.key("acme")) as client:
            decided = await client.post("/v1/policy-check", json=CHECK)
            real = decided.json()["decision_id"]
            responses = []
            for bad in ("%00", f"{real[:16]}%00{real[17:]}", "%E2%80%AE" + real[3:], "..%5C..", real.upper()):
                responses.append(await client.get(f"/v1/decisions/{bad}"))
                responses.append(await client.post(f"/v1/decisions/{bad}/outcome", json={"label": "allow"}))
            found = await client.get(f"/v1/decisions/{real}")
    for response in responses:
        assert _refused(response, 404)["field"] == "decision_id"
    assert found.status_code == 200, found.text  # the store still answers: nothing failed it
