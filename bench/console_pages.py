"""The console's pages on a large decision log: overview, list and decision page with a million decisions.

For each database (a SQLite file, and PostgreSQL at ``--postgres``), the run fills a fresh log with
``--decisions`` decisions of one tenant over 30 days (four tasks; answers, rollups and a few
outcomes as the writer keeps them), starts ``fastslow serve`` on it in its own process, signs in
with a ``read`` key, and times each page ``--runs`` times, sequentially, beside the baseline
``GET /healthz`` on the same server in the same run (what any request costs: the page's own cost is
the difference). Each page figure is the median and p99 wall time of the whole HTTP exchange, page
body included. Target (issue 30): each page's p50 under 300 ms.

    python bench/console_pages.py                       # 1,000,000 decisions, both databases
    python bench/console_pages.py --quick               # 20,000 decisions, SQLite only, under a minute
    python bench/console_pages.py --databases postgresql --decisions 200000

The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
from _ready import wait_answering
from sqlalchemy import create_engine, insert, make_url, text

from fastslow.api.store import (
    AnswerRow,
    DecisionRow,
    DecisionStore,
    LatencyRollupRow,
    OutcomeRow,
    RollupRow,
    rollups_of,
    upgrade,
)

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
POSTGRES = os.environ.get("FASTSLOW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TENANT = "bench"
TASKS = {
    "support": ["billing", "technical", "account", "other"],
    "tool_safety": ["destructive", "exfiltration"],
    "intent": ["buy", "cancel", "ask", "complain", "other"],
    "triage": ["urgent", "normal", "low"],
}
CHUNK = 10_000
DAYS = 30


def _rows(n: int, now: datetime, rng: random.Random) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Decisions and their answers, ``CHUNK`` at a time, spread evenly over the last ``DAYS`` days."""
    span = DAYS * 86_400.0
    names = list(TASKS)
    for start in range(0, n, CHUNK):
        decisions: list[dict[str, Any]] = []
        answers: list[dict[str, Any]] = []
        for i in range(start, min(n, start + CHUNK)):
            task = names[i % len(names)]
            options = TASKS[task]
            p = rng.betavariate(5, 1.5)
            kept = p >= 0.7
            check = task == "tool_safety"
            escalated = not kept and not check
            decision_id = uuid.uuid4().hex
            outcome = options[rng.randrange(len(options))]
            decisions.append(
                {
                    "id": decision_id,
                    "tenant": TENANT,
                    "task": task,
                    "question": task,
                    "outcome": None if check else outcome,
                    "system": 2 if escalated else 1,
                    "reason": "confident" if kept else rng.choice(["low_confidence", "small_margin", "none_of_these"]),
                    "escalate": escalated,
                    "confidence": p,
                    "threshold": 0.7,
                    "verdict": ("allow" if kept else "review") if check else None,
                    "policy_version": "v2" if i > n // 2 else "v1",
                    "engine": "openai" if escalated else "embedded",
                    "model": "gpt-5.5" if escalated else "e5",
                    "latency_ms": rng.lognormvariate(6.5, 0.4) if escalated else rng.lognormvariate(3.0, 0.5),
                    "cost_usd": 0.0021 if escalated else None,
                    "detail": "",
                    "state_digest": f"{i:064x}",
                    "state_text": None,
                    "created_at": now - timedelta(seconds=span * (1 - i / n)),
                    "audit": kept and rng.random() < 0.01,
                    "audit_rate": 0.01,
                    "examples_version": None,
                }
            )
            rest = (1 - p) / (len(options) - 1)
            answers += [
                {"decision_id": decision_id, "option": o, "probability": p if o == outcome else rest} for o in options
            ]
        yield decisions, answers


