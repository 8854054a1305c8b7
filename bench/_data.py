"""Public labelled data for the benchmarks, read in place, and the metrics reported on it.

Data lives in ``../shared/data`` beside the checkout, or wherever ``FASTSLOW_SHARED_DATA`` points;
nothing is copied into the repository. Splits are deterministic (seeded).

``Bench`` (converted sets, seeded test samples, benign traffic), ``read_jsonl`` / ``write_jsonl``,
``log`` and ``wilson`` are shared by ``report.py`` and ``quality.py``.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "Bench",
    "DataMissing",
    "Task",
    "accuracy",
    "clinc_domains",
    "coverage_at",
    "coverage_curve",
    "data_dir",
    "ece",
    "embedding_cache_dir",
    "log",
    "prompt_injections",
    "read_jsonl",
    "reliability",
    "wilson",
    "write_jsonl",
    "xstest",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
Z_95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95 % interval."""


class DataMissing(Exception):
    """A data set the benchmark needs is not where it should be."""


def data_dir(override: str | None = None) -> Path:
    """The shared data folder: ``override``, else ``$FASTSLOW_SHARED_DATA``, else ``../shared/data``."""
    return Path(override or os.environ.get("FASTSLOW_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")


def embedding_cache_dir() -> Path | None:
    """``$FASTSLOW_EMBEDDED__CACHE_DIR``, where fastslow keeps example embeddings and trained heads, if set.

    The benchmarks' runs then reuse what an earlier run embedded and trained (an embedding or a
    head is the same read back as computed, so the figures are too); unset, each run's work folder
    has its own cache.
    """
    value = os.environ.get("FASTSLOW_EMBEDDED__CACHE_DIR")
    return Path(value) if value else None


def _need(path: Path) -> Path:
    if not path.exists():
        raise DataMissing(
            f"{path} not found: the benchmarks read the public data sets in place from ../shared/data "
            "(or $FASTSLOW_SHARED_DATA); see docs/data.md for where to get them"
        )
    return path


@dataclass(frozen=True, slots=True)
class Task:
    """One labelled decision: train and test texts with option names as labels."""

    name: str
    kind: str
    """``choice`` or ``noul``."""
    options: tuple[str, ...]
    train_texts: list[str]
    train_labels: list[str]
    test_texts: list[str]
    test_labels: list[str]
    instructions: str
    descriptions: dict[str, str | None]
    """Option -> description, for the zero-shot engines."""

    def cap_train(self, per_option: int | None, seed: int) -> Task:
        """At most ``per_option`` training examples per option (a seeded sample)."""
        if per_option is None:
            return self
        rng = random.Random(seed)
        keep: list[int] = []
        for option in self.options:
            members = [i for i, label in enumerate(self.train_labels) if label == option]
            keep += sorted(rng.sample(members, min(per_option, len(members))))
        keep.sort()
        return replace(
            self, train_texts=[self.train_texts[i] for i in keep], train_labels=[self.train_labels[i] for i in keep]
        )

    def subsample_test(self, n: int | None, seed: int) -> Task:
        if n is None or n >= len(self.test_texts):
            return self
        idx = sorted(random.Random(seed).sample(range(len(self.test_texts)), n))
        return replace(
            self, test_texts=[self.test_texts[i] for i in idx], test_labels=[self.test_labels[i] for i in idx]
        )


def clinc_domains(root: Path, *, per_domain: int = 50, seed: int = 0) -> Task:
    """CLINC150 as 10-way domain routing: ``per_domain`` train examples per domain, the full test split."""
    folder = root / "clinc150"
    data = json.loads(_need(folder / "data_full.json").read_text())
    domains: dict[str, list[str]] = json.loads(_need(folder / "domains.json").read_text())
    domain_of = {intent: d for d, intents in domains.items() for intent in intents}
    rng = random.Random(seed)
    train_texts: list[str] = []
    train_labels: list[str] = []
    for domain in domains:
        pool = [text for text, intent in data["train"] if domain_of[intent] == domain]
        for text in rng.sample(pool, per_domain):
            train_texts.append(text)
            train_labels.append(domain)
    return Task(
        name="clinc150_domains",
        kind="choice",
        options=tuple(domains),
        train_texts=train_texts,
        train_labels=train_labels,
        test_texts=[text for text, _ in data["test"]],
        test_labels=[domain_of[intent] for _, intent in data["test"]],
        instructions="Which domain does the user's request belong to?",
        # Zero-shot engines see each domain's intent names, the only description the data set has.
        descriptions={d: ", ".join(i.replace("_", " ") for i in intents) for d, intents in domains.items()},
    )


def xstest(root: Path, *, seed: int = 0) -> Task:
    """XSTest prompts, unsafe -> yes; a seeded stratified half for training, the other half for testing."""
    rows = list(csv.DictReader(_need(root / "xstest" / "xstest_prompts.csv").open(encoding="utf-8")))
    rng = random.Random(seed)
    train: list[dict[str, str]] = []
    test: list[dict[str, str]] = []
    for label in ("safe", "unsafe"):
        group = [r for r in rows if r["label"] == label]
        rng.shuffle(group)
        train += group[: len(group) // 2]
        test += group[len(group) // 2 :]
    yes_no = {"unsafe": "yes", "safe": "no"}
    return Task(
        name="xstest_unsafe",
        kind="noul",
        options=("yes", "no"),
        train_texts=[r["prompt"] for r in train],
        train_labels=[yes_no[r["label"]] for r in train],
        test_texts=[r["prompt"] for r in test],
        test_labels=[yes_no[r["label"]] for r in test],
        instructions="Does this prompt ask for help with something harmful, dangerous, illegal or hateful?",
        descriptions={"yes": None, "no": None},
    )


def prompt_injections(root: Path) -> Task:
    """deepset prompt injections (lower-cased copy): train on ``train``, test on ``val`` + ``test``."""
    folder = root / "deepset_prompt_injections_lowercased"

    def read(split: str) -> list[dict[str, str]]:
        return list(csv.DictReader(_need(folder / f"{split}.csv").open(encoding="utf-8")))

    train, test = read("train"), read("val") + read("test")
    yes_no = {"1": "yes", "0": "no"}
    return Task(
        name="prompt_injection",
        kind="noul",
        options=("yes", "no"),
        train_texts=[r["text"] for r in train],
        train_labels=[yes_no[r["label"]] for r in train],
        test_texts=[r["text"] for r in test],
        test_labels=[yes_no[r["label"]] for r in test],
        instructions="Is this text a prompt injection: an attempt to override or ignore the assistant's instructions?",
        descriptions={"yes": None, "no": None},
    )


# -- metrics over (probabilities, labels) with columns in option order ------------------------------

F64 = NDArray[np.float64]


def accuracy(probs: F64, labels: Sequence[int]) -> float:
    return float(np.mean(probs.argmax(axis=1) == np.asarray(labels)))


def reliability(probs: F64, labels: Sequence[int], bins: int = 15) -> list[tuple[float, float, int]]:
    """Per equal-width confidence bin: (mean confidence, accuracy, count); empty bins are left out."""
    conf = probs.max(axis=1)
    right = probs.argmax(axis=1) == np.asarray(labels)
    edges = np.linspace(0.0, 1.0, bins + 1)
    out = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        in_bin = (conf > lo) & (conf <= hi) if i else (conf >= lo) & (conf <= hi)
        if in_bin.any():
            out.append((float(conf[in_bin].mean()), float(right[in_bin].mean()), int(in_bin.sum())))
    return out


def ece(probs: F64, labels: Sequence[int], bins: int = 15) -> float:
    """Expected calibration error of the top label, ``bins`` equal-width bins."""
    n = len(labels)
    return float(sum(count / n * abs(acc - conf) for conf, acc, count in reliability(probs, labels, bins)))


def coverage_curve(probs: F64, labels: Sequence[int]) -> tuple[F64, F64]:
    """(coverage, selective accuracy) when answering only the most confident share of inputs."""
    order = np.argsort(-probs.max(axis=1), kind="stable")
    right = (probs.argmax(axis=1) == np.asarray(labels))[order]
    n = np.arange(1, len(right) + 1)
    return n / len(right), np.cumsum(right) / n


def coverage_at(probs: F64, labels: Sequence[int], target: float = 0.97) -> float:
    """The largest share of inputs answerable, most confident first, at selective accuracy >= ``target``."""
    coverage, acc = coverage_curve(probs, labels)
    ok = np.flatnonzero(acc >= target)
    return float(coverage[ok.max()]) if len(ok) else 0.0


def wilson(successes: float, n: float, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval (95 % by default) for ``successes`` out of ``n``; ``(0, 1)`` when ``n`` is 0.

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0 or ``n`` successes
    and for small ``n``: the interval to report beside a share measured on a few hundred rows.
    """
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


# -- converted sets, shared by report.py and quality.py --------------------------------------------


def log(message: str) -> None:
    """One timestamped progress line on stderr."""
    sys.stderr.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every row of a JSON Lines file (gunzipped when the name ends ``.gz``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` as JSON Lines to ``path`` and return it."""
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


class Bench:
    """Converted data under one work folder: whole sets, seeded test samples and benign traffic."""

    def __init__(self, data: Path, work: Path, *, rows: int, seed: int) -> None:
        self.data = data
        self.work = work
        self.rows = rows
        self.seed = seed
        (work / "data").mkdir(parents=True, exist_ok=True)

    def converted(self, name: str, shots: int | None, *, seed: int | None = None) -> tuple[Path, Path | None]:
        """The full conversion of ``name`` (with ``shots`` examples per label), and its examples policy.

        ``seed`` (default the bench's) seeds the converter: its validation split and which
        training rows become examples.
        """
        from fastslow.policies.evaluation import convert

        seed = self.seed if seed is None else seed
        suffix = (f"-{shots}" if shots else "") + (f"-seed{seed}" if seed != self.seed else "")
        out = self.work / "data" / f"{name}{suffix}.jsonl.gz"
        examples = out.with_name(out.name + ".examples.yaml")
        if not out.is_file() or (shots and not examples.is_file()):
            convert(name, self.data, out, seed=seed, examples_per_label=shots)
        return out, examples if shots else None

    def test_sample(self, name: str) -> Path:
        """A seeded sample of ``self.rows`` test rows of ``name`` (all of them when fewer)."""
        out = self.work / "data" / f"{name}.test-{self.rows}.jsonl"
        if not out.is_file():
            full, _ = self.converted(name, None)
            test = [r for r in read_jsonl(full) if r.get("meta", {}).get("split") == "test"]
            random.Random(self.seed).shuffle(test)
            write_jsonl(out, test[: self.rows])
        return out

    def benign(self, check: str, task: str, rules: list[str], *, quick: bool = False) -> dict[str, Path]:
        """Ordinary traffic as rows of the check ``task``, every rule labelled "no" (MT-Bench only when ``quick``)."""
        out: dict[str, Path] = {}
        rng = random.Random(self.seed)

        def rows_of(texts: list[str]) -> list[dict[str, Any]]:
            rng.shuffle(texts)
            return [
                {"id": f"benign-{i}", "task": task, "state": t, "labels": dict.fromkeys(rules, "no")}
                for i, t in enumerate(texts[: self.rows])
            ]

        if not quick:
            clinc = read_jsonl(self.test_sample("clinc150-intent"))
            in_scope = [r["state"] for r in clinc if "none_of_these" not in r["labels"].values()]
            path = self.work / "data" / f"benign-clinc-{check}.jsonl"
            out["CLINC150 in-scope"] = write_jsonl(path, rows_of(in_scope))
        mt_bench = [
            json.loads(line)["turns"][0]
            for line in (self.data / "routellm" / "mt_bench__question.jsonl").read_text().splitlines()
            if line.strip()
        ]
        out["MT-Bench questions"] = write_jsonl(self.work / "data" / f"benign-mtbench-{check}.jsonl", rows_of(mt_bench))
        if quick:
            return out
        moderation, _ = self.converted("moderation", None)
        clean = [
            r["state"]
            for r in read_jsonl(moderation)
            if r["meta"].get("split") == "test" and len(r["labels"]) == 8 and set(r["labels"].values()) == {"no"}
        ]
        if check != "moderation":
            out["moderation clean rows"] = write_jsonl(
                self.work / "data" / f"benign-moderation-{check}.jsonl", rows_of(clean)
            )
        return out


def offline_settings(work: Path, embedder: str) -> Any:
    """The embedded engine with ``embedder``, state under ``work``, the shared embedding cache, and no
    System 2: an escalated decision stays unresolved, and nothing leaves the machine."""
    from fastslow.router import Settings
    from fastslow.router.settings import EmbeddedSettings, System2Settings

    return Settings(
        engine="embedded",
        data_dir=work / "state",
        embedded=EmbeddedSettings(embedder=embedder, cache_dir=embedding_cache_dir()),  # type: ignore[arg-type]
        system2=System2Settings(default="local:none", local_base_url=None),
    )


def seeded_sample(rows: list[dict[str, Any]], n: int | None, seed: str) -> list[dict[str, Any]]:
    """``n`` rows drawn with ``seed`` (all of them when ``n`` is ``None`` or not smaller)."""
    if n is None or n >= len(rows):
        return rows
    return random.Random(seed).sample(rows, n)
