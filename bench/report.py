"""Reproduce ``docs/benchmarks.md``: every embedded engine through ``fastslow eval`` on the public sets.

For each routing set (CLINC150 domains and intents, Banking77, HWU64 scenario and intent, RouteLLM
MMLU and GSM8K) it converts the data (``fastslow data convert``), then evaluates on a seeded sample
of the *test* split: sparrow zero-shot (the baseline, in the same run), the embedded engine
zero-shot (sparrow blended with e5 similarity), and e5 or MiniLM with a trained head at 5, 10 and 50
training examples per option, run as a policy task exactly as the router runs it (thresholds 0.7 /
0.15, "none of these", escalation). Checks (XSTest, OpenAI moderation, prompt injections) are
trained on their training split and run on their test split and on benign text from other sets
(CLINC150 in-scope, MT-Bench questions, the moderation set's clean rows), so false denies on
ordinary traffic show. RouteLLM is also run cross-domain (trained on MMLU, tested on GSM8K).
Then ``bench/quality.py`` measures the quality targets (``--no-quality`` leaves them out) and its
section "System-1 quality: targets" ends the page.

    python bench/report.py            # the full report (about 30 minutes on two cores, cold cache, without quality)
    python bench/report.py --quick    # one set, two engines, 60 rows, quality.py --quick: about two minutes

The full run rewrites ``docs/benchmarks.md`` and its plots (``--docs DIR`` elsewhere); reports
and data go under ``--work`` (default ``bench/out/report``). The last line of stdout is one JSON
object with every figure. Nothing is tuned here: thresholds are the policy defaults, examples come
from the training split, and every figure is on rows no engine learned from (the quality section's
thresholds come from cross-validation on training rows).
"""

from __future__ import annotations

import os

# As in quality.py, which this runs: one OpenBLAS thread a process (MiniLM runs in numpy, and
# OpenBLAS's threads thrash on a loaded two-core machine). Read when numpy loads, so before it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import quality  # noqa: E402

from fastslow.api import EvalOptions, evaluate  # noqa: E402
from fastslow.router import EngineName, Settings  # noqa: E402
from fastslow.router.settings import EmbeddedSettings  # noqa: E402

from _data import Bench as DataBench  # noqa: E402
from _data import embedding_cache_dir  # noqa: E402
from _data import log as _log  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("FASTSLOW_SHARED_DATA", REPO.parent / "shared" / "data"))

ROUTING = ["clinc150-domain", "clinc150-intent", "banking77", "hwu64", "routellm-mmlu", "routellm-gsm8k"]
CHECKS = ["xstest", "moderation", "prompt-injection"]
SHOTS = [5, 10, 50]
CHECK_SHOTS = 50
PUBLISHED_FEW_SHOT = {"clinc150-intent": 94.2, "banking77": 87.2, "hwu64": 87.1}
"""CPFT (Zhang et al. 2021), 10-shot intent accuracy on the full test sets."""
NAMES = {
    "clinc150-domain": "CLINC150, 10 domains (+ out-of-scope)",
    "clinc150-intent": "CLINC150, 150 intents (+ out-of-scope)",
    "banking77": "Banking77, 77 intents",
    "hwu64": "HWU64, scenario then intent",
    "routellm-mmlu": "RouteLLM MMLU: does the weak model suffice?",
    "routellm-gsm8k": "RouteLLM GSM8K: does the weak model suffice?",
    "xstest": "XSTest: is the prompt unsafe?",
    "moderation": "OpenAI moderation: 8 categories",
    "prompt-injection": "Prompt injections (deepset)",
}


@dataclass(frozen=True, slots=True)
class Config:
    """One engine configuration."""

    name: str
    engine: EngineName
    embedder: str = "e5"
    shots: int | None = None
    """Training examples per option; ``None``: zero-shot."""


def _configs(quick: bool) -> list[Config]:
    if quick:
        return [Config("sparrow zero-shot", "sparrow"), Config("e5 + head, 10/option", "embedded", "e5", 10)]
    out = [Config("sparrow zero-shot", "sparrow"), Config("embedded zero-shot (sparrow x e5)", "embedded")]
    for embedder, label in (("e5", "e5"), ("minilm", "MiniLM")):
        out += [Config(f"{label} + head, {n}/option", "embedded", embedder, n) for n in SHOTS]
    return out


