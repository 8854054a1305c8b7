"""An engine shared fairly between tenants: its model steps (``FairLock``) and its places (``FairGate``).

* ``FairLock``: a thread lock handed out round-robin across tenants (first come, first served
  within one), with lanes for steps of different tenants at once, so one tenant's many or long
  requests delay another's by at most one step each.
* ``FairGate``: an async admission gate with a bounded queue, whose places are shared by weight
  and handed to the tenant that has used the engine least; beyond its queue a request is refused
  at once (``Overloaded``) rather than left waiting.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager

from ._timing import Deadline
from ._work import Overloaded, StopToken, current_deadline, current_tenant

__all__ = ["SHARED_S", "FairGate", "FairLock"]

_POLL_S = 0.05
"""How often a thread waiting for a ``FairLock`` looks at its stop token."""
SHARED_S = 0.25
"""How recently another tenant's step must have started for a ``FairLock`` to count it as active."""
_GRANTS_KEPT = 64


class _Turns:
    """Waiters per tenant, served round-robin; not thread-safe on its own."""

    def __init__(self) -> None:
        self._queues: OrderedDict[str, deque[object]] = OrderedDict()
        self.size = 0

    def waiting(self, tenant: str) -> int:
        queue = self._queues.get(tenant)
        return len(queue) if queue is not None else 0

    def add(self, tenant: str, ticket: object) -> None:
        self._queues.setdefault(tenant, deque()).append(ticket)
        self.size += 1

    def remove(self, tenant: str, ticket: object) -> bool:
        queue = self._queues.get(tenant)
        if queue is None or ticket not in queue:
            return False
        queue.remove(ticket)
        if not queue:
            del self._queues[tenant]
        self.size -= 1
        return True

    def largest(self) -> str | None:
        """The tenant with the most waiters (the first in turn among equals); ``None`` when none waits."""
        if not self._queues:
            return None
        return max(self._queues, key=lambda tenant: len(self._queues[tenant]))

    def pop_newest(self, tenant: str) -> object:
        """Take ``tenant``'s most recent waiter out of the queue."""
        queue = self._queues[tenant]
        ticket = queue.pop()
        if not queue:
            del self._queues[tenant]
        self.size -= 1
        return ticket

    def next_least(self, key: Callable[[str], float]) -> tuple[str, object] | None:
        """The oldest waiter of the tenant with the least ``key`` (the first to wait among equals)."""
        if not self._queues:
            return None
        tenant = min(self._queues, key=key)
        queue = self._queues[tenant]
        ticket = queue.popleft()
        if not queue:
            del self._queues[tenant]
        self.size -= 1
        return tenant, ticket

    def tenants(self) -> Iterable[str]:
        """The tenants with waiters."""
        return self._queues.keys()

    def next(self, after: str | None = None, busy: Iterable[str] = ()) -> tuple[str, object] | None:
        """The next tenant and ticket: the first tenant in turn gives its oldest waiter and goes to the back.

        ``after`` is the tenant just served: when others are waiting it goes after them, so the
        tenant whose work loops (one window after another) does not get the next turn too. Tenants
        in ``busy`` are passed over (they hold a step already).
        """
        skip = set(busy)
        ready = [tenant for tenant in self._queues if tenant not in skip]
        if not ready:
            return None
        if len(ready) > 1 and ready[0] == after:
            self._queues.move_to_end(after)
            ready = [*ready[1:], after]
        tenant = ready[0]
        queue = self._queues.pop(tenant)
        ticket = queue.popleft()
        if queue:
            self._queues[tenant] = queue
        self.size -= 1
        return tenant, ticket


