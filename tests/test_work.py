"""The work primitives: request deadlines, stop tokens, the fair lock and the fair admission gate."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest
from pydantic import ValidationError

import fastslow.router._fair as fair_module
from fastslow.router import Overloaded, request_scope
from fastslow.router.engine_api import (
    Abandoned,
    Deadline,
    FairGate,
    FairLock,
    StopToken,
    budget_s,
    current_deadline,
    current_tenant,
    run_blocking,
)
from fastslow.router.settings import LimitsSettings


def _wait_for(condition: object, timeout: float = 10.0) -> None:
    assert callable(condition)
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition never held"
        time.sleep(0.005)


def test_request_scope_sets_deadline_and_tenant_and_nests_to_the_sooner() -> None:
    assert current_deadline() is None and current_tenant() == ""
    assert budget_s(5.0) == 5.0
    with request_scope(timeout_s=10.0, tenant="acme") as outer:
        assert outer is not None and current_deadline() is outer
        assert current_tenant() == "acme"
        left = budget_s(None)
        assert left is not None and 9.0 < left <= 10.0
        assert budget_s(2.0) == 2.0
        with request_scope(timeout_s=60.0) as inner:
            assert inner is outer  # a longer inner budget cannot extend the request
            assert current_tenant() == "acme"
        with request_scope(timeout_s=1.0, tenant="other") as sooner:
            assert sooner is not outer and current_tenant() == "other"
    assert current_deadline() is None


async def test_run_blocking_stops_the_thread_when_the_await_is_cancelled() -> None:
    steps: list[int] = []
    finished = threading.Event()

    def work(stop: StopToken) -> int:
        try:
            for i in range(10_000):
                stop.check()
                steps.append(i)
                time.sleep(0.01)
            return -1
        finally:
            finished.set()

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await run_blocking(work)
    assert await asyncio.to_thread(finished.wait, 5.0), "the worker thread kept running after its caller left"
    assert len(steps) < 200


async def test_run_blocking_honours_the_request_deadline() -> None:
    def work(stop: StopToken) -> None:
        while True:
            stop.check()
            time.sleep(0.01)

    started = time.monotonic()
    with request_scope(timeout_s=0.2), pytest.raises(Abandoned):
        await run_blocking(work)
    assert time.monotonic() - started < 2.0


def _in_tenant(tenant: str, fn: object) -> threading.Thread:
    assert callable(fn)
    context = contextvars.copy_context()

    def run() -> None:
        with request_scope(tenant=tenant):
            fn()

    return threading.Thread(target=context.run, args=(run,), daemon=True)


def test_fair_lock_goes_round_robin_across_tenants() -> None:
    lock = FairLock()
    order: list[str] = []
    first = lock.acquire()

    def take(label: str) -> object:
        def run() -> None:
            with lock.hold():
                order.append(label)

        return run

    threads = []
    for n, (tenant, label) in enumerate([("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")], start=1):
        thread = _in_tenant(tenant, take(label))
        thread.start()
        threads.append(thread)
        _wait_for(lambda n=n: lock._turns.size == n)  # queued in this order
    lock.release(first)
    for thread in threads:
        thread.join(5)
    # Tenant b waited behind one step of tenant a, not behind all three.
    assert order == ["a1", "b1", "a2", "a3"]


def test_a_second_lane_goes_to_another_tenant_never_to_the_one_holding_a_step() -> None:
    lock = FairLock(lanes=2)
    order: list[str] = []
    release = {label: threading.Event() for label in ("a1", "a2", "b1")}

    def take(label: str) -> object:
        def run() -> None:
            with lock.hold():
                order.append(label)
                assert release[label].wait(5)

        return run

    a1 = _in_tenant("a", take("a1"))
    a1.start()
    _wait_for(lambda: order == ["a1"])
    a2 = _in_tenant("a", take("a2"))
    a2.start()
    _wait_for(lambda: lock._turns.size == 1)  # a's second step waits, though a lane is free
    b1 = _in_tenant("b", take("b1"))
    b1.start()
    _wait_for(lambda: order == ["a1", "b1"])  # b does not wait for a's step in progress
    release["a1"].set()
    _wait_for(lambda: order == ["a1", "b1", "a2"])
    release["a2"].set()
    release["b1"].set()
    for thread in (a1, a2, b1):
        thread.join(5)


def test_a_fair_lock_says_whether_another_tenant_takes_steps() -> None:
    lock = FairLock(lanes=2)
    assert not lock.others_active("a")
    step = _in_tenant("b", lambda: lock.release(lock.acquire()))
    step.start()
    step.join(5)
    assert lock.others_active("a")  # b took a step a moment ago
    assert not lock.others_active("b")  # its own steps do not count
    assert not lock.others_active("a", within_s=0.0)  # and none is running now


def test_a_waiter_whose_token_stops_leaves_the_queue_and_the_lock_still_works() -> None:
    lock = FairLock()
    held = lock.acquire()
    stop = StopToken(Deadline(0.1))
    with pytest.raises(Abandoned):
        lock.acquire(stop)
    assert lock._turns.size == 0
    lock.release(held)
    with lock.hold():
        pass


async def test_fair_gate_admits_round_robin_and_refuses_beyond_its_queue() -> None:
    gate = FairGate("embedded", capacity=1, queue=4)
    order: list[str] = []
    release = asyncio.Event()

    async def use(tenant: str, label: str, *, hold: bool = False) -> None:
        async with gate.admit(tenant):
            order.append(label)
            if hold:
                await release.wait()

    holder = asyncio.create_task(use("a", "a0", hold=True))
    await asyncio.sleep(0)
    waiters = []
    for tenant, label in [("a", "a1"), ("b", "b1"), ("c", "c1"), ("d", "d1")]:
        waiters.append(asyncio.create_task(use(tenant, label)))
        await asyncio.sleep(0)
    assert gate.active == 1 and gate.waiting == 4
    with pytest.raises(Overloaded, match="busy"):  # the queue is full, and nobody holds more of it than e would
        await use("e", "e1")
    release.set()
    await asyncio.gather(holder, *waiters)
    # Tenant a was just served (a0), so the other tenants go first.
    assert order == ["a0", "b1", "c1", "d1", "a1"]
    assert gate.active == 0 and gate.waiting == 0


async def test_a_lone_tenant_fills_the_whole_queue() -> None:
    gate = FairGate("embedded", capacity=2, queue=8)
    release = asyncio.Event()
    served: list[int] = []

    async def use(n: int) -> None:
        async with gate.admit("only"):
            await release.wait()
            served.append(n)

    tasks = [asyncio.create_task(use(n)) for n in range(10)]
    await asyncio.sleep(0)
    assert gate.active == 2 and gate.waiting == 8  # every slot and the whole queue, no 503
    with pytest.raises(Overloaded):
        await use(10)  # beyond the queue it configured
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(served) == list(range(10))


async def test_a_tenant_below_its_share_is_admitted_while_another_holds_every_place() -> None:
    gate = FairGate("embedded", capacity=4, queue=8)
    release = asyncio.Event()
    admitted: list[str] = []

    async def use(tenant: str, label: str) -> None:
        async with gate.admit(tenant):
            admitted.append(label)
            await release.wait()

    flood = [asyncio.create_task(use("a", f"a{n}")) for n in range(6)]  # four places, two waiting
    await asyncio.sleep(0)
    assert gate.active == 4 and gate.waiting == 2
    # b's share of four places between two tenants is two: both its requests come in at once, over
    # capacity, instead of waiting for a's long requests; a third waits its turn.
    others = [asyncio.create_task(use("b", f"b{n}")) for n in range(3)]
    await asyncio.sleep(0)
    assert admitted[-2:] == ["b0", "b1"] and gate.active == 6 and gate.waiting == 3
    release.set()
    await asyncio.gather(*flood, *others)
    assert sorted(admitted) == sorted([f"a{n}" for n in range(6)] + ["b0", "b1", "b2"])
    assert gate.active == 0 and gate.waiting == 0


async def test_places_freed_over_capacity_are_not_handed_on_until_back_under_it() -> None:
    gate = FairGate("embedded", capacity=2, queue=8)
    releases = {label: asyncio.Event() for label in ("a0", "a1", "a2", "b0")}
    admitted: list[str] = []

    async def use(tenant: str, label: str) -> None:
        async with gate.admit(tenant):
            admitted.append(label)
            await releases[label].wait()

    tasks = [asyncio.create_task(use("a", label)) for label in ("a0", "a1", "a2")]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(use("b", "b0")))  # b's share is one place: in at once
    await asyncio.sleep(0)
    assert admitted == ["a0", "a1", "b0"] and gate.active == 3 and gate.waiting == 1
    releases["a0"].set()  # back to capacity: the freed place is not handed to a2
    for _ in range(3):
        await asyncio.sleep(0)
    assert admitted == ["a0", "a1", "b0"] and gate.active == 2 and gate.waiting == 1
    releases["b0"].set()  # under capacity now: a2 comes in
    for _ in range(3):
        await asyncio.sleep(0)
    assert admitted == ["a0", "a1", "b0", "a2"] and gate.active == 2
    releases["a1"].set()
    releases["a2"].set()
    await asyncio.gather(*tasks)
    assert gate.active == 0


async def test_a_full_queue_makes_room_for_another_tenant_at_the_floods_expense() -> None:
    gate = FairGate("embedded", capacity=1, queue=4)
    release = asyncio.Event()
    outcomes: dict[str, str] = {}

    async def use(tenant: str, label: str) -> None:
        try:
            async with gate.admit(tenant):
                await release.wait()
            outcomes[label] = "served"
        except Overloaded:
            outcomes[label] = "refused"

    flood = [asyncio.create_task(use("a", f"a{n}")) for n in range(5)]  # one running, four waiting
    await asyncio.sleep(0)
    assert gate.waiting == 4
    others = [asyncio.create_task(use(t, f"{t}1")) for t in ("b", "c")]
    for _ in range(3):  # the newcomers queue, then the refused waiters' tasks run
        await asyncio.sleep(0)
    # Each newcomer took the place of a's newest waiter: a keeps two, b and c one each.
    assert gate.waiting == 4 and outcomes == {"a4": "refused", "a3": "refused"}
    with pytest.raises(Overloaded):  # b already holds as much as a would leave it
        async with gate.admit("b"):
            pass
    release.set()
    await asyncio.gather(*flood, *others)
    assert outcomes["b1"] == outcomes["c1"] == "served"
    assert [outcomes[f"a{n}"] for n in range(5)] == ["served", "served", "served", "refused", "refused"]
    assert gate.active == 0 and gate.waiting == 0


class _Clock:
    """``time`` for the gate: its ``monotonic()`` moves only when a test says, so engine time is exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(fair_module, "time", fake)
    return fake


