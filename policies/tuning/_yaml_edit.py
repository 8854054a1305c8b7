"""Writing fitted numbers back into a policy file without touching anything else.

Edits are made in the file's text, at the positions the YAML parser reports for each node: a
value that exists is replaced where it stands (a value whose shape changes, a list or a mapping
where a flow mapping or a null was, is rewritten from its key's line to its end); a key that is
missing is added on new lines at the end of its mapping, at that mapping's indentation; a key that
is removed takes its lines with it. Every other byte (comments, key order, quoting,
blank lines, long lines however they were folded) stays as it was, which a round trip through a
YAML library does not promise: ruamel.yaml re-folds long plain scalars by its own rule and so
rewrote 35 lines of a policy fragment ``fastslow data convert`` itself writes. The edited text is
parsed again before it is written, and the write is atomic and refuses a file that changed since
it was read.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fastslow.policies._load import _Loader
from fastslow.router import ConfigError

__all__ = ["PolicyEditor"]


@dataclass(frozen=True, slots=True)
class _Edit:
    start: int
    end: int
    text: str


def _scalar(value: Any) -> str:
    """A scalar as YAML text that reads back as the same value (floats keep a dot or an exponent)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write {value} into a policy file")
        text = repr(value)
        return text if any(c in text for c in ".eE") else text + ".0"
    if isinstance(value, int):
        return str(value)
    if value is None:
        return "null"
    text = str(value)
    plain = yaml.safe_dump(text, default_style=None, width=1 << 16).removesuffix("\n...\n").strip()
    # JSON's quoting is YAML's double-quoted style: safe for any text the plain style would misread.
    return text if plain == text and text.strip() == text and text else json.dumps(text, ensure_ascii=False)


def _flow(value: Any) -> str:
    """A scalar, or a list of them (nested lists too), as one line of YAML: ``[0.31, 0.2]``."""
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_flow(v) for v in value)}]"
    return _scalar(value)


def _block(value: Mapping[str, Any], indent: int) -> str:
    """``value`` as block-style lines at ``indent`` spaces, ending with a newline.

    A list of lists (an isotonic map's points) takes one line an item, ``- [x, y]``; another list is
    written on one line.
    """
    lines: list[str] = []
    pad = " " * indent
    for key, item in value.items():
        if isinstance(item, Mapping):
            if item:
                lines.append(f"{pad}{_scalar(key)}:\n" + _block(item, indent + 2))
            else:
                lines.append(f"{pad}{_scalar(key)}: {{}}\n")
        elif isinstance(item, (list, tuple)) and item and all(isinstance(v, (list, tuple)) for v in item):
            lines.append(f"{pad}{_scalar(key)}:\n" + "".join(f"{pad}  - {_flow(v)}\n" for v in item))
        elif isinstance(item, (list, tuple)):
            lines.append(f"{pad}{_scalar(key)}: {_flow(item)}\n")
        else:
            lines.append(f"{pad}{_scalar(key)}: {_scalar(item)}\n")
    return "".join(lines)


def _end(node: yaml.Node) -> int:
    """Where a node's own text ends: a block mapping's or sequence's last value, not the comments after it."""
    if isinstance(node, yaml.MappingNode) and node.value and not node.flow_style:
        return _end(node.value[-1][1])
    if isinstance(node, yaml.SequenceNode) and node.value and not node.flow_style:
        return _end(node.value[-1])
    return int(node.end_mark.index)


