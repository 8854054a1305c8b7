"""Evaluation of decisions on labelled data: one row format, converters for public sets, metrics.

* ``read_rows``: the JSON Lines evaluation format (explicit questions and labels, or a policy
  task's name), every problem reported with its line number.
* ``convert`` / ``CONVERTERS``: the public data sets in ``../shared/data`` as evaluation files, with
  their splits kept apart and a ``meta.json`` of source, licence, seed and counts.
* The metrics: accuracy, macro-F1, calibration (ECE, reliability, Brier, log loss), AUROC,
  selective prediction (accuracy–coverage), verdict shares for checks, RouteLLM's APGR and CPT,
  and a paired bootstrap to compare two runs on the same rows.

See ``docs/evaluation.md``.
"""

from ._convert import CONVERTERS, Converter, ConvertResult, Dataset, Item, Source, TaskSpec, convert, pick_examples
from ._metrics import (
    Bootstrap,
    Confusion,
    CoverageCurve,
    GapCurve,
    Label,
    Reliability,
    SelectivePoint,
    VerdictShares,
    accuracy,
    apgr,
    auroc,
    brier,
    confusion,
    coverage_at,
    coverage_curve,
    cpt,
    ece,
    gap_recovered_curve,
    kept_at,
    log_loss,
    macro_f1,
    paired_bootstrap,
    percentiles,
    reliability,
    verdict_shares,
)
from ._rows import SPLITS, EvalRow, RowProblem, RowsRead, Split, normalise_label, read_rows

__all__ = [
    "CONVERTERS",
    "SPLITS",
    "Bootstrap",
    "Confusion",
    "ConvertResult",
    "Converter",
    "CoverageCurve",
    "Dataset",
    "EvalRow",
    "GapCurve",
    "Item",
    "Label",
    "Reliability",
    "RowProblem",
    "RowsRead",
    "SelectivePoint",
    "Source",
    "Split",
    "TaskSpec",
    "VerdictShares",
    "accuracy",
    "apgr",
    "auroc",
    "brier",
    "confusion",
    "convert",
    "coverage_at",
    "coverage_curve",
    "cpt",
    "ece",
    "gap_recovered_curve",
    "kept_at",
    "log_loss",
    "macro_f1",
    "normalise_label",
    "paired_bootstrap",
    "percentiles",
    "pick_examples",
    "read_rows",
    "reliability",
    "verdict_shares",
]
