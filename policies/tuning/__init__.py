"""Fitting a policy's numbers from labelled decisions: thresholds that state an accuracy, calibration, bands.

* ``tune_thresholds``: a route's or classification's minimum confidence and margin, chosen to keep
  the most decisions in System 1 while a lower confidence bound on their accuracy meets a target
  on held-out decisions (Learn then Test, ``_select``).
* ``tune_bands``: a check rule's ``allow_at`` / ``deny_at`` from bounds on the share of benign
  states denied and of violations allowed.
* ``fit_temperature``: the temperature that minimises log loss, judged by ECE and Brier held out.
* ``PolicyEditor``: writes the numbers into the YAML file, keeping everything else byte for byte.

``fastslow calibrate`` and ``fastslow tune`` (``docs/tuning.md``) are built on these.
"""

from ._bounds import needed_for, wilson_lower, wilson_upper
from ._calibrate import CalibrationFit, Figures, figures, fit_temperature
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
    "MARGIN_GRID",
    "BandChoice",
    "CalibrationFit",
    "Figures",
    "Labelled",
    "Point",
    "PolicyEditor",
    "ThresholdChoice",
    "TooFewLabels",
    "figures",
    "fit_mismatches",
    "fit_temperature",
    "kept_answer",
    "needed_for",
    "tune_bands",
    "tune_thresholds",
    "wilson_lower",
    "wilson_upper",
]
