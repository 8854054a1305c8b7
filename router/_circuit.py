"""A circuit breaker: the per-engine state machine, and what it counts as the engine's failure.

``CircuitBreaker`` is per-process state with three states:

    closed ──(``failures`` consecutive failures)──> open ──(``open_s`` seconds)──> half-open
      ^                                              ^                               │
      └──────────────(a probe succeeds)──────────────┼───────(a probe fails)─────────┘

While open, calls fail at once with ``CircuitOpen`` (an ``EngineUnavailable``) and never reach the
engine; half-open lets ``probes`` calls through, and the first of them to end decides.

It counts *consecutive* failures rather than a failure rate over a rolling window: a rate needs a
minimum volume to mean anything, so on a quiet single deployment (a few calls a minute) a window
either never fills or opens on two unlucky calls, while "N in a row" behaves the same at any
traffic. One success resets the count, so a flaky engine that answers most calls stays closed.

What counts as a failure (``counts_as_failure``): an engine that cannot serve anyone. Timeouts,
unreachable engines, 5xx, 429 (the upstream is shedding load), protocol errors, and an upstream
401/403/404/407 (our key or URL is wrong: every call will fail alike). Not: ``InvalidRequest`` and the
other 4xx (the caller's input), ``Overloaded`` (our own queue), cancellation or ``Abandoned`` (the
caller left), ``ConfigError`` (raised before anything is sent) and exceptions outside the error tree.

The wrappers that put a breaker in front of an engine are in ``_breaker``; they settle a call
cancelled at its budget as the ``EngineTimeout`` it stands for, not as a cancellation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from ._errors import EngineError, EngineHTTPError, EngineUnavailable

__all__ = [
    "BreakerSnapshot",
    "BreakerState",
    "CircuitBreaker",
    "CircuitOpen",
    "OnChange",
    "Permit",
    "counts_as_failure",
]

BreakerState: TypeAlias = Literal["closed", "open", "half_open"]
OnChange: TypeAlias = Callable[[str, BreakerState, BreakerState], None]
"""Called as ``on_change(name, old, new)`` after each state change, outside the breaker's lock."""

# Upstream statuses that say the engine cannot serve anyone (our credentials, URL or proxy are
# wrong, or it is timing out or shedding load), as opposed to a 4xx about this one request.
_ENGINE_FAULT_STATUSES = frozenset({401, 403, 404, 407, 408, 429})


def counts_as_failure(error: BaseException) -> bool:
    """Whether ``error`` says the engine cannot serve (see the module docstring), so a breaker counts it."""
    if isinstance(error, CircuitOpen):
        return False  # our own fast failure, not news about the engine
    if isinstance(error, EngineHTTPError):
        return error.status >= 500 or error.status in _ENGINE_FAULT_STATUSES
    return isinstance(error, EngineError)


class CircuitOpen(EngineUnavailable):
    """A breaker is open: the call was refused without reaching the engine.

    Attributes:
        retry_after_s: seconds until the breaker lets a probe through.
    """

    def __init__(self, message: str, *, engine: str = "", retry_after_s: float = 0.0) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, engine=engine)


@dataclass(frozen=True, slots=True, kw_only=True)
class BreakerSnapshot:
    """A breaker's state at one moment, for readiness and metrics."""

    name: str
    state: BreakerState
    consecutive_failures: int
    """Failures in a row while closed; the count that opened it while open or half-open."""
    opened_at: float | None
    """When it last opened, on the breaker's clock; ``None`` while closed."""
    next_probe_at: float | None
    """When it lets a probe through, on the breaker's clock; ``None`` unless open."""
    retry_after_s: float
    """Seconds from this snapshot until ``next_probe_at`` (0 unless open)."""


@dataclass(frozen=True, slots=True)
class Permit:
    """Leave to make one call; hand it back to ``CircuitBreaker.settle`` when the call ends."""

    generation: int
    probe: bool


