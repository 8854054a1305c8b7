"""Fit the zero-shot calibration the embedded engines ship, and measure it on sets it never saw.

Writes ``engines/embedded/zero_shot_calibration.json`` (read by ``engines/embedded/_zero_shot.py``):
one calibration per engine x model x question type, each fitted on the engine's *raw* zero-shot
distributions, computed as the engines compute them (``SparrowEngine.read(..., calibrated=False)``;
for the embedded engine's choices, ``EmbeddedEngine._blend`` of that with the similarity of what
the engine embeds), with e5 and MiniLM as the embedder.

Fit sets, the only rows the calibration learns from (training splits; validation splits for the
figures shown beside the fit):

* choice: SNIPS (7 intents), HWU64 scenarios (18) and intents (64), and, on other rows of them,
  the same question with a seeded subset of 2 to 8 of the options (the true one kept);
* noul: ``topics``, "Is this request about <intent>?" on further SNIPS and HWU64 rows (the true
  intent half the time, another one otherwise), and deepset's prompt-injection training split.

Every fit set weighs the same. The form of each calibration is chosen on the fit sets alone, by
leave-one-set-out log loss (the simplest form within 0.002 nats of the best): for choices none,
one temperature, or an inverse temperature linear in log K (K options); for nouls none, a
temperature, or Platt scaling (a slope and a bias on logit P(yes)). Scores stay as they are: no
public set has ordinal labels to fit them on.

Evaluation sets, never fitted on (test splits; ``--evaluate``): choices on CLINC150 domains,
CLINC150 intents and Banking77; yes/no on XSTest (and all its splits: its test split has 90 rows),
OpenAI moderation (8 rules) and RouteLLM MMLU; beside them RouteLLM GSM8K, the prompt-injection
test split (its training split is a fit set) and yes/no topic questions made the fit sets' way
from the CLINC150 and Banking77 test rows (``*-topics``; ``-20``: yes a fifth of the time). Each
shows rows, accuracy, mean confidence, ECE (15 bins), AUROC (choices: the confidence ranking right
answers above wrong ones; yes/no: P(yes) ranking yes rows above no rows) and the Brier skill score
against the set's own base rates, raw and calibrated.

    python bench/fit_zero_shot.py --evaluate         # fit, write the JSON, measure (about 20 min cold on 2 cores)
    python bench/fit_zero_shot.py --quick --evaluate # small samples, e5 only, under a minute; writes under --out
    python bench/fit_zero_shot.py --evaluate-only    # measure the shipped file, fit nothing

Raw distributions are cached under ``--out`` (``cache/*.jsonl``, keyed by state and question), so a
rerun recomputes only what is new. Data is read in place from ../shared/data (or
$FASTSLOW_SHARED_DATA); the converted files go to ``--out``. The last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import math
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from fastslow.engines.embedded import EmbeddedEngine, SparrowEngine, load_embedder
from fastslow.engines.embedded.tools import (
    CALIBRATION_FILE,
    FORMAT,
    ZeroShotCalibration,
    ZeroShotCalibrations,
    as_text,
    ends,
    load_zero_shot_calibrations,
    squash,
)
from fastslow.policies.evaluation import auroc, brier, convert, ece, log_loss, read_rows
from fastslow.router import Choice, Noul, Question, State
from fastslow.router.engine_api import question_to_wire

from _data import DataMissing, data_dir, wilson

F64 = NDArray[np.float64]
REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "engines" / "embedded" / CALIBRATION_FILE
EMBEDDERS = ("e5", "minilm")
MIN_CONFIDENCE = 0.7
"""The shipped policy's default ``min_confidence``: an answer under it escalates."""
CEILING_TOP = 0.1
"""The share of most confident held-out answers whose accuracy sets a yes/no calibration's ceiling."""
EMBEDDER_CHOICE: dict[str, Literal["e5", "minilm"]] = {"e5": "e5", "minilm": "minilm"}
FLOOR = 1e-12
NONE = "none_of_these"
console = Console(stderr=True)


# -- items ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    """One (state, question) with its true option; ``group`` is the set it came from."""

    group: str
    id: str
    question_name: str
    state: State
    question: Question
    label: str

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(self.question.options)

    @property
    def key(self) -> str:
        text = json.dumps([self.state, question_to_wire(self.question)], sort_keys=True, ensure_ascii=False)
        return hashlib.sha1(text.encode()).hexdigest()


def _rows(name: str, source: Path, work: Path, split: str, limit: int | None) -> list[Any]:
    """A seeded sample of at most ``limit`` rows of one split (converted once into ``work``), shuffled."""
    out = work / "data" / f"{name}.{split}.{limit or 'all'}.jsonl.gz"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        convert(name, source, out, splits=[split], limit=limit)
    rows = list(read_rows(out).rows)
    random.Random(f"{name}/{split}").shuffle(rows)
    return rows


