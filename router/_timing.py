"""A time budget shared by every attempt of one call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["Deadline"]


@dataclass(slots=True)
class Deadline:
    """Seconds left of a call's budget, read from a monotonic clock."""

    budget_s: float
    started: float = field(default_factory=time.monotonic)

    @property
    def remaining(self) -> float:
        return max(0.0, self.budget_s - (time.monotonic() - self.started))

    @property
    def expired(self) -> bool:
        return self.remaining <= 0.0
