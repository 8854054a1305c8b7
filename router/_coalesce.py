"""One engine call for many questions: concurrent calls about the same state are coalesced.

``CoalescingEngine`` wraps a ``DecisionEngine``. A call that finds nothing in flight for that
engine is sent at once, in the caller's own task, exactly as the bare engine would have been
called: nothing waits unless there is something to wait with (and there is no hop through the
event loop). While a call is in flight (the engine is under load), a call about the same state
(the same state, images and read options) as other callers opens, or joins, a short window
(``CoalesceSettings.window_s``); when the window closes, or the batch reaches ``max_questions``,
the engine gets one call carrying the union of the callers' questions. A call asking exactly
what an in-flight call asks (the same state and questions) shares that call's result. Each
caller gets back its own questions' answers and returns at its own deadline: a coalesced call
runs in a task of its own, shielded from any one caller leaving, and is cancelled once every
caller has left. (A call sent at once ends with its own caller; one sharing it then
asks again.) An engine error reaches every caller of that call.

The shared call's budget is the longest of its callers' (they each stop waiting at their own),
and it runs under a request scope with that deadline and the opening caller's tenant. Token usage
is reported to the caller that opened the call, so costs are not counted twice.

In a shared call, two callers naming the same question differently ask it twice, and a caller
whose question has the name of a different question in the batch is sent on its own: names key
trained heads.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from opentelemetry import context as otel_context

from ._answers import Answer, EngineReply, NoAnswer, Usage
from ._coalesce_calls import NO_OPTIONS, Call, Gone, Group, Shared, group_key, question_key
from ._engine import DecisionEngine, ReadOptions, SyncDecide
from ._errors import EngineTimeout
from ._questions import Image, Question, State
from ._settings import CoalesceSettings
from ._timing import Deadline
from ._traced import collecting_call_span, receive_call_span
from ._tracing import enabled, link_current
from ._work import _SCOPE, _Scope, budget_s

__all__ = ["CoalescingEngine"]


class CoalescingEngine:
    """``inner`` with concurrent calls about one state coalesced (see the module docstring).

    Other attributes (``url``, ``examples``, ``model``) are read through to ``inner``.

    Args:
        inner: the engine calls are sent to.
        settings: the window, the batch size and the answer cache; the defaults when omitted.
    """

    def __init__(self, inner: DecisionEngine, settings: CoalesceSettings | None = None) -> None:
        self._init(inner, Shared(settings or CoalesceSettings()), "")

    def _init(self, inner: DecisionEngine, shared: Shared, version: str, real: DecisionEngine | None = None) -> None:
        self.inner = inner
        self._real = real if real is not None else inner
        """The engine itself, whose other attributes this one shows (``inner`` may be a gate in front of it)."""
        self.name = inner.name
        self.limits = inner.limits
        # The learned examples' versions the router records with each decision (``Decision.examples_version``).
        self.examples_versions: Mapping[str, str] = getattr(inner, "examples_versions", None) or {}
        self._shared = shared
        self._version = version
        self._prefix = (inner.name, str(getattr(self._real, "model", "") or ""), version)

    def __getattr__(self, name: str) -> Any:
        if name == "_real":  # not set yet: no recursion through the lookup below
            raise AttributeError(name)
        return getattr(self._real, name)

    def _view(self, inner: DecisionEngine, version: str) -> CoalescingEngine:
        view = object.__new__(CoalescingEngine)
        view._init(inner, self._shared, version, self._real)
        return view

    def via(self, inner: DecisionEngine) -> CoalescingEngine:
        """The same coalescing, with the calls it sends going through ``inner`` (say, an admission gate)."""
        return self._view(inner, self._version)

    def for_policy(self, version: str) -> CoalescingEngine:
        """The view whose cached answers belong to policy ``version``; this engine when the cache is off."""
        shared = self._shared
        if shared.cache is None:
            return self
        view = shared.views.get(version)
        if view is None:
            if len(shared.views) >= 8:  # versions before the last few reloads are not asked any more
                shared.views.clear()
            view = shared.views[version] = self._view(self._real, version)
        return view

    @property
    def calls_sent(self) -> int:
        """Engine calls sent so far, by every view of this engine."""
        return self._shared.calls_sent

    async def decide(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply:
        """Answer every question about ``state``, sharing an engine call with other callers when one is due."""
        shared = self._shared
        timeout = budget_s(options.timeout_s if options is not None else None)
        if shared.running == 0 and not shared.pending and shared.cache is None:
            # Nothing to join and nobody to wait for: the call goes out now, keys computed only if
            # a later caller needs them.
            return await self._inline(state, questions, images, options, timeout, keyed=True)
        while True:
            try:
                return await self._coalesced(state, questions, images, options, timeout)
            except Gone:
                continue  # the call this one shared ended with its only other caller: ask again

    def decide_sync(
        self,
        state: State,
        questions: Mapping[str, Question],
        *,
        images: Sequence[Image] = (),
        options: ReadOptions | None = None,
    ) -> EngineReply | None:
        """The engine's own ``decide_sync`` while there is nothing here to share; else ``None``.

        A sync caller blocks its thread, so it cannot wait in a window for others: with nothing in
        flight or queued (and no answer cache) it asks the engine from its own thread, as a bare
        engine is asked; otherwise it gets ``None`` and awaits ``decide``, which coalesces.
        """
        shared = self._shared
        sync: SyncDecide | None = getattr(self.inner, "decide_sync", None)
        if sync is None or shared.running or shared.pending or shared.cache is not None:
            return None
        reply = sync(state, questions, images=images, options=options)
        if reply is not None:
            shared.calls_sent += 1  # a metric: a lost increment between threads costs nothing
        return reply

    async def _inline(
        self,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],
        options: ReadOptions | None,
        timeout: float | None,
        *,
        keyed: bool,
    ) -> EngineReply:
        """Call the engine in the caller's own task, as a bare engine is called; others may share the result.

        No task of its own, so no hop through the event loop; the price is that the call ends if
        its caller leaves, and then any caller sharing it asks again (``Gone``).
        """
        shared = self._shared
        call = Call(self.inner, state, questions, images, options, self._prefix)
        call.ends.append(None if timeout is None else time.monotonic() + timeout)
        call.inline = True
        shared.running += 1
        shared.calls_sent += 1
        if keyed:
            shared.unkeyed.add(call)
        try:
            if enabled():
                with collecting_call_span(call.took_span):
                    reply = await self.inner.decide(state, questions, images=images, options=options)
            else:
                reply = await self.inner.decide(state, questions, images=images, options=options)
        except BaseException as exc:
            self._settle(call, None, exc)
            raise
        self._settle(call, reply, None)
        return reply

    def _settle(self, call: Call, reply: EngineReply | None, error: BaseException | None) -> None:
        """An inline call ended: hand its outcome to whoever shares it."""
        shared = self._shared
        shared.running -= 1
        shared.unkeyed.discard(call)
        if call.identity is not None and shared.identical.get(call.identity) is call:
            del shared.identical[call.identity]
        future = call.future
        if future is None or future.done():
            return
        if reply is not None and call.members:
            future.set_result(reply)
        elif isinstance(error, Exception) and call.members:
            future.set_exception(error)
        else:
            future.cancel()

    async def _coalesced(
        self,
        state: State,
        questions: Mapping[str, Question],
        images: Sequence[Image],
        options: ReadOptions | None,
        timeout: float | None,
    ) -> EngineReply:
        shared = self._shared
        end = None if timeout is None else time.monotonic() + timeout
        group = group_key(state, images, options)
        if group is None:
            return await self._inline(state, questions, images, options, timeout, keyed=False)
        violations = (options.violations if options is not None else None) or {}
        qkeys = {n: question_key(q, violations.get(n)) for n, q in questions.items()}
        cached: dict[str, Answer] = {}
        if shared.cache is not None:
            for n, key in qkeys.items():
                hit = shared.cache.get((*self._prefix, group, key))
                if hit is not None:
                    cached[n] = hit if hit.question == n else replace(hit, question=n)
            if len(cached) == len(questions):
                model = next(iter(cached.values())).model
                return EngineReply(
                    answers={n: cached[n] for n in questions}, engine=self.name, model=model, latency_ms=0.0
                )
        ask = {n: q for n, q in questions.items() if n not in cached} if cached else questions
        self._promote()
        identity = (group, frozenset((n, qkeys[n]) for n in ask))
        same = shared.identical.get(identity)
        if same is not None and (same.end is None or (end is not None and end <= same.end)):
            reply = await self._wait(same, ask, timeout, opener=False)
        else:
            call, opener = self._join(group, state, ask, qkeys, violations, images, options, end)
            reply = await self._wait(call, ask, timeout, opener=opener)
        if not cached:
            return reply
        answers: dict[str, Answer | NoAnswer] = {n: cached[n] if n in cached else reply.answers[n] for n in questions}
        return replace(reply, answers=answers)

    def _join(
        self,
        group: Group,
        state: State,
        ask: Mapping[str, Question],
        qkeys: Mapping[str, tuple[str, str | None]],
        violations: Mapping[str, str],
        images: Sequence[Image],
        options: ReadOptions | None,
        end: float | None,
    ) -> tuple[Call, bool]:
        """The call these questions go out with, and whether this caller opened it."""
        shared = self._shared
        cap = min(shared.settings.max_questions, self.limits.max_questions or shared.settings.max_questions)
        call = shared.pending.get(group)
        if call is not None:
            if any(n in call.qkeys and call.qkeys[n] != qkeys[n] for n in ask):
                lone = self._pending(group, state, ask, qkeys, violations, images, options, end, register=False)
                self._flush(lone)
                return lone, True
            new = [n for n in ask if n not in call.qkeys]
            if len(call.qkeys) + len(new) <= cap:
                self._add(call, ask, qkeys, violations, new, end)
                if len(call.qkeys) >= cap:
                    self._flush(call)
                return call, False
            self._flush(call)
        call = self._pending(group, state, ask, qkeys, violations, images, options, end, register=True)
        if len(call.qkeys) >= cap or not shared.running:
            self._flush(call)  # full already, or the engine went idle: no one left to wait with
        return call, True

    def _pending(
        self,
        group: Group,
        state: State,
        ask: Mapping[str, Question],
        qkeys: Mapping[str, tuple[str, str | None]],
        violations: Mapping[str, str],
        images: Sequence[Image],
        options: ReadOptions | None,
        end: float | None,
        *,
        register: bool,
    ) -> Call:
        call = Call(self.inner, state, {}, images, options, self._prefix)
        call.group = group
        call.questions = {}
        self._add(call, ask, qkeys, violations, list(ask), end)
        loop = asyncio.get_running_loop()
        call.future = loop.create_future()
        if register:
            self._shared.pending[group] = call
            window = self._shared.settings.window_s
            call.handle = (
                loop.call_later(window, self._flush, call) if window > 0 else loop.call_soon(self._flush, call)
            )
        return call

    @staticmethod
    def _add(
        call: Call,
        ask: Mapping[str, Question],
        qkeys: Mapping[str, tuple[str, str | None]],
        violations: Mapping[str, str],
        new: Sequence[str],
        end: float | None,
    ) -> None:
        questions = dict(call.questions)
        for n in new:
            questions[n] = ask[n]
            call.qkeys[n] = qkeys[n]
            if n in violations:
                call.violations[n] = violations[n]
        call.questions = questions
        call.ends.append(end)

    def _flush(self, call: Call) -> None:
        shared = self._shared
        if call.group is not None and shared.pending.get(call.group) is call:
            del shared.pending[call.group]
        if call.handle is not None:
            call.handle.cancel()
            call.handle = None
        if call.task is not None or (call.future is not None and call.future.done()):
            return  # sent already, or every caller left before it was
        self._start(call)

    def _start(self, call: Call) -> None:
        """Send a coalesced call in a task of its own, so no one caller's leaving ends it."""
        shared = self._shared
        opts = call.options or NO_OPTIONS
        end = call.end
        budget = None if end is None else max(0.0, end - time.monotonic())
        opts = replace(opts, timeout_s=budget, violations=dict(call.violations) or None)
        context = contextvars.copy_context()
        # The opener's scope would stop the shared work at the opener's deadline; the longest
        # caller's is the one that matters (each caller stops waiting at its own).
        deadline = Deadline(budget) if budget is not None else None
        context.run(_SCOPE.set, _Scope(deadline=deadline, tenant=call.tenant))
        if enabled():
            # The call's span goes in the trace of the caller that opened it, whoever's arrival sent it.
            context.run(otel_context.attach, call.otel)
            context.run(receive_call_span, call.took_span)
        call.task = asyncio.get_running_loop().create_task(
            call.engine.decide(call.state, call.questions, images=call.images, options=opts), context=context
        )
        if call.group is not None:
            call.identity = (call.group, frozenset(call.qkeys.items()))
            shared.identical[call.identity] = call
        shared.running += 1
        shared.calls_sent += 1
        call.task.add_done_callback(lambda task: self._done(call, task))

    def _promote(self) -> None:
        """Give the calls sent on the fast path their keys, so identical calls can find them."""
        shared = self._shared
        for call in shared.unkeyed:
            group = group_key(call.state, call.images, call.options)
            if group is None:
                continue
            call.future = asyncio.get_running_loop().create_future()
            violations = (call.options.violations if call.options is not None else None) or {}
            call.group = group
            call.qkeys = {n: question_key(q, violations.get(n)) for n, q in call.questions.items()}
            call.identity = (group, frozenset(call.qkeys.items()))
            shared.identical.setdefault(call.identity, call)
        shared.unkeyed.clear()

    def _done(self, call: Call, task: asyncio.Task[EngineReply]) -> None:
        shared = self._shared
        shared.running -= 1
        if call.identity is not None and shared.identical.get(call.identity) is call:
            del shared.identical[call.identity]
        future = call.future
        if task.cancelled():
            if future is not None:
                future.cancel()
            return
        error = task.exception()  # retrieved here, so an abandoned call logs nothing
        if future is not None and not future.done():
            if call.members == 0:
                future.cancel()
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result(task.result())
        if error is None and shared.cache is not None and call.group is not None:
            for n, answer in task.result().answers.items():
                if isinstance(answer, Answer) and n in call.qkeys:
                    shared.cache.put((*call.prefix, call.group, call.qkeys[n]), answer)

    async def _wait(
        self, call: Call, names: Mapping[str, Question], timeout: float | None, *, opener: bool
    ) -> EngineReply:
        future = call.future
        assert future is not None
        call.members += 1
        try:
            if timeout is None:
                reply = await asyncio.shield(future)
            else:
                async with asyncio.timeout(timeout):
                    reply = await asyncio.shield(future)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if future.cancelled() and task is not None and not task.cancelling():
                raise Gone from None  # the call was cancelled under us, not this caller
            raise
        except TimeoutError:
            shown = f"{timeout:g} s" if timeout is not None else "its deadline"
            raise EngineTimeout(f"no answer within {shown}", engine=self.name) from None
        finally:
            call.members -= 1
            if call.members == 0 and not future.done():
                self._abandon(call)
        if not opener:
            link_current(call.span)  # this caller's span, to the call another caller's trace holds
        if opener and len(names) == len(reply.answers):
            return reply
        return EngineReply(
            answers={n: reply.answers[n] for n in names},
            engine=reply.engine,
            model=reply.model,
            latency_ms=reply.latency_ms,
            usage=reply.usage if opener else Usage(),
        )

    def _abandon(self, call: Call) -> None:
        """Every caller has left: stop the call, or never send it."""
        shared = self._shared
        if call.task is not None:
            call.task.cancel()
            return
        if call.inline:
            return  # its own caller is still in it; it ends with that caller
        if call.group is not None and shared.pending.get(call.group) is call:
            del shared.pending[call.group]
        if call.handle is not None:
            call.handle.cancel()
            call.handle = None
        if call.future is not None:
            call.future.cancel()

    async def aclose(self) -> None:
        await self.inner.aclose()
