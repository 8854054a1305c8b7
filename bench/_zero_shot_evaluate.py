"""``bench/fit_zero_shot.py``'s evaluation: raw against calibrated figures of every set, as a table and as Markdown.

Its own module so that ``fit_zero_shot.py`` stays small; ``fit_zero_shot.py`` re-exports ``evaluate``,
which ``bench/_quality_zero_shot.py`` reads from there.
"""

from __future__ import annotations

from typing import Any

from _zero_shot_figures import MIN_CONFIDENCE, _r, figures
from _zero_shot_raw import Raw, console
from _zero_shot_sets import HELD_OUT_SOURCE, Item, _kind_of
from rich.table import Table

from fastslow.engines.embedded.tools import ZeroShotCalibrations


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
