"""CLINC150 domains: the embedded engine's open-set rate chosen on the validation split, then judged once on test.

``embedded.open_set_rate`` is the share of in-scope messages the open-set score may call "none of
these" (it is calibrated on the route's own examples). Raising it escalates more out-of-scope
messages and more in-scope ones. ``bench/quality.py`` section 1 judges the default (0.1) on the
test split; here each candidate rate runs section 1's protocol (50 examples a domain, none for "none
of these", thresholds by 5-fold cross-validation on those examples) against CLINC150's whole
*validation* split (3,100 rows, 100 out of scope), a rate is chosen there, and only the chosen
rate and the default are then judged on the test split, side by side in the same run. Nothing is
read off the test split.

The rule: among the rates whose validation figures meet the targets for kept accuracy (>= 97 %) and
in-scope rows kept (>= 80 %), the one escalating the most out-of-scope rows (the smaller rate on a
tie); where none meets both, the default.

    python bench/open_set_rate.py                         # e5 (and e5+minilm where MiniLM is installed); 0.1, 0.2, 0.3
    python bench/open_set_rate.py --embedders e5 --rates 0.1,0.15,0.2
    python bench/open_set_rate.py --quick                 # e5, tiny samples: under a minute with a warm cache

Runs go under ``--work`` (default ``bench/out/open_set_rate``); the last line of stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import quality  # first: it limits OpenBLAS to one thread before numpy loads

from fastslow.engines.embedded import minilm_available

from _data import Bench, log

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RATE = 0.1
KEPT_ACCURACY = "accuracy of kept decisions (out-of-scope kept = wrong)"
IN_SCOPE_KEPT = "in-scope rows kept"
OOS_ESCALATED = "out-of-scope rows escalated"
RULE = (
    "among the rates meeting kept accuracy >= 97 % and in-scope kept >= 80 % on the validation split, "
    "the one escalating the most out-of-scope rows there (the smaller on a tie); where none meets both, the default"
)


def _by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["figure"]: f for f in result["figures"]}


def choose(validation: dict[float, dict[str, Any]]) -> tuple[float, str]:
    """The rate the rule picks from the validation results, and why."""
    fits = []
    for rate, result in sorted(validation.items()):
        f = _by_name(result)
        if f[KEPT_ACCURACY]["value"] >= 0.97 and f[IN_SCOPE_KEPT]["value"] >= 0.80:
            fits.append((f[OOS_ESCALATED]["value"], -rate))
    if not fits:
        return DEFAULT_RATE, "no rate met kept accuracy >= 97 % and in-scope kept >= 80 % on validation: the default"
    _oos, neg_rate = max(fits)
    return -neg_rate, "the most out-of-scope rows escalated on validation among rates meeting both targets there"


def _row(result: dict[str, Any]) -> dict[str, Any]:
    f = _by_name(result)
    return {
        "thresholds": result["thresholds"],
        "figures": {
            name: {k: f[name][k] for k in ("value", "low", "high", "n")}
            for name in (KEPT_ACCURACY, IN_SCOPE_KEPT, OOS_ESCALATED)
        },
    }


async def sweep(
    choose_on: quality.Context, judge_on: quality.Context, embedder: str, rates: list[float]
) -> dict[str, Any]:
    """Each rate on ``choose_on``'s validation rows, then the chosen one and the default on ``judge_on``'s test rows."""
    validation = {}
    for rate in rates:
        validation[rate] = await quality.clinc(choose_on, embedder, open_set_rate=rate, split="validation")
        log(f"{embedder} rate {rate:g} on validation: {_row(validation[rate])['figures']}")
    chosen, why = choose(validation)
    test = {DEFAULT_RATE: await quality.clinc(judge_on, embedder, open_set_rate=DEFAULT_RATE)}
    if chosen != DEFAULT_RATE:
        test[chosen] = await quality.clinc(judge_on, embedder, open_set_rate=chosen)
    return {
        "validation": {f"{r:g}": _row(v) for r, v in validation.items()},
        "chosen": chosen,
        "why": why,
        "test": {f"{r:g}": _row(v) for r, v in test.items()},
    }


def _context(args: argparse.Namespace, plan: quality.Plan, work: Path) -> quality.Context:
    work.mkdir(parents=True, exist_ok=True)
    return quality.Context(plan, Bench(args.data, work, rows=plan.benign_rows, seed=0), quality.Runs(work, plan), 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="e5, tiny samples, rates 0.1 and 0.2")
    parser.add_argument("--data", type=Path, default=quality.DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "open_set_rate")
    parser.add_argument("--embedders", default=None, help="comma-separated (default e5 and, if installed, e5+minilm)")
    parser.add_argument("--rates", default=None, help="comma-separated candidate rates (default 0.1,0.2,0.3)")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"error: --data: no such folder {args.data}")
    logging.basicConfig(level=logging.WARNING)
    default_embedders = "e5" if args.quick or not minilm_available() else "e5,e5+minilm"
    embedders = (args.embedders or default_embedders).split(",")
    rates = sorted({float(r) for r in (args.rates or ("0.1,0.2" if args.quick else "0.1,0.2,0.3")).split(",")})
    plan = replace(quality.plan_for(args.quick), ablation_embedders=())
    results: dict[str, Any] = {"quick": args.quick, "rates": rates, "rule": RULE, "embedders": {}}
    for embedder in embedders:
        # The whole validation split to choose on (3,100 rows, 100 of them out of scope: a sample
        # would leave too few of those to tell rates apart); the test split as section 1 samples it.
        choose_on, judge_on = (
            _context(args, replace(plan, embedders=(embedder,), clinc_test=clinc_test), args.work / embedder / split)
            for split, clinc_test in (("validation", 40 if args.quick else None), ("test", plan.clinc_test))
        )
        results["embedders"][embedder] = asyncio.run(sweep(choose_on, judge_on, embedder, rates))
    (args.work / "open_set_rate.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