class Bench(DataBench):
    """Converted data and report directories under one work folder."""

    async def run(
        self, label: str, config: Config, data: Path, *, policy: Path | None = None, task: str | None = None
    ) -> dict[str, Any]:
        """``fastslow eval`` of ``data`` under ``config``; the report's metrics."""
        slug = "".join(c if c.isalnum() else "-" for c in f"{label}-{config.name}").strip("-")
        out = self.work / "reports" / slug
        settings = Settings(
            engine=config.engine,
            data_dir=self.work / "state",
            embedded=EmbeddedSettings(embedder=config.embedder, cache_dir=embedding_cache_dir()),  # type: ignore[arg-type]
        )
        started = time.monotonic()
        options = EvalOptions(policy=policy, task=task, progress=False, concurrency=4)
        await evaluate(data, out, settings=settings, options=options)
        metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
        metrics["_dir"] = str(out)
        metrics["_seconds"] = round(time.monotonic() - started, 1)
        _log(f"{label} / {config.name}: {_headline(metrics)} ({metrics['_seconds']} s)")
        return metrics


def _headline(metrics: dict[str, Any]) -> str:
    o = metrics["overall"]
    return f"accuracy {_pct(o['accuracy'])}, kept {_pct(o['kept']['share'])} at {_pct(o['kept']['accuracy'])}"


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}"


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _task(policy: Path) -> str:
    import yaml

    doc = yaml.safe_load(policy.read_text(encoding="utf-8"))
    return str(next(iter(doc["tasks"])))


def _rules(policy: Path) -> list[str]:
    import yaml

    doc = yaml.safe_load(policy.read_text(encoding="utf-8"))
    task = next(iter(doc["tasks"].values()))
    return list(task.get("rules", {}))


