"""RouteLLM's MMLU and GSM8K (lm-sys/RouteLLM): does the weak model suffice for this prompt?

Labels come from the real outcomes: ``yes`` when the weak model (Mixtral-8x7B-Instruct) answered
correctly. Both outcomes stay in ``meta`` (``weak_correct``, ``strong_correct``) for APGR and CPT.
Prompts RouteLLM found in its routers' training data (``*__contaminated_prompts.jsonl``) are
dropped, as its own evaluation does: MMLU keeps 14,037 prompts, GSM8K 1,307.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from fastslow.policies.evaluation._rows import Split
from fastslow.router import ConfigError, Noul

from ._base import Converter, Dataset, Item, Source, TaskSpec, need, read_csv
from ._split import assign_splits

__all__ = ["QUESTION", "ROUTELLM_GSM8K", "ROUTELLM_MMLU", "SPLIT_SHARES", "STRONG_MODEL", "WEAK_MODEL"]

WEAK_MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG_MODEL = "gpt-4-1106-preview"
QUESTION = "weak_suffices"
SPLIT_SHARES: dict[Split, float] = {"train": 0.6, "validation": 0.2, "test": 0.2}
"""The data has no splits: distinct prompts are split seeded, stratified by both outcomes."""

SOURCE = Source(
    folder="routellm",
    marker="gsm8k__gsm8k_responses.csv",
    repository="lm-sys/RouteLLM",
    commit="0b64fda",
    licence="Apache-2.0",
    url="https://github.com/lm-sys/RouteLLM",
    note="routellm/evals/...; '/' became '__' in file names",
)
_NOUL = Noul(
    instructions=(
        "Will a smaller, cheaper model (Mixtral-8x7B-Instruct) answer this prompt correctly, so that the "
        "frontier model (GPT-4) is not needed?"
    ),
    yes="the smaller model's answer is correct",
    no="the smaller model's answer is wrong",
)
_OUTCOME = {"True": True, "False": False}


def _contaminated(path: Path) -> set[str]:
    prompts: set[str] = set()
    with need(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            try:
                prompts.add(json.loads(line)["eval_prompt"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ConfigError("not a contamination record with eval_prompt", path=str(path), line=n) from None
    return prompts


def _items(path: Path, prefix: str, meta: dict[str, str], drop: set[str]) -> Iterable[Item | None]:
    """One item per prompt of a responses CSV; ``None`` for a contaminated one."""
    for n, row in enumerate(read_csv(path, ("prompt", WEAK_MODEL, STRONG_MODEL))):
        if row["prompt"] in drop:
            yield None
            continue
        weak, strong = _OUTCOME.get(row[WEAK_MODEL]), _OUTCOME.get(row[STRONG_MODEL])
        if weak is None or strong is None:
            raise ConfigError("a correctness column is neither True nor False", path=str(path), line=n + 2)
        yield Item(
            id=f"{prefix}-{n}",
            state=row["prompt"],
            labels={QUESTION: "yes" if weak else "no"},
            split="train",
            meta=meta | {"weak_correct": weak, "strong_correct": strong},
        )


def _dataset(name: str, found: Iterable[Item | None], seed: int) -> Dataset:
    collected = list(found)
    items = [item for item in collected if item is not None]
    items = assign_splits(
        items,
        SPLIT_SHARES,
        seed=seed,
        stratum=lambda item: f"{item.meta['weak_correct']}/{item.meta['strong_correct']}",
    )
    shares = " / ".join(f"{split} {share:.0%}" for split, share in SPLIT_SHARES.items())
    return Dataset(
        task=TaskSpec(name=name, kind="classify", questions={QUESTION: _NOUL}),
        items=tuple(items),
        split_rule=f"seeded over distinct prompts, stratified by (weak_correct, strong_correct): {shares}",
        dropped={"contaminated": len(collected) - len(items)},
        notes={"weak_model": WEAK_MODEL, "strong_model": STRONG_MODEL},
    )


def _mmlu(folder: Path, seed: int) -> Dataset:
    drop = _contaminated(folder / "mmlu__contaminated_prompts.jsonl")
    files = sorted((folder / "mmlu_responses").glob("mmlu_*.csv"))
    if not files:
        raise ConfigError("no mmlu_*.csv files", path=str(folder / "mmlu_responses"), key="source")

    def found() -> Iterable[Item | None]:
        for path in files:
            subject = path.stem.removeprefix("mmlu_")
            yield from _items(path, subject, {"subject": subject}, drop)

    return _dataset("routellm-mmlu", found(), seed)


def _gsm8k(folder: Path, seed: int) -> Dataset:
    drop = _contaminated(folder / "gsm8k__contaminated_prompts.jsonl")
    return _dataset("routellm-gsm8k", _items(folder / "gsm8k__gsm8k_responses.csv", "row", {}, drop), seed)


ROUTELLM_MMLU = Converter(
    name="routellm-mmlu",
    summary="Does the weak model (Mixtral-8x7B) answer this MMLU question correctly? Real outcomes of both models.",
    source=SOURCE,
    read=_mmlu,
)
ROUTELLM_GSM8K = Converter(
    name="routellm-gsm8k",
    summary="Does the weak model (Mixtral-8x7B) solve this GSM8K problem? Real outcomes of both models.",
    source=SOURCE,
    read=_gsm8k,
)
