"""The HTTP hot path: ``POST /v1/policy-check`` on ``fastslow serve`` against a bare FastAPI app, over loopback.

What a policy check costs in the service itself, not in System 1: fastslow runs with the ``jev``
engine against a stub Jev ``/v1/systemone`` server that answers at once (``bench/_http_servers.py``),
and the baselines are a bare FastAPI *proxy*, whose one route forwards the same Jev request to the
same stub through the same client fastslow uses and answers its JSON (what the System-1 exchange
costs), and a bare FastAPI *route* answering the same JSON bytes without any exchange (captured
from fastslow's own answer in the same run), all under the same uvicorn configuration
(``server_config``, one worker). The server under test is pinned to one core (``taskset -c``); the load generator and
the stub share the other, so neither steals the server's core. Without ``taskset`` or two cores it
runs unpinned and says so (``"pinned": false``).

The load is a closed loop: ``concurrency`` workers, each sending its next check when its last one
is answered, through one ``httpx2.AsyncClient`` with ``concurrency`` connections, every request
timed; each slice is bounded in requests and in seconds. Slices interleave (bare, fastslow, bare,
fastslow, ...) so drift on a busy machine falls on both; throughput and server CPU per request are
medians over slices, p50 / p99 are over every measured request of a target (one slice holds too
few for a stable p99). Server CPU is the server process's user + system time (``/proc``) over each
slice: what a check costs, which a busy machine does not inflate. A non-2xx answer or a transport
error counts as an error. ``generator_cpu_share`` is the load generator's CPU time over a slice's
wall time: near 1 it, not the server, set the pace (the bare figures are then a floor).

Then the embedded engine (``FASTSLOW_ENGINE=embedded``) with cross-request batching of the encoder
on (as shipped) and off, in interleaved slices on one server (not two with
``FASTSLOW_EMBEDDED__BATCHING`` on and off: one process loads the encoder once and shares its core
and caches): ``fastslow serve`` with ``BatchingEmbedder.embed`` patched to bypass the batching
while off, switched by a signal between slices (``bench/_http_servers.py serve-switchable``), with
``limits.engine_queue`` raised so one tenant's callers queue rather than being refused. Beside it,
the encoder alone timed on batches of 1 to 32 texts (``encoder-scaling``): what a batch can save.
Last, the fastslow (jev) server's resident set size after N1 and after N2 more checks
(``/proc/<pid>/status`` VmRSS): its caches must be bounded.

Every server gets its own SQLite database in a temporary directory, the example policy
(``examples/policy.yaml``, check task ``tool_safety``), a tenant key made with ``fastslow keys
create``, and a rate limit of ``RATE_LIMIT`` a minute: counted as in production, never reached
(the default 600 a minute per key would answer 429 within the first second of load). Each check
is a different shell command, so no cache answers in place of the service.

    python bench/http_service.py            # concurrency 1 / 8 / 32, embedded at all three, RSS after 20k and 100k
    python bench/http_service.py --quick    # short slices, embedded at 32 only, RSS after 100 and 400

Named ``http_service.py``, not ``http.py``: bench scripts run with ``bench/`` first on ``sys.path``,
where a ``http.py`` would shadow the standard library's ``http`` package for every one of them.

Writes ``http.json`` and ``http.md`` under ``--out`` (default ``bench/out/http``); the last line of
stdout is one JSON object (``ratio_vs_proxy`` and ``ratio_vs_bare``: fastslow's throughput over the
proxy's and the bare route's, per concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from _ready import wait_answering

REPO = Path(__file__).resolve().parent.parent
RATE_LIMIT = 100_000_000
"""Requests per key per minute: on, as in production (its cost is part of a check's), and never reached."""
BIN = Path(sys.executable).parent
SERVERS = Path(__file__).resolve().parent / "_http_servers.py"
POLICY = REPO / "examples" / "policy.yaml"
TICKS = os.sysconf("SC_CLK_TCK")
CONCURRENCY = (1, 8, 32)
GENERATOR_BOUND = 0.8
"""A slice whose load generator used more of its core than this was paced by the generator, not the
server: it is marked and does not count toward a ratio."""


@dataclass(frozen=True)
class Sizes:
    """How much each phase sends: slices per target, and each slice's caps."""

    slices: int
    slice_requests: int
    slice_s: float
    warmup_s: float
    embedded_concurrency: tuple[int, ...]
    embedded_slices: int
    embedded_slice_s: float
    rss_checks: tuple[int, int]
    rss_cap_s: float


QUICK = Sizes(2, 400, 0.5, 0.25, (32,), 2, 1.0, (100, 400), 5.0)
FULL = Sizes(5, 4_000, 4.0, 1.5, CONCURRENCY, 3, 4.0, (20_000, 100_000), 900.0)


# -- processes ---------------------------------------------------------------------------------


def _cores() -> tuple[int, int] | None:
    """The server's core and the generator's, or ``None`` when pinning is not possible here."""
    if not hasattr(os, "sched_setaffinity") or shutil.which("taskset") is None:
        return None
    cores = sorted(os.sched_getaffinity(0))
    return (cores[0], cores[1]) if len(cores) >= 2 else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc status")


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]
    key: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid


