"""Hot reloads in a running API: no request waits for training, no half-written file is put in force,
and a failed reload is visible in ``/metrics`` and ``/readyz`` while the last good policy serves."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest

from fastslow.engines import ENGINES, EngineBuild
from fastslow.policies import load_policy, policy_version
from fastslow.router.engine_api import DecisionEngine

from fakes.api_server import api_client, new_key, running_api, test_policy, test_settings

CHECK = {"policies": ["tool_safety"], "tool_call": {"name": "sql", "arguments": {"query": "DROP TABLE customers;"}}}
RELOAD_TIMEOUT_S = 30.0
"""Generous: the app polls its policy file once a second and loads a change on the second poll that sees it."""


def _sample(metrics: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


async def _until(condition: Callable[[], Any], what: str, timeout_s: float = RELOAD_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s} s"
        await asyncio.sleep(0.05)


async def _check(client: httpx2.AsyncClient) -> dict[str, Any]:
    response = await client.post("/v1/policy-check", json=CHECK)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


class GatedTraining:
    """The embedded engine's factory, made to block once armed until the test lets it go on.

    The blocked build stands in for a long training: while it waits, the test sees what requests get.
    """

    def __init__(self, real: Callable[[EngineBuild], DecisionEngine]) -> None:
        self._real = real
        self.armed = False
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, build: EngineBuild) -> DecisionEngine:
        if self.armed:
            self.started.set()
            assert self.release.wait(RELOAD_TIMEOUT_S), "the test never let training finish"
        return self._real(build)


async def test_requests_during_training_are_answered_promptly_under_the_old_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = GatedTraining(ENGINES["embedded"])
    monkeypatch.setitem(ENGINES, "embedded", gate)
    settings = test_settings(tmp_path)
    path = settings.policy_file
    assert path is not None
    with running_api(settings) as api:
        key = await new_key(settings, "acme")
        async with api_client(api.url, key) as client:
            old = (await _check(client))["policy_version"]
            gate.armed = True
            text = path.read_text(encoding="utf-8") + "\n# retrained\n"
            _write_atomically(path, text)
            new = policy_version(text.encode())
            assert await asyncio.to_thread(gate.started.wait, RELOAD_TIMEOUT_S), "the reload never trained"

            # Training is blocked until released: a request that waited on it would never finish.
            during = await asyncio.wait_for(asyncio.gather(*(_check(client) for _ in range(8))), RELOAD_TIMEOUT_S / 2)
            ready = (await client.get("/readyz")).json()
            assert {r["policy_version"] for r in during} == {old}
            assert ready["policy_version"] == old and ready["status"] == "ready"
            assert ready["policy_file"] == {"in_force": True, "error": None, "change": "readying"}

            gate.release.set()

            async def swapped() -> bool:
                return bool((await client.get("/readyz")).json()["policy_version"] == new)

            await _until(swapped, "the new policy taking effect")
            after = await _check(client)
            metrics = (await client.get("/metrics")).text
            settled = (await client.get("/readyz")).json()
    assert settled["policy_file"]["change"] is None
    assert after["policy_version"] == new and after["verdict"] == "deny"
    assert _sample(metrics, "fastslow_policy_reloads_total") == 1
    assert _sample(metrics, "fastslow_policy_reload_failures_total") == 0


async def test_a_file_written_in_two_steps_is_never_in_force_half_written(tmp_path: Path) -> None:
    path = test_policy(tmp_path / "policy", split_checks=False)
    settings = test_settings(tmp_path, policy_file=path)
    full = path.read_text(encoding="utf-8") + "\n# second revision\n"
    half = full[: full.index("\n  tool_safety:") + 1]
    # The first half alone is a valid policy without the check task: loaded, every check would be a 422.
    scratch = tmp_path / "half.yaml"
    scratch.write_text(half, encoding="utf-8")
    assert "tool_safety" not in load_policy(scratch).tasks
    with running_api(settings) as api:
        key = await new_key(settings, "acme")
        async with api_client(api.url, key) as client:
            old = (await _check(client))["policy_version"]
            statuses: list[int] = []
            versions: set[str] = set()
            done = asyncio.Event()

            async def hammer() -> None:
                while not done.is_set():
                    response = await client.post("/v1/policy-check", json=CHECK)
                    statuses.append(response.status_code)
                    if response.status_code == 200:
                        versions.add(response.json()["policy_version"])

            hammering = asyncio.create_task(hammer())
            path.write_text(half, encoding="utf-8")  # a writer that writes in place, in two steps
            await asyncio.sleep(0.3)
            with path.open("a", encoding="utf-8") as rest:
                rest.write(full[len(half) :])

            async def reloaded() -> bool:
                return bool((await client.get("/readyz")).json()["policy_version"] == policy_version(full.encode()))

            await _until(reloaded, "the complete file taking effect")
            done.set()
            await hammering
            metrics = (await client.get("/metrics")).text
    assert statuses and set(statuses) == {200}
    assert versions <= {old, policy_version(full.encode())}
    assert _sample(metrics, "fastslow_policy_reloads_total") == 1
    assert _sample(metrics, "fastslow_policy_reload_failures_total") == 0


async def test_a_broken_file_keeps_the_old_policy_serving_and_shows_in_metrics_and_readyz(tmp_path: Path) -> None:
    settings = test_settings(tmp_path)
    path = settings.policy_file
    assert path is not None
    with running_api(settings) as api:
        key = await new_key(settings, "acme")
        async with api_client(api.url, key) as client:
            old = (await _check(client))["policy_version"]
            _write_atomically(path, path.read_text(encoding="utf-8").replace("thresholds", "treshold", 1))

            async def failed() -> bool:
                return bool((await client.get("/readyz")).json()["policy_file"]["in_force"] is False)

            await _until(failed, "the failed reload showing in /readyz")
            ready = await client.get("/readyz")
            served = await _check(client)
            metrics = (await client.get("/metrics")).text
    # Still ready: the last good policy is in force and serving.
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.json()["policy_version"] == old == served["policy_version"]
    error = ready.json()["policy_file"]["error"]
    assert "did you mean 'thresholds'?" in error and "\n" not in error
    assert str(tmp_path) not in ready.text and path.name not in ready.text
    assert _sample(metrics, "fastslow_policy_reload_failures_total") == 1
    assert _sample(metrics, "fastslow_policy_reloads_total") == 0
