"""A real Prometheus scraping a real `fastslow serve`: every query of the Grafana dashboard returns series,
and the alert rules see the conditions they are for.

`fastslow serve` runs as its own process on a loopback port (embedded System 1, SQLite log, System 2
a fake OpenAI-compatible server with a price, one check task on a dead Jev engine), and the
shipped deploy/prometheus.yml, pointed at it, scrapes it every second with deploy/alerts.yml loaded.
A short load of routes and policy checks runs, then the policy file is broken. Then each PromQL
expression of deploy/grafana/dashboards/fastslow.json (Grafana's variables replaced by fixed
values) must return at least one series with a number, and Prometheus must report the alerts those
conditions raise: the reload failure at once, the open breaker and the drift pending their ``for``.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from fakes.api_server import REPO, api_client, new_key, test_policy, test_settings
from fakes.embedded import build_lock, child_env
from fakes.openai_server import openai_server, structured
from fakes.processes import wait_until_answering
from fakes.prometheus import Prometheus, binary, running_prometheus

DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "fastslow.json"
PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus.yml"
RULES = REPO / "deploy" / "alerts.yml"
STARTUP_S = 300.0
"""Room for a cold start: the server trains the example heads when no other test did yet."""
SETTLE_S = 120.0
"""A deadline for each wait after the start (scrapes, refreshes, alerts), never a pause."""
LOAD_S = 3.0
"""Long enough for several 1 s scrapes to see the counters move, so rates and quantiles have values."""
ROUNDS = 32
"""At least this many routes of ``support``: report drift judges coverage from 30 decisions on."""
GRAFANA_VARIABLES = {
    "${__rate_interval}": "1m",
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "${task:regex}": ".*",
    "${task}": ".*",
    "$task": ".*",
}
MESSAGES = [
    "I was charged twice this month",
    "Please refund my last invoice",
    "The app crashes when I open settings",
    "I cannot reset my password",
    "My invoice page crashes when I log in",  # billing, technical or account: unsure, System 2 answers
]
CALLS = [
    {"name": "sql", "arguments": {"query": "DROP TABLE customers;"}},
    {"name": "shell", "arguments": {"command": "ls -la"}},
    {"name": "send_email", "arguments": {"to": "team@example.com", "subject": "standup notes"}},
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _policy(tmp_path: Path) -> Path:
    """The test policy with a fit to judge drift by (one that kept nothing) and a check on a dead engine."""
    path = test_policy(tmp_path, split_checks=False)
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["tasks"]["support"]["fitted"] = {
        "thresholds": {
            "by": "fastslow tune",
            "date": "2026-12-01T00:00:00Z",
            "target_accuracy": 0.9,
            "held_out": {"kept": 0.0, "accuracy": 0.95, "lower_bound": 0.92},
        }
    }
    doc["tasks"]["dead_engine_check"] = {**doc["tasks"]["tool_safety"], "engine": "jev"}
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _settings_file(tmp_path: Path, system2_url: str) -> Path:
    path = tmp_path / "fastslow.toml"
    path.write_text(
        f"""\
[system2]
openai_api_key = "sk-test"
openai_base_url = "{system2_url}"

[system2.prices."openai:gpt-5.5"]
input = 1.25
output = 10.0

[jev]
base_url = "http://127.0.0.1:{_free_port()}"
profile = "jev"
max_retries = 0

[breaker]
failures = 2
open_s = 600

[metrics]
refresh_s = 0.5
drift_s = 0.5
""",
        encoding="utf-8",
    )
    return path


@contextmanager
def _serving(env: dict[str, str], log: Path) -> Iterator[str]:
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "fastslow.api.cli", "serve", "--port", str(port), "--log-level", "warning"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # One engine build at a time across test workers: a cold cache trains the heads once.
        with build_lock(Path(env["FASTSLOW_EMBEDDED__CACHE_DIR"])):
            wait_until_answering(process, f"{url}/healthz", log=log, timeout_s=STARTUP_S)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _prometheus_config(api_url: str) -> dict[str, Any]:
    """The shipped configuration, scraping this server every second instead of compose's replicas."""
    config: dict[str, Any] = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    config["global"].update(scrape_interval="1s", evaluation_interval="1s")
    config["rule_files"] = [str(RULES)]
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "fastslow-api"]
    del job["dns_sd_configs"]
    job["static_configs"] = [{"targets": [api_url.removeprefix("http://")]}]
    config["scrape_configs"] = [job]
    return config


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of the dashboard, Grafana's variables given fixed values."""
    queries = []
    for panel in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, f"{panel['title']}: a Grafana variable this test does not know: {expr}"
            queries.append((panel["title"], expr))
    return queries