class CircuitBreaker:
    """Fail fast after repeated engine failures, and probe for recovery (see the module docstring).

    Thread-safe: sync callers (``decide_sync``) and the event loop share one breaker.

    Args:
        name: the engine's name, in errors and passed to ``on_change``.
        failures: consecutive failures that open the breaker.
        open_s: seconds it stays open before letting probes through.
        probes: calls let through at once while half-open.
        clock: monotonic seconds; injectable for tests.
        on_change: called ``(name, old, new)`` after each change of state.
    """

    def __init__(
        self,
        name: str,
        *,
        failures: int = 5,
        open_s: float = 30.0,
        probes: int = 1,
        clock: Callable[[], float] = time.monotonic,
        on_change: OnChange | None = None,
    ) -> None:
        if failures < 1 or probes < 1 or open_s < 0:
            raise ValueError("failures and probes must be at least 1 and open_s not negative")
        self.name = name
        self.failures = failures
        self.open_s = open_s
        self.probes = probes
        self._clock = clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._count = 0
        self._opened_at: float | None = None
        self._in_flight = 0
        # Bumped on every change of state, so a call admitted before one cannot settle the next.
        self._generation = 0

    @property
    def state(self) -> BreakerState:
        """The state now (an open breaker whose time is up reads as half-open)."""
        return self.snapshot().state

    @property
    def closed(self) -> bool:
        """Whether the breaker is closed, without moving it on (cheap: read before every retry)."""
        return self._state == "closed"

    def snapshot(self) -> BreakerSnapshot:
        """The state now, with what opened it and when it probes next."""
        with self._lock:
            now = self._clock()
            changes = self._tick(now)
            wait = self._wait(now)
            opened = self._opened_at
            snap = BreakerSnapshot(
                name=self.name,
                state=self._state,
                consecutive_failures=self._count,
                opened_at=self._opened_at,
                next_probe_at=opened + self.open_s if self._state == "open" and opened is not None else None,
                retry_after_s=wait,
            )
        self._notify(changes)
        return snap

    def admit(self) -> Permit:
        """Leave for one call; raises ``CircuitOpen`` while open or while every probe is out."""
        with self._lock:
            now = self._clock()
            changes = self._tick(now)
            permit: Permit | None = None
            if self._state == "closed":
                permit = Permit(self._generation, probe=False)
            elif self._state == "half_open" and self._in_flight < self.probes:
                self._in_flight += 1
                permit = Permit(self._generation, probe=True)
            wait = self._wait(now)
        self._notify(changes)
        if permit is None:
            raise self._refusal(wait)
        return permit

    def settle(self, permit: Permit, error: BaseException | None) -> None:
        """Record how a call admitted with ``permit`` ended: ``None`` for a success, else what it raised."""
        if error is None:
            self._end(permit, "success")
        else:
            self._end(permit, "failure" if counts_as_failure(error) else "neutral")

    def release(self, permit: Permit) -> None:
        """Hand back a ``permit`` that was never used (a probe slot included): neither success nor failure."""
        self._end(permit, "neutral")

    def _end(self, permit: Permit, outcome: Literal["success", "failure", "neutral"]) -> None:
        with self._lock:
            changes: list[tuple[BreakerState, BreakerState]] = []
            if permit.generation == self._generation:
                if permit.probe:
                    self._in_flight -= 1
                    if outcome != "neutral":
                        changes.append(self._open() if outcome == "failure" else self._close())
                elif outcome == "failure":
                    self._count += 1
                    if self._count >= self.failures:
                        changes.append(self._open())
                elif outcome == "success":
                    self._count = 0
        self._notify(changes)

    def reset(self) -> None:
        """Close the breaker now (an operator's override)."""
        with self._lock:
            changes = [] if self._state == "closed" else [self._close()]
            self._count = 0
        self._notify(changes)

    # --- under the lock -----------------------------------------------------------------------

    def _tick(self, now: float) -> list[tuple[BreakerState, BreakerState]]:
        """Move an open breaker whose time is up to half-open (lazily: no timer thread)."""
        if self._state == "open" and self._opened_at is not None and now >= self._opened_at + self.open_s:
            return [self._move("half_open")]
        return []

    def _wait(self, now: float) -> float:
        if self._state == "open" and self._opened_at is not None:
            return max(0.0, self._opened_at + self.open_s - now)
        return 0.0

    def _open(self) -> tuple[BreakerState, BreakerState]:
        self._opened_at = self._clock()
        return self._move("open")

    def _close(self) -> tuple[BreakerState, BreakerState]:
        self._count = 0
        self._opened_at = None
        return self._move("closed")

    def _move(self, new: BreakerState) -> tuple[BreakerState, BreakerState]:
        old, self._state = self._state, new
        self._generation += 1
        self._in_flight = 0
        return old, new

    # --- outside the lock ---------------------------------------------------------------------

    def _refusal(self, wait: float) -> CircuitOpen:
        if wait > 0:
            message = f"circuit open after {self.failures} consecutive failures; next probe in {wait:.1f} s"
        else:
            message = "circuit half-open: a probe call is already testing the engine"
        return CircuitOpen(message, engine=self.name, retry_after_s=wait)

    def _notify(self, changes: Sequence[tuple[BreakerState, BreakerState]]) -> None:
        # Outside the lock, so a callback may read ``snapshot()`` without deadlocking.
        if self._on_change is not None:
            for old, new in changes:
                if old != new:
                    self._on_change(self.name, old, new)
