"""Read a policy file: YAML -> validated models -> ``fastslow.router.PolicySet``, with errors that name the line.

The YAML is composed into nodes first so every key path keeps the line it was written on; a pydantic
error location such as ``tasks.tool_safety.rules.delete.deny_at`` is then reported as
``policy.yaml:17: deny_at should be less than or equal to 1, got 1.5 (key 'tasks.tool_safety.rules.delete.deny_at')``.

Scalars follow YAML 1.2: only ``true``/``false`` are booleans, so ``yes:`` and ``no:`` stay the option
names they look like, and every mapping key is kept as the text that was written.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from fastslow.router import ConfigError, PolicySet

from ._convert import NeedsExamples, PolicyProblem, to_policy_set
from ._schema import PolicyFile, suggest

__all__ = ["load_policy", "parse_policy", "policy_version"]

Loc = tuple[str | int, ...]
_TASK_KINDS = frozenset({"route", "classify", "check"})
_QUESTION_TYPES = frozenset({"noul", "choice", "score"})
_BOOL = "tag:yaml.org,2002:bool"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_DROPPED = {_BOOL, _INT, _FLOAT, "tag:yaml.org,2002:timestamp"}


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core scalars: no yes/no/on/off booleans, no octal, sexagesimal or dates."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _DROPPED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(_INT, re.compile(r"^(?:[-+]?(?:0|[1-9][0-9]*)|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    _FLOAT,
    # A dot or an exponent is required, so ``017`` stays the text it looks like.
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


# libyaml's parser, where PyYAML was built with it, composes the same nodes (marks included) about
# ten times faster than the pure-Python one: a policy with thousands of examples loads, and reloads
# on every change, in milliseconds. Malformed YAML is parsed again by the pure-Python parser, so the
# messages an author sees are the same whichever parser PyYAML has.
_FAST_LOADERS: tuple[type[Any], ...] = ()
if getattr(yaml, "__with_libyaml__", False):

    class _CLoader(yaml.CSafeLoader):
        """``_Loader``'s scalars on libyaml's parser."""

    _CLoader.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers
    _FAST_LOADERS = (_CLoader,)


def _compose(text: str) -> tuple[Any, yaml.Node | None]:
    """A loader (for its constructors) and the document's root node; raises ``yaml.YAMLError``."""
    for fast in _FAST_LOADERS:
        loader = fast(text)
        try:
            return loader, loader.get_single_node()
        except yaml.YAMLError:
            pass  # the pure-Python parser below says what is wrong, in its words
        finally:
            loader.dispose()
    slow = _Loader(text)
    try:
        return slow, slow.get_single_node()
    finally:
        slow.dispose()


def policy_version(data: bytes) -> str:
    """The version a policy is recorded under: ``sha256:`` and the first 16 hex digits of its bytes' hash."""
    return "sha256:" + hashlib.sha256(data).hexdigest()[:16]


class _Builder:
    """Turns composed YAML nodes into plain data, remembering the line of every key and list item."""

    def __init__(self, loader: Any, source: str) -> None:
        self.loader = loader
        self.source = source
        self.lines: dict[Loc, int] = {(): 1}
        self._open: set[int] = set()

    def _error(self, node: yaml.Node, message: str, loc: Loc) -> ConfigError:
        return ConfigError(message, path=self.source, line=node.start_mark.line + 1, key=_dotted(loc) or None)

    def build(self, node: yaml.Node, loc: Loc = ()) -> Any:
        if id(node) in self._open:
            raise self._error(node, "a YAML alias refers to a mapping that contains it", loc)
        if isinstance(node, yaml.ScalarNode):
            return self.loader.construct_object(node)
        self._open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                items = []
                for i, item in enumerate(node.value):
                    self.lines[(*loc, i)] = item.start_mark.line + 1
                    items.append(self.build(item, (*loc, i)))
                return items
            assert isinstance(node, yaml.MappingNode)
            return self._mapping(node, loc)
        finally:
            self._open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[str, Any]:
        out: dict[str, Any] = {}
        merged: list[yaml.MappingNode] = []
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                merged.extend(s for s in sources if isinstance(s, yaml.MappingNode))
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                raise self._error(key_node, "mapping keys must be plain text", loc)
            key = str(key_node.value)
            if key in out:
                raise self._error(key_node, f"duplicate key {key!r}", (*loc, key))
            self.lines[(*loc, key)] = key_node.start_mark.line + 1
            out[key] = self.build(value_node, (*loc, key))
        # ``<<: *anchor`` fills in only the keys the mapping does not set itself (YAML merge keys).
        for source in merged:
            for key, value in self._mapping(source, loc).items():
                out.setdefault(key, value)
        return out


