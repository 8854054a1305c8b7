"""The System-1 exchange by client: httpx2 (fastslow's) against aiohttp, the same Jev request to the same stub.

Each exchange is what the jev engine's async path does per call: POST the Jev request (the
example policy's ``tool_safety`` rules, encoded by the engine's own ``build_request``) to
``/v1/systemone`` under a deadline, read the reply body up to the reply cap, and decode its JSON.
The clients:

* ``httpx2``: fastslow's own path, ``post_with_retries`` over ``fast_transport`` (asyncio streams);
* ``httpx2-aiohttp``: fastslow's path (``post_with_retries``) on ``aiohttp_transport``: httpx2's
  requests and responses, aiohttp's exchange;
* ``httpx2-bare``: the same client and transport without ``post_with_retries`` (a plain ``post``
  under ``asyncio.timeout``): what fastslow's retry and deadline wrapper adds;
* ``httpx2-default``: the same client on httpx2's default transport, for scale;
* ``aiohttp``: ``aiohttp.ClientSession`` (its C HTTP parser), with the same deadline
  (``asyncio.timeout``), reply cap and connection pool size.

The stub (``bench/_http_servers.py stub``) runs in its own process on one core and this process on
the other (``taskset``), so CPU per exchange (this process's ``time.process_time`` over a slice,
divided by its exchanges) is the client's own, plus the event loop's. The load is a closed loop of
``concurrency`` tasks; slices of the clients interleave (httpx2, aiohttp, httpx2-default, ...) so
drift falls on all of them; CPU is the median over slices, p50 / p99 over every exchange.

    python bench/jev_client.py            # concurrency 1 / 8 / 32, 7 slices of 2,000 exchanges each
    python bench/jev_client.py --quick    # 2 slices of 200

The decision rule (the HTTP hot-path issue): aiohttp replaces httpx2 in the System-1 engines'
async path only if it costs at least 25 % less CPU per exchange. The last line of stdout is one
JSON object with ``aiohttp_cpu_vs_httpx2`` per concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from http_service import SERVERS, Fleet, _cores, _p99, wait_ready

from fastslow.engines import aiohttp_transport, fast_transport
from fastslow.engines.jev import PROFILES, build_request, client_headers, encode_body, post_with_retries
from fastslow.policies import BUILTIN_POLICY, load_policy
from fastslow.router import CheckTask, ReadOptions
from fastslow.router.engine_api import Deadline, check_state

CONCURRENCY = (1, 8, 32)
CAP = 4 * 1024 * 1024
"""The reply cap both clients enforce (fastslow's default is larger; the stub's reply is ~300 bytes)."""
SAVING_NEEDED = 0.25
"""aiohttp must cost at least this much less CPU per exchange to replace httpx2."""
HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}

Exchange = Callable[[], Awaitable[None]]


def jev_body() -> bytes:
    """The Jev request the example policy's ``tool_safety`` check sends, as the engine encodes it."""
    task = load_policy(BUILTIN_POLICY).tasks["tool_safety"]
    assert isinstance(task, CheckTask)
    questions = {f"tool_safety.{name}": rule.question for name, rule in task.rules.items()}
    violations = {f"tool_safety.{name}": rule.action.violation for name, rule in task.rules.items()}
    state = check_state({"name": "shell", "arguments": {"command": "ls -la /srv/1"}})
    wire = build_request(
        state, questions, profile=PROFILES["jev"], model=None, options=ReadOptions(violations=violations)
    )
    content, _type = encode_body(wire)
    return content


class Clients:
    """One client of each kind, pooled for ``concurrency`` connections, each with its exchange."""

    def __init__(self, url: str, concurrency: int, body: bytes) -> None:
        import aiohttp

        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._fast = httpx2.AsyncClient(timeout=10.0, transport=fast_transport(limits))
        self._default = httpx2.AsyncClient(timeout=10.0, limits=limits)
        self._over_aiohttp = httpx2.AsyncClient(timeout=10.0, transport=aiohttp_transport(limits))
        # Merged with each client's defaults once, as the jev engine does, not on every request.
        self._headers = {id(c): client_headers(c, HEADERS) for c in (self._fast, self._default, self._over_aiohttp)}
        self._aiohttp = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=concurrency), timeout=aiohttp.ClientTimeout(total=10.0)
        )
        self._url = httpx2.URL(f"{url}/v1/systemone")
        self._plain_url = f"{url}/v1/systemone"
        self._body = body
        self.exchanges: dict[str, Exchange] = {
            "httpx2": self._httpx2,
            "aiohttp": self._aiohttp_exchange,
            "httpx2-aiohttp": self._httpx2_aiohttp,
            "httpx2-bare": self._httpx2_bare,
            "httpx2-default": self._httpx2_default,
        }

    async def _over(self, client: httpx2.AsyncClient) -> None:
        reply = await post_with_retries(
            client,
            self._url,
            content=self._body,
            headers=self._headers[id(client)],
            deadline=Deadline(10.0),
            max_retries=0,
            engine="jev",
            max_reply_bytes=CAP,
        )
        json.loads(reply.content)

    async def _httpx2(self) -> None:
        await self._over(self._fast)

    async def _httpx2_aiohttp(self) -> None:
        await self._over(self._over_aiohttp)

    async def _httpx2_bare(self) -> None:
        async with asyncio.timeout(10.0):
            reply = await self._fast.post(self._url, content=self._body, headers=self._headers[id(self._fast)])
        reply.raise_for_status()
        json.loads(reply.content)

    async def _httpx2_default(self) -> None:
        await self._over(self._default)

    async def _aiohttp_exchange(self) -> None:
        async with asyncio.timeout(10.0):
            async with self._aiohttp.post(self._plain_url, data=self._body, headers=HEADERS) as response:
                declared = response.content_length
                if declared is not None and declared > CAP:
                    raise RuntimeError("reply over the cap")
                body = await response.content.read(CAP + 1)
                if len(body) > CAP:
                    raise RuntimeError("reply over the cap")
                if not 200 <= response.status < 300:
                    raise RuntimeError(f"status {response.status}")
        json.loads(body)

    async def aclose(self) -> None:
        await self._fast.aclose()
        await self._default.aclose()
        await self._over_aiohttp.aclose()
        await self._aiohttp.close()


