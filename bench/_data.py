"""Public labelled data for the benchmarks, read in place, and the metrics reported on it.

Data lives in ``../shared/data`` beside the checkout, or wherever ``FASTSLOW_SHARED_DATA`` points;
nothing is copied into the repository. Splits are deterministic (seeded).
"""

from __future__ import annotations

import csv
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DataMissing",
    "Task",
    "accuracy",
    "clinc_domains",
    "coverage_at",
    "coverage_curve",
    "data_dir",
    "ece",
    "prompt_injections",
    "reliability",
    "xstest",
]

REPO_ROOT = Path(__file__).resolve().parent.parent


class DataMissing(Exception):
    """A data set the benchmark needs is not where it should be."""


def data_dir(override: str | None = None) -> Path:
    """The shared data folder: ``override``, else ``$FASTSLOW_SHARED_DATA``, else ``../shared/data``."""
    return Path(override or os.environ.get("FASTSLOW_SHARED_DATA") or REPO_ROOT.parent / "shared" / "data")


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
