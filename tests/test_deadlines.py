"""Deadlines that end the work, and one tenant's long request that cannot slow another's.

The embedded engine runs its model in bounded steps (at most 64 tokens of short texts, or one
text of at most 256) under a lock handed round-robin across tenants, and stops between steps once
its budget is gone. Before that, a timed-out request kept the embedder (and its lock) busy for seconds
after its answer went out, and every request behind it timed out too. Timing bounds here are
generous (the budget plus a second or more); CPU is measured with ``time.process_time()``, which
counts this process only (the API runs in it, in a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from fastslow.api.store import DecisionStore, database_url_for
from fastslow.api.store._models import DecisionRow
from fastslow.engines.embedded import E5Embedder, EmbeddedEngine
from fastslow.router import Choice, EngineTimeout, Noul, ReadOptions, Settings, request_scope
from fastslow.router.engine_api import Abandoned, StopToken
from fastslow.router.settings import EmbeddedSettings, JevSettings, LimitsSettings

from fakes.api_server import EXAMPLE_POLICY, RunningApi, api_client, running_api, test_settings
from fakes.slow_server import Mode, running_slow_server

# Wall-clock and CPU bounds: kept in one xdist group, so two of them never run at once.
pytestmark = pytest.mark.xdist_group("timing")

QUESTION = {
    "topic": Choice(
        criteria={"billing": "charges and invoices", "shell": "running commands", "weather": "rain and sun"},
        instructions="What is this about?",
    )
}
LONG = "please check the quarterly invoices and the shell history again " * 940  # ~60,000 characters
SHORT = "ls -la"


IDLE_S = 2.5
"""How long a test watches the process's CPU after an answer went out."""
ONE_STEP_CPU_S = 1.5
"""The most CPU one step may still cost after its deadline (a 256-token text is about a quarter of a
second on two cores), with a wide margin. Work that kept running would spend about 2 * IDLE_S."""


def _idle_cpu_s(seconds: float = IDLE_S) -> float:
    """CPU this process spends while the test sleeps: work left running shows up here."""
    before = time.process_time()
    time.sleep(seconds)
    return time.process_time() - before


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> EmbeddedEngine:
    return EmbeddedEngine.from_settings(EmbeddedSettings(), cache_dir=tmp_path_factory.mktemp("cache"))


async def test_a_timed_out_long_state_does_not_delay_the_next_short_one(engine: EmbeddedEngine) -> None:
    await engine.decide(SHORT, QUESTION)  # warm
    started = time.monotonic()
    with pytest.raises(EngineTimeout):
        # What a route reads of it is priced at 256 tokens, about 0.2 s here: a budget shorter than that.
        await engine.decide(LONG, QUESTION, options=ReadOptions(timeout_s=0.05))
    assert time.monotonic() - started < 0.05 + 1.0
    started = time.monotonic()
    reply = await engine.decide(SHORT, QUESTION, options=ReadOptions(timeout_s=2.0))
    assert time.monotonic() - started < 2.0
    assert set(reply.answers["topic"].probabilities) == {"billing", "shell", "weather"}
    # The abandoned work stopped within a step: nothing is left burning CPU.
    assert await asyncio.to_thread(_idle_cpu_s) < ONE_STEP_CPU_S


async def test_many_questions_over_a_long_state_stop_at_the_budget(engine: EmbeddedEngine) -> None:
    questions = {f"q{i}": Noul(instructions=f"Does it mention item {i}?") for i in range(64)}
    state = "word " * 19_999
    started = time.monotonic()
    # As a policy check, so that every question reads every window of the state: 64 x 200 steps.
    checks = ReadOptions(timeout_s=0.2, violations=dict.fromkeys(questions, "yes"))
    with pytest.raises(EngineTimeout):
        await engine.sparrow.decide(state, questions, options=checks)
    assert time.monotonic() - started < 0.2 + 1.0
    assert await asyncio.to_thread(_idle_cpu_s) < ONE_STEP_CPU_S


# -- over the HTTP API, between tenants ---------------------------------------------------------

PATIENT_S = 8.0
"""The long request's budget: long enough that its work is still running while the other tenant checks."""
HASTY_S = 0.1
"""A budget shorter than reading a long state takes (its 896 tokens are about 0.7 s here)."""
BUDGET_S = 4.0
"""The short checks' budget."""


def _policy(directory: Path) -> Path:
    doc = yaml.safe_load(EXAMPLE_POLICY.read_text(encoding="utf-8"))
    doc["defaults"]["engine_options"] = {"timeout_s": BUDGET_S}
    patient = dict(doc["tasks"]["tool_safety"])
    patient["engine_options"] = {**patient.get("engine_options", {}), "timeout_s": PATIENT_S}
    doc["tasks"]["tool_safety_patient"] = patient
    hasty = dict(doc["tasks"]["tool_safety"])
    hasty["engine_options"] = {**hasty.get("engine_options", {}), "timeout_s": HASTY_S}
    doc["tasks"]["tool_safety_hasty"] = hasty
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    root = tmp_path_factory.mktemp("deadlines")
    with running_api(test_settings(root, policy_file=_policy(root / "policy"))) as running:
        yield running


