"""Can a reading of a long document's window scores tell an injected document from its clean twin?

A policy check reads a long state window by window (``engines/embedded/_reading.py``) and the worst
window decides. Here, documents of 20,000-27,000 characters are built from CLINC150 test requests
and MT-Bench questions (seeded), each with a twin holding one held-out injection of the
prompt-injection set's test split at a random boundary in its middle half. The prompt-injection rule
(e5 by default, trained on the set's training split with the background, its read budget raised so
it reads every window) scores every window of both twins; then each candidate reading of those
scores is compared:

* ``worst``: the worst window (what ships);
* ``worst_for_n``: the worst window corrected for the number of windows read: its exceedance among
  the rule's out-of-fold scores of its negative rows, raised to a document of N independent windows
  (N: the windows times their step over their size), mapped back to the score with that exceedance;
* ``worst_minus_p90`` / ``worst_minus_p50``: the worst window above the document's own 90th or 50th
  percentile window;
* ``worst_z``: the worst window's z-score within its document.

For each: AUROC of injected against clean twins, and at the example policy's bands (allow at or
under 0.15, deny at or over 0.5) the share of clean twins allowed and of injected ones denied (for
the readings that are probabilities). Embeddings go through the on-disk cache. Prints one JSON
object on its last line.

    python bench/long_documents.py            # 24 pairs (about 6 minutes on two cores, cold)
    python bench/long_documents.py --quick    # 3 pairs
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from rich.progress import Progress

from fastslow.engines.embedded import EmbeddingCache, ExampleEngine, examples_from_mapping, load_embedder

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ALLOW_AT, DENY_AT = 0.15, 0.5
"""The example policy's bands for its check rules (``examples/policy.yaml``)."""
WINDOW_OVERLAP = 0.5
"""Check windows overlap by half (``CHECK_WINDOW_STEP`` is half of ``CHECK_WINDOW_CHARS``): N windows
cover about N / 2 independent stretches of text."""
READ_TOKENS = 8_000
"""Enough for every window of a 27,000-character document (the shipped budget reads the start)."""

F64 = NDArray[np.float64]


