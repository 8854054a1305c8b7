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

``fastslow calibrate`` and ``fastslow tune`` (``docs/tuning.md``) are built on these.
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
from ._fitted import fit_mismatches
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
from ._yaml_edit import PolicyEditor

__all__ = [
    "BAND_GRID",
    "CONFIDENCE_GRID",
    "FOLDS",
    "ISOTONIC_MIN_ROWS",
    "MARGIN_GRID",
    "METHODS",
    "PLATT_MIN_ROWS",
    "BandChoice",
    "CalibrationFit",
    "Figures",
    "Labelled",
    "Method",
    "Point",
    "PolicyEditor",
    "ThresholdChoice",
    "TooFewLabels",
    "figures",
    "fit_calibration",
    "fit_mismatches",
    "fit_temperature",
    "kept_answer",
    "needed_for",
    "reexpress",
    "tune_bands",
    "tune_thresholds",
    "wilson_lower",
    "wilson_upper",
]
