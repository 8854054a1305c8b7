"""Helpers for policy checks: the state System 1 reads, its size, shadow verdicts and the combined verdict."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeAlias, cast

from langchain_core.messages import BaseMessage

from ._answers import Answer, NoAnswer
from ._chat import ToolCall
from ._decisions import Decision, EngineFailure, Verdict
from ._errors import InvalidRequest
from ._questions import State
from ._sanitize import strip_thoughts

__all__ = ["check_state", "combine", "context_state", "more_suspicious", "read_size", "shadow_verdict", "unread"]

CONTEXT_TURNS = 4
"""The caller's most recent turns System 1 reads with the item when a check task has ``system1_context``."""

Read: TypeAlias = Answer | NoAnswer | EngineFailure


def shadow_verdict(decision: Decision, violation: str, from_incumbent: bool) -> Decision:
    """A shadow check's verdict: the incumbent's own, System 2's option as a verdict; nobody's denies."""
    if decision.outcome is None:
        return replace(decision, outcome="deny", verdict="deny", escalate=False)
    if from_incumbent:
        verdict = cast(Verdict, decision.outcome) if decision.outcome in ("allow", "review", "deny") else "deny"
    else:
        verdict = "deny" if decision.outcome == violation else "allow"
    return replace(decision, outcome=verdict, verdict=verdict)


def check_state(item: str | ToolCall | Mapping[str, Any]) -> State:
    """The System-1 state for a check: the item alone (``context_state`` adds the conversation).

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
    return body


def context_state(body: State, context: Sequence[BaseMessage]) -> State | None:
    """The item with the caller's last few turns, for the second read; ``None`` without any text turn."""
    earlier = [text for m in context if (text := strip_thoughts(m.text))][-CONTEXT_TURNS:]
    return {"item": body, "conversation": earlier} if earlier else None


def more_suspicious(
    alone: Mapping[str, Read], together: Mapping[str, Read], violations: Mapping[str, str]
) -> dict[str, Read]:
    """Per rule, the read that puts more probability on the violation; a read that failed wins.

    The item alone is what the rule was trained on; the read with context may only add suspicion,
    so a conversation can never talk a check out of a violation it sees in the item. A read with no
    answer is the more suspicious one too: the rule then escalates or fails closed.
    """

    def suspicion(name: str, read: Read) -> float:
        if not isinstance(read, Answer):
            return 2.0 if isinstance(read, EngineFailure) else 1.5
        return read.probabilities.get(violations[name], 0.0)

    out: dict[str, Read] = {}
    for name, first in alone.items():
        second = together.get(name, first)
        out[name] = second if suspicion(name, second) > suspicion(name, first) else first
    return out


def read_size(state: State) -> int:
    """The length of the state's text as engines read it: JSON compactly, whitespace runs as one space."""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return len(" ".join(text.split()))


def unread(answer: Read, state_size: Callable[[], int], read_limit: int | None) -> str | None:
    """Why System 1 read only part of a state (``None`` when it read all of it).

    ``state_size`` gives the state's ``read_size`` (asked only when needed: it walks the whole
    state); ``read_limit`` is the engine's ``max_read_chars``. An engine that prices what it reads
    in tokens says so itself (``Signals.read_all``).
    """
    partial = isinstance(answer, Answer) and answer.signals.read_all is False
    if read_limit is None and not partial:
        return None
    size = state_size()
    if read_limit is not None and size > read_limit:
        return f"the state has {size} characters; System 1 reads at most {read_limit}"
    if partial:
        return f"the state ({size} characters) holds more tokens than System 1 reads for a check"
    return None


def combine(decisions: Mapping[str, Decision]) -> tuple[Verdict, str]:
    """Deny beats review beats allow; the deciding rule is the most certain violator of the worst verdict."""
    rank = {"deny": 2, "review": 1, "allow": 0}
    worst = max(decisions.items(), key=lambda kv: (rank[kv[1].verdict or "deny"], kv[1].confidence))
    return worst[1].verdict or "deny", worst[0]