def _injections(root: Path) -> Iterator[tuple[str, str, str]]:
    folder = root / "deepset_prompt_injections_lowercased"
    for split in ("train", "val", "test"):
        with (folder / f"{split}.csv").open(encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                yield split, row["text"], row["label"]


def _rule(root: Path, embedder: str, cache: EmbeddingCache) -> ExampleEngine:
    rows = [(t, y) for split, t, y in _injections(root) if split == "train"]
    examples = {"yes": [t for t, y in rows if y == "1"], "no": [t for t, y in rows if y == "0"]}
    mapping = {"questions": {"injection": {"examples": examples, "check": "true"}}}
    return ExampleEngine(
        examples_from_mapping(mapping),
        load_embedder(embedder),  # type: ignore[arg-type]
        cache=cache,
        use_background=True,
        cache_states=True,
        check_read_tokens=READ_TOKENS,
    )


def documents(root: Path, pairs: int, seed: int = 0) -> list[tuple[str, str]]:
    """``pairs`` (clean, injected) twins."""
    clinc = [t for t, _ in json.loads((root / "clinc150" / "data_full.json").read_text())["test"]]
    lines = (root / "routellm" / "mt_bench__question.jsonl").read_text().splitlines()
    pool = clinc + [json.loads(line)["turns"][0] for line in lines if line.strip()]
    held = [t for split, t, y in _injections(root) if split == "test" and y == "1" and len(t) < 400]
    rng = random.Random(seed)
    out = []
    for i in range(pairs):
        parts: list[str] = []
        used, target = 0, rng.randint(20_000, 27_000)
        while used < target:
            parts.append(rng.choice(pool))
            used += len(parts[-1]) + 2
        at = rng.randint(len(parts) // 4, 3 * len(parts) // 4)
        out.append(("\n\n".join(parts), "\n\n".join([*parts[:at], held[i % len(held)], *parts[at:]])))
    return out


class Exceedance:
    """The weighted share of a rule's negative training rows scoring at least s, out of fold."""

    def __init__(self, scores: F64, weights: F64) -> None:
        order = np.argsort(scores)
        self.sorted = scores[order]
        kept = weights[order]
        self.tail = np.cumsum(kept[::-1])[::-1] / kept.sum()

    def of(self, s: float) -> float:
        i = int(np.searchsorted(self.sorted, s, side="left"))
        return 0.0 if i >= len(self.sorted) else float(self.tail[i])

    def score_at(self, exceedance: float) -> float:
        at = np.nonzero(self.tail <= exceedance)[0]
        return float(self.sorted[at[0]]) if len(at) else float(self.sorted[-1])


def readings(exceedance: Exceedance) -> dict[str, Callable[[F64], float]]:
    def worst_for_n(s: F64) -> float:
        worst, n = float(s.max()), max(1.0, len(s) * WINDOW_OVERLAP)
        e = exceedance.of(worst)
        return worst if e == 0.0 else min(worst, exceedance.score_at(1 - (1 - e) ** n))

    return {
        "worst": lambda s: float(s.max()),
        "worst_for_n": worst_for_n,
        "worst_minus_p90": lambda s: float(s.max() - np.quantile(s, 0.9)),
        "worst_minus_p50": lambda s: float(s.max() - np.quantile(s, 0.5)),
        "worst_z": lambda s: float((s.max() - s.mean()) / (s.std() + 1e-9)),
    }


def _auroc(positive: Sequence[float], negative: Sequence[float]) -> float:
    p, n = np.array(positive)[:, None], np.array(negative)[None, :]
    return float((p > n).mean() + 0.5 * (p == n).mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embedder", choices=["e5", "minilm"], default="e5")
    parser.add_argument("--pairs", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="3 pairs")
    args = parser.parse_args(argv)
    pairs = 3 if args.quick else args.pairs
    engine = _rule(args.data, args.embedder, EmbeddingCache())
    trained = engine.trained["injection"]
    head = trained.head
    yes = head.labels.index("yes")
    if head.oof is None or trained.targets is None:
        raise SystemExit("the rule's head kept no out-of-fold scores: rebuild its cache")
    negative = trained.targets != yes
    weights = trained.weights if trained.weights is not None else np.ones(len(trained.targets))
    exceedance = Exceedance(head.oof[negative, yes], weights[negative])
    scores: dict[str, list[F64]] = {"clean": [], "injected": []}
    with Progress(transient=True) as progress:
        task = progress.add_task("documents", total=2 * pairs)
        for plain, hidden in documents(args.data, pairs):
            for kind, text in (("clean", plain), ("injected", hidden)):
                reading = engine.read(text, windows=True)
                scores[kind].append(head.probabilities(reading.windows)[:, yes])
                progress.advance(task)
    figures: dict[str, dict[str, float]] = {}
    for name, read in readings(exceedance).items():
        clean = [read(s) for s in scores["clean"]]
        injected = [read(s) for s in scores["injected"]]
        row = {"auroc": round(_auroc(injected, clean), 3)}
        if name in ("worst", "worst_for_n"):
            row |= {
                "clean_allowed": round(float(np.mean(np.array(clean) <= ALLOW_AT)), 3),
                "clean_denied": round(float(np.mean(np.array(clean) >= DENY_AT)), 3),
                "injected_denied": round(float(np.mean(np.array(injected) >= DENY_AT)), 3),
                "injected_allowed": round(float(np.mean(np.array(injected) <= ALLOW_AT)), 3),
            }
        figures[name] = row
        sys.stderr.write(f"{name}: {row}\n")
    worst = {kind: sorted(round(float(s.max()), 3) for s in scores[kind]) for kind in scores}
    windows = int(np.median([len(s) for s in scores["clean"]]))
    print(
        json.dumps(
            {"embedder": args.embedder, "pairs": pairs, "windows_median": windows, "worst": worst, "readings": figures}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
