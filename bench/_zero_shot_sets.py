"""The items of ``bench/fit_zero_shot.py``: the fit sets the calibration learns from and the evaluation sets.

Its own module so that ``fit_zero_shot.py`` stays small; ``fit_zero_shot.py`` re-exports the names
other scripts read (``bench/_quality_zero_shot.py`` builds its evaluation sets from them).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastslow.policies.evaluation import convert, read_rows
from fastslow.router import Choice, Noul, Question, State
from fastslow.router.engine_api import question_to_wire

NONE = "none_of_these"


@dataclass(frozen=True, slots=True)
class Item:
    """One (state, question) with its true option; ``group`` is the set it came from."""

    group: str
    id: str
    question_name: str
    state: State
    question: Question
    label: str

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(self.question.options)

    @property
    def key(self) -> str:
        text = json.dumps([self.state, question_to_wire(self.question)], sort_keys=True, ensure_ascii=False)
        return hashlib.sha1(text.encode()).hexdigest()


def _rows(name: str, source: Path, work: Path, split: str, limit: int | None) -> list[Any]:
    """A seeded sample of at most ``limit`` rows of one split (converted once into ``work``), shuffled."""
    out = work / "data" / f"{name}.{split}.{limit or 'all'}.jsonl.gz"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        convert(name, source, out, splits=[split], limit=limit)
    rows = list(read_rows(out).rows)
    random.Random(f"{name}/{split}").shuffle(rows)
    return rows


def _labelled(group: str, rows: Iterable[Any], only: str | None = None) -> list[Item]:
    items = []
    for row in rows:
        for qname, question in row.questions.items():
            if (only is None or qname == only) and qname in row.labels:
                items.append(Item(group, row.id, qname, row.state, question, row.labels[qname]))
    return items


def _subsets(group: str, items: Sequence[Item], seed: int, sizes: Sequence[int] = (2, 3, 4, 5, 8)) -> list[Item]:
    """The same rows asked with a seeded subset of the options, the true one kept."""
    rng = random.Random(seed)
    out = []
    for item in items:
        assert isinstance(item.question, Choice)
        k = rng.choice([s for s in sizes if s < len(item.options)])
        others = rng.sample([o for o in item.options if o != item.label], k - 1)
        keep = set(others) | {item.label}
        criteria = {o: d for o, d in item.question.criteria.items() if o in keep}
        question = Choice(criteria=criteria, instructions=item.question.instructions)
        out.append(Item(group, item.id, item.question_name, item.state, question, item.label))
    return out


def _readable(option: str, description: str | None) -> str:
    if description and description.strip():
        return description.strip()
    return option.replace("_", " ").lower()


def _topics(group: str, items: Sequence[Item], seed: int, p_yes: float = 0.5) -> list[Item]:
    """Yes/no topic questions: the true option with probability ``p_yes``, another one otherwise."""
    rng = random.Random(seed)
    out = []
    for item in items:
        assert isinstance(item.question, Choice)
        if item.label == NONE:  # out of scope: no topic to ask about
            continue
        yes = rng.random() < p_yes
        option = item.label if yes else rng.choice([o for o in item.options if o not in (item.label, NONE)])
        topic = _readable(option, item.question.criteria[option])
        question = Noul(instructions=f"Is this request about {topic}?")
        out.append(Item(group, item.id, "topic", item.state, question, "yes" if yes else "no"))
    return out


def fit_sets(source: Path, work: Path, n: int, split: str) -> dict[str, list[Item]]:
    """The items the calibration may learn from, by kind (``split``: train to fit, validation to check).

    Choices: SNIPS and HWU64's own questions on ``n`` rows each, and option subsets on ``n / 2``
    other rows of each. Nouls: topic questions on ``n / 4`` further rows of each question (one set,
    ``topics``: one construction, so it weighs as much as the prompt injections) and prompt injections.
    No state is asked twice within one set.
    """
    snips_rows = _rows("snips", source, work, split, 2 * n)
    hwu_rows = _rows("hwu64", source, work, split, 2 * n)
    snips, snips2 = _labelled("snips", snips_rows[:n]), _labelled("", snips_rows[n:])
    scen = _labelled("hwu64-scenario", hwu_rows[:n], "scenario")
    intent = _labelled("hwu64-intent", hwu_rows[:n], "intent")
    intent2, scen2 = _labelled("", hwu_rows[n:], "intent"), _labelled("", hwu_rows[n:], "scenario")
    half, quarter = n // 2, max(1, n // 4)
    subsets = _subsets("snips-subsets", snips2[:half], 11) + _subsets("hwu64-subsets", intent2[:half], 12)
    topics = (
        _topics("topics", snips2[half : half + quarter], 21)
        + _topics("topics", intent2[half : half + quarter], 22)
        + _topics("topics", scen2[half + quarter : half + 2 * quarter], 23)
    )
    injection = _labelled("prompt-injection", _rows("prompt-injection", source, work, split, n))
    return {"choice": [*snips, *scen, *intent, *subsets], "noul": [*topics, *injection]}


EVAL_CHOICE = ("clinc150-domain", "clinc150-intent", "banking77")
EVAL_NOUL = ("xstest", "moderation", "routellm-mmlu")
EVAL_TOPICS = ("clinc150-intent-topics", "banking77-topics", "clinc150-domain-topics", "banking77-topics-20")
"""Derived yes/no sets on the choice evaluation sets' test rows, asked as the fit sets' topics are
("Is this request about <intent>?", yes half the time; ``-20``: yes a fifth of the time)."""
EVAL_EXTRA_NOUL = ("xstest-all", "routellm-gsm8k", "prompt-injection")
"""Shown beside the evaluation: XSTest over all its splits (its test split is small), GSM8K, and the
prompt-injection test split (not an evaluation set proper: its training split is a fit set)."""


HELD_OUT_SOURCE = {"hwu64-scenario": "hwu64"}
"""Evaluation sets whose source the shipped calibration was fitted on (other rows, other splits):
each is measured under the shipped forms refitted on the fit sets of the other sources alone
(``without_source``), so that it is a set its calibration never saw."""


def eval_sets(source: Path, work: Path, n: int) -> dict[str, list[Item]]:
    out: dict[str, list[Item]] = {}
    for name in (*EVAL_CHOICE, *EVAL_NOUL, "routellm-gsm8k", "prompt-injection"):
        out[name] = _labelled(name, _rows(name, source, work, "test", n))
    out["hwu64-scenario"] = _labelled("hwu64-scenario", _rows("hwu64", source, work, "test", n), "scenario")
    rows = [r for s in ("train", "validation", "test") for r in _rows("xstest", source, work, s, None)]
    out["xstest-all"] = _labelled("xstest-all", rows)
    half = n // 2
    out["clinc150-intent-topics"] = _topics("clinc150-intent-topics", out["clinc150-intent"][:half], 31)
    out["clinc150-domain-topics"] = _topics("clinc150-domain-topics", out["clinc150-domain"][half:], 32)
    out["banking77-topics"] = _topics("banking77-topics", out["banking77"][:half], 33)
    out["banking77-topics-20"] = _topics("banking77-topics-20", out["banking77"][half:], 34, p_yes=0.2)
    return out


def _kind_of(items: Sequence[Item]) -> str:
    return "choice" if isinstance(items[0].question, Choice) else "noul"
