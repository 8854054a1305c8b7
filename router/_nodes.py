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
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeAlias, TypeVar

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig

# The key under which LangGraph hands a running node its state reader; only read, for the graph's
# state keys (see _state_keys).
from langgraph._internal._constants import CONFIG_KEY_READ
from langgraph.graph import MessagesState
from langgraph.types import Command, Send, interrupt

from ._decisions import Decision
from ._errors import ConfigError, InvalidRequest
from ._gate_checks import GateChecks, refusal
from ._langsmith import (
    Annotations,
    annotate_run,
    check_annotations,
    decision_annotations,
    decisions_annotations,
    node_run,
    posting_calls,
)
from ._router import Incumbent, Router
from ._turns import latest_user_turn

__all__ = ["RouterState", "classify_node", "decision_record", "policy_gate_node", "route_edge", "router_node"]

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


class RouterState(MessagesState, total=False):
    """Graph state for ``router_node``: the conversation and the two keys the node writes.

    Use it as the graph's state, or subclass it to add keys of your own. Without ``route`` and
    ``decision`` in the graph's state LangGraph would drop what the node writes without a word, and
    each follow-up turn would be routed afresh instead of sticking to the conversation's route; so
    ``router_node`` refuses to run in a graph whose state lacks them.
    """

    route: str | None
    """The route the conversation is on: the node reads it as the previous route (stickiness) and
    writes each decision's; ``None`` when the decision went to the ``escalate_to`` node."""
    decision: dict[str, Any] | None
    """The latest routing decision as plain data (``decision_record``): route, confidence, system,
    reason, policy version."""


@dataclass(frozen=True, slots=True)
class _Traced(Generic[R]):
    """How a node shows up in LangSmith when LangChain tracing is on (``fastslow.router._langsmith``).

    ``describe`` gives the decided value's metadata and tags for the node's run; ``shown`` the
    state text its engine calls may carry (``None`` unless the router opts in); ``calls`` whether
    the node posts its engine calls itself (the policy gate's checks post theirs, each in its task).
    """

    describe: Callable[[R], Annotations]
    shown: Callable[[Any], str | None] = lambda _input: None
    calls: bool = True


class _Dual(Runnable[Any, Any], Generic[R]):
    """A runnable whose async path awaits ``afunc`` and whose sync path calls ``func``.

    ``finish`` runs in the caller's thread and task either way, so it may call ``interrupt()``.
    ``check``, when given, is called with the run's config before anything is decided. With
    ``traced`` and LangChain tracing on, the decision goes onto the node's run before ``finish``
    (which may interrupt), and the engine calls become its child runs; with tracing off the only
    cost is looking for a tracer among the config's handlers.
    """

    def __init__(
        self,
        afunc: Callable[[Any], Coroutine[Any, Any, R]],
        func: Callable[[Any], R],
        finish: Callable[[Any, R], Any],
        name: str,
        check: Callable[[RunnableConfig | None], None] | None = None,
        traced: _Traced[R] | None = None,
    ):
        self.name = name
        self._afunc = afunc
        self._func = func
        self._finish = finish
        self._check = check
        self._traced = traced

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        del kwargs
        if self._check is not None:
            self._check(config)
        run = node_run(config) if self._traced is not None else None
        if run is None or self._traced is None:
            return self._finish(input, self._func(input))
        with posting_calls(run if self._traced.calls else None, state_text=self._traced.shown(input)):
            decided = self._func(input)
        annotate_run(run, *self._traced.describe(decided))
        return self._finish(input, decided)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        del kwargs
        if self._check is not None:
            self._check(config)
        run = node_run(config) if self._traced is not None else None
        if run is None or self._traced is None:
            return self._finish(input, await self._afunc(input))
        with posting_calls(run if self._traced.calls else None, state_text=self._traced.shown(input)):
            decided = await self._afunc(input)
        annotate_run(run, *self._traced.describe(decided))
        return self._finish(input, decided)


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


def _in_state(exc: InvalidRequest, messages_key: str, runnable: str) -> InvalidRequest:
    """The router's error about its ``messages`` argument, told as one about the graph state's key."""
    field = exc.field
    if field != "messages" and not field.startswith("messages."):
        return exc
    where = f"{runnable} reads the conversation from the graph state's {messages_key!r}"
    return InvalidRequest(messages_key + field.removeprefix("messages"), f"{exc.message} ({where})")


def _deciders(
    router: Router, task: str, messages_key: str, route_key: str, incumbent: GraphIncumbent | None, runnable: str
) -> tuple[Callable[[Any], Coroutine[Any, Any, Decision]], Callable[[Any], Decision]]:
    # A state with no user turn to route is an error, never a decision: the router says which, and
    # the error names the state key. The messages are passed as they are (converted where read).
    async def decide(state: Any) -> Decision:
        messages = _get(state, messages_key) or ()
        try:
            return await router.route(
                task, messages, previous=_get(state, route_key), incumbent=_bind(incumbent, state)
            )
        except InvalidRequest as exc:
            raise _in_state(exc, messages_key, runnable) from None

    def decide_sync(state: Any) -> Decision:
        messages = _get(state, messages_key) or ()
        try:
            return router.route_sync(task, messages, previous=_get(state, route_key), incumbent=_bind(incumbent, state))
        except InvalidRequest as exc:
            raise _in_state(exc, messages_key, runnable) from None

    return decide, decide_sync


