"""What a System-2 call cost, from the provider's token counts and the per-model prices in settings."""

from __future__ import annotations

from collections.abc import Iterable

from fastslow.router.settings import ModelPrice

__all__ = ["call_cost", "total_cost"]

_PER_TOKEN = 1e-6  # prices are per million tokens


def call_cost(
    price: ModelPrice | None, *, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0
) -> float | None:
    """US dollars for one call; ``None`` when the model has no price in the settings.

    Args:
        price: the model's price (``System2Settings.prices[ref]``).
        input_tokens: every input token, cached ones included (as OpenAI and vLLM report them).
        output_tokens: every output token, reasoning tokens included: providers bill thoughts as
            output even though they never reach the content.
        cached_input_tokens: the part of ``input_tokens`` read from the provider's prompt cache,
            billed at ``cached_input`` (``input`` when that is unset).
    """
    if price is None:
        return None
    cached = min(max(cached_input_tokens, 0), input_tokens)
    cached_rate = price.cached_input if price.cached_input is not None else price.input
    dollars = (input_tokens - cached) * price.input + cached * cached_rate + output_tokens * price.output
    return dollars * _PER_TOKEN


def total_cost(costs: Iterable[float | None]) -> float | None:
    """The sum of several calls' costs (a tool loop's rounds); ``None`` if any of them is unknown."""
    total = 0.0
    for cost in costs:
        if cost is None:
            return None
        total += cost
    return total
