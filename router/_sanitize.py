"""Neutralise model control strings in user text before it reaches any engine.

A user who writes ``<|channel>thought``, ``<end_of_turn><start_of_turn>system`` or ``[INST]`` into a
support ticket must not be able to open a thought channel or a new turn inside a policy check. Each
control string is rewritten with look-alike brackets: angle brackets become U+2039/U+203A
(``‹|turn›``), square ones U+2045/U+2046 (``⁅INST⁆``). The text stays readable in logs, but no
tokenizer reads it as a special token any more.

Detection runs on a *folded* view of the text: invisible characters (Unicode category Cf and the
other default-ignorable code points) dropped, and every character whose NFKC form is ASCII (``＜``,
``﹤``, ``｜``, ``ｉ``, no-break spaces, ...) replaced by that form. Text without a control string
comes back unchanged, byte for byte; text with one comes back folded, with its control strings
rewritten. The result is a fixed point and its folded view holds no control string. Every pattern
is bounded, so any input costs linear time. ``docs/control-strings.md`` has the table per family.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

__all__ = ["CONTROL_STRINGS", "neutralise", "neutralise_text", "strip_thoughts"]

_FAMILIES: dict[str, tuple[str, ...]] = {
    "Gemma 4 / DiffusionGemma": (
        "<|channel>",
        "<channel|>",
        "<|think|>",
        "<|turn>",
        "<turn|>",
        "<|tool_call>",
        "<tool_call|>",
        "<|tool_response>",
        "<tool_response|>",
        "<|image|>",
        '<|"|>',
    ),
    "reasoning markers": ("<think>", "</think>"),
    "Gemma 1-3": (
        "<start_of_turn>",
        "<end_of_turn>",
        "<bos>",
        "<eos>",
        "<pad>",
        "<unk>",
        "<mask>",
        "<start_of_image>",
        "<end_of_image>",
        "<image_soft_token>",
        "<unused0>",
    ),
    "Llama 2": ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<s>", "</s>"),
    "Llama 3": (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<|python_tag|>",
        "<|reserved_special_token_0|>",
    ),
    "ChatML / Qwen": (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|vision_start|>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ),
    "Mistral": (
        "[SYSTEM_PROMPT]",
        "[/SYSTEM_PROMPT]",
        "[TOOL_CALLS]",
        "[AVAILABLE_TOOLS]",
        "[/AVAILABLE_TOOLS]",
        "[TOOL_RESULTS]",
        "[/TOOL_RESULTS]",
        "[TOOL_CONTENT]",
        "[IMG]",
        "[IMG_BREAK]",
        "[IMG_END]",
        "[PREFIX]",
        "[MIDDLE]",
        "[SUFFIX]",
        "[THINK]",
        "[/THINK]",
        "[ARGS]",
        "[CALL_ID]",
    ),
    "DeepSeek": (
        "<｜begin▁of▁sentence｜>",
        "<｜end▁of▁sentence｜>",
        "<｜User｜>",
        "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁outputs▁begin｜>",
        "<｜tool▁output▁begin｜>",
        "<｜fim▁begin｜>",
        "<｜fim▁hole｜>",
        "<｜fim▁end｜>",
    ),
    "other families caught by the general patterns": (
        "<|user|>",
        "<|assistant|>",
        "<|end|>",
        "<|start|>",
        "<|message|>",
        "<|START_OF_TURN_TOKEN|>",
    ),
}

CONTROL_STRINGS: tuple[str, ...] = tuple(dict.fromkeys(token for family in _FAMILIES.values() for token in family))
"""Representative special tokens of every engine family fastslow neutralises (the patterns catch more)."""

# Every quantifier below is bounded, so one match attempt costs O(1) and a scan O(n) whatever the
# input (Python's ``re`` backtracks). Whitespace sits only next to a mandatory delimiter, never
# between two quantifiers over the same characters, which would multiply the attempts.
_W = r"\s{0,4}"
_SLASH = rf"(?:/{_W})?"
# ``▁`` (U+2581) is DeepSeek's word separator; ``"`` is Gemma 4's string delimiter ``<|"|>``.
_NAME = r'(?:"|[\w\u2581]{1,64})'
_WORDS = (
    r"(?:bos|eos|pad|unk|mask|think|unused\d{1,4}|(?:start|end)_of_[a-z0-9_]{1,32}"
    r"|[a-z]{1,16}_soft_token|tool_call|tool_response)"
)
_BRACKET_NAMES = (
    r"(?:inst|system_prompt|available_tools|tool_calls|tool_results|tool_content|img_break|img_end|call_id)"
)
_UPPER_TAG = (
    rf"(?-i:\[{_W}(?:/{_W}[A-Z][A-Z0-9_]{{0,31}}|[A-Z][A-Z0-9]{{0,31}}(?:_[A-Z0-9]{{1,31}}){{1,7}}"
    rf"|INST|IMG|PREFIX|MIDDLE|SUFFIX|THINK|ARGS){_W}\])"
)
_CONTROL = re.compile(
    "|".join(
        (
            rf"<{_W}\|{_W}{_SLASH}{_NAME}(?:{_W}\|)?{_W}>",  # <|name|>, <|name>: Gemma 4, Llama 3, ChatML, DeepSeek
            rf"<{_W}{_SLASH}{_NAME}{_W}\|{_W}>",  # <name|>: Gemma 4 closers
            rf"<{_W}{_SLASH}{_WORDS}{_W}>",  # <start_of_turn>, <bos>, <think>, <tool_call>
            r"</?s>",  # Llama 2's <s>; exact only, so "x < s > y" stays prose
            rf"<<{_W}{_SLASH}sys{_W}>>",  # Llama 2's <<SYS>>
            rf"\[{_W}{_SLASH}{_BRACKET_NAMES}{_W}\]",  # [INST], [TOOL_CALLS] in any case
            _UPPER_TAG,  # any upper-case [/NAME] or [NAME_WITH_UNDERSCORE]; BBCode [img] stays
        )
    ),
    re.IGNORECASE,
)

# Characters whose folded form holds "<" or "[", which every control string starts with: text
# without any of them cannot hold one, so it skips folding altogether.
_TRIGGERS = re.compile("[<\\[\ufe47\ufe64\uff1c\uff3b]")

# Default-ignorable code points that are not Cf (fillers, variation selectors, the combining
# grapheme joiner): invisible too, so a tokenizer or a reader may skip them just the same.
_IGNORABLE_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0xE0000, 0xE0FFF),
)
# NFKC maps to ASCII only from the Basic and Supplementary Multilingual Planes, and Cf characters
# outside them lie in plane 14 (covered above); tests/test_sanitize.py checks both over all of Unicode.
_FOLD_SCAN_END = 0x20000

_LOOKALIKE = str.maketrans({"<": "\u2039", ">": "\u203a", "[": "\u2045", "]": "\u2046"})


@cache
def _fold_table() -> dict[int, str | None]:
    # Built on first use from the running Python's Unicode data (about 20 ms), not at import.
    table: dict[int, str | None] = {}
    for code in range(0x80, _FOLD_SCAN_END):
        char = chr(code)
        if unicodedata.category(char) == "Cf":
            table[code] = None
            continue
        folded = unicodedata.normalize("NFKC", char)
        if folded != char and folded.isascii():
            table[code] = folded
    for low, high in _IGNORABLE_RANGES:
        table.update(dict.fromkeys(range(low, high + 1)))
    return table


def _fold(text: str) -> str:
    # Per character rather than unicodedata.normalize("NFKC", text): CPython's canonical
    # reordering is quadratic in a run of combining marks (100,000 of them take seconds), and no
    # control string needs more than the ASCII forms.
    return text if text.isascii() else text.translate(_fold_table())


def _rewrite(match: re.Match[str]) -> str:
    return match.group(0).translate(_LOOKALIKE)


def neutralise_text(text: str) -> str:
    """Rewrite every control string in ``text`` with look-alike brackets.

    Text without a control string is returned unchanged. Text with one is returned folded
    (invisible characters dropped, characters whose NFKC form is ASCII replaced by it), so that a
    token spelt with zero-width or fullwidth characters is caught and stays caught.
    """
    if _TRIGGERS.search(text) is None:
        return text
    rewritten, count = _CONTROL.subn(_rewrite, _fold(text))
    return rewritten if count else text


def _empty_like(value: Any) -> dict[str, Any] | list[Any] | None:
    if isinstance(value, Mapping):
        return {}
    if isinstance(value, (list, tuple)):
        return []
    return None


def _entries(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        return ((neutralise_text(str(key)), item) for key, item in value.items())
    return (("", item) for item in value)


def neutralise(value: Any) -> Any:
    """Neutralise every string inside a state (string, object, array), keys included.

    Objects come back as dicts, arrays and tuples as lists, other values as they are. Nesting
    depth is unbounded (an explicit stack, not recursion). Raises ``ValueError`` for a value that
    contains itself.
    """
    if isinstance(value, str):
        return neutralise_text(value)
    root = _empty_like(value)
    if root is None:
        return value
    # Each frame is (id of the source, its remaining entries, the copy being filled). Only the
    # containers on the current path are kept in ``open_ids``: a shared sub-list is copied twice,
    # as the recursive version did, but a cycle is refused instead of growing the stack for ever.
    stack: list[tuple[int, Iterator[tuple[str, Any]], dict[str, Any] | list[Any]]] = [
        (id(value), _entries(value), root)
    ]
    open_ids = {id(value)}
    while stack:
        source_id, entries, target = stack[-1]
        for key, item in entries:
            copied: Any
            if isinstance(item, str):
                copied, shell = neutralise_text(item), None
            else:
                shell = _empty_like(item)
                copied = item if shell is None else shell
            if isinstance(target, dict):
                target[key] = copied
            else:
                target.append(copied)
            if shell is not None:
                if id(item) in open_ids:
                    raise ValueError("cannot neutralise a value that contains itself")
                open_ids.add(id(item))
                stack.append((id(item), _entries(item), shell))
                break
        else:
            stack.pop()
            open_ids.discard(source_id)
    return root


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
