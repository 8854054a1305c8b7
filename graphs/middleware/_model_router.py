"""Model routing as ``create_agent`` middleware: System 1 picks the model for each user turn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain.agents.middleware.types import ExtendedModelResponse, OmitFromInput
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.runtime import Runtime
from langsmith.run_trees import RunTree

from fastslow.router import ConfigError, Decision, InvalidRequest, Router, RouteTask
from fastslow.router.graph_api import (
    TRACE_TAG,
    annotate_run,
    current_node_run,
    decision_annotations,
    decision_record,
    posting_calls,
)

from ._thoughts import without_thoughts

__all__ = ["FRONTIER", "ROUTE_KEY", "ModelRouterMiddleware", "ModelRouterState"]

ROUTE_KEY = "fastslow_route"
"""State key: the latest user turn's routing record (turn, model, route, reason, the decision)."""

FRONTIER = "frontier"
"""The ``model`` a record names when the turn went to the frontier model."""

TAG = TRACE_TAG
MODEL_KEY = "fastslow.model"
"""LangSmith metadata on the routing hook's run: the ``models`` key (or ``frontier``) the turn goes to."""

_Result = ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]


class ModelRouterState(AgentState[Any]):
    """The agent state key ``ModelRouterMiddleware`` adds."""

    fastslow_route: NotRequired[Annotated[dict[str, Any], OmitFromInput]]
    """The routing record of the latest user turn."""


class ModelRouterMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Pick the chat model for each user turn with a fastslow route task.

    Before the agent runs on a new user turn (``before_agent``), the route task decides about the
    latest ``HumanMessage``, as ``router_node`` does (escalation, stickiness on the previous turn's
    route, the decision recorded to the router's sink). A route System 1 settled goes to its model in
    ``models``; anything else (escalated, open-ended, "none of these", settled only by System 2)
    goes to ``frontier``, as fastslow sends to System 2 what System 1 cannot settle. The record
    (``fastslow_route`` in state: the turn's message id, the model key, route, reason and
    ``decision_record``) is kept per user turn: every model call of that turn, the whole tool loop
    and a resume after a pause included, uses the same model, and the turn is never routed twice.
    ``wrap_model_call`` applies it with ``request.override(model=...)``.

    Thoughts never enter the agent's state: every message a model returns loses its reasoning and
    thinking blocks, ``reasoning`` / ``reasoning_content`` fields and ``<think>`` or DiffusionGemma
    thought-channel text before it is written (so before any checkpoint).

    Anthropic with extended thinking: its signed thinking blocks would have to stay in the
    conversation for a tool loop to continue, and they may not enter state. So a model with
    thinking on (a ``thinking`` field whose type is not ``"disabled"``, as on ``ChatAnthropic``)
    is called with thinking switched off whenever the call offers tools; calls without tools keep
    thinking, whose blocks are then stripped. fastslow's own Anthropic engine keeps thinking
    inside one engine call instead; an agent loop cannot.

    Args:
        router: the fastslow router (``build_runtime(settings).router``).
        task: a route task of the policy.
        models: route name -> the model for turns System 1 settles on that route; every route but
            the task's "none of these" option needs one.
        frontier: the model for every other turn.

    Raises:
        ConfigError: ``task`` is not in the policy or not a route task, a route has no model, or
            a ``models`` key names no route. Checked against the policy in force when built; a
            route added by a later reload goes to ``frontier`` until the agent is rebuilt.
    """

    # The hooks are typed over plain AgentState, not ModelRouterState: create_agent takes one middleware
    # state type for its whole list, so a list mixing middlewares type-checks only then.
    state_schema = ModelRouterState

    def __init__(
        self,
        router: Router,
        task: str,
        *,
        models: Mapping[str, BaseChatModel],
        frontier: BaseChatModel,
    ) -> None:
        super().__init__()
        found = router.task(task, RouteTask)
        routes = [r for r in found.routes if r != found.none_option]
        for route in routes:
            if route not in models:
                raise ConfigError(
                    f"route {route!r} of task {task!r} names no configured model; models: {', '.join(models)}",
                    key=f"tasks.{task}.routes.{route}",
                )
        for key in models:
            if key not in routes:
                raise ConfigError(
                    f"model key {key!r} names no route of task {task!r}; routes: {', '.join(routes)}",
                    key=f"models.{key}",
                )
        self.router = router
        self.task = task
        self.models = dict(models)
        self.frontier = frontier
        self._unthinking: dict[int, BaseChatModel] = {}

    @property
    def name(self) -> str:
        return f"ModelRouter[{self.task}]"

    # -- once per user turn: the routing decision --------------------------------------------

    def before_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        del runtime
        turn = _new_turn(state)
        if turn is None:
            return None
        run = current_node_run()
        try:
            with posting_calls(run, state_text=_shown(self.router, state)) if run is not None else nullcontext():
                decision = self.router.route_sync(self.task, state["messages"], previous=_previous(state))
        except InvalidRequest as exc:
            return _unreadable(turn, exc)
        return self._record(turn, decision, run)

    async def abefore_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        del runtime
        turn = _new_turn(state)
        if turn is None:
            return None
        run = current_node_run()
        try:
            with posting_calls(run, state_text=_shown(self.router, state)) if run is not None else nullcontext():
                decision = await self.router.route(self.task, state["messages"], previous=_previous(state))
        except InvalidRequest as exc:
            return _unreadable(turn, exc)
        return self._record(turn, decision, run)

    def _record(self, turn: str, decision: Decision, run: RunTree | None) -> dict[str, Any]:
        settled = decision.outcome is not None and decision.system == 1 and not decision.escalate
        model = decision.outcome if settled and decision.outcome in self.models else FRONTIER
        if run is not None:  # LangChain tracing on: the decision and the model chosen on the hook's run
            metadata, tags = decision_annotations("route", decision)
            annotate_run(run, {**metadata, MODEL_KEY: model}, [*tags, f"{TAG}:model:{model}"])
        record = {
            "turn": turn,
            "model": model,
            "route": decision.outcome,
            "reason": decision.reason,
            "decision": decision_record(decision),
        }
        return {ROUTE_KEY: record}

    # -- every model call: the turn's model, and no thoughts in what comes back ------------------

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], ModelResponse[Any]]
    ) -> _Result:
        return _clean(handler(request.override(model=self._model_for(request))))

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]
    ) -> _Result:
        return _clean(await handler(request.override(model=self._model_for(request))))

    def _model_for(self, request: ModelRequest[Any]) -> BaseChatModel:
        record = request.state.get(ROUTE_KEY)
        key = record.get("model") if isinstance(record, Mapping) else None
        model = self.models.get(key, self.frontier) if isinstance(key, str) else self.frontier
        return self._without_thinking(model) if request.tools else model

    def _without_thinking(self, model: BaseChatModel) -> BaseChatModel:
        thinking = getattr(model, "thinking", None)
        if not isinstance(thinking, Mapping) or thinking.get("type", "disabled") == "disabled":
            return model
        # One copy per model, made on first use: a model copy is cheap, but its client need not be.
        if id(model) not in self._unthinking:
            self._unthinking[id(model)] = model.model_copy(update={"thinking": None})
        return self._unthinking[id(model)]


def _latest_human(messages: Sequence[AnyMessage]) -> tuple[int, HumanMessage] | None:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage):
            return index, message
    return None


def _new_turn(state: AgentState[Any]) -> str | None:
    """The latest user turn's key when it has not been routed yet, else ``None``."""
    found = _latest_human(state["messages"])
    if found is None:
        return None
    index, message = found
    # LangGraph's add_messages gives every message an id; a position is the fallback outside it.
    turn = message.id or f"#{index}"
    kept = state.get(ROUTE_KEY)
    return None if isinstance(kept, Mapping) and kept.get("turn") == turn else turn


def _unreadable(turn: str, exc: InvalidRequest) -> dict[str, Any]:
    # A user turn System 1 cannot read (an image alone, no text): nothing to route, so the turn goes
    # to the frontier model, which can read it, rather than failing the agent. No decision is made.
    record = {"turn": turn, "model": FRONTIER, "route": None, "reason": "unreadable", "detail": exc.message}
    return {ROUTE_KEY: record}


def _shown(router: Router, state: AgentState[Any]) -> str | None:
    """The latest user turn's text for LangSmith child runs, only where the router opts in to state text."""
    if not router.trace_state_text:
        return None
    found = _latest_human(state["messages"])
    return found[1].text if found is not None else None


def _previous(state: AgentState[Any]) -> str | None:
    kept = state.get(ROUTE_KEY)
    route = kept.get("route") if isinstance(kept, Mapping) else None
    return route if isinstance(route, str) else None


def _clean(result: _Result) -> _Result:
    if isinstance(result, AIMessage):
        cleaned = without_thoughts(result)
        assert isinstance(cleaned, AIMessage)
        return cleaned
    if isinstance(result, ExtendedModelResponse):
        result.model_response = _clean(result.model_response)  # type: ignore[assignment]
        return result
    return ModelResponse(
        result=[without_thoughts(m) for m in result.result], structured_response=result.structured_response
    )