def fill(url: str, n: int) -> str:
    """A fresh log at ``url`` with ``n`` decisions; the id of one of the newest (for the decision page)."""
    upgrade(url)
    engine = create_engine(url.replace("+aiosqlite", ""))
    rng = random.Random(7)
    now = datetime.now(UTC)
    newest = ""
    rollups: dict[tuple[Any, ...], dict[str, Any]] = {}
    latency: dict[tuple[Any, ...], dict[str, Any]] = {}
    started = time.perf_counter()
    with engine.begin() as connection:
        for decisions, answers in _rows(n, now, rng):
            connection.execute(insert(DecisionRow), decisions)
            connection.execute(insert(AnswerRow), answers)
            outcomes = [
                {
                    "id": uuid.uuid4().hex,
                    "decision_id": d["id"],
                    "tenant": d["tenant"],
                    "task": d["task"],
                    "label": d["outcome"] or "allow",
                    "system2_correct": None,
                    "note": None,
                    "created_at": d["created_at"],
                }
                for d in decisions
                if d["audit"]
            ]
            if outcomes:
                connection.execute(insert(OutcomeRow), outcomes)
            ups, buckets = rollups_of(decisions)
            for up in ups:
                key = tuple(up[k] for k in ("task", "hour", "engine", "system", "reason", "kept", "policy_version"))
                into = rollups.setdefault(key, {**up, "decisions": 0, "cost_usd": 0.0, "costed": 0, "latency_ms": 0.0})
                for name in ("decisions", "cost_usd", "costed", "latency_ms"):
                    into[name] += up[name]
            for b in buckets:
                key = tuple(b[k] for k in ("task", "hour", "engine", "bucket"))
                latency.setdefault(key, {**b, "decisions": 0})["decisions"] += b["decisions"]
            newest = decisions[-1]["id"]
            print(
                f"  {len(rollups)} rollup rows, {decisions[-1]['created_at']:%Y-%m-%d} ...", end="\r", file=sys.stderr
            )
        connection.execute(insert(RollupRow), list(rollups.values()))
        connection.execute(insert(LatencyRollupRow), list(latency.values()))
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("ANALYZE"))
            connection.commit()
    engine.dispose()
    print(f"  filled {n:,} decisions in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return newest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _key(url: str) -> str:
    store = await DecisionStore.open(url)
    try:
        key, _ = await store.create_key(TENANT, name="bench", scopes=("read",))
    finally:
        await store.aclose()
    return key


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(database: str, url: str, n: int, runs: int, work: Path) -> dict[str, Any]:
    print(f"{database}: filling {n:,} decisions", file=sys.stderr)
    newest = fill(url, n)
    key = asyncio.run(_key(url))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTSLOW_")}
    data = work / database
    data.mkdir(parents=True, exist_ok=True)
    env.update(
        FASTSLOW_DATA_DIR=str(data),
        FASTSLOW_SETTINGS_FILE=str(data / "none.toml"),
        FASTSLOW_DATABASE_URL=url,
        FASTSLOW_RATE_LIMIT_PER_MINUTE="0",
    )
    log = data / "serve.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [str(BIN / "fastslow"), "serve", "--port", str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_answering(base + "/readyz", alive=lambda: server.poll() is None, deadline_s=300):
            raise RuntimeError(f"fastslow serve did not start:\n{log.read_text(errors='replace')[-2000:]}")
        with httpx2.Client(base_url=base, timeout=30, follow_redirects=False) as client:
            signin = client.get("/console/sign-in")
            csrf = _csrf(signin.text)
            answer = client.post("/console/sign-in", data={"key": key, "csrf": csrf})
            if answer.status_code not in (200, 303):
                raise RuntimeError(f"sign-in failed: {answer.status_code} {answer.text[:300]}")
            first = client.get("/console/decisions")
            cursor = _next_cursor(first.text)
            pages = {
                "baseline /healthz": "/healthz",
                "overview (all tasks, 24 h)": "/console?range=24h",
                "overview (one task, 30 d)": "/console?task=support&range=30d",
                "decisions list": "/console/decisions",
                "decisions list, next page": f"/console/decisions?after={cursor}" if cursor else "/console/decisions",
                "decisions list, filtered (task, reason, has outcome)": (
                    "/console/decisions?task=triage&reason=small_margin&has_outcome=no"
                ),
                "decisions list, audit sample": "/console/decisions?audit=yes",
                "decisions list, outcome recorded (1 in 125)": "/console/decisions?has_outcome=yes",
                "decisions list, a filter matching nothing": "/console/decisions?verdict=deny",
                "decision page": f"/console/decisions/{newest}",
                "calibration (one task)": "/console/calibration?task=support",
                "reviews": "/console/reviews",
            }
            timings: dict[str, list[float]] = {name: [] for name in pages}
            for _ in range(runs):
                for name, path in pages.items():  # interleaved: drift on a noisy machine hits every page alike
                    started = time.perf_counter()
                    response = client.get(path)
                    elapsed = (time.perf_counter() - started) * 1000
                    if response.status_code != 200:
                        raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
                    timings[name].append(elapsed)
    finally:
        server.terminate()
        server.wait(30)
    base_p50 = statistics.median(timings["baseline /healthz"])
    return {
        name: {
            "p50_ms": round(statistics.median(values), 1),
            "p99_ms": round(_percentile(values, 0.99), 1),
            "p50_over_baseline": round(statistics.median(values) / base_p50, 1),
        }
        for name, values in timings.items()
    }


def _csrf(html: str) -> str:
    marker = 'name="csrf" value="'
    at = html.find(marker)
    return "" if at < 0 else html[at + len(marker) : html.find('"', at + len(marker))]


def _next_cursor(html: str) -> str | None:
    marker = "after="
    at = html.find(marker)
    if at < 0:
        return None
    end = at + len(marker)
    while end < len(html) and (html[end].isalnum() or html[end] in "-_"):
        end += 1
    return html[at + len(marker) : end]


def _postgres_url(work: Path) -> tuple[str, str]:
    schema = f"fastslow_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(make_url(POSTGRES).set(drivername="postgresql+psycopg"))
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    admin.dispose()
    url = (
        make_url(POSTGRES)
        .set(drivername="postgresql+psycopg")
        .update_query_dict({"options": f"-csearch_path={schema}"})
    )
    del work
    return url.render_as_string(hide_password=False), schema


def _drop_schema(schema: str) -> None:
    admin = create_engine(make_url(POSTGRES).set(drivername="postgresql+psycopg"))
    with admin.begin() as connection:
        connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    admin.dispose()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20,000 decisions, SQLite only, 10 runs")
    parser.add_argument("--decisions", type=int, default=None, help="decisions in the log (default 1,000,000)")
    parser.add_argument("--runs", type=int, default=None, help="requests per page (default 30, --quick 10)")
    parser.add_argument("--databases", default=None, help="sqlite,postgresql (default both; --quick: sqlite)")
    args = parser.parse_args(argv)
    n = args.decisions or (20_000 if args.quick else 1_000_000)
    runs = args.runs or (10 if args.quick else 30)
    databases = (args.databases or ("sqlite" if args.quick else "sqlite,postgresql")).split(",")
    results: dict[str, Any] = {"decisions": n, "runs": runs, "target_p50_ms": 300, "databases": {}}
    with tempfile.TemporaryDirectory(prefix="fastslow-console-bench-") as folder:
        work = Path(folder)
        for database in databases:
            if database == "sqlite":
                url = f"sqlite+aiosqlite:///{work / 'log.sqlite3'}"
                results["databases"][database] = measure(database, url, n, runs, work)
            elif database == "postgresql":
                url, schema = _postgres_url(work)
                try:
                    results["databases"][database] = measure(database, url, n, runs, work)
                finally:
                    _drop_schema(schema)
            else:
                parser.error(f"--databases: unknown database {database!r}")
    pages = [figures for db in results["databases"].values() for name, figures in db.items() if "baseline" not in name]
    results["every_page_under_target"] = all(f["p50_ms"] < 300 for f in pages)
    for database, figures in results["databases"].items():
        print(f"\n{database}, {n:,} decisions, {runs} runs a page")
        for name, f in figures.items():
            ratio = f["p50_over_baseline"]
            print(f"  {name:<55} p50 {f['p50_ms']:>7.1f} ms  p99 {f['p99_ms']:>7.1f} ms  ({ratio}x baseline)")
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
