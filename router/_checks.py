"""Helpers for policy checks: the state System 1 reads, its size, shadow verdicts and the combined verdict."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from langchain_core.messages import BaseMessage

from ._chat import ToolCall
from ._decisions import Decision, Verdict
from ._errors import InvalidRequest
from ._questions import State
from ._tasks import CheckTask

__all__ = ["check_state", "combine", "read_size", "shadow_verdict"]


def shadow_verdict(decision: Decision, violation: str, from_incumbent: bool) -> Decision:
    """A shadow check's verdict: the incumbent's own, System 2's option as a verdict; nobody's denies."""
    if decision.outcome is None:
        return replace(decision, outcome="deny", verdict="deny", escalate=False)
    if from_incumbent:
        verdict = cast(Verdict, decision.outcome) if decision.outcome in ("allow", "review", "deny") else "deny"
    else:
        verdict = "deny" if decision.outcome == violation else "allow"
    return replace(decision, outcome=verdict, verdict=verdict)


def check_state(item: str | ToolCall | Mapping[str, Any], context: Sequence[BaseMessage], task: CheckTask) -> State:
    """The System-1 state for a check: the item, plus the last few turns when there is context.

    A tool call (a ``ToolCall``, or a mapping of just ``tool``/``name`` and ``arguments``/``args``)
    becomes one compact line, the form policy examples are written in: ``shell: rm -rf /srv/data``
    when it has one string argument, else ``send_email: to=a@example.com, subject="weekly report"``.
    Live calls then look like the examples the embedded engine was trained on.
    """

    def line(name: str, args: Mapping[str, Any]) -> str:
        if len(args) == 1 and isinstance(value := next(iter(args.values())), str):
            return f"{name}: {value}"

        def show(k: str, v: Any) -> str:
            plain = isinstance(v, str) and v and not any(c in v for c in ' ,="\n')
            if plain:
                return str(v)
            # The API bounds arguments' depth (limits.max_depth, at most 512) well inside what the
            # C encoder takes; a library caller's deeper or cyclic value is refused, not a crash.
            try:
                return json.dumps(v, ensure_ascii=False, default=str)
            except (RecursionError, ValueError) as exc:
                raise InvalidRequest(f"arguments.{k}", f"cannot be encoded as JSON: {exc}") from None

        return (f"{name}: " + ", ".join(f"{k}={show(k, v)}" for k, v in args.items())) if args else name

    body: State
    if isinstance(item, ToolCall):
        body = line(item.name, item.args)
    elif isinstance(item, Mapping):
        name = item.get("tool", item.get("name"))
        args = item.get("arguments", item.get("args", {}))
        tool_shaped = len(item) <= 2 and set(item) <= {"tool", "name", "arguments", "args"}
        if tool_shaped and isinstance(name, str) and isinstance(args, Mapping):
            body = line(name, args)
        else:
            body = dict(item)
    else:
        body = item
    if task.kind == "check" and context:
        earlier = [m.text for m in context if m.text][-4:]
        return {"item": body, "conversation": earlier}
    return body


def read_size(state: State) -> int:
    """The length of the state's text as engines read it: JSON compactly, whitespace runs as one space."""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return len(" ".join(text.split()))


def combine(decisions: Mapping[str, Decision]) -> tuple[Verdict, str]:
    """Deny beats review beats allow; the deciding rule is the most certain violator of the worst verdict."""
    rank = {"deny": 2, "review": 1, "allow": 0}
    worst = max(decisions.items(), key=lambda kv: (rank[kv[1].verdict or "deny"], kv[1].confidence))
    return worst[1].verdict or "deny", worst[0]
