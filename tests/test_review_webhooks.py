"""Review webhooks to a real receiver on loopback, on SQLite and PostgreSQL: signed, retried with back-off
until a 2xx, sent once by one of several replicas, given up after the configured tries; and expiry."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from fastslow.api._reviews import ReviewWorker, backoff_s
from fastslow.api.store import DecisionStore, ReviewDraft
from fastslow.api.store._models import ReviewEventRow
from fastslow.router.settings import ReviewSettings, WebhookSettings

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)
from fakes.webhooks import WebhookReceiver, signed_by, webhook_receiver

SECRET = "whsec-test-0123456789"


def _draft(tenant: str = "acme") -> ReviewDraft:
    return ReviewDraft(
        tenant=tenant,
        decision_id=uuid.uuid4().hex,
        source="api",
        task="tool_safety",
        rule="destructive_action",
        subject={"tool_call": {"name": "run_sql", "args": {"query": "UPDATE users SET plan = 'free'"}}},
        probabilities={"destructive_action": 0.4},
        probability=0.4,
        policy_version="sha256:v1",
    )


@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    with webhook_receiver() as receiver:
        yield receiver


def _settings(hook: WebhookReceiver, **changes: Any) -> ReviewSettings:
    webhooks = {"acme": WebhookSettings(url=hook.url, secret=SecretStr(SECRET))}
    return ReviewSettings(webhooks=webhooks, webhook_timeout_s=5.0, **changes)


async def _deliver_until(worker: ReviewWorker, hook: WebhookReceiver, count: int, *, rounds: int = 500) -> None:
    for _ in range(rounds):
        if len(hook.received()) >= count:
            return
        await worker.deliver()
        await asyncio.sleep(0.002)
    raise AssertionError(f"expected {count} deliveries, got {hook.received()}")


async def _row(store: DecisionStore, review_id: str) -> ReviewEventRow:
    async with async_sessionmaker(store.engine)() as session:
        row = await session.scalar(select(ReviewEventRow).where(ReviewEventRow.review_id == review_id))
    assert row is not None
    return row


async def test_an_opened_review_is_sent_signed_and_a_failed_delivery_is_retried(
    store: DecisionStore, hook: WebhookReceiver
) -> None:
    review = await store.open_review(_draft(), ttl_s=3600)
    await store.open_review(_draft(tenant="globex"), ttl_s=3600)  # no webhook: never sent
    worker = ReviewWorker(store, _settings(hook), base_delay_s=0.001, max_delay_s=0.01)
    hook.fail_next(503)
    await _deliver_until(worker, hook, 2)
    failed, delivered = hook.received()
    assert (failed.status, delivered.status) == (503, 200)
    assert failed.body == delivered.body  # the same stored event, sent again
    assert failed.headers["x-fastslow-delivery"] == delivered.headers["x-fastslow-delivery"]
    assert delivered.headers["x-fastslow-event"] == "review.opened"
    assert delivered.headers["content-type"] == "application/json"
    assert signed_by(SECRET, delivered) and not signed_by("another secret", delivered)
    event = delivered.event
    assert event["event"] == "review.opened"
    assert event["review"]["id"] == review.id and event["review"]["status"] == "pending"
    assert "subject" not in event["review"]  # the checked call stays behind the API's key
    row = await _row(store, review.id)
    assert row.delivered_at is not None and row.attempts == 2 and row.last_error is None
    assert await worker.deliver() == 0  # delivered: nothing more to send
    assert len(hook.received()) == 2


async def test_a_settlement_is_sent_too_and_each_event_once_among_replicas(
    store: DecisionStore, hook: WebhookReceiver
) -> None:
    reviews = [await store.open_review(_draft(), ttl_s=3600) for _ in range(3)]
    await store.settle_review(reviews[0].id, tenant="acme", verdict="allow", by="key-1", note="fine")
    replicas = [ReviewWorker(store, _settings(hook)) for _ in range(3)]
    sent = await asyncio.gather(*(replica.deliver() for replica in replicas))
    assert sum(sent) == 4
    deliveries = hook.received()
    assert sorted(d.headers["x-fastslow-event"] for d in deliveries) == ["review.opened"] * 3 + ["review.settled"]
    assert len({d.headers["x-fastslow-delivery"] for d in deliveries}) == 4  # none sent twice
    settled = next(d.event["review"] for d in deliveries if d.event["event"] == "review.settled")
    assert (settled["id"], settled["status"], settled["verdict"], settled["settled_by"]) == (
        reviews[0].id,
        "allowed",
        "allow",
        "key-1",
    )


async def test_an_event_is_given_up_after_its_tries(
    store: DecisionStore, hook: WebhookReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    review = await store.open_review(_draft(), ttl_s=3600)
    worker = ReviewWorker(store, _settings(hook, webhook_attempts=3), base_delay_s=0.001, max_delay_s=0.01)
    hook.fail_next(500, 500, 500, 500)
    await _deliver_until(worker, hook, 3)
    for _ in range(20):  # past every back-off: no fourth try
        await worker.deliver()
        await asyncio.sleep(0.002)
    assert [d.status for d in hook.received()] == [500, 500, 500]
    row = await _row(store, review.id)
    assert row.delivered_at is None and row.attempts == 3 and row.last_error == "HTTP 500"
    assert "gave up sending review.opened" in caplog.text


async def test_the_background_work_expires_due_reviews_and_sends_the_expiry(
    store: DecisionStore, hook: WebhookReceiver
) -> None:
    review = await store.open_review(_draft(), ttl_s=0.01)
    worker = ReviewWorker(store, _settings(hook, sweep_s=0.02, expire_verdict="deny"))
    async with worker.running():
        for _ in range(500):
            if any(d.headers["x-fastslow-event"] == "review.expired" for d in hook.received()):
                break
            await asyncio.sleep(0.01)
    expired = await store.get_review(review.id, tenant="acme")
    assert expired is not None and (expired.status, expired.verdict) == ("expired", "deny")
    [sent] = [d.event["review"] for d in hook.received() if d.event["event"] == "review.expired"]
    assert (sent["status"], sent["verdict"], sent["settled_by"]) == ("expired", "deny", "expiry")


def test_the_back_off_doubles_with_jitter_up_to_its_cap() -> None:
    rng = random.Random(7)
    waits = [backoff_s(attempt, base_s=1.0, cap_s=30.0, rng=rng) for attempt in range(1, 9)]
    for attempt, wait in enumerate(waits, start=1):
        full = min(30.0, 2.0 ** (attempt - 1))
        assert full / 2 <= wait <= full
    assert max(waits) <= 30.0
