"""What fastslow adds per routing decision in a LangGraph graph, side by side with the LangGraph Jev routers.

Every router asks the same stub: a Jev ``/v1/systemone`` server behind an ``httpx2.MockTransport``
that answers instantly (the first option, at 0.9), so what is measured is each router's own work
and the graph step it needs. Each graph goes START -> <routing> -> billing -> END; the baseline is
the same graph with a bare conditional edge (a function returning ``"billing"``), and a form's
added latency is its median (and 99th percentile) minus the baseline's, all in one run. Forms run
interleaved, in a fresh random order each round, so drift on a busy machine is shared out.

- ``fastslow node``: ``router_node`` (a node step, ``Command(goto=...)``, the decision in state);
- ``fastslow edge``: ``route_edge`` on a conditional edge (the decision in the log only);
- each of those with the decision log (``DecisionStore`` on SQLite) as the router's sink;
- ``langgraph-jev-router`` 0.2.0: ``@jev_first`` on a conditional-edge function (sync under
  ``invoke``, async under ``ainvoke``, as its README offers both), the default settings;
- ``langgraph-jev`` 0.1.0: a ``JevNode`` and ``route_by_decision`` on the edge after it, as its
  README shows; under ``ainvoke`` the node is its own ``ainvoke`` method and the edge an async
  function (the README's sync forms would run in LangGraph's thread pool there).

Under ``ainvoke`` the baseline edge and the agents are async functions too, so no form pays for a
thread hop it would not pay in a well-built async graph; every peer gets its lightest form.

Every call routes a new message ("... order <n>"), so the jev-router's LRU of identical inputs
never answers in place of Jev. Then ``Router.route`` is run many times in process, without a sink,
and the resident set size is read after the first and the last batch (caches must be bounded).

    python bench/overhead.py            # 600 calls a form and mode; RSS after 20k and 100k decisions
    python bench/overhead.py --quick    # 150 calls a form and mode; RSS after 5k and 25k: under a minute

Needs the ``bench`` extra (``pip install -e '.[bench]'``). Writes ``overhead.json`` and
``overhead.md`` under ``--out`` (default ``bench/out/overhead``); the last line of stdout is one
JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _overhead_peers import (
    PEERS,
    BenchState,
    LazySink,
    StubChats,
    StubEngines,
    jev_router_edge,
    langgraph_jev_graph,
    stub_async_client,
    stub_sync_client,
)
from _overhead_tracing import SwitchProvider, Traced, install
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, StateGraph

from fastslow.engines.jev import JevEngine
from fastslow.router import PolicySet, Route, Router, RouteTask, Thresholds, route_edge, router_node
from fastslow.router.engine_api import TracedEngine
from fastslow.router.settings import JevSettings

REPO = Path(__file__).resolve().parent.parent
ROUTES = ("billing", "technical", "account")
BASELINE = "bare conditional edge"
TRACED = "fastslow node, traced (in-memory exporter)"
UNTRACED = "fastslow node"


def _router(sink: LazySink | None) -> Router:
    settings = JevSettings(base_url="http://jev.stub", profile="jev", max_retries=0)
    # Both clients, as the peers have theirs: the sync one serves invoke (Router.route_sync).
    # In a span wrapper, as the engine pool builds every engine.
    engine = TracedEngine(JevEngine(settings, http_client=stub_async_client(), sync_http_client=stub_sync_client()))
    task = RouteTask(
        name="support",
        routes={r: Route(name=r, description=f"{r} questions") for r in ROUTES},
        thresholds=Thresholds(min_confidence=0.7),
    )
    policy = PolicySet(tasks={"support": task}, version="bench")
    return Router(lambda: policy, StubEngines(engine), StubChats(), sink=sink)


def _to_billing(state: BenchState) -> str:
    del state
    return "billing"


async def _ato_billing(state: BenchState) -> str:
    del state
    return "billing"


def _handled(state: BenchState) -> dict[str, Any]:
    del state
    return {"handled": True}


async def _ahandled(state: BenchState) -> dict[str, Any]:
    del state
    return {"handled": True}


def _graph(routing: Callable[[StateGraph[BenchState, Any, BenchState, BenchState]], None], mode: str) -> Any:
    graph: StateGraph[BenchState, Any, BenchState, BenchState] = StateGraph(BenchState)
    for name in ROUTES:
        # An async agent under ainvoke: a sync one would run in LangGraph's thread pool, and that
        # thread hop, the same in every form, would only add noise.
        graph.add_node(name, _ahandled if mode == "ainvoke" else _handled)
        graph.add_edge(name, END)
    routing(graph)
    return graph.compile()


def _forms(mode: str, work: Path, provider: SwitchProvider) -> tuple[dict[str, Any], list[LazySink]]:
    """Each form's compiled graph, and the decision logs (new SQLite files for this mode) to close."""
    sinks: list[LazySink] = []

    def bare(g: Any) -> None:
        # Async under ainvoke: LangGraph runs a sync edge function there in its thread pool.
        g.add_conditional_edges(START, _ato_billing if mode == "ainvoke" else _to_billing, list(ROUTES))

    def node(router: Router) -> Callable[[Any], None]:
        def add(g: Any) -> None:
            g.add_node("route", router_node(router, "support", escalate_to="account"), destinations=ROUTES)
            g.add_edge(START, "route")

        return add

    def edge(router: Router) -> Callable[[Any], None]:
        return lambda g: g.add_conditional_edges(START, route_edge(router, "support", escalate_to="account"), ROUTES)

    def log(name: str, *, write_behind: bool = False) -> LazySink:
        sinks.append(LazySink(f"sqlite+aiosqlite:///{work / f'{mode}-{name}.sqlite3'}", write_behind=write_behind))
        return sinks[-1]

    forms: dict[str, Any] = {
        BASELINE: bare,
        UNTRACED: node(_router(None)),
        TRACED: node(_router(None)),
        "fastslow edge": edge(_router(None)),
        "fastslow node + SQLite log": node(_router(log("node"))),
        "fastslow edge + SQLite log": edge(_router(log("edge"))),
        "fastslow node + SQLite log, write-behind": node(_router(log("node-wb", write_behind=True))),
        "fastslow edge + SQLite log, write-behind": edge(_router(log("edge-wb", write_behind=True))),
        "langgraph-jev-router": jev_router_edge(list(ROUTES), asynchronous=mode == "ainvoke"),
        "langgraph-jev": langgraph_jev_graph(list(ROUTES), asynchronous=mode == "ainvoke"),
    }
    apps = {name: _graph(routing, mode) for name, routing in forms.items()}
    apps[TRACED] = Traced(apps[TRACED], provider)
    return apps, sinks