async def _use(gate: FairGate, clock: _Clock, order: list[str], tenant: str, label: str, held_s: float) -> None:
    async with gate.admit(tenant):
        order.append(label)
        for _ in range(5):  # the others queue meanwhile
            await asyncio.sleep(0)
        clock.now += held_s


async def test_a_tenant_whose_requests_cost_more_gets_fewer_turns(clock: _Clock) -> None:
    # One place: tenant a's requests hold the engine 30 s each, b's 1 s. With a turn each, b would
    # wait for every one of a's; by engine time used, b's requests go first while a has used more.
    gate = FairGate("embedded", capacity=1, queue=8)
    order: list[str] = []
    tasks = [asyncio.create_task(_use(gate, clock, order, "a", f"a{n}", 30.0)) for n in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(_use(gate, clock, order, "b", f"b{n}", 1.0)) for n in range(3)]
    await asyncio.gather(*tasks)
    assert order == ["a0", "b0", "b1", "b2", "a1", "a2"]
    assert gate.active == 0 and gate.waiting == 0


async def test_a_tenants_weight_scales_its_share_of_engine_time(clock: _Clock) -> None:
    # Equal requests of 10 s; tenant a's weight of 4 counts each of its requests as 2.5 s of its share.
    gate = FairGate("embedded", capacity=1, queue=16, weights={"a": 4.0})
    order: list[str] = []
    first = asyncio.create_task(_use(gate, clock, order, "b", "b0", 10.0))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(_use(gate, clock, order, "a", f"a{n}", 10.0)) for n in range(5)]
    tasks += [asyncio.create_task(_use(gate, clock, order, "b", f"b{n}", 10.0)) for n in range(1, 3)]
    await asyncio.gather(first, *tasks)
    # b has used 10 s; a's first four come to 10 s of its share, and a tie goes to the tenant that
    # has waited longest (a), so a runs five times for b's one, then b's last.
    assert order == ["b0", "a0", "a1", "a2", "a3", "a4", "b1", "b2"]


async def test_fair_gate_wait_ends_at_the_deadline_without_losing_the_place() -> None:
    gate = FairGate("jev", capacity=1, queue=2)
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.admit("a"):
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with gate.admit("b", Deadline(0.05)):
            pass
    assert gate.waiting == 0
    release.set()
    await holder
    async with gate.admit("b"):
        assert gate.active == 1
    assert gate.active == 0


def test_a_tenant_weight_must_be_above_zero() -> None:
    with pytest.raises(ValidationError, match="weights must be above 0: acme"):
        LimitsSettings(tenant_weights={"acme": 0.0, "beta": 2.0})
    assert LimitsSettings(tenant_weights={"beta": 2.0}).tenant_weights == {"beta": 2.0}
