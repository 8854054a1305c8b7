"""The calibration the embedded engines ship for their zero-shot answers, per model and question type.

Sparrow's zero-shot distributions (and the embedded engine's sparrow x similarity blend for choices)
rank options well but their confidences do not mean what they say: choices are under-confident on
few options and over-confident on many. ``zero_shot_calibration.json``, beside this module, holds one
small calibration per (engine, model, question type), fitted by ``bench/fit_zero_shot.py`` on public
data that the engines are not evaluated on (SNIPS, HWU64 and deepset's prompt-injection training
split), so that zero-shot confidences are calibrated out of the box. Its forms:

* ``temperature`` (choice, score): ``q_i ∝ p_i ** beta`` with ``beta = beta0 + beta_log_k * ln K``
  for ``K`` options (``K`` clipped to the range fitted on); ``beta > 0`` keeps the order of the options.
* ``platt`` (noul): ``logit(q_yes) = slope * logit(p_yes) + bias``; with ``bias = 0`` it is a
  temperature, and it keeps the order of P(yes) across states. Its ``ceiling`` (1 when absent) is
  the most confidence an answer may have: both options are kept within ``[1 - ceiling, ceiling]``.
  It is fitted as what the most confident answers were worth on sets they were not fitted on, so
  that a yes/no question the model has no skill on says so by a confidence that escalates, rather
  than by a calibrated-looking number (a calibration fitted on average sets cannot tell the sets
  apart; the ceiling holds on every one).
* ``identity``: left as the engine gives it (a type without public data to fit on).

A model or type the file does not name is left as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal, get_args

from fastslow.router import ConfigError

__all__ = [
    "CALIBRATION_FILE",
    "FORMAT",
    "Form",
    "Kind",
    "ZeroShotCalibration",
    "ZeroShotCalibrations",
    "calibrate_zero_shot",
    "load_zero_shot_calibrations",
    "shipped_zero_shot_calibrations",
]

FORMAT = "fastslow-zero-shot-calibration/1"
CALIBRATION_FILE = "zero_shot_calibration.json"
Kind = Literal["noul", "choice", "score"]
Form = Literal["identity", "temperature", "platt"]

_FLOOR = 1e-12
"""Probabilities are clipped to ``[_FLOOR, 1 - _FLOOR]`` before taking logs."""
_BETA_RANGE = (0.05, 20.0)
"""The inverse temperature is kept in this range whatever ``K`` gives."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroShotCalibration:
    """One question type's calibration of one model (see the module's docstring for the forms)."""

    engine: str
    model: str
    kind: Kind
    form: Form
    beta0: float = 1.0
    beta_log_k: float = 0.0
    k_min: int = 2
    k_max: int = 1000
    slope: float = 1.0
    bias: float = 0.0
    ceiling: float = 1.0
    """(noul) The most confidence an answer may have (see the module's docstring)."""
    info: Mapping[str, Any] = field(default_factory=dict)
    """What it was fitted on, with how many rows, and its figures there (kept as the file has them)."""

    def beta(self, k: int) -> float:
        """The inverse temperature for a question of ``k`` options."""
        kk = min(max(k, self.k_min), self.k_max)
        beta = self.beta0 + self.beta_log_k * math.log(kk)
        return min(max(beta, _BETA_RANGE[0]), _BETA_RANGE[1])

    def apply(self, probs: Mapping[str, float]) -> dict[str, float]:
        """The calibrated distribution over the same options, in the same order, summing to 1."""
        if self.form == "identity" or len(probs) < 2:
            return dict(probs)
        if self.form == "platt":
            if set(probs) != {"yes", "no"}:
                raise ValueError(f"a platt calibration takes a yes/no distribution, not {sorted(probs)}")
            p = min(max(probs["yes"] / (probs["yes"] + probs["no"]), _FLOOR), 1.0 - _FLOOR)
            z = self.slope * math.log(p / (1.0 - p)) + self.bias
            yes = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
            yes = min(max(yes, 1.0 - self.ceiling), self.ceiling)
            return {name: (yes if name == "yes" else 1.0 - yes) for name in probs}
        beta = self.beta(len(probs))
        logs = {name: beta * math.log(max(p, _FLOOR)) for name, p in probs.items()}
        top = max(logs.values())
        weights = {name: math.exp(v - top) for name, v in logs.items()}
        total = sum(weights.values())
        return {name: w / total for name, w in weights.items()}


