"""``convert``: a data set's folder -> the evaluation file, its ``meta.json`` and an examples fragment.

Rows are written in the explicit form (questions + labels), so any engine can be evaluated on
them. The questions object is the same on every row of a file: it is encoded once and spliced in.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fastslow.policies._base import suggest
from fastslow.policies.evaluation._rows import SPLITS, Split
from fastslow.router import ConfigError
from fastslow.router.engine_api import question_to_wire

from ._base import Converter, Dataset, Item, Source, TaskSpec, locate
from ._fragment import fragment
from ._registry import CONVERTERS

__all__ = ["ConvertResult", "convert", "pick_examples"]

LabelCounts = dict[str, dict[str, dict[str, int]]]
"""Split -> question -> option -> rows."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ConvertResult:
    """What ``convert`` wrote."""

    name: str
    out_path: Path
    meta_path: Path
    examples_path: Path | None
    counts: Mapping[str, int]
    """Split -> rows written."""
    labels: LabelCounts
    """Split -> question -> option -> rows written."""
    dropped: Mapping[str, int] = field(default_factory=dict)
    """Reason -> rows of the data left out."""

    @property
    def rows(self) -> int:
        return sum(self.counts.values())


def _check_options(splits: Collection[str] | None, examples_per_label: int | None, limit: int | None) -> list[Split]:
    if examples_per_label is not None and (isinstance(examples_per_label, bool) or examples_per_label < 1):
        raise ConfigError(f"examples_per_label must be at least 1, not {examples_per_label!r}", key="examples")
    if limit is not None and (isinstance(limit, bool) or limit < 1):
        raise ConfigError(f"limit must be at least 1, not {limit!r}", key="limit")
    if splits is None:
        return list(SPLITS)
    wanted: list[Split] = []
    for name in [splits] if isinstance(splits, str) else splits:
        split = next((s for s in SPLITS if s == name), None)
        if split is None:
            raise ConfigError(
                f"unknown split {name!r}; expected {', '.join(SPLITS)}{suggest(name, SPLITS)}", key="splits"
            )
        wanted.append(split)
    return [s for s in SPLITS if s in wanted]


def pick_examples(dataset: Dataset, per_label: int, seed: int) -> dict[str, dict[str, list[Item]]]:
    """Question -> option -> up to ``per_label`` training items: the first in a seeded shuffle."""
    train = [item for item in dataset.items if item.split == "train"]
    random.Random(seed).shuffle(train)
    picked: dict[str, dict[str, list[Item]]] = {q: {} for q in dataset.task.questions}
    for item in train:
        for question, option in item.labels.items():
            chosen = picked[question].setdefault(option, [])
            # A text the data repeats is one example, not two.
            if len(chosen) < per_label and all(other.state != item.state for other in chosen):
                chosen.append(item)
    return picked


def _select(items: Sequence[Item], splits: list[Split], limit: int | None, seed: int) -> list[Item]:
    keep = [item for item in items if item.split in splits]
    if limit is None:
        return keep
    chosen: set[int] = set()
    for split in splits:
        members = [i for i, item in enumerate(keep) if item.split == split]
        # A seeded sample, not the first rows: the data sets are often sorted by label.
        chosen.update(random.Random(seed).sample(members, min(limit, len(members))))
    return [item for i, item in enumerate(keep) if i in chosen]


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _open_rows(path: Path, *, gzipped: bool) -> IO[str]:
    # Every row repeats its questions, so a file gzips to a few per cent of its size.
    if gzipped:
        return gzip.open(path, "wt", encoding="utf-8")
    return path.open("w", encoding="utf-8")


def _write_rows(out: Path, dataset: Dataset, items: Sequence[Item], example_ids: set[str]) -> LabelCounts:
    """Write ``items`` as explicit rows (through a temporary file); returns what was written."""
    wire = {q: question_to_wire(question) for q, question in dataset.task.questions.items()}
    questions = _json(wire)
    labels: LabelCounts = {}
    tmp = out.with_name(out.name + ".tmp")
    with _open_rows(tmp, gzipped=out.name.endswith(".gz")) as fh:
        for item in items:
            meta: dict[str, Any] = {"split": item.split, **item.meta}
            if item.id in example_ids:
                meta["example"] = True
            fh.write(
                f'{{"id":{_json(item.id)},"state":{_json(item.state)},"questions":{questions},'
                f'"labels":{_json(item.labels)},"meta":{_json(meta)}}}\n'
            )
            for question, option in item.labels.items():
                by_option = labels.setdefault(item.split, {}).setdefault(question, {})
                by_option[option] = by_option.get(option, 0) + 1
    os.replace(tmp, out)
    return labels


