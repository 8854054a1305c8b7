"""Section 6 of ``bench/quality.py``: decision latency through the in-process ``Router``."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable
from typing import Any

import yaml
from _quality_checks import benign_texts
from _quality_core import Context, _cached, _slug
from _quality_crossfit import _check_task, injection_spec
from _quality_routes import _clinc_examples, _route_task

from fastslow.api import build_runtime
from fastslow.policies.evaluation import percentiles
from fastslow.router import Router

from _data import log

# -- 6. Latency ----------------------------------------------------------------------------------------


def _long_state(ctx: Context, chars: int) -> str:
    texts = [t for ts in benign_texts(ctx).values() for t in ts]
    rng = ctx.rng("long-state")
    parts: list[str] = []
    while sum(len(p) + 1 for p in parts) < chars:
        parts.append(rng.choice(texts))
    return " ".join(" ".join(parts).split())[:chars]


SHORT_STATE = "Can you freeze my debit card? I think I left it at the bar."
"""About 60 characters."""


async def _timed(call: Callable[[], Any], calls: int, budget_s: float) -> list[float]:
    """Milliseconds of each of up to ``calls`` sequential calls, stopping once ``budget_s`` is spent."""
    out: list[float] = []
    started = time.perf_counter()
    for _ in range(calls):
        t0 = time.perf_counter()
        await call()
        out.append((time.perf_counter() - t0) * 1000.0)
        if time.perf_counter() - started > budget_s:
            break
    return out


def _latency_policy(ctx: Context) -> dict[str, Any]:
    template, examples = _clinc_examples(ctx)
    spec = _cached(ctx, "injection_spec", injection_spec)
    return {"tasks": {"route": _route_task(template, examples), "check": _check_task(spec, spec.items)}}


async def latency(ctx: Context, embedder: str) -> dict[str, Any]:
    """Section 6: decisions through the in-process Router, one at a time, after a warm-up."""
    folder = ctx.runs.work / "runs" / _slug("latency", embedder)
    folder.mkdir(parents=True, exist_ok=True)
    policy = folder / "policy.yaml"
    policy.write_text(yaml.safe_dump(_latency_policy(ctx), sort_keys=False, allow_unicode=True, width=200))
    settings = ctx.runs.settings(embedder).model_copy(update={"policy_file": policy})
    runtime = await asyncio.to_thread(build_runtime, settings)  # trains the policy's heads
    states = {"short": SHORT_STATE, "long": _long_state(ctx, ctx.plan.long_chars)}
    load = os.getloadavg()
    try:
        cells = [
            await _measure_cell(ctx, runtime.router, task, state, text)
            for task in ("route", "check")
            for state, text in states.items()
        ]
    finally:
        await runtime.aclose()
    for c in cells:
        log(f"latency {embedder} {c['task']} {c['state']}: p50 {c['p50_ms']:.1f} ms ({c['calls']} calls)")
    return {"embedder": embedder, "load_before": list(load), "load_after": list(os.getloadavg()), "cells": cells}


async def _measure_cell(ctx: Context, router: Router, task: str, state: str, text: str) -> dict[str, Any]:
    """One (task, state) cell: a warm-up, then the plan's calls (a long state's within its time budget)."""
    from langchain_core.messages import HumanMessage

    def call() -> Any:
        if task == "route":
            return router.route("route", [HumanMessage(text)])
        return router.check("check", text)

    short = state == "short"
    await _timed(call, 3 if short else 1, math.inf)
    calls = ctx.plan.latency_short if short else ctx.plan.latency_long
    times = await _timed(call, calls, math.inf if short else ctx.plan.long_budget_s)
    return _latency_cell(task, state, len(text), times)


def _latency_cell(task: str, state: str, chars: int, times: list[float]) -> dict[str, Any]:
    p = percentiles(times, (50, 99))
    cell: dict[str, Any] = {"task": task, "state": state, "chars": chars, "calls": len(times)}
    cell.update(p50_ms=p[50.0], p99_ms=p[99.0], max_ms=max(times))
    if state == "short":
        cell["target"] = "p50 < 30 ms"
        cell["met"] = p[50.0] < 30.0
    return cell
