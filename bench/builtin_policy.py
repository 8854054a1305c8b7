"""The policy built into fastslow (``examples/policy.yaml``) on held-out public data and tool calls.

What a newcomer meets first, measured as the router decides it (``fastslow eval``, System 1 only:
nothing escalates to a model) on the default embedded engine:

* ``support`` (route), out of scope: CLINC150's out-of-scope messages, labelled ``other`` (the
  task's "none of these" route). The share System 1 escalates (for any reason), with its Wilson
  95 % interval. Floor: 90 %.
* ``support``, in scope: Banking77's customer-support messages, labelled with a route by a coarse
  intent -> route map (``banking_route``). The share System 1 keeps (decides without escalating),
  and how often a kept route agrees with the map (indicative only: many banking intents could go to
  two teams). Floor: 50 % kept.
* ``tool_safety`` (check): plainly destructive and ordinary tool calls written for this benchmark.
  The task's verdict (deny / review / allow: the worst of its rules, as the router combines them)
  for each kind of call.

``bench/data/tool_calls.jsonl`` (114 destructive, 119 ordinary calls) is an evaluation file only.
It was written before the built-in policy's ``tool_safety`` examples were changed, apart from
them and in another style (other commands, phrasing and argument shapes, some as
``{"tool": ..., "arguments": ...}`` objects). None of its calls may ever become an example of the
built-in policy or of any policy judged with it, nor choose a band: otherwise this benchmark
measures nothing. ``bench/data/tool_calls_tune.jsonl`` (73 and 70 other calls) is what the bands
and examples were chosen on; it is no example either.

``--split test`` (the default) scores CLINC150's 1,000 out-of-scope test rows, Banking77's 3,080
test rows and ``tool_calls.jsonl``. ``--split tune`` scores the rows to choose settings on instead:
CLINC150's 200 out-of-scope training and validation rows, Banking77's 1,003 validation rows (a
seeded tenth of its training rows) and ``tool_calls_tune.jsonl``. Choose on ``tune``, report
``test``. Rows equal to one of the policy's examples are left out by ``fastslow eval`` and counted.

    python bench/builtin_policy.py                # the built-in policy, every test row (2-3 minutes cold)
    python bench/builtin_policy.py --quick        # 200 rows of each public set: under a minute
    python bench/builtin_policy.py --policy my.yaml --split tune
    python bench/builtin_policy.py --before old-policy.yaml   # a row for another policy file above it

What the engine reads of every row stays in the embedding cache under ``--work`` (or
``FASTSLOW_EMBEDDED__CACHE_DIR``), so a rerun, with another policy too, embeds nothing again. The
last line of stdout is one JSON object; ``--work``/builtin_policy.md is the section of
``docs/benchmarks.md`` (``bench/report.py --append``).
"""

from __future__ import annotations

import os

# As in quality.py: one OpenBLAS thread a process (read when numpy loads, so before it).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from fastslow.api import EvalOptions, evaluate  # noqa: E402
from fastslow.policies import BUILTIN_POLICY  # noqa: E402
from fastslow.policies.evaluation import Prediction, read_predictions, read_run  # noqa: E402
from fastslow.router import Settings  # noqa: E402

from _data import Bench, log, offline_settings, read_jsonl, seeded_sample, wilson, write_jsonl  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("FASTSLOW_SHARED_DATA", REPO.parent / "shared" / "data"))
TOOL_CALLS = {
    "test": REPO / "bench" / "data" / "tool_calls.jsonl",
    "tune": REPO / "bench" / "data" / "tool_calls_tune.jsonl",
}
ROUTE_TASK, CHECK_TASK = "support", "tool_safety"
FLOORS = {"out_of_scope_escalated": 0.9, "in_scope_kept": 0.5}
QUICK_ROWS = 200

# Banking77's intents by the built-in support task's teams: money that moved or should have
# (billing), something that does not work (technical), the customer's identity, access and cards
# as things they hold (account). Coarse: it is only read for the indicative agreement figure.
_TECHNICAL = {
    "card_not_working",
    "contactless_not_working",
    "virtual_card_not_working",
    "apple_pay_or_google_pay",
    "card_acceptance",
    "atm_support",
}
_ACCOUNT = {
    "card_arrival",
    "card_linking",
    "card_delivery_estimate",
    "lost_or_stolen_card",
    "age_limit",
    "pin_blocked",
    "getting_virtual_card",
    "edit_personal_details",
    "why_verify_identity",
    "unable_to_verify_identity",
    "get_physical_card",
    "visa_or_mastercard",
    "compromised_card",
    "passcode_forgotten",
    "lost_or_stolen_phone",
    "terminate_account",
    "card_swallowed",
    "verify_source_of_funds",
    "change_pin",
    "getting_spare_card",
    "order_physical_card",
    "get_disposable_virtual_card",
    "activate_my_card",
    "card_about_to_expire",
    "verify_my_identity",
    "country_support",
    "disposable_card_limits",
}


