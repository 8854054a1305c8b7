"""Cross-request micro-batches: prompts of concurrent calls sent in one completions request.

A completions server that takes a list of prompts (vLLM, OpenAI) answers them in one request, so
calls about different states can share one. ``PromptBatcher`` follows the policy of
``fastslow.router._coalesce`` and ``fastslow.engines.embedded._batching``: a call that finds no
request of its engine in flight is sent at once, in its caller's own task, so a lone call never
waits. While a request is in flight, later calls queue, grouped by their request parameters (only
calls that would send the same ``model``, ``seed``, ``temperature``, ... can share a request). When
a request ends, everything queued goes out, one request per group and per ``max_prompts`` prompts
(a group that fills up goes out at once: waiting longer would gain nothing). One call's prompts are
never split across requests; a call with more than ``max_prompts`` prompts goes alone.

Each caller returns at its own deadline (its engine's ``asyncio.timeout`` cancels its wait): a
caller that leaves the queue is never sent, and one that leaves a request in flight stops waiting
while the request carries on for the others; the request is cancelled once all of them have left.
A shared request has the longest remaining budget of its callers. An error reaches every caller
of the request, as the same exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Generic, NamedTuple, TypeVar

from fastslow.router.engine_api import Deadline

__all__ = ["MAX_PROMPTS", "PromptBatcher", "Share"]

MAX_PROMPTS = 64
"""The most prompts one shared request carries (vLLM schedules a list prompt as that many sequences)."""

R = TypeVar("R")

Send = Callable[[list[str], Mapping[str, Hashable], Deadline], Awaitable[R]]
"""Sends one request: its prompts, its parameters, and the deadline its timeout is read from."""


class Share(NamedTuple, Generic[R]):
    """One caller's part of a reply: its prompts are ``offset``, ``offset + 1``, ... of ``reply``."""

    offset: int
    reply: R
    billed: bool
    """Whether this caller reports the request's usage: the first caller still waiting does, the
    others do not, so a shared request's tokens are counted once."""


class _Waiter(Generic[R]):
    __slots__ = ("batch", "deadline", "future", "offset", "prompts")

    def __init__(self, prompts: list[str], deadline: Deadline, future: asyncio.Future[Share[R]]) -> None:
        self.prompts = prompts
        self.deadline = deadline
        self.future = future
        self.offset = 0
        self.batch: _Batch[R] | None = None
        """The request this caller's prompts went out in; ``None`` while queued."""


class _Batch(Generic[R]):
    __slots__ = ("task", "waiters")

    def __init__(self, waiters: list[_Waiter[R]]) -> None:
        self.waiters = waiters
        self.task: asyncio.Task[None] | None = None


class PromptBatcher(Generic[R]):
    """Calls' prompts sent together while the server is busy (see the module docstring).

    Args:
        send: sends one request and returns its reply; its exceptions reach the callers as they are.
        max_prompts: the most prompts a shared request carries.
    """

    def __init__(self, send: Send[R], *, max_prompts: int = MAX_PROMPTS) -> None:
        self._send = send
        self._max = max_prompts
        self._in_flight = 0
        self._queues: dict[frozenset[tuple[str, Hashable]], list[_Waiter[R]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # the loop holds tasks weakly

    @property
    def queued(self) -> int:
        """Prompts waiting for a request in flight to end."""
        return sum(len(w.prompts) for queue in self._queues.values() for w in queue)

    async def complete(self, prompts: list[str], params: Mapping[str, Hashable], deadline: Deadline) -> Share[R]:
        """Send ``prompts`` with ``params``, alone or with other callers' prompts; this caller's share of the reply."""
        if not self._in_flight:
            return Share(0, await self._inline(prompts, params, deadline), billed=True)
        waiter = _Waiter[R](prompts, deadline, asyncio.get_running_loop().create_future())
        key = frozenset(params.items())
        queue = self._queues.setdefault(key, [])
        queue.append(waiter)
        if sum(len(w.prompts) for w in queue) >= self._max:
            self._start_group(key, params)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._leave(waiter, key)
            raise

    async def _inline(self, prompts: list[str], params: Mapping[str, Hashable], deadline: Deadline) -> R:
        """The caller's own request, with no task of its own: a lone call is sent exactly as without batching."""
        self._in_flight += 1
        try:
            return await self._send(prompts, params, deadline)
        finally:
            self._in_flight -= 1
            self._flush()

    def _leave(self, waiter: _Waiter[R], key: frozenset[tuple[str, Hashable]]) -> None:
        future = waiter.future
        if future.done() and not future.cancelled():
            future.exception()  # the answer came as the caller left: nobody else will read it
        batch = waiter.batch
        if batch is None:
            queue = self._queues.get(key)
            if queue is not None and waiter in queue:
                queue.remove(waiter)
                if not queue:
                    del self._queues[key]
        elif batch.task is not None and all(w.future.done() for w in batch.waiters):
            batch.task.cancel()

    def _flush(self) -> None:
        """Send everything queued: the request it waited for has ended."""
        for key in list(self._queues):
            self._start_group(key, dict(key))

    def _start_group(self, key: frozenset[tuple[str, Hashable]], params: Mapping[str, Hashable]) -> None:
        batch: list[_Waiter[R]] = []
        size = 0
        for waiter in self._queues.pop(key, []):
            if waiter.future.done():
                continue  # left while queued (a cancelled wait cancels its future)
            if batch and size + len(waiter.prompts) > self._max:
                self._start(batch, params)
                batch, size = [], 0
            batch.append(waiter)
            size += len(waiter.prompts)
        if batch:
            self._start(batch, params)

    def _start(self, waiters: list[_Waiter[R]], params: Mapping[str, Hashable]) -> None:
        batch = _Batch(waiters)
        offset = 0
        for waiter in waiters:
            waiter.batch, waiter.offset = batch, offset
            offset += len(waiter.prompts)
        self._in_flight += 1
        # A task of its own, so no one caller's leaving ends the request for the others.
        batch.task = asyncio.get_running_loop().create_task(self._run(batch, params))
        self._tasks.add(batch.task)
        batch.task.add_done_callback(self._done)

    async def _run(self, batch: _Batch[R], params: Mapping[str, Hashable]) -> None:
        prompts = [p for w in batch.waiters for p in w.prompts]
        longest = max((w.deadline for w in batch.waiters), key=lambda d: d.remaining)
        try:
            reply = await self._send(prompts, params, longest)
        except Exception as exc:
            for waiter in batch.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
            return
        except BaseException:
            # Cancelled (every caller has left) or interrupted: nobody may wait for an answer that will not come.
            for waiter in batch.waiters:
                waiter.future.cancel()
            raise
        billed = False
        for waiter in batch.waiters:
            if not waiter.future.done():
                waiter.future.set_result(Share(waiter.offset, reply, billed=not billed))
                billed = True

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1
        self._flush()
