"""The Router: ask System 1, decide by policy, escalate to System 2, record.

It holds no decision state of its own: the policy comes from a provider (hot-reloaded by
``policies``), engines from a source, and every decision goes to a sink (the decision log), so any
number of replicas can run side by side.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeAlias, TypeVar, cast

from langchain_core.messages import BaseMessage

from ._answers import Answer, NoAnswer
from ._chat import THOUGHT_TASK, ChatEngine, ToolCall
from ._decisions import (
    Decision,
    EngineFailure,
    Verdict,
    audited,
    decide_answer,
    decide_check,
    escalated_by_system2,
)
from ._engine import DecisionEngine
from ._errors import ConfigError, EngineError, EngineTimeout, InvalidRequest
from ._escalate import ask_system2
from ._questions import Question, State
from ._settings import EngineName
from ._tasks import CheckTask, ClassifyTask, PolicySet, RouteTask, Task, TaskCommon
from ._turns import split_turns
from ._work import budget_s

__all__ = ["ChatSource", "CheckResult", "DecisionSink", "EngineSource", "Router"]

T = TypeVar("T", bound=Task)
NO_FRONTIER = "no frontier model configured"


class EngineSource(Protocol):
    """Gives the System-1 engine for a task, trained on the policy's examples where it learns from them."""

    def engine_for(self, name: EngineName | None, policy: PolicySet) -> DecisionEngine: ...


class ChatSource(Protocol):
    """Gives the System-2 engine for a model reference, or ``None`` when none is configured."""

    def chat_for(self, ref: str | None) -> ChatEngine | None: ...


Incumbent: TypeAlias = Callable[[str], Awaitable[str | None]]
"""What decides a task in shadow mode instead of System 2: question name -> option (or verdict)."""


class DecisionSink(Protocol):
    """Where decisions are recorded (the decision log)."""

    async def record(self, decision: Decision, *, state: State) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckResult:
    """The verdict of a policy check over all its rules."""

    task: str
    verdict: Verdict
    rule: str
    """The rule that decided the verdict."""
    decisions: Mapping[str, Decision]
    system2: bool
    """Whether System 2 was consulted for any rule."""
    policy_version: str


