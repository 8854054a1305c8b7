"""The evaluation file: JSON Lines of labelled states, read and checked row by row.

A row is either explicit (``questions`` in Jev's ``/v1/systemone`` shape, so any engine can be asked
them) or names a policy ``task`` whose questions it takes. See ``docs/evaluation.md``.

A bad row never stops the reader: it is left out and reported with its line number, unless
``strict=True``, where the first one raises ``ConfigError`` naming the file, the line and the key.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias, get_args

from fastslow.policies._base import suggest
from fastslow.router import (
    CheckTask,
    ClassifyTask,
    ConfigError,
    InvalidRequest,
    Noul,
    PolicySet,
    Question,
    RouteTask,
    Score,
    State,
)
from fastslow.router.engine_api import questions_from_wire, validate_state

__all__ = ["SPLITS", "EvalRow", "RowProblem", "RowsRead", "Split", "normalise_label", "read_rows"]

Split: TypeAlias = Literal["train", "validation", "test"]
SPLITS: tuple[Split, ...] = get_args(Split)

_KEYS = ("id", "task", "state", "questions", "labels", "label", "weight", "meta")
_NOUL_LABELS: dict[object, str] = {"yes": "yes", "no": "no", "true": "yes", "false": "no", True: "yes", False: "no"}
_SHOWN_OPTIONS = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalRow:
    """One labelled state: the questions to ask about it and the true option of some of them."""

    id: str
    """The row's ``id``, else ``line-N``; unique within its file."""
    line: int
    """1-based line of the row in its file."""
    state: State
    questions: Mapping[str, Question]
    """Every question an engine is asked; a task row's are its task's (see ``docs/evaluation.md``)."""
    labels: Mapping[str, str]
    """Question name -> true option, as the question's ``options`` spell it. Questions without a
    label here are unknown for this row and are not scored (OpenAI moderation's missing keys)."""
    weight: float = 1.0
    meta: Mapping[str, Any] = field(default_factory=dict)
    task: str | None = None
    """The policy task the row names; ``None`` for an explicit row."""

    @property
    def split(self) -> Split | None:
        """``meta.split``, when the row has one."""
        split = self.meta.get("split")
        return split if split in SPLITS else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RowProblem:
    """Why one line of the file was left out."""

    line: int
    message: str
    key: str | None = None
    """Dotted key inside the row, such as ``labels.intent``, when one is at fault."""

    def __str__(self) -> str:
        suffix = f" (key {self.key!r})" if self.key else ""
        return f"line {self.line}: {self.message}{suffix}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RowsRead:
    """What ``read_rows`` found: the good rows, in file order, and one problem per bad line."""

    path: str
    rows: tuple[EvalRow, ...]
    problems: tuple[RowProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def in_split(self, split: Split) -> tuple[EvalRow, ...]:
        """The rows whose ``meta.split`` is ``split``."""
        return tuple(row for row in self.rows if row.split == split)


class _Bad(Exception):
    """One row's first problem; caught per line, never escapes the reader."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


def _options_text(options: tuple[str, ...]) -> str:
    shown = ", ".join(options[:_SHOWN_OPTIONS])
    return shown + (f", ... ({len(options)} in all)" if len(options) > _SHOWN_OPTIONS else "")


def normalise_label(question: Question, value: object) -> str | None:
    """``value`` as one of ``question.options``, or ``None`` when it names none of them.

    A yes/no label may also be written ``true``/``false`` (JSON booleans or text, as on Jev's
    wire), and a score label as a level index (number or text) or as the level's text.
    """
    if isinstance(question, Noul):
        # Only text and booleans: ``1 == True`` would otherwise make the number 1 a "yes".
        if isinstance(value, str):
            return _NOUL_LABELS.get(value.lower())
        return _NOUL_LABELS.get(value) if isinstance(value, bool) else None
    if isinstance(question, Score):
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and value not in question.options and value in question.levels:
            value = str(question.levels.index(value))
    return value if isinstance(value, str) and value in question.options else None


def _refuse_constant(name: str) -> float:
    # NaN and Infinity are not JSON, though Python's reader takes them.
    raise ValueError(f"{name} is not JSON")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _parse(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise _Bad(f"not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise _Bad("not JSON this reader can take: nested too deeply") from None
    except ValueError as exc:
        raise _Bad(f"not JSON: {exc}") from None


class _Reader:
    """Checks rows one at a time; remembers ids and parsed questions across them."""

    def __init__(self, policy: PolicySet | Callable[[], PolicySet] | None) -> None:
        self._policy = policy
        self._first_line_of: dict[str, int] = {}
        # Rows often share one questions object: parse each once and share the result.
        self._parsed: dict[str, Mapping[str, Question]] = {}
        self._last: tuple[Any, Mapping[str, Question]] | None = None

    def row(self, text: str, line: int) -> EvalRow:
        body = _parse(text)
        if not isinstance(body, dict):
            raise _Bad(f"a row must be a JSON object, not {_json_type(body)}")
        for key in body:
            if key not in _KEYS:
                raise _Bad(f"unknown key {key!r}{suggest(key, _KEYS)}", key)
        row_id = self._id(body, line)
        if "state" not in body:
            raise _Bad("missing required key 'state'", "state")
        try:
            state = validate_state(body["state"])
        except InvalidRequest as exc:
            raise _Bad(exc.message, "state") from None
        task, questions = self._questions(body)
        labels = self._labels(body, task, questions)
        weight = _weight(body.get("weight", 1.0))
        meta = body.get("meta", {})
        if not isinstance(meta, dict):
            raise _Bad(f"meta must be an object, not {_json_type(meta)}", "meta")
        if "split" in meta and meta["split"] not in SPLITS:
            raise _Bad(f"meta.split must be one of {', '.join(SPLITS)}, not {meta['split']!r}", "meta.split")
        self._first_line_of[row_id] = line  # only now: a bad row does not claim its id
        return EvalRow(
            id=row_id,
            line=line,
            state=state,
            questions=questions,
            labels=labels,
            weight=weight,
            meta=meta,
            task=task.name if task is not None else None,
        )

    def _id(self, body: Mapping[str, Any], line: int) -> str:
        row_id = body.get("id", f"line-{line}")
        if not isinstance(row_id, str) or not row_id:
            raise _Bad(f"id must be a non-empty string, not {row_id!r}", "id")
        if row_id in self._first_line_of:
            raise _Bad(f"duplicate id {row_id!r} (first on line {self._first_line_of[row_id]})", "id")
        return row_id

    def _questions(
        self, body: Mapping[str, Any]
    ) -> tuple[RouteTask | ClassifyTask | CheckTask | None, Mapping[str, Question]]:
        if "task" in body and "questions" in body:
            raise _Bad("a row gives either questions or a task, not both", "questions")
        if "task" in body:
            return self._task(body["task"])
        if "questions" not in body:
            raise _Bad("missing required key 'questions' (or 'task', to take a policy task's questions)", "questions")
        raw = body["questions"]
        if self._last is not None and self._last[0] == raw and _same_order(self._last[0], raw):
            return None, self._last[1]  # the common case: a converted file repeats one questions object
        cache_key = json.dumps(raw, ensure_ascii=False, separators=(",", ":"))
        questions = self._parsed.get(cache_key)
        if questions is None:
            try:
                questions = questions_from_wire(raw)
            except InvalidRequest as exc:
                raise _Bad(exc.message, exc.field) from None
            self._parsed[cache_key] = questions
        self._last = (raw, questions)
        return None, questions

    def _task(self, name: Any) -> tuple[RouteTask | ClassifyTask | CheckTask, Mapping[str, Question]]:
        if not isinstance(name, str):
            raise _Bad(f"task must be a task name, not {_json_type(name)}", "task")
        if self._policy is None:
            raise _Bad(f"the row names task {name!r}, but no policy was given to read its questions from", "task")
        if callable(self._policy):
            self._policy = self._policy()  # a ConfigError (a bad policy file) ends the read
        task = self._policy.tasks.get(name)
        if task is None:
            known = sorted(self._policy.tasks)
            raise _Bad(f"unknown task {name!r}; the policy has {', '.join(known)}{suggest(name, known)}", "task")
        if isinstance(task, RouteTask):
            return task, {task.name: task.question}
        if isinstance(task, ClassifyTask):
            return task, dict(task.questions)
        return task, {rule.name: rule.question for rule in task.rules.values()}

    def _labels(
        self,
        body: Mapping[str, Any],
        task: RouteTask | ClassifyTask | CheckTask | None,
        questions: Mapping[str, Question],
    ) -> dict[str, str]:
        raw = body.get("labels")
        if "label" in body:
            if not isinstance(task, RouteTask):
                raise _Bad("label (one option) is for route-task rows; use labels: {question: option}", "label")
            if raw is not None:
                raise _Bad("a row gives either label or labels, not both", "label")
            raw = {task.name: body["label"]}
        if raw is None:
            raise _Bad("missing required key 'labels'", "labels")
        if not isinstance(raw, dict) or not raw:
            raise _Bad("labels must be a non-empty object {question: true option}", "labels")
        out: dict[str, str] = {}
        for name, value in raw.items():
            key = "label" if "label" in body else f"labels.{name}"
            question = questions.get(name)
            if question is None:
                names = list(questions)
                raise _Bad(
                    f"label for unknown question {name!r}; the questions are {_options_text(tuple(names))}"
                    f"{suggest(name, names)}",
                    key,
                )
            option = normalise_label(question, value)
            if option is None:
                raise _Bad(
                    f"label {value!r} of question {name!r} is not one of its options "
                    f"({_options_text(question.options)}){suggest(str(value), question.options)}",
                    key,
                )
            out[name] = option
        return out


def _same_order(a: Any, b: Any) -> bool:
    """Whether two equal JSON values also list their keys in the same order (option order matters)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same_order(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return all(_same_order(x, y) for x, y in zip(a, b, strict=True))
    return True


def _weight(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"weight must be a number, not {_json_type(value)}", "weight")
    try:
        weight = float(value)
    except OverflowError:  # an integer beyond any float
        weight = math.inf
    if not math.isfinite(weight) or weight < 0.0:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:20]}... ({len(repr(value))} characters)"
        raise _Bad(f"weight must be a finite number >= 0, not {shown}", "weight")
    return weight


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _lines(path: Path) -> Iterator[tuple[int, str | None]]:
    """``(line number, text)``; text is ``None`` for a line that is not UTF-8. A ``.gz`` file is gunzipped."""
    with gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                yield number, None


