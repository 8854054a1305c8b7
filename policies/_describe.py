"""A policy's tasks as plain data, for people and clients: ``fastslow policy check`` and ``GET /v1/tasks``.

One description, so the command line and the API never disagree on what a task is held to: its
kind, engine, System-2 model, options, thresholds (a check: each rule's bands), calibration and the
``fitted:`` records of what ``fastslow calibrate`` and ``tune`` measured.
"""

from __future__ import annotations

from typing import Any

from fastslow.router import CheckTask, ClassifyTask, PolicySet, Task

__all__ = ["describe_policy", "describe_task"]


def describe_task(task: Task, *, default_engine: str, default_escalate_to: str | None = None) -> dict[str, Any]:
    """``task`` as JSON-able data; ``default_engine`` and ``default_escalate_to`` fill in what it leaves unset."""
    out: dict[str, Any] = {
        "kind": task.kind,
        "engine": task.engine or default_engine,
        "escalate_to": task.escalate_to or default_escalate_to,
        "mode": task.mode,
        "on_failure": task.on_failure,
    }
    if isinstance(task, CheckTask):
        # A check's verdicts come from its rules' bands, not from the thresholds.
        out["rules"] = {
            name: {
                "options": list(rule.question.options),
                "violation": rule.action.violation,
                "deny_at": rule.action.deny_at,
                "allow_at": rule.action.allow_at,
                "examples": sum(len(texts) for texts in rule.examples.values()),
            }
            for name, rule in task.rules.items()
        }
    else:
        out["thresholds"] = {"min_confidence": task.thresholds.min_confidence, "min_margin": task.thresholds.min_margin}
        if isinstance(task, ClassifyTask):
            questions = task.questions.items()
            out["questions"] = {name: {"kind": q.kind, "options": list(q.options)} for name, q in questions}
        else:
            out["routes"] = list(task.question.options)
            out["none_of_these"] = task.none_option
    calibration: dict[str, Any] = {"temperature": task.calibration.temperature}
    if task.calibration.questions:
        calibration["questions"] = sorted(task.calibration.questions)
    out["calibration"] = calibration
    out["fitted"] = {kind: dict(record) for kind, record in task.fitted.items()}
    return out


def describe_policy(policy: PolicySet, *, default_engine: str) -> dict[str, dict[str, Any]]:
    """Every task of ``policy`` by name (``describe_task``), in the file's order."""
    return {
        name: describe_task(task, default_engine=default_engine, default_escalate_to=policy.default_escalate_to)
        for name, task in policy.tasks.items()
    }
