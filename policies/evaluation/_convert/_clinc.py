"""CLINC150 (clinc/oos-eval): 10 domains, 150 intents and out-of-scope queries.

Three views of one file: domain routing, intent routing and the two as one row (domain, then
intent). Out-of-scope queries are labelled with the "none of these" option, named as the policy
file's ``none_of_these`` key, so choosing it is what a route task escalates on.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from fastslow.policies._schema import NONE_DESCRIPTION
from fastslow.policies.evaluation._rows import Split
from fastslow.router import Choice, ConfigError

from ._base import Converter, Dataset, Item, Source, TaskSpec, need, readable
from ._split import drop_cross_split_duplicates

__all__ = ["CLINC150_DOMAIN", "CLINC150_HIER", "CLINC150_INTENT", "NONE_OF_THESE"]

NONE_OF_THESE = "none_of_these"
"""The option out-of-scope rows are labelled with: the policy key's own name."""

SOURCE = Source(
    folder="clinc150",
    marker="data_full.json",
    repository="clinc/oos-eval",
    commit="828f809",
    licence="CC BY 3.0",
    url="https://github.com/clinc/oos-eval",
)
_SPLITS: dict[str, Split] = {
    "train": "train",
    "oos_train": "train",
    "val": "validation",
    "oos_val": "validation",
    "test": "test",
    "oos_test": "test",
}
_WORDS = {"pto": "PTO", "w2": "W-2 form", "mpg": "MPG", "apr": "APR", "401k": "401(k)", "uber": "Uber"}
_RULE = (
    "the data set's own train / val / test, each with its oos_ part (data_full.json); a text in two "
    "splits is kept only in the later one (test, then validation)"
)


def _domain_question(domains: dict[str, list[str]]) -> Choice:
    # A domain's only description in the data is the list of its intents.
    criteria: dict[str, str | None] = {d: ", ".join(readable(i, _WORDS) for i in ints) for d, ints in domains.items()}
    criteria[NONE_OF_THESE] = NONE_DESCRIPTION
    return Choice(criteria=criteria, instructions="Which domain does the user's request belong to?")


def _intent_question(domains: dict[str, list[str]]) -> Choice:
    criteria: dict[str, str | None] = {i: readable(i, _WORDS) for ints in domains.values() for i in ints}
    criteria[NONE_OF_THESE] = NONE_DESCRIPTION
    return Choice(criteria=criteria, instructions="Which intent does the user's request express?")


def _read(folder: Path) -> tuple[dict[str, list[str]], list[tuple[str, str, str, Split]]]:
    """The domains and ``(id, text, intent, split)`` for every query."""
    path = need(folder / "data_full.json")
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        domains: dict[str, list[str]] = json.loads(need(folder / "domains.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"not the CLINC150 JSON: {exc}", path=str(path)) from None
    known = {i for ints in domains.values() for i in ints} | {"oos"}
    queries: list[tuple[str, str, str, Split]] = []
    for part, split in _SPLITS.items():
        for n, pair in enumerate(data.get(part, ())):
            if not (isinstance(pair, list) and len(pair) == 2 and pair[1] in known and isinstance(pair[0], str)):
                raise ConfigError(f"{part}[{n}] is not [text, known intent]: {pair!r}", path=str(path), key=part)
            queries.append((f"{part}-{n}", pair[0], pair[1], split))
    return domains, queries


def _dataset(folder: Path, name: str, views: dict[str, Literal["domain", "intent"]]) -> Dataset:
    """Rows asking, for each question name in ``views``, the domain or the intent."""
    domains, queries = _read(folder)
    build = {"domain": _domain_question, "intent": _intent_question}
    questions = {q: build[view](domains) for q, view in views.items()}
    domain_of = {i: d for d, ints in domains.items() for i in ints}
    items: list[Item] = []
    for row_id, text, intent, split in queries:
        truth = {"domain": domain_of.get(intent, NONE_OF_THESE), "intent": intent if intent != "oos" else NONE_OF_THESE}
        meta = {"intent": intent} | ({"domain": domain_of[intent]} if intent in domain_of else {})
        labels = {q: truth[view] for q, view in views.items()}
        items.append(Item(id=row_id, state=text, labels=labels, split=split, meta=meta))
    kept, dropped = drop_cross_split_duplicates(items)
    task = TaskSpec(
        name=name,
        kind="classify" if len(questions) > 1 else "route",
        questions=questions,
        none_of_these=NONE_OF_THESE,
    )
    return Dataset(task=task, items=tuple(kept), split_rule=_RULE, dropped={"text_in_two_splits": dropped})


def _domain(folder: Path, seed: int) -> Dataset:
    del seed  # the data set's own splits; the same for the other two views
    return _dataset(folder, "clinc150-domain", {"clinc150-domain": "domain"})


def _intent(folder: Path, seed: int) -> Dataset:
    del seed
    return _dataset(folder, "clinc150-intent", {"clinc150-intent": "intent"})


def _hier(folder: Path, seed: int) -> Dataset:
    del seed
    return _dataset(folder, "clinc150-hier", {"domain": "domain", "intent": "intent"})


CLINC150_DOMAIN = Converter(
    name="clinc150-domain",
    summary="Which of 10 domains a request belongs to; out-of-scope requests are none_of_these.",
    source=SOURCE,
    read=_domain,
)
CLINC150_INTENT = Converter(
    name="clinc150-intent",
    summary="Which of 150 intents a request expresses; out-of-scope requests are none_of_these.",
    source=SOURCE,
    read=_intent,
)
CLINC150_HIER = Converter(
    name="clinc150-hier",
    summary="Two questions per request: its domain (10), then its intent (150); out of scope is none_of_these in both.",
    source=SOURCE,
    read=_hier,
)
