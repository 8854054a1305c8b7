"""Thresholds from ``fastslow tune`` on public data: tuned on rows it may see, judged on the test split.

* ``clinc``: CLINC150 domain routing, 50 examples a domain from the training split (the converter's
  fragment, "none of these" examples included), thresholds tuned to 97 % on the validation split.
* ``banking``: Banking77, 10 examples an intent, thresholds tuned to 97 % on 2,000 other training
  rows (Banking77 has no validation split).
* ``xstest``: XSTest as a policy check, bands tuned with ``--max-false-deny 0.02 --max-miss 0.05``
  over ten folds of contrast groups (``xstest_set``); judged on prompts neither learned nor tuned on.

For each, the tuned policy runs over the test split (``fastslow eval``), and the kept decisions'
accuracy (an out-of-scope message kept counts as wrong), its Wilson interval and the share kept are
reported beside what the shipped thresholds (0.7 / 0.15) keep of the same answers, and beside the
held-out lower bound ``tune`` promised. The last line of output is one JSON object.

    python bench/tuning.py            # full: every test row (about 10 minutes on two cores)
    python bench/tuning.py --quick    # 400 tuning rows, 300 test rows, an 80 % target: about a minute
"""

from __future__ import annotations

import os

# As in quality.py: one OpenBLAS thread a process (read when numpy loads, so before it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import yaml  # noqa: E402
from quality import _family  # noqa: E402

from fastslow.api import EvalOptions, evaluate  # noqa: E402
from fastslow.engines.chat import call_cost  # noqa: E402
from fastslow.policies import load_policy  # noqa: E402
from fastslow.policies.evaluation import Prediction, read_predictions  # noqa: E402
from fastslow.policies.tuning import PolicyEditor, TooFewLabels, apply_fit, collect, kept_answer, tune  # noqa: E402
from fastslow.router import CheckTask, ClassifyTask, RouteTask, Task  # noqa: E402

from _data import Bench, log, offline_settings, read_jsonl, seeded_sample, wilson, write_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("FASTSLOW_SHARED_DATA", REPO.parent / "shared" / "data"))
TARGET = 0.97
QUICK_TARGET = 0.8
"""--quick's target: 200 held-out rows cannot show 97 % (88 kept decisions, all right, are the fewest)."""
SHIPPED = (0.7, 0.15)
SETS = ("clinc", "banking", "xstest")
SHOTS = {"clinc": 50, "banking": 10}
"""Examples per option: CLINC150's domains as in the System-1 quality targets, Banking77's as CPFT's."""


def _example_texts(task: Task) -> set[str]:
    """Every example text of a route or classification task (such rows are not tuning rows)."""
    if isinstance(task, RouteTask):
        return {t for route in task.routes.values() for t in route.examples}
    if isinstance(task, ClassifyTask):
        return {t for per_option in task.examples.values() for texts in per_option.values() for t in texts}
    return set()


def _kept_figures(predictions: Sequence[Prediction], c: float, m: float, none: str | None) -> dict[str, Any]:
    scored = [p for p in predictions if p.label is not None and p.probabilities]
    kept = [(kept_answer(p.probabilities, c, m, none), p.label) for p in scored]
    right = sum(k == label for k, label in kept if k is not None)
    n_kept = sum(k is not None for k, _ in kept)
    low, high = wilson(right, n_kept)
    return {
        "min_confidence": c,
        "min_margin": m,
        "rows": len(scored),
        "kept": n_kept / len(scored) if scored else 0.0,
        "kept_accuracy": right / n_kept if n_kept else None,
        "wilson_95": [low, high],
    }


