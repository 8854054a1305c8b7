"""Learning from escalations, simulated on CLINC150 domain routing: does System 1 escalate less over time?

The task starts from 10 examples a domain (the converter's fragment, "none of these" examples
included) and opts into ``learn:``. Training-split messages it has no example of arrive one at a
time through the real ``Router``, decision log (SQLite) and ``Learner``: what System 1 escalates,
a simulated System 2 answers (the gold label, wrong at ``--system2-error``, since no frontier API is
reachable here), and the answer is learned; every ``--refresh`` requests the learner reads the
table and retrains when due, as a replica's poll would.

Whenever the engines retrain, the thresholds are re-tuned to the target (``tune_thresholds``: Learn
then Test, 95 % bound) on one half of the validation split; at each checkpoint the other half, fixed
throughout, says what share System 1 escalates and how accurate what it keeps is. The two halves
share the validation split's mix of out-of-scope messages, so the bound carries over (the test
split's mix differs: ``bench/tuning.py`` says by how much that costs).

    python bench/learning.py            # checkpoints 0, 100, 500, 2,000 (about 5 minutes on two cores)
    python bench/learning.py --quick    # checkpoints 0, 100, 300 on 800 rows, a 90 % target: under a minute

The last line of output is one JSON object; ``learning.md`` and ``learning.png`` are written beside it.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from langchain_core.messages import BaseMessage, HumanMessage  # noqa: E402

from fastslow.api import Learner  # noqa: E402
from fastslow.api.store import DecisionStore  # noqa: E402
from fastslow.engines import EnginePool  # noqa: E402
from fastslow.engines.embedded import EmbeddedModels  # noqa: E402
from fastslow.engines.embedded.tools import ends, squash  # noqa: E402
from fastslow.policies import load_policy  # noqa: E402
from fastslow.policies.tuning import Labelled, TooFewLabels, kept_answer, tune_thresholds  # noqa: E402
from fastslow.router import PolicySet, Router, RouteTask, Settings, Thresholds  # noqa: E402
from fastslow.router.engine_api import ChatResult  # noqa: E402
from fastslow.router.settings import EmbeddedSettings  # noqa: E402

from _data import Bench, embedding_cache_dir, log, read_jsonl, wilson  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("FASTSLOW_SHARED_DATA", REPO.parent / "shared" / "data"))
TASK = "clinc150-domain"
SHOTS = 10
TARGET, QUICK_TARGET = 0.97, 0.9
CHECKPOINTS, QUICK_CHECKPOINTS = (0, 100, 500, 2000), (0, 100, 300)


class SimulatedSystem2:
    """A ``ChatEngine`` answering with the gold label of the state it is shown, wrong at ``error``."""

    name = "simulated"
    model = "simulated-system2"
    base_url = None

    def __init__(self, gold: Mapping[str, str], options: Sequence[str], *, error: float, seed: int) -> None:
        self._gold = gold
        self._options = list(options)
        self._error = error
        self._rng = random.Random(seed)
        self.calls = 0
        self.wrong = 0

    async def complete(self, messages: Sequence[BaseMessage], **_: Any) -> ChatResult:
        self.calls += 1
        prompt = str(messages[-1].content)
        state = prompt.split("State:\n", 1)[1].split("\n\nQuestion:\n", 1)[0]
        answer = self._gold[state]
        if self._rng.random() < self._error:
            answer = self._rng.choice([o for o in self._options if o != answer])
            self.wrong += 1
        return ChatResult(content="", model=self.model, structured={"answer": answer})

    async def aclose(self) -> None:
        return None


class _Chats:
    def __init__(self, chat: SimulatedSystem2) -> None:
        self._chat = chat

    def chat_for(self, ref: str | None) -> SimulatedSystem2:
        del ref  # one System 2 for every task
        return self._chat


class _Policy:
    """The policy in force: the file's, with the thresholds re-tuned at each retrain."""

    def __init__(self, policy: PolicySet) -> None:
        self.policy = policy

    def __call__(self) -> PolicySet:
        return self.policy

    def set_thresholds(self, c: float, m: float) -> None:
        task = self.policy.tasks[TASK]
        tuned = dataclasses.replace(task, thresholds=Thresholds(min_confidence=c, min_margin=m))
        self.policy = dataclasses.replace(self.policy, tasks={**self.policy.tasks, TASK: tuned})


