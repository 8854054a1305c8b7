"""``fastslow serve --workers N`` beside ``--workers 1``: policy checks per second on this machine's cores.

Both servers run the ``jev`` engine against the stub Jev server (``bench/_http_servers.py stub``),
as ``bench/http_service.py`` runs them, with their decision log on PostgreSQL (workers refuse
SQLite: ``--database-url``, default the local test database), and neither is pinned: N
workers are there to use every core. The load generator and the stub share those cores with the
servers, which bounds what N workers can show on a small machine: on two cores the generator alone
uses a good part of one (``generator_cpu_share``), so the ratio measured here is a floor of what
two workers give where the callers run elsewhere.

The load is ``http_service``'s closed loop: ``concurrency`` callers through one ``httpx2`` client
with as many keep-alive connections, in slices that alternate between the two servers. Server CPU
per check is the whole process tree's (the supervisor and its workers). uvicorn's workers share
one listening socket and each accepts what is waiting when it wakes, so a burst of connections may
land unevenly: ``spread`` says how many of the generator's connections each worker took (from
``/proc``), since a worker with none adds nothing.

    python bench/workers.py            # concurrency 8 and 32, 5 slices each
    python bench/workers.py --quick    # concurrency 8 and 32, 1 short slice each: under a minute on a warm cache

Writes ``workers.json`` under ``--out`` (default ``bench/out/workers``); the last line of stdout is
one JSON object (``ratio``: N workers' throughput over one worker's, per concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from http_service import (
    BIN,
    REPO,
    SERVERS,
    Checks,
    Fleet,
    Server,
    Slice,
    _client,
    _cpu_s,
    _ratio,
    fastslow_env,
    load,
    make_key,
    summarise,
    wait_ready,
)

CONCURRENCY = (8, 32)


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def _tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(_children(current))
    return out


def _tree_cpu_s(pids: list[int]) -> float:
    """User plus system CPU seconds of ``pids`` so far (one that has ended counts no more)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += _cpu_s(pid)
    return total


def _workers(server: Server) -> list[int]:
    """The server's worker processes: its supervisor's spawned children, or the server itself."""
    spawned = [p for p in _children(server.pid) if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
    return spawned or [server.pid]


def _connections(pid: int, port: int) -> int:
    """How many established connections to ``port`` the process ``pid`` holds (its sockets' inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        local_port, state, inode = int(parts[1].split(":")[1], 16), parts[3], parts[9]
        if local_port == port and state == "01" and inode in inodes:  # 01: ESTABLISHED
            count += 1
    return count


async def _measured(client: Any, server: Server, checks: Checks, c: int, slice_s: float) -> Slice:
    pids = _tree(server.pid)
    server_cpu, generator_cpu = _tree_cpu_s(pids), time.process_time()
    out = await load(client, checks, c, 1_000_000, slice_s)
    out.server_cpu_s = _tree_cpu_s(pids) - server_cpu
    out.generator_cpu_s = time.process_time() - generator_cpu
    return out


async def run(workers: int, slices: int, slice_s: float, work: Path, database_url: str) -> dict[str, Any]:
    fleet = Fleet(work, None)
    results: dict[str, Any] = {"workers": workers, "cores": len(os.sched_getaffinity(0)), "concurrency": {}}
    with ExitStack() as stack:
        stack.callback(fleet.stop)
        stub = fleet.start("stub", [sys.executable, str(SERVERS), "stub"], {**os.environ}, core=None)
        wait_ready(stub, "/healthz")
        servers: dict[str, Server] = {}
        for n in (1, workers):
            env = fastslow_env(
                work / f"w{n}", FASTSLOW_ENGINE="jev", FASTSLOW_JEV__BASE_URL=stub.url, FASTSLOW_JEV__PROFILE="jev"
            )
            env["FASTSLOW_DATABASE_URL"] = database_url
            command = [str(BIN / "fastslow"), "serve", "--log-level", "warning", "--workers", str(n)]
            servers[f"w{n}"] = fleet.start(f"w{n}", command, env, core=None)
        for server in servers.values():
            wait_ready(server, "/readyz", 300)
            make_key(server)
        checks = Checks()
        for c in CONCURRENCY:
            clients = {name: _client(server, c) for name, server in servers.items()}
            try:
                # Warm: every worker up and its first-call paths taken, connections open.
                for name in servers:
                    await load(clients[name], checks, c, 1_000_000, 2.0)
                samples: dict[str, list[Slice]] = {name: [] for name in servers}
                for _ in range(slices):
                    for name, server in servers.items():
                        samples[name].append(await _measured(clients[name], server, checks, c, slice_s))
                row: dict[str, Any] = {name: summarise(s) for name, s in samples.items()}
                wn = servers[f"w{workers}"]
                port = int(wn.url.rsplit(":", 1)[1])
                row["spread"] = sorted((_connections(pid, port) for pid in _workers(wn)), reverse=True)
                row["ratio"] = _ratio(row[f"w{workers}"]["rps"], row["w1"]["rps"])
                results["concurrency"][str(c)] = row
            finally:
                for client in clients.values():
                    await client.aclose()
    results["ratio"] = {c: row["ratio"] for c, row in results["concurrency"].items()}
    results["generator_cpu_share"] = {
        c: statistics.median(row[name]["generator_cpu_share"] for name in ("w1", f"w{workers}"))
        for c, row in results["concurrency"].items()
    }
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one short slice per concurrency")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the server beside one worker's")
    parser.add_argument(
        "--database-url",
        default=os.environ.get("FASTSLOW_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        help="both servers' decision log, on PostgreSQL",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "workers")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastslow-workers-") as tmp:
        slices, slice_s = (1, 2.0) if args.quick else (5, 4.0)
        results = asyncio.run(run(args.workers, slices, slice_s, Path(tmp), args.database_url))
    results["quick"] = args.quick
    results["seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "workers.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))  # noqa: T201 - the one JSON line the benchmark ends with
    return 0


if __name__ == "__main__":
    sys.exit(main())