def _labelled(group: str, rows: Iterable[Any], only: str | None = None) -> list[Item]:
    items = []
    for row in rows:
        for qname, question in row.questions.items():
            if (only is None or qname == only) and qname in row.labels:
                items.append(Item(group, row.id, qname, row.state, question, row.labels[qname]))
    return items


def _subsets(group: str, items: Sequence[Item], seed: int, sizes: Sequence[int] = (2, 3, 4, 5, 8)) -> list[Item]:
    """The same rows asked with a seeded subset of the options, the true one kept."""
    rng = random.Random(seed)
    out = []
    for item in items:
        assert isinstance(item.question, Choice)
        k = rng.choice([s for s in sizes if s < len(item.options)])
        others = rng.sample([o for o in item.options if o != item.label], k - 1)
        keep = set(others) | {item.label}
        criteria = {o: d for o, d in item.question.criteria.items() if o in keep}
        question = Choice(criteria=criteria, instructions=item.question.instructions)
        out.append(Item(group, item.id, item.question_name, item.state, question, item.label))
    return out


def _readable(option: str, description: str | None) -> str:
    if description and description.strip():
        return description.strip()
    return option.replace("_", " ").lower()


def _topics(group: str, items: Sequence[Item], seed: int, p_yes: float = 0.5) -> list[Item]:
    """Yes/no topic questions: the true option with probability ``p_yes``, another one otherwise."""
    rng = random.Random(seed)
    out = []
    for item in items:
        assert isinstance(item.question, Choice)
        if item.label == NONE:  # out of scope: no topic to ask about
            continue
        yes = rng.random() < p_yes
        option = item.label if yes else rng.choice([o for o in item.options if o not in (item.label, NONE)])
        topic = _readable(option, item.question.criteria[option])
        question = Noul(instructions=f"Is this request about {topic}?")
        out.append(Item(group, item.id, "topic", item.state, question, "yes" if yes else "no"))
    return out


def fit_sets(source: Path, work: Path, n: int, split: str) -> dict[str, list[Item]]:
    """The items the calibration may learn from, by kind (``split``: train to fit, validation to check).

    Choices: SNIPS and HWU64's own questions on ``n`` rows each, and option subsets on ``n / 2``
    other rows of each. Nouls: topic questions on ``n / 4`` further rows of each question (one set,
    ``topics``: one construction, so it weighs as much as the prompt injections) and prompt injections.
    No state is asked twice within one set.
    """
    snips_rows = _rows("snips", source, work, split, 2 * n)
    hwu_rows = _rows("hwu64", source, work, split, 2 * n)
    snips, snips2 = _labelled("snips", snips_rows[:n]), _labelled("", snips_rows[n:])
    scen = _labelled("hwu64-scenario", hwu_rows[:n], "scenario")
    intent = _labelled("hwu64-intent", hwu_rows[:n], "intent")
    intent2, scen2 = _labelled("", hwu_rows[n:], "intent"), _labelled("", hwu_rows[n:], "scenario")
    half, quarter = n // 2, max(1, n // 4)
    subsets = _subsets("snips-subsets", snips2[:half], 11) + _subsets("hwu64-subsets", intent2[:half], 12)
    topics = (
        _topics("topics", snips2[half : half + quarter], 21)
        + _topics("topics", intent2[half : half + quarter], 22)
        + _topics("topics", scen2[half + quarter : half + 2 * quarter], 23)
    )
    injection = _labelled("prompt-injection", _rows("prompt-injection", source, work, split, n))
    return {"choice": [*snips, *scen, *intent, *subsets], "noul": [*topics, *injection]}


EVAL_CHOICE = ("clinc150-domain", "clinc150-intent", "banking77")
EVAL_NOUL = ("xstest", "moderation", "routellm-mmlu")
EVAL_TOPICS = ("clinc150-intent-topics", "banking77-topics", "clinc150-domain-topics", "banking77-topics-20")
"""Derived yes/no sets on the choice evaluation sets' test rows, asked as the fit sets' topics are
("Is this request about <intent>?", yes half the time; ``-20``: yes a fifth of the time)."""
EVAL_EXTRA_NOUL = ("xstest-all", "routellm-gsm8k", "prompt-injection")
"""Shown beside the evaluation: XSTest over all its splits (its test split is small), GSM8K, and the
prompt-injection test split (not an evaluation set proper: its training split is a fit set)."""


HELD_OUT_SOURCE = {"hwu64-scenario": "hwu64"}
"""Evaluation sets whose source the shipped calibration was fitted on (other rows, other splits):
each is measured under the shipped forms refitted on the fit sets of the other sources alone
(``without_source``), so that it is a set its calibration never saw."""


