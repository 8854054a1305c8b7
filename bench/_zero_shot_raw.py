"""The raw zero-shot distributions ``bench/fit_zero_shot.py`` fits on, computed by the engines' own code and cached.

Its own module so that ``fit_zero_shot.py`` stays small; ``fit_zero_shot.py`` re-exports ``Raw`` and
``RawCache``, which ``bench/_quality_zero_shot.py`` reads from there.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from _zero_shot_sets import Item
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from fastslow.engines.embedded import EmbeddedEngine, SparrowEngine, load_embedder
from fastslow.engines.embedded.tools import as_text, ends, squash
from fastslow.router import Choice, State

EMBEDDER_CHOICE: dict[str, Literal["e5", "minilm"]] = {"e5": "e5", "minilm": "minilm"}
console = Console(stderr=True)


class RawCache:
    """Raw zero-shot distributions by source (``sparrow``, ``e5``, ``minilm``) and item key, on disk."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._data: dict[str, dict[str, dict[str, float]]] = {}

    def table(self, source: str) -> dict[str, dict[str, float]]:
        if source not in self._data:
            table: dict[str, dict[str, float]] = {}
            path = self.folder / f"{source}.jsonl"
            if path.exists():
                for line in path.read_text().splitlines():
                    if line.strip():
                        entry = json.loads(line)
                        table[entry["k"]] = entry["p"]
            self._data[source] = table
        return self._data[source]

    def add(self, source: str, entries: dict[str, dict[str, float]]) -> None:
        self.table(source).update(entries)
        with (self.folder / f"{source}.jsonl").open("a") as fh:
            for key, probs in entries.items():
                fh.write(json.dumps({"k": key, "p": probs}) + "\n")


class Raw:
    """Computes raw distributions for items, through the engines' own code, with a cache."""

    def __init__(self, cache: RawCache, embedders: Sequence[str]) -> None:
        self.cache = cache
        self.sparrow = SparrowEngine()
        self.embedder_names = tuple(embedders)
        self._engines: dict[str, EmbeddedEngine] = {}

    def engine(self, embedder: str) -> EmbeddedEngine:
        if embedder not in self._engines:
            self._engines[embedder] = EmbeddedEngine(
                sparrow=self.sparrow, embedder=load_embedder(EMBEDDER_CHOICE[embedder])
            )
        return self._engines[embedder]

    def blended_model(self, embedder: str) -> str:
        engine = self.engine(embedder)
        assert engine.embedder is not None
        return f"{self.sparrow.model}*{engine.embedder.name}-similarity"

    def engine_model(self, source: str) -> tuple[str, str]:
        """The engine and model names a calibration of ``source``'s distributions is keyed by."""
        return ("sparrow", self.sparrow.model) if source == "sparrow" else ("embedded", self.blended_model(source))

    def sources(self, kind: str) -> list[str]:
        return ["sparrow", *self.embedder_names] if kind == "choice" else ["sparrow"]

    def key(self, source: str, item: Item) -> str:
        """The cache key of ``item``'s raw distribution from ``source``: marked where the engine reads
        less than the whole state (``_reading``), so an entry made before reading existed is not reused."""
        text = as_text(item.state)
        if source == "sparrow":
            flat = squash(text)
            changed = ends(flat) != flat  # read as a classification reads it: the start and end
        else:
            changed = _embedded_text(item.state) != text
        return f"{item.key}:read-1" if changed else item.key

    def fill(self, items: Sequence[Item], label: str) -> None:
        """Compute every missing raw distribution of ``items`` (sparrow first, then each blend).

        As the engines compute them: sparrow reads the state as ``SparrowEngine.read`` does, and a
        blend embeds what ``EmbeddedEngine`` embeds and mixes it with ``EmbeddedEngine._blend``.
        """
        todo: dict[str, list[Item]] = defaultdict(list)
        for source in ("sparrow", *self.embedder_names):
            table = self.cache.table(source)
            seen: set[str] = set()
            for item in items:
                if source != "sparrow" and not isinstance(item.question, Choice):
                    continue
                key = self.key(source, item)
                if key not in table and key not in seen:
                    seen.add(key)
                    todo[source].append(item)
        total = sum(len(v) for v in todo.values())
        if not total:
            return
        with _progress() as progress:
            task = progress.add_task(f"raw {label}", total=total)
            for chunk in _chunks(todo.get("sparrow", []), 64):
                entries = {
                    self.key("sparrow", it): self.sparrow.read(it.state, it.question, calibrated=False) for it in chunk
                }
                self.cache.add("sparrow", entries)
                progress.advance(task, len(chunk))
            for embedder in self.embedder_names:
                engine = self.engine(embedder)
                assert engine.embedder is not None
                for chunk in _chunks(todo.get(embedder, []), 32):
                    texts = list(dict.fromkeys(_embedded_text(it.state) for it in chunk))
                    vectors = dict(zip(texts, engine.embedder.embed(texts), strict=True))
                    entries = {}
                    for it in chunk:
                        assert isinstance(it.question, Choice)
                        base = self.get("sparrow", it)
                        vector = vectors[_embedded_text(it.state)]
                        entries[self.key(embedder, it)] = engine._blend(vector, it.question, dict(base), None)
                    self.cache.add(embedder, entries)
                    progress.advance(task, len(chunk))

    def get(self, source: str, item: Item) -> dict[str, float]:
        return self.cache.table(source)[self.key(source, item)]


def _embedded_text(state: State) -> str:
    """What ``EmbeddedEngine`` embeds of a state for the zero-shot blend."""
    return ends(squash(as_text(state)))


def _chunks(seq: Sequence[Item], size: int) -> Iterable[Sequence[Item]]:
    for start in range(0, len(seq), size):
        yield seq[start : start + size]


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
