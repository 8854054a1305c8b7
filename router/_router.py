"""The Router: ask System 1, decide by policy, escalate to System 2, record.

It holds no decision state of its own: the policy comes from a provider (hot-reloaded by
``policies``), engines from a source, and every decision goes to a sink (the decision log), so any
number of replicas can run side by side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache, partial
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from langchain_core.messages import BaseMessage, MessageLikeRepresentation
from opentelemetry import trace

from ._answers import Answer, NoAnswer
from ._breaker import failure_log_level
from ._chat import THOUGHT_TASK, ChatEngine, ToolCall
from ._checks import check_state, combine, context_state, more_suspicious, read_size, shadow_verdict, unread
from ._decisions import (
    Decision,
    EngineFailure,
    Verdict,
    audited,
    decide_answer,
    decide_check,
    escalated_by_system2,
)
from ._engine import DecisionEngine, SyncDecide
from ._errors import ConfigError, EngineError, EngineTimeout, failure_summary
from ._escalate import ask_system2, state_text
from ._questions import Question, State
from ._sync import NOT_NOW, Plan, Step, _NotNow, run_async, run_sync
from ._tasks import CheckTask, ClassifyTask, PolicySet, RouteTask, Rule, Task, TaskCommon
from ._tracing import Attr, annotate_decision, decision_spans, now_ns, operation_span
from ._turns import as_messages, split_turns
from ._work import budget_s

if TYPE_CHECKING:
    from langchain_core.prompt_values import PromptValue

__all__ = ["ChatSource", "CheckResult", "DecisionSink", "EngineSource", "Router"]

log = logging.getLogger("fastslow.router")

T = TypeVar("T")
K = TypeVar("K", bound=Task)
NO_FRONTIER = "no frontier model configured"

Asked: TypeAlias = tuple[Mapping[str, Answer | NoAnswer | EngineFailure], str]
"""The engine's answers, and the learned-examples version it was trained with for the task."""


class EngineSource(Protocol):
    """Gives the System-1 engine for a task, trained on the policy's examples where it learns from them."""

    def engine_for(self, name: str | None, policy: PolicySet) -> DecisionEngine: ...


class ChatSource(Protocol):
    """Gives the System-2 engine for a model reference, or ``None`` when none is configured."""

    def chat_for(self, ref: str | None) -> ChatEngine | None: ...


Incumbent: TypeAlias = Callable[[str], Awaitable[str | None]]
"""What decides a task in shadow mode instead of System 2: question name -> option (or verdict)."""


class DecisionSink(Protocol):
    """Where decisions are recorded (the decision log).

    A sink may also have ``record_many(decisions, *, state)`` (one commit for a call's decisions)
    and ``record_from_thread(decisions, *, state) -> bool``: queue them from a thread outside any
    event loop without waiting, ``False`` when it cannot (the sync router then awaits ``record``).
    """

    async def record(self, decision: Decision, *, state: State) -> None: ...


