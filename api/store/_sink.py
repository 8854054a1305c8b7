"""The router's ``DecisionSink`` for one tenant: what ``DecisionStore.sink`` hands out.

It records through the store's one ``DecisionWriter``, committed before ``record`` returns (group
commit) or, for write-behind, queued. ``ReviewingSink`` also opens the reviews of a graph's policy
gate in the review queue (``fastslow.router.ReviewRecorder``), committed before ``open_review``
returns, whatever the sink's decisions do: the decision a review is about may still be queued then,
which is why ``reviews.decision_id`` is no foreign key.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence

from fastslow.router import Decision, PendingReview, State

from ._reviews import ReviewDraft
from ._values import Review
from ._writer import DecisionWriter

__all__ = ["ReviewingSink", "TenantSink"]


class TenantSink:
    """The router's ``DecisionSink`` for one tenant."""

    def __init__(
        self, writer: DecisionWriter, tenant: str, store_state: Callable[[str], bool] | bool, write_behind: bool
    ) -> None:
        self._writer = writer
        self._tenant = tenant
        self._store_state = store_state
        self._write_behind = write_behind

    def _keeps_state(self, decisions: Iterable[Decision]) -> bool:
        if callable(self._store_state):
            return all(self._store_state(d.task) for d in decisions)
        return bool(self._store_state)

    async def record(self, decision: Decision, *, state: State) -> None:
        await self.record_many((decision,), state=state)

    def record_from_thread(self, decisions: Sequence[Decision], *, state: State) -> bool:
        """Queue ``decisions`` from a sync caller's thread (``DecisionWriter.record_from_thread``).

        Only what ``record_many`` would not wait for: ``False`` for a durable sink and for System-2
        answers, which are committed before the router returns.
        """
        if not self._write_behind or any(d.system == 2 for d in decisions):
            return False
        return self._writer.record_from_thread(
            decisions, tenant=self._tenant, state=state, store_state=self._keeps_state(decisions)
        )

    async def record_many(self, decisions: Sequence[Decision], *, state: State) -> None:
        """All of one call's decisions in one transaction (one commit instead of several)."""
        # A System-2 answer cost a frontier model call, next to which its commit is free, and what
        # learns from it (``Learner.sink``) needs its row in the log: it is never left behind.
        durable = not self._write_behind or any(d.system == 2 for d in decisions)
        await self._writer.record(
            decisions, tenant=self._tenant, state=state, store_state=self._keeps_state(decisions), durable=durable
        )


class ReviewingSink(TenantSink):
    """A ``TenantSink`` that is also a ``ReviewRecorder``: a graph's gate opens its reviews in the queue."""

    def __init__(
        self,
        writer: DecisionWriter,
        tenant: str,
        store_state: Callable[[str], bool] | bool,
        write_behind: bool,
        *,
        open_review: Callable[[ReviewDraft], Awaitable[Review]],
    ) -> None:
        super().__init__(writer, tenant, store_state, write_behind)
        self._open_review = open_review

    async def open_review(self, pending: PendingReview) -> str:
        """Open ``pending`` in this tenant's review queue; its id, once committed."""
        draft = ReviewDraft(
            tenant=self._tenant,
            decision_id=pending.decision_id,
            source=pending.source,
            task=pending.task,
            rule=pending.rule,
            subject=pending.subject,
            probabilities=pending.probabilities,
            probability=pending.probability,
            policy_version=pending.policy_version,
            thread_id=pending.thread_id,
            tool_call_id=pending.tool_call_id,
        )
        review = await self._open_review(draft)
        return review.id