def _dotted(loc: Loc) -> str:
    return ".".join(str(part) for part in loc)


def _clean(loc: Loc) -> Loc:
    """Drop the segments pydantic adds for union tags and dict keys, leaving the path in the file."""
    parts = [part for part in loc if part != "[key]"]
    if len(parts) > 2 and parts[0] == "tasks" and parts[2] in _TASK_KINDS:
        del parts[2]
    if len(parts) > 4 and parts[0] == "tasks" and parts[2] in ("questions", "rules") and parts[4] in _QUESTION_TYPES:
        del parts[4]
    return tuple(parts)


def _line(lines: Mapping[Loc, int], loc: Loc) -> int:
    # A missing key has no line of its own: point at the closest enclosing key that exists.
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return 1


def _type_name(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {value!r}"


def _describe(error: ErrorDetails) -> tuple[Loc, str]:
    """The file location and a plain-words message for one pydantic error."""
    loc = _clean(error["loc"])
    ctx = error.get("ctx") or {}
    kind, value = error["type"], error.get("input")
    if "at" in ctx:
        return (*loc, *ctx["at"]), error["msg"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        field = "kind" if ctx.get("discriminator") == "'kind'" else "type"
        expected = ["route", "classify", "check"] if field == "kind" else re.findall(r"'([^']*)'", ctx["expected_tags"])
        if kind == "union_tag_not_found":
            return (*loc, field), f"missing key {field!r}; expected one of {', '.join(expected)}"
        tag = ctx["tag"]
        return (*loc, field), f"unknown {field} {tag!r}; expected one of {', '.join(expected)}{suggest(tag, expected)}"
    last = str(loc[-1]) if loc else "the file"
    if kind == "missing":
        return loc, f"missing required key {last!r}"
    if kind == "extra_forbidden":
        return loc, f"unknown key {last!r}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return loc, f"{last} should be a mapping of keys to values, not {_type_name(value)}"
    if kind == "list_type":
        return loc, f"{last} should be a list, not {_type_name(value)}"
    if kind == "string_type":
        return loc, f"{last} should be text, not {_type_name(value)}"
    if kind == "literal_error" and error["loc"][-1:] == ("[key]",):
        expected = re.findall(r"'([^']*)'", ctx.get("expected", ""))
        return loc, f"unknown option {value!r}; expected {' or '.join(expected)}{suggest(value, expected)}"
    message = error["msg"]
    if message.startswith("Input should"):
        # pydantic's own wording names neither the key nor the value; our custom errors already do.
        message = f"{last} should{message[len('Input should') :]}"
        if not isinstance(value, (Mapping, list)):
            message += f", got {value!r}"
    return loc, message


def _config_error(problems: list[tuple[Loc, str]], lines: Mapping[Loc, int], source: str) -> ConfigError:
    located = sorted(((_line(lines, loc), loc, message) for loc, message in problems), key=lambda p: p[0])
    line, loc, message = located[0]
    error = ConfigError(message, path=source, line=line, key=_dotted(loc) or None)
    # The first problem is the error; the rest ride along as notes so one edit can fix them all.
    for other_line, other_loc, other_message in located[1:]:
        error.add_note(str(ConfigError(other_message, path=source, line=other_line, key=_dotted(other_loc) or None)))
    return error


# PyYAML's words for a key or list item at the wrong depth: its own text says nothing of indentation.
_INDENTATION_PROBLEMS = (
    "mapping values are not allowed here",
    "expected <block end>",
    "did not find expected key",
    "could not find expected ':'",
    "block sequence entries are not allowed here",
    "expected '<document start>'",
)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _indentation_hint(text: str, index: int | None, problem: str) -> str:
    """A plain hint for a YAML error that is an indentation mistake (PyYAML names only the line)."""
    if "'\\t'" in problem:  # PyYAML writes the tab it found as '\t'
        return ". Hint: YAML indents with spaces only; replace the tab with spaces"
    if index is None or not any(p in problem for p in _INDENTATION_PROBLEMS):
        return ""
    lines = text.splitlines()
    if not 0 <= index < len(lines):
        return ""
    above = next(
        (i for i in range(index - 1, -1, -1) if lines[i].strip() and not lines[i].lstrip().startswith("#")), None
    )
    here = f"line {index + 1} is indented {_indent(lines[index])} spaces"
    if above is not None:
        here += f", line {above + 1} above it {_indent(lines[above])}"
    return (
        f". Hint: check the indentation ({here}): the keys of one mapping line up exactly, and what a key "
        "holds goes one level (two spaces) deeper than the key"
    )


def parse_policy(
    data: bytes | str,
    *,
    source: str = "<policy>",
    needs_examples: NeedsExamples | None = None,
    default_engine: str = "embedded",
) -> PolicySet:
    """Parse and validate policy YAML given as bytes or text.

    Args:
        data: the file's content; its SHA-256 becomes the policy version.
        source: the name errors and ``PolicySet.source`` use (normally the file path).
        needs_examples: engine name -> question kinds it cannot answer well without examples
            (the embedded engine: ``{"noul"}``); such questions without examples are refused.
            ``None`` skips the check.
        default_engine: the engine of tasks that name none (the settings' ``engine``).

    Raises:
        ConfigError: the YAML is malformed or does not follow the schema; names the line and key.
    """
    raw = data.encode() if isinstance(data, str) else data
    version = policy_version(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"the policy file is not UTF-8 text ({exc.reason})", path=source) from None
    try:
        loader, node = _compose(text)
        if node is None:
            raise ConfigError("the policy file is empty; it needs at least a 'tasks' mapping", path=source, line=1)
        builder = _Builder(loader, source)
        doc = builder.build(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        context = exc.context or ""
        if exc.context and exc.context_mark and exc.problem_mark and exc.context_mark.line != exc.problem_mark.line:
            context += f" (from line {exc.context_mark.line + 1})"
        what = "; ".join(p for p in (context, exc.problem or "") if p)
        hint = _indentation_hint(text, mark.line if mark else None, what)
        raise ConfigError(f"invalid YAML: {what}{hint}", path=source, line=mark.line + 1 if mark else None) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", path=source) from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"a policy file is a mapping with a 'tasks' key, not {_type_name(doc)}", path=source, line=1)
    # Top-level ``x-`` keys are the authors' own (a home for YAML anchors, as in compose files).
    doc = {key: value for key, value in doc.items() if not str(key).startswith("x-")}
    try:
        model = PolicyFile.model_validate(doc)
        return to_policy_set(
            model, version=version, source=source, needs_examples=needs_examples, default_engine=default_engine
        )
    except ValidationError as exc:
        raise _config_error([_describe(e) for e in exc.errors()], builder.lines, source) from None
    except PolicyProblem as exc:
        raise _config_error([(exc.loc, exc.message)], builder.lines, source) from None


def load_policy(
    path: str | os.PathLike[str],
    *,
    needs_examples: NeedsExamples | None = None,
    default_engine: str = "embedded",
) -> PolicySet:
    """Read, validate and convert one policy file.

    Args:
        path: the YAML file.
        needs_examples: engine name -> question kinds it cannot answer well without examples;
            a yes/no rule without examples on such an engine is refused. ``None`` skips the check.
        default_engine: the engine of tasks that name none.

    Returns:
        The policy, its ``version`` the content hash of the file's bytes.

    Raises:
        ConfigError: the file cannot be read, is not valid YAML or breaks the schema; the message names
            the file, line and key, and suggests the closest allowed key for a misspelt one.
    """
    source = os.fspath(path)
    try:
        data = Path(source).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the policy file: {exc.strerror or exc}", path=source) from None
    return parse_policy(data, source=source, needs_examples=needs_examples, default_engine=default_engine)
