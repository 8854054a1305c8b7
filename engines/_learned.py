"""Examples learned from escalations, as engines train on them: a snapshot with a version per task.

The decision log holds the learned examples (``fastslow.api.learning``); a ``LearnedSet`` is what
one read of them gave. Its versions are content hashes, so every replica that reads the same rows
names them the same way, and a decision records the version its engine was trained with.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fastslow.router import ClassifyTask, Examples, PolicySet, RouteTask

__all__ = ["LearnedExampleText", "LearnedSet", "merge_learned"]

MIN_PER_OPTION_ALONE = 2
"""Learned examples every option needs before a question without examples of its own learns at all:
a head trained on some options only would put no probability on the others."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedExampleText:
    """One learned example, as training needs it."""

    task: str
    question: str
    """The question's name as engines are asked it (``task`` or ``task.question``)."""
    option: str
    text: str


def _version(rows: list[LearnedExampleText]) -> str:
    body = json.dumps(sorted((r.question, r.option, r.text) for r in rows), ensure_ascii=False)
    return f"{len(rows)}-{hashlib.sha256(body.encode()).hexdigest()[:12]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedSet:
    """The learned examples in force: question -> option -> texts, and a version per learning task."""

    examples: Mapping[str, Examples] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)
    """Task name -> ``count-hash`` of its learned examples (``0-...`` when it has none yet)."""

    @classmethod
    def of(cls, rows: Iterable[LearnedExampleText], *, tasks: Iterable[str] = ()) -> LearnedSet:
        """The set of ``rows``, with a version for each of ``tasks`` (the tasks that learn) and each row's task."""
        by_task: dict[str, list[LearnedExampleText]] = {t: [] for t in tasks}
        examples: dict[str, dict[str, list[str]]] = {}
        for row in rows:
            by_task.setdefault(row.task, []).append(row)
            examples.setdefault(row.question, {}).setdefault(row.option, []).append(row.text)
        return cls(
            examples={q: {o: tuple(sorted(ts)) for o, ts in sorted(opts.items())} for q, opts in examples.items()},
            versions={t: _version(rs) for t, rs in sorted(by_task.items())},
        )

    @property
    def key(self) -> str:
        """One string for the whole set: engines trained on equal sets are the same engine."""
        if not self.versions:
            return ""
        return hashlib.sha256(json.dumps(self.versions, sort_keys=True).encode()).hexdigest()[:16]

    def count(self, task: str) -> int:
        version = self.versions.get(task, "0-")
        return int(version.split("-", 1)[0])


def merge_learned(policy: PolicySet, own: Mapping[str, Examples], learned: LearnedSet) -> dict[str, Examples]:
    """The examples engines train on: the policy's, with the learned ones added to each question.

    A learned text that is already one of the question's own examples (under any option) is left
    out: the policy file wins. An option the question no longer has is left out (a route removed
    since). A question with no examples of its own takes learned ones only once every option has
    ``MIN_PER_OPTION_ALONE`` of them.
    """
    options = _options(policy)
    out: dict[str, Examples] = {q: dict(ex) for q, ex in own.items()}
    for question, by_option in learned.examples.items():
        if question not in options:
            continue
        allowed, required = options[question]
        base = own.get(question, {})
        seen = {t for texts in base.values() for t in texts}
        merged = {o: tuple(ts) for o, ts in base.items()}
        for option, texts in by_option.items():
            if option not in allowed:
                continue
            new = tuple(t for t in texts if t not in seen)
            if new:
                merged[option] = merged.get(option, ()) + new
        if not base and any(len(merged.get(o, ())) < MIN_PER_OPTION_ALONE for o in required):
            continue
        if merged:
            out[question] = merged
    return out


def _options(policy: PolicySet) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """Question name (as engines are asked) -> (its options, those that need examples), for tasks that learn."""
    out: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
    for task in policy.tasks.values():
        if task.learn is None:
            continue
        if isinstance(task, RouteTask):
            options = frozenset(task.question.options)
            # The "none of these" route is the open-set score's; it needs no examples of its own.
            out[task.name] = (options, options - {task.none_option})
        elif isinstance(task, ClassifyTask):
            for q, question in task.questions.items():
                out[f"{task.name}.{q}"] = (frozenset(question.options), frozenset(question.options))
    return out