def _turn_shown(router: Router, messages_key: str) -> Callable[[Any], str | None]:
    """The latest user turn's text for LangSmith child runs, only where the router opts in to state text."""

    def shown(state: Any) -> str | None:
        if not router.trace_state_text:
            return None
        messages = _get(state, messages_key)
        try:
            found = latest_user_turn(messages, messages_key) if messages else None
        except InvalidRequest:
            return None
        return found[1].text if found is not None else None

    return shown


def _route_traced(router: Router, messages_key: str) -> _Traced[Decision]:
    return _Traced(partial(decision_annotations, "route"), _turn_shown(router, messages_key))


def _state_keys(config: RunnableConfig | None) -> Mapping[str, Any] | None:
    """The state keys (channels) of the graph running the node; ``None`` outside a graph run."""
    configurable = config.get("configurable") if config else None
    read = configurable.get(CONFIG_KEY_READ) if configurable else None
    # LangGraph hands each task ``partial(local_read, scratchpad, channels, managed, task)``, and its
    # own ToolNode reads the channels from there as well. On any other shape nothing is checked.
    if isinstance(read, partial) and len(read.args) > 1 and isinstance(read.args[1], Mapping):
        return read.args[1]
    return None


def _writes_kept(runnable: str, route_key: str, decision_key: str) -> Callable[[RunnableConfig | None], None]:
    """A check that the graph's state has both keys the node writes: LangGraph drops others unsaid."""

    def check(config: RunnableConfig | None) -> None:
        channels = _state_keys(config)
        missing = [key for key in (route_key, decision_key) if channels is not None and key not in channels]
        if missing:
            raise ConfigError(
                f"{runnable} writes {route_key!r} and {decision_key!r} to the graph state, but the state has no "
                f"{' or '.join(map(repr, missing))}: LangGraph would drop the write without a word, and follow-up "
                f"turns would lose their route. Build the graph on fastslow.RouterState (or add `{route_key}: "
                f"str | None` and `{decision_key}: dict[str, Any] | None` to your state), or pass route_key= / "
                "decision_key= naming keys your state has"
            )

    return check


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

    The route goes to ``route_key`` and the decision record to ``decision_key``; the graph's state
    needs both keys (``RouterState`` has them). A follow-up turn sticks to the route read back from
    ``route_key`` unless System 1 is confident of a change.

    The conversation under ``messages_key`` may hold anything ``Router.route`` takes (messages,
    role/content dicts, ``(role, text)`` pairs).

    Raises:
        ConfigError: when the node runs in a graph whose state has no ``route_key`` or no
            ``decision_key`` (checked on every run, before anything is decided).
        InvalidRequest: the state's conversation is empty or missing, has no user turn, or its
            latest user turn has no text: there is nothing to route, and nothing is decided.

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

    name = f"router:{task}"
    check = _writes_kept(f"router_node({task!r})", route_key, decision_key)
    deciders = _deciders(router, task, messages_key, route_key, incumbent, name)
    return _Dual(*deciders, finish, name, check, _route_traced(router, messages_key))


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
    Other arguments are as ``router_node``'s, and so are the errors for a state with no user turn.
    """
    mapping = dict(routes or {})

    def finish(state: Any, decision: Decision) -> str | Send:
        goto = escalate_to if decision.outcome is None else mapping.get(decision.outcome, decision.outcome)
        if not send:
            return goto
        if not isinstance(state, Mapping):
            raise ConfigError(f"route_edge(send=True) needs a mapping graph state, not {type(state).__name__}")
        return Send(goto, {**state, route_key: decision.outcome, decision_key: decision_record(decision)})

    name = f"route:{task}"
    deciders = _deciders(router, task, messages_key, route_key, incumbent, name)
    # An edge has no run of its own: the decision goes onto the run of the node it leaves.
    return _Dual(*deciders, finish, name, traced=_route_traced(router, messages_key))


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

    When the router records into the decision log (a ``ReviewRecorder`` sink), each review is also
    opened in the review queue, with the run's thread id; the interrupt's ``review_id`` names it,
    and ``fastslow.graphs.resume_reviewed`` resumes the thread once it is settled (docs/reviews.md).

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
                        "review_id": result.get("review_id"),
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

    # Each check posts its engine calls under its own run (a LangGraph task's), so the node posts none.
    traced = _Traced(partial(check_annotations, task), calls=False)
    return _Dual(evaluate, evaluate_sync, finish, f"policy_gate:{task}", traced=traced)


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

    A state with no user turn is classified by its ``input`` (as JSON). ``incumbent``: as
    ``router_node``'s, called with the graph state and each question's name.

    Raises:
        InvalidRequest: the state has neither a user turn nor an ``input``, or its latest user
            turn has no text: there is nothing to classify.
    """

    def text(state: Any) -> str:
        messages = _get(state, messages_key)
        found = latest_user_turn(messages, messages_key) if messages else None
        if found is None:
            value = _get(state, "input")
            if value is None:
                raise InvalidRequest(
                    messages_key,
                    f"has no user turn, and the graph state no 'input': classify_node({task!r}) has nothing to read",
                )
            return json.dumps(value)
        index, message = found
        if not message.text.strip():
            raise InvalidRequest(f"{messages_key}.{index}", "the latest user turn has no text to read")
        return message.text

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

    def shown(state: Any) -> str | None:
        if not router.trace_state_text:
            return None
        try:
            return text(state)
        except InvalidRequest:
            return None

    traced = _Traced(partial(decisions_annotations, "classify", task), shown)
    return _Dual(classify, classify_sync, finish, f"classify:{task}", traced=traced)
