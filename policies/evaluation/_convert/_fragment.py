"""The examples fragment: a policy file whose one task holds training rows as examples.

It is a whole, loadable policy file (``load_policy`` reads it), so a user can check it as it is
and paste its task, or just its ``routes`` / ``questions`` / ``rules``, into their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import yaml

from fastslow.policies._load import _Loader
from fastslow.policies._locate import BUILTIN_POLICY
from fastslow.router import Choice, Noul

from ._base import Item, TaskSpec

__all__ = ["fragment"]

_STR = "tag:yaml.org,2002:str"


class _Dumper(yaml.SafeDumper):
    """Quotes every text that the policy loader (YAML 1.2) would read as something else."""


@cache
def _policy_loader() -> _Loader:
    return _Loader("")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # PyYAML quotes what YAML 1.1 would not read as text; the policy loader reads YAML 1.2, where
    # ``1e5`` is a number although 1.1 says text. Ask that loader, so every example stays verbatim.
    loader: Any = _policy_loader()  # PyYAML's stubs leave resolve untyped
    as_policy_reads = loader.resolve(yaml.ScalarNode, value, (True, False))
    return dumper.represent_scalar(_STR, value, style="'" if as_policy_reads != _STR else None)


_Dumper.add_representer(str, _represent_str)


def _texts(items: Sequence[Item]) -> list[str]:
    return [item.state for item in items]


def _question(question: Noul | Choice, picked: Mapping[str, Sequence[Item]]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if isinstance(question, Choice):
        body["type"] = "choice"
    if question.instructions is not None:
        body["instructions"] = question.instructions
    if isinstance(question, Noul):
        body |= {k: v for k, v in (("yes", question.yes), ("no", question.no)) if v is not None}
    else:
        body["criteria"] = dict(question.criteria)
    examples = {option: _texts(picked[option]) for option in question.options if picked.get(option)}
    if examples:
        body["examples"] = examples
    return body


def fragment(task: TaskSpec, picked: Mapping[str, Mapping[str, Sequence[Item]]], header: str) -> str:
    """The YAML text: ``header`` as comments, then ``tasks: {<task.name>: ...}``."""
    body: dict[str, Any]
    if task.kind == "route":
        ((name, question),) = task.questions.items()
        assert isinstance(question, Choice)  # a route task's one question is a choice of routes
        routes: dict[str, Any] = {}
        for option, description in question.criteria.items():
            route: dict[str, Any] = {"description": description}
            if picked[name].get(option):
                route["examples"] = _texts(picked[name][option])
            routes[option] = route
        body = {"kind": "route", "instructions": question.instructions, "routes": routes}
        if task.none_of_these is not None:
            body["none_of_these"] = task.none_of_these
    else:
        key = "questions" if task.kind == "classify" else "rules"
        body = {"kind": task.kind, key: {q: _question(question, picked[q]) for q, question in task.questions.items()}}
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    document = {"defaults": _shipped_thresholds(), "tasks": {task.name: body}}
    dumped = yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
    return comments + dumped


def _shipped_thresholds() -> dict[str, Any]:
    """The built-in policy's default thresholds, so a fragment decides (and escalates) as it would.

    Without them a task keeps every answer however unsure (the schema's thresholds are 0): an
    evaluation of the fragment would say nothing about when System 1 hands over.
    """
    shipped = yaml.safe_load(BUILTIN_POLICY.read_text(encoding="utf-8"))
    return {"thresholds": dict(shipped["defaults"]["thresholds"])}