class Messages:
    """A new user message every call, so no router can answer from a cache of identical inputs."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> dict[str, Any]:
        self.n += 1
        text = f"I was charged twice for order {self.n}, please refund it"
        return {"messages": [HumanMessage(text)], "request": text}


def _rounds(calls: int) -> tuple[int, int]:
    per_round = 5
    return max(1, calls // per_round), per_round


Samples = dict[str, list[float]]


def measure_sync(forms: dict[str, Any], calls: int, warmup: int, seed: int) -> tuple[Samples, Samples]:
    """Each call's wall time and the process's CPU time over it, in ms, per form."""
    rng, messages = random.Random(seed), Messages()
    samples: dict[str, list[float]] = {name: [] for name in forms}
    cpu_samples: dict[str, list[float]] = {name: [] for name in forms}
    for app in forms.values():
        for _ in range(warmup):
            app.invoke(messages())
    rounds, per_round = _rounds(calls)
    for _ in range(rounds):
        order = list(forms)
        rng.shuffle(order)
        for name in order:
            app = forms[name]
            for _ in range(per_round):
                state = messages()
                started, cpu = time.perf_counter(), time.process_time()
                app.invoke(state)
                samples[name].append((time.perf_counter() - started) * 1000)
                cpu_samples[name].append((time.process_time() - cpu) * 1000)
    return samples, cpu_samples


async def measure_async(forms: dict[str, Any], calls: int, warmup: int, seed: int) -> tuple[Samples, Samples]:
    rng, messages = random.Random(seed), Messages()
    samples: dict[str, list[float]] = {name: [] for name in forms}
    cpu_samples: dict[str, list[float]] = {name: [] for name in forms}
    for app in forms.values():
        for _ in range(warmup):
            await app.ainvoke(messages())
    rounds, per_round = _rounds(calls)
    for _ in range(rounds):
        order = list(forms)
        rng.shuffle(order)
        for name in order:
            app = forms[name]
            for _ in range(per_round):
                state = messages()
                started, cpu = time.perf_counter(), time.process_time()
                await app.ainvoke(state)
                samples[name].append((time.perf_counter() - started) * 1000)
                cpu_samples[name].append((time.process_time() - cpu) * 1000)
    return samples, cpu_samples


def _tracing(figures: dict[str, dict[str, Any]], traced: Traced, calls: int) -> dict[str, float]:
    """What recording spans adds per decision: the traced node against the same node untraced, same run."""
    spans = traced.spans + len(traced.exporter_spans())
    return {
        "added_p50_ms": round(figures[TRACED]["raw_p50_ms"] - figures[UNTRACED]["raw_p50_ms"], 4),
        "added_cpu_p50_ms": round(figures[TRACED]["cpu_p50_ms"] - figures[UNTRACED]["cpu_p50_ms"], 4),
        "spans_per_call": round(spans / max(1, calls), 2),
    }


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def summarise(samples: tuple[Samples, Samples]) -> dict[str, dict[str, Any]]:
    """Added p50 / p99 over the bare edge per form, and each form's added p50 over each peer's.

    ``cpu_*`` are the same from the process's CPU time: what the work costs, without the time
    the process waited for a core on a busy machine (nor, under ``invoke``, for a thread to wake).
    """
    wall, cpu = samples
    base50, base99, cpu50 = statistics.median(wall[BASELINE]), _p99(wall[BASELINE]), statistics.median(cpu[BASELINE])
    added: dict[str, dict[str, Any]] = {
        name: {
            "p50_ms": round(statistics.median(values) - base50, 4),
            "p99_ms": round(_p99(values) - base99, 4),
            "raw_p50_ms": round(statistics.median(values), 4),
            "cpu_p50_ms": round(statistics.median(cpu[name]) - cpu50, 4),
            "n": len(values),
        }
        for name, values in wall.items()
    }
    for name, figures in added.items():
        if name == BASELINE:
            continue
        for peer in PEERS:
            for key, prefix in (("p50_ms", "ratio_vs_"), ("cpu_p50_ms", "cpu_ratio_vs_")):
                peer_p50 = added[peer][key]
                figures[prefix + peer] = round(figures[key] / peer_p50, 3) if peer_p50 > 0 else None
    return added


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    import resource  # not Linux: the peak instead of the current size

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure_rss(first: int, last: int) -> dict[str, float]:
    """RSS after ``first`` and after ``last`` in-process decisions (``Router.route``, no sink)."""
    router, messages = _router(None), Messages()

    async def decide(count: int) -> None:
        for _ in range(count // 8):
            await asyncio.gather(*(router.route("support", messages()["messages"]) for _ in range(8)))

    await decide(first)
    gc.collect()
    at_first = _rss_mib()
    await decide(last - first)
    gc.collect()
    at_last = _rss_mib()
    return {
        "decisions_first": first,
        "decisions_last": last,
        "rss_mib_first": round(at_first, 1),
        "rss_mib_last": round(at_last, 1),
        "growth_mib": round(at_last - at_first, 1),
    }


def _ratio(value: float | None) -> str:
    # None: the peer added nothing measurable in this run, so there is no ratio to give.
    return "n/a" if value is None else f"{value:.2f}"


def render(results: dict[str, Any]) -> str:
    """The figures as a markdown section (for docs/benchmarks.md)."""
    peers = list(PEERS)
    head = (
        "| form | added p50 ms | added p99 ms | "
        + " | ".join(f"× {p}" for p in peers)
        + " | added CPU p50 ms | "
        + " | ".join(f"CPU × {p}" for p in peers)
        + " |"
    )
    lines = ["## Overhead per routing decision in a LangGraph graph", ""]
    lines.append(
        "Added over a bare conditional edge, stub Jev answering instantly, interleaved in one run "
        f"({'quick' if results['quick'] else 'full'}; {results['calls']} calls a form and mode). "
        "CPU columns: the process's CPU time per call, which a busy machine does not inflate."
    )
    for mode in ("invoke", "ainvoke"):
        lines += ["", f"### `{mode}`", "", head, "|" + "---|" * (4 + 2 * len(peers))]
        for name, f in results[mode].items():
            if name == BASELINE:
                blank = " |" * len(peers)
                lines.append(f"| {name} (raw p50 {f['raw_p50_ms']:.3f} ms) | 0 | 0 |{blank} 0 |{blank}")
                continue
            ratios = " | ".join(_ratio(f[f"ratio_vs_{p}"]) for p in peers)
            cpu = " | ".join(_ratio(f[f"cpu_ratio_vs_{p}"]) for p in peers)
            lines.append(
                f"| {name} | {f['p50_ms']:.3f} | {f['p99_ms']:.3f} | {ratios} | {f['cpu_p50_ms']:.3f} | {cpu} |"
            )
    lines += ["", "### Tracing", ""]
    for mode in ("invoke", "ainvoke"):
        t = results["tracing"][mode]
        lines.append(
            f"- `{mode}`: spans recorded and exported to memory add {t['added_p50_ms']:.3f} ms p50 "
            f"({t['added_cpu_p50_ms']:.3f} ms CPU) per decision over the same node untraced "
            f"({t['spans_per_call']:.1f} spans a call)."
        )
    lines.append(
        "Untraced, the process's provider says it records nothing, and fastslow then makes no span, "
        "exactly as in a process that configures no tracing."
    )
    rss = results["rss"]
    lines += [
        "",
        f"RSS after {rss['decisions_first']:,} in-process decisions: {rss['rss_mib_first']} MiB; after "
        f"{rss['decisions_last']:,}: {rss['rss_mib_last']} MiB ({rss['growth_mib']:+} MiB).",
        "",
        *_targets(results, peers),
        "Under `invoke` the router decides in the caller's thread (`Router.route_sync`): the Jev client",
        "asks over its sync `httpx2.Client`, and the write-behind log only queues from that thread.",
        "System 2, a durable commit and engines without a sync path go through fastslow's loop thread.",
        "The log's own figures (`+ SQLite log`, without write-behind) are group commit, as the HTTP API",
        "uses: each call waits for its commit.",
    ]
    return "\n".join(lines)


TARGETS = (
    ("fastslow edge", 0.5),
    ("fastslow node", 1.0),
    ("fastslow node + SQLite log, write-behind", 1.5),
)
"""Issue 13's targets: a form's added p50 at most this many times the lightest peer's, in the same run."""