class Fleet:
    """Every child process of the run, each stopped when the run ends, however it ends."""

    def __init__(self, work: Path, cores: tuple[int, int] | None) -> None:
        self.work = work
        self.cores = cores
        self.servers: list[Server] = []

    def start(self, name: str, command: list[str], env: dict[str, str], *, core: int | None) -> Server:
        """Start ``command`` on a free port, on ``core`` alone when one is given (``taskset -c``)."""
        port = _free_port()
        pinned = ["taskset", "-c", str(core)] if core is not None else []
        log = self.work / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [*pinned, *command, "--port", str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=self.work
            )
        server = Server(name, f"http://127.0.0.1:{port}", process, log, env)
        self.servers.append(server)
        return server

    def stop(self) -> None:
        for server in self.servers:
            if server.process.poll() is None:
                server.process.terminate()
        for server in self.servers:
            try:
                server.process.wait(15)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait(5)


def _signal(server: Server, number: signal.Signals) -> None:
    """Send ``number`` and give the server's loop a moment to run its handler before the slice starts."""
    os.kill(server.pid, number)
    time.sleep(0.2)


def pin(server: Server, core: int | None) -> None:
    """Move every thread of a running server onto ``core`` (``taskset -a -p``); its later threads follow."""
    if core is not None:
        subprocess.run(["taskset", "-a", "-p", "-c", str(core), str(server.pid)], check=True, capture_output=True)


def wait_ready(server: Server, path: str, deadline_s: float = 120.0) -> None:
    """Until ``path`` answers 200; the server's log tail in the error when it dies or never does."""
    if not wait_answering(server.url + path, alive=lambda: server.process.poll() is None, deadline_s=deadline_s):
        tail = server.log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{server.name} did not become ready at {path}:\n{tail}")


def make_key(server: Server) -> None:
    done = subprocess.run(
        [str(BIN / "fastslow"), "keys", "create", "--tenant", "bench"],
        env=server.env,
        capture_output=True,
        check=True,
        cwd=server.env["FASTSLOW_DATA_DIR"],
    )
    server.key = done.stdout.decode().strip()


def fastslow_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """A clean fastslow environment: nothing of the caller's ``FASTSLOW_*`` leaks into the run, but
    its embedding cache (``FASTSLOW_EMBEDDED__CACHE_DIR``), where set: a head read back from it is
    the one trained, and the servers then start without training the example policy's rules again."""
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTSLOW_") or k == "FASTSLOW_EMBEDDED__CACHE_DIR"}
    env.update(
        FASTSLOW_DATA_DIR=str(data_dir),
        FASTSLOW_SETTINGS_FILE=str(data_dir / "no-settings.toml"),
        FASTSLOW_POLICY_FILE=str(POLICY),
        FASTSLOW_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT),
        **extra,
    )
    return env


# -- load --------------------------------------------------------------------------------------


