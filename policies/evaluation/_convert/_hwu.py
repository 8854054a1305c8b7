"""HWU64 (xliuhw/NLU-Evaluation-Data): a home assistant's 18 scenarios, then its 64 intents.

Two questions per row: the scenario (which agent) and the intent (which tool), ``scenario_action``
as the data names it. ``answerid`` is not unique in the data, so rows are named by position.
"""

from __future__ import annotations

from pathlib import Path

from fastslow.policies.evaluation._rows import Split
from fastslow.router import Choice, ConfigError

from ._base import Converter, Dataset, Item, Source, TaskSpec, read_csv, readable
from ._split import drop_cross_split_duplicates

__all__ = ["HWU64", "TEST_FOLD", "VALIDATION_FOLD"]

TEST_FOLD = "10"
VALIDATION_FOLD = "9"
"""The data's ten cross-validation test folds partition it: fold 10 is the test split, fold 9 the
validation split and folds 1-8 the train split."""

SOURCE = Source(
    folder="hwu64",
    marker="hwu64_10fold_testsets.csv",
    repository="xliuhw/NLU-Evaluation-Data",
    commit="f6071b4",
    licence="CC BY 4.0",
    url="https://github.com/xliuhw/NLU-Evaluation-Data",
    note="the ten test folds merged into one CSV",
)
_NAME = "hwu64"
_WORDS = {
    "iot": "smart home",
    "qa": "question answering",
    "hue": "Hue",
    "wemo": "WeMo plug",
    "lightchange": "light change",
    "lightdim": "light dim",
    "lightoff": "light off",
    "lighton": "light on",
    "lightup": "light up",
    "addcontact": "add contact",
    "querycontact": "query contact",
    "sendemail": "send email",
    "commandstop": "command stop",
    "dontcare": "don't care",
    "createoradd": "create or add",
}


def _split(fold: str) -> Split:
    return "test" if fold == TEST_FOLD else "validation" if fold == VALIDATION_FOLD else "train"


def _read(folder: Path, seed: int) -> Dataset:
    del seed  # the data's own folds
    path = folder / SOURCE.marker
    rows = read_csv(path, ("fold", "answerid", "scenario", "label", "text"))
    actions: dict[str, list[str]] = {}
    for n, row in enumerate(rows):
        scenario, label = row["scenario"], row["label"]
        if not label.startswith(f"{scenario}_") or row["fold"] not in {str(f) for f in range(1, 11)}:
            raise ConfigError(
                f"label {label!r} is not of scenario {scenario!r}, or no fold", path=str(path), line=n + 2
            )
        intents = actions.setdefault(scenario, [])
        if label not in intents:
            intents.append(label)
    scenarios = sorted(actions)
    scenario_q = Choice(
        # A scenario is described by the actions the data has for it.
        criteria={
            s: f"{readable(s, _WORDS)}: " + ", ".join(readable(i[len(s) + 1 :], _WORDS) for i in sorted(actions[s]))
            for s in scenarios
        },
        instructions="Which scenario (assistant) should handle the user's request?",
    )
    intent_q = Choice(
        criteria={i: readable(i, _WORDS) for s in scenarios for i in sorted(actions[s])},
        instructions="Which intent (scenario and action) does the user's request express?",
    )
    items = [
        Item(
            id=f"row-{n}",
            state=row["text"],
            labels={"scenario": row["scenario"], "intent": row["label"]},
            split=_split(row["fold"]),
            meta={"fold": int(row["fold"]), "answerid": row["answerid"]},
        )
        for n, row in enumerate(rows)
    ]
    kept, dropped = drop_cross_split_duplicates(items)  # none in the data as published; kept as a guard
    return Dataset(
        task=TaskSpec(name=_NAME, kind="classify", questions={"scenario": scenario_q, "intent": intent_q}),
        items=tuple(kept),
        dropped={"text_in_two_splits": dropped},
        split_rule=f"the data's folds: {TEST_FOLD} is test, {VALIDATION_FOLD} validation, the other eight train",
    )


HWU64 = Converter(
    name=_NAME,
    summary="Two questions per request: its scenario (18 assistants), then its intent (64 scenario actions).",
    source=SOURCE,
    read=_read,
)
