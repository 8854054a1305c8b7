"""Which open-set score tells CLINC150's out-of-scope messages from in-scope ones best?

CLINC150 as 10-domain routing with ``--shots`` training examples per domain (no out-of-scope
examples), scored on the test split's in-scope and out-of-scope messages: AUROC of each candidate
score (higher = more in scope), over ``--seeds`` sampled training sets. The candidates are the
ones weighed for ``engines/embedded/_open_set.py``. Embeddings go through the on-disk cache, so a
rerun embeds nothing. Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fastslow.engines.embedded import EmbeddingCache, fit_head, load_background, load_embedder

F = NDArray[np.float64]
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _auroc(pos: F, neg: F) -> float:
    scores = np.concatenate([pos, neg])
    ranks = scores.argsort().argsort() + 1.0
    return float((ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def _unit(x: F) -> F:
    out: F = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def _nearest(k: int, center: bool) -> Callable[[F, F, NDArray[np.intp], F], F]:
    def score(x: F, train: F, _y: NDArray[np.intp], _bg: F) -> F:
        mu = train.mean(axis=0) if center else 0.0
        sims = _unit(x - mu) @ _unit(train - mu).T
        out: F = np.sort(sims, axis=1)[:, -k:].mean(axis=1)
        return out

    return score


def _centroid(x: F, train: F, y: NDArray[np.intp], _bg: F) -> F:
    cents = _unit(np.stack([train[y == c].mean(axis=0) for c in np.unique(y)]))
    out: F = (x @ cents.T).max(axis=1)
    return out


def _mahalanobis(x: F, train: F, y: NDArray[np.intp], _bg: F) -> F:
    classes = np.unique(y)
    means = np.stack([train[y == c].mean(axis=0) for c in classes])
    resid = train - means[np.searchsorted(classes, y)]
    cov = resid.T @ resid / len(resid)
    cov = 0.5 * cov + 0.5 * np.trace(cov) / len(cov) * np.eye(len(cov))
    prec = np.linalg.inv(cov)
    d = x[:, None, :] - means[None]
    out: F = -np.einsum("nkd,de,nke->nk", d, prec, d).min(axis=1)
    return out


def _top_probability(x: F, train: F, y: NDArray[np.intp], _bg: F) -> F:
    head = fit_head(train, [str(c) for c in np.unique(y)], y)
    out: F = head.probabilities(x).max(axis=1)
    return out


def _background_relative(x: F, train: F, _y: NDArray[np.intp], bg: F) -> F:
    out: F = (x @ train.T).max(axis=1) - 0.5 * (x @ bg.T).max(axis=1)
    return out


SCORES = {
    "nearest example, centred (shipped)": _nearest(1, True),
    "nearest example": _nearest(1, False),
    "mean of 5 nearest": _nearest(5, False),
    "nearest centroid": _centroid,
    "Mahalanobis (shrunk)": _mahalanobis,
    "head's top probability": _top_probability,
    "nearest example minus background": _background_relative,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--embedder", choices=["e5", "minilm"], default="e5")
    parser.add_argument("--shots", type=int, default=50)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="20 shots, 300 test rows of each kind, one seed")
    args = parser.parse_args(argv)
    folder = args.data / "clinc150"
    full = json.loads((folder / "data_full.json").read_text())
    domain_of = {i: d for d, ints in json.loads((folder / "domains.json").read_text()).items() for i in ints}
    domains = sorted(set(domain_of.values()))
    in_scope = [t for t, _ in full["test"]]
    out_scope = [t for t, _ in full["oos_test"]]
    shots, seeds = (20, 1) if args.quick else (args.shots, args.seeds)
    if args.quick:
        rng = random.Random(0)
        in_scope, out_scope = rng.sample(in_scope, 300), rng.sample(out_scope, 300)
    embedder = load_embedder(args.embedder)
    cache = EmbeddingCache()
    x_in = cache.embed(embedder, in_scope).astype(np.float64)
    x_out = cache.embed(embedder, out_scope).astype(np.float64)
    background = load_background(embedder, cache).vectors.astype(np.float64)
    results: dict[str, list[float]] = {name: [] for name in SCORES}
    for seed in range(seeds):
        rng = random.Random(seed)
        by_domain: dict[str, list[str]] = {d: [] for d in domains}
        for text, intent in full["train"]:
            by_domain[domain_of[intent]].append(text)
        texts = [t for d in domains for t in rng.sample(by_domain[d], shots)]
        y = np.repeat(np.arange(len(domains)), shots)
        train = cache.embed(embedder, texts).astype(np.float64)
        for name, score in SCORES.items():
            auc = _auroc(score(x_in, train, y, background), score(x_out, train, y, background))
            results[name].append(auc)
            sys.stderr.write(f"seed {seed}: {name}: AUROC {auc:.3f}\n")
    summary = {name: round(float(np.mean(v)), 4) for name, v in results.items()}
    print(json.dumps({"embedder": embedder.name, "shots": shots, "seeds": seeds, "auroc": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
