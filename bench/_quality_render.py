"""The markdown section ``bench/quality.py`` writes and ``bench/report.py`` appends to ``docs/benchmarks.md``.

It reads only the results' JSON, so a page can be rendered again from ``quality.json`` files
(``bench/report.py --quality-from``) without measuring anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from _quality_routes import MARGIN_GRID

PUBLISHED_BANKING = 0.872
"""CPFT (Zhang et al. 2021), 10-shot Banking77 accuracy on the full test set."""


# -- the page section ----------------------------------------------------------------------------------


def _pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}"


def _met(f: dict[str, Any]) -> str:
    if f.get("met") is None:
        return "—"
    if f["met"]:
        return "yes" if f["clear"] else "yes (within noise)"
    return "**no**" if f["clear"] else "no (within noise)"


FIGURE_HEAD = "figure | value % | Wilson 95 % | n | target | met |"


def _figure_cells(f: dict[str, Any]) -> str:
    target = f.get("target", {}).get("text", "—")
    return (
        f"{f['figure']} | {_pct(f['value'])} | {_pct(f['low'])}–{_pct(f['high'])} | {f['n']} | {target} | {_met(f)} |"
    )


def _figure_table(lead: Sequence[str], entries: Iterable[tuple[Sequence[str], list[dict[str, Any]]]]) -> list[str]:
    head = "| " + " | ".join(lead) + " | " + FIGURE_HEAD
    rule = "|" + "---|" * (len(lead) + 6)
    lines = [head, rule]
    for cells, figures in entries:
        for n, f in enumerate(figures):
            # The lead cells (engine, thresholds) once per engine: the rows below it are its own.
            lead_cells = cells if n == 0 else [""] * len(cells)
            lines.append("| " + " | ".join(lead_cells) + " | " + _figure_cells(f))
    return lines + [""]


def _bands(bands: dict[str, Any]) -> str:
    return "; ".join(f"{b['allow_at']:.3f} / {b['deny_at']:.3f}" for b in bands.values())


def _clinc_section(results: dict[str, Any]) -> list[str]:
    entries = list(results.items())
    first = entries[0][1]
    lines = [
        "### 1. CLINC150 domains: keep what is right, escalate the rest",
        "",
        f'{first["examples_per_domain"]} examples a domain, none for "none of these" (the open-set score '
        "gives it its probability). (min confidence, min margin) is chosen by 5-fold cross-validation on those "
        f"{10 * first['examples_per_domain']} training examples: the largest out-of-fold kept share whose kept "
        f"accuracy is at least 97 %, over confidence 0.50-0.99 and margin {', '.join(f'{m:g}' for m in MARGIN_GRID)}. "
        f"Then the test split: {first['test_rows']} rows (a seeded sample keeping its in-scope / out-of-scope mix "
        "unless that is the whole 5,500). An out-of-scope row kept counts as wrong; escalated means for any reason. "
        "Heads are the default adapted ones (`embedded.head: adapted`) unless a row says softmax head.",
        "",
    ]
    lead = ("engine", "thresholds (conf. / margin)", "CV kept / CV kept accuracy")
    return lines + _figure_table(lead, ((_threshold_cells(key, r), r["figures"]) for key, r in entries))


def _threshold_cells(key: str, r: dict[str, Any]) -> tuple[str, str, str]:
    t = r["thresholds"]
    chosen = f"{t['min_confidence']:.2f} / {t['min_margin']:.2f}" + ("" if t["reached"] else " (97 % not reached)")
    return key, chosen, f"{_pct(t['kept'])} / {_pct(t['kept_accuracy'])}"


def _banking_section(results: dict[str, Any]) -> list[str]:
    first = next(iter(results.values()))
    sample = "the full test split" if first["full_test"] else f"a fixed seeded sample of {first['test_rows']} test rows"
    lines = [
        "### 2. Banking77, 10 examples an intent",
        "",
        f"Accuracy of System 1's top intent over {len(first['seeds'])} sampled 10-shot example sets (converter seeds "
        f"{', '.join(map(str, first['seeds']))}), each on {sample}. CPFT's published 10-shot figure is "
        f"{100 * PUBLISHED_BANKING:.1f} %. The interval is Wilson's on the pooled answers (every set's). Heads are "
        "the default adapted ones (`embedded.head: adapted`) unless a row says softmax head.",
        "",
        "| engine | mean % | min % | max % | rows a set | Wilson 95 % (pooled) | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        f = r["figures"][0]
        lines.append(
            f"| {key} | {_pct(r['mean'])} | {_pct(r['min'])} | {_pct(r['max'])} | {r['test_rows']} "
            f"| {_pct(f['low'])}–{_pct(f['high'])} | {f['target']['text']} | {_met(f)} |"
        )
    return lines + [""]


def _check_section(title: str, text: str, results: dict[str, Any]) -> list[str]:
    lines = [title, "", text, ""]
    return lines + _figure_table(
        ("engine", "bands (allow / deny), fold 1; fold 2"),
        (((key, _bands(r["bands"])), r["figures"]) for key, r in results.items()),
    )


def _documents_section(results: dict[str, Any]) -> list[str]:
    first = next(iter(results.values()))
    low, high = first.get("lengths") or first["chars"]
    lines = [
        "### 5. An injection hidden in a long document",
        "",
        f"{first['documents']} documents of {low:,}-{high:,} characters, benign texts of the other sets joined, each "
        "with one held-out injection (of the fold its rule did not learn from) at a random boundary in its middle "
        "half; beside them the same documents without it. A check reads a long state window by window and takes "
        "the worst window.",
        "",
    ]
    return lines + _figure_table(("engine",), (((key,), r["figures"]) for key, r in results.items()))


def _latency_section(results: dict[str, Any], blas_threads: str | None) -> list[str]:
    lines = [
        "### 6. Decision latency",
        "",
        "Through the in-process `Router` (System 1 only), one call at a time after a warm-up: a route task (CLINC150 "
        "domains) and a check (the prompt-injection rule), on a short state and a long one. A long-state cell stops "
        "early once its time budget is spent, so it may have fewer calls than asked. Load average (1 min) is the "
        "machine's, shared with other work, before and after: on a busy machine these figures move by tens of "
        f"milliseconds from run to run. OpenBLAS threads (MiniLM runs in numpy): {blas_threads or 'its default'}.",
        "",
        "| engine | task | state | chars | calls | p50 ms | p99 ms | target | met | load |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results.items():
        load = f"{r['load_before'][0]:.1f} → {r['load_after'][0]:.1f}"
        for c in r["cells"]:
            met = "—" if "met" not in c else ("yes" if c["met"] else "**no**")
            lines.append(
                f"| {key} | {c['task']} | {c['state']} | {c['chars']:,} | {c['calls']} | {c['p50_ms']:.1f} "
                f"| {c['p99_ms']:.1f} | {c.get('target', '—')} | {met} | {load} |"
            )
    return lines + [""]


def _zero_shot_section(result: dict[str, Any] | None) -> list[str]:
    lines = ["### 7. Zero-shot calibration", ""]
    if not result:
        return lines + [
            "Not measured in this run: bench/fit_zero_shot.py's evaluation did not run (see the errors below).",
            "",
        ]
    lines += [
        f"`bench/fit_zero_shot.py`'s own evaluation of the shipped calibration (`{result['calibration']}`), on sets it "
        f"was not fitted on, at most {result['rows_per_set']} rows a set: raw → calibrated. AUROC is P(yes) ranking "
        "yes rows first for yes/no sets, the confidence ranking right answers first for choices; the Brier skill "
        "score is against the set's base rates.",
        "",
        "| set | engine | rows | accuracy % | ECE | AUROC | Brier skill |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, engines in result["sets"].items():
        for engine, r in engines.items():
            if engine.startswith("embedded (sparrow"):
                continue
            a, b = r["raw"], r["calibrated"]
            pairs = [f"{_num(a[k])} → {_num(b[k])}" for k in ("ece", "auroc", "brier_skill")]
            lines.append(f"| {name} | {engine} | {a['rows']} | {_pct(a['accuracy'])} | " + " | ".join(pairs) + " |")
    return lines + [""]


def _num(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


XSTEST_TEXT = (
    "Is the prompt unsafe? (violation = yes.) Two-fold cross-fitting over XSTest's 450 prompts grouped by contrast "
    "pair (the n-th `contrast_X` prompt is the unsafe twin of the n-th `X` one; the three privacy and the three "
    "discrimination types are grouped by position), so a pair never straddles the folds. Each fold's rule learns "
    "the other fold's prompts; its bands come from an inner cross-validation on that training fold alone: "
    "deny_at the lowest value denying at most 2 % of its safe prompts out of fold, allow_at the highest allowing "
    "at most 5 % of its unsafe ones (and never above deny_at). Figures pool both held-out folds."
)
INJECTION_TEXT = (
    "Is this text a prompt injection? deepset's set, all 662 rows (its train, validation and test splits pooled), "
    "two-fold cross-fitted as above (benign = label 0). Benign text of other sets (the moderation set's clean test "
    "rows, MT-Bench first turns, CLINC150 in-scope test rows) is judged by both folds' rules and pooled, so each "
    "such text counts twice and its interval is a little narrower than its rows warrant."
)


def _work_folders(results: dict[str, Any]) -> str:
    work = results.get("work", "bench/out/quality")
    folders = work if isinstance(work, list) else [work]
    shown = ", ".join(f"`{w}/runs/`" for w in folders)
    return shown + (" (sections of separate runs, merged)" if len(folders) > 1 else "")


def render_quality(results: dict[str, Any]) -> str:
    """The markdown section "## System-1 quality: targets" for ``docs/benchmarks.md``."""
    lines = [
        "## System-1 quality: targets",
        "",
        f"Generated by `python bench/quality.py{' --quick' if results.get('quick') else ''}` "
        f"({results.get('seconds', 0) / 60:.1f} minutes). Every figure is `fastslow eval`, the router's own decisions "
        "(System 1 only; nothing escalates to a model), on rows the engine did not learn from. Thresholds and bands "
        "come from cross-validation on the training rows, never from the rows scored; the open-set score is "
        "calibrated by the engine on the in-scope examples alone. Beside each share is its Wilson 95 % interval; "
        "*met* reads the figure itself, *within noise* that the interval reaches across the target. Runs, rows and "
        f"policies are under {_work_folders(results)}.",
        "",
    ]
    if results.get("clinc"):
        lines += _clinc_section(results["clinc"])
    if results.get("banking"):
        lines += _banking_section(results["banking"])
    if results.get("xstest"):
        lines += _check_section("### 3. XSTest as a policy check", XSTEST_TEXT, results["xstest"])
    if results.get("injection"):
        lines += _check_section("### 4. Prompt injections as a policy check", INJECTION_TEXT, results["injection"])
    if results.get("documents"):
        lines += _documents_section(results["documents"])
    if results.get("latency"):
        lines += _latency_section(results["latency"], results.get("blas_threads"))
    if "zero_shot" in results:
        lines += _zero_shot_section(results["zero_shot"].get("shipped"))
    if results.get("errors"):
        lines += ["Engine errors during the run (each retried):", ""] + [f"- {e}" for e in results["errors"]] + [""]
    return "\n".join(lines)
