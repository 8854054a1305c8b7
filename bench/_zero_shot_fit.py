"""How ``bench/fit_zero_shot.py`` chooses and fits every calibration, and the calibration file it writes.

Each form is chosen by leave-one-set-out log loss on the fit sets; a yes/no calibration's ceiling
is read off the same held-out answers. Its own module so that ``fit_zero_shot.py`` stays small.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from _zero_shot_figures import _r, figures
from _zero_shot_forms import FORMS, _arrays, _equal_weights, _fit, _group_sizes
from _zero_shot_raw import Raw
from _zero_shot_sets import Item

from fastslow.engines.embedded.tools import (
    FORMAT,
    ZeroShotCalibration,
    ZeroShotCalibrations,
    load_zero_shot_calibrations,
)

from _data import wilson

CEILING_TOP = 0.1
"""The share of most confident held-out answers whose accuracy sets a yes/no calibration's ceiling."""


def _held_out(
    engine: str, model: str, kind: str, form: str, items: Sequence[Item], raw: list[dict[str, float]]
) -> Iterator[tuple[str, list[int], ZeroShotCalibration]]:
    """Leave one fit set out, each in turn: the set, its rows, and the calibration fitted on the others."""
    for held in sorted({i.group for i in items}):
        train = [j for j, it in enumerate(items) if it.group != held]
        tr_items = [items[j] for j in train]
        cal = _fit(engine, model, kind, form, _arrays(tr_items, [raw[j] for j in train], _equal_weights(tr_items)))
        yield held, [j for j, it in enumerate(items) if it.group == held], cal


def _loso(
    engine: str, model: str, kind: str, form: str, items: Sequence[Item], raw: list[dict[str, float]]
) -> dict[str, Any]:
    """Leave one fit set out: fit on the others, score the one left out (log loss and ECE, mean over sets)."""
    losses, eces = {}, {}
    for held, test, cal in _held_out(engine, model, kind, form, items, raw):
        got = figures([items[j] for j in test], [cal.apply(raw[j]) for j in test])
        losses[held], eces[held] = got["log_loss"], got["ece"]
    return {
        "log_loss": float(np.mean(list(losses.values()))),
        "ece": float(np.mean(list(eces.values()))),
        "by_set": {g: {"log_loss": round(losses[g], 4), "ece": round(eces[g], 4)} for g in sorted(losses)},
    }


def _ceiling(
    engine: str, model: str, form: str, items: Sequence[Item], raw: list[dict[str, float]]
) -> tuple[float, dict[str, Any]]:
    """A yes/no calibration's ceiling: what its most confident answers were worth on sets it was not fitted on.

    Leave one fit set out: fit on the others, answer the one left out; pooled over the sets, the
    ``CEILING_TOP`` most confident answers' accuracy, at its lower Wilson bound (95 %), at least 0.5.
    A set the model has no skill on then cannot get answers more confident than the model has been
    right, wherever it was.
    """
    pooled: list[tuple[float, bool]] = []
    for _held, test, cal in _held_out(engine, model, "noul", form, items, raw):
        for j in test:
            q = cal.apply(raw[j])
            answer = max(q, key=lambda o: q[o])
            pooled.append((q[answer], answer == items[j].label))
    pooled.sort(key=lambda cr: -cr[0])
    top = pooled[: max(30, int(CEILING_TOP * len(pooled)))]
    right = sum(r for _c, r in top)
    ceiling = max(0.5, wilson(right, len(top))[0])
    info = {
        "by": f"leave one fit set out: the {CEILING_TOP:.0%} most confident held-out answers' accuracy, "
        "its lower Wilson bound",
        "rows": len(top),
        "accuracy": round(right / len(top), 4) if top else None,
        "their_confidence_from": round(top[-1][0], 4) if top else None,
        "ceiling": round(ceiling, 4),
    }
    return ceiling, info


def _entry_json(cal: ZeroShotCalibration, info: dict[str, Any]) -> dict[str, Any]:
    if cal.form == "identity":
        params: dict[str, Any] = {}
    elif cal.form == "platt":
        params = {"slope": round(cal.slope, 6), "bias": round(cal.bias, 6)}
        if cal.ceiling < 1.0:
            params["ceiling"] = round(cal.ceiling, 4)
    else:
        params = {
            "beta0": round(cal.beta0, 6),
            "beta_log_k": round(cal.beta_log_k, 6),
            "k_min": cal.k_min,
            "k_max": cal.k_max,
        }
    return {"engine": cal.engine, "model": cal.model, "kind": cal.kind, "form": cal.form, "params": params, **info}


def _version() -> str:
    from importlib.metadata import version

    return version("fastslow")


