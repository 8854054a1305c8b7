"""One decision procedure, two ways to run it: awaited, or called from sync code without an event loop hop.

The router's decisions are written once, as plans: generators that yield each step needing I/O
(asking the engine, escalating, recording) and get its result back. ``run_async`` awaits every
step. ``run_sync`` runs each step in the calling thread when the step can (an engine with a sync
client, a write-behind log that only queues), and otherwise runs that step's coroutine on
``LoopThread``, a private event loop in a daemon thread. The common case (System 1 answers, the
decision is queued) then never leaves the caller's thread; the rare one (System 2, a durable
commit) pays one hop, next to which a frontier call's latency is large anyway.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeAlias, TypeVar

__all__ = ["NOT_NOW", "LoopThread", "Plan", "Step", "run_async", "run_sync"]

T = TypeVar("T")
R = TypeVar("R")


class _NotNow:
    def __repr__(self) -> str:
        return "NOT_NOW"


NOT_NOW: Final = _NotNow()
"""What a step's sync form returns when it cannot do its work in the calling thread."""


@dataclass(frozen=True, slots=True)
class Step(Generic[T]):
    """One piece of I/O in a plan: its coroutine, and optionally a sync form for the calling thread."""

    run: Callable[[], Coroutine[Any, Any, T]]
    now: Callable[[], T | _NotNow] | None = None


Plan: TypeAlias = Generator[Step[Any], Any, R]


async def run_async(plan: Plan[R]) -> R:
    """Run ``plan`` awaiting each step."""
    try:
        step = next(plan)
        while True:
            step = plan.send(await step.run())
    except StopIteration as done:
        result: R = done.value
        return result


def run_sync(plan: Plan[R]) -> R:
    """Run ``plan`` from sync code: each step in this thread when it can, else on ``LoopThread``."""
    try:
        step = next(plan)
        while True:
            value = step.now() if step.now is not None else NOT_NOW
            if value is NOT_NOW:
                value = LoopThread.run(step.run())
            step = plan.send(value)
    except StopIteration as done:
        result: R = done.value
        return result


class LoopThread:
    """One daemon thread running an event loop, for the async steps of sync callers.

    One loop for every sync caller, so whatever binds to a loop (an ``httpx2.AsyncClient``'s
    connections, the decision log's database pool) binds to this one. The coroutine runs in a
    copy of the caller's context: a request scope's deadline and tenant hold there too.
    """

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                cls._thread = threading.Thread(target=loop.run_forever, name="fastslow-sync", daemon=True)
                cls._thread.start()
                cls._loop = loop
            return cls._loop

    @classmethod
    def run(cls, coro: Coroutine[Any, Any, T]) -> T:
        loop = cls.loop()
        if threading.current_thread() is cls._thread:
            coro.close()
            # Waiting here for the loop this thread runs would wait forever.
            raise RuntimeError("a sync fastslow call was made from fastslow's own loop thread; await the async one")
        context = contextvars.copy_context()
        future: Future[T] = Future()

        def start() -> None:
            task = loop.create_task(coro, context=context)

            def done(t: asyncio.Task[T]) -> None:
                if t.cancelled():
                    future.cancel()
                elif (error := t.exception()) is not None:
                    future.set_exception(error)
                else:
                    future.set_result(t.result())

            task.add_done_callback(done)

        loop.call_soon_threadsafe(start)
        return future.result()