class FairLock:
    """A thread lock granted round-robin across tenants, first come first served within one.

    A plain lock lets a thread that releases and re-acquires in a loop (one embedding window after
    another) starve the others; here, each release hands the lock to the next tenant in turn, so a
    short request from one tenant waits for at most one step of each other tenant's work.

    With ``lanes`` above one, up to that many holders run at once, each of a different tenant: one
    tenant's steps still run one at a time (as with one lane), but another tenant's step need not
    wait for the step in progress, which cannot be interrupted. A lone tenant's work is unchanged.

    Args:
        lanes: steps of different tenants held at once.
    """

    def __init__(self, lanes: int = 1) -> None:
        if lanes < 1:
            raise ValueError("need lanes >= 1")
        self._cond = threading.Condition()
        self._lanes = lanes
        self._holders: dict[object, str] = {}
        """Ticket -> tenant of each step running now."""
        self._last: str | None = None
        """The tenant most recently granted the lock: it goes after the others waiting."""
        self._granted: dict[str, float] = {}
        """Tenant -> when it was last granted a step (recent ones only)."""
        self._turns = _Turns()

    def acquire(self, stop: StopToken | None = None) -> object:
        """Wait for the lock (giving up with ``Abandoned`` when ``stop`` says so); the ticket to release."""
        ticket = object()
        tenant = current_tenant()
        with self._cond:
            self._turns.add(tenant, ticket)
            self._grant()
            while ticket not in self._holders:
                if stop is not None and stop.stopped:
                    # Not granted (we hold the condition and are not a holder): leave the queue.
                    self._turns.remove(tenant, ticket)
                    stop.check()
                self._cond.wait(timeout=_POLL_S if stop is not None else None)
            return ticket

    def others_active(self, tenant: str, within_s: float = SHARED_S) -> bool:
        """Whether a tenant other than ``tenant`` holds a step now, or was granted one in the last ``within_s``."""
        now = time.monotonic()
        with self._cond:
            if any(t != tenant for t in self._holders.values()):
                return True
            return any(t != tenant and now - at < within_s for t, at in self._granted.items())

    def release(self, ticket: object) -> None:
        with self._cond:
            if ticket not in self._holders:
                raise RuntimeError("release of a FairLock not held by this ticket")
            del self._holders[ticket]
            self._grant()

    def _grant(self) -> None:
        """Free lanes to the next waiters in turn whose tenant holds none (under the condition)."""
        granted = False
        while len(self._holders) < self._lanes:
            turn = self._turns.next(after=self._last, busy=set(self._holders.values()))
            if turn is None:
                break
            self._last, ticket = turn
            self._holders[ticket] = self._last
            self._note_grant(self._last)
            granted = True
        if granted:
            self._cond.notify_all()

    def _note_grant(self, tenant: str) -> None:
        now = time.monotonic()
        self._granted[tenant] = now
        if len(self._granted) > _GRANTS_KEPT:  # forget those long gone: tenants are unbounded
            self._granted = {t: at for t, at in self._granted.items() if now - at < SHARED_S}

    @contextmanager
    def hold(self, stop: StopToken | None = None) -> Iterator[None]:
        """Hold the lock for one step."""
        ticket = self.acquire(stop)
        try:
            yield
        finally:
            self.release(ticket)