def banking_route(intent: str) -> str:
    """The support route a Banking77 intent goes to: billing unless it is named above."""
    return "technical" if intent in _TECHNICAL else "account" if intent in _ACCOUNT else "billing"


def support_rows(bench: Bench, split: str, limit: int | None) -> dict[str, list[dict[str, Any]]]:
    """Task rows for ``support``: CLINC150's out-of-scope messages (``other``) and Banking77's (mapped)."""
    splits = {"test": {"test"}, "tune": {"train", "validation"}}[split]
    clinc, _ = bench.converted("clinc150-domain", None)
    outside = [
        {"id": f"clinc-{r['id']}", "task": ROUTE_TASK, "state": r["state"], "label": "other", "meta": r["meta"]}
        for r in read_jsonl(clinc)
        if r["meta"].get("intent") == "oos" and r["meta"].get("split") in splits
    ]
    banking, _ = bench.converted("banking77", None)
    banking_splits = {"test": {"test"}, "tune": {"validation"}}[split]
    inside = [
        {
            "id": f"banking-{r['id']}",
            "task": ROUTE_TASK,
            "state": r["state"],
            "label": banking_route(r["labels"]["banking77"]),
            "meta": {**r["meta"], "intent": r["labels"]["banking77"]},
        }
        for r in read_jsonl(banking)
        if r["meta"].get("split") in banking_splits
    ]
    return {
        "out_of_scope": seeded_sample(outside, limit, f"oos-{split}"),
        "in_scope": seeded_sample(inside, limit, f"banking-{split}"),
    }


def _share(hits: int, n: int) -> dict[str, Any]:
    low, high = wilson(hits, n)
    return {"share": hits / n if n else None, "hits": hits, "n": n, "wilson_95": [low, high]}


def route_figures(predictions: Sequence[Prediction], kind: str) -> dict[str, Any]:
    """Escalated (out of scope) or kept (in scope) shares, with the reasons and kept routes."""
    scored = [p for p in predictions if p.label is not None]
    kept = [p for p in scored if p.kept]
    out: dict[str, Any] = {
        "escalated" if kind == "out_of_scope" else "kept": _share(
            len(scored) - len(kept) if kind == "out_of_scope" else len(kept), len(scored)
        ),
        "reasons": dict(Counter(p.reason for p in scored).most_common()),
        "kept_routes": dict(Counter(p.answer for p in kept).most_common()),
    }
    if kind == "in_scope":
        out["kept_agrees_with_map"] = _share(sum(p.answer == p.label for p in kept), len(kept))
    return out


_RANK = {"allow": 0, "review": 1, "deny": 2}


def tool_figures(predictions: Sequence[Prediction], kinds: dict[str, str]) -> dict[str, Any]:
    """Per kind of call (destructive, ordinary): how many the task denied, reviewed and allowed."""
    verdicts: dict[str, str] = {}
    for p in predictions:
        verdict = p.verdict or "deny"  # a rule nobody could judge fails closed, as the router does
        if _RANK[verdict] >= _RANK[verdicts.get(p.row, "allow")]:
            verdicts[p.row] = verdict
    out: dict[str, Any] = {}
    for kind in ("destructive", "ordinary"):
        rows = [r for r, k in kinds.items() if k == kind and r in verdicts]
        counts = Counter(verdicts[r] for r in rows)
        out[kind] = {v: counts.get(v, 0) for v in ("deny", "review", "allow")} | {"n": len(rows)}
        right = "deny" if kind == "destructive" else "allow"
        out[kind][f"{right}_share"] = _share(counts.get(right, 0), len(rows))
    return out


async def _run(
    name: str, rows: Sequence[dict[str, Any]], task: str, policy: Path, work: Path, settings: Settings
) -> tuple[list[Prediction], int]:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    data = write_jsonl(folder / "rows.jsonl", rows)
    options = EvalOptions(policy=policy, task=task, progress=False, system2=False, overwrite=True)
    started = time.monotonic()
    await evaluate(data, folder / "run", settings=settings, options=options)
    log(f"{name}: {len(rows)} rows in {time.monotonic() - started:.1f} s")
    return list(read_predictions(folder / "run")), len(read_run(folder / "run").dropped_training_rows)


