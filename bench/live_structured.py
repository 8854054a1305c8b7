"""Measure a live Jev-shaped deployment (the DiffusionGemma structured server by default).

Sends decision requests through ``JevEngine`` in four mixes (one noul, one choice, one score, and
16 mixed questions per request), then prints p50/p99 latency and error counts per mix. The last
line of output is one JSON object with the totals, for scripts.

    python bench/live_structured.py --url http://gpu-box:8011
    python bench/live_structured.py --url http://127.0.0.1:PORT --quick      # e.g. against the test fake
    python bench/live_structured.py --url https://api.typesafe.ai --profile jev --api-key "$TYPESAFE_API_KEY"

This is an operator's tool, not a test: it talks to whatever ``--url`` names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, get_args

from pydantic import SecretStr

from fastslow.engines.jev import JevEngine
from fastslow.router import Choice, EngineError, Noul, Question, ReadOptions, Score
from fastslow.router.settings import JevProfileName, JevSettings

TICKETS = [
    "I was charged twice for my subscription this month. Please refund one of the charges.",
    "The app crashes every time I open the settings page on Android 15.",
    "How do I change the email address on my account?",
    "Your service has been down for two hours and we have a customer demo at noon!",
    "Can I get an invoice with our company VAT number on it?",
    "I forgot my password and the reset email never arrives.",
    "Please cancel my plan at the end of the billing period.",
    "The export to CSV drops every row after the first thousand.",
]

TEAM = Choice(
    criteria={"billing": "Charges, invoices, refunds", "technical": "Bugs and outages", "account": None, "other": None},
    instructions="Which team should handle this ticket?",
)
URGENCY = Score(levels=["Can wait", "This week", "Today", "Within the hour", "Now"], instructions="How urgent is it?")
REFUND = Noul(instructions="Does the customer ask for money back?")


def _mixed16() -> dict[str, Question]:
    questions: dict[str, Question] = {"team": TEAM, "urgency": URGENCY, "refund": REFUND}
    topics = [
        "a crash",
        "a login problem",
        "an invoice",
        "a cancellation",
        "data loss",
        "a deadline",
        "a refund",
        "a security concern",
        "an outage",
        "a feature request",
        "an export",
        "anger",
    ]
    for i, topic in enumerate(topics):
        questions[f"mentions_{i}"] = Noul(instructions=f"Does the ticket mention {topic}?")
    questions["sentiment"] = Score(levels=["calm", "annoyed", "furious"], instructions="How angry is the customer?")
    return questions


MIXES: dict[str, dict[str, Question]] = {
    "noul-1": {"refund": REFUND},
    "choice-1": {"team": TEAM},
    "score-1": {"urgency": URGENCY},
    "mixed-16": _mixed16(),
}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); ``None`` for no values."""
    if not values:
        return None
    ranked = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ranked)))
    return round(ranked[rank - 1], 2)


async def run(engine: JevEngine, *, per_mix: int, concurrency: int, options: ReadOptions) -> dict[str, dict[str, Any]]:
    """Send ``per_mix`` requests of every mix; return latencies and error kinds per mix."""
    gate = asyncio.Semaphore(concurrency)
    results: dict[str, dict[str, Any]] = {m: {"latencies_ms": [], "errors": Counter()} for m in MIXES}

    async def one(mix: str, i: int) -> None:
        state = {"ticket": TICKETS[i % len(TICKETS)], "request": i}
        async with gate:
            started = time.perf_counter()
            try:
                reply = await engine.decide(state, MIXES[mix], options=options)
            except EngineError as exc:
                results[mix]["errors"][type(exc).__name__] += 1
                return
            results[mix]["latencies_ms"].append((time.perf_counter() - started) * 1000.0)
            missing = sum(1 for a in reply.answers.values() if not hasattr(a, "probabilities"))
            if missing:
                results[mix]["errors"]["NoAnswer"] += missing

    await asyncio.gather(*(one(mix, i) for mix in MIXES for i in range(per_mix)))
    return results


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--url", required=True, help="server root, e.g. http://gpu-box:8011")
    parser.add_argument("--profile", default="structured", choices=get_args(JevProfileName))
    parser.add_argument("--quick", action="store_true", help="4 requests per mix instead of --requests")
    parser.add_argument("--requests", type=int, default=50, help="requests per mix (default 50)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=10.0, help="budget per decision, retries included")
    parser.add_argument("--api-key", default=os.environ.get("FASTSLOW_JEV__API_KEY"))
    parser.add_argument("--model", default=None)
    parser.add_argument("--samples", default=None, help="structured server: noise draws (1..32 or 'auto')")
    args = parser.parse_args(argv)

    per_mix = 4 if args.quick else args.requests
    samples: int | Literal["auto"] | None = None
    if args.samples is not None:
        samples = "auto" if args.samples == "auto" else int(args.samples)
    settings = JevSettings(
        base_url=args.url,
        profile=args.profile,
        api_key=SecretStr(args.api_key) if args.api_key else None,
        model=args.model,
        timeout_s=args.timeout,
    )
    options = ReadOptions(samples=samples, timeout_s=args.timeout)

    async def go() -> tuple[dict[str, dict[str, Any]], float]:
        engine = JevEngine(settings)
        started = time.perf_counter()
        try:
            return await run(engine, per_mix=per_mix, concurrency=args.concurrency, options=options), started
        finally:
            await engine.aclose()

    results, started = asyncio.run(go())
    wall_s = time.perf_counter() - started

    print(f"{'mix':<10} {'sent':>5} {'ok':>5} {'errors':>6} {'p50 ms':>8} {'p99 ms':>8}")
    all_latencies: list[float] = []
    errors: Counter[str] = Counter()
    summary_mixes: dict[str, Any] = {}
    for mix, result in results.items():
        latencies: list[float] = result["latencies_ms"]
        all_latencies += latencies
        errors.update(result["errors"])
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        n_errors = sum(result["errors"].values())
        print(f"{mix:<10} {per_mix:>5} {len(latencies):>5} {n_errors:>6} {_fmt(p50):>8} {_fmt(p99):>8}")
        summary_mixes[mix] = {"ok": len(latencies), "errors": dict(result["errors"]), "p50_ms": p50, "p99_ms": p99}
    if errors:
        print("errors: " + ", ".join(f"{kind} x{count}" for kind, count in errors.most_common()))
    summary = {
        "url": args.url,
        "profile": args.profile,
        "requests": per_mix * len(MIXES),
        "ok": len(all_latencies),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "p50_ms": percentile(all_latencies, 50),
        "p99_ms": percentile(all_latencies, 99),
        "wall_s": round(wall_s, 3),
        "mixes": summary_mixes,
    }
    print(json.dumps(summary))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
