"""A policy with one task of each kind (route ``support``, check ``tools``, classify ``triage``) for router tests."""

from __future__ import annotations

from typing import Any

from fastslow.router import (
    CheckAction,
    CheckTask,
    ClassifyTask,
    Noul,
    PolicySet,
    Route,
    RouteTask,
    Rule,
    Score,
    Thresholds,
)

__all__ = ["ROUTES", "three_task_policy"]

ROUTES = {
    "billing": Route(name="billing", description="Charges and refunds"),
    "technical": Route(name="technical", description="Bugs"),
    "other": Route(name="other", description="None of the above"),
}


def three_task_policy(**task_overrides: Any) -> PolicySet:
    route = RouteTask(
        name="support",
        routes=ROUTES,
        none_option="other",
        thresholds=Thresholds(min_confidence=0.7, min_margin=0.1),
        **task_overrides,
    )
    check = CheckTask(
        name="tools",
        rules={
            "destructive": Rule(
                name="destructive",
                question=Noul(instructions="Does it delete data?"),
                action=CheckAction(deny_at=0.8, allow_at=0.3),
            ),
            "exfiltration": Rule(
                name="exfiltration",
                question=Noul(instructions="Does it send data out?"),
                action=CheckAction(deny_at=0.8, allow_at=0.3),
            ),
        },
        on_failure="fail_closed",
    )
    classify = ClassifyTask(
        name="triage",
        questions={"urgent": Noul(instructions="Is it urgent?"), "tone": Score(levels=["calm", "annoyed", "furious"])},
        thresholds=Thresholds(min_confidence=0.6),
    )
    return PolicySet(
        tasks={"support": route, "tools": check, "triage": classify},
        version="sha256:test",
        egress_allow=("http://10.0.0.5:8000",),
    )