class Router:
    """Typed decisions with escalation, as used by the LangGraph nodes and the HTTP API."""

    def __init__(
        self,
        policies: Callable[[], PolicySet],
        engines: EngineSource,
        chats: ChatSource,
        *,
        sink: DecisionSink | None = None,
    ) -> None:
        self._policies = policies
        self._engines = engines
        self._chats = chats
        self._sink = sink

    def with_sink(self, sink: DecisionSink | None) -> Router:
        """The same router recording into ``sink`` (say, the decision log bound to one tenant)."""
        return Router(self._policies, self._engines, self._chats, sink=sink)

    @property
    def policy(self) -> PolicySet:
        return self._policies()

    def _task(self, policy: PolicySet, name: str, kind: type[T]) -> T:
        task = policy.tasks.get(name)
        if task is None:
            raise ConfigError(f"no task {name!r} in the policy; tasks: {', '.join(policy.tasks)}", key=f"tasks.{name}")
        if not isinstance(task, kind):
            raise ConfigError(f"task {name!r} is a {task.kind} task, not a {kind.__name__}", key=f"tasks.{name}.kind")
        return task

    async def _ask(
        self,
        task: TaskCommon,
        policy: PolicySet,
        state: State,
        questions: Mapping[str, Question],
        *,
        violations: Mapping[str, str] | None = None,
    ) -> tuple[Mapping[str, Answer | NoAnswer | EngineFailure], str]:
        """The engine's answers, and the version of the learned examples it was trained with for ``task``."""
        engine = self._engines.engine_for(task.engine, policy)
        learned: Mapping[str, str] = getattr(engine, "examples_versions", None) or {}
        version = learned.get(task.name, "")
        # The task's budget, cut to what is left of the request's deadline (request_scope).
        timeout = budget_s(task.read.timeout_s)
        options = task.read if timeout == task.read.timeout_s else replace(task.read, timeout_s=timeout)
        if violations:
            options = replace(options, violations=violations)
        try:
            async with asyncio.timeout(timeout):
                reply = await engine.decide(state, questions, options=options)
        except (TimeoutError, EngineTimeout) as exc:
            failure = EngineFailure(message=f"System 1 timed out: {exc}".rstrip(": "), timeout=True)
            return dict.fromkeys(questions, failure), version
        except EngineError as exc:
            return dict.fromkeys(questions, EngineFailure(message=str(exc))), version
        return reply.answers, version

    def _chat(self, task: TaskCommon, policy: PolicySet) -> tuple[ChatEngine | None, str]:
        chat = self._chats.chat_for(task.escalate_to or policy.default_escalate_to)
        if chat is None:
            return None, NO_FRONTIER
        if task.egress.local_only:
            base = getattr(chat, "base_url", None)
            if not base or not any(str(base).startswith(allowed) for allowed in policy.egress_allow):
                return None, f"egress denied: task is local_only and {base or chat.model} is not allow-listed"
        return chat, ""

    async def _escalate(
        self,
        decision: Decision,
        task: TaskCommon,
        policy: PolicySet,
        question: Question,
        state: State,
        context: Sequence[BaseMessage] = (),
    ) -> Decision:
        chat, why_not = self._chat(task, policy)
        if chat is None:
            return replace(decision, detail="; ".join(x for x in (decision.detail, why_not) if x))
        token = THOUGHT_TASK.set(task.name if task.debug_thoughts else None)
        try:
            answer = await ask_system2(chat, question, state, context=context, timeout_s=budget_s(task.read.timeout_s))
        finally:
            THOUGHT_TASK.reset(token)
        if answer.option is None:
            return replace(decision, detail="; ".join(x for x in (decision.detail, answer.detail) if x))
        return escalated_by_system2(
            decision, answer.option, model=answer.model, detail=decision.detail, cost_usd=answer.cost_usd
        )

    async def _shadow(
        self,
        decision: Decision,
        task: TaskCommon,
        policy: PolicySet,
        question: Question,
        state: State,
        incumbent: Incumbent | None,
        name: str,
        context: Sequence[BaseMessage] = (),
    ) -> Decision:
        """The incumbent's decision, with System 1's distribution beside it (``mode: shadow``).

        What System 1 would have done is kept (its distribution, confidence and reason in
        ``detail``) so ``fastslow report shadow`` can say what the thresholds would have kept; the
        outcome, and so what the caller does, is the incumbent's alone.
        """
        would = decision.outcome if not decision.escalate else "escalate"
        detail = f"shadow: System 1 would have {would!s} ({decision.reason}, {decision.model or decision.engine})"
        if incumbent is not None:
            outcome = await incumbent(name)
            return replace(
                decision,
                outcome=outcome,
                system=2,
                escalate=outcome is None,
                reason="shadow",
                model="incumbent",
                detail=detail,
            )
        asked = await self._escalate(replace(decision, escalate=True), task, policy, question, state, context)
        if asked.system != 2:
            return replace(asked, outcome=None, escalate=True, reason="shadow", detail=f"{detail}; {asked.detail}")
        return replace(asked, reason="shadow", detail=detail)

    async def _record(self, decisions: Sequence[Decision], state: State) -> None:
        if self._sink is None:
            return
        # A check's rules (a classification's questions) belong together: one commit where the sink
        # can batch them, such as the decision log.
        record_many = getattr(self._sink, "record_many", None)
        if record_many is not None and len(decisions) > 1:
            await record_many(decisions, state=state)
            return
        for decision in decisions:
            await self._sink.record(decision, state=state)

    async def route(
        self,
        task_name: str,
        messages: Sequence[BaseMessage],
        *,
        previous: str | None = None,
        incumbent: Incumbent | None = None,
    ) -> Decision:
        """Pick a route for the latest user turn; ``previous`` is the route the conversation is on.

        ``incumbent`` is what decides a task in shadow mode (``mode: shadow``) instead of System 2:
        called with the task's name, it returns the route (``None``: it could not say).
        """
        policy = self.policy
        task = self._task(policy, task_name, RouteTask)
        current, earlier = split_turns(messages, task.context_turns)
        state: State = current if not earlier else {"message": current, "earlier": list(earlier)}
        questions: dict[str, Question] = {task.name: task.question}
        if task.open_ended is not None:
            questions[f"{task.name}.open_ended"] = task.open_ended.question
        answers, learned = await self._ask(task, policy, state, questions)
        decision = decide_answer(
            task.name,
            answers[task.name],
            thresholds=task.thresholds,
            calibration=task.calibration,
            none_option=task.none_option,
            policy_version=policy.version,
        )
        decision = replace(decision, examples_version=learned)
        if task.mode == "shadow":
            decision = await self._shadow(decision, task, policy, task.question, state, incumbent, task.name)
            await self._record([decision], state)
            return decision
        open_ended = answers.get(f"{task.name}.open_ended")
        if task.open_ended is not None and isinstance(open_ended, Answer):
            p = open_ended.probabilities["yes"]
            if p >= task.open_ended.threshold:
                decision = replace(decision, outcome=None, escalate=True, reason="open_ended", confidence=p)
        decision = self._stick(task, decision, previous)
        if decision.escalate and decision.reason != "open_ended" and decision.reason not in ("engine_error", "timeout"):
            decision = await self._escalate(decision, task, policy, task.question, state)
        elif decision.escalate and decision.reason in ("engine_error", "timeout") and task.on_failure == "escalate":
            decision = await self._escalate(decision, task, policy, task.question, state)
        decision = audited(decision, task.audit_rate)
        await self._record([decision], state)
        return decision

    @staticmethod
    def _stick(task: RouteTask, decision: Decision, previous: str | None) -> Decision:
        if not task.sticky.enabled or previous is None or previous not in task.routes:
            return decision
        if decision.reason in ("open_ended", "engine_error", "timeout"):
            return decision
        if decision.outcome == previous:
            return decision
        if not decision.escalate and decision.confidence >= task.sticky.min_change_confidence:
            return decision
        return replace(
            decision,
            outcome=previous,
            escalate=False,
            reason="sticky",
            threshold=task.sticky.min_change_confidence,
            detail=f"kept previous route; System 1 was not confident of a change ({decision.reason})",
        )

    async def classify(
        self, task_name: str, state: State, *, incumbent: Incumbent | None = None
    ) -> dict[str, Decision]:
        """Answer every question of a classification task, escalating the unsure ones.

        In shadow mode ``incumbent`` (called with each question's name) or System 2 answers instead.
        """
        policy = self.policy
        task = self._task(policy, task_name, ClassifyTask)
        names = {f"{task.name}.{q}": q for q in task.questions}
        answers, learned = await self._ask(task, policy, state, {full: task.questions[q] for full, q in names.items()})

        async def one(full: str, short: str) -> Decision:
            decision = decide_answer(
                task.name,
                answers[full],
                thresholds=task.thresholds,
                calibration=task.calibration.for_question(short),
                policy_version=policy.version,
            )
            decision = replace(decision, question=short, examples_version=learned)
            if task.mode == "shadow":
                return await self._shadow(decision, task, policy, task.questions[short], state, incumbent, short)
            failed = decision.reason in ("engine_error", "timeout")
            if decision.escalate and (not failed or task.on_failure == "escalate"):
                decision = await self._escalate(decision, task, policy, task.questions[short], state)
            return decision

        decided = [audited(d, task.audit_rate) for d in await asyncio.gather(*(one(f, s) for f, s in names.items()))]
        await self._record(decided, state)
        return dict(zip(names.values(), decided, strict=True))

    async def check(
        self,
        task_name: str,
        item: str | ToolCall | Mapping[str, Any],
        *,
        context: Sequence[BaseMessage] = (),
        incumbent: Incumbent | None = None,
    ) -> CheckResult:
        """Apply a policy check's rules to a text or a proposed tool call.

        In shadow mode ``incumbent`` (called with each rule's name, returning ``allow``, ``review``
        or ``deny``) or System 2 judges instead; what nobody could judge is denied.
        """
        policy = self.policy
        task = self._task(policy, task_name, CheckTask)
        state = _check_state(item, context, task)
        names = {f"{task.name}.{r}": r for r in task.rules}
        read_limit = self._engines.engine_for(task.engine, policy).limits.max_read_chars
        size = _read_size(state) if read_limit is not None else 0
        questions = {full: task.rules[r].question for full, r in names.items()}
        violations = {full: task.rules[r].action.violation for full, r in names.items()}
        answers, _ = await self._ask(task, policy, state, questions, violations=violations)

        async def one(full: str, short: str) -> Decision:
            rule = task.rules[short]
            decision = decide_check(
                task.name,
                answers[full],
                action=rule.action,
                calibration=task.calibration.for_question(short),
                on_failure=task.on_failure,
                policy_version=policy.version,
            )
            decision = replace(decision, question=short)
            if task.mode == "shadow":
                judged = await self._shadow(decision, task, policy, rule.question, state, incumbent, short, context)
                return _shadow_verdict(judged, rule.action.violation, incumbent is not None)
            if read_limit is not None and size > read_limit and decision.verdict == "allow":
                # System 1 read only the first read_limit characters: what it allowed is not all there is.
                return replace(
                    decision,
                    outcome=task.on_oversize,
                    verdict=task.on_oversize,
                    reason="oversize",
                    detail=f"the state has {size} characters; System 1 reads at most {read_limit}",
                )
            if not decision.escalate:
                return decision
            escalated = await self._escalate(decision, task, policy, rule.question, state, context)
            if escalated.system != 2:
                # Nobody could judge it: fail closed rather than let the call through.
                return replace(escalated, outcome="deny", verdict="deny", escalate=False)
            verdict: Verdict = "deny" if escalated.outcome == rule.action.violation else "allow"
            return replace(escalated, outcome=verdict, verdict=verdict)

        results = await asyncio.gather(*(one(f, s) for f, s in names.items()))
        decided = {name: audited(d, task.audit_rate) for name, d in zip(names.values(), results, strict=True)}
        await self._record(list(decided.values()), state)
        verdict, rule = _combine(decided)
        return CheckResult(
            task=task.name,
            verdict=verdict,
            rule=rule,
            decisions=decided,
            system2=any(d.system == 2 for d in decided.values()),
            policy_version=policy.version,
        )


