"""What a fit is: the edits it makes to the policy file, the record written beside them, how it is shown.

``tune`` and ``calibrate_task`` each return a ``Fit``; ``apply_fit`` makes its edits through a
``PolicyEditor`` (comments, order and formatting of everything else kept) and ``plot_fit`` draws
tune's accuracy-coverage path. The record (``fitted:`` in the task) names the data, engine,
embedder and policy version it was measured on, so ``fit_mismatches`` and ``drift`` can compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastslow.policies.evaluation import Prediction

from ._collect import Collected
from ._log import SAMPLE_WORDS
from ._select import Labelled, ThresholdChoice
from ._yaml_edit import PolicyEditor

__all__ = ["MAP_KEYS", "REMOVE", "Fit", "apply_fit", "plot_fit"]

MAP_KEYS = ("platt", "isotonic")
"""The policy file's keys of a confidence map; a calibration has at most one."""


class _Remove:
    def __repr__(self) -> str:
        return "REMOVE"


REMOVE: Any = _Remove()
"""An edit's value that takes its key out of the policy file (``apply``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """What a command fitted: the edits to make, the record written beside them, and lines for people."""

    edits: list[tuple[tuple[str, ...], Any]]
    record: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    curve: ThresholdChoice | None = None
    warnings: list[str] = field(default_factory=list)
    """What the fit cannot vouch for (``fastslow tune`` prints each as ``warning: ...`` on stderr)."""


def now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def labelled(predictions: Sequence[Prediction]) -> list[Labelled]:
    return [
        Labelled(
            probabilities=dict(p.probabilities),
            label=str(p.label),
            none_option=p.none_option,
            weight=p.weight,
        )
        for p in predictions
    ]


def base_record(command: str, c: Collected, data: str | Path) -> dict[str, Any]:
    record: dict[str, Any] = {
        "by": f"fastslow {command}",
        "date": now(),
        "data": str(data),
        "data_sha256": c.info.data_sha256[:16],
        "rows_fit": len({p.row for p in c.fit}),
        "rows_held_out": len({p.row for p in c.held_out}),
        "engine": c.info.engine,
        "model": c.info.model,
        "embedder": c.embedder,
        "policy_version": c.info.policy_version,
    }
    if c.source == "log":
        del record["data_sha256"]
        record["sample"] = SAMPLE_WORDS[c.sample or "all"]
    return record


def plot_fit(fit: Fit, path: Path, task: str) -> bool:
    """Draw tune's accuracy-coverage path (held out) to ``path``; ``False`` when there is none to draw."""
    from fastslow.policies.evaluation import plot_tuning

    choice = fit.curve
    if choice is None:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    curve = choice.curve
    chosen = next(
        i for i, p in enumerate(curve) if (p.min_confidence, p.min_margin) == (choice.min_confidence, choice.min_margin)
    )
    plot_tuning(
        path,
        [p.kept for p in curve],
        [p.accuracy for p in curve],
        [p.lower for p in curve],
        target=choice.target,
        chosen=chosen,
        title=f"fastslow tune: {task}, held out ({choice.n_held_out} decisions, {choice.level:.0%} bound)",
    )
    return True


def apply_fit(editor: PolicyEditor, fit: Fit) -> None:
    """Make ``fit``'s edits; a rule written as a bare question becomes a mapping to take its bands.

    An edit whose value is ``REMOVE`` takes its key out. A task calibration left without a map of
    its own while the file's ``defaults`` give one gets ``null`` for it, so that it runs as fitted.
    """
    removed: dict[tuple[str, ...], set[str]] = {}
    for keys, value in fit.edits:
        if value is REMOVE:
            editor.remove(keys)
            removed.setdefault(keys[:-1], set()).add(keys[-1])
            continue
        if len(keys) == 5 and keys[2] == "rules":
            editor.expand(keys[:4], "instructions")
        editor.set(keys, value)
    for at, gone in removed.items():
        if at[:1] == ("tasks",) and at[-1:] == ("calibration",) and gone >= set(MAP_KEYS):
            for key in MAP_KEYS:
                node = editor.get(("defaults", "calibration", key))
                if node is not None and node.tag != "tag:yaml.org,2002:null":
                    editor.set((*at, key), None)