def fit(
    raw: Raw,
    train: dict[str, list[Item]],
    valid: dict[str, list[Item]],
    n: int,
    kinds: Sequence[str] = ("choice", "noul"),
    keep: Path | None = None,
) -> tuple[dict[str, Any], ZeroShotCalibrations, dict[str, Any]]:
    """Choose and fit every calibration of ``kinds`` (the others kept as the calibration file ``keep`` has them).

    Returns the file's JSON, the calibrations, and a summary.
    """
    entries: list[dict[str, Any]] = []
    cals: dict[tuple[str, str, str], ZeroShotCalibration] = {}
    summary: dict[str, Any] = {}
    kept_doc = json.loads(keep.read_text(encoding="utf-8")) if keep is not None else {}
    kept = load_zero_shot_calibrations(keep).entries if keep is not None else {}
    for kind in ("choice", "noul"):
        if kind not in kinds:  # kept as the file has it
            entries += [e for e in kept_doc.get("calibrations", []) if e["kind"] == kind]
            cals.update({key: cal for key, cal in kept.items() if key[2] == kind})
            continue
        items = train[kind]
        for source in raw.sources(kind):
            engine, model = raw.engine_model(source)
            probs = [raw.get(source, it) for it in items]
            loso = {form: _loso(engine, model, kind, form, items, probs) for form in FORMS[kind]}
            # The simplest form within 0.002 nats of the best held-out log loss.
            best = min(v["log_loss"] for v in loso.values())
            form = next(f for f in FORMS[kind] if loso[f]["log_loss"] <= best + 0.002)
            cal = _fit(engine, model, kind, form, _arrays(items, probs, _equal_weights(items)))
            ceiling_info = None
            if kind == "noul" and cal.form == "platt":
                ceiling, ceiling_info = _ceiling(engine, model, form, items, probs)
                cal = replace(cal, ceiling=ceiling)
            vitems = valid[kind]
            vprobs = [raw.get(source, it) for it in vitems]
            before = figures(vitems, vprobs)
            after = figures(vitems, [cal.apply(p) for p in vprobs])
            info = {
                "fitted_on": {
                    "sets": {g: {"split": "train", "rows": c} for g, c in _group_sizes(items).items()},
                    "n": len(items),
                    "weighting": "each set weighs the same",
                    "source": "../shared/data (bench/fit_zero_shot.py)",
                },
                "selection": {
                    "by": "leave-one-set-out log loss on the fit sets: the simplest form within 0.002 nats of the best",
                    "leave_one_set_out": _r(loso),
                },
                "validation": {
                    "split": "validation of the same sets",
                    "n": len(vitems),
                    "raw": _r({k: before[k] for k in ("ece", "log_loss", "brier_skill")}),
                    "calibrated": _r({k: after[k] for k in ("ece", "log_loss", "brier_skill")}),
                },
            }
            if ceiling_info is not None:
                info["ceiling"] = ceiling_info
            entries.append(_entry_json(cal, info))
            cals[(engine, model, kind)] = cal
            summary[f"{engine}/{kind}"] = {
                "form": form,
                "params": entries[-1]["params"],
                "validation": info["validation"],
            }
    score = ZeroShotCalibration(engine="sparrow", model=raw.sparrow.model, kind="score", form="identity")
    entries.append(
        _entry_json(
            score,
            {"fitted_on": None, "note": "left as sparrow gives it: no public set with ordinal labels to fit on"},
        )
    )
    cals[("sparrow", raw.sparrow.model, "score")] = score
    document = {
        "format": FORMAT,
        "fastslow_version": _version(),
        "created": datetime.date.today().isoformat(),
        "script": "bench/fit_zero_shot.py",
        "rows_per_set": n,
        "forms": {
            "temperature": "q_i ∝ p_i ** beta, beta = beta0 + beta_log_k * ln(clip(K, k_min, k_max))",
            "platt": "logit(q_yes) = slope * logit(p_yes) + bias",
            "identity": "unchanged",
        },
        "calibrations": entries,
    }
    return document, ZeroShotCalibrations(cals), summary


def without_source(
    raw: Raw, train: Sequence[Item], cals: ZeroShotCalibrations, prefix: str
) -> tuple[ZeroShotCalibrations, dict[str, int]]:
    """The choice calibrations of ``cals``, each in its own form, refitted on the fit sets not drawn from ``prefix``.

    Returns them and the rows of each fit set they learned from.
    """
    items = [it for it in train if not it.group.startswith(prefix)]
    entries: dict[tuple[str, str, str], ZeroShotCalibration] = {}
    for source in raw.sources("choice"):
        engine, model = raw.engine_model(source)
        shipped = cals.entries[(engine, model, "choice")]
        probs = [raw.get(source, it) for it in items]
        entries[(engine, model, "choice")] = _fit(
            engine, model, "choice", shipped.form, _arrays(items, probs, _equal_weights(items))
        )
    return ZeroShotCalibrations(entries), _group_sizes(items)
