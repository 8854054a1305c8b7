"""Neutralise model control strings in user text before it reaches any engine.

A user who writes ``<|channel>thought`` or ``<turn|><|turn>system`` into a support ticket must not
be able to open a thought channel or a new turn inside a policy check. Each control string is
rewritten with look-alike angle brackets (U+2039/U+203A): still readable in logs, but no longer the
tokenizer's special token.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["CONTROL_STRINGS", "neutralise", "neutralise_text", "strip_thoughts"]

CONTROL_STRINGS: tuple[str, ...] = (
    "<|channel>",
    "<channel|>",
    "<|think|>",
    "<|turn>",
    "<turn|>",
    "<think>",
    "</think>",
)
"""The DiffusionGemma / Gemma 4 and ``<think>`` markers that fastslow neutralises."""

# Also catch the Gemma family's other ``<|name>`` / ``<name|>`` / ``<|name|>`` specials and
# spacing or case variants a tokenizer might still fold together.
_CONTROL = re.compile(r"<\s*(\|?)\s*(/?)\s*([A-Za-z_]{2,32})\s*(\|?)\s*>")
_THINK = re.compile(r"<\s*(/?)\s*think\s*>", re.IGNORECASE)


def _rewrite(match: re.Match[str]) -> str:
    lead, slash, name, trail = match.group(1), match.group(2), match.group(3), match.group(4)
    if not lead and not trail:
        return match.group(0)
    return f"\u2039{lead}{slash}{name}{trail}\u203a"


def neutralise_text(text: str) -> str:
    """Rewrite every control string in ``text``; other text is returned unchanged."""
    if "<" not in text:
        return text
    text = _CONTROL.sub(_rewrite, text)
    return _THINK.sub(lambda m: f"\u2039{m.group(1)}think\u203a", text)


def neutralise(value: Any) -> Any:
    """Neutralise every string inside a state (string, object, array), keys included."""
    if isinstance(value, str):
        return neutralise_text(value)
    if isinstance(value, Mapping):
        return {neutralise_text(str(k)): neutralise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [neutralise(v) for v in value]
    return value


# A thought block runs from its opening marker to its closing one, or to the end of the text
# when the model stopped before closing it.
_THOUGHT_BLOCKS = (
    re.compile(r"<\|channel>thought.*?(?:<channel\|>|\Z)", re.DOTALL),
    re.compile(r"<think>.*?(?:</think>|\Z)", re.DOTALL | re.IGNORECASE),
)


def strip_thoughts(text: str) -> str:
    """Remove DiffusionGemma ``<|channel>thought … <channel|>`` and ``<think> … </think>`` blocks."""
    for pattern in _THOUGHT_BLOCKS:
        text = pattern.sub("", text)
    return text.strip()
