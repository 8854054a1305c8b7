"""Work that ends at its deadline, on behalf of a tenant.

Three pieces, used together by the embedded engines and the HTTP API:

* ``request_scope``: one deadline (and the caller's tenant) per request, in a context variable, so
  every stage (queueing, System 1, System 2) reads the same clock without threading it through
  every signature. ``asyncio.to_thread`` copies the context, so worker threads see it too.
* ``run_blocking``: blocking work in a worker thread that is *told* to stop. C code cannot be
  interrupted mid-call, so long work runs in bounded steps and calls ``StopToken.check()`` between
  them; when the awaiting coroutine is cancelled (its budget ran out, its client left) the token
  is cancelled and the thread gives up at its next step instead of running to the end.
* ``Overloaded``: what an engine's admission gate (``FairGate``, in ``_fair``) raises when its
  queue is full; ``FairLock`` and ``FairGate`` share an engine between tenants there.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from ._errors import FastslowError
from ._timing import Deadline

__all__ = [
    "Abandoned",
    "Overloaded",
    "StopToken",
    "budget_s",
    "current_deadline",
    "current_tenant",
    "gather_all",
    "request_scope",
    "run_blocking",
]

T = TypeVar("T")


class Abandoned(Exception):
    """Blocking work stopped between steps: its deadline passed or its caller went away."""


class Overloaded(FastslowError):
    """An engine's queue is full: the request was not admitted, and nothing was decided.

    Attributes:
        engine: the engine whose queue is full.
        retry_after_s: a hint for the client's next attempt.
    """

    def __init__(self, engine: str, *, queued: int, retry_after_s: float = 1.0) -> None:
        self.engine = engine
        self.retry_after_s = retry_after_s
        super().__init__(f"engine {engine!r} is busy: {queued} requests are already waiting for it; retry later")


@dataclass(frozen=True, slots=True)
class _Scope:
    deadline: Deadline | None
    tenant: str


_SCOPE: ContextVar[_Scope | None] = ContextVar("fastslow_request_scope", default=None)


@contextmanager
def request_scope(*, timeout_s: float | None = None, tenant: str = "") -> Iterator[Deadline | None]:
    """Run the block under one deadline of ``timeout_s`` (none when ``None``) on behalf of ``tenant``.

    A scope inside another keeps the earlier (outer) deadline when it is sooner.
    """
    outer = _SCOPE.get()
    deadline = Deadline(timeout_s) if timeout_s is not None else None
    if outer is not None and outer.deadline is not None:
        if deadline is None or outer.deadline.remaining < deadline.remaining:
            deadline = outer.deadline
    token = _SCOPE.set(_Scope(deadline=deadline, tenant=tenant or (outer.tenant if outer else "")))
    try:
        yield deadline
    finally:
        _SCOPE.reset(token)


def current_deadline() -> Deadline | None:
    """The deadline of the request being served, if any."""
    scope = _SCOPE.get()
    return scope.deadline if scope is not None else None


def current_tenant() -> str:
    """The tenant of the request being served (``""`` outside any request)."""
    scope = _SCOPE.get()
    return scope.tenant if scope is not None else ""


def budget_s(own: float | None) -> float | None:
    """A stage's budget: its own ``own`` seconds, cut to what is left of the request's deadline."""
    deadline = current_deadline()
    if deadline is None:
        return own
    left = deadline.remaining
    return left if own is None else min(own, left)


class StopToken:
    """Tells blocking work in another thread to stop; checked between steps.

    Args:
        deadline: the work also stops once it has passed.
    """

    def __init__(self, deadline: Deadline | None = None) -> None:
        self.deadline = deadline
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    @property
    def stopped(self) -> bool:
        return self._cancelled.is_set() or (self.deadline is not None and self.deadline.expired)

    def check(self) -> None:
        """Raise ``Abandoned`` when the work should stop."""
        if self._cancelled.is_set():
            raise Abandoned("the caller stopped waiting")
        if self.deadline is not None and self.deadline.expired:
            raise Abandoned(f"past its {self.deadline.budget_s:g} s deadline")


async def run_blocking(fn: Callable[[StopToken], T], *, deadline: Deadline | None = None) -> T:
    """Run ``fn(token)`` in a worker thread; cancelling the await cancels the token.

    The request's deadline (``request_scope``) applies when ``deadline`` is not given.
    """
    token = StopToken(deadline if deadline is not None else current_deadline())
    context = contextvars.copy_context()  # as asyncio.to_thread does: the thread sees the request's scope
    try:
        return await asyncio.get_running_loop().run_in_executor(_threads(), context.run, fn, token)
    except asyncio.CancelledError:
        token.cancel()
        raise


_THREADS: ThreadPoolExecutor | None = None
_THREADS_LOCK = threading.Lock()
WORK_THREADS = 64
"""Threads for blocking engine work. Not the event loop's default pool (``cpu_count + 4`` threads,
six on two cores): requests waiting at a ``FairLock`` sit in threads, and there a pool that small
would leave a tenant admitted below its share waiting for a thread behind another tenant's requests.
They are started as needed; a waiting one costs no CPU."""


def _threads() -> ThreadPoolExecutor:
    global _THREADS
    with _THREADS_LOCK:
        if _THREADS is None:
            _THREADS = ThreadPoolExecutor(max_workers=WORK_THREADS, thread_name_prefix="fastslow-work")
        return _THREADS


async def gather_all(calls: Sequence[Coroutine[Any, Any, T]]) -> list[T]:
    """Await every call, results in order; the first failure cancels the others and is raised as it is.

    ``asyncio.gather`` leaves the others running past a failed call (a trickling reply included)
    until they end on their own; parts of one request must end together.
    """
    failure: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(call) for call in calls]
    except BaseExceptionGroup as failed:
        failure = failed.exceptions[0]
    if failure is not None:
        # Raised outside the handler, so its context is the call's own and not the group's.
        raise failure
    return [task.result() for task in tasks]