@dataclass
class Slice:
    latencies_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    errors: int = 0


async def run_slice(exchange: Exchange, concurrency: int, n: int) -> Slice:
    """``n`` exchanges by ``concurrency`` closed-loop tasks, with this process's CPU time over them."""
    out = Slice()
    sent = 0

    async def worker() -> None:
        nonlocal sent
        while sent < n:
            sent += 1
            started = time.perf_counter()
            try:
                await exchange()
            except Exception:
                out.errors += 1
                continue
            out.latencies_ms.append((time.perf_counter() - started) * 1000)

    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.cpu_s = time.process_time() - cpu
    return out


def summarise(slices: list[Slice]) -> dict[str, Any]:
    latencies = [ms for s in slices for ms in s.latencies_ms]
    per = [s.cpu_s / len(s.latencies_ms) * 1e6 for s in slices if s.latencies_ms]
    return {
        "exchanges": len(latencies),
        "errors": sum(s.errors for s in slices),
        "cpu_us_per_exchange": statistics.median(per) if per else None,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p99_ms": _p99(latencies) if latencies else None,
    }


async def measure(url: str, slices: int, n: int, warmup: int) -> dict[str, Any]:
    body = jev_body()
    results: dict[str, Any] = {}
    for concurrency in CONCURRENCY:
        clients = Clients(url, concurrency, body)
        try:
            for exchange in clients.exchanges.values():  # connections open, code paths warm
                await run_slice(exchange, concurrency, warmup)
            got: dict[str, list[Slice]] = {name: [] for name in clients.exchanges}
            for _ in range(slices):
                for name, exchange in clients.exchanges.items():
                    got[name].append(await run_slice(exchange, concurrency, n))
        finally:
            await clients.aclose()
        row: dict[str, Any] = {name: summarise(s) for name, s in got.items()}
        base, other = row["httpx2"]["cpu_us_per_exchange"], row["aiohttp"]["cpu_us_per_exchange"]
        row["aiohttp_cpu_vs_httpx2"] = other / base if base and other else None
        results[str(concurrency)] = row
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        "| concurrency | client | CPU µs / exchange | p50 ms | p99 ms | exchanges | errors | CPU vs httpx2 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, row in results["by_concurrency"].items():
        base = row["httpx2"]["cpu_us_per_exchange"]
        for name in ("httpx2", "aiohttp", "httpx2-aiohttp", "httpx2-bare", "httpx2-default"):
            r = row[name]
            ratio = r["cpu_us_per_exchange"] / base if base and r["cpu_us_per_exchange"] else None
            lines.append(
                f"| {c} | {name} | {r['cpu_us_per_exchange']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['exchanges']} | {r['errors']} | {ratio:.2f} |"
            )
    lines.append("")
    lines.append(f"Decision: {results['decision']}")
    return "\n".join(lines) + "\n"


def decide(results: dict[str, Any]) -> str:
    ratios = {c: row["aiohttp_cpu_vs_httpx2"] for c, row in results.items()}
    shown = ", ".join(f"{r:.2f}× at {c}" for c, r in ratios.items() if r is not None)
    adopted = ", ".join(
        f"{row['httpx2-aiohttp']['cpu_us_per_exchange'] / row['httpx2']['cpu_us_per_exchange']:.2f}× at {c}"
        for c, row in results.items()
        if row["httpx2"]["cpu_us_per_exchange"] and row["httpx2-aiohttp"]["cpu_us_per_exchange"]
    )
    if all(r is not None and r <= 1.0 - SAVING_NEEDED for r in ratios.values()):
        return (
            f"use aiohttp: its CPU per exchange is {shown} httpx2's (at most 0.75× needed); "
            f"fastslow's path on aiohttp_transport costs {adopted} its path on httpx2's transport"
        )
    return f"keep httpx2: aiohttp's CPU per exchange is {shown} httpx2's (switching needs at most 0.75×)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 slices of 200 exchanges (seconds)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out" / "jev_client")
    args = parser.parse_args(argv)
    slices, n, warmup = (2, 200, 50) if args.quick else (7, 2000, 500)
    cores = _cores()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(Path(tmp), cores)
        try:
            stub = fleet.start(
                "stub", [sys.executable, str(SERVERS), "stub"], dict(os.environ), core=cores and cores[1]
            )
            wait_ready(stub, "/healthz")
            if cores is not None:
                os.sched_setaffinity(0, {cores[0]})
            by_concurrency = asyncio.run(measure(stub.url, slices, n, warmup))
        finally:
            fleet.stop()
    results = {
        "quick": args.quick,
        "pinned": cores is not None,
        "slices": slices,
        "exchanges_per_slice": n,
        "by_concurrency": by_concurrency,
        "decision": decide(by_concurrency),
    }
    (args.out / "jev_client.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "jev_client.md").write_text(render(results))
    print(render(results), file=sys.stderr)
    summary = {c: row["aiohttp_cpu_vs_httpx2"] for c, row in by_concurrency.items()}
    print(json.dumps({"aiohttp_cpu_vs_httpx2": summary, "decision": results["decision"], "pinned": cores is not None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