def _tool_check(command: str) -> dict[str, Any]:
    return {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": command}}}


async def _verdicts(client: Any, commands: list[str]) -> list[tuple[str, float, str]]:
    out = []
    for command in commands:
        started = time.monotonic()
        response = await client.post("/v1/policy-check", json=_tool_check(command))
        elapsed = time.monotonic() - started
        assert response.status_code == 200, response.text
        body = response.json()
        assert elapsed < BUDGET_S + 1.0, f"{command!r} took {elapsed:.2f} s against a {BUDGET_S} s budget"
        out.append((body["verdict"], elapsed, ",".join(r["reason"] for r in body["rules"])))
    return out


COMMANDS = ["ls -la", "rm -rf /srv/data", "cat README.md", "ls -la"]


async def test_one_tenants_largest_request_does_not_change_anothers_verdicts(api: RunningApi) -> None:
    heavy_key, light_key = await api.key("heavy"), await api.key("light")
    async with api_client(api.url, heavy_key) as heavy, api_client(api.url, light_key) as light:
        alone = await _verdicts(light, COMMANDS)
        assert all("timeout" not in reasons for _v, _t, reasons in alone)
        largest = {"policies": ["tool_safety_patient"], "text": "please review this shell history " * 3000}
        assert len(largest["text"]) <= 100_000
        # Six at once, more than the engine's four places: the light tenant is admitted at once all
        # the same (it holds less than its share), and the embedder's lock goes round the tenants,
        # so it waits for one step of the heavy one, not one of each of its requests.
        long_calls = [asyncio.create_task(heavy.post("/v1/policy-check", json=largest)) for _ in range(6)]
        await asyncio.sleep(0.3)  # the long requests are now inside the embedder
        assert not any(call.done() for call in long_calls)
        during = await _verdicts(light, COMMANDS)
        assert not all(c.done() for c in long_calls), "the long requests ended first: no overlap was tested"
        responses = await asyncio.gather(*long_calls)
    assert [r.status_code for r in responses] == [200] * 6
    assert [v for v, _t, _r in during] == [v for v, _t, _r in alone]
    assert [r for _v, _t, r in during] == [r for _v, _t, r in alone]


async def test_a_timed_out_long_check_does_not_delay_the_next_short_ones(api: RunningApi) -> None:
    key = await api.key("timeouts")
    async with api_client(api.url, key) as client:
        started = time.monotonic()
        response = await client.post("/v1/policy-check", json={"policies": ["tool_safety_hasty"], "text": LONG})
        assert time.monotonic() - started < HASTY_S + 1.0
        assert response.status_code == 200
        body = response.json()
        assert body["verdict"] == "deny" and {r["reason"] for r in body["rules"]} == {"timeout"}
        after = await _verdicts(client, ["ls -la", "ls -la", "ls -la"])
    assert all("timeout" not in reasons for _v, _t, reasons in after)
    assert await asyncio.to_thread(_idle_cpu_s) < ONE_STEP_CPU_S


async def test_a_full_engine_queue_is_a_503_with_retry_after_and_records_nothing(tmp_path: Path) -> None:
    settings = test_settings(
        tmp_path,
        policy_file=_policy(tmp_path / "policy"),
        limits=LimitsSettings(local_engine_concurrency=1, engine_queue=0),
        # The holder reads all of its long state (about 20,000 tokens), so it holds the engine for
        # its whole patient budget while the second request comes.
        embedded={"check_read_tokens": 100_000},
    )
    with running_api(settings) as running:
        key = await running.key("busy")
        async with api_client(running.url, key) as client:
            busy = {"policies": ["tool_safety_patient"], "text": "please review this shell history " * 3000}
            holder = asyncio.create_task(client.post("/v1/policy-check", json=busy))
            await asyncio.sleep(0.5)
            assert not holder.done()
            started = time.monotonic()
            refused = await client.post("/v1/policy-check", json=_tool_check("ls -la"))
            assert time.monotonic() - started < 1.0  # refused at once, not queued
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["type"] == "overloaded"
            assert int(refused.headers["retry-after"]) >= 1
            held = await holder
            assert held.status_code == 200
            rules = len(held.json()["rules"])
            assert await _decisions_of(settings, "busy") == rules  # the refused request left no row
            again = await client.post("/v1/policy-check", json=_tool_check("ls -la"))
            assert again.status_code == 200
            assert await _decisions_of(settings, "busy") == 2 * rules


async def _decisions_of(settings: Settings, tenant: str) -> int:
    store = await DecisionStore.open(database_url_for(settings))
    try:
        async with store.engine.connect() as connection:
            query = select(func.count()).select_from(DecisionRow).where(DecisionRow.tenant == tenant)
            return int((await connection.execute(query)).scalar_one())
    finally:
        await store.aclose()


FLOODS = {
    "combining marks": "a" + "\u0301" * 5000,
    "brackets": "[" * 2500 + "]" * 2500,
    "nested-looking argument": None,  # a tool call whose one argument is 5 KB of nesting-like text
}


@pytest.mark.parametrize("flood", sorted(FLOODS))
async def test_a_small_pathological_request_costs_at_most_its_budget(api: RunningApi, flood: str) -> None:
    key = await api.key("floods")
    text = FLOODS[flood]
    body: dict[str, Any] = (
        {"policies": ["tool_safety"], "text": text}
        if text is not None
        else {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "{[" * 2500}}}
    )
    async with api_client(api.url, key) as client:
        cpu = time.process_time()
        started = time.monotonic()
        response = await client.post("/v1/policy-check", json=body)
        assert time.monotonic() - started < BUDGET_S + 1.0
        assert response.status_code == 200, response.text
    idle = await asyncio.to_thread(_idle_cpu_s)
    assert idle < ONE_STEP_CPU_S, f"{idle:.2f} s of CPU spent after the answer went out"
    # Two cores at most for the budget, one step past it, and the request's own handling.
    assert time.process_time() - cpu < 2 * BUDGET_S + ONE_STEP_CPU_S + IDLE_S


