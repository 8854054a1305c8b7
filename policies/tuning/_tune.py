"""``fastslow tune``: a task's thresholds (a route, a classification) or bands (a check) from labelled decisions.

Thresholds keep the most decisions in System 1 while a lower confidence bound on their held-out
accuracy meets the target (``tune_thresholds``); bands bound the benign states denied and the
violations allowed (``tune_bands``). The record says what System 1 keeps and, where the System-2
model has a price in the settings, what that saves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from fastslow.router import CheckTask, RouteTask, Settings, Task
from fastslow.router.settings import ModelPrice

from ._collect import Collected
from ._fit import Fit, base_record, labelled
from ._select import (
    CONFIDENCE_GRID,
    MARGIN_GRID,
    BandChoice,
    ThresholdChoice,
    TooFewLabels,
    tune_bands,
    tune_thresholds,
)

__all__ = ["OUTPUT_TOKENS", "PROMPT_TOKENS", "CallCost", "system2_cost_per_call", "threshold_warnings", "tune"]

OUTPUT_TOKENS = 16
"""Tokens a System-2 answer to a typed question takes (an option name and a little JSON)."""
PROMPT_TOKENS = 150
"""Tokens of instructions and option descriptions around the state in a System-2 prompt (an estimate)."""


class CallCost(Protocol):
    """US dollars for one System-2 call at ``price`` (``fastslow.engines.chat.call_cost``); ``None``: no price."""

    def __call__(self, price: ModelPrice | None, *, input_tokens: int, output_tokens: int) -> float | None: ...


def system2_cost_per_call(
    settings: Settings, task: Task, mean_state_chars: float, call_cost: CallCost
) -> tuple[str, float | None]:
    """The task's System-2 model and its estimated cost of one call (``None`` without a price in the settings).

    Input tokens: the state at four characters a token plus ``PROMPT_TOKENS``; output: ``OUTPUT_TOKENS``.
    """
    ref = task.escalate_to or settings.system2.default
    price: ModelPrice | None = settings.system2.prices.get(ref)
    tokens = int(round(mean_state_chars / 4.0)) + PROMPT_TOKENS
    return ref, call_cost(price, input_tokens=tokens, output_tokens=OUTPUT_TOKENS)


def _money(x: float) -> str:
    return f"${x:,.4f}" if x < 1 else f"${x:,.2f}"


def tune(
    c: Collected,
    data: str | Path,
    settings: Settings,
    *,
    call_cost: CallCost,
    target: float,
    level: float,
    max_false_deny: float,
    max_miss: float,
    seed: int = 0,
) -> Fit:
    """Thresholds (a route or classification) or bands (a check) for ``c.task``, as a ``Fit`` to apply.

    Args:
        c: the task's labelled decisions (``collect`` or ``collect_from_log``).
        data: what they came from, for the record.
        settings: the System-2 model and its price, for the savings.
        call_cost: what a call at a price costs (the composition root passes the chat engines' own).
        target: the accuracy the kept decisions must show (routes, classifications).
        level: the confidence level of the bounds.
        max_false_deny: checks: the most benign states denied (a share).
        max_miss: checks: the most violations allowed (a share).
        seed: the bootstrap's seed.

    Raises:
        TooFewLabels: the message names the number of labelled decisions needed.
    """
    if isinstance(c.task, CheckTask):
        return _tune_check(c, data, max_false_deny=max_false_deny, max_miss=max_miss, level=level, seed=seed)
    choice = tune_thresholds(labelled(c.fit), labelled(c.held_out), target=target, level=level, seed=seed)
    h = choice.held_out
    ref, per_call = system2_cost_per_call(settings, c.task, c.mean_state_chars, call_cost)
    record = {
        **base_record("tune", c, data),
        "target_accuracy": target,
        "level": level,
        "held_out": {
            "kept": round(h.kept, 4),
            "escalated": round(1.0 - h.kept, 4),
            "accuracy": round(h.accuracy, 4),
            "lower_bound": round(h.lower, 4),
            "kept_decisions": h.n_kept,
            "decisions": choice.n_held_out,
        },
    }
    lines = [
        f"thresholds for {c.task.name}: min_confidence {choice.min_confidence}, min_margin {choice.min_margin}",
        f"held out ({choice.n_held_out} decisions): System 1 keeps {h.kept:.1%} (escalates {1 - h.kept:.1%}) at "
        f"{h.accuracy:.2%} accuracy; the {level:.0%} lower bound {h.lower:.2%} clears the {target:.1%} target by "
        f"{100 * (h.lower - target):.2f} points ({choice.tested} of {len(choice.curve)} points of the path tested)",
        _savings(h.kept, ref, per_call),
    ]
    edits: list[tuple[tuple[str, ...], Any]] = [
        (("tasks", c.task.name, "thresholds", "min_confidence"), choice.min_confidence),
        (("tasks", c.task.name, "thresholds", "min_margin"), choice.min_margin),
    ]
    if per_call is not None:
        record["cost_saved_per_1000_usd"] = round(1000 * h.kept * per_call, 6)
    record["system2"] = ref
    edits.append((("tasks", c.task.name, "fitted", "thresholds"), record))
    return Fit(edits=edits, record=record, lines=lines, curve=choice, warnings=threshold_warnings(c, choice))


def threshold_warnings(c: Collected, choice: ThresholdChoice) -> list[str]:
    """What tuned thresholds cannot vouch for: out-of-scope traffic the rows never showed, a point at
    the edge of the search (the target did not bind there, so the rows say little about it)."""
    out: list[str] = []
    if isinstance(c.task, RouteTask):
        none = c.task.none_option
        if none is None:
            out.append(
                f"task {c.task.name!r} has no none_of_these route, so no labelled row can show how these thresholds "
                "treat messages that fit no route; such messages are kept whenever they clear them "
                "(docs/policies.md: none_of_these)"
            )
        elif not any(p.label == none for p in c.fit + c.held_out):
            out.append(
                f"no row is labelled {none!r} (out of scope): the rows cannot show how these thresholds treat "
                "messages that fit no route, and out-of-scope traffic may be kept at them; add labelled "
                f"out-of-scope rows (label {none!r}), e.g. from `fastslow data convert clinc150-domain`"
            )
    loosest = (min(CONFIDENCE_GRID), min(MARGIN_GRID))
    if (choice.min_confidence, choice.min_margin) == loosest:
        out.append(
            f"the chosen thresholds (min_confidence {loosest[0]}, min_margin {loosest[1]}) are the loosest the "
            f"search tries: the {choice.target:.1%} target did not bind on these rows, so they say nothing about "
            "where accuracy would fall below it; check that the rows are like the traffic (out-of-scope included) "
            "or raise --target-accuracy"
        )
    elif choice.min_confidence == min(CONFIDENCE_GRID):
        out.append(
            f"min_confidence {choice.min_confidence} is the lowest the search tries: the target did not bind on "
            "confidence, only on the margin"
        )
    elif choice.min_confidence == max(CONFIDENCE_GRID):
        out.append(
            f"min_confidence {choice.min_confidence} is the highest the search tries: the target holds only at its "
            "strictest point, keeping few decisions; more or better examples, or a lower target, would keep more"
        )
    return out


def _savings(kept: float, ref: str, per_call: float | None) -> str:
    if per_call is None:
        return (
            f"cost saved: {kept:.1%} of decisions need no System-2 call; {ref} has no price in the settings "
            "(FASTSLOW_SYSTEM2__PRICES) to put a figure on it"
        )
    return (
        f"cost saved: {_money(1000 * kept * per_call)} per 1,000 decisions against sending all to {ref} "
        f"(an estimated {_money(per_call)} a call; System 1 runs here at no per-call cost)"
    )


def _tune_check(
    c: Collected, data: str | Path, *, max_false_deny: float, max_miss: float, level: float, seed: int
) -> Fit:
    # The bands' candidates are ordered before any data is seen, so both splits take part in the test.
    everything = c.fit + c.held_out
    assert isinstance(c.task, CheckTask)
    record: dict[str, Any] = {
        **base_record("tune", c, data),
        "max_false_deny": max_false_deny,
        "max_miss": max_miss,
        "level": level,
        "rules": {},
    }
    edits: list[tuple[tuple[str, ...], Any]] = []
    lines: list[str] = []
    for name, rule in c.task.rules.items():
        rows = [p for p in everything if p.question == name]
        if not rows:
            lines.append(f"rule {name}: no labelled decisions, bands left as they are")
            continue
        violation = rule.action.violation
        try:
            bands = tune_bands(
                [p.probabilities.get(violation, 0.0) for p in rows],
                [p.label == violation for p in rows],
                max_false_deny=max_false_deny,
                max_miss=max_miss,
                level=level,
                weights=[p.weight for p in rows],
                seed=seed,
            )
        except TooFewLabels as exc:
            raise TooFewLabels(f"rule {name}: {exc}") from exc
        record["rules"][name] = _band_record(bands)
        edits += [
            (("tasks", c.task.name, "rules", name, "allow_at"), bands.allow_at),
            (("tasks", c.task.name, "rules", name, "deny_at"), bands.deny_at),
        ]
        lines.append(
            f"rule {name}: allow_at {bands.allow_at}, deny_at {bands.deny_at}: benign denied {bands.false_deny:.1%} "
            f"(bound {bands.false_deny_upper:.1%} <= {max_false_deny:.1%}), violations allowed {bands.miss:.1%} "
            f"(bound {bands.miss_upper:.1%} <= {max_miss:.1%}); sent to review: {bands.review_benign:.1%} of benign, "
            f"{bands.review_violations:.1%} of violations ({bands.n_benign} benign, {bands.n_violations} violations)"
        )
    if not record["rules"]:
        raise TooFewLabels(f"no rule of {c.task.name} has labelled decisions in {data}")
    edits.append((("tasks", c.task.name, "fitted", "bands"), record))
    return Fit(edits=edits, record=record, lines=lines)


def _band_record(b: BandChoice) -> dict[str, Any]:
    return {
        "false_deny": round(b.false_deny, 4),
        "false_deny_bound": round(b.false_deny_upper, 4),
        "miss": round(b.miss, 4),
        "miss_bound": round(b.miss_upper, 4),
        "review_benign": round(b.review_benign, 4),
        "review_violations": round(b.review_violations, 4),
        "benign": b.n_benign,
        "violations": b.n_violations,
    }
