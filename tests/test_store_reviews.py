"""The review queue in the decision log, on SQLite and PostgreSQL: opening, the queue's order, settling
(two at once: one wins), expiry, and the outbox event each of them writes."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from fastslow.api.store import DecisionStore, ReviewDraft
from fastslow.api.store._models import ReviewEventRow
from fastslow.router import PendingReview, ReviewRecorder

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)


def _draft(p: float, *, tenant: str = "acme", **changes: Any) -> ReviewDraft:
    fields: dict[str, Any] = {
        "tenant": tenant,
        "decision_id": uuid.uuid4().hex,
        "source": "api",
        "task": "tool_safety",
        "rule": "destructive_action",
        "subject": {"tool_call": {"name": "shell", "args": {"command": "<b>rm</b> -rf /"}}},
        "probabilities": {"destructive_action": p, "data_exfiltration": 0.01},
        "probability": p,
        "policy_version": "sha256:v1",
    }
    return ReviewDraft(**{**fields, **changes})


async def _events(store: DecisionStore, review_id: str) -> list[str]:
    sessions = async_sessionmaker(store.engine)
    async with sessions() as session:
        rows = await session.scalars(
            select(ReviewEventRow.event)
            .where(ReviewEventRow.review_id == review_id)
            .order_by(ReviewEventRow.created_at)
        )
        return list(rows)


async def test_the_queue_shows_pending_reviews_most_uncertain_first_and_only_the_tenants_own(
    store: DecisionStore,
) -> None:
    opened = {p: await store.open_review(_draft(p), ttl_s=3600) for p in (0.9, 0.52, 0.3, 0.45)}
    other = await store.open_review(_draft(0.5, tenant="globex"), ttl_s=3600)
    queue = await store.reviews(tenant="acme", status="pending")
    assert [r.probability for r in queue] == [0.52, 0.45, 0.3, 0.9]
    assert other.id not in {r.id for r in queue}
    assert await store.get_review(other.id, tenant="acme") is None
    review = await store.get_review(opened[0.52].id, tenant="acme")
    assert review is not None and review.subject == {
        "tool_call": {"name": "shell", "args": {"command": "<b>rm</b> -rf /"}}
    }
    assert review.probabilities == {"destructive_action": 0.52, "data_exfiltration": 0.01}
    assert await _events(store, review.id) == ["review.opened"]
    second_page = await store.reviews(tenant="acme", status="pending", limit=2, offset=2)
    assert [r.probability for r in second_page] == [0.3, 0.9]


async def test_of_two_settlements_at_once_one_wins_and_the_other_reads_it_back(store: DecisionStore) -> None:
    review = await store.open_review(_draft(0.5), ttl_s=3600)
    allow, deny = await asyncio.gather(
        store.settle_review(review.id, tenant="acme", verdict="allow", by="key-a", note="asked for it"),
        store.settle_review(review.id, tenant="acme", verdict="deny", by="key-b"),
    )
    assert allow is not None and deny is not None
    assert sorted([allow.now_settled, deny.now_settled]) == [False, True]
    winner = allow if allow.now_settled else deny
    loser = deny if winner is allow else allow
    assert loser.review == winner.review  # the first settlement, as it was committed
    assert winner.review.status in ("allowed", "denied") and winner.review.settled_at is not None
    assert await _events(store, review.id) == ["review.opened", "review.settled"]  # one settlement event
    assert await store.reviews(tenant="acme", status="pending") == []
    assert await store.settle_review(review.id, tenant="globex", verdict="deny", by="key-c") is None


async def test_a_due_review_expires_with_the_configured_verdict_once(store: DecisionStore) -> None:
    due = await store.open_review(_draft(0.5), ttl_s=0.001)
    later = await store.open_review(_draft(0.6), ttl_s=3600)
    await asyncio.sleep(0.01)
    assert await store.expire_reviews(verdict="deny") == 1
    assert await store.expire_reviews(verdict="deny") == 0  # a second sweep (another replica) finds none
    expired = await store.get_review(due.id, tenant="acme")
    assert expired is not None
    assert (expired.status, expired.verdict, expired.settled_by) == ("expired", "deny", "expiry")
    assert await _events(store, due.id) == ["review.opened", "review.expired"]
    # Settling it after is no settlement: the caller gets the expiry back.
    settled = await store.settle_review(due.id, tenant="acme", verdict="allow", by="key-a")
    assert settled is not None and not settled.now_settled and settled.review.status == "expired"
    [pending] = await store.reviews(tenant="acme", status="pending")
    assert pending.id == later.id


async def test_the_graph_sink_opens_reviews_and_a_sink_without_reviews_opens_none(store: DecisionStore) -> None:
    sink = store.sink("acme", write_behind=True, review_ttl_s=60)
    assert isinstance(sink, ReviewRecorder)
    assert not isinstance(store.sink("acme", write_behind=True, review_ttl_s=None), ReviewRecorder)
    pending = PendingReview(
        decision_id=uuid.uuid4().hex,
        task="tools",
        rule="destructive",
        subject={"tool_call": {"name": "shell", "args": {"command": "truncate log"}}},
        probabilities={"destructive": 0.5},
        probability=0.5,
        policy_version="sha256:test",
        source="agent",
        thread_id="thread-1",
        tool_call_id="call-1",
    )
    review_id = await sink.open_review(pending)
    review = await store.get_review(review_id, tenant="acme")
    assert review is not None
    assert (review.source, review.thread_id, review.tool_call_id, review.status) == (
        "agent",
        "thread-1",
        "call-1",
        "pending",
    )
    assert 59 < (review.expires_at - review.created_at).total_seconds() <= 60
