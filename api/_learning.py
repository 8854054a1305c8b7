"""Learning from escalations: System 2's answers and recorded outcomes become examples for System 1.

A task opts in with ``learn:`` (route and classification tasks; its ``store_state`` must be true,
since an example is the decided text). Three moments:

* a decision System 2 answered is recorded: its text and System 2's option are learned
  (``Learner.sink`` wraps the decision log's sink, so it happens after the commit);
* an outcome is recorded: a label is learned (it outranks System 2), and whatever was learned from
  a decision the outcome says was wrong is withdrawn;
* each replica reads the learned examples from the database every ``learning.poll_s`` seconds
  (``Learner.running``) and, when a retrain is due, trains new engines in a worker thread while the
  old ones keep serving; the new ones take over in one step (``EnginePool.train``).

The database is the only shared state: replicas learn into it and train from it, and name the
same set by the same version (``LearnedSet``), which each decision records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from fastslow.api.store import DecisionStore, LearnOutcome, LearnSource, StoredDecision, StoredOutcome
from fastslow.engines import EnginePool, LearnedExampleText, LearnedSet
from fastslow.router import ClassifyTask, Decision, DecisionSink, PolicySet, RouteTask, State, Task, polling

__all__ = ["Learner", "example_text", "question_name"]

log = logging.getLogger("fastslow.learning")


def question_name(task: Task, question: str) -> str:
    """The name engines are asked a decision's question by: the task's, or ``task.question``."""
    return task.name if isinstance(task, RouteTask) else f"{task.name}.{question}"


def example_text(task: Task, state: State) -> str:
    """What an example learned from ``state`` reads: a route's current user turn, else the state as engines read it.

    Whitespace runs become one space, as engines read every text.
    """
    if isinstance(task, RouteTask) and isinstance(state, dict) and isinstance(state.get("message"), str):
        text = str(state["message"])
    elif isinstance(state, str):
        text = state
    else:
        text = json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return " ".join(text.split())


@dataclass(frozen=True, slots=True, kw_only=True)
class _Due:
    due: bool
    why: str


class Learner:
    """One process's side of learning from escalations.

    Args:
        store: the decision log, which holds the learned examples.
        engines: the pool whose engines learn (trained anew when a retrain is due).
        policies: the policy in force (``PolicyStore.current``).
        max_wait_s: a change smaller than a task's ``retrain_after`` is trained on after this long.
        observe: called with (task, what became of an offered example), for metrics.
        on_retrain: called after each retrain, for metrics.

    Example:
        ```python
        learner = Learner(store, runtime.engines, lambda: runtime.store.current)
        router = runtime.router.with_sink(learner.sink(store.sink("acme", store_state=True), tenant="acme"))
        async with learner.running(poll_s=5.0):
            ...
        ```
    """

    def __init__(
        self,
        store: DecisionStore,
        engines: EnginePool,
        policies: Callable[[], PolicySet],
        *,
        max_wait_s: float = 60.0,
        observe: Callable[[str, LearnOutcome], None] | None = None,
        on_retrain: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._engines = engines
        self._policies = policies
        self._max_wait_s = max_wait_s
        self._observe = observe
        self._on_retrain = on_retrain
        self._pending_since: float | None = None
        self._training = asyncio.Lock()
        self.retrains = 0
        """Retrains this process did (for metrics and tests)."""

    def _learn_config(self, name: str, tenant: str) -> tuple[Task, int, int, frozenset[str]] | None:
        task = self._policies().tasks.get(name)
        if task is None or task.learn is None or not isinstance(task, (RouteTask, ClassifyTask)):
            return None
        learn = task.learn
        if learn.tenants is not None and tenant not in learn.tenants:
            return None
        return task, learn.max_examples, learn.max_text_chars, frozenset(learn.sources)

    def sink(self, inner: DecisionSink, *, tenant: str) -> DecisionSink:
        """``inner`` (the decision log's sink for ``tenant``), learning from each System-2 answer it records."""
        return _LearningSink(inner, self, tenant)

    async def learn_from(self, decision: Decision, state: State, *, tenant: str) -> LearnOutcome | None:
        """Learn System 2's answer to an escalated question; ``None`` when there is nothing to learn."""
        config = self._learn_config(decision.task, tenant)
        if config is None or decision.system != 2 or decision.outcome is None or decision.model == "incumbent":
            return None
        task, max_examples, max_chars, sources = config
        text = example_text(task, state)
        if "system2" not in sources or not text or len(text) > max_chars:
            return None
        return await self._add(
            task, decision.question, decision.outcome, text, "system2", tenant, decision.id, max_examples
        )

    async def on_outcome(self, decision: StoredDecision, outcome: StoredOutcome) -> LearnOutcome | None:
        """Withdraw what ``decision`` taught if ``outcome`` says it was wrong; learn the outcome's label.

        Returns what learning the label did, ``None`` when it was not learned.
        """
        wrong = outcome.system2_correct is False or (outcome.label is not None and outcome.label != decision.outcome)
        if wrong:
            said = f"label {outcome.label!r}" if outcome.label is not None else "System 2 was wrong"
            withdrawn = await self._store.learned.withdraw_from(
                decision.id,
                why=f"outcome {outcome.id} of decision {decision.id}: {said}",
                keep_option=outcome.label,
            )
            if withdrawn:
                log.info("withdrew %d learned example(s) of decision %s: %s", withdrawn, decision.id, said)
        config = self._learn_config(decision.task, decision.tenant)
        if config is None or outcome.label is None or decision.state_text is None or decision.verdict is not None:
            return None
        task, max_examples, max_chars, sources = config
        text = example_text(task, json.loads(decision.state_text))
        if "outcomes" not in sources or not text or len(text) > max_chars:
            return None
        return await self._add(
            task, decision.question, outcome.label, text, "outcome", decision.tenant, decision.id, max_examples
        )

    async def _add(
        self,
        task: Task,
        question: str,
        option: str,
        text: str,
        source: LearnSource,
        tenant: str,
        decision_id: str,
        max_examples: int,
    ) -> LearnOutcome:
        result = await self._store.learned.add(
            task=task.name,
            question=question_name(task, question),
            option=option,
            text=text,
            source=source,
            tenant=tenant,
            decision_id=decision_id,
            max_examples=max_examples,
        )
        if self._observe is not None:
            self._observe(task.name, result)
        return result

    async def read(self) -> LearnedSet:
        """The learned examples in force for the policy's learning tasks, as one versioned set."""
        policy = self._policies()
        tasks = [name for name, task in policy.tasks.items() if task.learn is not None]
        rows = await self._store.learned.list(tasks) if tasks else []
        texts = (LearnedExampleText(task=r.task, question=r.question, option=r.option, text=r.text) for r in rows)
        return LearnedSet.of(texts, tasks=tasks)

    def _due(self, policy: PolicySet, trained: LearnedSet, new: LearnedSet) -> _Due:
        def items(s: LearnedSet) -> set[tuple[str, str, str]]:
            return {(q, o, t) for q, by in s.examples.items() for o, ts in by.items() for t in ts}

        old_items, new_items = items(trained), items(new)
        if old_items - new_items:
            return _Due(due=True, why=f"{len(old_items - new_items)} example(s) withdrawn or relabelled")
        for name, version in new.versions.items():
            task = policy.tasks.get(name)
            if task is None or task.learn is None:
                continue
            added = new.count(name) - trained.count(name)
            if version != trained.versions.get(name) and added >= task.learn.retrain_after:
                return _Due(due=True, why=f"task {name!r}: {added} new example(s)")
        if not trained.versions and new.versions:
            return _Due(due=True, why="first training with the learned examples")
        now = time.monotonic()
        if self._pending_since is None:
            self._pending_since = now
        if now - self._pending_since >= self._max_wait_s:
            return _Due(due=True, why=f"changes waiting {now - self._pending_since:.0f} s")
        return _Due(due=False, why="")

    async def refresh(self, *, force: bool = False) -> bool:
        """Read the learned examples and, when a retrain is due (or ``force``), train and swap; whether it did.

        Training runs in a worker thread; requests keep the engines in force until it ends.
        """
        async with self._training:
            policy = self._policies()
            new = await self.read()
            trained = self._engines.learned
            if new.key == trained.key or not (new.examples or trained.examples):
                self._pending_since = None
                return False
            due = _Due(due=True, why="asked") if force else self._due(policy, trained, new)
            if not due.due:
                return False
            started = time.perf_counter()
            await asyncio.to_thread(self._engines.train, policy, new)
            self._pending_since = None
            self.retrains += 1
            if self._on_retrain is not None:
                self._on_retrain()
            log.info(
                "retrained on learned examples (%s): %s in %.1f s",
                due.why,
                ", ".join(f"{t} {v}" for t, v in new.versions.items()),
                time.perf_counter() - started,
            )
            return True

    @contextlib.asynccontextmanager
    async def running(self, *, poll_s: float = 5.0) -> AsyncIterator[Learner]:
        """Refresh every ``poll_s`` seconds in the background while the block runs (first at once)."""
        # A database blip must not end learning for good: a failed refresh is logged and polling goes on.
        failure = "reading or training on the learned examples failed"
        async with polling(self.refresh, poll_s, name="fastslow-learning", log=log, failure=failure, at_once=True):
            yield self


class _LearningSink:
    """A decision sink that learns from what System 2 answered, once the decision is recorded."""

    def __init__(self, inner: DecisionSink, learner: Learner, tenant: str) -> None:
        self._inner = inner
        self._learner = learner
        self._tenant = tenant

    async def _learn(self, decisions: Sequence[Decision], state: State) -> None:
        for decision in decisions:
            if decision.system != 2:
                continue
            try:
                await self._learner.learn_from(decision, state, tenant=self._tenant)
            except Exception:  # the decision is recorded and answered; learning from it is best effort
                log.exception("learning from decision %s failed", decision.id)

    async def record(self, decision: Decision, *, state: State) -> None:
        await self._inner.record(decision, state=state)
        await self._learn([decision], state)

    async def record_many(self, decisions: Sequence[Decision], *, state: State) -> None:
        record_many = getattr(self._inner, "record_many", None)
        if record_many is not None:
            await record_many(decisions, state=state)
        else:
            for decision in decisions:
                await self._inner.record(decision, state=state)
        await self._learn(decisions, state)