def eval_sets(source: Path, work: Path, n: int) -> dict[str, list[Item]]:
    out: dict[str, list[Item]] = {}
    for name in (*EVAL_CHOICE, *EVAL_NOUL, "routellm-gsm8k", "prompt-injection"):
        out[name] = _labelled(name, _rows(name, source, work, "test", n))
    out["hwu64-scenario"] = _labelled("hwu64-scenario", _rows("hwu64", source, work, "test", n), "scenario")
    rows = [r for s in ("train", "validation", "test") for r in _rows("xstest", source, work, s, None)]
    out["xstest-all"] = _labelled("xstest-all", rows)
    half = n // 2
    out["clinc150-intent-topics"] = _topics("clinc150-intent-topics", out["clinc150-intent"][:half], 31)
    out["clinc150-domain-topics"] = _topics("clinc150-domain-topics", out["clinc150-domain"][half:], 32)
    out["banking77-topics"] = _topics("banking77-topics", out["banking77"][:half], 33)
    out["banking77-topics-20"] = _topics("banking77-topics-20", out["banking77"][half:], 34, p_yes=0.2)
    return out


# -- raw distributions, cached ---------------------------------------------------------------------------


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


# -- fitting ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arrays:
    """A set's raw distributions as arrays: per K, log-probabilities (n, K) and label indices."""

    groups: list[str]
    by_k: dict[int, tuple[F64, NDArray[np.intp], F64]]  # K -> (log p, label, weight)


def _arrays(items: Sequence[Item], probs: Sequence[dict[str, float]], weights: Sequence[float]) -> Arrays:
    buckets: dict[int, tuple[list[list[float]], list[int], list[float]]] = defaultdict(lambda: ([], [], []))
    for item, p, w in zip(items, probs, weights, strict=True):
        options = item.options
        b = buckets[len(options)]
        b[0].append([math.log(max(p[o], FLOOR)) for o in options])
        b[1].append(options.index(item.label))
        b[2].append(w)
    by_k = {k: (np.array(v[0]), np.array(v[1], dtype=np.intp), np.array(v[2])) for k, v in buckets.items()}
    return Arrays(sorted({i.group for i in items}), by_k)


def _features(form: str, k: int) -> F64:
    return np.array([1.0, math.log(k)]) if form == "temperature_log_k" else np.array([1.0])


def _fit_temperature(data: Arrays, form: str) -> F64:
    """Inverse temperature ``beta = w . f(K)`` minimising the weighted log loss (convex: Newton)."""
    w = np.zeros(2 if form == "temperature_log_k" else 1)
    w[0] = 1.0

    def loss_grad_hess(w: F64) -> tuple[float, F64, F64]:
        loss, grad, hess = 0.0, np.zeros_like(w), np.zeros((len(w), len(w)))
        for k, (logp, y, wt) in data.by_k.items():
            f = _features(form, k)
            beta = float(f @ w)
            z = beta * logp
            top = z.max(axis=1, keepdims=True)
            e = np.exp(z - top)
            lse = np.log(e.sum(axis=1)) + top[:, 0]
            q = e / e.sum(axis=1, keepdims=True)
            true = logp[np.arange(len(y)), y]
            loss += float(np.sum(wt * (lse - beta * true)))
            mean = (q * logp).sum(axis=1)
            var = (q * logp**2).sum(axis=1) - mean**2
            grad += float(np.sum(wt * (mean - true))) * f
            hess += float(np.sum(wt * var)) * np.outer(f, f)
        return loss, grad, hess

    for _ in range(100):
        loss, grad, hess = loss_grad_hess(w)
        step = np.linalg.solve(hess + 1e-9 * np.eye(len(w)), grad)
        t = 1.0
        while t > 1e-6:
            cand = w - t * step
            if all(float(_features(form, k) @ cand) > 0 for k in data.by_k) and loss_grad_hess(cand)[0] <= loss:
                break
            t /= 2
        w = w - t * step
        if float(np.abs(t * step).max()) < 1e-8:
            break
    return w


def _noul_x(data: Arrays) -> tuple[F64, F64, F64]:
    """logit P(yes), whether the label is yes, and weights, of a yes/no set (options ``yes``, ``no``)."""
    ((logp, y, wt),) = data.by_k.values()
    x = logp[:, 0] - logp[:, 1]  # options are ("yes", "no")
    return x, (y == 0).astype(np.float64), wt


def _fit_platt(data: Arrays, with_bias: bool) -> F64:
    """Slope (and bias) on logit P(yes) minimising the weighted log loss (logistic regression, Newton)."""
    x, t, wt = _noul_x(data)
    feats = np.stack([x, np.ones_like(x)], axis=1) if with_bias else x[:, None]
    w = np.zeros(feats.shape[1])
    w[0] = 1.0
    for _ in range(100):
        z = feats @ w
        p = 1.0 / (1.0 + np.exp(-z))
        grad = feats.T @ (wt * (p - t))
        hess = (feats * (wt * p * (1 - p))[:, None]).T @ feats + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w = w - step
        if float(np.abs(step).max()) < 1e-10:
            break
    return w


