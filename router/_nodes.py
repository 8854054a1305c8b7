"""LangGraph nodes: the router, the policy gate in front of a ``ToolNode``, and classify; the router edge.

Each factory returns a runnable that works under ``invoke`` and ``ainvoke``: under ``invoke`` the
router's sync methods (``route_sync``, ...) decide in the calling thread wherever the engine and
the sink can (and run the rest on a private event loop thread); anything that needs LangGraph's
run context (``interrupt``) stays in the calling thread either way.

They are bare ``Runnable`` subclasses, which LangGraph runs as they are: a plain function would be
wrapped in a ``RunnableCallable`` with one path only (an async function has no sync path, a sync
one runs in an executor under ``ainvoke``), and a ``RunnableLambda`` inspects the function's
signature and opens a callback run on every call. The node's own run (LangGraph's, named after the
node) is still traced.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Generic, TypeAlias, TypeVar

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig

# The key under which LangGraph hands a running node its task-call hook; only read, to tell a node's
# run from a bare call of the runnable, where a task cannot be called.
from langgraph.types import Command, Send, interrupt

from ._decisions import Decision
from ._errors import ConfigError
from ._gate_checks import GateChecks, refusal
from ._router import Incumbent, Router

__all__ = ["classify_node", "decision_record", "policy_gate_node", "route_edge", "router_node"]

T = TypeVar("T")
R = TypeVar("R")


def decision_record(decision: Decision) -> dict[str, Any]:
    """A decision as plain JSON-able data, fit for graph state and checkpoints."""
    # Field by field, not dataclasses.asdict: that deep-copies every value, on every routing step.
    # Every field is a scalar but the distribution, which is copied to a plain dict once.
    return {
        "task": decision.task,
        "question": decision.question,
        "outcome": decision.outcome,
        "system": decision.system,
        "reason": decision.reason,
        "escalate": decision.escalate,
        "confidence": decision.confidence,
        "threshold": decision.threshold,
        "probabilities": dict(decision.probabilities),
        "verdict": decision.verdict,
        "policy_version": decision.policy_version,
        "engine": decision.engine,
        "model": decision.model,
        "latency_ms": decision.latency_ms,
        "detail": decision.detail,
        "cost_usd": decision.cost_usd,
        "id": decision.id,
        "audit": decision.audit,
        "audit_rate": decision.audit_rate,
        "examples_version": decision.examples_version,
    }


class _Dual(Runnable[Any, Any], Generic[R]):
    """A runnable whose async path awaits ``afunc`` and whose sync path calls ``func``.

    ``finish`` runs in the caller's thread and task either way, so it may call ``interrupt()``.
    """

    def __init__(
        self,
        afunc: Callable[[Any], Coroutine[Any, Any, R]],
        func: Callable[[Any], R],
        finish: Callable[[Any, R], Any],
        name: str,
    ):
        self.name = name
        self._afunc = afunc
        self._func = func
        self._finish = finish

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        del config, kwargs
        return self._finish(input, self._func(input))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        del config, kwargs
        return self._finish(input, await self._afunc(input))


def _get(state: Any, key: str, default: Any = None) -> Any:
    if isinstance(state, Mapping):
        return state.get(key, default)
    return getattr(state, key, default)


GraphIncumbent: TypeAlias = Callable[[Any, str], Awaitable[str | None]]
"""An existing router, for shadow mode: (graph state, question name) -> its answer."""


def _bind(incumbent: GraphIncumbent | None, state: Any) -> Incumbent | None:
    if incumbent is None:
        return None

    async def ask(name: str) -> str | None:
        return await incumbent(state, name)

    return ask


def _deciders(
    router: Router, task: str, messages_key: str, route_key: str, incumbent: GraphIncumbent | None
) -> tuple[Callable[[Any], Coroutine[Any, Any, Decision]], Callable[[Any], Decision]]:
    async def decide(state: Any) -> Decision:
        messages: Sequence[BaseMessage] = _get(state, messages_key, [])
        return await router.route(task, messages, previous=_get(state, route_key), incumbent=_bind(incumbent, state))

    def decide_sync(state: Any) -> Decision:
        messages: Sequence[BaseMessage] = _get(state, messages_key, [])
        return router.route_sync(task, messages, previous=_get(state, route_key), incumbent=_bind(incumbent, state))

    return decide, decide_sync


def router_node(
    router: Router,
    task: str,
    *,
    routes: Mapping[str, str] | None = None,
    escalate_to: str = "frontier",
    messages_key: str = "messages",
    route_key: str = "route",
    decision_key: str = "decision",
    incumbent: GraphIncumbent | None = None,
) -> Runnable[Any, Any]:
    """Route the latest user turn: returns ``Command(goto=<node>)`` and writes the decision to state.

    Args:
        routes: route name -> node name, when they differ.
        escalate_to: the node that takes decisions nobody could settle (open-ended requests, or
            low confidence with no System 2 answer), typically a frontier agent.
        incumbent: for a task in shadow mode, the router the graph used before: called with the
            graph state and the task name, it returns the route, and the graph goes where it says
            while System 1's answer is only logged. Without it, System 2 decides in shadow mode.
    """
    mapping = dict(routes or {})

    def finish(state: Any, decision: Decision) -> Command[Any]:
        del state
        goto = escalate_to if decision.outcome is None else mapping.get(decision.outcome, decision.outcome)
        return Command(goto=goto, update={route_key: decision.outcome, decision_key: decision_record(decision)})

    return _Dual(*_deciders(router, task, messages_key, route_key, incumbent), finish, f"router:{task}")


def route_edge(
    router: Router,
    task: str,
    *,
    routes: Mapping[str, str] | None = None,
    escalate_to: str = "frontier",
    messages_key: str = "messages",
    route_key: str = "route",
    decision_key: str = "decision",
    incumbent: GraphIncumbent | None = None,
    send: bool = False,
) -> Runnable[Any, Any]:
    """The routing decision as a conditional edge, without a node step of its own.

    ``graph.add_conditional_edges(source, route_edge(router, task), path_map)``: it returns the node
    to go to (``routes`` mapped, ``escalate_to`` when nobody could settle it), so ``path_map`` lists
    those nodes. The decision is the same as ``router_node``'s (escalation, shadow mode, stickiness
    on the previous route read from ``route_key``) and goes to the router's decision log.

    An edge cannot write state. By default the decision reaches only the decision log, and
    stickiness holds only where a node writes the route to ``route_key`` (the agent that takes the
    conversation, say). With ``send=True`` the edge returns
    ``Send(<node>, {**state, route_key: <route>, decision_key: <record>})`` instead: that node gets
    the decision in its input and can write it to state; the graph state must then be a mapping.
    Other arguments are as ``router_node``'s.
    """
    mapping = dict(routes or {})

    def finish(state: Any, decision: Decision) -> str | Send:
        goto = escalate_to if decision.outcome is None else mapping.get(decision.outcome, decision.outcome)
        if not send:
            return goto
        if not isinstance(state, Mapping):
            raise ConfigError(f"route_edge(send=True) needs a mapping graph state, not {type(state).__name__}")
        return Send(goto, {**state, route_key: decision.outcome, decision_key: decision_record(decision)})

    return _Dual(*_deciders(router, task, messages_key, route_key, incumbent), finish, f"route:{task}")


def _pending_calls(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    last = messages[-1] if messages else None
    if not isinstance(last, AIMessage):
        return []
    return [dict(call) for call in last.tool_calls]


def policy_gate_node(
    router: Router,
    task: str,
    *,
    tools: str = "tools",
    agent: str = "agent",
    messages_key: str = "messages",
    decisions_key: str = "gate",
) -> Runnable[Any, Any]:
    """Check each pending tool call of the last AI message before it runs.

    Deny answers the call with a refusal ``ToolMessage`` (so no tool call is left orphaned), review
    pauses with ``interrupt()`` for a person (resume with ``"allow"`` or ``"deny"``), allow passes the
    call to the ``tools`` node through ``Send``. The graph needs a checkpointer for review.

    Each check runs as a LangGraph task (``langgraph.func.task``), so its verdict is checkpointed
    with the node's pending writes: LangGraph runs the node again from the top on resume, and the
    resumed node gets the verdict the person reviewed, not a new check (no second engine call,
    System-2 call or recorded decision, and no verdict that may differ from the one approved).
    """

    def pending(state: Any) -> tuple[list[dict[str, Any]], list[BaseMessage]]:
        messages: Sequence[AnyMessage] = _get(state, messages_key, [])
        return _pending_calls(messages), [m for m in messages[:-1] if not isinstance(m, ToolMessage)]

    checks = GateChecks(router, task)

    async def evaluate(state: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        calls, context = pending(state)
        return list(zip(calls, await checks.check_all(calls, context), strict=True))

    def evaluate_sync(state: Any) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        # One call after another: a model rarely proposes more than one or two calls at once.
        calls, context = pending(state)
        return [(c, checks.check_sync(c, context)) for c in calls]

    def finish(state: Any, checked: list[tuple[dict[str, Any], dict[str, Any]]]) -> Command[Any]:
        refusals: list[ToolMessage] = []
        allowed: list[dict[str, Any]] = []
        records: list[dict[str, Any]] = []
        for call, result in checked:
            verdict = result["verdict"]
            how = "System 2" if result["system2"] else "System 1"
            if verdict == "review":
                answer = interrupt(
                    {
                        "task": result["task"],
                        "tool_call": {"id": call["id"], "name": call["name"], "args": call["args"]},
                        "rule": result["rule"],
                        "probability": result["confidence"],
                        "resume_with": ["allow", "deny"],
                    }
                )
                verdict = "allow" if _approved(answer) else "deny"
                how = "a person"
            records.append({"tool_call_id": call["id"], "verdict": verdict, "rule": result["rule"], "by": how})
            if verdict == "allow":
                allowed.append(call)
            else:
                refusals.append(refusal(call, result, f"decided by {how}"))
        update: dict[str, Any] = {decisions_key: records}
        if refusals:
            update[messages_key] = refusals
        if not allowed:
            return Command(goto=agent, update=update)
        sends = [
            Send(tools, {"__type": "tool_call_with_context", "tool_call": call, "state": state}) for call in allowed
        ]
        return Command(goto=sends, update=update)

    return _Dual(evaluate, evaluate_sync, finish, f"policy_gate:{task}")


def _approved(answer: Any) -> bool:
    if isinstance(answer, str):
        return answer.strip().lower() in ("allow", "approve", "approved", "yes")
    if isinstance(answer, Mapping):
        return _approved(answer.get("decision", answer.get("verdict", "")))
    return answer is True


def classify_node(
    router: Router,
    task: str,
    *,
    messages_key: str = "messages",
    output_key: str = "classification",
    decisions_key: str = "classification_decisions",
    incumbent: GraphIncumbent | None = None,
) -> Runnable[Any, Any]:
    """Answer a classification task about the latest user turn and write ``{question: answer}`` to state.

    ``incumbent``: as ``router_node``'s, called with the graph state and each question's name.
    """

    def text(state: Any) -> str:
        messages: Sequence[BaseMessage] = _get(state, messages_key, [])
        human = [m for m in messages if m.type == "human"]
        return human[-1].text if human else json.dumps(_get(state, "input", ""))

    async def classify(state: Any) -> dict[str, Decision]:
        return await router.classify(task, text(state), incumbent=_bind(incumbent, state))

    def classify_sync(state: Any) -> dict[str, Decision]:
        return router.classify_sync(task, text(state), incumbent=_bind(incumbent, state))

    def finish(state: Any, decided: dict[str, Decision]) -> dict[str, Any]:
        del state
        return {
            output_key: {name: d.outcome for name, d in decided.items()},
            decisions_key: {name: decision_record(d) for name, d in decided.items()},
        }

    return _Dual(classify, classify_sync, finish, f"classify:{task}")
