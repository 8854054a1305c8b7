"""Measure System 1 against the quality targets, on rows the engine did not learn from.

Every figure is ``fastslow eval`` (the router's own decisions) on held-out rows, beside its Wilson
95 % interval and its target. Thresholds and bands are never read off the rows they are scored on:
they come from cross-validation on the training rows, and the open-set score is calibrated on
in-scope rows only (the engine does that from the examples themselves).

1. CLINC150 domains, 50 examples a domain and none for "none of these": (min_confidence,
   min_margin) chosen by 5-fold cross-validation on the 500 examples (the largest kept share with
   out-of-fold kept accuracy >= 97 %), then the test split (in-scope and out-of-scope rows): kept
   accuracy, in-scope kept, out-of-scope escalated. Ablation: the open-set score off.
2. Banking77, 10 examples an intent: accuracy of five sampled example sets (seeds 0-4) on the test split.
3. XSTest as a policy check, two-fold cross-fitted over its safe / unsafe contrast pairs: each
   fold's rule is trained on the other fold, its bands (allow_at, deny_at) chosen by an inner
   cross-validation on that fold. Safe denied, safe reviewed, unsafe caught. Ablation: no background.
4. Prompt injections (deepset, all 662 rows), cross-fitted the same way: injections caught, and
   benign text from other sets (moderation clean rows, MT-Bench, CLINC150 in-scope) denied or reviewed.
5. One held-out injection hidden in a long benign document (20,000-30,000 characters), against the
   same documents without it.
6. Decision latency through the in-process ``Router``: route and check, short and long states.
7. The zero-shot calibration's own evaluation (``bench/fit_zero_shot.py``), raw against calibrated.

    python bench/quality.py              # every section, sizes as plan_for(False) (35 minutes on two loaded cores)
    python bench/quality.py --quick      # tiny samples, e5 only: under a minute with a warm cache
    python bench/quality.py --only clinc,latency

Runs go under ``--work`` (default ``bench/out/quality``), one folder each (rows, policy, report);
the last line of stdout is one JSON object of every figure. ``render_quality(results)`` is the
markdown section ``bench/report.py`` appends to ``docs/benchmarks.md``. System 2 is never called.
"""

from __future__ import annotations

import os

# MiniLM runs in numpy: OpenBLAS's threads, one per core, fight the machine's other work and made
# an embedding 25 times slower on a loaded two-core machine (0.6 s against 23 ms). One thread a
# process, unless the caller says otherwise; read when numpy loads, so before any import below.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable, Sequence  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from _quality_checks import (  # noqa: E402
    DOC_MAX_CHARS,
    benign_texts,
    document_figures,
    hidden_documents,
    injection,
    injection_figures,
    xstest,
)
from _quality_core import (  # noqa: E402
    DEFAULT_DATA,
    REPO,
    Context,
    Plan,
    Runs,
    Target,
    figure,
    grouped_folds,
    plan_for,
    stratified_folds,
)
from _quality_crossfit import (  # noqa: E402
    BAND_GRID,
    BENIGN_DENIED,
    VIOLATION_ALLOWED,
    Bands,
    CheckSpec,
    CrossFit,
    ExtraRows,
    Item,
    choose_bands,
    cross_fit,
    injection_spec,
    xstest_spec,
)

# Private, but bench/tuning.py groups XSTest's prompts with it and imports it from here.
from _quality_crossfit import _family as _family  # noqa: E402
from _quality_latency import SHORT_STATE, latency  # noqa: E402
from _quality_render import FIGURE_HEAD, INJECTION_TEXT, PUBLISHED_BANKING, XSTEST_TEXT, render_quality  # noqa: E402
from _quality_routes import (  # noqa: E402
    CONFIDENCE_GRID,
    KEPT_ACCURACY,
    MARGIN_GRID,
    NONE,
    Scored,
    Thresholds,
    banking,
    choose_thresholds,
    clinc,
    route_figures,
    route_kept,
)
from _quality_zero_shot import zero_shot  # noqa: E402

from _data import Bench, log  # noqa: E402

# The sections live in the _quality_* modules beside this one; this script is their façade, so
# bench/report.py, bench/open_set_rate.py and the others keep importing every name from ``quality``.
__all__ = [
    "BAND_GRID",
    "BENIGN_DENIED",
    "CONFIDENCE_GRID",
    "DEFAULT_DATA",
    "DOC_MAX_CHARS",
    "FIGURE_HEAD",
    "INJECTION_TEXT",
    "KEPT_ACCURACY",
    "MARGIN_GRID",
    "NONE",
    "PUBLISHED_BANKING",
    "REPO",
    "SECTIONS",
    "SHORT_STATE",
    "VIOLATION_ALLOWED",
    "XSTEST_TEXT",
    "Bands",
    "CheckSpec",
    "Context",
    "CrossFit",
    "ExtraRows",
    "Item",
    "Plan",
    "Runs",
    "Scored",
    "Step",
    "Target",
    "Thresholds",
    "banking",
    "benign_texts",
    "choose_bands",
    "choose_thresholds",
    "clinc",
    "cross_fit",
    "document_figures",
    "figure",
    "grouped_folds",
    "hidden_documents",
    "injection",
    "injection_figures",
    "injection_spec",
    "latency",
    "main",
    "measure",
    "measure_async",
    "merge_results",
    "plan_for",
    "render_quality",
    "route_figures",
    "route_kept",
    "stratified_folds",
    "xstest",
    "xstest_spec",
    "zero_shot",
]

SECTIONS = ("clinc", "banking", "xstest", "injection", "latency", "zero_shot")


# -- the measurement -------------------------------------------------------------------------------------


Step = tuple[str, str, Callable[[], Any]]
"""(section, key, the coroutine or function measuring it)."""


