"""A policy gate's checks of proposed tool calls, shared by ``policy_gate_node`` and the
``create_agent`` gate middleware (``fastslow.graphs.middleware``).

Inside a graph run each check is a LangGraph task (``langgraph.func.task``), so its verdict is
checkpointed with the node's (or hook's) pending writes. LangGraph runs a paused node again from
the top on resume; the resumed run then gets back the verdict a person reviewed instead of a new
check: no second engine call, System-2 call or recorded decision, and no verdict that may differ
from the one approved. Outside a graph (a node called directly) a check is a plain call.

A ``review`` verdict also opens a review in the review queue when the router's sink can
(``ReviewRecorder``, the decision log's sink) and the run has a thread to resume: inside the same
task, so the review is opened once however often the paused node runs again, and its id
(``review_id``) is checkpointed with the verdict.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, Literal

from langchain_core.messages import BaseMessage, ToolMessage
from langgraph._internal._constants import CONFIG_KEY_CALL
from langgraph.config import get_config
from langgraph.func import task as lg_task
from langsmith.run_trees import RunTree

from ._chat import ToolCall
from ._langsmith import annotate_run, check_annotations, current_node_run, posting_calls
from ._reviews import PendingReview, ReviewRecorder
from ._router import CheckResult, Router
from ._sync import LoopThread

__all__ = ["Checked", "GateChecks", "refusal"]

log = logging.getLogger("fastslow.router")

Checked = dict[str, Any]
"""What a gate keeps of a check: plain data (task, verdict, rule, confidence, system2,
policy_version, review_id; the deciding rule's decision_id, system and reason, and every rule's
decision_ids), since LangGraph checkpoints it."""


def _checked(result: CheckResult) -> Checked:
    deciding = result.decisions[result.rule]
    return {
        "task": result.task,
        "verdict": result.verdict,
        "rule": result.rule,
        "confidence": deciding.confidence,
        "system2": result.system2,
        "policy_version": result.policy_version,
        "review_id": None,
        # For LangSmith runs (``check_annotations``): which decisions the verdict came from.
        "decision_id": deciding.id,
        "system": deciding.system,
        "reason": deciding.reason,
        "decision_ids": {rule: decision.id for rule, decision in result.decisions.items()},
    }


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    return ToolCall(id=call["id"] or "", name=call["name"], args=call["args"])


def _pending_review(
    result: CheckResult, call: Mapping[str, Any], source: Literal["graph", "agent"], thread_id: str
) -> PendingReview:
    decision = result.decisions[result.rule]
    return PendingReview(
        decision_id=decision.id,
        task=result.task,
        rule=result.rule,
        subject={"tool_call": {"name": call["name"], "args": call["args"]}},
        probabilities={name: d.confidence for name, d in result.decisions.items() if d.probabilities},
        # A rule System 1 could not answer (on_failure: review) has no probability: as uncertain as can be.
        probability=decision.confidence if decision.probabilities else 0.5,
        policy_version=result.policy_version,
        source=source,
        thread_id=thread_id,
        tool_call_id=call["id"] or None,
    )


def _review_target(router: Router, result: CheckResult) -> tuple[ReviewRecorder, str] | None:
    """Where to open ``result``'s review, and the thread it belongs to; ``None``: no review to open.

    Only a ``review`` verdict, only into a sink that keeps reviews, and only in a run with a thread:
    a graph without one cannot pause, so nobody could resume it.
    """
    sink = router.sink
    if result.verdict != "review" or not isinstance(sink, ReviewRecorder):
        return None
    try:
        thread = get_config().get("configurable", {}).get("thread_id")
    except RuntimeError:  # outside any runnable context
        return None
    return None if thread is None else (sink, str(thread))


def _in_graph() -> bool:
    """Whether this runs in a LangGraph run, where ``langgraph.func.task`` calls are checkpointed."""
    try:
        configurable = get_config().get("configurable", {})
    except RuntimeError:  # outside any runnable context
        return False
    return CONFIG_KEY_CALL in configurable


def refusal(call: Mapping[str, Any], checked: Mapping[str, Any], why: str) -> ToolMessage:
    """The error ``ToolMessage`` answering a refused call, so the model sees why (and no call is orphaned)."""
    content = (
        f"Refused by policy {checked['task']!r} (rule {checked['rule']!r}, p={checked['confidence']:.2f}, {why}). "
        "Do not retry this call; explain to the user or choose another action."
    )
    return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"], status="error")


class GateChecks:
    """Check task ``task`` on tool calls (``{"id", "name", "args"}`` mappings), once per call across a pause.

    ``source`` names the gate in the reviews it opens: ``graph`` for ``policy_gate_node``,
    ``agent`` for the ``create_agent`` middleware (they resume with different values).
    """

    def __init__(self, router: Router, task: str, *, source: Literal["graph", "agent"] = "graph") -> None:
        async def policy_check(call: Mapping[str, Any], context: Sequence[BaseMessage]) -> Checked:
            run = current_node_run()
            with posting_calls(run) if run is not None else nullcontext():
                result = await router.check(task, _tool_call(call), context=context)
            checked = _traced(run, task, call, _checked(result))
            target = _review_target(router, result)
            if target is not None:
                recorder, thread = target
                checked["review_id"] = await _opened(recorder, _pending_review(result, call, source, thread))
            return checked

        def policy_check_sync(call: Mapping[str, Any], context: Sequence[BaseMessage]) -> Checked:
            run = current_node_run()
            with posting_calls(run) if run is not None else nullcontext():
                result = router.check_sync(task, _tool_call(call), context=context)
            checked = _traced(run, task, call, _checked(result))
            target = _review_target(router, result)
            if target is not None:
                recorder, thread = target
                # On the loop a sync router's durable commits run on: the log's pool is bound there.
                pending = _pending_review(result, call, source, thread)
                checked["review_id"] = LoopThread.run(_opened(recorder, pending))
            return checked

        self._check = policy_check
        self._check_sync = policy_check_sync
        # A task's checkpoint id holds its name and its node's (or hook's) id, so two gates in one
        # graph don't mix. The sync and async checks share one name: a run paused under ``invoke``
        # and resumed under ``ainvoke`` (or the other way) finds the checks it made, and so neither
        # checks nor opens a review again.
        policy_check_sync.__name__ = policy_check.__name__  # what lg_task(name=...) does, typed
        self._task = lg_task(policy_check)
        self._task_sync = lg_task(policy_check_sync)

    async def check_all(self, calls: Sequence[Mapping[str, Any]], context: Sequence[BaseMessage]) -> list[Checked]:
        """Every call's check, concurrently."""
        # Tasks are made in call order, so a resumed run finds each check under the same id.
        asks: list[Awaitable[Checked]] = (
            [self._task(c, context) for c in calls] if _in_graph() else [self._check(c, context) for c in calls]
        )
        return list(await asyncio.gather(*asks))

    def check_sync(self, call: Mapping[str, Any], context: Sequence[BaseMessage]) -> Checked:
        """One call's check, for sync nodes and hooks (called in call order)."""
        if not _in_graph():
            return self._check_sync(call, context)
        return self._task_sync(call, context).result()


def _traced(run: RunTree | None, task: str, call: Mapping[str, Any], checked: Checked) -> Checked:
    """``checked``, put on ``run`` (the check's own, a LangGraph task's) when LangChain tracing is on."""
    if run is not None:
        annotate_run(run, *check_annotations(task, [(call, checked)]))
    return checked


async def _opened(recorder: ReviewRecorder, pending: PendingReview) -> str | None:
    """The id of the review opened for ``pending``; ``None`` when it could not be opened.

    The gate pauses either way: a person can still resume the thread through LangGraph, only
    the queue does not show it. So a failure is logged, not raised into the graph.
    """
    try:
        return await recorder.open_review(pending)
    except Exception:
        log.exception("opening the review of decision %s failed", pending.decision_id)
        return None