FORMS = {"choice": ("identity", "temperature", "temperature_log_k"), "noul": ("identity", "temperature", "platt")}


def _calibration(
    engine: str, model: str, kind: str, form: str, w: F64, k_range: tuple[int, int]
) -> ZeroShotCalibration:
    if form == "identity":
        return ZeroShotCalibration(engine=engine, model=model, kind=kind, form="identity")  # type: ignore[arg-type]
    if kind == "noul":
        bias = float(w[1]) if form == "platt" else 0.0
        return ZeroShotCalibration(engine=engine, model=model, kind="noul", form="platt", slope=float(w[0]), bias=bias)
    return ZeroShotCalibration(
        engine=engine,
        model=model,
        kind=kind,  # type: ignore[arg-type]
        form="temperature",
        beta0=float(w[0]),
        beta_log_k=float(w[1]) if form == "temperature_log_k" else 0.0,
        k_min=k_range[0],
        k_max=k_range[1],
    )


def _fit(engine: str, model: str, kind: str, form: str, data: Arrays) -> ZeroShotCalibration:
    ks = sorted(data.by_k)
    if form == "identity":
        return _calibration(engine, model, kind, form, np.zeros(0), (ks[0], ks[-1]))
    if kind == "noul":
        w = _fit_platt(data, with_bias=form == "platt")
    else:
        w = _fit_temperature(data, form)
    return _calibration(engine, model, kind, form, w, (ks[0], ks[-1]))


def _group_sizes(items: Sequence[Item]) -> dict[str, int]:
    """Rows of each fit set (group) in ``items``, by name."""
    return dict(sorted(Counter(item.group for item in items).items()))


def _equal_weights(items: Sequence[Item]) -> list[float]:
    """Each group (set) weighs the same in total, whatever its size."""
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[item.group] += 1
    return [1.0 / counts[item.group] for item in items]


# -- figures ---------------------------------------------------------------------------------------------


def _base_rates(items: Sequence[Item], key: Any) -> list[F64]:
    """Each item's reference forecast: the label frequencies of the items sharing its ``key(item)``."""
    by_key: dict[Any, list[int]] = defaultdict(list)
    for i, item in enumerate(items):
        by_key[(key(item), item.options)].append(i)
    base: list[F64] = [np.zeros(0)] * len(items)
    for (_, options), idx in by_key.items():
        counts = np.zeros(len(options))
        for i in idx:
            counts[options.index(items[i].label)] += 1
        for i in idx:
            base[i] = counts / counts.sum()
    return base


def _skill(briers: Sequence[float], refs: Sequence[float]) -> float:
    ref = float(np.mean(refs))
    return 1.0 - float(np.mean(briers)) / ref if ref > 0 else math.nan


ECE_FLOOR_DRAWS = 200


def ece_floor(confidence: Sequence[float]) -> float:
    """The ECE a perfectly calibrated model with these confidences would show on this many rows.

    Binned ECE is biased upwards on a finite sample: each bin's accuracy scatters about its
    confidence by sqrt(c (1 - c) / n_b), and the absolute values add up. On 1,000 rows at about 60 %
    that scatter alone reads as 0.03 to 0.04, most of a 0.05 target. Mean over seeded draws of
    right ~ Bernoulli(confidence), the same bins.
    """
    c = np.asarray(confidence, dtype=np.float64)
    rng = np.random.default_rng(0)
    return float(np.mean([ece(c, rng.random(len(c)) < c) for _ in range(ECE_FLOOR_DRAWS)]))


def figures(items: Sequence[Item], probs: Sequence[dict[str, float]], *, floor: bool = False) -> dict[str, Any]:
    """Rows, accuracy, ECE, AUROC, Brier and Brier skill scores; with ``floor``, the ECE's ``ece_floor`` too
    (200 seeded draws: only for the figures shown, not for every fit the form selection scores).

    ``brier_skill`` is against the base rates of the whole set (one forecast of its label
    frequencies for every row); ``brier_skill_per_question`` against each question's own (the
    same but for moderation, whose eight rules have their own base rates).
    """
    conf, right, briers, losses = [], [], [], []
    yes_scores: list[float] = []
    yes_truth: list[bool] = []
    per_set = _base_rates(items, lambda it: it.group)
    per_question = _base_rates(items, lambda it: (it.group, it.question_name))
    refs, refs_q = [], []
    for i, (item, p) in enumerate(zip(items, probs, strict=True)):
        options = item.options
        vec = np.array([p[o] for o in options])
        vec = vec / vec.sum()
        y = options.index(item.label)
        top = int(vec.argmax())
        conf.append(float(vec[top]))
        right.append(top == y)
        briers.append(brier(vec[None, :], [y]))
        refs.append(brier(per_set[i][None, :], [y]))
        refs_q.append(brier(per_question[i][None, :], [y]))
        losses.append(log_loss(vec[None, :], [y]))
        if isinstance(item.question, Noul):
            yes_scores.append(p["yes"])
            yes_truth.append(item.label == "yes")
    noul = bool(yes_scores) and len(yes_scores) == len(items)
    return {
        "rows": len(items),
        "accuracy": float(np.mean(right)),
        "mean_confidence": float(np.mean(conf)),
        "ece": ece(conf, right),
        "ece_floor": ece_floor(conf) if floor else None,
        "auroc": auroc(yes_scores, yes_truth) if noul else auroc(conf, right),
        "auroc_of": "P(yes) for yes rows" if noul else "confidence for right answers",
        "confidence_auroc": auroc(conf, right),
        "brier": float(np.mean(briers)),
        "brier_skill": _skill(briers, refs),
        "brier_skill_per_question": _skill(briers, refs_q),
        "log_loss": float(np.mean(losses)),
        "base_rate_yes": float(np.mean(yes_truth)) if noul else None,
        "mean_p_yes": float(np.mean(yes_scores)) if noul else None,
        "oos_auroc": _oos_auroc(items, probs),
        "under_min_confidence": float(np.mean(np.array(conf) < MIN_CONFIDENCE)),
    }


