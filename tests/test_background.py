"""The shipped background: varied, hash-checked, and disjoint from every evaluation source."""

from __future__ import annotations

import csv
import gzip
import json
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fastslow.engines.embedded._background import BACKGROUND_DIR, background_units, load_background
from fastslow.engines.embedded._embedders import E5_FILES, load_embedder
from fastslow.engines.embedded._shards import MANIFEST
from fastslow.router import ConfigError


def _texts() -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in sorted(BACKGROUND_DIR.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def _norm(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.sub(r"[^\w\s]", " ", folded).split())


def _csv_column(path: Path, column: str) -> Iterator[str]:
    with path.open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            yield row[column]


def _evaluation_texts(root: Path) -> Iterator[str]:
    """Every text of every evaluation source in ../shared/data."""
    for name in ("data_full.json", "data_oos_plus.json"):
        for split in json.loads((root / "clinc150" / name).read_text()).values():
            yield from (text for text, _ in split)
    for split in ("train.csv", "test.csv"):
        yield from _csv_column(root / "banking77" / split, "text")
    yield from _csv_column(root / "hwu64" / "hwu64_10fold_testsets.csv", "text")
    yield from _csv_column(root / "snips" / "snips_2017_flat.csv", "text")
    yield from _csv_column(root / "xstest" / "xstest_prompts.csv", "prompt")
    for split in ("train.csv", "val.csv", "test.csv"):
        yield from _csv_column(root / "deepset_prompt_injections_lowercased" / split, "text")
    with gzip.open(root / "openai_moderation" / "samples-1680.jsonl.gz", "rt", encoding="utf-8") as fh:
        yield from (json.loads(line)["prompt"] for line in fh if line.strip())
    for line in (root / "routellm" / "mt_bench__question.jsonl").read_text().splitlines():
        if line.strip():
            yield from json.loads(line)["turns"]
    yield from _csv_column(root / "routellm" / "gsm8k__gsm8k_responses.csv", "prompt")
    for path in sorted((root / "routellm" / "mmlu_responses").glob("*.csv")):
        yield from _csv_column(path, "prompt")


def _shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = text.split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def test_background_is_large_and_varied() -> None:
    rows = _texts()
    kinds = Counter(r["kind"] for r in rows)
    languages = {r["lang"] for r in rows}
    assert len(rows) >= 1500
    for kind in ("question", "command", "instruction", "chat", "tool_call", "document", "paragraph"):
        assert kinds[kind] >= 50, kinds
    assert len(languages) >= 15, languages
    assert sum(1 for r in rows if r["lang"] != "en") >= 500
    assert sum(1 for r in rows if len(r["text"]) >= 3000) >= 20  # long documents
    assert len({r["id"] for r in rows}) == len(rows)
    assert len({r["text"] for r in rows}) == len(rows)


@pytest.mark.data
@pytest.mark.slow  # reads every data set: out of make test-fast
def test_background_is_disjoint_from_every_evaluation_source(shared_data: Path) -> None:
    evaluation = {_norm(t) for t in _evaluation_texts(shared_data)}
    assert len(evaluation) > 40_000  # every source was read
    background = [_norm(r["text"]) for r in _texts()]
    same = sorted({t for t in background if t in evaluation})
    assert not same, f"background texts found in evaluation sources: {same[:10]}"
    # Nor a long run of words shared with one of them (a copied passage inside a longer text).
    evaluation_shingles: set[tuple[str, ...]] = set()
    for text in evaluation:
        evaluation_shingles |= _shingles(text)
    copied = [t[:80] for t in background if _shingles(t) & evaluation_shingles]
    assert not copied, f"background texts sharing an 8-word passage with evaluation sources: {copied[:10]}"


def test_shipped_embeddings_match_texts_and_hashes() -> None:
    manifest = json.loads((BACKGROUND_DIR / MANIFEST).read_text())
    units = background_units()
    e5_id = f"e5-small-q4-{E5_FILES['e5-small-q4.bin'][:12]}"
    assert e5_id in manifest
    for entry in manifest.values():
        vectors = np.load(BACKGROUND_DIR / entry["file"], allow_pickle=False)
        assert vectors.shape[0] == len(units) == int(entry["units"])
        assert np.allclose(np.linalg.norm(vectors.astype(np.float32), axis=1), 1.0, atol=1e-2)


def test_a_tampered_embedding_file_is_refused(tmp_path: Path) -> None:
    for path in BACKGROUND_DIR.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    embedder = load_embedder("e5")
    entry = json.loads((tmp_path / MANIFEST).read_text())[embedder.model_id]
    vectors = np.load(tmp_path / entry["file"])
    vectors[0, 0] += np.float16(0.01)
    np.save(tmp_path / entry["file"], vectors)
    with pytest.raises(ConfigError, match="hash mismatch"):
        load_background(embedder, directory=tmp_path)
    # An edited text without rebuilt embeddings is refused too, naming the rebuild command.
    for path in BACKGROUND_DIR.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    with (tmp_path / "en_short.jsonl").open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "x", "kind": "chat", "lang": "en", "text": "one more line"}) + "\n")
    with pytest.raises(ConfigError, match="_background"):
        load_background(embedder, directory=tmp_path)


def test_a_cold_start_embeds_no_background_text() -> None:
    embedder = load_embedder("e5")
    before = embedder.texts_embedded
    background = load_background(embedder)
    assert embedder.texts_embedded == before
    assert background.vectors.shape == (len(background.units), embedder.dim)
