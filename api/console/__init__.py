"""The operator's console at ``/console``: server-rendered pages over the decision log and the review queue.

``install_console(app, settings)`` serves it on the API's app (``create_app`` does when
``settings.console.enabled``); ``docs/console.md`` describes its pages, sign-in and sessions.
``calibration_figures(store, task, tenant=...)`` is the one function that turns a task's recorded
outcomes into its reliability bins, accuracy-coverage curve and ECE, as plain values, for the
console's calibration page and for any metric that reports the same figures.
"""

from ._figures import (
    MIN_LABELLED,
    OUTCOME_LIMIT,
    CalibrationFigures,
    ConsoleLog,
    CoveragePoint,
    ReliabilityBin,
    calibration_figures,
)
from ._pages import CONSOLE_URL, STATIC_URL, Console, install_console

__all__ = [
    "CONSOLE_URL",
    "MIN_LABELLED",
    "OUTCOME_LIMIT",
    "STATIC_URL",
    "CalibrationFigures",
    "Console",
    "ConsoleLog",
    "CoveragePoint",
    "ReliabilityBin",
    "calibration_figures",
    "install_console",
]
