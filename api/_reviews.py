"""The review queue's background work under ``fastslow serve``: expiring due reviews and sending webhook events.

    worker = ReviewWorker(store, settings.reviews)
    async with worker.running():      # the app's lifespan enters this, as it does Learner.running
        ...

Every ``settings.reviews.sweep_s`` seconds each replica

* settles every pending review past its ``expires_at`` with ``expire_verdict`` (``deny`` unless
  configured), recorded as ``expired``: never another System-1 or System-2 call. One conditional
  ``UPDATE``, so replicas sweeping at once expire each review once;
* sends the outbox's due events (``review_events``) of the tenants in ``settings.reviews.webhooks``:
  each is claimed first (``fastslow.api.store._review_events``), so two replicas do not both send
  it, then ``POST``-ed with its signature. A 2xx answer delivers it; anything else (another status,
  a timeout, a refused connection) is tried again after an exponential back-off with jitter, capped,
  up to ``webhook_attempts`` tries, then given up and logged.

Delivery is at least once: a replica that dies after the receiver took an event, before it marked
the event delivered, leaves it to be sent again once its claim lapses. Events of one review may
arrive out of order after a retry. Receivers deduplicate on ``X-Fastslow-Delivery`` (the event's
id) and read the review's ``status`` rather than trust arrival order (docs/reviews.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import random
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx2
from sqlalchemy.ext.asyncio import async_sessionmaker

from fastslow.api.store import DecisionStore
from fastslow.api.store._review_events import OutboxEvent, claim_event, delivered, due_events, failed
from fastslow.router import polling
from fastslow.router.settings import ReviewSettings

__all__ = ["DELIVERY_HEADER", "EVENT_HEADER", "SIGNATURE_HEADER", "ReviewWorker", "backoff_s", "sign"]

log = logging.getLogger("fastslow.api")

EVENT_HEADER = "X-Fastslow-Event"
DELIVERY_HEADER = "X-Fastslow-Delivery"
SIGNATURE_HEADER = "X-Fastslow-Signature"
LEASE_MARGIN_S = 30.0
"""A claim lasts the webhook timeout and this much more: only a replica that died mid-send outlives it."""
SENDS_AT_ONCE = 8


def sign(secret: str, body: bytes, *, timestamp: int) -> str:
    """The ``X-Fastslow-Signature`` value: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``.

    The timestamp is signed with the body, so a receiver can refuse an old event replayed to it.
    """
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def backoff_s(attempt: int, *, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """The pause after failed try number ``attempt`` (1, 2, ...): doubling from ``base_s``, at most ``cap_s``.

    Jittered between half and all of it, so events that failed together (a receiver that was down)
    do not all come back at the same instant.
    """
    full = min(cap_s, base_s * 2.0 ** max(0, attempt - 1))
    return full / 2.0 + (rng or random).uniform(0.0, full / 2.0)


class ReviewWorker:
    """Expires due reviews and sends the tenants' webhook events, from one replica.

    Args:
        store: the decision log the reviews and their outbox are in.
        settings: ``settings.reviews``.
        base_delay_s: the first retry's pause (before jitter); each retry doubles it.
        max_delay_s: the longest pause between two tries.
    """

    def __init__(
        self, store: DecisionStore, settings: ReviewSettings, *, base_delay_s: float = 2.0, max_delay_s: float = 600.0
    ) -> None:
        self._store = store
        self._settings = settings
        self._sessions = async_sessionmaker(store.engine, expire_on_commit=False)
        self._base_delay_s = base_delay_s
        self._max_delay_s = max_delay_s
        self._client: httpx2.AsyncClient | None = None
        self.delivered = 0
        """Events this worker delivered (for tests and logs)."""

    async def expire(self) -> int:
        """Settle every pending review past its expiry with the configured verdict; how many."""
        expired = await self._store.expire_reviews(verdict=self._settings.expire_verdict)
        if expired:
            log.info("%d review(s) expired as %s", expired, self._settings.expire_verdict)
        return expired

    async def deliver(self) -> int:
        """Send every due event this replica can claim, concurrently; how many were delivered."""
        hooks = self._settings.webhooks
        now = datetime.now(UTC)
        due = await due_events(
            self._sessions, tenants=hooks.keys(), now=now, max_attempts=self._settings.webhook_attempts
        )
        if not due:
            return 0
        slots = asyncio.Semaphore(SENDS_AT_ONCE)
        lease = timedelta(seconds=self._settings.webhook_timeout_s + LEASE_MARGIN_S)

        async def one(event: OutboxEvent) -> bool:
            async with slots:
                if not await claim_event(self._sessions, event, now=now, lease_until=datetime.now(UTC) + lease):
                    return False  # another replica has it
                return await self._send(event)

        sent = sum(await asyncio.gather(*(one(event) for event in due)))
        self.delivered += sent
        return sent

    async def _send(self, event: OutboxEvent) -> bool:
        hook = self._settings.webhooks.get(event.tenant)
        if hook is None:  # the tenant's webhook was removed since the event was read
            return False
        body = event.body.encode()
        headers = {
            "Content-Type": "application/json",
            EVENT_HEADER: event.event,
            DELIVERY_HEADER: event.id,
            SIGNATURE_HEADER: sign(hook.secret.get_secret_value(), body, timestamp=int(time.time())),
        }
        client = self._client
        try:
            if client is None:
                async with self._new_client() as client:
                    response = await client.post(hook.url, content=body, headers=headers)
            else:
                response = await client.post(hook.url, content=body, headers=headers)
            error = None if 200 <= response.status_code < 300 else f"HTTP {response.status_code}"
        except httpx2.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            await delivered(self._sessions, event.id, now=datetime.now(UTC))
            return True
        attempt = event.attempts + 1
        if attempt >= self._settings.webhook_attempts:
            log.error(
                "gave up sending %s of review %s to tenant %r's webhook after %d tries: %s",
                event.event,
                event.review_id,
                event.tenant,
                attempt,
                error,
            )
            await failed(self._sessions, event.id, error=error, retry_at=None)
            return False
        wait = backoff_s(attempt, base_s=self._base_delay_s, cap_s=self._max_delay_s)
        log.warning(
            "sending %s of review %s to tenant %r's webhook failed (try %d of %d, next in %.1f s): %s",
            event.event,
            event.review_id,
            event.tenant,
            attempt,
            self._settings.webhook_attempts,
            wait,
            error,
        )
        await failed(self._sessions, event.id, error=error, retry_at=datetime.now(UTC) + timedelta(seconds=wait))
        return False

    def _new_client(self) -> httpx2.AsyncClient:
        # No redirects: a webhook's address is configured, and a redirect could carry the signed body elsewhere.
        return httpx2.AsyncClient(timeout=self._settings.webhook_timeout_s, follow_redirects=False)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReviewWorker]:
        """Expire and deliver every ``sweep_s`` seconds in the background while the block runs (first at once)."""
        every = self._settings.sweep_s
        async with contextlib.AsyncExitStack() as stack:
            if self._settings.webhooks:
                self._client = await stack.enter_async_context(self._new_client())
                stack.callback(setattr, self, "_client", None)
                await stack.enter_async_context(
                    polling(
                        self.deliver,
                        every,
                        name="fastslow-review-webhooks",
                        log=log,
                        failure="sending review webhook events failed",
                        at_once=True,
                    )
                )
            await stack.enter_async_context(
                polling(
                    self.expire,
                    every,
                    name="fastslow-review-expiry",
                    log=log,
                    failure="expiring reviews failed",
                    at_once=True,
                )
            )
            yield self
