"""``fastslow report drift`` composed: ``fastslow.policies.tuning.drift`` over the settings' decision log."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from fastslow.policies.tuning import COVERAGE_SHIFT, Drift
from fastslow.policies.tuning import drift as drift_from
from fastslow.router import Settings

from ._tune import log_opener

__all__ = ["COVERAGE_SHIFT", "Drift", "drift"]


async def drift(
    *,
    settings: Settings,
    policy: Path,
    task: str,
    tenant: str | None = None,
    since: datetime | None = None,
    level: float = 0.95,
) -> Drift:
    """Compare the log with the task's fitted records (``fastslow.policies.tuning.drift``).

    Raises:
        ConfigError: an unknown task, or a task with nothing fitted to compare with.
    """
    return await drift_from(
        log_opener(settings),
        settings=settings,
        policy=policy,
        task=task,
        tenant=tenant,
        since=since,
        level=level,
    )
