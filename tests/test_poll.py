"""``polling``: a step every interval in the background, failures logged, cancelled with its block."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fastslow.router import polling

log = logging.getLogger("fastslow.test_poll")


async def _until(condition: asyncio.Event, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        await condition.wait()


async def test_the_first_step_waits_one_interval_unless_at_once() -> None:
    later: list[int] = []
    at_once: list[int] = []

    async def step_later() -> None:
        later.append(1)

    async def step_at_once() -> None:
        at_once.append(1)

    async with polling(step_later, 3600.0, name="later", log=log, failure="failed"):
        await asyncio.sleep(0.01)
    async with polling(step_at_once, 3600.0, name="at-once", log=log, failure="failed", at_once=True):
        await asyncio.sleep(0.01)
    assert later == [] and at_once == [1]


async def test_a_failing_step_is_logged_and_polling_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    again = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        again.set()

    with caplog.at_level(logging.ERROR, logger=log.name):
        async with polling(step, 0.001, name="flaky", log=log, failure="the step failed"):
            await _until(again)
    assert [(r.getMessage(), r.exc_info is not None) for r in caplog.records] == [("the step failed", True)]
    assert "boom" in caplog.text


async def test_leaving_the_block_cancels_a_step_in_progress() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def step() -> None:
        started.set()
        try:
            await asyncio.sleep(3600.0)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with polling(step, 3600.0, name="slow", log=log, failure="failed", at_once=True):
        await _until(started)
    assert cancelled.is_set()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "slow"]


async def test_the_background_task_carries_its_name() -> None:
    async def step() -> None:
        pass

    async with polling(step, 3600.0, name="fastslow-test-poll", log=log, failure="failed"):
        assert [t.get_name() for t in asyncio.all_tasks() if t.get_name() == "fastslow-test-poll"]


@pytest.mark.parametrize("interval_s", [0.0, -1.0])
async def test_the_interval_must_be_positive(interval_s: float) -> None:
    async def step() -> None:
        pass

    with pytest.raises(ValueError, match="must be positive"):
        async with polling(step, interval_s, name="bad", log=log, failure="failed"):
            pass