# -- the Jev gateway over a misbehaving System-1 server ------------------------------------------

GATEWAY_BUDGET_S = 1.0
SYSTEMONE_BODY = {
    "state": "I was charged twice",
    "questions": {"topic": {"type": "choice", "criteria": {"billing": None, "technical": None}}},
}


def _jev_reply(_path: str, _body: bytes) -> tuple[int, bytes]:
    answer = {
        "type": "choice",
        "choice": "billing",
        "confidence": 0.9,
        "probabilities": {"billing": 0.9, "technical": 0.1},
    }
    body = {"model": "fake", "answers": {"topic": answer}, "usage": {"input_tokens": 5, "output_tokens": 1}}
    return 200, json.dumps(body).encode()


@pytest.mark.parametrize("mode", ["trickle", "oversized", "oversized-chunked"])
async def test_the_gateway_keeps_its_budget_and_its_reply_cap_over_a_bad_engine(
    tmp_path: Path, mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    with running_slow_server(_jev_reply, mode=mode) as engine_server:
        settings = test_settings(
            tmp_path,
            engine="jev",
            jev=JevSettings(base_url=engine_server.url, profile="jev", max_retries=0),
            limits=LimitsSettings(gateway_timeout_s=GATEWAY_BUDGET_S, max_engine_reply_bytes=1_048_576),
        )
        with running_api(settings) as running:
            key = await running.key("gateway")
            async with api_client(running.url, key) as client:
                started = time.monotonic()
                response = await client.post("/v1/systemone", json=SYSTEMONE_BODY)
                elapsed = time.monotonic() - started
    error = response.json()["error"]
    if mode == "trickle":
        assert response.status_code == 503, response.text
        assert error["type"] == "engine_timeout"
        assert elapsed < GATEWAY_BUDGET_S + 1.0
    else:
        # An upstream that answers past the cap misbehaves: 502, and a retry will not help.
        assert response.status_code == 502, response.text
        assert error["type"] == "upstream_error" and "retry-after" not in response.headers
        assert "limits.max_engine_reply_bytes" not in error["message"]  # the operator's detail: in the log
        assert "limits.max_engine_reply_bytes" in caplog.text
        assert elapsed < 5.0


def test_a_short_text_waits_for_one_window_of_another_tenants_long_ones() -> None:
    """The embedder's lock goes round the tenants, and every C call runs on one thread (one OpenMP
    team): three threads of one tenant embedding 100,000 characters each delay another tenant's
    short text by about one window, not by their whole texts, nor by OpenMP teams spinning against
    each other (which made one window take seven times as long)."""
    embedder = E5Embedder()
    window = "please review this shell history " * 60
    started = time.monotonic()
    embedder.embed([window])
    one_window_s = time.monotonic() - started
    stop = StopToken()

    def heavy() -> None:
        # The token only ends the heavy texts once the waits are measured (within a window, not
        # after the rest of a 100,000-character text, which took tens of seconds).
        with request_scope(tenant="heavy"), contextlib.suppress(Abandoned):
            while not stop.stopped:
                embedder.embed(["please review this shell history " * 3000], stop=stop)

    threads = [threading.Thread(target=heavy, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    waits = []
    with request_scope(tenant="light"):
        for _ in range(8):
            started = time.monotonic()
            embedder.embed(["shell: ls -la"])
            waits.append(time.monotonic() - started)
    stop.cancel()
    for thread in threads:
        thread.join(60)
    assert max(waits) < 4 * one_window_s + 1.0, (waits, one_window_s)
