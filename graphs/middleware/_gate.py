"""The policy gate as ``create_agent`` middleware: every proposed tool call is checked before it runs."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState
from langchain.agents.middleware.human_in_the_loop import Action, ActionRequest, HITLRequest, ReviewConfig
from langchain.agents.middleware.types import OmitFromInput, PrivateStateAttr, ToolCallRequest
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, ToolMessage
from langgraph.runtime import Runtime
from langgraph.types import Command, interrupt

from fastslow.router import CheckTask, ConfigError, Router
from fastslow.router.graph_api import Checked, GateChecks, annotate_run, check_annotations, current_node_run, refusal

__all__ = ["GATE_KEY", "PolicyGateMiddleware", "PolicyGateState"]

GATE_KEY = "fastslow_gate"
"""State key: one record per tool call of the latest model turn that proposed any (id, name, verdict, rule, by)."""

_EDITS_KEY = "fastslow_edited_tool_calls"

_Call = dict[str, Any]
_Plan = Generator[list[_Call], list[Checked], dict[str, Any]]


class PolicyGateState(AgentState[Any]):
    """The agent state keys ``PolicyGateMiddleware`` adds."""

    fastslow_gate: NotRequired[Annotated[list[dict[str, Any]], OmitFromInput]]
    """The gate's record of the latest model turn's tool calls."""
    fastslow_edited_tool_calls: NotRequired[Annotated[dict[str, Action], PrivateStateAttr]]
    """Tool call id -> the reviewer's replacement, applied when the tool runs."""


class PolicyGateMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Check every tool call the model proposes with a fastslow check task before any tool runs.

    After each model call (``after_model``) each pending tool call is checked with
    ``router.check(task, ...)``, given the conversation before it as ``policy_gate_node`` gives it:

    * **deny**: the call is answered by an error ``ToolMessage`` saying which rule refused it, so the
      model sees why and carries on (the tools edge skips a call that has its ``ToolMessage``);
    * **allow**: the tool runs;
    * **review**: the agent pauses as ``HumanInTheLoopMiddleware`` does (one ``interrupt`` with a
      ``HITLRequest`` for the model turn, each action request carrying the ``fastslow`` decision:
      task, rule, probability and, when the router records into the decision log, the
      ``review_id`` of the review opened in the review queue), and resumes with
      ``Command(resume={"decisions": [...]})``:
      ``approve`` runs the call, ``reject`` answers it with an error ``ToolMessage`` (with the
      reviewer's ``message`` when given), ``edit`` replaces it with the ``edited_action``, which is
      checked again and handled by its own verdict (a denied edit does not run, a reviewed one
      pauses again).

    Each check runs as a LangGraph task (``langgraph.func.task``), checkpointed with the hook's
    pending writes: LangGraph runs the hook again from the top on resume, and it gets the checks it
    made before the pause back, so no engine call, System-2 call or recorded decision happens twice
    and the verdict the person reviewed is the one acted on. Review needs a checkpointer.

    The policy is read through the router on every check, so a reloaded policy file applies to the
    next model turn.

    Args:
        router: the fastslow router (``build_runtime(settings).router``).
        task: a check task of the policy.
        allowed_decisions: what a reviewer may answer, as in ``HumanInTheLoopMiddleware``.
        context: whether the check is given the conversation before the call (the router decides
            what System 1 and System 2 read of it, as for ``policy_gate_node``); ``False`` gives it
            the call alone.

    Raises:
        ConfigError: ``task`` is not in the policy, or is not a check task.
    """

    # The hooks are typed over plain AgentState, not PolicyGateState: create_agent takes one middleware
    # state type for its whole list, so a list mixing middlewares type-checks only then.
    state_schema = PolicyGateState

    def __init__(
        self,
        router: Router,
        task: str,
        *,
        allowed_decisions: Sequence[str] = ("approve", "edit", "reject"),
        context: bool = True,
    ) -> None:
        super().__init__()
        router.task(task, CheckTask)
        unknown = sorted(set(allowed_decisions) - {"approve", "edit", "reject"})
        if unknown or not allowed_decisions:
            raise ConfigError(
                f"allowed_decisions takes approve, edit and reject, not {unknown}", key="allowed_decisions"
            )
        self.router = router
        self.task = task
        self.allowed_decisions = list(allowed_decisions)
        self.context = context

        # Checkpointed as LangGraph tasks: a hook run again on resume gets back the reviewed verdicts.
        self._checks = GateChecks(router, task, source="agent")

    @property
    def name(self) -> str:
        return f"PolicyGate[{self.task}]"

    # -- after the model call: check, pause for review, answer refused calls --------------------

    def after_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        del runtime
        calls, context = _pending(state["messages"], self.context)
        if not calls:
            return _cleared(state)
        plan = self._plan(calls, self._traced(calls, [self._checks.check_sync(c, context) for c in calls]))
        try:
            batch = next(plan)
            while True:
                batch = plan.send([self._checks.check_sync(c, context) for c in batch])
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def aafter_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        del runtime
        calls, context = _pending(state["messages"], self.context)
        if not calls:
            return _cleared(state)
        plan = self._plan(calls, self._traced(calls, await self._checks.check_all(calls, context)))
        try:
            batch = next(plan)
            while True:
                batch = plan.send(await self._checks.check_all(batch, context))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _traced(self, calls: list[_Call], checked: list[Checked]) -> list[Checked]:
        """``checked``, put on the hook's run when LangChain tracing is on (each check's engine calls
        are child runs of the check's own task run)."""
        run = current_node_run()
        if run is not None:
            annotate_run(run, *check_annotations(self.task, list(zip(calls, checked, strict=True))))
        return checked

    def _plan(self, calls: list[_Call], checked: list[Checked]) -> _Plan:
        """Settle every call; yields edited calls to be checked, and returns the state update.

        One plan for both hooks: the sync hook checks what it yields with ``check_sync``, the async
        one with ``check``.
        """
        answers: dict[str, ToolMessage] = {}
        records: dict[str, dict[str, Any]] = {}
        edits: dict[str, Action] = {}
        todo = list(zip(calls, checked, strict=True))
        while todo:
            review: list[tuple[_Call, Checked]] = []
            for call, result in todo:
                if result["verdict"] == "review":
                    review.append((call, result))
                    continue
                by = "System 2" if result["system2"] else "System 1"
                records[call["id"]] = _record(call, result["verdict"], result, by)
                if result["verdict"] == "deny":
                    answers[call["id"]] = refusal(call, result, f"decided by {by}")
            if not review:
                break
            decisions = interrupt(self._request(review))["decisions"]
            if len(decisions) != len(review):
                raise ValueError(
                    f"Number of human decisions ({len(decisions)}) does not match "
                    f"number of hanging tool calls ({len(review)})."
                )
            edited: list[_Call] = []
            for (call, result), decision in zip(review, decisions, strict=True):
                kind = decision.get("type")
                if kind not in self.allowed_decisions:
                    raise ValueError(
                        f"Unexpected human decision: {decision}. Decision type {kind!r} is not allowed "
                        f"for tool {call['name']!r}. Expected one of {self.allowed_decisions}."
                    )
                if kind == "approve":
                    records[call["id"]] = _record(call, "allow", result, "a person")
                elif kind == "reject":
                    records[call["id"]] = _record(call, "deny", result, "a person")
                    answers[call["id"]] = _rejected(call, decision.get("message"))
                else:
                    action = decision["edited_action"]
                    edits[call["id"]] = Action(name=action["name"], args=dict(action["args"]))
                    edited.append({**call, "name": action["name"], "args": dict(action["args"])})
            todo = list(zip(edited, (yield edited) if edited else [], strict=True))
        order = [c["id"] for c in calls]
        return {
            "messages": [answers[i] for i in order if i in answers],
            GATE_KEY: [records[i] for i in order],
            # A refused edit does not run, so only allowed ones are substituted.
            _EDITS_KEY: {i: action for i, action in edits.items() if i not in answers},
        }

    def _request(self, review: list[tuple[_Call, Checked]]) -> HITLRequest:
        actions: list[ActionRequest] = []
        configs: list[ReviewConfig] = []
        for call, result in review:
            action: dict[str, Any] = {
                "name": call["name"],
                "args": call["args"],
                "description": (
                    f"fastslow policy {result['task']!r} asks for review "
                    f"(rule {result['rule']!r}, p={result['confidence']:.2f}).\n\n"
                    f"Tool: {call['name']}\nArgs: {call['args']}"
                ),
                # What fastslow decided, for a reviewer's interface; HITL clients ignore the key.
                "fastslow": {
                    "tool_call_id": call["id"],
                    "task": result["task"],
                    "rule": result["rule"],
                    "probability": result["confidence"],
                    "system2": result["system2"],
                    "policy_version": result["policy_version"],
                    # The review queue's id when the router records into the decision log
                    # (``fastslow.graphs.resume_reviewed``); None otherwise.
                    "review_id": result.get("review_id"),
                },
            }
            actions.append(action)  # type: ignore[arg-type]  # ActionRequest plus the "fastslow" key
            configs.append(ReviewConfig(action_name=call["name"], allowed_decisions=self.allowed_decisions))  # type: ignore[typeddict-item]
        return HITLRequest(action_requests=actions, review_configs=configs)

    # -- when a tool runs: the reviewer's edit in place of the model's call --------------------

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]]
    ) -> ToolMessage | Command[Any]:
        executed = _edit_for(request)
        if executed is None:
            return handler(request)
        return _noted(handler(_apply_edit(request, executed)), executed)

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage | Command[Any]:
        executed = _edit_for(request)
        if executed is None:
            return await handler(request)
        return _noted(await handler(_apply_edit(request, executed)), executed)