class Checks:
    """A new tool call every request (a different shell command), so nothing can answer from a cache."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> dict[str, Any]:
        self.n += 1
        return {
            "policies": ["tool_safety"],
            "tool_call": {"name": "shell", "arguments": {"command": f"ls -la /srv/{self.n}"}},
        }


@dataclass
class Slice:
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    wall_s: float = 0.0
    server_cpu_s: float = 0.0
    generator_cpu_s: float = 0.0
    stub_cpu_s: float = 0.0

    @property
    def n(self) -> int:
        return len(self.latencies_ms) + sum(self.errors.values())


async def load(client: httpx2.AsyncClient, checks: Checks, concurrency: int, max_requests: int, max_s: float) -> Slice:
    """A closed loop of ``concurrency`` workers until ``max_requests`` are sent or ``max_s`` have passed."""
    out = Slice()
    sent = 0
    deadline = time.perf_counter() + max_s

    async def worker() -> None:
        nonlocal sent
        while sent < max_requests and time.perf_counter() < deadline:
            sent += 1
            body = checks()
            started = time.perf_counter()
            try:
                response = await client.post("/v1/policy-check", json=body)
            except httpx2.HTTPError as exc:
                out.errors[type(exc).__name__] += 1
                continue
            if 200 <= response.status_code < 300:
                out.latencies_ms.append((time.perf_counter() - started) * 1000)
            else:
                try:  # fastslow's error body names the kind: overloaded, engine_timeout, ...
                    kind = response.json()["error"]["type"]
                except (ValueError, KeyError, TypeError):
                    kind = "?"
                out.errors[f"{response.status_code} {kind}"] += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out.wall_s = time.perf_counter() - started
    return out


async def measured(
    client: httpx2.AsyncClient, server: Server, stub: Server | None, checks: Checks, c: int, n: int, s: float
) -> Slice:
    """One slice, with the server's, the stub's and this process's CPU time over it."""
    server_cpu, generator_cpu = _cpu_s(server.pid), time.process_time()
    stub_cpu = _cpu_s(stub.pid) if stub is not None else 0.0
    out = await load(client, checks, c, n, s)
    out.server_cpu_s = _cpu_s(server.pid) - server_cpu
    out.generator_cpu_s = time.process_time() - generator_cpu
    out.stub_cpu_s = (_cpu_s(stub.pid) - stub_cpu) if stub is not None else 0.0
    return out


def _client(server: Server, concurrency: int) -> httpx2.AsyncClient:
    limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {server.key}"} if server.key else {}
    return httpx2.AsyncClient(base_url=server.url, headers=headers, limits=limits, timeout=60)


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]


def summarise(slices: Sequence[Slice], *, stub: bool = False) -> dict[str, Any]:
    """Medians over slices for throughput and CPU; p50 / p99 over every measured request."""
    latencies = [ms for s in slices for ms in s.latencies_ms]
    errors: Counter[str] = Counter()
    for s in slices:
        errors.update(s.errors)
    ok = [s for s in slices if s.latencies_ms]
    figures: dict[str, Any] = {
        "requests": sum(s.n for s in slices),
        "slices": len(slices),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "rps": round(statistics.median(len(s.latencies_ms) / s.wall_s for s in ok), 1) if ok else 0.0,
        "p50_ms": round(statistics.median(latencies), 3) if latencies else None,
        "p99_ms": round(_p99(latencies), 3) if latencies else None,
        "cpu_ms_per_request": round(statistics.median(s.server_cpu_s * 1000 / s.n for s in ok), 3) if ok else None,
        "generator_cpu_share": round(statistics.median(s.generator_cpu_s / s.wall_s for s in slices), 2),
    }
    if stub:
        figures["stub_cpu_ms_per_request"] = round(statistics.median(s.stub_cpu_s * 1000 / s.n for s in ok), 3)
    return figures


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


async def compare(
    targets: dict[str, Server],
    stub: Server | None,
    concurrencies: Sequence[int],
    slices: int,
    slice_s: float,
    sizes: Sizes,
    *,
    switch: dict[str, Callable[[], None]] | None = None,
) -> dict[int, dict[str, dict[str, Any]]]:
    """Per concurrency, every target measured in interleaved slices (A, B, A, B, ...)."""
    checks, out = Checks(), {}
    for c in concurrencies:
        clients = {name: _client(server, c) for name, server in targets.items()}
        try:
            for name in targets:  # warm: connections open, first-call paths taken
                await load(clients[name], checks, c, 10_000, sizes.warmup_s)
            samples: dict[str, list[Slice]] = {name: [] for name in targets}
            for _ in range(slices):
                for name, server in targets.items():
                    if switch is not None:
                        switch[name]()
                    samples[name].append(
                        await measured(clients[name], server, stub, checks, c, sizes.slice_requests, slice_s)
                    )
            out[c] = {name: summarise(s, stub=stub is not None and name != "bare") for name, s in samples.items()}
        finally:
            for client in clients.values():
                await client.aclose()
    return out