QueueFromThread: TypeAlias = Callable[..., bool]
"""A sink's ``record_from_thread``."""


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
        trace_state_text: bool = False,
    ) -> None:
        self._policies = policies
        self._engines = engines
        self._chats = chats
        self._sink = sink
        self._trace_state_text = trace_state_text
        """Put the state text on decision spans (``Settings.tracing.state_text``); thoughts never go there."""

    def with_sink(self, sink: DecisionSink | None) -> Router:
        """The same router recording into ``sink`` (say, the decision log bound to one tenant)."""
        return Router(self._policies, self._engines, self._chats, sink=sink, trace_state_text=self._trace_state_text)

    @property
    def trace_state_text(self) -> bool:
        """Whether decision spans (and LangSmith runs) carry the state text."""
        return self._trace_state_text

    def _shown(self, state: State) -> str | None:
        """The state text for spans when the settings opt in, else ``None``."""
        return state_text(state) if self._trace_state_text else None

    @property
    def policy(self) -> PolicySet:
        return self._policies()

    @property
    def sink(self) -> DecisionSink | None:
        """Where this router records its decisions (``None``: nowhere).

        A policy gate also opens its reviews there when the sink is a ``ReviewRecorder``.
        """
        return self._sink

    def task(self, name: str, kind: type[K]) -> K:
        """The task ``name`` of the policy in force, which must be a ``kind`` (say ``RouteTask``).

        Raises:
            ConfigError: the policy has no such task, or it is of another kind (naming the key).
        """
        return self._task(self.policy, name, kind)

    def _task(self, policy: PolicySet, name: str, kind: type[K]) -> K:
        task = policy.tasks.get(name)
        if task is None:
            raise ConfigError(f"no task {name!r} in the policy; tasks: {', '.join(policy.tasks)}", key=f"tasks.{name}")
        if not isinstance(task, kind):
            raise ConfigError(f"task {name!r} is a {task.kind} task, not a {kind.__name__}", key=f"tasks.{name}.kind")
        return task

    def _ask(
        self,
        task: TaskCommon,
        policy: PolicySet,
        state: State,
        questions: Mapping[str, Question],
        *,
        violations: Mapping[str, str] | None = None,
    ) -> Step[Asked]:
        """The engine's answers, and the version of the learned examples it was trained with for ``task``."""
        engine = self._engines.engine_for(task.engine, policy)
        learned: Mapping[str, str] = getattr(engine, "examples_versions", None) or {}
        version = learned.get(task.name, "")
        # The task's budget, cut to what is left of the request's deadline (request_scope).
        timeout = budget_s(task.read.timeout_s)
        options = task.read if timeout == task.read.timeout_s else replace(task.read, timeout_s=timeout)
        if violations:
            options = replace(options, violations=violations)

        async def run() -> Asked:
            try:
                async with asyncio.timeout(timeout):
                    reply = await engine.decide(state, questions, options=options)
            except (TimeoutError, EngineTimeout, EngineError) as exc:
                return _failed(questions, exc), version
            return reply.answers, version

        decide_sync: SyncDecide | None = getattr(engine, "decide_sync", None)
        if decide_sync is None:
            return Step(run)

        def now() -> Asked | _NotNow:
            # The engine bounds a sync call by ``options.timeout_s`` itself: no event loop to cancel it.
            try:
                reply = decide_sync(state, questions, options=options)
            except (EngineTimeout, EngineError) as exc:
                return _failed(questions, exc), version
            return NOT_NOW if reply is None else (reply.answers, version)

        return Step(run, now)

    def system2_for(self, task_name: str) -> tuple[ChatEngine | None, str]:
        """The System-2 engine ``task_name``'s escalations go to now, or ``None`` and why not (readiness).

        Raises:
            ConfigError: the policy has no such task.
        """
        policy = self.policy
        task = policy.tasks.get(task_name)
        if task is None:
            raise ConfigError(f"no task {task_name!r} in the policy", key=f"tasks.{task_name}")
        return self._chat(task, policy)

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

    def _record(self, decisions: Sequence[Decision], state: State) -> Step[None] | None:
        """The step recording ``decisions``, or ``None`` without a sink."""
        sink = self._sink
        if sink is None:
            return None

        async def run() -> None:
            # A check's rules (a classification's questions) belong together: one commit where the
            # sink can batch them, such as the decision log.
            record_many = getattr(sink, "record_many", None)
            if record_many is not None and len(decisions) > 1:
                await record_many(decisions, state=state)
                return
            for decision in decisions:
                await sink.record(decision, state=state)

        queue: QueueFromThread | None = getattr(sink, "record_from_thread", None)
        if queue is None:
            return Step(run)
        return Step(run, lambda: None if queue(decisions, state=state) else NOT_NOW)

    async def route(
        self,
        task_name: str,
        messages: Sequence[MessageLikeRepresentation] | str | PromptValue,
        *,
        previous: str | None = None,
        incumbent: Incumbent | None = None,
    ) -> Decision:
        """Pick a route for the latest user turn; ``previous`` is the route the conversation is on.

        ``messages`` is the conversation in any form LangChain takes (``convert_to_messages``):
        message objects, ``{"role": "user", "content": ...}`` dicts, ``(role, text)`` pairs, a
        ``PromptValue``, or a plain string as one user turn. ``incumbent`` is what decides a task in
        shadow mode (``mode: shadow``) instead of System 2: called with the task's name, it returns
        the route (``None``: it could not say).

        Raises:
            InvalidRequest: ``messages`` (``field`` names it, or the item at fault as
                ``messages.<index>``) is empty, has no user turn, its latest user turn has no text,
                or it is not a conversation. Nothing is decided or recorded then.
            ConfigError: the policy has no such route task.
        """
        with operation_span("route", task_name) as span:
            decision = await run_async(self._route(task_name, messages, previous, incumbent))
            annotate_decision(span, decision)
            return decision

    def route_sync(
        self,
        task_name: str,
        messages: Sequence[MessageLikeRepresentation] | str | PromptValue,
        *,
        previous: str | None = None,
        incumbent: Incumbent | None = None,
    ) -> Decision:
        """``route`` for sync code: the same decision, made in the calling thread where it can be.

        An engine with a sync client (``JevEngine``) is asked from this thread and a write-behind
        decision log only queues, so the common decision never waits on an event loop; System 2, a
        durable commit and engines without a sync path run on a private event loop thread.
        """
        with operation_span("route", task_name) as span:
            decision = run_sync(self._route(task_name, messages, previous, incumbent))
            annotate_decision(span, decision)
            return decision

    def _route(
        self,
        task_name: str,
        messages: Sequence[MessageLikeRepresentation] | str | PromptValue,
        previous: str | None,
        incumbent: Incumbent | None,
    ) -> Plan[Decision]:
        policy = self.policy
        task = self._task(policy, task_name, RouteTask)
        current, earlier = split_turns(messages, task.context_turns)
        # System 2 reads the earlier turns; System 1 only where the task says (see RouteTask.system1_context).
        conversation: State = current if not earlier else {"message": current, "earlier": list(earlier)}
        state = conversation if task.system1_context else current
        questions: dict[str, Question] = {task.name: task.question}
        if task.open_ended is not None:
            questions[f"{task.name}.open_ended"] = task.open_ended.question
        asked: Asked = yield self._ask(task, policy, state, questions)
        answers, learned = asked
        decision = decide_answer(
            task.name,
            answers[task.name],
            thresholds=task.thresholds,
            calibration=task.calibration,
            none_option=task.none_option,
            policy_version=policy.version,
            examples_version=learned,
        )
        if task.mode == "shadow":
            decision = yield self._later(
                self._shadow(decision, task, policy, task.question, conversation, incumbent, task.name)
            )
        else:
            open_ended = answers.get(f"{task.name}.open_ended")
            if task.open_ended is not None and isinstance(open_ended, Answer):
                p = open_ended.probabilities["yes"]
                if p >= task.open_ended.threshold:
                    decision = replace(decision, outcome=None, escalate=True, reason="open_ended", confidence=p)
            decision = self._stick(task, decision, previous)
            failed = decision.reason in ("engine_error", "timeout")
            if decision.escalate and decision.reason != "open_ended" and (not failed or task.on_failure == "escalate"):
                decision = yield self._later(self._escalate(decision, task, policy, task.question, conversation))
            decision = audited(decision, task.audit_rate)
        shown = self._shown(state)
        if shown is not None:
            trace.get_current_span().set_attribute(Attr.STATE_TEXT, shown)
        record = self._record([decision], state)
        if record is not None:
            yield record
        return decision

    @staticmethod
    def _later(coro: Coroutine[Any, Any, T]) -> Step[T]:
        """A step with no sync form: System 2 or the incumbent, awaited (on the loop thread for sync callers)."""
        return Step(lambda: coro)

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
        with operation_span("classify", task_name) as span:
            started = now_ns()
            decisions = await run_async(self._classify(task_name, state, incumbent))
            decision_spans(span, list(decisions.values()), started_ns=started, state_text=self._shown(state))
            return decisions

    def classify_sync(self, task_name: str, state: State, *, incumbent: Incumbent | None = None) -> dict[str, Decision]:
        """``classify`` for sync code, in the calling thread where it can be (as ``route_sync``)."""
        with operation_span("classify", task_name) as span:
            started = now_ns()
            decisions = run_sync(self._classify(task_name, state, incumbent))
            decision_spans(span, list(decisions.values()), started_ns=started, state_text=self._shown(state))
            return decisions

    def _classify(self, task_name: str, state: State, incumbent: Incumbent | None) -> Plan[dict[str, Decision]]:
        policy = self.policy
        task = self._task(policy, task_name, ClassifyTask)
        names = {f"{task.name}.{q}": q for q in task.questions}
        asked: Asked = yield self._ask(task, policy, state, {full: task.questions[q] for full, q in names.items()})
        answers, learned = asked
        decided: dict[str, Decision] = {}
        later: dict[str, Coroutine[Any, Any, Decision]] = {}
        for full, short in names.items():
            decision = decide_answer(
                task.name,
                answers[full],
                thresholds=task.thresholds,
                calibration=task.calibration.for_question(short),
                policy_version=policy.version,
                question=short,
                examples_version=learned,
            )
            question = task.questions[short]
            failed = decision.reason in ("engine_error", "timeout")
            if task.mode == "shadow":
                later[full] = self._shadow(decision, task, policy, question, state, incumbent, short)
            elif decision.escalate and (not failed or task.on_failure == "escalate"):
                later[full] = self._escalate(decision, task, policy, question, state)
            decided[full] = decision
        out: dict[str, Decision] = yield from self._finish(task, names, decided, later, state)
        return out

    async def check(
        self,
        task_name: str,
        item: str | ToolCall | Mapping[str, Any],
        *,
        context: Sequence[MessageLikeRepresentation] | str | PromptValue = (),
        incumbent: Incumbent | None = None,
    ) -> CheckResult:
        """Apply a policy check's rules to a text or a proposed tool call.

        ``context`` is the conversation before it, in any form ``route`` takes its ``messages``
        (a plain string is one user turn). In shadow mode ``incumbent`` (called with each rule's
        name, returning ``allow``, ``review`` or ``deny``) or System 2 judges instead; what nobody
        could judge is denied.

        Raises:
            InvalidRequest: ``context`` (or its item ``context.<index>``) is not a conversation.
        """
        with operation_span("check", task_name) as span:
            started = now_ns()
            result = await run_async(self._check(task_name, item, context, incumbent))
            self._annotate_check(span, result, started, item)
            return result

    def check_sync(
        self,
        task_name: str,
        item: str | ToolCall | Mapping[str, Any],
        *,
        context: Sequence[MessageLikeRepresentation] | str | PromptValue = (),
        incumbent: Incumbent | None = None,
    ) -> CheckResult:
        """``check`` for sync code, in the calling thread where it can be (as ``route_sync``)."""
        with operation_span("check", task_name) as span:
            started = now_ns()
            result = run_sync(self._check(task_name, item, context, incumbent))
            self._annotate_check(span, result, started, item)
            return result

    def _annotate_check(
        self, span: trace.Span, result: CheckResult, started_ns: int, item: str | ToolCall | Mapping[str, Any]
    ) -> None:
        """A check's verdict on its span, and a child span per rule's decision."""
        if not span.is_recording():
            return
        decisions = list(result.decisions.values())
        span.set_attributes(
            {
                Attr.VERDICT: result.verdict,
                Attr.RULE: result.rule,
                Attr.SYSTEM: 2 if result.system2 else 1,
                Attr.POLICY_VERSION: result.policy_version,
                Attr.DECISION_ID: [d.id for d in decisions],
            }
        )
        # The item's text only: a tool call's arguments stay out unless the settings opt in to state text.
        decision_spans(span, decisions, started_ns=started_ns, state_text=self._shown(check_state(item)))

    def _check(
        self,
        task_name: str,
        item: str | ToolCall | Mapping[str, Any],
        conversation: Sequence[MessageLikeRepresentation] | str | PromptValue,
        incumbent: Incumbent | None,
    ) -> Plan[CheckResult]:
        context = as_messages(conversation, "context")
        policy = self.policy
        task = self._task(policy, task_name, CheckTask)
        state = check_state(item)
        names = {f"{task.name}.{r}": r for r in task.rules}
        read_limit = self._engines.engine_for(task.engine, policy).limits.max_read_chars
        state_size = cache(partial(read_size, state))  # measured once, and only if a rule's read is in doubt
        questions = {full: task.rules[r].question for full, r in names.items()}
        violations = {full: task.rules[r].action.violation for full, r in names.items()}
        asked: Asked = yield self._ask(task, policy, state, questions, violations=violations)
        answers: Mapping[str, Answer | NoAnswer | EngineFailure] = asked[0]
        with_context = context_state(state, context) if task.system1_context else None
        if with_context is not None:
            # Only ever stricter: the item alone is judged above, the conversation may add suspicion.
            together: Asked = yield self._ask(task, policy, with_context, questions, violations=violations)
            answers = more_suspicious(answers, together[0], violations)
        decided: dict[str, Decision] = {}
        later: dict[str, Coroutine[Any, Any, Decision]] = {}
        for full, short in names.items():
            rule = task.rules[short]
            decision = decide_check(
                task.name,
                answers[full],
                action=rule.action,
                calibration=task.calibration.for_question(short),
                on_failure=task.on_failure,
                policy_version=policy.version,
                question=short,
            )
            if task.mode == "shadow":
                later[full] = self._shadow_check(decision, task, policy, rule, state, incumbent, short, context)
            elif decision.verdict == "allow" and (detail := unread(answers[full], state_size, read_limit)):
                # System 1 read only the start of the state: what it allowed is not all there is.
                decision = replace(
                    decision, outcome=task.on_oversize, verdict=task.on_oversize, reason="oversize", detail=detail
                )
            elif decision.escalate:
                later[full] = self._escalate_check(decision, task, policy, rule, state, context)
            decided[full] = decision
        out: dict[str, Decision] = yield from self._finish(task, names, decided, later, state)
        verdict, rule_name = combine(out)
        return CheckResult(
            task=task.name,
            verdict=verdict,
            rule=rule_name,
            decisions=out,
            system2=any(d.system == 2 for d in out.values()),
            policy_version=policy.version,
        )

    def _finish(
        self,
        task: TaskCommon,
        names: Mapping[str, str],
        decided: dict[str, Decision],
        later: Mapping[str, Coroutine[Any, Any, Decision]],
        state: State,
    ) -> Plan[dict[str, Decision]]:
        """A classification's or a check's last steps: what needs System 2 (together), the audit, the record."""
        if later:
            settled: dict[str, Decision] = yield self._later(_gather(later))
            decided.update(settled)
        out = {short: audited(decided[full], task.audit_rate) for full, short in names.items()}
        record = self._record(list(out.values()), state)
        if record is not None:
            yield record
        return out

    async def _shadow_check(
        self,
        decision: Decision,
        task: CheckTask,
        policy: PolicySet,
        rule: Rule,
        state: State,
        incumbent: Incumbent | None,
        name: str,
        context: Sequence[BaseMessage],
    ) -> Decision:
        judged = await self._shadow(decision, task, policy, rule.question, state, incumbent, name, context)
        return shadow_verdict(judged, rule.action.violation, incumbent is not None)

    async def _escalate_check(
        self,
        decision: Decision,
        task: CheckTask,
        policy: PolicySet,
        rule: Rule,
        state: State,
        context: Sequence[BaseMessage],
    ) -> Decision:
        escalated = await self._escalate(decision, task, policy, rule.question, state, context)
        if escalated.system != 2:
            # Nobody could judge it: fail closed rather than let the call through.
            return replace(escalated, outcome="deny", verdict="deny", escalate=False)
        verdict: Verdict = "deny" if escalated.outcome == rule.action.violation else "allow"
        return replace(escalated, outcome=verdict, verdict=verdict)


def _failed(questions: Mapping[str, Question], exc: BaseException) -> dict[str, EngineFailure]:
    """Every question's answer when the engine could not answer at all."""
    # The failure's own text (an upstream's error body, an internal URL) goes to the log only: the
    # decision's detail is stored, and returned to API clients.
    # A timeout has no text of its own (asyncio's TimeoutError): say what kind of failure it was.
    log.log(
        failure_log_level(exc), "System 1 could not answer %s: %s", sorted(questions), str(exc) or failure_summary(exc)
    )
    timeout = isinstance(exc, (TimeoutError, EngineTimeout))
    failure = EngineFailure(message=f"System 1 {failure_summary(exc)}", timeout=timeout)
    return dict.fromkeys(questions, failure)


async def _gather(coros: Mapping[str, Coroutine[Any, Any, Decision]]) -> dict[str, Decision]:
    results = await asyncio.gather(*coros.values())
    return dict(zip(coros, results, strict=True))