def _label(row: dict[str, Any]) -> str:
    return str(row["labels"][TASK])


def _split(rows: list[dict[str, Any]], seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two halves, stratified by label."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_label.setdefault(_label(r), []).append(r)
    rng = random.Random(seed)
    a: list[dict[str, Any]] = []
    b: list[dict[str, Any]] = []
    for label in sorted(by_label):
        group = by_label[label]
        rng.shuffle(group)
        a += group[: len(group) // 2]
        b += group[len(group) // 2 :]
    return a, b


class Scorer:
    """System 1's answers to fixed rows, from their embeddings read once (as the engine reads a state)."""

    def __init__(self, models: EmbeddedModels, rows: Sequence[dict[str, Any]]) -> None:
        self.labels = [_label(r) for r in rows]
        self.vectors = models.embedder.embed([ends(squash(str(r["state"]))) for r in rows])

    def answers(self, pool: EnginePool, policy: PolicySet) -> list[dict[str, float]]:
        engine = pool.engine_for(None, policy)
        examples = getattr(engine, "examples", None)
        assert examples is not None, "the embedded engine has no trained head for the task"
        task = policy.tasks[TASK]
        assert isinstance(task, RouteTask)
        return [examples.probabilities(np.asarray(v), TASK, task.question) for v in self.vectors]


def _labelled(answers: Sequence[dict[str, float]], labels: Sequence[str], none: str | None) -> list[Labelled]:
    return [Labelled(probabilities=a, label=y, none_option=none) for a, y in zip(answers, labels, strict=True)]


def _kept(answers: Sequence[dict[str, float]], labels: Sequence[str], c: float, m: float, none: str | None) -> Any:
    kept = [(kept_answer(a, c, m, none), y) for a, y in zip(answers, labels, strict=True)]
    n_kept = sum(k is not None for k, _ in kept)
    right = sum(k == y for k, y in kept if k is not None)
    low, high = wilson(right, n_kept)
    return {
        "escalated": 1.0 - n_kept / len(kept),
        "kept": n_kept,
        "kept_accuracy": right / n_kept if n_kept else None,
        "wilson_95": [low, high],
    }


async def simulate(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    target = args.target if args.target is not None else (QUICK_TARGET if quick else TARGET)
    checkpoints = QUICK_CHECKPOINTS if quick else CHECKPOINTS
    bench = Bench(args.data, args.work, rows=300, seed=0)
    full, fragment = bench.converted(TASK, SHOTS)
    assert fragment is not None
    rows = read_jsonl(full)
    doc = yaml.safe_load(fragment.read_text(encoding="utf-8"))
    doc["tasks"][TASK].update(store_state=True, learn={"retrain_after": args.retrain_after, "max_examples": 5000})
    work = args.work / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    policy_file = work / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    policy = _Policy(load_policy(policy_file))
    task = policy().tasks[TASK]
    assert isinstance(task, RouteTask)
    none = task.none_option
    seeded = {t for route in task.routes.values() for t in route.examples}

    rng = random.Random(args.seed)
    stream = [r for r in rows if r["meta"].get("split") == "train" and r["state"] not in seeded]
    rng.shuffle(stream)
    stream = stream[: checkpoints[-1]]
    validation = [r for r in rows if r["meta"].get("split") == "validation"]
    if quick:
        validation = random.Random(args.seed).sample(validation, 800)
    tuning, held_out = _split(validation, args.seed)

    # Escalation rates only, no timing: the rows' embeddings stay in the cache for the next run.
    embedded = EmbeddedSettings(embedder=args.embedder, cache_states=True)
    settings = Settings(engine="embedded", data_dir=work / "state", embedded=embedded)
    models = EmbeddedModels(settings.embedded, cache_dir=embedding_cache_dir() or args.work / "cache")
    pool = EnginePool(settings, models=models)
    store = await DecisionStore.open(f"sqlite+aiosqlite:///{work / 'log.sqlite3'}")
    learner = Learner(store, pool, policy, max_wait_s=3600.0)
    system2 = SimulatedSystem2(
        {str(r["state"]): _label(r) for r in stream},
        task.question.options,
        error=args.system2_error,
        seed=args.seed,
    )
    router = Router(policy, pool, _Chats(system2), sink=learner.sink(store.sink("sim", store_state=True), tenant="sim"))
    started = time.monotonic()
    log(f"embedding {len(tuning)} tuning and {len(held_out)} held-out validation rows once")
    tune_rows, test_rows = Scorer(models, tuning), Scorer(models, held_out)

    def retune() -> dict[str, Any]:
        answers = tune_rows.answers(pool, policy())
        labelled = _labelled(answers, tune_rows.labels, none)
        fit, held = labelled[::2], labelled[1::2]
        try:
            choice = tune_thresholds(fit, held, target=target, level=0.95, seed=args.seed)
        except TooFewLabels as exc:
            # Nothing passes: escalate everything rather than keep decisions below the target.
            policy.set_thresholds(1.0, 1.0)
            return {"refused": str(exc), "min_confidence": 1.0, "min_margin": 1.0}
        policy.set_thresholds(choice.min_confidence, choice.min_margin)
        return {
            "min_confidence": choice.min_confidence,
            "min_margin": choice.min_margin,
            "lower_bound": choice.held_out.lower,
        }

    points: list[dict[str, Any]] = []
    curve: list[dict[str, Any]] = []
    """Held-out figures after every retrain, for the plot."""

    def retrained(requests: int) -> dict[str, Any]:
        tuned = retune()
        figures = _kept(
            test_rows.answers(pool, policy()), test_rows.labels, tuned["min_confidence"], tuned["min_margin"], none
        )
        curve.append({"requests": requests, "learned": pool.learned.count(TASK), **figures})
        return tuned

    tuned = retrained(0)
    window_escalated = window_n = 0
    for i, row in enumerate([None, *stream]):
        if row is not None:
            messages: list[BaseMessage] = [HumanMessage(str(row["state"]))]
            decision = await router.route(TASK, messages)
            window_n += 1
            window_escalated += decision.system == 2 or decision.escalate
            if i % args.refresh == 0 and await learner.refresh():
                tuned = retrained(i)
        if i in checkpoints:
            if await learner.refresh(force=True):
                tuned = retrained(i)
            figures = _kept(
                test_rows.answers(pool, policy()), test_rows.labels, tuned["min_confidence"], tuned["min_margin"], none
            )
            point = {
                "requests": i,
                "learned": pool.learned.count(TASK),
                "examples_version": pool.learned.versions.get(TASK, ""),
                **tuned,
                "held_out": figures,
                "stream_escalated": window_escalated / window_n if window_n else None,
                "system2_wrong": system2.wrong,
                "seconds": round(time.monotonic() - started, 1),
            }
            points.append(point)
            window_escalated = window_n = 0
            accuracy = "-" if figures["kept_accuracy"] is None else f"{100 * figures['kept_accuracy']:.2f} %"
            log(
                f"after {i} requests: {point['learned']} learned, held-out escalation "
                f"{100 * figures['escalated']:.1f} %, kept accuracy {accuracy}"
            )
    await pool.aclose()
    await store.aclose()
    return {
        "set": TASK,
        "embedder": args.embedder,
        "examples_per_route": SHOTS,
        "target": target,
        "system2_error": args.system2_error,
        "tuning_rows": len(tuning),
        "held_out_rows": len(held_out),
        "retrains": learner.retrains,
        "points": points,
        "curve": curve,
        "escalation_falls": points[-1]["held_out"]["escalated"] < points[0]["held_out"]["escalated"],
        "target_met_everywhere": all(
            p["held_out"]["kept_accuracy"] is None or p["held_out"]["kept_accuracy"] >= target for p in points
        ),
        "quick": quick,
        "seconds": round(time.monotonic() - started, 1),
    }


def render(results: dict[str, Any]) -> str:
    lines = [
        "## Learning from escalations (`bench/learning.py`)",
        "",
        f"CLINC150 domain routing from {results['examples_per_route']} examples a route, learning what a simulated "
        f"System 2 (the gold label, wrong {100 * results['system2_error']:.0f} % of the time) answers; thresholds "
        f"re-tuned to {100 * results['target']:.0f} % (95 % bound) on {results['tuning_rows']} validation rows "
        f"at every retrain, figures on {results['held_out_rows']} other validation rows. Escalated: the share of "
        "the held-out rows System 1 does not keep; the stream column is the share of the requests since the "
        "previous point that went to System 2.",
        "",
        "| requests | learned examples | thresholds | held-out: escalated | kept accuracy (95 %) | stream: escalated |",
        "|---|---|---|---|---|---|",
    ]
    for p in results["points"]:
        h = p["held_out"]
        accuracy = (
            "-"
            if h["kept_accuracy"] is None
            else f"{100 * h['kept_accuracy']:.2f} % ({100 * h['wilson_95'][0]:.1f}–{100 * h['wilson_95'][1]:.1f})"
        )
        stream = "-" if p["stream_escalated"] is None else f"{100 * p['stream_escalated']:.1f} %"
        lines.append(
            f"| {p['requests']} | {p['learned']} | {p['min_confidence']} / {p['min_margin']} "
            f"| {100 * h['escalated']:.1f} % | {accuracy} | {stream} |"
        )
    last = results["points"][-1]
    lines += [
        "",
        "Thresholds 1.0 / 1.0: no pair met the target on the tuning rows, so System 1 kept nothing. Of System 2's "
        f"answers, {last['system2_wrong']} were wrong and were learned as they came: no outcome was recorded to "
        f"withdraw them. {results['retrains']} retrains in {results['seconds']:.0f} s on two cores.",
        "",
        "![escalation rate as System 1 learns](learning.png)",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve, points = results["curve"], results["points"]
    fig, left = plt.subplots(figsize=(6.4, 3.6), dpi=120)
    left.plot(
        [c["requests"] for c in curve], [100 * c["escalated"] for c in curve], color="tab:blue", label="escalated"
    )
    left.scatter([p["requests"] for p in points], [100 * p["held_out"]["escalated"] for p in points], color="tab:blue")
    left.set_xlabel("requests routed (each escalation answered by System 2 and learned)")
    left.set_ylabel("held-out rows escalated (%)")
    left.set_ylim(0, 100)
    right = left.twinx()
    kept = [c for c in curve if c["kept_accuracy"] is not None]
    right.plot(
        [c["requests"] for c in kept],
        [100 * c["kept_accuracy"] for c in kept],
        color="tab:green",
        label="accuracy of what System 1 kept",
    )
    right.axhline(100 * results["target"], color="tab:green", linestyle=":", linewidth=1, label="target")
    right.set_ylabel("kept accuracy (%)")
    right.set_ylim(90, 100)
    left.set_title(f"CLINC150 domains from {results['examples_per_route']} examples a route, learning as it goes")
    fig.legend(loc="center right", bbox_to_anchor=(0.86, 0.55), fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="checkpoints 0, 100, 300, 800 validation rows, 90 %%")
    parser.add_argument("--target", type=float, default=None, help=f"accuracy to tune to (default {TARGET})")
    parser.add_argument("--system2-error", type=float, default=0.02, help="share of System 2's answers that are wrong")
    parser.add_argument("--retrain-after", type=int, default=25, help="the task's learn.retrain_after")
    parser.add_argument("--refresh", type=int, default=25, help="requests between the learner's reads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "learning", help="runs and results")
    parser.add_argument("--embedder", default="e5", choices=("e5", "minilm"))
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"error: --data: no such folder {args.data}")
    if not 0.0 <= args.system2_error < 1.0:
        parser.error("--system2-error must lie in [0, 1)")
    logging.basicConfig(level=logging.WARNING)
    results = asyncio.run(simulate(args))
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "learning.md").write_text(render(results), encoding="utf-8")
    plot(results, args.work / "learning.png")
    log(f"wrote {args.work / 'learning.md'} and learning.png")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
