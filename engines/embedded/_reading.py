"""What of a state the embedded engines read: bounded in the encoder's tokens, whatever its length or script.

The encoder's cost follows tokens, not characters: 4 KB of English is about 1,000 of e5's tokens,
4 KB of emoji or combining marks 4,000 (about 700 tokens take a second of one core here). So what
is read is measured, before any model work, with the tokenizer of the encoder that will read it
(``TokenCount``), and bounded in its tokens:

* Whitespace runs are squashed to one space first, so padding costs nothing and changes nothing.
* A route or classification reads the start and the end of a long text (``READ_START_CHARS`` and
  ``READ_END_CHARS``, shrunk until they fit ``READ_TOKENS``): what a message is about sits there,
  and the cost is then that of a short text.
* A policy check reads the text window by window (``CHECK_WINDOW_CHARS``, overlapping by
  ``CHECK_WINDOW_CHARS - CHECK_WINDOW_STEP``; a window over ``WINDOW_TOKENS`` is cut into pieces
  that fit) and takes the worst window, so one deny-worthy sentence in the middle of a long benign
  document is not averaged away. Its windows hold at most ``CHECK_READ_TOKENS`` tokens together
  (and ``CHECK_READ_CHARS`` characters); past that the engine says it read part of the state and
  the policy's ``on_oversize`` decides (``docs/limits.md``).

With both bounds, the most one state's reading costs is ``READ_TOKENS + CHECK_READ_TOKENS``
tokens, whatever it holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = [
    "CHECK_READ_CHARS",
    "CHECK_READ_TOKENS",
    "CHECK_WINDOW_CHARS",
    "CHECK_WINDOW_STEP",
    "MAX_CHECK_WINDOWS",
    "READ_END_CHARS",
    "READ_START_CHARS",
    "READ_TOKENS",
    "WINDOW_TOKENS",
    "CheckReading",
    "TokenCount",
    "check_reading",
    "check_windows",
    "ends",
    "squash",
]

TokenCount = Callable[[str], int]
"""Tokens the encoder feeds for a text, its prefix and special tokens included."""

READ_START_CHARS = 2_000
READ_END_CHARS = 1_000
READ_TOKENS = 256
"""What a route or classification reads of a state at most, in the encoder's tokens: about 1,100
characters of English; the start and end are shrunk to fit it. One model call: about 200 ms of e5
on two cores here, the longest step another tenant's short text can wait behind."""
CHECK_WINDOW_CHARS = 200
"""About 50 tokens of English: small enough that a one- or two-sentence injection decides its
window. Measured on a 20,000-character log of CLINC150 requests with a held-out injection in the
middle, the rule trained on the injection set's training split: with 400-character windows no
injection reached the deny band (0.8), with 200 six in ten did (median 0.84), while the log
without one stayed below it (0.77); 150-character windows denied the clean log too."""
CHECK_WINDOW_STEP = 150
WINDOW_TOKENS = 64
"""A check window's most tokens: 200 characters of English fit; of emoji or CJK a window is cut in
pieces of this many, so one window is one short step of the encoder whatever the script."""
CHECK_READ_TOKENS = 640
"""A check's windows together, at most, in the encoder's tokens (about 3,000 characters of
English). With ``READ_TOKENS`` of the start and end, a check reads at most 896 tokens, which costs
about 1.3 s of CPU here, under the shipped 2 s budget (``docs/limits.md``, "Price in tokens")."""
MAX_CHECK_WINDOWS = 200
CHECK_READ_CHARS = CHECK_WINDOW_STEP * (MAX_CHECK_WINDOWS - 1) + CHECK_WINDOW_CHARS
"""What a check reads of a state at most in characters (30,050 after squashing whitespace): the
bound that holds before any token is counted, and for engines that count none."""

_SHRINK_TRIES = 4


def squash(text: str) -> str:
    """``text`` with every run of whitespace made one space, and no space at either end."""
    return " ".join(text.split())


def _cut_back(text: str, end: int, floor: int) -> int:
    """``end`` moved back to just after a space, if there is one after ``floor``."""
    if end >= len(text):
        return len(text)
    space = text.rfind(" ", floor, end)
    return space + 1 if space > floor else end