async def one_set(
    bench: Bench, name: str, *, embedder: str, tune_rows: int | None, test_rows: int | None, target: float
) -> dict[str, Any]:
    converter = "clinc150-domain" if name == "clinc" else "banking77"
    shots = SHOTS[name]
    full, fragment = bench.converted(converter, shots)
    assert fragment is not None
    rows = read_jsonl(full)
    examples = _example_texts(load_policy(fragment).tasks[converter])
    if name == "clinc":
        tuning = [r for r in rows if r["meta"].get("split") == "validation"]
    else:
        tuning = [r for r in rows if r["meta"].get("split") == "train" and r["state"] not in examples]
        tune_rows = 2_000 if tune_rows is None else tune_rows
    tuning = seeded_sample(tuning, tune_rows, f"{name}-tune")
    test = seeded_sample([r for r in rows if r["meta"].get("split") == "test"], test_rows, f"{name}-test")
    work = bench.work / name
    work.mkdir(parents=True, exist_ok=True)
    tune_file, test_file = write_jsonl(work / "tune.jsonl", tuning), write_jsonl(work / "test.jsonl", test)
    policy = work / "policy.yaml"
    shutil.copyfile(fragment, policy)
    settings = offline_settings(bench.work, embedder)
    started = time.monotonic()
    collected = await collect(
        tune_file,
        work / "tune-run",
        settings=settings,
        policy=policy,
        task=converter,
        evaluate=evaluate,
        progress=False,
    )
    base = {"set": converter, "embedder": embedder, "examples": shots, "tune_rows": len(tuning), "target": target}
    try:
        fit = tune(
            collected,
            tune_file,
            settings,
            call_cost=call_cost,
            target=target,
            level=0.95,
            max_false_deny=0.02,
            max_miss=0.05,
        )
    except TooFewLabels as exc:
        log(f"{name}: tune refused: {exc}")
        return {**base, "refused": str(exc), "seconds": round(time.monotonic() - started, 1)}
    editor = PolicyEditor(policy)
    apply_fit(editor, fit)
    editor.write()
    log(f"{name}: " + "; ".join(fit.lines[:2]))
    options = EvalOptions(policy=policy, task=converter, progress=False, system2=False, overwrite=True)
    await evaluate(test_file, work / "test-run", settings=settings, options=options)
    predictions = list(read_predictions(work / "test-run"))
    task = load_policy(policy).tasks[converter]
    none = getattr(task, "none_option", None)
    tuned = _kept_figures(predictions, task.thresholds.min_confidence, task.thresholds.min_margin, none)
    shipped = _kept_figures(predictions, *SHIPPED, none)
    if none is not None:
        in_scope = [p for p in predictions if p.label != none]
        tuned["in_scope_kept_accuracy"] = _kept_figures(
            in_scope, task.thresholds.min_confidence, task.thresholds.min_margin, none
        )["kept_accuracy"]
        outside = [p for p in predictions if p.label == none and p.probabilities]
        tuned["out_of_scope_kept"] = (
            sum(
                kept_answer(p.probabilities, tuned["min_confidence"], tuned["min_margin"], none) is not None
                for p in outside
            )
            / len(outside)
            if outside
            else None
        )
    held = fit.record["held_out"]
    return {
        **base,
        "test_rows": len(test),
        "held_out_promise": {"kept": held["kept"], "accuracy": held["accuracy"], "lower_bound": held["lower_bound"]},
        "tuned": tuned,
        "shipped": shipped,
        "target_met_on_test": tuned["kept_accuracy"] is not None and tuned["kept_accuracy"] >= target,
        "seconds": round(time.monotonic() - started, 1),
    }


XSTEST_FOLDS = 10
MAX_FALSE_DENY, MAX_MISS = 0.02, 0.05


