"""``fastslow report shadow``: what System 1 would have done for a task the incumbent still decides.

A task in shadow mode (``mode: shadow``) logs one decision per question whose outcome is the
incumbent's (System 2, or the graph's own router through a node's ``incumbent`` callback) and whose
distribution is System 1's. This reads them back and says:

* **agreement**: how often System 1's top answer (a check's verdict under its bands) was the
  incumbent's;
* **kept**: the share the task's current thresholds (or bands) would have let System 1 settle, and
  the accuracy of those against the incumbent, with a Wilson interval;
* **savings**: the kept share times what the incumbent's calls cost, from the logged System-2
  costs (``cost_usd``), or nothing when they record none (a callback incumbent costs what it costs).

Going live is one YAML change: remove ``mode: shadow`` (or set ``mode: live``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from fastslow.router import CheckTask, Settings

from ._bounds import wilson_lower, wilson_upper
from ._collect import load_task
from ._log import ShadowLog
from ._select import kept_answer

__all__ = ["Shadow", "shadow_report"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Shadow:
    """What ``shadow_report`` found: lines for people and the figures behind them."""

    task: str
    lines: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)


def _check_verdict(p: float, allow_at: float, deny_at: float) -> str:
    return "deny" if p >= deny_at else ("allow" if p <= allow_at else "review")


async def shadow_report(
    open_log: Callable[[], Awaitable[ShadowLog]],
    *,
    settings: Settings,
    policy: Path,
    task: str,
    tenant: str | None = None,
    since: datetime | None = None,
) -> Shadow:
    """Agreement, what would have been kept at what accuracy, and savings (module docstring).

    ``open_log`` opens the decision log (``DecisionStore.open`` with its URL) once the task is
    known to be in ``policy``; only ``tenant``'s decisions count when given, and only those made
    at or after ``since``.

    Raises:
        ConfigError: an unknown task.
    """
    policy_set = load_task(policy, task, settings)
    the_task = policy_set.tasks[task]
    store = await open_log()
    try:
        logged = await store.decisions(task=task, tenant=tenant, since=since, reason="shadow")
    finally:
        await store.aclose()
    lines = [f"task {task}: {len(logged)} shadow decisions" + ("" if the_task.mode == "shadow" else " (now live)")]
    judged = [d for d in logged if d.outcome is not None and d.probabilities]
    if not judged:
        lines.append(
            "nothing to compare yet: no shadow decision the incumbent settled with System 1's answer beside it"
        )
        return Shadow(task=task, lines=lines, figures={"decisions": len(logged)})
    agree = kept = kept_right = 0
    costs = [d.cost_usd for d in judged if d.cost_usd is not None]
    for d in judged:
        if isinstance(the_task, CheckTask) and d.question in the_task.rules:
            action = the_task.rules[d.question].action
            mine: str | None = _check_verdict(
                d.probabilities.get(action.violation, 0.0), action.allow_at, action.deny_at
            )
            settled = mine != "review"
        else:
            thresholds = the_task.thresholds
            mine = kept_answer(
                d.probabilities,
                thresholds.min_confidence,
                thresholds.min_margin,
                getattr(the_task, "none_option", None),
            )
            settled = mine is not None
            mine = mine or max(d.probabilities, key=lambda o: d.probabilities[o])
        agree += mine == d.outcome
        if settled:
            kept += 1
            kept_right += mine == d.outcome
    n = len(judged)
    figures: dict[str, Any] = {"decisions": len(logged), "judged": n, "agreement": agree / n, "kept": kept / n}
    lines.append(f"System 1 agreed with the incumbent on {agree / n:.1%} of {n} decisions")
    if kept:
        accuracy = kept_right / kept
        low, high = wilson_lower(kept_right, kept, 0.975), wilson_upper(kept_right, kept, 0.975)
        figures["kept_accuracy"] = {"value": accuracy, "low": low, "high": high}
        lines.append(
            f"the current thresholds would have kept {kept / n:.1%} ({kept}) at {accuracy:.1%} agreement with the "
            f"incumbent (95 % interval {low:.1%}-{high:.1%})"
        )
    else:
        lines.append("the current thresholds would have kept none of them")
    if costs:
        per_call = sum(costs) / len(costs)
        figures["saved_per_1000_usd"] = 1000 * (kept / n) * per_call
        lines.append(
            f"estimated savings: ${1000 * (kept / n) * per_call:,.4f} per 1,000 decisions (mean logged incumbent "
            f"call ${per_call:,.6f}, {len(costs)} calls with a cost)"
        )
    else:
        lines.append(
            "estimated savings: the incumbent's calls record no cost (set system2.prices, or it is a callback)"
        )
    lines.append("go live: remove mode: shadow from the task (one YAML change; the service reloads it)")
    return Shadow(task=task, lines=lines, figures=figures)