def _shadow_verdict(decision: Decision, violation: str, from_incumbent: bool) -> Decision:
    """A shadow check's verdict: the incumbent's own, System 2's option as a verdict; nobody's denies."""
    if decision.outcome is None:
        return replace(decision, outcome="deny", verdict="deny", escalate=False)
    if from_incumbent:
        verdict = cast(Verdict, decision.outcome) if decision.outcome in ("allow", "review", "deny") else "deny"
    else:
        verdict = "deny" if decision.outcome == violation else "allow"
    return replace(decision, outcome=verdict, verdict=verdict)


def _check_state(item: str | ToolCall | Mapping[str, Any], context: Sequence[BaseMessage], task: CheckTask) -> State:
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


def _read_size(state: State) -> int:
    """The length of the state's text as engines read it: JSON compactly, whitespace runs as one space."""
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return len(" ".join(text.split()))


def _combine(decisions: Mapping[str, Decision]) -> tuple[Verdict, str]:
    """Deny beats review beats allow; the deciding rule is the most certain violator of the worst verdict."""
    rank = {"deny": 2, "review": 1, "allow": 0}
    worst = max(decisions.items(), key=lambda kv: (rank[kv[1].verdict or "deny"], kv[1].confidence))
    return worst[1].verdict or "deny", worst[0]