class FairGate:
    """Admission to one engine: at most ``capacity`` requests at once, ``queue`` more waiting.

    Waiting requests are admitted by the engine time each tenant has used: a freed place goes to
    the waiting tenant that has held the engine least since the gate was last idle, over its
    weight (``weights``, 1 when not named), so a tenant whose requests are costly gets fewer turns
    than one whose requests are cheap, rather than one turn each (a fair queue over measured work,
    as deficit round robin is over declared sizes). A tenant that starts waiting is counted from the
    least work among those waiting, so it neither jumps a long history nor pays for one.

    The places are work-conserving and shared by weight: a tenant alone may hold every place, and
    one that holds at least one place less than its share (``capacity`` over the tenants using or
    waiting for the engine, by weight) while another holds more than its own is admitted at once,
    over ``capacity`` if need be, rather than waiting for the other's long requests to end. Freed
    places are then not handed on until the gate is back under ``capacity``. So no tenant holds
    more than its share while another with a share of a whole place waits, and at most
    ``2 * capacity`` requests run at once; shares of less than a place are served by the queue.

    The queue is work-conserving too: a tenant alone may fill all of it. When it is full, a request
    of a tenant holding less of it than another makes room: that other tenant's newest waiter is
    refused with ``Overloaded`` and this one waits in its place, so every tenant's share of a full
    queue tends to an equal part, and one tenant's flood never keeps another tenant out. A request
    whose tenant already holds as much as any other is refused at once with ``Overloaded``. One
    whose deadline passes while it waits gets ``TimeoutError``. Per process by design: it guards
    this process's CPU or connections.

    Args:
        name: the engine's name, for errors.
        capacity: requests admitted at once.
        queue: requests allowed to wait.
        weights: tenant -> weight of its share (``LimitsSettings.tenant_weights``).
    """

    def __init__(self, name: str, *, capacity: int, queue: int, weights: Mapping[str, float] | None = None) -> None:
        if capacity < 1 or queue < 0:
            raise ValueError("need capacity >= 1 and queue >= 0")
        self.name = name
        self.capacity = capacity
        self.queue = queue
        self.weights = dict(weights or {})
        self.active = 0
        self._held: dict[str, int] = {}
        """Places each tenant holds now."""
        self._turns = _Turns()
        self._work: dict[str, float] = {}
        """Seconds each tenant held the engine since the gate was last idle, over its weight."""

    @property
    def waiting(self) -> int:
        return self._turns.size

    @asynccontextmanager
    async def admit(self, tenant: str | None = None, deadline: Deadline | None = None) -> AsyncIterator[None]:
        """Hold one of the gate's places for the block.

        Raises:
            Overloaded: the queue is full.
            TimeoutError: ``deadline`` (the request's, when omitted) passed while waiting.
        """
        who = current_tenant() if tenant is None else tenant
        deadline = deadline if deadline is not None else current_deadline()
        if (self.active < self.capacity and self._turns.size == 0) or self._below_share(who):
            self.active += 1
        else:
            await self._wait(who, deadline)
        self._held[who] = self._held.get(who, 0) + 1
        started = time.monotonic()
        try:
            yield
        finally:
            held = time.monotonic() - started
            self._work[who] = self._work.get(who, 0.0) + held / self.weights.get(who, 1.0)
            if self._held[who] == 1:
                del self._held[who]
            else:
                self._held[who] -= 1
            self._leave()

    def _share(self, tenant: str, present: Iterable[str]) -> float:
        """``tenant``'s share of the places among ``present`` (the tenants using or waiting for the engine)."""
        total = sum(self.weights.get(t, 1.0) for t in present)
        return self.capacity * self.weights.get(tenant, 1.0) / total

    def _below_share(self, tenant: str) -> bool:
        """Whether ``tenant`` holds less than its share while another tenant holds more than its own."""
        if not self._held or self._turns.waiting(tenant):
            return False  # nobody holds a place, or its own earlier requests wait: it takes its turn
        present = set(self._held) | set(self._turns.tenants()) | {tenant}
        if self._held.get(tenant, 0) + 1 > self._share(tenant, present):
            return False  # a share of less than one place is served by the queue, in its turn
        return any(n > self._share(t, present) for t, n in self._held.items() if t != tenant)

    async def _wait(self, tenant: str, deadline: Deadline | None) -> None:
        if self._turns.size >= self.queue:
            self._make_room(tenant)
        ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if tenant not in self._work:
            waiting = [self._work.get(t, 0.0) for t in self._turns.tenants()]
            self._work[tenant] = min(waiting, default=0.0)
        self._turns.add(tenant, ticket)
        try:
            timeout = deadline.remaining if deadline is not None else None
            async with asyncio.timeout(timeout):
                await ticket
        except BaseException:
            removed = self._turns.remove(tenant, ticket)
            if not removed and ticket.done() and not ticket.cancelled() and ticket.exception() is None:
                self._leave()  # admitted just as we gave up: hand the place on
            raise

    def _work_of(self, tenant: str) -> float:
        return self._work.get(tenant, 0.0)

    def _make_room(self, tenant: str) -> None:
        """The queue is full: refuse the newest waiter of the tenant holding most of it, or this request.

        Raises:
            Overloaded: no tenant holds more of the queue than ``tenant`` would with this request.
        """
        largest = self._turns.largest()
        if largest is None or largest == tenant or self._turns.waiting(largest) <= self._turns.waiting(tenant) + 1:
            raise Overloaded(self.name, queued=self._turns.size)
        ticket = self._turns.pop_newest(largest)
        assert isinstance(ticket, asyncio.Future)
        ticket.set_exception(Overloaded(self.name, queued=self._turns.size))

    def _leave(self) -> None:
        """Hand a freed place to the next waiter (by work done, not by who freed it), or free it."""
        if self.active > self.capacity:
            self.active -= 1  # over capacity since a tenant below its share came in: not handed on
            return
        while True:
            turn = self._turns.next_least(self._work_of)
            if turn is None:
                self.active -= 1
                if self.active == 0:
                    self._work.clear()  # idle: the next busy spell starts with no history
                return
            ticket = turn[1]
            assert isinstance(ticket, asyncio.Future)
            if not ticket.done():
                ticket.set_result(None)  # the place passes straight to the next waiter
                return