def _ends(text: str, start_chars: int, end_chars: int) -> str:
    if len(text) <= start_chars + end_chars:
        return text
    head = text[: _cut_back(text, start_chars, start_chars // 2)].rstrip()
    tail_from = len(text) - end_chars
    space = text.find(" ", tail_from, tail_from + end_chars // 2)
    tail = text[space + 1 if space >= 0 else tail_from :]
    return f"{head} … {tail}" if head and tail else head or tail


def ends(text: str, count: TokenCount | None = None) -> str:
    """The start and the end of a squashed text, joined by `` … ``, or the text when it is short.

    With ``count``, both are shrunk until the result fits ``READ_TOKENS`` of that encoder.
    """
    out = _ends(text, READ_START_CHARS, READ_END_CHARS)
    if count is None:
        return out
    start, end = READ_START_CHARS, READ_END_CHARS
    for _ in range(_SHRINK_TRIES):
        tokens = count(out)
        if tokens <= READ_TOKENS:
            return out
        share = min(len(out), start + end) * READ_TOKENS / tokens * 0.9
        start = max(1, int(share * 2 / 3))
        end = max(1, int(share / 3))
        out = _ends(text, start, end)
    # Never more than one token a character: this many characters always fit.
    return _ends(text, (READ_TOKENS - 8) * 2 // 3, (READ_TOKENS - 8) // 3)


def _windows(text: str, size: int, step: int) -> Iterator[tuple[str, int]]:
    """Overlapping windows of a squashed text, cut at spaces, each with where the next one starts."""
    start = 0
    while start < len(text):
        end = _cut_back(text, start + size, start + size // 2)
        piece = text[start:end].strip()
        if end >= len(text):
            yield piece, len(text)
            return
        nxt = start + step
        space = text.find(" ", nxt, nxt + size // 4)
        start = space + 1 if space >= 0 else nxt
        yield piece, start


def check_windows(
    text: str, *, size: int = CHECK_WINDOW_CHARS, step: int = CHECK_WINDOW_STEP, limit: int = MAX_CHECK_WINDOWS
) -> tuple[list[str], bool]:
    """Overlapping windows of a squashed text, cut at spaces, and whether the text was longer than they cover.

    A text of one window is itself. At most ``limit`` windows are made. Characters only: what
    ``check_reading`` cuts further by tokens.
    """
    if len(text) <= size:
        return [text], False
    out: list[str] = []
    for piece, nxt in _windows(text, size, step):
        out.append(piece)
        if len(out) >= limit:
            return out, nxt < len(text)
    return out, False


def _fit(window: str, tokens: int, count: TokenCount) -> Iterator[tuple[str, int]]:
    """``window`` (of ``tokens`` tokens) in pieces of at most ``WINDOW_TOKENS``, cut at spaces where there are any."""
    if tokens <= WINDOW_TOKENS:
        yield window, tokens
        return
    # Aim below the limit so most first cuts fit; shrink a piece that does not.
    size = max(1, int(len(window) * (WINDOW_TOKENS - 8) / tokens))
    start = 0
    while start < len(window):
        cut = size
        while True:
            end = _cut_back(window, start + cut, start + cut // 2)
            piece = window[start:end].strip()
            n = count(piece) if piece else 0
            if n <= WINDOW_TOKENS or cut <= 1:
                break
            cut = max(1, cut * 3 // 4)
        if piece:
            yield piece, n
        start = end


@dataclass(frozen=True, slots=True)
class CheckReading:
    """The windows a policy check reads of a squashed text."""

    windows: list[str]
    tokens: int
    """Their tokens together (at most ``CHECK_READ_TOKENS``)."""
    whole: bool
    """Whether they cover the whole text; else the check read only its start."""


def check_reading(text: str, count: TokenCount, *, budget: int = CHECK_READ_TOKENS) -> CheckReading:
    """The check windows of a squashed text that fit ``budget`` tokens of the encoder ``count`` measures for.

    Tokens are counted window by window, and no further than the budget: measuring a 100,000-character
    text costs what reading its first windows does, not what the whole of it would.
    """
    out: list[str] = []
    used = 0
    for window, _ in _windows(text, CHECK_WINDOW_CHARS, CHECK_WINDOW_STEP):
        for piece, tokens in _fit(window, count(window), count):
            if used + tokens > budget or len(out) >= MAX_CHECK_WINDOWS:
                return CheckReading(out, used, whole=False)
            out.append(piece)
            used += tokens
    return CheckReading(out, used, whole=True)
