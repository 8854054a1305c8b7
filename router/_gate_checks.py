"""A policy gate's checks of proposed tool calls, shared by ``policy_gate_node`` and the
``create_agent`` gate middleware (``fastslow.graphs.middleware``).

Inside a graph run each check is a LangGraph task (``langgraph.func.task``), so its verdict is
checkpointed with the node's (or hook's) pending writes. LangGraph runs a paused node again from
the top on resume; the resumed run then gets back the verdict a person reviewed instead of a new
check: no second engine call, System-2 call or recorded decision, and no verdict that may differ
from the one approved. Outside a graph (a node called directly) a check is a plain call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from langgraph._internal._constants import CONFIG_KEY_CALL
from langgraph.config import get_config
from langgraph.func import task as lg_task

from ._chat import ToolCall
from ._router import CheckResult, Router

__all__ = ["Checked", "GateChecks", "refusal"]

Checked = dict[str, Any]
"""What a gate keeps of a check: plain data (task, verdict, rule, confidence, system2,
policy_version), since LangGraph checkpoints it."""


def _checked(result: CheckResult) -> Checked:
    return {
        "task": result.task,
        "verdict": result.verdict,
        "rule": result.rule,
        "confidence": result.decisions[result.rule].confidence,
        "system2": result.system2,
        "policy_version": result.policy_version,
    }


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    return ToolCall(id=call["id"] or "", name=call["name"], args=call["args"])


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
    """Check task ``task`` on tool calls (``{"id", "name", "args"}`` mappings), once per call across a pause."""

    def __init__(self, router: Router, task: str) -> None:
        async def policy_check(call: Mapping[str, Any], context: Sequence[BaseMessage]) -> Checked:
            return _checked(await router.check(task, _tool_call(call), context=context))

        def policy_check_sync(call: Mapping[str, Any], context: Sequence[BaseMessage]) -> Checked:
            return _checked(router.check_sync(task, _tool_call(call), context=context))

        self._check = policy_check
        self._check_sync = policy_check_sync
        # Tasks are named after the functions; a task's checkpoint id also holds its node's (or
        # hook's), so two gates in one graph don't mix.
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
