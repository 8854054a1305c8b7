"""``fastslow calibrate`` and ``fastslow tune`` composed: the engines, the decision log and prices passed in.

The fits themselves are ``fastslow.policies.tuning``'s (``collect``, ``collect_from_log``,
``tune``, ``calibrate_task``, ``apply_fit``): they run the task over an evaluation file exactly as
``fastslow eval`` does, or read its outcomes back from the decision log, fit on one split and
report on the other, and write the result into the policy file with a ``fitted:`` record beside
it. This module supplies what they ask of the outside: ``evaluate`` with the engines, the store,
and what a System-2 call costs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from fastslow.policies.tuning import (
    HELD_OUT,
    MAP_KEYS,
    REMOVE,
    SAMPLE_WORDS,
    Collected,
    Fit,
    Sample,
    calibrate_task,
    load_task,
    logged_label,
    sample_weight,
    tune,
)
from fastslow.policies.tuning import apply_fit as apply
from fastslow.policies.tuning import collect as collect_rows
from fastslow.policies.tuning import collect_from_log as collect_logged
from fastslow.policies.tuning import plot_fit as plot
from fastslow.policies.tuning import system2_cost_per_call as cost_per_call
from fastslow.router import Settings, Task

from ._evaluate import evaluate

if TYPE_CHECKING:
    from .store import DecisionStore

__all__ = [
    "MAP_KEYS",
    "REMOVE",
    "SAMPLE_WORDS",
    "Collected",
    "Fit",
    "Sample",
    "apply",
    "calibrate_task",
    "collect",
    "collect_from_log",
    "load_task",
    "log_opener",
    "logged_label",
    "plot",
    "sample_weight",
    "system2_cost_per_call",
    "tune_task",
]


collect = partial(collect_rows, evaluate=evaluate)
"""``fastslow.policies.tuning.collect``, run by ``fastslow eval``'s engines (its ``evaluate`` given)."""


async def collect_from_log(
    *,
    settings: Settings,
    policy: Path,
    task: str,
    tenant: str | None = None,
    sample: Sample | None = None,
    held_out: float = HELD_OUT,
    seed: int = 0,
) -> Collected:
    """``fastslow.policies.tuning.collect_from_log`` over the settings' decision log."""
    return await collect_logged(
        log_opener(settings),
        settings=settings,
        policy=policy,
        task=task,
        tenant=tenant,
        sample=sample,
        held_out=held_out,
        seed=seed,
    )


def log_opener(settings: Settings) -> Callable[[], Awaitable[DecisionStore]]:
    """Opens the settings' decision log when called: the library opens it once the arguments are checked."""

    async def open_log() -> DecisionStore:
        # The store (and SQLAlchemy) loads only when a command reads the log.
        from .store import DecisionStore, database_url_for

        return await DecisionStore.open(database_url_for(settings))

    return open_log


def system2_cost_per_call(settings: Settings, task: Task, mean_state_chars: float) -> tuple[str, float | None]:
    """The task's System-2 model and its estimated cost of one call, at the chat engines' prices."""
    from fastslow.engines.chat import call_cost

    return cost_per_call(settings, task, mean_state_chars, call_cost)


def tune_task(
    c: Collected,
    data: str | Path,
    settings: Settings,
    *,
    target: float,
    level: float,
    max_false_deny: float,
    max_miss: float,
    seed: int = 0,
) -> Fit:
    """``fastslow.policies.tuning.tune``, with what a System-2 call costs from the chat engines.

    Raises:
        TooFewLabels: the message names the number of labelled decisions needed.
    """
    from fastslow.engines.chat import call_cost

    return tune(
        c,
        data,
        settings,
        call_cost=call_cost,
        target=target,
        level=level,
        max_false_deny=max_false_deny,
        max_miss=max_miss,
        seed=seed,
    )