def _pending(messages: Sequence[AnyMessage], context: bool) -> tuple[list[_Call], list[BaseMessage]]:
    """The latest model turn's tool calls that have no answer yet, and the conversation before it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
            calls = [dict(c) for c in message.tool_calls if c["id"] not in answered]
            return calls, [m for m in messages[:index] if not isinstance(m, ToolMessage)] if context else []
    return [], []


def _cleared(state: AgentState[Any]) -> dict[str, Any] | None:
    # An earlier turn's edits must never apply to this turn's calls.
    return {_EDITS_KEY: {}} if state.get(_EDITS_KEY) else None


def _record(call: _Call, verdict: str, result: Checked, by: str) -> dict[str, Any]:
    return {"tool_call_id": call["id"], "name": call["name"], "verdict": verdict, "rule": result["rule"], "by": by}


def _rejected(call: _Call, reason: str | None) -> ToolMessage:
    """A reviewer's rejection, worded as ``HumanInTheLoopMiddleware`` words it."""
    if reason:
        content = f"User rejected the tool call for `{call['name']}` with reason: {reason}"
    else:
        content = (
            f"User rejected the tool call for `{call['name']}` with id {call['id']}. The tool was not executed. "
            "Do not retry this tool call unless the user explicitly requests it."
        )
    return ToolMessage(content=content, tool_call_id=call["id"], name=call["name"], status="error")


def _edit_for(request: ToolCallRequest) -> Action | None:
    call_id = request.tool_call.get("id")
    state = request.state
    edits: Mapping[str, Action] = (state.get(_EDITS_KEY) or {}) if isinstance(state, Mapping) else {}
    return edits.get(call_id) if call_id else None


def _apply_edit(request: ToolCallRequest, executed: Action) -> ToolCallRequest:
    call = {**request.tool_call, "name": executed["name"], "args": executed["args"]}
    if executed["name"] == request.tool_call["name"]:
        return request.override(tool_call=call)  # type: ignore[arg-type]
    tool = next((t for t in request.runtime.tools if t.name == executed["name"]), None)
    if tool is None:
        names = ", ".join(sorted(t.name for t in request.runtime.tools))
        raise ValueError(f"the reviewer edited the call to {executed['name']!r}, which is not a tool; tools: {names}")
    return request.override(tool_call=call, tool=tool)  # type: ignore[arg-type]


def _noted(result: ToolMessage | Command[Any], executed: Action) -> ToolMessage | Command[Any]:
    """Tell the model that a reviewer replaced its call, and with what (as ``HumanInTheLoopMiddleware`` does)."""
    if not isinstance(result, ToolMessage) or not isinstance(result.content, str):
        return result
    notice = (
        "Note: a human reviewer replaced this tool call before it ran. Executed instead: "
        f"{executed['name']} with arguments {json.dumps(executed['args'], default=str)}."
    )
    return result.model_copy(update={"content": f"{notice}\n\nTool response:\n{result.content}"})
