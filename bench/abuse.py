"""The resilience figures of the abuse report, measured on ``fastslow serve`` as an outside tester would.

One server process (the shipped policy: System 1's budget 2 s, the embedded engine, SQLite), two
tenants. Each figure has its baseline in the same run:

* short ``shell: ls -la`` checks alone, then while the other tenant keeps three of its largest
  allowed checks (100,000 characters) running: latency p50 / p99 and how many were denied for a
  timeout (before: every one during the heavy check);
* the three short checks right after one 29,400-character check (before fair cost: it timed out,
  and each short check after it took 2,003 ms and was denied), against short checks with nothing
  before them;
* the probe's cheap-but-costly inputs (1,000 emoji, 5,000 combining marks, a 20,000-character word,
  99,000-character arguments, 100,000 characters of text): the server's CPU and time for each, and
  how it was answered (before fair cost: about 4 s of CPU each, denied by timeout), beside a short
  check's;
* ten clients of one tenant sending those inputs without pause while another tenant checks
  ``git status``: the other tenant's p50 / p99 against alone, and how many of its checks timed out
  or left System 1 (before fair cost: p50 23 ms became about 1.25 s, 2 to 5 % denied by timeout);
* the server's CPU in the two seconds after a timed-out answer went out (before: the work ran on);
* malformed and oversized requests: the status each gets and how long it took (before: 500s, a
  17 s gateway request, an over-limit ``Content-Length`` never answered).

    python bench/abuse.py            # about two minutes on two cores
    python bench/abuse.py --quick    # fewer repetitions, under a minute

The last line of stdout is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
from _ready import wait_answering

BIN = Path(sys.executable).parent
SHORT = {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "ls -la"}}}
LARGEST = {"policies": ["tool_safety"], "text": "please review this shell history " * 3000}
LONG = {"policies": ["tool_safety"], "text": "please check the invoices and the shell history " * 600}
GIT_STATUS = {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "git status"}}}
PROBES: dict[str, dict[str, Any]] = {
    "1,000 emoji": {"text": "\U0001f600" * 1000},
    "5,000 combining marks": {"text": "a" + "\u0301" * 5000},
    "20,000-character word": {"text": "x" * 20_000},
    "99,000-character arguments": {"tool_call": {"name": "shell", "arguments": {"command": "y" * 99_000}}},
    "100,000 characters of text": {"text": "please review this shell history " * 3030},
    "100,000 characters of CJK": {"text": "\u6f22\u5b57" * 50_000},
    "99,000-character ASCII argument": {
        "tool_call": {"name": "shell", "arguments": {"command": "echo " + "a b c d e f " * 8240}}
    },
    "20,000 characters of prose": {
        "text": "The quarterly report shows revenue growth across all regions, with particular strength in "
        "the northern markets where new customers signed long contracts. " * 130
    },
}
TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


@contextmanager
def serving(data_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], dict[str, str]]]:
    """``fastslow serve`` on a free loopback port, with the environment its keys are made in."""
    env = {**os.environ, "FASTSLOW_DATA_DIR": str(data_dir), "FASTSLOW_RATE_LIMIT_PER_MINUTE": "0"}
    port = _free_port()
    command = [str(BIN / "fastslow"), "serve", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_answering(f"{url}/healthz", alive=lambda: process.poll() is None, deadline_s=120):
            raise RuntimeError("fastslow serve did not start")
        yield url, process, env
    finally:
        process.terminate()
        process.wait(30)


def key(env: dict[str, str], tenant: str) -> str:
    out = subprocess.run(
        [str(BIN / "fastslow"), "keys", "create", "--tenant", tenant], env=env, capture_output=True, check=True
    )
    return out.stdout.decode().strip()


async def _short_checks(client: httpx2.AsyncClient, n: int, body: dict[str, Any] = SHORT) -> dict[str, Any]:
    latencies, timeouts, system2 = [], 0, 0
    for _ in range(n):
        started = time.monotonic()
        response = await client.post("/v1/policy-check", json=body)
        latencies.append((time.monotonic() - started) * 1000.0)
        rules = response.json()["rules"]
        timeouts += any(rule["reason"] == "timeout" for rule in rules)
        system2 += any(rule["system"] != 1 for rule in rules)
    latencies.sort()
    return {
        "n": n,
        "p50_ms": round(statistics.median(latencies), 1),
        # Nearest rank: the 99th of 100 (this took the largest before).
        "p99_ms": round(latencies[math.ceil(0.99 * n) - 1], 1),
        "timed_out": timeouts,
        "not_system1": system2,
    }


async def probes(url: str, tenant_key: str, pid: int) -> dict[str, Any]:
    """Each probe input once (after a short check as the baseline): server CPU, time and answer."""
    headers = {"Authorization": f"Bearer {tenant_key}"}
    out: dict[str, Any] = {}
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        await client.post("/v1/policy-check", json=GIT_STATUS)  # warm
        cases = {"short check (baseline)": GIT_STATUS}
        cases.update({name: {"policies": ["tool_safety"], **body} for name, body in PROBES.items()})
        for name, payload in cases.items():
            cpu = _cpu_s(pid)
            started = time.monotonic()
            response = await client.post("/v1/policy-check", json=payload)
            elapsed = time.monotonic() - started
            answer = response.json()
            out[name] = {
                "status": response.status_code,
                "server_cpu_s": round(_cpu_s(pid) - cpu, 2),
                "ms": round(elapsed * 1000.0, 1),
                "verdict": answer.get("verdict"),
                "reasons": sorted({rule["reason"] for rule in answer.get("rules", [])}),
            }
    return out


async def ten_clients(url: str, heavy_key: str, light_key: str, n: int) -> dict[str, Any]:
    """Ten clients of one tenant send the costliest accepted inputs without pause; another tenant checks."""
    heaviest = [PROBES[k] for k in ("100,000 characters of text", "1,000 emoji", "20,000-character word")]
    light_headers = {"Authorization": f"Bearer {light_key}"}
    async with httpx2.AsyncClient(base_url=url, headers=light_headers, timeout=60) as light:
        await _short_checks(light, 3, GIT_STATUS)  # warm
        alone = await _short_checks(light, n, GIT_STATUS)
        stop = asyncio.Event()
        heavy_headers = {"Authorization": f"Bearer {heavy_key}"}

        async def keep_heavy(i: int) -> tuple[int, int]:
            sent = timed_out = 0
            async with httpx2.AsyncClient(base_url=url, headers=heavy_headers, timeout=60) as heavy:
                while not stop.is_set():
                    body = {"policies": ["tool_safety"], **heaviest[(i + sent) % len(heaviest)]}
                    response = await heavy.post("/v1/policy-check", json=body)
                    sent += 1
                    if response.status_code == 200:
                        timed_out += any(r["reason"] == "timeout" for r in response.json()["rules"])
            return sent, timed_out

        heavy_tasks = [asyncio.create_task(keep_heavy(i)) for i in range(10)]
        await asyncio.sleep(1.0)
        during = await _short_checks(light, n, GIT_STATUS)
        stop.set()
        heavy = await asyncio.gather(*heavy_tasks)
    return {
        "alone": alone,
        "during_ten_clients": during,
        "heavy_requests": sum(s for s, _ in heavy),
        "heavy_timed_out": sum(t for _, t in heavy),
        "p50_ratio": round(during["p50_ms"] / alone["p50_ms"], 2),
        "p99_ratio": round(during["p99_ms"] / alone["p99_ms"], 2),
    }


async def cross_tenant(url: str, heavy_key: str, light_key: str, n: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {light_key}"}
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=60) as light:
        await _short_checks(light, 3)  # warm
        alone = await _short_checks(light, n)
        stop = asyncio.Event()

        async def keep_heavy() -> int:
            sent = 0
            async with httpx2.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {heavy_key}"}, timeout=60
            ) as heavy:
                while not stop.is_set():
                    await heavy.post("/v1/policy-check", json=LARGEST)
                    sent += 1
            return sent

        heavy_tasks = [asyncio.create_task(keep_heavy()) for _ in range(3)]
        await asyncio.sleep(0.5)
        during = await _short_checks(light, n)
        stop.set()
        heavy_sent = sum(await asyncio.gather(*heavy_tasks))
    return {
        "alone": alone,
        "during_three_largest": during,
        "heavy_requests": heavy_sent,
        "p50_ratio": round(during["p50_ms"] / alone["p50_ms"], 2),
    }


async def after_timeout(url: str, tenant_key: str, pid: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {tenant_key}"}
    async with httpx2.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        baseline = await _short_checks(client, 3)
        started = time.monotonic()
        response = await client.post("/v1/policy-check", json=LONG)
        long_ms = (time.monotonic() - started) * 1000.0
        reasons = sorted({rule["reason"] for rule in response.json()["rules"]})
        after = await _short_checks(client, 3)
        await asyncio.sleep(0.5)
        cpu = _cpu_s(pid)
        await asyncio.sleep(2.0)
        idle_cpu = _cpu_s(pid) - cpu
    return {
        "long_check_ms": round(long_ms, 1),
        "long_check_reasons": reasons,
        "short_before": baseline,
        "short_after": after,
        "server_cpu_s_in_2s_after": round(idle_cpu, 2),
    }


def _raw(url: str, payload: bytes, *, read_timeout: float = 5.0) -> tuple[str, float]:
    """Send raw bytes; the status line back (or what happened) and the seconds it took."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        sock.sendall(payload)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return "no answer", time.monotonic() - started
    line = data.split(b"\r\n", 1)[0].decode(errors="replace") if data else "closed"
    return line, time.monotonic() - started