async def routing(bench: Bench, sets: list[str], configs: list[Config]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in sets:
        results[name] = {}
        sample = bench.test_sample(name)
        for config in configs:
            if config.shots is None:
                results[name][config.name] = await bench.run(name, config, sample)
            else:
                _full, policy = bench.converted(name, config.shots)
                assert policy is not None
                results[name][config.name] = await bench.run(name, config, sample, policy=policy, task=_task(policy))
    return results


async def cross_domain(bench: Bench, configs: list[Config]) -> dict[str, Any]:
    """Trained on MMLU, tested on GSM8K (RouteLLM's harder direction)."""
    out: dict[str, Any] = {}
    sample = bench.test_sample("routellm-gsm8k")
    for config in configs:
        if config.shots != max(SHOTS):
            continue
        _full, policy = bench.converted("routellm-mmlu", config.shots)
        assert policy is not None
        out[config.name] = await bench.run("mmlu-to-gsm8k", config, sample, policy=policy, task=_task(policy))
    return out


async def checks(
    bench: Bench, names: list[str], embedders: list[str], *, quick: bool = False
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        results[name] = {}
        _full, policy = bench.converted(name, CHECK_SHOTS)
        assert policy is not None
        task, rules = _task(policy), _rules(policy)
        for embedder in embedders:
            config = Config(f"{embedder} + head, {CHECK_SHOTS}/option", "embedded", embedder, CHECK_SHOTS)
            entry = {"test": await bench.run(name, config, bench.test_sample(name), policy=policy, task=task)}
            for benign, path in bench.benign(name, task, rules, quick=quick).items():
                entry[benign] = await bench.run(f"{name}-on-{benign}", config, path, policy=policy, task=task)
            results[name][config.name] = entry
    return results


# -- the report ------------------------------------------------------------------------------------


def _verdicts(metrics: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Share allowed / reviewed / denied per true label, pooled over the check's rules."""
    totals: dict[str, dict[str, float]] = {}
    for group in metrics["questions"].values():
        for label, shares in ((group.get("verdicts") or {}).get("by_label") or {}).items():
            t = totals.setdefault(label, {"allowed": 0.0, "reviewed": 0.0, "denied": 0.0, "rows": 0.0})
            rows = shares.get("rows", 0)
            for key in ("allowed", "reviewed", "denied"):
                t[key] += (shares.get(key) or 0.0) * rows
            t["rows"] += rows
    return {
        label: {k: (v / t["rows"] if k != "rows" and t["rows"] else v) for k, v in t.items()}
        for label, t in totals.items()
    }


def _row_verdicts(metrics: dict[str, Any]) -> list[set[str]]:
    """Each row's set of verdicts over the check's rules (a rule without one failed closed: deny)."""
    rows: dict[str, set[str]] = {}
    with (Path(metrics["_dir"]) / "predictions.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            p = json.loads(line)
            rows.setdefault(p["row"], set()).add(p.get("verdict") or "deny")
    return list(rows.values())


def _denied_any(metrics: dict[str, Any]) -> float | None:
    """Share of benign rows (every rule "no") that at least one rule denied."""
    rows = _row_verdicts(metrics)
    return sum(1 for v in rows if "deny" in v) / len(rows) if rows else None


def _reviewed_any(metrics: dict[str, Any]) -> float | None:
    """Share of benign rows sent to review by some rule and denied by none."""
    rows = _row_verdicts(metrics)
    return sum(1 for v in rows if "review" in v and "deny" not in v) / len(rows) if rows else None


def render(
    route: dict[str, dict[str, Any]],
    cross: dict[str, Any],
    check: dict[str, dict[str, Any]],
    *,
    rows: int,
    quick: bool,
    seconds: float,
    plots: list[str],
    quality_results: dict[str, Any] | None = None,
) -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python bench/report.py` (this file and the plots beside it); "
        f"{'a --quick run' if quick else 'the full run'} took {seconds / 60:.1f} minutes on this machine "
        f"(2 cores, cold cache). Every figure is `fastslow eval` on a seeded sample of at most {rows} rows "
        "of each set's **test** split, rows no engine learned from; thresholds are the policy defaults "
        "(min confidence 0.7, min margin 0.15), fixed before the run, except in the last section, "
        "*System-1 quality: targets*, whose thresholds and bands come from cross-validation on the training "
        "rows; examples per option come from the training split. The reports themselves (metrics.json, plots, "
        "predictions) are under `bench/out/report/reports/`. Data: `../shared/data` (licences in each folder; see "
        "docs/data.md).",
        "",
        "Columns: **accuracy** of System 1's most probable option; **kept** is the share System 1 kept "
        "under the thresholds and **acc. kept** their accuracy (the operating point on new data); "
        "**cov@97** is the coverage at 97 % accuracy read off these same rows (descriptive only, "
        "optimistic); **ECE** over 15 bins; **OOS AUROC** ranks out-of-scope rows by P(none of these); "
        "**p50** latency per row.",
        "",
    ]
    for name, by_config in route.items():
        lines += [f"## {NAMES.get(name, name)}", ""]
        lines += [
            "| engine | rows | accuracy | macro-F1 | kept | acc. kept | cov@97 | ECE | OOS AUROC | p50 ms |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for config, m in by_config.items():
            o = m["overall"]
            oos = (o.get("out_of_scope") or {}).get("auroc_p_none")
            cov = o["coverage"]["at"].get("0.97", {})
            lines.append(
                f"| {config} | {o['n']} | {_pct(o['accuracy'])} | {_num(o['macro_f1'])} | {_pct(o['kept']['share'])} "
                f"| {_pct(o['kept']['accuracy'])} | {_pct(cov.get('coverage'))} | {_num(o['calibration']['ece'])} "
                f"| {_num(oos)} | {_num((o.get('latency_ms') or {}).get('p50'), 0)} |"
            )
        if name in PUBLISHED_FEW_SHOT:
            lines += [
                "",
                f"Published for comparison: CPFT, 10-shot, full test set: {PUBLISHED_FEW_SHOT[name]} % accuracy "
                "(a fine-tuned RoBERTa; fastslow's rows above are a trained head on frozen embeddings).",
            ]
        if name.startswith("routellm"):
            lines += [
                "",
                "(The embedded engine blends e5 only into choices; these are yes/no questions, so its zero-shot "
                "row is sparrow's.)",
                "",
                _routellm_table(by_config),
            ]
        lines.append("")
    if cross:
        lines += ["## RouteLLM cross-domain: trained on MMLU, tested on GSM8K", "", _routellm_table(cross), ""]
    if route.get("routellm-mmlu") or cross:
        lines += [
            "Published (RouteLLM paper, Table 1-3; CPT(50 %) / CPT(80 %) / APGR): random 50.07 / 79.93 / 0.500 "
            "on MMLU and 50.00 / 80.08 / 0.497 on GSM8K; their best routers trained on Arena data reach "
            "45.00 / 76.86 / 0.524 (MMLU, matrix factorization) and 53.59 / 85.24 / 0.475 on GSM8K "
            "(matrix factorization, Arena only); with golden MMLU labels 35.40 / 71.55 / 0.603 (SW ranking). "
            "See `../shared/reference/routellm-published.md`.",
            "",
        ]
    for name, by_config in check.items():
        lines += [f"## {NAMES.get(name, name)} as a policy check", ""]
        lines += [
            "| engine | rows | violations denied | violations reviewed | safe allowed | safe denied | safe reviewed |",
            "|---|---|---|---|---|---|---|",
        ]
        for config, entry in by_config.items():
            v = _verdicts(entry["test"])
            bad, ok = v.get("yes", {}), v.get("no", {})
            lines.append(
                f"| {config} | {entry['test']['overall']['n']} "
                f"| {_pct(bad.get('denied'))} | {_pct(bad.get('reviewed'))} "
                f"| {_pct(ok.get('allowed'))} | {_pct(ok.get('denied'))} | {_pct(ok.get('reviewed'))} |"
            )
        lines += [
            "",
            "On ordinary traffic (every row benign): the share of rows any rule denied, or sent to review.",
            "",
            "| engine | benign set | rows | denied | reviewed |",
            "|---|---|---|---|---|",
        ]
        for config, entry in by_config.items():
            for benign, m in entry.items():
                if benign == "test":
                    continue
                lines.append(
                    f"| {config} | {benign} | {m['run']['rows']} | {_pct(_denied_any(m))} | {_pct(_reviewed_any(m))} |"
                )
        lines.append("")
    lines += _behind(route, cross, check)
    lines += ["## Plots", ""] + [f"![{p}](benchmarks/{p})" for p in plots] + [""]
    if quality_results is not None:
        lines += [quality.render_quality(quality_results)]
    return "\n".join(lines)


def _best(by_config: dict[str, Any], prefix: str = "") -> tuple[str, dict[str, Any]] | None:
    candidates = [(c, m) for c, m in by_config.items() if c.startswith(prefix)]
    return max(candidates, key=lambda cm: cm[1]["overall"]["accuracy"] or 0.0) if candidates else None


def _behind(route: dict[str, dict[str, Any]], cross: dict[str, Any], check: dict[str, dict[str, Any]]) -> list[str]:
    """Plain statements, computed from the figures above, of where fastslow falls short."""
    out = ["## Where fastslow is behind", ""]
    for name, published in PUBLISHED_FEW_SHOT.items():
        ten = {c: m for c, m in route.get(name, {}).items() if "10/option" in c}
        best = _best(ten)
        if best is not None:
            gap = published - 100 * best[1]["overall"]["accuracy"]
            out.append(
                f"- **{NAMES[name]}**, 10 examples per option: {_pct(best[1]['overall']['accuracy'])} % "
                f"({best[0]}) against CPFT's {published} %: {gap:.1f} points behind a fine-tuned encoder"
                + (" (our rows include out-of-scope ones, which CPFT's figure does not)." if "clinc" in name else ".")
            )
    for name, by_config in route.items():
        best = _best(by_config)
        if best is None:
            continue
        kept = best[1]["overall"]["kept"]
        if kept["accuracy"] is not None and kept["accuracy"] < 0.95:
            out.append(
                f"- **{NAMES.get(name, name)}**: at the default thresholds the best engine ({best[0]}) keeps "
                f"{_pct(kept['share'])} % of decisions at only {_pct(kept['accuracy'])} % accuracy: the "
                "confidences are not yet a trustworthy signal for when to escalate."
            )
    for name, by_config in {**{k: v for k, v in route.items() if k.startswith("routellm")}, "cross": cross}.items():
        deciles = [((m["overall"].get("routellm") or {}).get("quantiles_10") or {}) for m in by_config.values()]
        apgrs = [d["apgr"] for d in deciles if d.get("apgr") is not None]
        if apgrs:
            what = "MMLU trained, GSM8K tested" if name == "cross" else NAMES[name]
            verdict = (
                "near chance: routing by prompt text alone barely beats a coin here"
                if max(apgrs) < 0.55
                else "level with the paper's best, though its spread across example counts (see the table) "
                "says one sample of 1,000 rows cannot separate them"
            )
            out.append(
                f"- **{what}**: best APGR {max(apgrs):.3f} (deciles, RouteLLM's procedure) against random 0.500 "
                f"and the paper's best 0.603 (MMLU with golden labels): {verdict}."
            )
    for name, by_config in check.items():
        for config, entry in by_config.items():
            denied = [(b, _denied_any(m)) for b, m in entry.items() if b != "test"]
            worst = max(denied, key=lambda bd: bd[1] or 0.0, default=None)
            if worst is not None and worst[1]:
                out.append(
                    f"- **{NAMES[name]}** ({config}): denies {_pct(worst[1])} % of benign rows "
                    f"({worst[0]}) it never saw."
                )
    out.append("")
    return out


def _routellm_table(by_config: dict[str, Any]) -> str:
    rows = [
        "| engine | APGR | CPT(50 %) | CPT(80 %) | APGR (deciles, as RouteLLM) | CPT(50 %) / CPT(80 %) (deciles) |",
        "|---|---|---|---|---|---|",
    ]
    for config, m in by_config.items():
        r = m["overall"].get("routellm") or {}
        every, deciles = r.get("every_threshold") or {}, r.get("quantiles_10") or {}
        rows.append(
            f"| {config} | {_num(every.get('apgr'))} | {_pct(every.get('cpt_50'), 2)} | {_pct(every.get('cpt_80'), 2)} "
            f"| {_num(deciles.get('apgr'))} | {_pct(deciles.get('cpt_50'), 2)} / {_pct(deciles.get('cpt_80'), 2)} |"
        )
    return "\n".join(rows)


def plot_accuracy(route: dict[str, dict[str, Any]], path: Path) -> None:
    """Accuracy and kept accuracy against examples per option, per set and embedder."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(figure)
    for col, key in enumerate(("accuracy", "kept")):
        ax = figure.add_subplot(1, 2, col + 1)
        for name, by_config in route.items():
            for embedder in ("e5", "MiniLM"):
                points = [
                    (int(c.split(", ")[1].split("/")[0]), m)
                    for c, m in by_config.items()
                    if c.startswith(f"{embedder} + head")
                ]
                if not points:
                    continue
                xs = [x for x, _ in points]
                ys = [
                    m["overall"]["accuracy"] if key == "accuracy" else m["overall"]["kept"]["accuracy"]
                    for _, m in points
                ]
                # One colour per set, both embedders (MiniLM dashed): the default cycle repeats after ten lines.
                colour = f"C{list(route).index(name)}"
                style = "-" if embedder == "e5" else "--"
                ax.plot(xs, ys, marker="o", linestyle=style, color=colour, label=f"{name} ({embedder})")
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(SHOTS, [str(s) for s in SHOTS])
        ax.set_xlabel("training examples per option")
        ax.set_ylabel("accuracy" if key == "accuracy" else "accuracy of what System 1 kept")
        ax.grid(alpha=0.3)
    figure.axes[0].legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    if not args.data.is_dir():
        raise SystemExit(f"error: --data: no such folder {args.data}")
    bench = Bench(args.data, args.work, rows=args.rows, seed=args.seed)
    configs = _configs(args.quick)
    sets = ["clinc150-domain"] if args.quick else ROUTING
    route = await routing(bench, sets, configs)
    cross = {} if args.quick else await cross_domain(bench, configs)
    check = await checks(
        bench, ["xstest"] if args.quick else CHECKS, ["e5"] if args.quick else ["e5", "minilm"], quick=args.quick
    )
    quality_results = None
    if args.quality_from:
        quality_results = quality.merge_results([json.loads(Path(p).read_text()) for p in args.quality_from])
    elif args.quality:
        quality_results = await quality.measure_async(
            args.data, args.work / "quality", quick=args.quick, seed=args.seed
        )
    seconds = time.monotonic() - started
    # The first complete run of a work folder is the cold one (conversion, training, every row); a
    # later run resumes every report and only redraws the page, so the page keeps the first figure.
    timing = args.work / "cold-run.json"
    if timing.is_file():
        seconds = float(json.loads(timing.read_text())["seconds"])
    else:
        timing.write_text(json.dumps({"seconds": round(seconds, 1), "quick": args.quick}))
    docs = args.docs if args.docs is not None else (args.work if args.quick else REPO / "docs")
    plots_dir = docs / "benchmarks"
    plots_dir.mkdir(parents=True, exist_ok=True)
    plots = ["accuracy.png"]
    plot_accuracy(route, plots_dir / "accuracy.png")
    for name in sets:
        best = route[name].get("e5 + head, 50/option") or route[name].get("e5 + head, 10/option")
        if best is not None:
            target = f"coverage-{name}.png"
            shutil.copyfile(Path(best["_dir"]) / "coverage.png", plots_dir / target)
            plots.append(target)
    page = render(
        route,
        cross,
        check,
        rows=args.rows,
        quick=args.quick,
        seconds=seconds,
        plots=plots,
        quality_results=quality_results,
    )
    if args.tuning_from is not None:
        # bench/tuning.py's section: thresholds from fastslow tune, judged on the test split.
        page += "\n" + args.tuning_from.read_text(encoding="utf-8")
    if args.learning_from is not None:
        page += "\n" + learning_section(args.learning_from, plots_dir)
    for section in args.append:
        # Other benches' sections as they wrote them (bench/overhead.py, bench/coalesce.py).
        page += "\n" + section.read_text(encoding="utf-8")
    (docs / "benchmarks.md").write_text(page, encoding="utf-8")

    def brief(m: dict[str, Any]) -> dict[str, Any]:
        o = m["overall"]
        return {
            "n": o["n"],
            "accuracy": o["accuracy"],
            "kept": o["kept"]["share"],
            "kept_accuracy": o["kept"]["accuracy"],
            "ece": o["calibration"]["ece"],
            "oos_auroc": (o.get("out_of_scope") or {}).get("auroc_p_none"),
            "routellm": (o.get("routellm") or {}).get("every_threshold"),
            "seconds": m["_seconds"],
        }

    return {
        "quick": args.quick,
        "rows": args.rows,
        "seconds": round(seconds, 1),
        "docs": str(docs / "benchmarks.md"),
        "routing": {n: {c: brief(m) for c, m in by_config.items()} for n, by_config in route.items()},
        "cross_domain": {c: brief(m) for c, m in cross.items()},
        "checks": {
            n: {
                c: {
                    "test": _verdicts(e["test"]),
                    **{b: {"denied": _denied_any(m)} for b, m in e.items() if b != "test"},
                }
                for c, e in by_config.items()
            }
            for n, by_config in check.items()
        },
        "quality": quality_results,
    }


def learning_section(learning_md: Path, plots_dir: Path) -> str:
    """bench/learning.py's section, its plot copied beside the page's others."""
    shutil.copyfile(learning_md.with_name("learning.png"), plots_dir / "learning.png")
    text = learning_md.read_text(encoding="utf-8")
    return text.replace("](learning.png)", f"]({plots_dir.name}/learning.png)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one set, two engines, 60 rows; quality.py --quick")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "report", help="data and reports")
    parser.add_argument("--docs", type=Path, default=None, help="where benchmarks.md goes (default docs/)")
    parser.add_argument("--rows", type=int, default=None, help="test rows per set (1000; 100 with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--quality",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run bench/quality.py (the quality targets; its --quick with --quick) and append its section",
    )
    parser.add_argument(
        "--tuning-from",
        type=Path,
        default=None,
        metavar="TUNING_MD",
        help="append this bench/tuning.py section (its tuning.md) to the page",
    )
    parser.add_argument(
        "--append",
        type=Path,
        nargs="*",
        default=[],
        metavar="MD",
        help="append these sections as they are (bench/out/overhead/overhead.md, bench/out/coalesce/coalesce.md)",
    )
    parser.add_argument(
        "--learning-from",
        type=Path,
        default=None,
        metavar="LEARNING_MD",
        help="append this bench/learning.py section (its learning.md, with learning.png beside it) to the page",
    )
    parser.add_argument(
        "--quality-from",
        nargs="+",
        type=Path,
        default=None,
        metavar="QUALITY_JSON",
        help="append the quality section from these quality.py results (merged section by section) instead of "
        "running it",
    )
    args = parser.parse_args(argv)
    if args.rows is None:
        args.rows = 60 if args.quick else 1000
    logging.basicConfig(level=logging.WARNING)
    report = asyncio.run(main_async(args))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
