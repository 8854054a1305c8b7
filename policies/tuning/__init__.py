"""Fitting a policy's numbers from labelled decisions: thresholds that state an accuracy, calibration, bands.

* ``tune_thresholds``: a route's or classification's minimum confidence and margin, chosen to keep
  the most decisions in System 1 while a lower confidence bound on their accuracy meets a target
  on held-out decisions (Learn then Test, ``_select``).
* ``tune_bands``: a check rule's ``allow_at`` / ``deny_at`` from bounds on the share of benign
  states denied and of violations allowed.
* ``fit_calibration``: a temperature and, with enough decisions, a Platt or isotonic map of the top
  probability, chosen by cross-validation and judged by ECE and Brier held out (``fit_temperature``:
  the temperature alone).
* ``PolicyEditor``: writes the numbers into the YAML file, keeping everything else byte for byte.

The commands' library (``docs/tuning.md``), which ``fastslow.api`` composes with the engines and
the decision log:

* ``collect`` / ``collect_from_log``: a task's labelled decisions, from an evaluation file run as
  ``fastslow eval`` runs it (an ``Evaluate``) or from the outcomes in the decision log (an
  ``OutcomeLog``), split into fit and held-out rows.
* ``tune`` and ``calibrate_task``: a ``Fit`` of thresholds or bands, or of a calibration, with the
  ``fitted:`` record written beside it; ``apply_fit`` makes its edits, ``plot_fit`` draws it.
* ``drift``: do the decisions logged lately still match what the fit promised (``report drift``)?
* ``shadow_report``: what System 1 would have kept of a task in shadow mode (``report shadow``).
* ``logged_label`` / ``sample_weight``: which option a recorded outcome makes right, and how much
  a labelled decision counts under a ``Sample``.
"""

from ._bounds import needed_for, wilson_lower, wilson_upper
from ._calibrate import (
    FOLDS,
    ISOTONIC_MIN_ROWS,
    METHODS,
    PLATT_MIN_ROWS,
    CalibrationFit,
    Figures,
    Method,
    figures,
    fit_calibration,
    fit_temperature,
    reexpress,
)
from ._collect import HELD_OUT, Collected, Evaluate, collect, collect_from_log, load_task
from ._drift import COVERAGE_SHIFT, ECE_FLOOR, MIN_ECE_ROWS, MIN_KEPT_ROWS, Drift, drift
from ._fit import MAP_KEYS, REMOVE, Fit, apply_fit, plot_fit
from ._fitted import embedder_name, fit_mismatches
from ._log import (
    LOG_LIMIT,
    SAMPLE_WORDS,
    DriftLog,
    LoggedDecision,
    LoggedOutcome,
    OutcomeLog,
    Sample,
    ShadowLog,
    logged_label,
    logged_prediction,
    sample_weight,
)
from ._recalibrate import calibrate_task
from ._select import (
    BAND_GRID,
    CONFIDENCE_GRID,
    MARGIN_GRID,
    BandChoice,
    Labelled,
    Point,
    ThresholdChoice,
    TooFewLabels,
    kept_answer,
    tune_bands,
    tune_thresholds,
)
from ._shadow import Shadow, shadow_report
from ._tune import OUTPUT_TOKENS, PROMPT_TOKENS, CallCost, system2_cost_per_call, threshold_warnings, tune
from ._yaml_edit import PolicyEditor

__all__ = [
    "BAND_GRID",
    "CONFIDENCE_GRID",
    "COVERAGE_SHIFT",
    "ECE_FLOOR",
    "FOLDS",
    "HELD_OUT",
    "ISOTONIC_MIN_ROWS",
    "LOG_LIMIT",
    "MAP_KEYS",
    "MARGIN_GRID",
    "METHODS",
    "MIN_ECE_ROWS",
    "MIN_KEPT_ROWS",
    "OUTPUT_TOKENS",
    "PLATT_MIN_ROWS",
    "PROMPT_TOKENS",
    "REMOVE",
    "SAMPLE_WORDS",
    "BandChoice",
    "CalibrationFit",
    "CallCost",
    "Collected",
    "Drift",
    "DriftLog",
    "Evaluate",
    "Figures",
    "Fit",
    "Labelled",
    "LoggedDecision",
    "LoggedOutcome",
    "Method",
    "OutcomeLog",
    "Point",
    "PolicyEditor",
    "Sample",
    "Shadow",
    "ShadowLog",
    "ThresholdChoice",
    "TooFewLabels",
    "apply_fit",
    "calibrate_task",
    "collect",
    "collect_from_log",
    "drift",
    "embedder_name",
    "figures",
    "fit_calibration",
    "fit_mismatches",
    "fit_temperature",
    "kept_answer",
    "load_task",
    "logged_label",
    "logged_prediction",
    "needed_for",
    "plot_fit",
    "reexpress",
    "sample_weight",
    "shadow_report",
    "system2_cost_per_call",
    "threshold_warnings",
    "tune",
    "tune_bands",
    "tune_thresholds",
    "wilson_lower",
    "wilson_upper",
]