def read_rows(
    path: str | Path, *, policy: PolicySet | Callable[[], PolicySet] | None = None, strict: bool = False
) -> RowsRead:
    """Read an evaluation file (JSON Lines), streaming, and check every row.

    Blank lines are skipped. Each other line is one row; a bad one is left out and reported once,
    with its 1-based line number and its first problem.

    Args:
        path: the ``.jsonl`` file.
        policy: the policy whose tasks ``task`` rows name; rows that name a task need it. A callable
            is called once, at the first such row: a file of explicit rows never loads the policy.
        strict: raise on the first problem instead of collecting them.

    Raises:
        ConfigError: the file cannot be read, or (``strict``) a row is bad; its ``path``, ``line``
            and ``key`` say where.
    """
    source = Path(path)
    shown = str(source)
    reader = _Reader(policy)
    rows: list[EvalRow] = []
    problems: list[RowProblem] = []
    try:
        for line, text in _lines(source):
            if text is not None and not text.strip():
                continue
            try:
                if text is None:
                    raise _Bad("not UTF-8 text")
                rows.append(reader.row(text, line))
            except _Bad as bad:
                if strict:
                    raise ConfigError(bad.message, path=shown, line=line, key=bad.key) from None
                problems.append(RowProblem(line=line, message=bad.message, key=bad.key))
    except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"cannot read the evaluation file: {reason}", path=shown) from None
    return RowsRead(path=shown, rows=tuple(rows), problems=tuple(problems))
