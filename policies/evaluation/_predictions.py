"""What an evaluation run writes: one prediction per row and question, and the run's own record.

A report directory holds ``predictions.jsonl`` (one ``Prediction`` per line, appended and flushed as
rows finish, so an interrupted run resumes where it stopped) and ``run.json`` (one ``RunInfo``: what
was run, on what, with which examples). The report (``metrics.json``, plots, ``summary.md``) is
computed from these two files alone, so it can be rebuilt, and two runs compared, without any engine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import IO, Any, Literal

from fastslow.router import ConfigError

__all__ = [
    "PREDICTIONS_FILE",
    "RUN_FILE",
    "Prediction",
    "RunInfo",
    "read_predictions",
    "read_run",
    "write_prediction",
    "write_run",
]

PREDICTIONS_FILE = "predictions.jsonl"
RUN_FILE = "run.json"

Kind = Literal["noul", "choice", "score"]
Verdict = Literal["allow", "review", "deny"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """System 1's answer to one question of one row, and what the router made of it."""

    row: str
    """The row's id (``EvalRow.id``)."""
    question: str
    """The question's name in the row (a task row: the task's question or rule name)."""
    kind: Kind
    options: tuple[str, ...]
    """The question's options, in order."""
    label: str | None
    """The true option; ``None`` when the row does not know it (the prediction is then not scored)."""
    answer: str | None
    """System 1's most probable option; ``None`` when it gave no distribution (an engine error)."""
    probabilities: Mapping[str, float]
    """System 1's calibrated distribution over ``options``; empty when it gave none."""
    confidence: float
    """The probability of ``answer`` (0 when there is none)."""
    kept: bool
    """Whether System 1's answer was kept (not escalated) under the thresholds in force."""
    reason: str
    """The router's reason (``confident``, ``low_confidence``, ``none_of_these``, ``timeout``, ...)."""
    outcome: str | None
    """The final decision: System 1's kept answer, System 2's, or ``None`` when nobody settled it."""
    system: Literal[1, 2]
    latency_ms: float
    """System 1's latency for the row's engine call (shared by the row's questions)."""
    threshold: float
    """The confidence threshold the decision was compared with."""
    weight: float = 1.0
    split: str | None = None
    task: str | None = None
    none_option: str | None = None
    """The question's "none of these" option, when it has one (out-of-scope detection)."""
    verdict: Verdict | None = None
    """For a check rule: allow / review / deny."""
    violation: str | None = None
    """For a check rule: the option that violates it (``yes`` for a yes/no rule)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The row's ``meta`` values a report uses (``weak_correct``, ``strong_correct``, ``type``)."""
    error: str | None = None
    """Why System 1 gave no answer, when it did not."""

    @property
    def correct(self) -> bool | None:
        """Whether System 1's answer is the label; ``None`` when unlabelled or unanswered."""
        if self.label is None or self.answer is None:
            return None
        return self.answer == self.label

    def to_json(self) -> str:
        """One line of ``predictions.jsonl``."""
        body = asdict(self)
        body["options"] = list(self.options)
        body["probabilities"] = dict(self.probabilities)
        body["meta"] = dict(self.meta)
        return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Prediction:
        """Read one line of ``predictions.jsonl`` (raises ``ValueError`` or ``TypeError`` on a bad one)."""
        body = json.loads(line)
        if not isinstance(body, dict):
            raise ValueError("a prediction is a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = set(body) - known
        if unknown:
            raise ValueError(f"unknown prediction fields: {sorted(unknown)}")
        body["options"] = tuple(body["options"])
        if not all(math.isfinite(float(p)) for p in body["probabilities"].values()):
            raise ValueError("probabilities must be finite")
        return cls(**body)


def write_prediction(fh: IO[str], prediction: Prediction) -> None:
    """Append one prediction and flush, so an interrupted run loses at most the line being written."""
    fh.write(prediction.to_json() + "\n")
    fh.flush()


def read_predictions(directory: Path) -> Iterator[Prediction]:
    """Every complete prediction of a report directory, in file order.

    A last line cut short by an interruption is ignored (the run will redo its row); any other bad
    line is a ``ConfigError`` naming the file and line.
    """
    path = directory / PREDICTIONS_FILE
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as fh:
        lines = fh.readlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield Prediction.from_json(line)
        except (ValueError, TypeError, KeyError) as exc:
            if number == len(lines) and not line.endswith("\n"):
                return  # the interrupted write of the last row
            raise ConfigError(f"not a prediction: {exc}", path=str(path), line=number) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInfo:
    """``run.json``: what a run evaluated, how, and what it left out."""

    data: str
    """The evaluation file's path, as given."""
    data_sha256: str
    """sha256 of the file's bytes: a resumed or compared run must be over the same rows."""
    engine: str
    """The System-1 engine (``embedded``, ``jev``, ...)."""
    model: str = ""
    """The engine's model(s), as its answers name them."""
    policy: str | None = None
    """The policy file, when one was used."""
    policy_version: str | None = None
    task: str | None = None
    """The task every row was run as (``--task``), if any."""
    split: str | None = None
    """Only rows of this split were run (``--split``), if set."""
    rows: int = 0
    """Rows run (after filters and dropped rows)."""
    problems: tuple[str, ...] = ()
    """Rows of the file that could not be read, one line each (``line N: why``)."""
    examples: Mapping[str, int] = field(default_factory=dict)
    """Question name -> how many labelled examples the engine was trained with for it."""
    dropped_training_rows: tuple[str, ...] = ()
    """Ids of rows left out because their state is one of the engine's training examples."""
    started_at: str = ""
    finished_at: str | None = None
    """``None`` while the run is incomplete."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """Anything else that shaped the run (concurrency, thresholds source, fastslow version)."""

    def to_json(self) -> str:
        body = asdict(self)
        body["problems"] = list(self.problems)
        body["dropped_training_rows"] = list(self.dropped_training_rows)
        body["examples"] = dict(self.examples)
        body["settings"] = dict(self.settings)
        return json.dumps(body, ensure_ascii=False, indent=1, allow_nan=False)


def write_run(directory: Path, run: RunInfo) -> None:
    """Write ``run.json`` atomically (a temporary file, then a rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (RUN_FILE + ".tmp")
    tmp.write_text(run.to_json() + "\n", encoding="utf-8")
    tmp.replace(directory / RUN_FILE)


def read_run(directory: Path) -> RunInfo:
    """Read ``run.json`` of a report directory.

    Raises:
        ConfigError: it is missing or not a run record.
    """
    path = directory / RUN_FILE
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"not a report directory (no readable {RUN_FILE}): {exc}", path=str(directory)) from None
    if not isinstance(body, dict):
        raise ConfigError(f"{RUN_FILE} is not a JSON object", path=str(path))
    known = {f.name for f in fields(RunInfo)}
    try:
        return RunInfo(
            **{
                **{k: v for k, v in body.items() if k in known},
                "problems": tuple(body.get("problems", ())),
                "dropped_training_rows": tuple(body.get("dropped_training_rows", ())),
            }
        )
    except TypeError as exc:
        raise ConfigError(f"{RUN_FILE} is not a run record: {exc}", path=str(path)) from None
