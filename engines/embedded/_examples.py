"""Labelled examples per question and option, read from a JSON or YAML file.

    questions:
      route:                      # the question's name in calls
        examples:
          billing: ["I was charged twice", ...]
          technical: [...]
        none_of_these: other      # optional: the option meaning "none of these" (out of scope)
      is_injection:               # a noul: options yes / no
        check: true               # optional: a policy-check rule (read window by window, background negatives)
        examples: {yes: [...], no: [...]}

Every scalar is read as text: ``yes``/``no``/``on``/``off`` stay strings (YAML 1.1 would make them
booleans) and ``404`` stays ``"404"``. Errors name the file, the line and the dotted key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from fastslow.router import ConfigError

__all__ = ["ExampleSet", "QuestionExamples", "examples_from_mapping", "load_examples"]

_NOUL_ALIASES = {"true": "yes", "false": "no"}


@dataclass(frozen=True, slots=True, kw_only=True)
class QuestionExamples:
    """The examples of one question."""

    name: str
    examples: Mapping[str, tuple[str, ...]]
    """Option name -> example texts, in file order."""
    none_option: str | None = None
    """The option meaning "none of these": the open-set score's probability goes to it."""
    violation: str | None = None
    """Set for a policy-check rule: the option meaning "violated" (``yes``). Such a rule reads a
    state window by window and, when ``background`` holds, learns against the shipped background."""
    background: bool = True

    @property
    def options(self) -> tuple[str, ...]:
        return tuple(self.examples)

    @property
    def fingerprint(self) -> str:
        """sha256 of the options, texts and role: questions with equal ones share one trained head."""
        role = [self.none_option, self.violation, self.background]
        return hashlib.sha256(json.dumps([self.examples, role], sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class ExampleSet:
    """Every question's examples, and where they came from."""

    questions: Mapping[str, QuestionExamples]
    source: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    """Task -> the version of the learned examples merged in (``fastslow.engines.LearnedSet``)."""


def _flag(value: object) -> object:
    # The loader keeps every scalar a string (so option "yes" stays "yes"); flags read it back.
    if isinstance(value, str) and value.lower() in {"true", "false"}:
        return value.lower() == "true"
    return value


_Flag = Annotated[bool, BeforeValidator(_flag)]


class _Question(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    examples: dict[str, list[str]] = Field(min_length=2)
    none_of_these: str | None = None
    check: _Flag = False
    background: _Flag = True


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    version: str | None = None
    questions: dict[str, _Question] = Field(min_length=1)


class _TextLoader(yaml.SafeLoader):
    """A safe loader that resolves only ``null``: every other scalar stays a string."""


_TextLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag == "tag:yaml.org,2002:null"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _duplicate_keys(node: yaml.Node, path: tuple[str, ...] = ()) -> tuple[int, str] | None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                return key.start_mark.line + 1, ".".join((*path, name))
            seen.add(name)
            found = _duplicate_keys(value, (*path, name))
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_keys(item, (*path, str(i)))
            if found:
                return found
    return None


def _line_of(node: yaml.Node | None, loc: Sequence[int | str]) -> int | None:
    """The 1-based line of the deepest node along ``loc`` (a pydantic error location)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if match is None:
                return line
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _build(model: _File, source: str | None) -> ExampleSet:
    questions: dict[str, QuestionExamples] = {}
    for name, body in model.questions.items():
        examples = {option: tuple(t.strip() for t in texts) for option, texts in body.examples.items()}
        if set(examples) == set(_NOUL_ALIASES):  # true/false, as on Jev's wire, mean yes/no
            examples = {_NOUL_ALIASES[o]: texts for o, texts in examples.items()}
        questions[name] = QuestionExamples(
            name=name,
            examples=examples,
            none_option=body.none_of_these,
            violation="yes" if body.check else None,
            background=body.background,
        )
    return ExampleSet(questions=questions, source=source)


def _validate(data: Any, *, source: str | None, root: yaml.Node | None) -> ExampleSet:
    if not isinstance(data, Mapping):
        raise ConfigError("an examples file is a mapping with a 'questions' key", path=source, line=_line_of(root, []))
    try:
        model = _File.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # A misspelt key also makes the right one "missing": report the misspelling, the cause.
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("["))]
        key = ".".join(str(p) for p in loc) or None
        raise ConfigError(err["msg"], path=source, line=_line_of(root, loc), key=key) from None
    for name, body in model.questions.items():
        for option, texts in body.examples.items():
            where: list[int | str] = ["questions", name, "examples", option]
            problem = None
            if not option.strip():
                problem = "option names must be non-empty"
            elif not texts:
                problem = f"option {option!r} has no examples"
            else:
                blank = next((i for i, t in enumerate(texts) if not t.strip()), None)
                if blank is not None:
                    where.append(blank)
                    problem = "examples must be non-empty text"
            if problem:
                raise ConfigError(problem, path=source, line=_line_of(root, where), key=".".join(map(str, where)))
    return _build(model, source)


def examples_from_mapping(data: Mapping[str, Any], *, source: str | None = None) -> ExampleSet:
    """Validate examples already in memory (``{"questions": {...}}``), as a file would be."""
    return _validate(data, source=source, root=None)


def load_examples(path: str | Path) -> ExampleSet:
    """Read and validate an examples file (``.json``, ``.yaml`` or ``.yml``).

    Raises:
        ConfigError: the file is missing, unparsable or invalid; ``path``, ``line`` and ``key`` say where.
    """
    path = Path(path)
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read examples file: {exc}", path=where) from None
    if path.suffix.lower() == ".json":
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"invalid JSON: {exc.msg}", path=where, line=exc.lineno) from None
    try:
        root = yaml.compose(text, Loader=_TextLoader)  # JSON is YAML too: this gives lines for both
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else None
        raise ConfigError(f"invalid YAML: {exc.problem}", path=where, line=line) from None
    if root is None:
        raise ConfigError("examples file is empty", path=where, line=1)
    duplicate = _duplicate_keys(root)
    if duplicate is not None:
        raise ConfigError("duplicate key", path=where, line=duplicate[0], key=duplicate[1])
    data = yaml.load(text, Loader=_TextLoader)  # noqa: S506 - a SafeLoader subclass
    return _validate(data, source=where, root=root)