async def measure(
    policy: Path, work: Path, rows: dict[str, list[dict[str, Any]]], tool_rows: list[dict[str, Any]], settings: Settings
) -> dict[str, Any]:
    """Every figure of one policy file: ``support`` on ``rows`` and ``tool_safety`` on ``tool_rows``."""
    out: dict[str, Any] = {"policy": str(policy)}
    for kind, kind_rows in rows.items():
        predictions, dropped = await _run(kind, kind_rows, ROUTE_TASK, policy, work, settings)
        out[kind] = route_figures(predictions, kind) | {"dropped_as_examples": dropped}
    predictions, dropped = await _run("tool_calls", tool_rows, CHECK_TASK, policy, work, settings)
    kinds = {r["id"]: r["meta"]["kind"] for r in tool_rows}
    out["tool_calls"] = tool_figures(predictions, kinds) | {"dropped_as_examples": dropped}
    escalated, kept = out["out_of_scope"]["escalated"]["share"], out["in_scope"]["kept"]["share"]
    out["floors_met"] = {
        "out_of_scope_escalated": escalated is not None and escalated >= FLOORS["out_of_scope_escalated"],
        "in_scope_kept": kept is not None and kept >= FLOORS["in_scope_kept"],
    }
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args.data, args.work, rows=QUICK_ROWS, seed=0)
    settings = offline_settings(args.work, args.embedder)
    rows = support_rows(bench, args.split, QUICK_ROWS if args.quick else None)
    tool_rows = read_jsonl(TOOL_CALLS[args.split])
    out: dict[str, Any] = {"split": args.split, "quick": args.quick, "embedder": args.embedder, "floors": FLOORS}
    if args.before is not None:
        out["before"] = await measure(args.before, args.work / "before", rows, tool_rows, settings)
    return out | await measure(args.policy, args.work / "policy", rows, tool_rows, settings)


def _cell(f: dict[str, Any]) -> str:
    low, high = f["wilson_95"]
    return f"{100 * (f['share'] or 0):.1f} % of {f['n']} ({100 * low:.1f}–{100 * high:.1f})"


def _row(name: str, r: dict[str, Any]) -> str:
    tools = r["tool_calls"]
    verdicts = {k: "{deny} / {review} / {allow}".format(**tools[k]) for k in ("destructive", "ordinary")}
    return (
        f"| {name} | {_cell(r['out_of_scope']['escalated'])} | {_cell(r['in_scope']['kept'])} "
        f"| {verdicts['destructive']} (of {tools['destructive']['n']}) "
        f"| {verdicts['ordinary']} (of {tools['ordinary']['n']}) |"
    )


def render(r: dict[str, Any]) -> str:
    """The section of ``docs/benchmarks.md`` (``bench/report.py --append``): one row a policy."""
    split = (
        "CLINC150's out-of-scope and Banking77's test rows, `bench/data/tool_calls.jsonl`"
        if r["split"] == "test"
        else "the tuning rows (CLINC150's out-of-scope training and validation rows, Banking77's validation "
        "rows, `bench/data/tool_calls_tune.jsonl`)"
    )
    sample = f", a seeded sample of {QUICK_ROWS} rows of each public set" if r["quick"] else ""
    lines = [
        "## The built-in policy (`bench/builtin_policy.py`)",
        "",
        "`examples/policy.yaml` on the default embedded engine, as the router decides (`fastslow eval`, no "
        f"System 2), on {split}{sample}. None of these rows is an example of the policy. Out-of-scope messages "
        "should escalate (floor 90 %), Banking77's support requests should be kept (floor 50 %), plainly "
        "destructive tool calls denied and ordinary ones allowed. Beside each share is its Wilson 95 % interval.",
        "",
        "| policy | CLINC150 out-of-scope escalated (95 %) | Banking77 kept (95 %) "
        "| destructive calls deny / review / allow | ordinary calls deny / review / allow |",
        "|---|---|---|---|---|",
    ]
    if "before" in r:
        lines.append(_row(f"before (`{Path(r['before']['policy']).name}`)", r["before"]))
    lines.append(_row(f"`{Path(r['policy']).name}`", r))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--policy", type=Path, default=BUILTIN_POLICY, help="the policy file (default: built-in)")
    parser.add_argument("--before", type=Path, default=None, help="another policy file to measure first, for a row")
    parser.add_argument("--split", choices=("test", "tune"), default="test", help="rows to score (see above)")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS} rows of each public set")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "builtin_policy", help="runs, results")
    parser.add_argument("--embedder", default="e5", choices=("e5", "minilm"))
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        raise SystemExit(f"error: --data: no such folder {args.data}")
    for flag in ("policy", "before"):
        path = getattr(args, flag)
        if path is not None and not path.is_file():
            raise SystemExit(f"error: --{flag}: no such file {path}")
    args.policy = args.policy.resolve()
    logging.basicConfig(level=logging.WARNING)
    results = asyncio.run(main_async(args))
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "builtin_policy.md").write_text(render(results), encoding="utf-8")
    log(f"wrote {args.work / 'builtin_policy.md'}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
