"""Per-question quality signals from the structured server's ``diagnostics`` object (wire-formats §2.5).

``diagnostics.questions[id]`` holds ``label_mass``, ``argmax_is_label`` and per-read ``entropy``;
``diagnostics.samples.tops`` holds each read's ``[label, top prob, entropy]``, from which the
agreement of several reads follows. ``diagnostics.thought`` is never read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastslow.router import Noul, Question, Score
from fastslow.router.engine_api import Signals

__all__ = ["number", "read_signals", "reads_by_question"]


def number(value: Any) -> float | None:
    """A finite JSON number as a float (booleans are not numbers), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def _server_label(question: Question, option: str) -> str:
    """The structured server's answer-slot label for ``option`` (what ``diagnostics.samples.tops`` holds)."""
    if isinstance(question, Noul):
        return option
    index = question.options.index(option)
    if isinstance(question, Score) and len(question.options) <= 9:
        return str(index + 1)
    return chr(ord("A") + index)


def reads_by_question(diagnostics: Mapping[str, Any]) -> dict[str, list[Sequence[Any]]]:
    """Per question id, each read's ``[label, top prob, entropy]`` from ``samples.tops``.

    ``tops`` is a list of reads (one read group) or a list of lists of reads (several groups).
    """
    samples = diagnostics.get("samples")
    tops = samples.get("tops") if isinstance(samples, Mapping) else None
    out: dict[str, list[Sequence[Any]]] = {}

    def visit(entry: Any) -> None:
        if isinstance(entry, Mapping):
            for qid, top in entry.items():
                if isinstance(top, list) and top:
                    out.setdefault(str(qid), []).append(top)
        elif isinstance(entry, list):
            for item in entry:
                visit(item)

    if isinstance(tops, list):
        visit(tops)
    return out


def read_signals(
    wire_name: str,
    question: Question,
    probs: Mapping[str, float],
    diagnostics: Mapping[str, Any],
    reads: Mapping[str, list[Sequence[Any]]],
    *,
    server_labels: bool,
) -> Signals:
    """Signals for one answered question; ``server_labels`` enables agreement (structured labels only)."""
    per_question = diagnostics.get("questions")
    entry = per_question.get(wire_name) if isinstance(per_question, Mapping) else None
    entry = entry if isinstance(entry, Mapping) else {}
    mass = number(entry.get("label_mass"))
    argmax = entry.get("argmax_is_label")
    raw_entropy = entry.get("entropy")
    if isinstance(raw_entropy, list):
        entropy = tuple(e for e in map(number, raw_entropy) if e is not None)
    else:
        single = number(raw_entropy)
        entropy = () if single is None else (single,)
    mine = reads.get(wire_name, [])
    if not entropy:
        entropy = tuple(e for e in (number(r[2]) if len(r) > 2 else None for r in mine) if e is not None)
    agreement = None
    if server_labels and len(mine) >= 2:
        top = max(probs, key=lambda k: probs[k])
        label = _server_label(question, top)
        agreement = sum(1 for r in mine if str(r[0]) == label) / len(mine)
    return Signals(
        label_mass=mass,
        argmax_is_label=argmax if isinstance(argmax, bool) else None,
        entropy=entropy,
        agreement=agreement,
    )
