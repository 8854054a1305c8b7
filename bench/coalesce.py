"""Coalescing: 64 callers asking 64 different questions about one state, and a lone caller.

The System 1 is a Jev ``/v1/systemone`` stub behind an ``httpx2.MockTransport`` that answers after
a small fixed service delay and counts the requests it gets. Two routers ask it, each through its
own ``JevEngine``: one with the engine wrapped in ``CoalescingEngine`` (what ``EnginePool`` hands
out by default), one with the bare engine. Each round, in alternating order:

* a burst: 64 concurrent ``Router.classify`` calls, each for its own one-question task about the
  same state: the engine requests the stub got, and every caller's latency;
* lone calls: one ``Router.classify`` at a time, nothing else in flight.

Medians over rounds (of each burst's p50 and p99), and ratios coalesced / bare, from the same
interleaved run; a full garbage collection runs before each burst, outside the timing.

    python bench/coalesce.py            # about a minute and a half on two cores
    python bench/coalesce.py --quick    # a few rounds, well under a minute

Writes ``bench/out/coalesce/coalesce.md``; the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx2

from fastslow.engines.jev import JevEngine
from fastslow.router import ClassifyTask, Noul, PolicySet, Router
from fastslow.router.engine_api import ChatEngine, CoalescingEngine, DecisionEngine
from fastslow.router.settings import CoalesceSettings, JevSettings

OUT = Path(__file__).parent / "out" / "coalesce"
CALLERS = 64
STATE = "My parcel was marked delivered yesterday but it never arrived, and the courier will not answer."


class _Stub:
    """The Jev stub: every noul answered "no" at 0.97 after ``delay_s``; requests counted."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.requests = 0

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests += 1
        questions = json.loads(request.content)["questions"]
        await asyncio.sleep(self.delay_s)
        answers = {name: {"type": "noul", "noul": 0.03} for name in questions}
        body = {"model": "jev-1.13.0", "answers": answers, "usage": {"input_tokens": 40, "output_tokens": 1}}
        return httpx2.Response(200, json=body)


class _Engines:
    def __init__(self, engine: DecisionEngine) -> None:
        self.engine = engine

    def engine_for(self, name: object, policy: PolicySet) -> DecisionEngine:
        del name, policy
        return self.engine


class _NoChats:
    def chat_for(self, ref: str | None) -> ChatEngine | None:
        del ref
        return None


def _policy() -> PolicySet:
    tasks = {
        f"fact{i}": ClassifyTask(name=f"fact{i}", questions={"q": Noul(instructions=f"Does the text state fact {i}?")})
        for i in range(CALLERS)
    }
    return PolicySet(tasks=tasks, version="bench")


def _router(stub: _Stub, *, coalesce: bool) -> Router:
    client = httpx2.AsyncClient(transport=httpx2.MockTransport(stub))
    jev = JevEngine(JevSettings(base_url="http://jev.stub", profile="jev", max_retries=0), http_client=client)
    engine: DecisionEngine = CoalescingEngine(jev, CoalesceSettings()) if coalesce else jev
    policy = _policy()
    return Router(lambda: policy, _Engines(engine), _NoChats())


async def _timed(router: Router, task: str) -> float:
    started = time.perf_counter()
    decisions = await router.classify(task, STATE)
    assert decisions["q"].outcome == "no", decisions
    return (time.perf_counter() - started) * 1000.0


async def _burst(router: Router, stub: _Stub) -> tuple[int, list[float]]:
    gc.collect()  # a full collection inside one side's burst would be noise, not a difference
    before = stub.requests
    latencies = await asyncio.gather(*(_timed(router, f"fact{i}") for i in range(CALLERS)))
    return stub.requests - before, list(latencies)


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(rounds: int, lone: int, delay_s: float) -> dict[str, Any]:
    stubs = {mode: _Stub(delay_s) for mode in ("coalesced", "bare")}
    routers = {mode: _router(stubs[mode], coalesce=mode == "coalesced") for mode in stubs}
    for mode in routers:  # warm-up: clients, JSON paths, first-call costs
        await _burst(routers[mode], stubs[mode])
        await _timed(routers[mode], "fact0")
    requests: dict[str, list[int]] = {m: [] for m in routers}
    burst_p50: dict[str, list[float]] = {m: [] for m in routers}
    burst_p99: dict[str, list[float]] = {m: [] for m in routers}
    lone_p50: dict[str, list[float]] = {m: [] for m in routers}
    for r in range(rounds):
        order = ["coalesced", "bare"] if r % 2 == 0 else ["bare", "coalesced"]
        for mode in order:
            sent, latencies = await _burst(routers[mode], stubs[mode])
            requests[mode].append(sent)
            burst_p50[mode].append(statistics.median(latencies))
            burst_p99[mode].append(_p(latencies, 0.99))
        for mode in order:
            alone = [await _timed(routers[mode], f"fact{i % CALLERS}") for i in range(lone)]
            lone_p50[mode].append(statistics.median(alone))
    med = statistics.median
    return {
        "callers": CALLERS,
        "service_delay_ms": delay_s * 1000.0,
        "rounds": rounds,
        "engine_requests": {m: int(med(v)) for m, v in requests.items()},
        "engine_requests_max": {m: max(v) for m, v in requests.items()},
        "burst_p50_ms": {m: round(med(v), 3) for m, v in burst_p50.items()},
        "burst_p99_ms": {m: round(med(v), 3) for m, v in burst_p99.items()},
        "burst_ratio_vs_bare": round(med(burst_p50["coalesced"]) / med(burst_p50["bare"]), 3),
        "lone_p50_ms": {m: round(med(v), 3) for m, v in lone_p50.items()},
        "lone_ratio_vs_bare": round(med(lone_p50["coalesced"]) / med(lone_p50["bare"]), 3),
    }


def _markdown(result: dict[str, Any]) -> str:
    req, b50, b99, l50 = (result[k] for k in ("engine_requests", "burst_p50_ms", "burst_p99_ms", "lone_p50_ms"))
    return "\n".join(
        [
            "## Coalescing many callers into few engine calls (`bench/coalesce.py`)",
            "",
            f"{result['callers']} concurrent `Router.classify` calls, one question each, about one state; Jev stub "
            f"behind `httpx2.MockTransport` with a {result['service_delay_ms']:g} ms service delay; "
            f"{result['rounds']} interleaved rounds, medians.",
            "",
            "| | coalesced | bare | ratio |",
            "|---|---|---|---|",
            f"| engine requests per burst (max) | {req['coalesced']} ({result['engine_requests_max']['coalesced']}) "
            f"| {req['bare']} ({result['engine_requests_max']['bare']}) | |",
            f"| burst latency p50 ms | {b50['coalesced']} | {b50['bare']} | {result['burst_ratio_vs_bare']} |",
            f"| burst latency p99 ms | {b99['coalesced']} | {b99['bare']} | |",
            f"| lone call p50 ms | {l50['coalesced']} | {l50['bare']} | {result['lone_ratio_vs_bare']} |",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a few rounds, well under a minute")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="the stub's service delay")
    args = parser.parse_args()
    rounds, lone = (6, 40) if args.quick else (30, 100)
    result = asyncio.run(_run(rounds, lone, args.delay_ms / 1000.0))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "coalesce.md").write_text(_markdown(result))
    print(_markdown(result))  # noqa: T201 - a benchmark's report
    print(json.dumps(result))  # noqa: T201


if __name__ == "__main__":
    main()