def _source_meta(folder: Path, source: Source) -> dict[str, str]:
    meta = {
        "folder": str(folder.resolve()),
        "data_set": source.folder,
        "repository": source.repository,
        "commit": source.commit,
        "url": source.url,
        "licence": source.licence,
    }
    return meta | ({"note": source.note} if source.note else {})


def _task_meta(task: TaskSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": task.name, "kind": task.kind}
    if task.none_of_these is not None:
        meta["none_of_these"] = task.none_of_these
    if task.kind == "check":
        meta["violation"] = dict.fromkeys(task.questions, "yes")
    return meta


def _examples(
    name: str, converter: Converter, dataset: Dataset, path: Path, per_label: int, seed: int
) -> dict[str, Any]:
    """Write the examples fragment; returns its entry in ``meta.json``."""
    picked = pick_examples(dataset, per_label, seed)
    ids = sorted({item.id for by_option in picked.values() for chosen in by_option.values() for item in chosen})
    source = converter.source
    header = (
        f"Examples for a fastslow policy file: {per_label} training row(s) per label of {name}, seed {seed}.\n"
        f"From {source.repository} @ {source.commit} ({source.licence}): keep the attribution."
    )
    _write_text(path, fragment(dataset.task, picked, header))
    return {"file": path.name, "per_label": per_label, "ids": ids}


def convert(
    name: str,
    source_dir: str | Path,
    out_path: str | Path,
    *,
    seed: int = 0,
    examples_per_label: int | None = None,
    splits: Collection[str] | None = None,
    limit: int | None = None,
) -> ConvertResult:
    """Convert one data set of ``../shared/data`` into an evaluation file (JSON Lines).

    Beside ``out_path`` it writes ``<out_path>.meta.json`` (source, licence, seed, counts) and,
    with ``examples_per_label``, ``<out_path>.examples.yaml``: a policy file whose one task holds
    that many training rows per label as examples. An ``out_path`` ending ``.gz`` is gzipped.

    Args:
        name: a key of ``CONVERTERS``.
        source_dir: the data set's folder, or the shared data folder that holds it.
        seed: drives every split the data set does not make itself, the examples and ``limit``.
        examples_per_label: write the examples fragment with this many training rows per label.
        splits: write only rows of these splits (all three by default).
        limit: at most this many rows per split, a seeded sample (for quick looks and tests);
            the counts then describe what was written, ``available`` in ``meta.json`` the whole.

    Raises:
        ConfigError: an unknown name or split, a folder without the data set, a malformed file.
    """
    converter = CONVERTERS.get(name)
    if converter is None:
        raise ConfigError(
            f"unknown data set {name!r}; expected one of {', '.join(CONVERTERS)}{suggest(name, CONVERTERS)}", key="name"
        )
    wanted = _check_options(splits, examples_per_label, limit)
    folder = locate(Path(source_dir), converter.source)
    dataset = converter.read(folder, seed)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta_path = out.with_name(out.name + ".meta.json")
    examples_path: Path | None = None
    examples: dict[str, Any] | None = None
    if examples_per_label is not None:
        examples_path = out.with_name(out.name + ".examples.yaml")
        examples = _examples(name, converter, dataset, examples_path, examples_per_label, seed)
    selected = _select(dataset.items, wanted, limit, seed)
    written = _write_rows(out, dataset, selected, set(examples["ids"]) if examples else set())
    counts: dict[str, int] = {s: sum(1 for item in selected if item.split == s) for s in wanted}
    labels: LabelCounts = {s: written.get(s, {}) for s in wanted}
    meta_doc = {
        "converter": name,
        "summary": converter.summary,
        "format": "fastslow evaluation rows (docs/evaluation.md), explicit form: questions + labels",
        "task": _task_meta(dataset.task),
        "source": _source_meta(folder, converter.source),
        "seed": seed,
        "split_rule": dataset.split_rule,
        "splits": wanted,
        "limit": limit,
        "rows": len(selected),
        "counts": counts,
        "labels": labels,
        "available": {s: sum(1 for item in dataset.items if item.split == s) for s in SPLITS},
        "dropped": dict(dataset.dropped),
        "examples": examples,
    } | ({"notes": dict(dataset.notes)} if dataset.notes else {})
    _write_text(meta_path, json.dumps(meta_doc, ensure_ascii=False, indent=2) + "\n")
    return ConvertResult(
        name=name,
        out_path=out,
        meta_path=meta_path,
        examples_path=examples_path,
        counts=counts,
        labels=labels,
        dropped=dict(dataset.dropped),
    )