async def rss(server: Server, first: int, last: int, cap_s: float) -> dict[str, Any]:
    """The server's RSS after ``first`` checks and after ``last`` (concurrency 8), within ``cap_s`` in all."""
    checks, deadline = Checks(), time.perf_counter() + cap_s
    async with _client(server, 8) as client:
        done = await load(client, checks, 8, first, cap_s)
        at_first, first_n = _rss_mib(server.pid), done.n
        more = await load(client, checks, 8, last - first, max(deadline - time.perf_counter(), 0.1))
        at_last = _rss_mib(server.pid)
    return {
        "checks_first": first_n,
        "checks_last": first_n + more.n,
        "errors": sum(done.errors.values()) + sum(more.errors.values()),
        "rss_mib_first": round(at_first, 1),
        "rss_mib_last": round(at_last, 1),
        "growth_mib": round(at_last - at_first, 1),
    }


# -- report ------------------------------------------------------------------------------------


def _bound(met: bool, row: dict[str, Any]) -> bool | None:
    """``met``, or ``None`` where the load generator set the pace (the slice does not count)."""
    return None if row["generator_bound"] else met


def _targets(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The HTTP hot path's targets against the bare proxy: (target, what was measured, met?; None: not counted)."""
    jev = results["jev"]
    rows: list[tuple[str, str, bool | None]] = []
    for c in ("8", "32"):
        ratio = jev[c]["ratio_vs_proxy"]
        met = _bound(ratio is not None and ratio >= 0.6, jev[c])
        rows.append((f"throughput ≥ 0.6× proxy at {c}", f"{ratio}×", met))
    for c in ("8", "32"):
        p99_ratio = jev[c]["p99_ratio_vs_proxy"]
        met = _bound(p99_ratio is not None and p99_ratio <= 2, jev[c])
        rows.append((f"p99 ≤ 2× proxy at {c}", f"{p99_ratio}×", met))
    p99 = jev["8"]["fastslow"]["p99_ms"]
    rows.append(("p99 ≤ 50 ms at 8", f"{p99} ms", p99 is not None and p99 <= 50))
    counted = [jev[c]["cpu_ratio_vs_proxy"] for c in jev if not jev[c]["generator_bound"]]
    worst = max((r for r in counted if r is not None), default=None)
    cpu_met = None if worst is None else worst <= 1.7
    rows.append(("CPU per check ≤ 1.7× proxy (every concurrency)", f"{worst}× at worst", cpu_met))
    batching = results["embedded_batching_ratio"]
    rows.append(("embedded batching ≥ 3× at 32", f"{batching}×", None if batching is None else batching >= 3))
    growth = results["rss"]["growth_mib"]
    rows.append(("RSS growth ≤ 20 MiB", f"{growth:+} MiB", growth <= 20))
    return rows


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render(results: dict[str, Any]) -> str:
    """The figures as a markdown section (for docs/benchmarks.md)."""
    mode = "quick" if results["quick"] else "full"
    pinned = "server pinned to one core, load generator and stub on another" if results["pinned"] else "unpinned"
    lines = [
        "## HTTP policy-check service (`bench/http_service.py`)",
        "",
        f"`POST /v1/policy-check` over loopback, closed loop, {mode} run ({pinned}); fastslow with the `jev` engine",
        "against a stub answering at once, beside a bare FastAPI proxy (the same Jev exchange with the stub,",
        "nothing else) and a bare FastAPI route answering the same JSON, all under the same uvicorn",
        "configuration. Throughput and server CPU per check: medians of interleaved slices; p50 / p99: over every",
        "measured request.",
        "",
        "### fastslow (jev stub) against a bare proxy and a bare route",
        "",
        "The proxy forwards each check's Jev request to the same stub through the same client and answers its",
        "JSON (`bench/_http_servers.py proxy`): what the System-1 exchange costs. The bare route answers fastslow's",
        "bytes without any exchange.",
        "",
        "| concurrency | target | req/s | p50 / p99 ms | CPU ms/req | generator CPU share | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for c, row in results["jev"].items():
        for name in ("bare", "proxy", "fastslow"):
            f = row[name]
            lines.append(
                f"| {c} | {name} | {f['rps']:.0f} | {_ms(f['p50_ms'])} / {_ms(f['p99_ms'])} | "
                f"{_ms(f['cpu_ms_per_request'])} | {f['generator_cpu_share']} | {f['errors']} |"
            )
    lines += [
        "",
        "| concurrency | fastslow × proxy: req/s | p99 | CPU | fastslow × bare: req/s | p99 | CPU | generator-bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, row in results["jev"].items():
        lines.append(
            f"| {c} | {row['ratio_vs_proxy']} | {row['p99_ratio_vs_proxy']} | {row['cpu_ratio_vs_proxy']} | "
            f"{row['ratio_vs_bare']} | {row['p99_ratio']} | {row['cpu_ratio']} | "
            f"{'yes' if row['generator_bound'] else 'no'} |"
        )
    shares = [r[k]["generator_cpu_share"] for r in results["jev"].values() for k in ("bare", "proxy", "fastslow")]
    lines += [
        "",
        f"The load generator's CPU share of its core over a slice: {min(shares)} to {max(shares)} "
        "(near 1: it, not the server, set the pace).",
    ]
    lines += [
        "",
        "### Embedded engine: cross-request batching of the encoder on and off",
        "",
        "| concurrency | batching | req/s | p50 ms | p99 ms | CPU ms/req | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for c, row in results["embedded"].items():
        for name, f in row.items():
            lines.append(
                f"| {c} | {name} | {f['rps']:.1f} | {_ms(f['p50_ms'])} | {_ms(f['p99_ms'])} | "
                f"{_ms(f['cpu_ms_per_request'])} | {f['errors']} |"
            )
    scaling = results["encoder_ms_per_text_by_batch"]
    lines += [
        "",
        "One server, switched between slices: `fastslow serve` with `BatchingEmbedder.embed` patched to bypass",
        "the batching while off (`bench/_http_servers.py serve-switchable`), so on and off share one process;",
        "`limits.engine_queue` 256, so that one tenant's 32 callers all wait instead of half being refused.",
        "",
        "The encoder itself (e5-small-q4, one core), milliseconds per text by batch size: "
        + ", ".join(f"{size}: {ms}" for size, ms in scaling.items())
        + ". Its cost per text barely falls as batches grow (the C engine is compute-bound on short",
        "texts), which bounds what cross-request batching can gain on this engine.",
    ]
    r = results["rss"]
    lines += [
        "",
        f"RSS of the fastslow (jev) server after {r['checks_first']:,} checks: {r['rss_mib_first']} MiB; after "
        f"{r['checks_last']:,}: {r['rss_mib_last']} MiB ({r['growth_mib']:+} MiB).",
        "",
        "| target (HTTP hot path, second round: against the proxy) | measured | |",
        "|---|---|---|",
    ]
    for target, measured_, met in _targets(results):
        lines.append(f"| {target} | {measured_} | {'not run' if met is None else 'met' if met else 'missed'} |")
    return "\n".join(lines) + "\n"


# -- run ---------------------------------------------------------------------------------------


async def run(sizes: Sizes, quick: bool, work: Path) -> dict[str, Any]:
    cores = _cores()
    server_core = generator_core = None
    if cores is not None:
        server_core, generator_core = cores
        os.sched_setaffinity(0, {generator_core})  # this process; the keys command inherits it too
    fleet = Fleet(work, cores)
    started, phases = time.perf_counter(), {}
    with ExitStack() as stack:
        stack.callback(fleet.stop)
        python = [sys.executable, str(SERVERS)]
        # The encoder's own cost per text as batches grow, on the server's core before any server
        # shares it: the most a cross-request batch can save.
        pinned = ["taskset", "-c", str(server_core)] if server_core is not None else []
        scaling = subprocess.run(
            [*pinned, *python, "encoder-scaling"], capture_output=True, text=True, check=True, cwd=work
        )
        encoder = json.loads(scaling.stdout.strip().splitlines()[-1])
        phases["encoder"] = round(time.perf_counter() - started, 1)
        stub = fleet.start("stub", [*python, "stub"], {**os.environ}, core=generator_core)
        wait_ready(stub, "/healthz")  # the stub answers every path
        jev_env = fastslow_env(
            work / "jev", FASTSLOW_ENGINE="jev", FASTSLOW_JEV__BASE_URL=stub.url, FASTSLOW_JEV__PROFILE="jev"
        )
        serve = [str(BIN / "fastslow"), "serve", "--log-level", "warning"]
        # Both start unpinned, on both cores (loading the encoder is most of a minute on one),
        # and are moved onto the server's core once ready, before anything is measured.
        fastslow = fleet.start("fastslow-jev", serve, jev_env, core=None)
        # One tenant sends every request here; a lone tenant may fill the whole queue (FairGate),
        # and 256 keeps all 32 callers' waits far from it.
        embedded_env = fastslow_env(work / "embedded", FASTSLOW_ENGINE="embedded", FASTSLOW_LIMITS__ENGINE_QUEUE="256")
        embedded_server = fleet.start("embedded", [*python, "serve-switchable"], embedded_env, core=None)
        for server in (fastslow, embedded_server):
            wait_ready(server, "/readyz", 300)
            pin(server, server_core)
            make_key(server)
        phases["start"] = round(time.perf_counter() - started - phases["encoder"], 1)
        # The bare app answers with the bytes fastslow itself answered, so both send the same body.
        answer = httpx2.post(
            f"{fastslow.url}/v1/policy-check",
            json=Checks()(),
            headers={"Authorization": f"Bearer {fastslow.key}"},
            timeout=30,
        )
        answer.raise_for_status()
        (work / "answer.json").write_bytes(answer.content)
        bare = fleet.start(
            "bare", [*python, "bare", "--body", str(work / "answer.json")], {**os.environ}, core=server_core
        )
        wait_ready(bare, "/healthz")
        # The fair baseline: the same Jev exchange with the stub through the same client, and nothing else.
        proxy = fleet.start("proxy", [*python, "proxy", "--stub", stub.url], {**os.environ}, core=server_core)
        wait_ready(proxy, "/healthz")

        jev_raw = await compare(
            {"bare": bare, "proxy": proxy, "fastslow": fastslow}, stub, CONCURRENCY, sizes.slices, sizes.slice_s, sizes
        )
        phases["jev"] = round(time.perf_counter() - started - sum(phases.values()), 1)
        jev: dict[str, Any] = {}
        for c, row in jev_raw.items():
            b, x, f = row["bare"], row["proxy"], row["fastslow"]
            jev[str(c)] = {
                **row,
                "ratio_vs_bare": _ratio(f["rps"], b["rps"]),
                "p99_ratio": _ratio(f["p99_ms"], b["p99_ms"]),
                "cpu_ratio": _ratio(f["cpu_ms_per_request"], b["cpu_ms_per_request"]),
                "ratio_vs_proxy": _ratio(f["rps"], x["rps"]),
                "p99_ratio_vs_proxy": _ratio(f["p99_ms"], x["p99_ms"]),
                "cpu_ratio_vs_proxy": _ratio(f["cpu_ms_per_request"], x["cpu_ms_per_request"]),
                # Its pace was the load generator's, not the server's: not counted toward a ratio.
                "generator_bound": any(row[k]["generator_cpu_share"] > GENERATOR_BOUND for k in ("proxy", "fastslow")),
            }
        switch = {
            "on": lambda: _signal(embedded_server, signal.SIGUSR2),
            "off": lambda: _signal(embedded_server, signal.SIGUSR1),
        }
        embedded_raw = await compare(
            {"on": embedded_server, "off": embedded_server},
            None,
            sizes.embedded_concurrency,
            sizes.embedded_slices,
            sizes.embedded_slice_s,
            sizes,
            switch=switch,
        )
        phases["embedded"] = round(time.perf_counter() - started - sum(phases.values()), 1)
        embedded = {str(c): row for c, row in embedded_raw.items()}
        at32 = embedded.get("32")
        batching = _ratio(at32["on"]["rps"], at32["off"]["rps"]) if at32 else None
        memory = await rss(fastslow, *sizes.rss_checks, sizes.rss_cap_s)
        phases["rss"] = round(time.perf_counter() - started - sum(phases.values()), 1)
        answer_body = json.loads(answer.content)
    errors = sum(f["errors"] for row in [*jev_raw.values(), *embedded_raw.values()] for f in row.values())
    return {
        "quick": quick,
        "pinned": cores is not None,
        "cores": {"server": server_core, "generator_and_stub": generator_core},
        "check": {"policy": "tool_safety", "verdict": answer_body["verdict"], "answer_bytes": len(answer.content)},
        "ratio_vs_bare": {c: row["ratio_vs_bare"] for c, row in jev.items()},
        "ratio_vs_proxy": {c: row["ratio_vs_proxy"] for c, row in jev.items()},
        "jev": jev,
        "embedded": embedded,
        "embedded_batching_ratio": batching,
        "encoder_ms_per_text_by_batch": encoder["ms_per_text_by_batch"],
        "rss": memory,
        "errors": errors + memory["errors"],
        "phase_s": phases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short slices, embedded at 32 only: under a minute")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "http")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastslow-http-") as tmp:
        results = asyncio.run(run(sizes, args.quick, Path(tmp)))
    results["targets"] = [{"target": t, "measured": m, "met": met} for t, m, met in _targets(results)]
    results["seconds"] = round(time.perf_counter() - started, 1)
    (args.out / "http.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "http.md").write_text(render(results))
    print(json.dumps(results))  # noqa: T201 - the one JSON line the benchmark ends with
    return 0


if __name__ == "__main__":
    sys.exit(main())
