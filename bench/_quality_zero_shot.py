"""Section 7 of ``bench/quality.py``: the zero-shot calibration's own evaluation, from ``bench/fit_zero_shot.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _quality_core import REPO, Context

from fastslow.engines.embedded.tools import load_zero_shot_calibrations

# -- 7. Zero-shot calibration ----------------------------------------------------------------------------


def zero_shot(ctx: Context) -> dict[str, Any] | None:
    """fit_zero_shot.py's evaluation of the shipped calibration (raw against calibrated), or ``None`` without it."""
    try:
        import fit_zero_shot as fz
    except ImportError as exc:
        ctx.runs.errors.append(f"zero-shot: bench/fit_zero_shot.py not importable: {exc}")
        return None
    work = ctx.runs.work / "zeroshot"
    embedders = ctx.plan.embedders
    raw = fz.Raw(fz.RawCache(work / "cache"), embedders)
    if ctx.plan.zero_shot_sets is None:
        # A set drawn from a fit set's source counts only under a calibration refitted without that
        # source, which fit_zero_shot.py --evaluate measures; under the shipped one it would flatter.
        sets = fz.eval_sets(ctx.bench.data, work, ctx.plan.zero_shot_rows)
        sets = {name: items for name, items in sets.items() if name not in fz.HELD_OUT_SOURCE}
    else:
        sets = {name: _zero_shot_set(fz, ctx, work, name) for name in ctx.plan.zero_shot_sets}
    raw.fill([it for items in sets.values() for it in items], "zero-shot evaluation sets")
    calibrations = load_zero_shot_calibrations(fz.SHIPPED)
    return {
        "calibration": str(fz.SHIPPED.relative_to(REPO)),
        "rows_per_set": ctx.plan.zero_shot_rows,
        "sets": fz.evaluate(raw, sets, calibrations),
    }


def _zero_shot_set(fz: Any, ctx: Context, work: Path, name: str) -> list[Any]:
    """One of fit_zero_shot.py's evaluation sets, small (for --quick)."""
    n = ctx.plan.zero_shot_rows
    if name == "xstest-all":
        rows = [r for s in ("train", "validation", "test") for r in fz._rows("xstest", ctx.bench.data, work, s, None)]
        return list(fz._labelled(name, rows[:n]))
    return list(fz._labelled(name, fz._rows(name, ctx.bench.data, work, "test", n)))
