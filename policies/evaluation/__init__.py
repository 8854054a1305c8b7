"""Evaluation of decisions on labelled data: one row format, converters for public sets, metrics.

* ``read_rows``: the JSON Lines evaluation format (explicit questions and labels, or a policy
  task's name), every problem reported with its line number.
* ``convert`` / ``CONVERTERS``: the public data sets in ``../shared/data`` as evaluation files, with
  their splits kept apart and a ``meta.json`` of source, licence, seed and counts.
* The metrics: accuracy, macro-F1, calibration (ECE, reliability, Brier, log loss), AUROC,
  selective prediction (accuracy–coverage), verdict shares for checks, RouteLLM's APGR and CPT,
  and a paired bootstrap to compare two runs on the same rows.
* ``evaluate`` (its options an ``EvalOptions``): answer every row of an evaluation file as production
  would (a policy task's rows by a ``TaskRouter``, explicit rows by a ``RowEngine``, both built by
  the caller's ``Deciders``),
  one ``Prediction`` per (row, question), resumable; ``headline`` is its one-line summary, and
  ``prediction`` is how a decision (the router's, or one read back from the log) is scored.
* ``write_report`` / ``compare_reports``: a run's report directory (``metrics.json``, plots,
  ``summary.md``) from its ``predictions.jsonl`` and ``run.json``, and two runs side by side.

See ``docs/evaluation.md``.
"""

from ._compare import (
    COMPARISON_FILE,
    COMPARISON_SUMMARY,
    Comparison,
    Difference,
    GroupComparison,
    compare_reports,
)
from ._convert import CONVERTERS, Converter, ConvertResult, Dataset, Item, Source, TaskSpec, convert, pick_examples
from ._decided import FAILED_REASONS, Decided, prediction
from ._deciders import Deciders, RowEngine, TaskRouter, TrainingTexts
from ._headline import Headline, headline
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
from ._options import EvalOptions
from ._plan import EXPLICIT_THRESHOLDS, NONE_OF_THESE
from ._plots import plot_tuning
from ._predictions import (
    PREDICTIONS_FILE,
    RUN_FILE,
    Prediction,
    RunInfo,
    read_predictions,
    read_run,
    write_prediction,
    write_run,
)
from ._report import Report, write_report
from ._report_metrics import (
    CONFUSION_FILE,
    COVERAGE_PLOT,
    GROUP_KEYS,
    METRICS_FILE,
    METRICS_KEYS,
    RELIABILITY_PLOT,
    REPORT_FORMAT,
    SUMMARY_FILE,
)
from ._rows import SPLITS, EvalRow, RowProblem, RowsRead, Split, normalise_label, read_rows
from ._run import evaluate

__all__ = [
    "COMPARISON_FILE",
    "COMPARISON_SUMMARY",
    "CONFUSION_FILE",
    "CONVERTERS",
    "COVERAGE_PLOT",
    "EXPLICIT_THRESHOLDS",
    "FAILED_REASONS",
    "GROUP_KEYS",
    "METRICS_FILE",
    "METRICS_KEYS",
    "NONE_OF_THESE",
    "PREDICTIONS_FILE",
    "RELIABILITY_PLOT",
    "REPORT_FORMAT",
    "RUN_FILE",
    "SPLITS",
    "SUMMARY_FILE",
    "Bootstrap",
    "Comparison",
    "Confusion",
    "ConvertResult",
    "Converter",
    "CoverageCurve",
    "Dataset",
    "Decided",
    "Deciders",
    "Difference",
    "EvalOptions",
    "EvalRow",
    "GapCurve",
    "GroupComparison",
    "Headline",
    "Item",
    "Label",
    "Prediction",
    "Reliability",
    "Report",
    "RowEngine",
    "RowProblem",
    "RowsRead",
    "RunInfo",
    "SelectivePoint",
    "Source",
    "Split",
    "TaskRouter",
    "TaskSpec",
    "TrainingTexts",
    "VerdictShares",
    "accuracy",
    "apgr",
    "auroc",
    "brier",
    "compare_reports",
    "confusion",
    "convert",
    "coverage_at",
    "coverage_curve",
    "cpt",
    "ece",
    "evaluate",
    "gap_recovered_curve",
    "headline",
    "kept_at",
    "log_loss",
    "macro_f1",
    "normalise_label",
    "paired_bootstrap",
    "percentiles",
    "pick_examples",
    "plot_tuning",
    "prediction",
    "read_predictions",
    "read_rows",
    "read_run",
    "reliability",
    "verdict_shares",
    "write_prediction",
    "write_report",
    "write_run",
]
