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
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _zero_shot_evaluate import _show, evaluate, markdown
from _zero_shot_figures import ece_floor
from _zero_shot_fit import fit, without_source
from _zero_shot_raw import Raw, RawCache, console
from _zero_shot_sets import HELD_OUT_SOURCE, _kind_of, eval_sets, fit_sets

# Private, but bench/_quality_zero_shot.py builds its small (--quick) evaluation sets with them and
# reads them from here.
from _zero_shot_sets import _labelled as _labelled
from _zero_shot_sets import _rows as _rows

from fastslow.engines.embedded.tools import CALIBRATION_FILE, ZeroShotCalibrations, load_zero_shot_calibrations

from _data import DataMissing, data_dir

# The steps live in the _zero_shot_* modules beside this one; this script is their façade (the CLI and
# the flow between them), so bench/_quality_zero_shot.py and tests/test_zero_shot_calibration.py keep
# reading every name they use from ``fit_zero_shot``.
__all__ = [
    "EMBEDDERS",
    "HELD_OUT_SOURCE",
    "REPO",
    "SHIPPED",
    "Raw",
    "RawCache",
    "ece_floor",
    "eval_sets",
    "evaluate",
    "fit",
    "fit_sets",
    "main",
    "markdown",
    "without_source",
]

REPO = Path(__file__).resolve().parent.parent
SHIPPED = REPO / "engines" / "embedded" / CALIBRATION_FILE
EMBEDDERS = ("e5", "minilm")


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