def _oos_auroc(items: Sequence[Item], probs: Sequence[dict[str, float]]) -> float | None:
    """AUROC of P(none_of_these) for the out-of-scope rows, as ``fastslow eval`` reports it; ``None`` without one."""
    pairs = [(p[NONE] / sum(p.values()), it.label == NONE) for it, p in zip(items, probs, strict=True) if NONE in p]
    if not pairs or len(pairs) < len(items):
        return None
    return auroc([s for s, _ in pairs], [t for _, t in pairs])


def _held_out(
    engine: str, model: str, kind: str, form: str, items: Sequence[Item], raw: list[dict[str, float]]
) -> Iterator[tuple[str, list[int], ZeroShotCalibration]]:
    """Leave one fit set out, each in turn: the set, its rows, and the calibration fitted on the others."""
    for held in sorted({i.group for i in items}):
        train = [j for j, it in enumerate(items) if it.group != held]
        tr_items = [items[j] for j in train]
        cal = _fit(engine, model, kind, form, _arrays(tr_items, [raw[j] for j in train], _equal_weights(tr_items)))
        yield held, [j for j, it in enumerate(items) if it.group == held], cal


def _loso(
    engine: str, model: str, kind: str, form: str, items: Sequence[Item], raw: list[dict[str, float]]
) -> dict[str, Any]:
    """Leave one fit set out: fit on the others, score the one left out (log loss and ECE, mean over sets)."""
    losses, eces = {}, {}
    for held, test, cal in _held_out(engine, model, kind, form, items, raw):
        got = figures([items[j] for j in test], [cal.apply(raw[j]) for j in test])
        losses[held], eces[held] = got["log_loss"], got["ece"]
    return {
        "log_loss": float(np.mean(list(losses.values()))),
        "ece": float(np.mean(list(eces.values()))),
        "by_set": {g: {"log_loss": round(losses[g], 4), "ece": round(eces[g], 4)} for g in sorted(losses)},
    }


def _ceiling(
    engine: str, model: str, form: str, items: Sequence[Item], raw: list[dict[str, float]]
) -> tuple[float, dict[str, Any]]:
    """A yes/no calibration's ceiling: what its most confident answers were worth on sets it was not fitted on.

    Leave one fit set out: fit on the others, answer the one left out; pooled over the sets, the
    ``CEILING_TOP`` most confident answers' accuracy, at its lower Wilson bound (95 %), at least 0.5.
    A set the model has no skill on then cannot get answers more confident than the model has been
    right, wherever it was.
    """
    pooled: list[tuple[float, bool]] = []
    for _held, test, cal in _held_out(engine, model, "noul", form, items, raw):
        for j in test:
            q = cal.apply(raw[j])
            answer = max(q, key=lambda o: q[o])
            pooled.append((q[answer], answer == items[j].label))
    pooled.sort(key=lambda cr: -cr[0])
    top = pooled[: max(30, int(CEILING_TOP * len(pooled)))]
    right = sum(r for _c, r in top)
    ceiling = max(0.5, wilson(right, len(top))[0])
    info = {
        "by": f"leave one fit set out: the {CEILING_TOP:.0%} most confident held-out answers' accuracy, "
        "its lower Wilson bound",
        "rows": len(top),
        "accuracy": round(right / len(top), 4) if top else None,
        "their_confidence_from": round(top[-1][0], 4) if top else None,
        "ceiling": round(ceiling, 4),
    }
    return ceiling, info


# -- main ------------------------------------------------------------------------------------------------