async def malformed(url: str, tenant_key: str) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {tenant_key}", "Content-Type": "application/json"}
    cases: dict[str, tuple[str, bytes | dict[str, Any]]] = {
        "state nested 480 deep": ("/v1/systemone", b'{"state": ' + b"[" * 480 + b"]" * 480 + b', "questions": {}}'),
        "state nested 100,000 deep": ("/v1/systemone", b'{"state": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        "lone surrogate question name": (
            "/v1/systemone",
            b'{"state": "x", "questions": {"\\ud800": {"type": "noul", "instructions": "x?"}}}',
        ),
        "utf-8 BOM": ("/v1/policy-check", b"\xef\xbb\xbf" + json.dumps(SHORT).encode()),
        "utf-16": ("/v1/policy-check", json.dumps(SHORT).encode("utf-16")),
        "duplicate tool_call": (
            "/v1/policy-check",
            b'{"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {}},'
            b' "tool_call": {"name": "shell", "arguments": {"command": "rm -rf /"}}}',
        ),
        "900 KB argument": (
            "/v1/policy-check",
            {"policies": ["tool_safety"], "tool_call": {"name": "shell", "arguments": {"command": "x" * 900_000}}},
        ),
        "3,000 options": (
            "/v1/systemone",
            {
                "state": "which one?",
                "questions": {"pick": {"type": "choice", "criteria": {f"option {i}": None for i in range(3000)}}},
            },
        ),
    }
    out: dict[str, Any] = {}
    async with httpx2.AsyncClient(base_url=url, timeout=60) as client:
        for name, (path, body) in cases.items():
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            started = time.monotonic()
            response = await client.post(path, content=content, headers=auth)
            error = response.json().get("error", {}) if response.status_code >= 400 else {}
            out[name] = {
                "status": response.status_code,
                "field": error.get("field"),
                "ms": round((time.monotonic() - started) * 1000.0, 1),
            }
        response = await client.get("/v1/decisions/abc%00def", headers=auth)
        out["NUL in a decision id"] = {"status": response.status_code, "field": response.json()["error"].get("field")}
        response = await client.post("/v1/policy-check", content=b"{not json")
        out["invalid JSON without a key"] = {"status": response.status_code}
    smuggled = (
        b"POST /v1/policy-check HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    line, seconds = _raw(url, smuggled)
    out["Content-Length and Transfer-Encoding"] = {"answer": line, "s": round(seconds, 2)}
    line, seconds = _raw(url, b"POST /v1/policy-check HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n")
    out["over-limit Content-Length, no body"] = {"answer": line, "s": round(seconds, 2)}
    return out


async def run(quick: bool) -> dict[str, Any]:
    n = 8 if quick else 30
    with tempfile.TemporaryDirectory(prefix="fastslow-abuse-") as tmp, serving(Path(tmp)) as (url, process, env):
        heavy, light, other = key(env, "heavy"), key(env, "light"), key(env, "other")
        report: dict[str, Any] = {"quick": quick}
        report["cross_tenant"] = await cross_tenant(url, heavy, light, n)
        report["probes"] = await probes(url, other, process.pid)
        report["ten_clients"] = await ten_clients(url, heavy, light, 2 * n if quick else 300)
        report["after_a_timeout"] = await after_timeout(url, other, process.pid)
        report["malformed"] = await malformed(url, other)
        report["server_alive"] = httpx2.get(f"{url}/healthz", timeout=5).status_code == 200
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (under a minute)")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.quick))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
