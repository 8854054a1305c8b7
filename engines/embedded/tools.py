"""For the offline scripts that rebuild the embedded engines' shipped data, and benchmarks that read as they do.

Not for engine users (they need ``fastslow.engines.embedded``): this is what ``bench/build_background.py``
(the background embeddings, rebuilt after editing ``background/*.jsonl``), ``bench/fit_zero_shot.py``
(the zero-shot calibration file) and ``bench/learning.py`` use of the engines' internals.

- ``build_background(embedder)`` embeds ``background_units()`` (from ``BACKGROUND_DIR``) and
  records the vectors in the manifest; ``build_shipped(embedder, cold_start)`` ships what a cold
  start of the built-in policy embeds (``SHIPPED_DIR``).
- ``as_text(state)`` is the state as one string; ``squash`` and ``ends`` are what a route or
  classification reads of it: ``ends(squash(as_text(state)))``.
- ``load_zero_shot_calibrations(path)`` reads a calibration file (``FORMAT``); the shipped one is
  ``CALIBRATION_FILE`` beside the engines' modules, of ``ZeroShotCalibrations`` made of one
  ``ZeroShotCalibration`` per engine, model and question type.
"""

from ._background import BACKGROUND_DIR, background_units
from ._background import build as build_background
from ._common import as_text
from ._reading import ends, squash
from ._shipped import SHIPPED_DIR, build_shipped
from ._zero_shot import (
    CALIBRATION_FILE,
    FORMAT,
    ZeroShotCalibration,
    ZeroShotCalibrations,
    load_zero_shot_calibrations,
)

__all__ = [
    "BACKGROUND_DIR",
    "CALIBRATION_FILE",
    "FORMAT",
    "SHIPPED_DIR",
    "ZeroShotCalibration",
    "ZeroShotCalibrations",
    "as_text",
    "background_units",
    "build_background",
    "build_shipped",
    "ends",
    "load_zero_shot_calibrations",
    "squash",
]