def _targets(results: dict[str, Any], peers: Sequence[str]) -> list[str]:
    lines = ["| target: added p50 against the lightest peer | `ainvoke` | `invoke` |", "|---|---|---|"]
    for form, bound in TARGETS:
        cells = []
        for mode in ("ainvoke", "invoke"):
            forms = results[mode]
            if form not in forms:
                cells.append("not run")
                continue
            ratio = max(forms[form][f"ratio_vs_{p}"] for p in peers)  # against the lightest of them
            cells.append(f"{ratio:.2f}×: {'met' if ratio <= bound else 'missed'}")
        lines.append(f"| {form} ≤ {bound}× | {cells[0]} | {cells[1]} |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls and decisions: under a minute")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "overhead")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args(argv)
    calls, warmup = (150, 10) if args.quick else (600, 40)
    rss_counts = (5_000, 25_000) if args.quick else (20_000, 100_000)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    provider = install()
    tracing: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="fastslow-overhead-") as tmp:
        forms, sinks = _forms("invoke", Path(tmp), provider)
        sync = summarise(measure_sync(forms, calls, warmup, args.seed))
        tracing["invoke"] = _tracing(sync, forms[TRACED], calls + warmup)
        for sink in sinks:
            sink.close()

        async def run_async() -> dict[str, dict[str, Any]]:
            forms, sinks = _forms("ainvoke", Path(tmp), provider)
            try:
                figures = summarise(await measure_async(forms, calls, warmup, args.seed))
                tracing["ainvoke"] = _tracing(figures, forms[TRACED], calls + warmup)
                return figures
            finally:
                for sink in sinks:
                    await sink.aclose()

        asynchronous = asyncio.run(run_async())
    rss = asyncio.run(measure_rss(*rss_counts))
    results: dict[str, Any] = {
        "quick": args.quick,
        "calls": calls,
        "invoke": sync,
        "ainvoke": asynchronous,
        "rss": rss,
        "tracing": tracing,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (args.out / "overhead.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "overhead.md").write_text(render(results))
    print(json.dumps(results))  # noqa: T201 - the one JSON line the benchmark ends with
    return 0


if __name__ == "__main__":
    sys.exit(main())
