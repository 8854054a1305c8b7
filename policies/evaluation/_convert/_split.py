"""Seeded splits that keep every state in one split, and the rule for data sets' own overlaps.

Splits are made over *distinct states*, not rows: rows with the same text (MMLU repeats some
questions across subjects) always land together, so no state is ever in two splits. Within each
stratum (a label, say) the states are shuffled by one ``random.Random(seed)`` in a fixed order
of strata, so a split depends on the seed and the data alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from fastslow.policies.evaluation._rows import SPLITS, Split
from fastslow.router import Choice

from ._base import Dataset, Item, TaskSpec

__all__ = ["VALIDATION_SHARE", "assign_splits", "drop_cross_split_duplicates", "route_with_validation"]

VALIDATION_SHARE = 0.1
"""Share of a train split's texts carved out (seeded, per label) as the validation split of a
data set that publishes only train and test."""


def assign_splits(
    items: Sequence[Item],
    fractions: Mapping[Split, float],
    *,
    seed: int,
    stratum: Callable[[Item], str],
    only: Split | None = None,
) -> list[Item]:
    """Items in the same order, their split drawn by ``fractions`` (summing to 1).

    Args:
        fractions: share of each stratum's states per split; the first split listed takes what
            rounding leaves.
        stratum: the key to stratify by; a state's stratum is that of its first row.
        only: reassign only the items now in this split (carving a validation split out of a
            data set's train split); the others keep theirs.
    """
    chosen = [i for i, item in enumerate(items) if only is None or item.split == only]
    strata: dict[str, list[str]] = {}
    seen: set[str] = set()
    for i in chosen:
        item = items[i]
        if item.state not in seen:
            seen.add(item.state)
            strata.setdefault(stratum(item), []).append(item.state)
    rng = random.Random(seed)
    names = list(fractions)
    split_of: dict[str, Split] = {}
    for key in sorted(strata):
        states = strata[key]
        rng.shuffle(states)
        sizes = [round(len(states) * fractions[name]) for name in names[1:]]
        start = len(states) - sum(sizes)
        for state in states[:start]:
            split_of[state] = names[0]
        for name, size in zip(names[1:], sizes, strict=True):
            for state in states[start : start + size]:
                split_of[state] = name
            start += size
    out = list(items)
    for i in chosen:
        out[i] = replace(items[i], split=split_of[items[i].state])
    return out


def drop_cross_split_duplicates(items: Sequence[Item]) -> tuple[list[Item], int]:
    """A data set's own splits may share a few texts: keep each only in its latest split.

    Test outranks validation, validation outranks train, so the published test counts stay
    whole and the few shared texts leave the training side. Returns the items kept and how many
    were dropped.
    """
    rank = {name: i for i, name in enumerate(SPLITS)}
    latest: dict[str, int] = {}
    for item in items:
        latest[item.state] = max(latest.get(item.state, -1), rank[item.split])
    kept = [item for item in items if rank[item.split] == latest[item.state]]
    return kept, len(items) - len(kept)


def route_with_validation(name: str, question: Choice, items: Sequence[Item], *, seed: int, split_rule: str) -> Dataset:
    """A route data set from published train and test rows: a seeded ``VALIDATION_SHARE`` of the
    train split's texts (per label) becomes the validation split, and texts in two splits are kept
    only in the later one."""
    split = assign_splits(
        items,
        {"train": 1 - VALIDATION_SHARE, "validation": VALIDATION_SHARE},
        seed=seed,
        stratum=lambda item: item.labels[name],
        only="train",
    )
    kept, dropped = drop_cross_split_duplicates(split)
    return Dataset(
        task=TaskSpec(name=name, kind="route", questions={name: question}),
        items=tuple(kept),
        split_rule=split_rule,
        dropped={"text_in_two_splits": dropped},
    )
