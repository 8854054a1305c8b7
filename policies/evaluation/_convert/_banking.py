"""BANKING77 (PolyAI-LDN/task-specific-datasets): 77 close-neighbour banking intents."""

from __future__ import annotations

import json
from pathlib import Path

from fastslow.policies.evaluation._rows import Split
from fastslow.router import Choice, ConfigError

from ._base import Converter, Dataset, Item, Source, need, read_csv, readable
from ._split import VALIDATION_SHARE, route_with_validation

__all__ = ["BANKING77"]


SOURCE = Source(
    folder="banking77",
    marker="train.csv",
    repository="PolyAI-LDN/task-specific-datasets",
    commit="57ec275",
    licence="CC BY 4.0",
    url="https://github.com/PolyAI-LDN/task-specific-datasets",
)
_NAME = "banking77"


def _read(folder: Path, seed: int) -> Dataset:
    categories: list[str] = json.loads(need(folder / "categories.json").read_text(encoding="utf-8"))
    question = Choice(
        criteria={c: readable(c) for c in categories},
        instructions="Which banking customer-support intent does the customer's message express?",
    )
    items: list[Item] = []
    for part in ("train", "test"):
        path = folder / f"{part}.csv"
        for n, row in enumerate(read_csv(path, ("text", "category"))):
            if row["category"] not in question.criteria:
                raise ConfigError(f"unknown category {row['category']!r}", path=str(path), line=n + 2)
            split: Split = "test" if part == "test" else "train"
            items.append(Item(id=f"{part}-{n}", state=row["text"], labels={_NAME: row["category"]}, split=split))
    return route_with_validation(
        _NAME,
        question,
        items,
        seed=seed,
        split_rule=(
            f"the data set's own test split; its train split less a seeded {VALIDATION_SHARE:.0%} of its texts "
            "(per intent), which is the validation split"
        ),
    )


BANKING77 = Converter(
    name=_NAME,
    summary="Which of 77 banking intents a customer's message expresses (fine-grained routing).",
    source=SOURCE,
    read=_read,
)