@dataclass(frozen=True, slots=True)
class ZeroShotCalibrations:
    """A calibration file's entries, by (engine, model, question type)."""

    entries: Mapping[tuple[str, str, str], ZeroShotCalibration]
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The file's top-level keys other than ``calibrations`` (format, version, date, script)."""

    def get(self, engine: str, model: str, kind: str) -> ZeroShotCalibration | None:
        return self.entries.get((engine, model, kind))

    def apply(self, probs: Mapping[str, float], *, engine: str, model: str, kind: str) -> dict[str, float]:
        """``probs`` calibrated for this engine, model and type; as they are when the file has none."""
        found = self.get(engine, model, kind)
        return found.apply(probs) if found is not None else dict(probs)


_FORMS: dict[str, tuple[str, ...]] = {"noul": ("identity", "platt"), "choice": ("identity", "temperature"),
                                      "score": ("identity", "temperature")}  # fmt: skip


def _number(params: Mapping[str, Any], key: str, default: float, path: str, at: str) -> float:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{key} must be a finite number, not {value!r}", path=path, key=f"{at}.params.{key}")
    return float(value)


def _entry(raw: Any, path: str, at: str) -> ZeroShotCalibration:
    if not isinstance(raw, dict):
        raise ConfigError("a calibration must be an object", path=path, key=at)
    for key in ("engine", "model", "kind", "form"):
        if not isinstance(raw.get(key), str):
            raise ConfigError(f"{key} must be a string", path=path, key=f"{at}.{key}")
    kind, form = raw["kind"], raw["form"]
    if kind not in get_args(Kind):
        raise ConfigError(f"unknown question type {kind!r}", path=path, key=f"{at}.kind")
    if form not in _FORMS[kind]:
        raise ConfigError(f"form {form!r} is not one for {kind} questions", path=path, key=f"{at}.form")
    params = raw.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError("params must be an object", path=path, key=f"{at}.params")
    slope = _number(params, "slope", 1.0, path, at)
    k_min, k_max = _number(params, "k_min", 2, path, at), _number(params, "k_max", 1000, path, at)
    if slope <= 0:
        raise ConfigError("slope must be positive (it keeps the order of P(yes))", path=path, key=f"{at}.params.slope")
    ceiling = _number(params, "ceiling", 1.0, path, at)
    if not 0.5 <= ceiling <= 1.0:
        raise ConfigError("ceiling must be within 0.5 and 1", path=path, key=f"{at}.params.ceiling")
    if not 2 <= k_min <= k_max:
        raise ConfigError("k_min and k_max must be 2 <= k_min <= k_max", path=path, key=f"{at}.params.k_min")
    info = {k: v for k, v in raw.items() if k not in ("engine", "model", "kind", "form", "params")}
    return ZeroShotCalibration(
        engine=raw["engine"],
        model=raw["model"],
        kind=kind,
        form=form,
        beta0=_number(params, "beta0", 1.0, path, at),
        beta_log_k=_number(params, "beta_log_k", 0.0, path, at),
        k_min=int(k_min),
        k_max=int(k_max),
        slope=slope,
        bias=_number(params, "bias", 0.0, path, at),
        ceiling=ceiling,
        info=info,
    )


def load_zero_shot_calibrations(path: Path) -> ZeroShotCalibrations:
    """Read a calibration file (the format ``bench/fit_zero_shot.py`` writes).

    Raises:
        ConfigError: the file is missing, not JSON, of another format, or has a bad entry.
    """
    where = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the zero-shot calibration: {exc}", path=where) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConfigError(f"not a {FORMAT} file", path=where, key="format")
    raw = data.get("calibrations")
    if not isinstance(raw, list):
        raise ConfigError("calibrations must be a list", path=where, key="calibrations")
    entries: dict[tuple[str, str, str], ZeroShotCalibration] = {}
    for i, item in enumerate(raw):
        entry = _entry(item, where, f"calibrations.{i}")
        key = (entry.engine, entry.model, entry.kind)
        if key in entries:
            raise ConfigError(f"a second calibration for {key}", path=where, key=f"calibrations.{i}")
        entries[key] = entry
    return ZeroShotCalibrations(entries, {k: v for k, v in data.items() if k != "calibrations"})


@cache
def shipped_zero_shot_calibrations() -> ZeroShotCalibrations:
    """The calibrations installed with fastslow (read once)."""
    return load_zero_shot_calibrations(Path(str(files("fastslow.engines.embedded").joinpath(CALIBRATION_FILE))))


def calibrate_zero_shot(probs: Mapping[str, float], *, engine: str, model: str, kind: str) -> dict[str, float]:
    """``probs`` with the shipped calibration of ``engine``/``model`` for questions of ``kind`` applied."""
    return shipped_zero_shot_calibrations().apply(probs, engine=engine, model=model, kind=kind)
