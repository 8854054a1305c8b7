"""The log's figures as metrics: ``fastslow serve`` reads the shared decision log in the background.

Two rounds, each on its own interval (``Settings.metrics``), both started by the app's lifespan::

    async with LogMonitor(decisions, figures, settings=settings, policy=..., policy_path=...).running():
        ...

* every ``refresh_s``: each task's ``LogSummary`` over the last ``window_s`` (every tenant's
  decisions together), from ``DecisionStore.summary``: the function the console's overview uses,
  so the dashboard and the console show the same kept share, System-2 cost and saving;
* every ``drift_s``: ``fastslow report drift`` (``fastslow.api._drift.drift``) for each task of the
  policy in force that has a ``fitted:`` record, over the last ``drift_since_days``. It runs in a
  worker thread with a connection of its own, as the command does: its YAML parsing and numpy work
  stay off the loop that serves requests.

Every replica runs both over the same log, so every replica exports the same figures: dashboards
take their ``max`` across instances. A round that fails is logged and the figures of the last good
one stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from fastslow.api.store import DecisionStore, LogSummary
from fastslow.router import ConfigError, PolicySet, Settings, polling

if TYPE_CHECKING:
    # Only a type here: the tuning package (numpy) loads when a drift round first runs.
    from fastslow.policies.tuning import Drift

__all__ = ["FigureSink", "LogMonitor", "fitted_tasks"]

log = logging.getLogger("fastslow.metrics")


class FigureSink(Protocol):
    """Where the figures go (``fastslow.api.app``'s ``LogFigures`` collector)."""

    def set_summaries(self, summaries: Mapping[str, LogSummary]) -> None: ...

    def set_drift(self, drift: Mapping[str, Drift]) -> None: ...


def fitted_tasks(policy: PolicySet) -> list[str]:
    """The tasks ``report drift`` can judge: those with a fitted thresholds or calibration record."""
    return sorted(
        name for name, task in policy.tasks.items() if task.fitted.get("thresholds") or task.fitted.get("calibration")
    )


class LogMonitor:
    """Reads the log's figures into a ``FigureSink`` every so often (module docstring)."""

    def __init__(
        self,
        decisions: DecisionStore,
        sink: FigureSink,
        *,
        settings: Settings,
        policy: Callable[[], PolicySet],
        policy_path: Path,
    ) -> None:
        self._decisions = decisions
        self._sink = sink
        self._settings = settings
        self._policy = policy
        self._policy_path = policy_path
        self._drift: dict[str, Drift] = {}

    async def refresh(self) -> dict[str, LogSummary]:
        """Read every task's summary of the window into the sink; returns them."""
        until = datetime.now(UTC)
        since = until - timedelta(seconds=self._settings.metrics.window_s)
        summaries: dict[str, LogSummary] = {}
        for task in await self._decisions.summary_tasks(tenant=None, since=since):
            summary = await self._decisions.summary(tenant=None, task=task, since=since, until=until)
            if summary.decisions:
                summaries[task] = summary
        self._sink.set_summaries(summaries)
        return summaries

    async def check_drift(self) -> dict[str, Drift]:
        """Run ``report drift`` for each fitted task into the sink; returns the results."""
        # Read here, not in the thread: the tasks of the policy this replica has in force.
        tasks = fitted_tasks(self._policy())
        results = await asyncio.to_thread(asyncio.run, self._drift_of(tasks)) if tasks else {}
        self._drift = results
        self._sink.set_drift(results)
        return results

    async def _drift_of(self, tasks: list[str]) -> dict[str, Drift]:
        # Imported here: the drift composition loads the tuning package (numpy), needed by this round only.
        from fastslow.api._drift import drift

        since = datetime.now(UTC) - timedelta(days=self._settings.metrics.drift_since_days)
        results: dict[str, Drift] = {}
        for task in tasks:
            try:
                results[task] = await drift(settings=self._settings, policy=self._policy_path, task=task, since=since)
            except ConfigError as exc:
                # The file on disk changed since the policy in force was loaded (the reload alert covers
                # a broken one): keep the task's last figures rather than let its gauge vanish.
                log.warning("drift check of task %s failed: %s", task, exc)
                if task in self._drift:
                    results[task] = self._drift[task]
        return results

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[LogMonitor]:
        """Refresh the figures every ``refresh_s`` and check drift every ``drift_s`` while the block runs."""
        every = self._settings.metrics
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(
                polling(
                    self.refresh,
                    every.refresh_s,
                    name="fastslow-log-figures",
                    log=log,
                    failure="reading the decision log's figures for the metrics failed",
                    at_once=True,
                )
            )
            await stack.enter_async_context(
                polling(
                    self.check_drift,
                    every.drift_s,
                    name="fastslow-drift-check",
                    log=log,
                    failure="the drift check for the metrics failed",
                    at_once=True,
                )
            )
            yield self