def _xstest_folds(rows: list[dict[str, Any]], rng: random.Random) -> list[list[dict[str, Any]]]:
    """XSTest's prompts in folds of whole contrast groups (a safe prompt and its unsafe twin together)."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_type.setdefault(r["meta"]["type"], []).append(r)
    groups: dict[str, list[dict[str, Any]]] = {}
    for kind, members in by_type.items():
        members.sort(key=lambda r: int(r["id"].rsplit("-", 1)[1]))
        for position, r in enumerate(members):
            groups.setdefault(f"{_family(kind)}-{position}", []).append(r)
    names = sorted(groups)
    rng.shuffle(names)
    return [[r for name in names[k::XSTEST_FOLDS] for r in groups[name]] for k in range(XSTEST_FOLDS)]


def _verdict_figures(predictions: Sequence[Prediction], rule: str) -> dict[str, Any]:
    rows = [p for p in predictions if p.question == rule and p.label is not None]
    safe = [p for p in rows if p.label == "no"]
    unsafe = [p for p in rows if p.label == "yes"]

    def share(items: Sequence[Prediction], verdicts: set[str]) -> dict[str, Any]:
        hits = sum((p.verdict or "deny") in verdicts for p in items)
        low, high = wilson(hits, len(items))
        return {"share": hits / len(items) if items else None, "n": len(items), "wilson_95": [low, high]}

    return {
        "safe_denied": share(safe, {"deny"}),
        "safe_reviewed": share(safe, {"review"}),
        "unsafe_caught": share(unsafe, {"deny", "review"}),
    }


async def xstest_set(bench: Bench, *, embedder: str, rotations: int) -> dict[str, Any]:
    """XSTest as a policy check, ten folds of contrast groups rotated: one fold's prompts are the
    rule's examples, the next fold is judged, the other eight are what ``tune`` fits the bands on."""
    full, fragment = bench.converted("xstest", 2)
    assert fragment is not None
    doc = yaml.safe_load(fragment.read_text(encoding="utf-8"))
    [(task_name, task)] = doc["tasks"].items()
    [(rule, spec)] = task["rules"].items()
    wording = {k: v for k, v in spec.items() if k not in ("examples", "deny_at", "allow_at")}
    folds = _xstest_folds(read_jsonl(full), random.Random(0))
    settings = offline_settings(bench.work, embedder)
    started = time.monotonic()
    predictions: list[Prediction] = []
    fits: list[dict[str, Any]] = []
    for k in range(rotations):
        examples, test = folds[k], folds[(k + 1) % XSTEST_FOLDS]
        # The converter's own split means nothing to these folds (and tune would leave its test rows out).
        tuning = [
            {**r, "meta": {m: v for m, v in r["meta"].items() if m != "split"}}
            for j, fold in enumerate(folds)
            if j not in (k, (k + 1) % XSTEST_FOLDS)
            for r in fold
        ]
        work = bench.work / "xstest" / f"rotation-{k}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        rule_spec = {
            **wording,
            "examples": {v: [r["state"] for r in examples if r["labels"][rule] == v] for v in ("yes", "no")},
        }
        policy = work / "policy.yaml"
        policy.write_text(
            yaml.safe_dump({"tasks": {task_name: {**task, "rules": {rule: rule_spec}}}}, sort_keys=False),
            encoding="utf-8",
        )
        tune_file, test_file = write_jsonl(work / "tune.jsonl", tuning), write_jsonl(work / "test.jsonl", test)
        collected = await collect(
            tune_file,
            work / "tune-run",
            settings=settings,
            policy=policy,
            task=task_name,
            evaluate=evaluate,
            progress=False,
        )
        try:
            fit = tune(
                collected,
                tune_file,
                settings,
                call_cost=call_cost,
                target=TARGET,
                level=0.95,
                max_false_deny=MAX_FALSE_DENY,
                max_miss=MAX_MISS,
            )
        except TooFewLabels as exc:
            return {"set": "xstest", "refused": str(exc), "seconds": round(time.monotonic() - started, 1)}
        editor = PolicyEditor(policy)
        apply_fit(editor, fit)
        editor.write()
        log(f"xstest rotation {k}: " + "; ".join(fit.lines))
        check = load_policy(policy).tasks[task_name]
        assert isinstance(check, CheckTask)
        action = check.rules[rule].action
        fits.append({**fit.record["rules"][rule], "allow_at": action.allow_at, "deny_at": action.deny_at})
        options = EvalOptions(policy=policy, task=task_name, progress=False, system2=False)
        await evaluate(test_file, work / "test-run", settings=settings, options=options)
        predictions += list(read_predictions(work / "test-run"))
    return {
        "set": "xstest",
        "embedder": embedder,
        "rotations": rotations,
        "max_false_deny": MAX_FALSE_DENY,
        "max_miss": MAX_MISS,
        "fits": fits,
        "test": _verdict_figures(predictions, rule),
        "seconds": round(time.monotonic() - started, 1),
    }


def render_xstest(r: dict[str, Any]) -> list[str]:
    if "refused" in r:
        return ["", f"XSTest: `tune` refused: {r['refused']}"]

    def cell(f: dict[str, Any]) -> str:
        low, high = f["wilson_95"]
        return f"{100 * f['share']:.1f} % of {f['n']} ({100 * low:.1f}–{100 * high:.1f})"

    t = r["test"]
    bands = ", ".join(f"{f['allow_at']}–{f['deny_at']}" for f in r["fits"])
    bounds = ", ".join(f"{100 * f['false_deny_bound']:.1f} %" for f in r["fits"])
    return [
        "",
        f"XSTest as a policy check, `fastslow tune --max-false-deny {r['max_false_deny']} --max-miss {r['max_miss']}`: "
        f"XSTest's contrast groups in ten folds; in each of {r['rotations']} rotations one fold's prompts are the "
        "rule's examples, the next fold is judged and the other eight are what the bands are tuned on. So "
        "every prompt below was judged by a rule that neither learned from it nor tuned on it.",
        "",
        "| safe prompts denied (95 %) | safe prompts sent to review | unsafe prompts denied or reviewed "
        "| false-deny bound promised on the tuning folds |",
        "|---|---|---|---|",
        f"| {cell(t['safe_denied'])} | {cell(t['safe_reviewed'])} | {cell(t['unsafe_caught'])} | {bounds} |",
        "",
        f"Bands chosen (allow_at–deny_at), one per rotation: {bands}.",
    ]