def _with_numbers(result: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [series for series in result if math.isfinite(float(series["value"][1]))]


def _alerts(prometheus: Prometheus) -> dict[tuple[str, str], str]:
    """(alert name, its engine or task) -> state, of the alerts Prometheus holds now."""
    return {
        (alert["labels"]["alertname"], alert["labels"].get("engine") or alert["labels"].get("task", "")): alert["state"]
        for alert in prometheus.get("alerts")["alerts"]
    }


async def _load(url: str, key: str) -> dict[int, int]:
    """Routes, and policy checks every third round, for ``LOAD_S`` seconds and ``ROUNDS``; statuses counted."""
    statuses: dict[int, int] = {}
    n = 0
    ends = time.monotonic() + LOAD_S
    async with api_client(url, key) as client:
        while time.monotonic() < ends or n < ROUNDS:
            message = {"role": "user", "content": f"{MESSAGES[n % len(MESSAGES)]} ({n})"}
            responses = [await client.post("/v1/route", json={"task": "support", "messages": [message]})]
            if n % 3 == 0:
                call = CALLS[n // 3 % len(CALLS)]
                for check in ("tool_safety", "dead_engine_check"):
                    body = {"policies": [check], "tool_call": call}
                    responses.append(await client.post("/v1/policy-check", json=body))
            for response in responses:
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            n += 1
    return statuses


async def test_every_dashboard_query_returns_series_and_the_alerts_see_their_conditions(tmp_path: Path) -> None:
    binary("prometheus")  # skip (or fail, where required) before starting anything
    with openai_server(respond=lambda _body: structured({"answer": "technical"})) as (system2_url, system2):
        policy = _policy(tmp_path)
        settings = test_settings(tmp_path, policy_file=policy)  # a migrated SQLite log under tmp_path/data
        key = await new_key(settings, "acme")
        env = child_env(
            FASTSLOW_DATA_DIR=str(settings.data_dir),
            FASTSLOW_POLICY_FILE=str(policy),
            FASTSLOW_SETTINGS_FILE=str(_settings_file(tmp_path, system2_url)),
            FASTSLOW_EMBEDDED__CACHE_DIR=os.environ["FASTSLOW_EMBEDDED__CACHE_DIR"],
        )
        with _serving(env, tmp_path / "serve.log") as api_url, running_prometheus(_prometheus_config(api_url)) as prom:
            deadline = time.monotonic() + SETTLE_S
            while not prom.query('up{job="fastslow-api"} == 1'):
                assert time.monotonic() < deadline, "Prometheus never scraped the API"
                time.sleep(0.1)
            statuses = await _load(api_url, key)
            assert set(statuses) == {200}, statuses
            # Drift first: a broken policy file keeps the drift gauge at its last good value.
            while not prom.query('fastslow_drift{task="support"} == 1'):
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.1)
            policy.write_text("tasks: [this is not a policy", encoding="utf-8")
            queries = dashboard_queries()
            empty: list[tuple[str, str]] = queries
            alerts: dict[tuple[str, str], str] = {}
            wanted = {
                ("FastslowPolicyReloadFailed", ""): "firing",
                ("FastslowBreakerOpen", "jev"): "pending",
                ("FastslowDrift", "support"): "pending",
            }
            while empty or any(alerts.get(alert) != state for alert, state in wanted.items()):
                assert time.monotonic() < deadline, f"no series for {empty}; alerts {alerts}"
                time.sleep(0.2)
                empty = [(title, expr) for title, expr in queries if not _with_numbers(prom.query(expr))]
                alerts = _alerts(prom)
            rules = [rule for group in prom.get("rules")["groups"] for rule in group["rules"]]
            task_values = prom.get("label/task/values", **{"match[]": "fastslow_decisions_total"})
            saved = prom.query('fastslow_log_saved_usd{task="support"}')
    assert system2.requests, "System 2 was never asked: no cost to show"
    assert len(queries) >= 10
    # Every rule loaded and evaluates; the kept-share alert needs a day of history, so it stays silent.
    assert {rule["name"] for rule in rules} == {
        "FastslowBreakerOpen",
        "FastslowPolicyReloadFailed",
        "FastslowKeptShareFalling",
        "FastslowDrift",
    }
    assert all(rule["health"] == "ok" for rule in rules), rules
    assert not any(name == "FastslowKeptShareFalling" for name, _ in alerts)
    # The dashboard's task variable (label_values(fastslow_decisions_total, task)) lists the tasks.
    assert {"support", "tool_safety", "dead_engine_check"} <= set(task_values)
    assert float(saved[0]["value"][1]) > 0
