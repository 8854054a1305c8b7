"""SNIPS (sonos/nlu-benchmark, 2017 custom-intent benchmark): 7 voice-assistant intents."""

from __future__ import annotations

from pathlib import Path

from fastslow.policies.evaluation._rows import Split
from fastslow.router import Choice, ConfigError

from ._base import Converter, Dataset, Item, Source, read_csv, readable
from ._split import VALIDATION_SHARE, route_with_validation

__all__ = ["SNIPS"]


SOURCE = Source(
    folder="snips",
    marker="snips_2017_flat.csv",
    repository="sonos/nlu-benchmark",
    commit="b86ac7f",
    licence="CC0",
    url="https://github.com/sonos/nlu-benchmark",
    note="2017-06-custom-intent-engines, flattened to one CSV",
)
_NAME = "snips"
# The benchmark scores engines on its ``validate`` part: that is the test split here.
_PARTS: dict[str, Split] = {"train_full": "train", "validate": "test"}


def _read(folder: Path, seed: int) -> Dataset:
    path = folder / SOURCE.marker
    rows = read_csv(path, ("split", "intent", "text"))
    intents = sorted({row["intent"] for row in rows})
    question = Choice(
        criteria={i: readable(i) for i in intents},
        instructions="Which voice-assistant intent does the user's request express?",
    )
    items: list[Item] = []
    counters = dict.fromkeys(_PARTS, 0)
    for n, row in enumerate(rows):
        part = row["split"]
        if part not in _PARTS:
            raise ConfigError(f"unknown split {part!r}; expected {', '.join(_PARTS)}", path=str(path), line=n + 2)
        row_id = f"{part}-{counters[part]}"
        counters[part] += 1
        items.append(Item(id=row_id, state=row["text"], labels={_NAME: row["intent"]}, split=_PARTS[part]))
    return route_with_validation(
        _NAME,
        question,
        items,
        seed=seed,
        split_rule=(
            f"validate is the test split; train_full less a seeded {VALIDATION_SHARE:.0%} of its texts (per intent), "
            "which is the validation split; a text in two splits is kept only in the later one"
        ),
    )


SNIPS = Converter(
    name=_NAME,
    summary="Which of 7 voice-assistant intents a request expresses (coarse routing sanity check).",
    source=SOURCE,
    read=_read,
)