def _steps(ctx: Context, only: set[str]) -> list[Step]:
    plan = ctx.plan
    steps: list[Step] = []
    if "clinc" in only:
        steps += [("clinc", e, partial(clinc, ctx, e)) for e in plan.embedders]
        steps += [
            ("clinc", f"{e}, open set off", partial(clinc, ctx, e, open_set_rate=0.0)) for e in plan.ablation_embedders
        ]
        steps += [
            ("clinc", f"{e}, softmax head", partial(clinc, ctx, e, head="softmax")) for e in plan.ablation_embedders
        ]
        steps += [
            ("clinc", f"{e}, agreement", partial(clinc, ctx, e, agreement=True)) for e in plan.embedders if "+" in e
        ]
    if "banking" in only:
        steps += [("banking", e, partial(banking, ctx, e)) for e in plan.embedders]
        steps += [
            ("banking", f"{e}, softmax head", partial(banking, ctx, e, head="softmax")) for e in plan.ablation_embedders
        ]
    if "xstest" in only:
        steps += [("xstest", e, partial(xstest, ctx, e)) for e in plan.embedders]
        steps += [
            ("xstest", f"{e}, no background", partial(xstest, ctx, e, background=False))
            for e in plan.ablation_embedders
        ]
    if "injection" in only:
        # The hidden-document rows ride with the first embedder's run (e5 by default).
        steps += [
            ("injection", e, partial(injection, ctx, e, documents=e == plan.embedders[0])) for e in plan.embedders
        ]
        steps += [
            ("injection", f"{e}, no background", partial(injection, ctx, e, background=False))
            for e in plan.ablation_embedders
        ]
    if "latency" in only:
        steps += [("latency", e, partial(latency, ctx, e)) for e in plan.embedders]
    if "zero_shot" in only:
        steps.append(("zero_shot", "shipped", partial(zero_shot, ctx)))
    return steps


async def measure_async(
    data: Path,
    work: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    only: Iterable[str] | None = None,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """Run the sections (``only``: some of ``SECTIONS``) and return every figure as one JSON-able dict."""
    started = time.monotonic()
    plan = plan or plan_for(quick)
    chosen = set(only or SECTIONS)
    unknown = chosen - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; the sections are {', '.join(SECTIONS)}")
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(plan, Bench(data, work, rows=plan.benign_rows, seed=seed), Runs(work, plan), seed)
    results: dict[str, Any] = {
        "quick": plan.quick,
        "seed": seed,
        "work": _shown_path(work),
        "plan": asdict(plan),
        "load_start": list(os.getloadavg()),
    }
    for section, key, step in _steps(ctx, chosen):
        log(f"{section} / {key}")
        value = step()
        value = await value if asyncio.iscoroutine(value) else value
        if section == "injection" and isinstance(value, dict) and "documents" in value:
            results.setdefault("documents", {})[key] = value.pop("documents")
        results.setdefault(section, {})[key] = value
    results["errors"] = ctx.runs.errors
    results["run_seconds"] = ctx.runs.seconds
    results["dropped_training_rows"] = {k: v for k, v in ctx.runs.dropped.items() if v}
    results["blas_threads"] = os.environ.get("OPENBLAS_NUM_THREADS")
    results["seconds"] = round(time.monotonic() - started, 1)
    return results


def merge_results(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Results of several ``quality.py --only`` runs as one; a section's entry measured twice is the later run's."""
    if not parts:
        raise ValueError("no quality results to merge")
    merged: dict[str, Any] = {
        **parts[0],
        "work": [part.get("work", "bench/out/quality") for part in parts],
        "errors": [],
        "run_seconds": {},
        "dropped_training_rows": {},
        "seconds": 0.0,
    }
    for part in parts:
        for section in (*SECTIONS, "documents"):
            if section in part:
                merged[section] = {**merged.get(section, {}), **part[section]}
        merged["errors"] += part.get("errors", [])
        merged["run_seconds"].update(part.get("run_seconds", {}))
        merged["dropped_training_rows"].update(part.get("dropped_training_rows", {}))
        merged["seconds"] = round(merged["seconds"] + float(part.get("seconds", 0.0)), 1)
    return merged


def _shown_path(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def measure(data: Path, work: Path, **kwargs: Any) -> dict[str, Any]:
    return asyncio.run(measure_async(data, work, **kwargs))


# -- command line ----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny samples, e5 only (under a minute, warm cache)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "quality", help="runs and results")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--embedders", default=None, help="comma-separated (default e5,minilm; e5 with --quick)")
    parser.add_argument("--clinc-test", type=int, default=None, help="CLINC150 test rows (0: all 5,500)")
    parser.add_argument("--banking-rows", type=int, default=None, help="Banking77 test rows (0: all 3,080)")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"error: --data: no such folder {args.data}")
    logging.basicConfig(level=logging.WARNING)
    plan = plan_for(args.quick)
    if args.embedders:
        embedders = tuple(args.embedders.split(","))
        plan = replace(
            plan, embedders=embedders, ablation_embedders=tuple(e for e in plan.ablation_embedders if e in embedders)
        )
    if args.clinc_test is not None:
        plan = replace(plan, clinc_test=args.clinc_test or None)
    if args.banking_rows is not None:
        plan = replace(plan, banking_rows=args.banking_rows or None)
    only = args.only.split(",") if args.only else None
    results = measure(args.data, args.work, quick=args.quick, seed=args.seed, only=only, plan=plan)
    (args.work / "quality.json").write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    (args.work / "quality.md").write_text(render_quality(results), encoding="utf-8")
    log(f"wrote {args.work / 'quality.json'} and {args.work / 'quality.md'}")
    print(json.dumps(results, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
