"""``polling``: one step every so many seconds in a background task, while a block runs.

The policy watcher (``PolicyStore.watching``) and the learner (``Learner.running``) both keep a
loop going beside the requests they serve: a step that fails is logged and the loop goes on (a disk
or database blip must not stop it for good), and leaving the block cancels the loop and waits for
it, so nothing of it outlives the block.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["polling"]


@contextlib.asynccontextmanager
async def polling(
    step: Callable[[], Awaitable[object]],
    interval_s: float,
    *,
    name: str,
    log: logging.Logger,
    failure: str,
    at_once: bool = False,
) -> AsyncIterator[None]:
    """Await ``step()`` every ``interval_s`` seconds in a background task while the block runs.

    Args:
        step: one round of work; a blocking one belongs in a worker thread (``asyncio.to_thread``).
        interval_s: the pause between the end of one step and the start of the next.
        name: the background task's name.
        log: where a step's exception is logged, with its traceback.
        failure: the message it is logged with.
        at_once: the first step runs on entering the block; otherwise after one interval.

    Leaving the block cancels the task (a step in progress included) and waits for it to end.

    Raises:
        ValueError: ``interval_s`` is not positive.

    Example:
        ```python
        async with polling(store.refresh, 5.0, name="refresh", log=log, failure="refresh failed"):
            ...
        ```
    """
    if interval_s <= 0:
        raise ValueError(f"{name}: the polling interval must be positive, got {interval_s!r}")
    task = asyncio.create_task(_loop(step, interval_s, log, failure, at_once=at_once), name=name)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _loop(
    step: Callable[[], Awaitable[object]], interval_s: float, log: logging.Logger, failure: str, *, at_once: bool
) -> None:
    if not at_once:
        await asyncio.sleep(interval_s)
    while True:
        try:
            await step()
        except Exception:  # keep polling; cancellation (a BaseException) still ends the loop
            log.exception(failure)
        await asyncio.sleep(interval_s)
