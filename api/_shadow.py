"""``fastslow report shadow`` composed: ``fastslow.policies.tuning.shadow_report`` over the settings' log."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from fastslow.policies.tuning import Shadow
from fastslow.policies.tuning import shadow_report as report_from
from fastslow.router import Settings

from ._tune import log_opener

__all__ = ["Shadow", "shadow_report"]


async def shadow_report(
    *, settings: Settings, policy: Path, task: str, tenant: str | None = None, since: datetime | None = None
) -> Shadow:
    """Agreement, what would have been kept at what accuracy, and savings (``fastslow.policies.tuning.shadow_report``).

    Raises:
        ConfigError: an unknown task.
    """
    return await report_from(
        log_opener(settings),
        settings=settings,
        policy=policy,
        task=task,
        tenant=tenant,
        since=since,
    )
