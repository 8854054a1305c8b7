"""``fastslow calibrate``: a task's calibration (task-wide and per question) fitted on labelled decisions.

A temperature always, and a Platt or isotonic map of the top probability where the fit split is
large enough (``fit_calibration``); it replaces the current calibration, so the decisions are
first restated without it (``reexpress``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastslow.policies.evaluation import Prediction
from fastslow.router import Calibration, Isotonic, Platt

from ._calibrate import ISOTONIC_MIN_ROWS, PLATT_MIN_ROWS, CalibrationFit, Method, fit_calibration, reexpress
from ._collect import Collected
from ._fit import MAP_KEYS, REMOVE, Fit, base_record, labelled
from ._select import Labelled, TooFewLabels

__all__ = ["calibrate_task"]


def calibrate_task(c: Collected, data: str | Path, *, method: Method = "auto") -> Fit:
    """A calibration for each of the task's questions with labelled decisions, and for the task as a whole.

    Each is a temperature and, where ``method`` and the number of decisions allow, a Platt or
    isotonic map of the top probability (``fit_calibration``). It replaces the current one, map
    and all: the decisions are first restated without the current map (``reexpress``).

    Raises:
        TooFewLabels: no question has decisions in both splits, or ``method`` asks for a map the
            task's fit split is too small for (a question too small for it gets a temperature alone).
    """
    current = c.task.calibration
    name = c.task.name
    record: dict[str, Any] = {**base_record("calibrate", c, data), "method": "temperature", "questions": {}}
    edits: list[tuple[tuple[str, ...], Any]] = []
    lines: list[str] = []
    questions = sorted({p.question for p in c.fit} & {p.question for p in c.held_out})
    if not questions:
        raise TooFewLabels("calibration needs labelled decisions of one question in both the fit and held-out split")

    def fit_under(fit: Sequence[Prediction], held: Sequence[Prediction], under: float, asked: Method) -> CalibrationFit:
        return fit_calibration(
            _restated(fit, current, under),
            _restated(held, current, under),
            method=asked,
            base_temperature=under,
            decided=labelled(held),
        )

    whole = fit_under(c.fit, c.held_out, current.temperature, method)
    here = ("tasks", name, "calibration")
    edits += [(here + ("temperature",), whole.calibration.temperature), *_map_edits(here, whole.calibration)]
    record.update(method=whole.method, asked=method, held_out=_figures_record(whole))
    if whole.scores:
        record["cv_brier"] = {m: round(v, 5) for m, v in whole.scores.items()}
    lines += [_fit_line(name, whole), f"  {whole.reason}"]
    own: dict[str, Calibration] = {}
    if len(questions) > 1:
        for q in questions:
            fit_q = [p for p in c.fit if p.question == q]
            held_q = [p for p in c.held_out if p.question == q]
            try:
                one = fit_under(fit_q, held_q, current.for_question(q).temperature, method)
            except TooFewLabels:
                needed = PLATT_MIN_ROWS if method == "platt" else ISOTONIC_MIN_ROWS
                one = fit_under(fit_q, held_q, current.for_question(q).temperature, "temperature")
                one = replace(one, reason=f"temperature alone: {len(fit_q)} fit decisions, {method} needs {needed}")
            own[q] = one.calibration
            record["questions"][q] = {"method": one.method, **_figures_record(one)}
            lines += [_fit_line(f"{name}.{q}", one), f"  {one.reason}"]
    else:
        record.pop("questions")
        if questions[0] in current.questions:
            # The question's own entry would hide the task-wide fit from it: it gets the same fit.
            own[questions[0]] = whole.calibration
    if own:
        edits.append((here + ("questions",), {q: _calibration_yaml(cal) for q, cal in own.items()}))
    edits.append((("tasks", name, "fitted", "calibration"), record))
    return Fit(edits=edits, record=record, lines=lines)


def _restated(predictions: Sequence[Prediction], current: Calibration, temperature: float) -> list[Labelled]:
    """The decisions as ``temperature`` alone gives them, each undone from the calibration it was decided under."""
    return [
        replace(row, probabilities=reexpress(p.probabilities, current.for_question(p.question), temperature))
        for p, row in zip(predictions, labelled(predictions), strict=True)
    ]


def _calibration_yaml(calibration: Calibration) -> dict[str, Any]:
    """A question's calibration as its policy-file mapping (``temperature`` and ``platt`` or ``isotonic``)."""
    out: dict[str, Any] = {"temperature": calibration.temperature}
    g = calibration.confidence_map
    if isinstance(g, Platt):
        out["platt"] = {"a": g.a, "b": g.b}
    elif isinstance(g, Isotonic):
        out["isotonic"] = [[x, y] for x, y in zip(g.x, g.y, strict=True)]
    return out


def _map_edits(at: tuple[str, ...], calibration: Calibration) -> list[tuple[tuple[str, ...], Any]]:
    """Write the map ``calibration`` has under ``at``, removing the other one (or both, when it has none)."""
    written = _calibration_yaml(calibration)
    return [(at + (key,), written.get(key, REMOVE)) for key in MAP_KEYS]


def _figures_record(f: CalibrationFit) -> dict[str, Any]:
    def one(x: Any) -> dict[str, float]:
        return {"ece": round(x.ece, 4), "brier": round(x.brier, 4), "log_loss": round(x.log_loss, 4)}

    return {"decisions": f.after.n, "before": one(f.before), "after": one(f.after)}


def _fit_line(name: str, f: CalibrationFit) -> str:
    b, a, g = f.before, f.after, f.calibration.confidence_map
    what = f"temperature {f.calibration.temperature} (x{f.factor:.3f})"
    if isinstance(g, Platt):
        what += f", platt a {g.a}, b {g.b}"
    elif isinstance(g, Isotonic):
        what += f", isotonic through {len(g.x)} points"
    return (
        f"{name}: {f.method}: {what}; held out ({a.n}): ECE {b.ece:.3f} -> {a.ece:.3f}, "
        f"Brier {b.brier:.4f} -> {a.brier:.4f}, log loss {b.log_loss:.3f} -> {a.log_loss:.3f}"
    )