def _scope_figures(r: dict[str, Any]) -> str:
    tuned = r.get("tuned") or {}
    inside, outside = tuned.get("in_scope_kept_accuracy"), tuned.get("out_of_scope_kept")
    if inside is None or outside is None:
        return ""
    return (
        f" Here, at the tuned thresholds: in-scope kept accuracy {100 * inside:.2f} %, and "
        f"{100 * outside:.1f} % of the out-of-scope messages kept."
    )


def render(results: dict[str, Any]) -> str:
    lines = [
        "## Tuned thresholds on the test split (`bench/tuning.py`)",
        "",
        f"`fastslow tune --target-accuracy {results['target']}` (95 % lower bound, Learn then Test) on rows it may "
        "see, "
        "then the test split through the tuned policy. Kept accuracy counts an out-of-scope message kept as "
        "wrong; the interval is Wilson's 95 %. The shipped thresholds are 0.7 / 0.15, on the same answers.",
        "",
        "| set | tuned on | thresholds | held-out bound | test: kept | test: kept accuracy (95 %) "
        "| shipped: kept | shipped: kept accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results["sets"].items():
        if key == "xstest":
            continue
        if "refused" in r:
            lines.append(
                f"| {r['set']} ({r['embedder']}, {r['examples']}/option) | {r['tune_rows']} rows | refused: "
                f"{r['refused']} | | | | | |"
            )
            continue
        t, s, h = r["tuned"], r["shipped"], r["held_out_promise"]
        lines.append(
            f"| {r['set']} ({r['embedder']}, {r['examples']}/option) | {r['tune_rows']} rows "
            f"| {t['min_confidence']} / {t['min_margin']} "
            f"| {100 * h['lower_bound']:.2f} % | {100 * t['kept']:.1f} % of {t['rows']} "
            f"| {100 * (t['kept_accuracy'] or 0):.2f} % ({100 * t['wilson_95'][0]:.1f}–{100 * t['wilson_95'][1]:.1f}) "
            f"| {100 * s['kept']:.1f} % | {100 * (s['kept_accuracy'] or 0):.2f} % |"
        )
    if "clinc" in results["sets"]:
        lines += [
            "",
            "CLINC150's validation split holds 3 % out-of-scope messages, its test split 18 %. A bound shown on "
            "one mix does not carry over to another, and every out-of-scope message kept counts as wrong. So the "
            "kept accuracy of CLINC150 on its test split can fall below what the validation rows showed while the "
            "in-scope rows alone stay above it." + _scope_figures(results["sets"]["clinc"]),
        ]
    if "xstest" in results["sets"]:
        lines += render_xstest(results["sets"]["xstest"])
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args.data, args.work, rows=300, seed=0)
    target = args.target if args.target is not None else (QUICK_TARGET if args.quick else TARGET)
    out: dict[str, Any] = {"quick": args.quick, "target": target, "sets": {}}
    for name in args.only:
        if name == "xstest":
            out["sets"][name] = await xstest_set(
                bench, embedder=args.embedder, rotations=1 if args.quick else XSTEST_FOLDS
            )
            continue
        out["sets"][name] = await one_set(
            bench,
            name,
            embedder=args.embedder,
            tune_rows=400 if args.quick else None,
            test_rows=300 if args.quick else None,
            target=target,
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="400 tuning rows, 300 test rows a set, an 80 %% target")
    parser.add_argument("--target", type=float, default=None, help=f"accuracy to tune to (default {TARGET})")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "tuning", help="runs and results")
    parser.add_argument("--embedder", default="e5", choices=("e5", "minilm"))
    parser.add_argument("--only", default=",".join(SETS), help=f"comma-separated: {', '.join(SETS)}")
    args = parser.parse_args(argv)
    args.only = [s for s in args.only.split(",") if s]
    unknown = set(args.only) - set(SETS)
    if unknown:
        parser.error(f"--only: unknown sets {sorted(unknown)}")
    if not args.data.is_dir():
        raise SystemExit(f"error: --data: no such folder {args.data}")
    logging.basicConfig(level=logging.WARNING)
    results = asyncio.run(main_async(args))
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "tuning.md").write_text(render(results), encoding="utf-8")
    log(f"wrote {args.work / 'tuning.md'}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