class PolicyEditor:
    """One policy file, loaded for editing: change values through ``set``, then ``write``.

    Raises:
        ConfigError: the file cannot be read or is not YAML.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the policy file: {exc.strerror or exc}", path=str(path)) from exc
        try:
            self.original = self._raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError("the policy file is not UTF-8 text", path=str(path)) from exc
        self._text = self.original
        self._root = self._compose(self._text)

    def _compose(self, text: str) -> yaml.MappingNode:
        try:
            root = yaml.compose(text, Loader=_Loader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise ConfigError(
                f"not valid YAML: {getattr(exc, 'problem', None) or exc}",
                path=str(self.path),
                line=mark.line + 1 if mark is not None else None,
            ) from exc
        if not isinstance(root, yaml.MappingNode):
            raise ConfigError("a policy file is a mapping at the top level", path=str(self.path))
        return root

    def _error(self, message: str, keys: Sequence[str], node: yaml.Node | None = None) -> ConfigError:
        return ConfigError(
            message,
            path=str(self.path),
            line=node.start_mark.line + 1 if node is not None else None,
            key=".".join(keys) or None,
        )

    @staticmethod
    def _child(node: yaml.MappingNode, key: str) -> yaml.Node | None:
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                child: yaml.Node = v
                return child
        return None

    def get(self, keys: Sequence[str]) -> yaml.Node | None:
        node: yaml.Node | None = self._root
        for key in keys:
            if not isinstance(node, yaml.MappingNode):
                return None
            node = self._child(node, key)
        return node

    def task(self, name: str) -> yaml.MappingNode:
        tasks = self.get(["tasks"])
        task = self._child(tasks, name) if isinstance(tasks, yaml.MappingNode) else None
        if not isinstance(task, yaml.MappingNode):
            known = ", ".join(str(k.value) for k, _ in tasks.value) if isinstance(tasks, yaml.MappingNode) else "none"
            raise self._error(f"no task {name!r} in the policy file (tasks: {known})", ["tasks"], tasks)
        return task

    def set(self, keys: Sequence[str], value: Any) -> None:
        """Set ``data[k0][k1]...`` to ``value`` (a scalar, a list or a mapping); what is missing is added."""
        node: yaml.Node = self._root
        for i, key in enumerate(keys):
            at = list(keys[: i + 1])
            if not isinstance(node, yaml.MappingNode):
                raise self._error(f"{'.'.join(keys[:i])} is not a mapping", keys[:i], node)
            child = self._child(node, key)
            if child is None:
                nested: Any = value
                for k in reversed(keys[i + 1 :]):
                    nested = {k: nested}
                self._add(node, key, nested, at)
                return
            if i == len(keys) - 1:
                block = isinstance(child, yaml.MappingNode) and bool(child.value) and not child.flow_style
                if isinstance(value, (list, tuple)) or (isinstance(value, Mapping) and not block):
                    self._rewrite_pair(key, value, at)
                else:
                    self._replace(child, value, at)
                return
            node = child

    def _pair(self, keys: Sequence[str]) -> tuple[yaml.Node, yaml.Node, int] | None:
        """The key and value nodes of ``keys``, and where the key's line starts; ``None`` if it is absent."""
        parent = self.get(keys[:-1])
        if not isinstance(parent, yaml.MappingNode):
            return None
        pair = next((kv for kv in parent.value if isinstance(kv[0], yaml.ScalarNode) and kv[0].value == keys[-1]), None)
        if pair is None:
            return None
        key_node, value_node = pair
        start = int(key_node.start_mark.index) - int(key_node.start_mark.column)
        if parent.flow_style or self._text[start : key_node.start_mark.index].strip():
            raise self._error(f"{'.'.join(keys)} does not start its own line: cannot rewrite it", keys, key_node)
        return key_node, value_node, start

    def _rewrite_pair(self, key: str, value: Any, keys: Sequence[str]) -> None:
        # From the key's line to the end of its value; what follows on that line (a comment) stays.
        found = self._pair(keys)
        assert found is not None, "set() found the key"
        key_node, value_node, start = found
        end = max(_end(value_node), int(key_node.end_mark.index) + 1)
        text = _block({key: value}, int(key_node.start_mark.column)).removesuffix("\n")
        self._apply(_Edit(start, end, text))

    def remove(self, keys: Sequence[str]) -> bool:
        """Take ``data[k0][k1]...`` out, every line of its value with it; ``False`` when it is not there.

        Raises:
            ConfigError: it is the only key of its mapping (which would be left empty), or it does
                not start its own line.
        """
        found = self._pair(keys)
        if found is None:
            return False
        key_node, value_node, start = found
        parent = self.get(keys[:-1])
        if isinstance(parent, yaml.MappingNode) and len(parent.value) == 1:
            raise self._error(f"{'.'.join(keys)} is the only key of its mapping: cannot remove it", keys, key_node)
        end = max(_end(value_node), int(key_node.end_mark.index) + 1)
        newline = self._text.find("\n", end - 1 if self._text[end - 1 : end] == "\n" else end)
        self._apply(_Edit(start, len(self._text) if newline < 0 else newline + 1, ""))
        return True

    def _add(self, parent: yaml.MappingNode, key: str, value: Any, keys: Sequence[str]) -> None:
        if parent.flow_style or not parent.value:
            raise self._error("cannot add a key to a mapping written in flow style ({...}): write it as a block", keys)
        indent = parent.value[0][0].start_mark.column
        # After the line the mapping's last value ends on (its end-of-line comment included).
        end = _end(parent)
        newline = self._text.find("\n", end)
        if self._text[end - 1 : end] == "\n":  # a block scalar's text ends with its own line
            at, prefix = end, ""
        elif newline < 0:
            at, prefix = len(self._text), "\n"
        else:
            at, prefix = newline + 1, ""
        lines = _block({key: value}, indent)
        self._apply(_Edit(at, at, prefix + lines))

    def _replace(self, node: yaml.Node, value: Any, keys: Sequence[str]) -> None:
        if not isinstance(value, Mapping):
            if not isinstance(node, yaml.ScalarNode):
                raise self._error(f"{'.'.join(keys)} is a {type(node).__name__}, not a value", keys, node)
            self._apply(_Edit(int(node.start_mark.index), int(node.end_mark.index), _scalar(value)))
            return
        if isinstance(node, yaml.MappingNode) and node.value and not node.flow_style:
            # A whole block (a fitted record) is rewritten, from its first key's line to its last value.
            indent = node.value[0][0].start_mark.column
            start = int(node.value[0][0].start_mark.index) - indent
            end = _end(node)
            newline = self._text.find("\n", end)
            stop = len(self._text) if newline < 0 else newline + 1
            self._apply(_Edit(start, stop, _block(value, indent)))
            return
        raise self._error(f"{'.'.join(keys)} is not a block mapping: cannot rewrite it", keys, node)

    def expand(self, keys: Sequence[str], shorthand: str) -> None:
        """Turn ``key: text`` (a rule's shorthand for its instructions) into ``key:`` / ``  shorthand: text``."""
        node = self.get(keys)
        parent = self.get(keys[:-1])
        if not isinstance(node, yaml.ScalarNode) or not isinstance(parent, yaml.MappingNode):
            return
        key_node = next(k for k, v in parent.value if v is node)
        indent = key_node.start_mark.column + 2
        text = f"\n{' ' * indent}{shorthand}: {_scalar(node.value)}"
        self._apply(_Edit(int(key_node.end_mark.index) + 1, int(node.end_mark.index), text))

    def _apply(self, edit: _Edit) -> None:
        text = self._text[: edit.start] + edit.text + self._text[edit.end :]
        self._root = self._compose(text)
        self._text = text

    def text(self) -> str:
        return self._text

    def diff(self) -> str:
        """A unified diff of the edits against the file as it was read."""
        name = str(self.path)
        lines = difflib.unified_diff(
            self.original.splitlines(keepends=True), self._text.splitlines(keepends=True), name, name
        )
        return "".join(lines)

    def write(self) -> None:
        """Replace the file atomically with the edited text.

        Raises:
            ConfigError: the file changed since it was read (nothing is written), or cannot be written.
        """
        try:
            now = self.path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read the policy file: {exc.strerror or exc}", path=str(self.path)) from exc
        if now != self._raw:
            raise ConfigError(
                "the policy file changed while it was being fitted; nothing was written: run the command again",
                path=str(self.path),
            )
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(self._text)
            with suppress(OSError):
                os.chmod(tmp, self.path.stat().st_mode & 0o7777)
            os.replace(tmp, self.path)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise ConfigError(f"cannot write the policy file: {exc.strerror or exc}", path=str(self.path)) from exc
        self._raw = self._text.encode("utf-8")
        self.original = self._text
