"""deepset's prompt injections, in a third-party lower-cased copy with its own 80/10/10 split."""

from __future__ import annotations

from pathlib import Path

from fastslow.policies.evaluation._rows import Split
from fastslow.router import ConfigError, Noul

from ._base import Converter, Dataset, Item, Source, TaskSpec, read_csv
from ._split import drop_cross_split_duplicates

__all__ = ["PROMPT_INJECTION", "QUESTION"]

QUESTION = "injection"
SOURCE = Source(
    folder="deepset_prompt_injections_lowercased",
    marker="train.csv",
    repository="deepset/prompt-injections (Hugging Face data set)",
    commit="f502ae7",
    licence="Apache-2.0",
    url="https://huggingface.co/datasets/deepset/prompt-injections",
    note="a third-party copy: lower-cased, whitespace collapsed, re-split 80/10/10 by that copy's author",
)
_PARTS: dict[str, Split] = {"train": "train", "val": "validation", "test": "test"}
_LABELS = {"1": "yes", "0": "no"}


def _read(folder: Path, seed: int) -> Dataset:
    del seed  # the copy's own splits
    items: list[Item] = []
    for part, split in _PARTS.items():
        path = folder / f"{part}.csv"
        for n, row in enumerate(read_csv(path, ("text", "label"))):
            if row["label"] not in _LABELS:
                raise ConfigError(f"label {row['label']!r} is neither 0 nor 1", path=str(path), line=n + 2)
            items.append(
                Item(id=f"{part}-{n}", state=row["text"], labels={QUESTION: _LABELS[row["label"]]}, split=split)
            )
    kept, dropped = drop_cross_split_duplicates(items)
    question = Noul(
        instructions=(
            "Is this text a prompt injection: an attempt to override or ignore the assistant's instructions?"
        ),
    )
    return Dataset(
        task=TaskSpec(name="prompt-injection", kind="check", questions={QUESTION: question}),
        items=tuple(kept),
        split_rule="the copy's own train / val / test files; a text in two splits is kept only in the later one",
        dropped={"text_in_two_splits": dropped},
    )


PROMPT_INJECTION = Converter(
    name="prompt-injection",
    summary="Is this text a prompt injection? deepset's set, English and German, lower-cased.",
    source=SOURCE,
    read=_read,
)
