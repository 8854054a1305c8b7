"""What every converter shares: where a data set comes from, the rows it yields, reading its files.

A converter reads one folder of ``../shared/data`` into a ``Dataset``: the task its rows ask
(questions in the router's own types) and one ``Item`` per labelled state, each already in its
split. ``_write`` turns that into the evaluation file, its ``meta.json`` and the examples fragment.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from fastslow.policies.evaluation._rows import Split
from fastslow.router import Choice, ConfigError, Noul

__all__ = [
    "Converter",
    "Dataset",
    "Item",
    "Source",
    "TaskKind",
    "TaskSpec",
    "locate",
    "need",
    "read_csv",
    "readable",
]

TaskKind: TypeAlias = Literal["route", "classify", "check"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """Where a data set comes from (the table in ``../shared/data/README.md``)."""

    folder: str
    """Its folder under the shared data root."""
    marker: str
    """A file the folder must hold; it is how ``--source`` is recognised as that folder."""
    repository: str
    commit: str
    licence: str
    url: str
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Item:
    """One labelled state, already in its split."""

    id: str
    state: str
    labels: Mapping[str, str]
    """Question name -> true option; a question the data does not label is absent."""
    split: Split
    meta: Mapping[str, Any] = field(default_factory=dict)
    """Kept from the data (``meta.split`` is added on writing)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    """The task a data set's rows ask: its name, kind and questions (for rows and the fragment)."""

    name: str
    kind: TaskKind
    questions: Mapping[str, Noul | Choice]
    """A route task has one question, named after the task; a check task's are its rules (yes/no,
    violated on ``yes``)."""
    none_of_these: str | None = None
    """The route option that means "none of these" (out of scope), when the data has one."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Dataset:
    """A data set read into rows: what ``Converter.read`` returns."""

    task: TaskSpec
    items: tuple[Item, ...]
    split_rule: str
    """How the splits were made, in words, for ``meta.json``."""
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Reason -> rows of the data left out (contaminated prompts, texts in two splits)."""
    notes: Mapping[str, Any] = field(default_factory=dict)
    """Anything else ``meta.json`` should record (category codes, model names)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Converter:
    """One entry of ``CONVERTERS``: a data set and how its files become rows."""

    name: str
    summary: str
    """What each row's questions ask, in one line."""
    source: Source
    read: Callable[[Path, int], Dataset]
    """``read(folder, seed)``; the seed drives every split the data set does not make itself."""


def locate(source_dir: Path, source: Source) -> Path:
    """The data set's folder: ``source_dir`` itself, or its ``source.folder`` (the shared data root)."""
    for candidate in (source_dir, source_dir / source.folder):
        if (candidate / source.marker).is_file():
            return candidate
    raise ConfigError(
        f"{source.marker} not found in {source_dir} nor in {source_dir / source.folder}: --source is the "
        f"{source.folder} folder of the shared data (from {source.repository}), or the folder holding it",
        path=str(source_dir),
        key="source",
    )


def need(path: Path) -> Path:
    if not path.is_file():
        raise ConfigError("file not found; the data set's folder is incomplete", path=str(path), key="source")
    return path


def read_csv(path: Path, columns: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a CSV file with a header that has at least ``columns``."""
    with need(path).open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigError(f"the header lacks column(s) {', '.join(missing)}", path=str(path), line=1)
        return list(reader)


_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def readable(name: str, words: Mapping[str, str] | None = None) -> str:
    """An intent name as words: ``card_not_working`` -> ``card not working``, ``AddToPlaylist`` ->
    ``add to playlist``; ``words`` replaces single words (abbreviations, run-together names)."""
    fixes = words or {}
    spaced = _CAMEL.sub(" ", name).replace("_", " ")
    return " ".join(fixes.get(word.lower(), word.lower()) for word in spaced.split())