def _entry_json(cal: ZeroShotCalibration, info: dict[str, Any]) -> dict[str, Any]:
    if cal.form == "identity":
        params: dict[str, Any] = {}
    elif cal.form == "platt":
        params = {"slope": round(cal.slope, 6), "bias": round(cal.bias, 6)}
        if cal.ceiling < 1.0:
            params["ceiling"] = round(cal.ceiling, 4)
    else:
        params = {
            "beta0": round(cal.beta0, 6),
            "beta_log_k": round(cal.beta_log_k, 6),
            "k_min": cal.k_min,
            "k_max": cal.k_max,
        }
    return {"engine": cal.engine, "model": cal.model, "kind": cal.kind, "form": cal.form, "params": params, **info}


def _version() -> str:
    from importlib.metadata import version

    return version("fastslow")


def _r(x: Any) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, 4)
    if isinstance(x, dict):
        return {k: _r(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_r(v) for v in x]
    return x


def fit(
    raw: Raw,
    train: dict[str, list[Item]],
    valid: dict[str, list[Item]],
    n: int,
    kinds: Sequence[str] = ("choice", "noul"),
    keep: Path | None = None,
) -> tuple[dict[str, Any], ZeroShotCalibrations, dict[str, Any]]:
    """Choose and fit every calibration of ``kinds`` (the others kept as the calibration file ``keep`` has them).

    Returns the file's JSON, the calibrations, and a summary.
    """
    entries: list[dict[str, Any]] = []
    cals: dict[tuple[str, str, str], ZeroShotCalibration] = {}
    summary: dict[str, Any] = {}
    kept_doc = json.loads(keep.read_text(encoding="utf-8")) if keep is not None else {}
    kept = load_zero_shot_calibrations(keep).entries if keep is not None else {}
    for kind in ("choice", "noul"):
        if kind not in kinds:  # kept as the file has it
            entries += [e for e in kept_doc.get("calibrations", []) if e["kind"] == kind]
            cals.update({key: cal for key, cal in kept.items() if key[2] == kind})
            continue
        items = train[kind]
        for source in raw.sources(kind):
            engine, model = raw.engine_model(source)
            probs = [raw.get(source, it) for it in items]
            loso = {form: _loso(engine, model, kind, form, items, probs) for form in FORMS[kind]}
            # The simplest form within 0.002 nats of the best held-out log loss.
            best = min(v["log_loss"] for v in loso.values())
            form = next(f for f in FORMS[kind] if loso[f]["log_loss"] <= best + 0.002)
            cal = _fit(engine, model, kind, form, _arrays(items, probs, _equal_weights(items)))
            ceiling_info = None
            if kind == "noul" and cal.form == "platt":
                ceiling, ceiling_info = _ceiling(engine, model, form, items, probs)
                cal = replace(cal, ceiling=ceiling)
            vitems = valid[kind]
            vprobs = [raw.get(source, it) for it in vitems]
            before = figures(vitems, vprobs)
            after = figures(vitems, [cal.apply(p) for p in vprobs])
            info = {
                "fitted_on": {
                    "sets": {g: {"split": "train", "rows": c} for g, c in _group_sizes(items).items()},
                    "n": len(items),
                    "weighting": "each set weighs the same",
                    "source": "../shared/data (bench/fit_zero_shot.py)",
                },
                "selection": {
                    "by": "leave-one-set-out log loss on the fit sets: the simplest form within 0.002 nats of the best",
                    "leave_one_set_out": _r(loso),
                },
                "validation": {
                    "split": "validation of the same sets",
                    "n": len(vitems),
                    "raw": _r({k: before[k] for k in ("ece", "log_loss", "brier_skill")}),
                    "calibrated": _r({k: after[k] for k in ("ece", "log_loss", "brier_skill")}),
                },
            }
            if ceiling_info is not None:
                info["ceiling"] = ceiling_info
            entries.append(_entry_json(cal, info))
            cals[(engine, model, kind)] = cal
            summary[f"{engine}/{kind}"] = {
                "form": form,
                "params": entries[-1]["params"],
                "validation": info["validation"],
            }
    score = ZeroShotCalibration(engine="sparrow", model=raw.sparrow.model, kind="score", form="identity")
    entries.append(
        _entry_json(
            score,
            {"fitted_on": None, "note": "left as sparrow gives it: no public set with ordinal labels to fit on"},
        )
    )
    cals[("sparrow", raw.sparrow.model, "score")] = score
    document = {
        "format": FORMAT,
        "fastslow_version": _version(),
        "created": datetime.date.today().isoformat(),
        "script": "bench/fit_zero_shot.py",
        "rows_per_set": n,
        "forms": {
            "temperature": "q_i ∝ p_i ** beta, beta = beta0 + beta_log_k * ln(clip(K, k_min, k_max))",
            "platt": "logit(q_yes) = slope * logit(p_yes) + bias",
            "identity": "unchanged",
        },
        "calibrations": entries,
    }
    return document, ZeroShotCalibrations(cals), summary


def _kind_of(items: Sequence[Item]) -> str:
    return "choice" if isinstance(items[0].question, Choice) else "noul"


def without_source(
    raw: Raw, train: Sequence[Item], cals: ZeroShotCalibrations, prefix: str
) -> tuple[ZeroShotCalibrations, dict[str, int]]:
    """The choice calibrations of ``cals``, each in its own form, refitted on the fit sets not drawn from ``prefix``.

    Returns them and the rows of each fit set they learned from.
    """
    items = [it for it in train if not it.group.startswith(prefix)]
    entries: dict[tuple[str, str, str], ZeroShotCalibration] = {}
    for source in raw.sources("choice"):
        engine, model = raw.engine_model(source)
        shipped = cals.entries[(engine, model, "choice")]
        probs = [raw.get(source, it) for it in items]
        entries[(engine, model, "choice")] = _fit(
            engine, model, "choice", shipped.form, _arrays(items, probs, _equal_weights(items))
        )
    return ZeroShotCalibrations(entries), _group_sizes(items)


def evaluate(
    raw: Raw,
    sets: dict[str, list[Item]],
    cals: ZeroShotCalibrations,
    held_out: dict[str, ZeroShotCalibrations] | None = None,
) -> dict[str, Any]:
    """Raw and calibrated figures of every set; a set named in ``held_out`` under the calibrations given there."""
    out: dict[str, Any] = {}
    for name, items in sets.items():
        kind = _kind_of(items)
        cals_here = (held_out or {}).get(name, cals)
        for source in raw.sources(kind):
            engine, model = raw.engine_model(source)
            label = "sparrow" if source == "sparrow" else f"embedded ({source})"
            probs = [raw.get(source, it) for it in items]
            before = figures(items, probs)
            after = figures(
                items, [cals_here.apply(p, engine=engine, model=model, kind=kind) for p in probs], floor=True
            )
            out.setdefault(name, {})[label] = {"kind": kind, "raw": _r(before), "calibrated": _r(after)}
            if kind == "noul":  # the embedded engine's nouls are sparrow's
                out[name]["embedded (sparrow's nouls)"] = out[name][label]
    return out


def _show(results: dict[str, Any]) -> None:
    table = Table(title="zero-shot calibration on sets it was not fitted on (raw -> calibrated)")
    for col in ("set", "engine", "rows", "acc.", "conf.", "ECE", "ECE floor", "AUROC", "Brier skill"):
        table.add_column(col)
    for name, engines in results.items():
        for label, r in engines.items():
            if label.startswith("embedded (sparrow"):
                continue
            a, b = r["raw"], r["calibrated"]

            def pair(key: str, a: dict[str, Any] = a, b: dict[str, Any] = b) -> str:
                return f"{a[key]:.3f} -> {b[key]:.3f}" if a[key] is not None else "-"

            table.add_row(
                name,
                label,
                str(a["rows"]),
                f"{a['accuracy']:.3f}",
                pair("mean_confidence"),
                pair("ece"),
                f"{b['ece_floor']:.3f}",
                pair("auroc"),
                pair("brier_skill"),
            )
    console.print(table)


ENGINE_ROWS = (
    ("sparrow", "sparrow"),
    ("embedded (e5)", "embedded, e5 (the default)"),
    ("embedded (minilm)", "embedded, MiniLM"),
)


def markdown(results: dict[str, Any], document: dict[str, Any]) -> str:
    """The evaluation as Markdown tables, one per engine and question type, and the shipped parameters."""
    lines: list[str] = [
        "ECE floor: the ECE a perfectly calibrated model with the calibrated confidences would show on",
        "as many rows (mean of seeded draws); the part of an ECE that is sampling noise. A set marked †",
        "is drawn from a source the shipped calibration learned from (other rows): it is measured under",
        "the same forms refitted without that source's fit sets.",
        "",
    ]
    for kind, title in (("choice", "choices"), ("noul", "yes/no questions")):
        for label, shown in ENGINE_ROWS:
            rows = [(name, e[label]) for name, e in results.items() if label in e and e[label]["kind"] == kind]
            if not rows:
                continue
            if kind == "noul" and label != "sparrow":
                continue
            who = "sparrow (and the embedded engine, whose yes/no answers are sparrow's)" if kind == "noul" else shown
            lines += [f"### {who}: {title}", ""]
            head = "| set | rows | accuracy | mean confidence | ECE | ECE floor | AUROC | Brier skill |"
            noul_tail = f" base rate yes | mean P(yes) | under {MIN_CONFIDENCE} |"
            lines += [head + (noul_tail if kind == "noul" else " OOS AUROC |")]
            lines += ["|" + "---|" * (head.count("|") - 1 + (3 if kind == "noul" else 1))]
            for name, r in rows:
                a, b = r["raw"], r["calibrated"]

                def arrow(key: str, a: dict[str, Any] = a, b: dict[str, Any] = b) -> str:
                    if a.get(key) is None:
                        return "—"
                    return f"{a[key]:.3f} → {b[key]:.3f}"

                tail = (
                    f" {a['base_rate_yes']:.3f} | {arrow('mean_p_yes')} | {arrow('under_min_confidence')} |"
                    if kind == "noul"
                    else f" {arrow('oos_auroc')} |"
                )
                shown_name = f"{name} †" if name in HELD_OUT_SOURCE else name
                lines.append(
                    f"| {shown_name} | {a['rows']} | {a['accuracy']:.3f} | {arrow('mean_confidence')} |"
                    f" {arrow('ece')} | {b['ece_floor']:.3f} | {arrow('auroc')} | {arrow('brier_skill')} |" + tail
                )
            lines.append("")
    lines += ["### Shipped parameters", "", "| engine | model | type | form | parameters |", "|---|---|---|---|---|"]
    for entry in document.get("calibrations", []):
        params = ", ".join(f"{k} = {v}" for k, v in entry["params"].items()) or "—"
        lines.append(f"| {entry['engine']} | {entry['model']} | {entry['kind']} | {entry['form']} | {params} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="the shared data folder (default ../shared/data)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "zeroshot", help="work folder")
    parser.add_argument("--quick", action="store_true", help="small samples, e5 only: under a minute")
    parser.add_argument("--rows", type=int, help="rows per fit set and split (default 600; 40 with --quick)")
    parser.add_argument("--eval-rows", type=int, help="rows per evaluation set (default 1000; 40 with --quick)")
    parser.add_argument(
        "--write",
        type=Path,
        help=f"where to write the calibration (default {SHIPPED.relative_to(REPO)}; under --out with --quick)",
    )
    parser.add_argument("--evaluate", action="store_true", help="also measure on the evaluation sets")
    parser.add_argument("--markdown", type=Path, help="write the evaluation's tables there (with --evaluate)")
    parser.add_argument(
        "--evaluate-only", action="store_true", help="measure the file --write names (default the shipped one)"
    )
    parser.add_argument(
        "--embedders", default=None, help="comma-separated blends to fit (default e5,minilm; e5 with --quick)"
    )
    parser.add_argument(
        "--kinds",
        default="choice,noul",
        help="question types to fit and measure (default choice,noul); the others are kept as the file has them",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    try:
        source = data_dir(args.data)
    except DataMissing as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    n = args.rows or (40 if args.quick else 600)
    n_eval = args.eval_rows or (40 if args.quick else 1000)
    embedders = tuple((args.embedders or ("e5" if args.quick else ",".join(EMBEDDERS))).split(","))
    if not set(embedders) <= set(EMBEDDERS):
        console.print(f"[red]--embedders: each one of {', '.join(EMBEDDERS)}[/red]")
        return 2
    write = args.write or (args.out / f"{CALIBRATION_FILE}.quick" if args.quick else SHIPPED)
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= {"choice", "noul"}:
        console.print("[red]--kinds: each one of choice, noul[/red]")
        return 2
    raw = Raw(RawCache(args.out / "cache"), embedders)
    report: dict[str, Any] = {"rows_per_fit_set": n, "rows_per_eval_set": n_eval, "embedders": list(embedders)}
    train = fit_sets(source, args.out, n, "train")
    if args.evaluate_only:
        cals = load_zero_shot_calibrations(write)
        report["calibration"] = str(write)
    else:
        valid = fit_sets(source, args.out, max(n // 2, 20), "validation")
        raw.fill([it for kind in kinds for it in train[kind]], "fit sets (train)")
        raw.fill([it for kind in kinds for it in valid[kind]], "fit sets (validation)")
        document, cals, summary = fit(raw, train, valid, n, kinds, keep=write if write.exists() else None)
        write.parent.mkdir(parents=True, exist_ok=True)
        write.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        console.print(f"wrote {write}")
        report["fit"] = summary
        report["written"] = str(write)
    if args.evaluate or args.evaluate_only:
        sets = eval_sets(source, args.out, n_eval)
        sets = {name: items for name, items in sets.items() if _kind_of(items) in kinds}
        raw.fill([it for items in sets.values() for it in items], "evaluation sets")
        held_out: dict[str, ZeroShotCalibrations] = {}
        if "choice" in kinds:
            raw.fill(train["choice"], "fit sets (train)")
            for name, prefix in HELD_OUT_SOURCE.items():
                held_out[name], fitted_on = without_source(raw, train["choice"], cals, prefix)
                report.setdefault("held_out_source", {})[name] = {"without": prefix, "fitted_on": fitted_on}
        report["evaluation"] = evaluate(raw, sets, cals, held_out)
        _show(report["evaluation"])
        if args.markdown is not None:
            document = json.loads(write.read_text())
            args.markdown.parent.mkdir(parents=True, exist_ok=True)
            args.markdown.write_text(markdown(report["evaluation"], document))
            console.print(f"wrote {args.markdown}")
    report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
