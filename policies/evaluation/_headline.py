"""The one-line summary of an evaluation run (``fastslow eval`` prints it), from its predictions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ._predictions import read_predictions

__all__ = ["Headline", "headline"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Headline:
    """The one-line summary of a run, from its predictions (weighted by the rows' weights)."""

    rows: int
    labelled: int
    """Predictions with a label (the scored ones)."""
    accuracy: float | None
    """System 1's answer against the label, over labelled predictions (no answer counts as wrong)."""
    kept_share: float | None
    """Share of labelled predictions whose System-1 answer was kept under the run's thresholds."""
    kept_accuracy: float | None
    """Accuracy over the kept ones."""
    predictions: int
    errors: int
    """Predictions without an answer because System 1 failed."""
    first_error: str | None = None

    def __str__(self) -> str:
        def share(value: float | None) -> str:
            return "n/a" if value is None else f"{value:.1%}"

        text = (
            f"rows {self.rows}, labelled {self.labelled}: accuracy {share(self.accuracy)}, "
            f"kept {share(self.kept_share)} (accuracy {share(self.kept_accuracy)})"
        )
        return text + (f", {self.errors} engine errors" if self.errors else "")


def headline(out_dir: Path) -> Headline:
    """Accuracy, kept share and kept accuracy of the run in ``out_dir``."""
    rows: set[str] = set()
    labelled = errors = predictions = 0
    first_error: str | None = None
    total = right = kept = kept_right = 0.0
    for p in read_predictions(out_dir):
        rows.add(p.row)
        predictions += 1
        if p.error is not None:
            errors += 1
            first_error = first_error or p.error
        if p.label is None:
            continue
        labelled += 1
        total += p.weight
        right += p.weight * (p.correct is True)
        if p.kept:
            kept += p.weight
            kept_right += p.weight * (p.correct is True)
    return Headline(
        rows=len(rows),
        labelled=labelled,
        accuracy=right / total if total else None,
        kept_share=kept / total if total else None,
        kept_accuracy=kept_right / kept if kept else None,
        predictions=predictions,
        errors=errors,
        first_error=first_error,
    )
