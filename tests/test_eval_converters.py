"""The data converters on the real files in ../shared/data: counts, splits, labels, meta.json, examples."""

from __future__ import annotations

import csv
import gzip
import json
from collections import Counter
from functools import cache
from pathlib import Path

import pytest
import yaml
from conftest import SHARED_DATA

from fastslow.policies import load_policy
from fastslow.policies.evaluation._convert import CONVERTERS, Dataset, convert
from fastslow.policies.evaluation._rows import SPLITS, read_rows
from fastslow.router import Choice, ConfigError, RouteTask

pytestmark = pytest.mark.data

# Per split, from ../shared/data/README.md; "dropped" is what the converter leaves out and why.
EXPECTED: dict[str, tuple[dict[str, int], dict[str, int]]] = {
    # train 15,000 + oos 100 (less 5 texts also in val or test), val 3,000 + 100, test 4,500 + 1,000
    "clinc150-domain": ({"train": 15_095, "validation": 3_100, "test": 5_500}, {"text_in_two_splits": 5}),
    "clinc150-intent": ({"train": 15_095, "validation": 3_100, "test": 5_500}, {"text_in_two_splits": 5}),
    "clinc150-hier": ({"train": 15_095, "validation": 3_100, "test": 5_500}, {"text_in_two_splits": 5}),
    # train 10,003, a seeded tenth of it the validation split; test 3,080
    "banking77": ({"train": 9_000, "validation": 1_003, "test": 3_080}, {"text_in_two_splits": 0}),
    # 11,036 over 10 folds: folds 1-8 train, 9 validation, 10 test
    "hwu64": ({"train": 8_608, "validation": 1_076, "test": 1_352}, {"text_in_two_splits": 0}),
    # train_full 13,784 (less 4 texts also in validate), validate 700 as the test split
    "snips": ({"train": 12_396, "validation": 1_384, "test": 700}, {"text_in_two_splits": 4}),
    # 14,042 less 5 contaminated = 14,037; 1,319 less 12 = 1,307
    "routellm-mmlu": ({"train": 8_423, "validation": 2_808, "test": 2_806}, {"contaminated": 5}),
    "routellm-gsm8k": ({"train": 785, "validation": 261, "test": 261}, {"contaminated": 12}),
    "moderation": ({"train": 1_008, "validation": 337, "test": 335}, {"no_known_label": 0}),
    "xstest": ({"train": 270, "validation": 90, "test": 90}, {}),
    "prompt-injection": ({"train": 529, "validation": 66, "test": 67}, {"text_in_two_splits": 0}),
}


def folder(name: str) -> Path:
    path = SHARED_DATA / CONVERTERS[name].source.folder
    if not path.is_dir():
        pytest.skip(f"{path} not found (set FASTSLOW_SHARED_DATA to the public data); CI always has it")
    return path


@cache
def dataset(name: str, seed: int = 0) -> Dataset:
    return CONVERTERS[name].read(folder(name), seed)


def by_split(data: Dataset) -> dict[str, set[str]]:
    return {split: {item.state for item in data.items if item.split == split} for split in SPLITS}


def test_every_data_set_of_the_readme_has_a_converter() -> None:
    assert sorted(CONVERTERS) == sorted(EXPECTED)
    assert all(name == c.name for name, c in CONVERTERS.items())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_counts_per_split_match_the_data_readme(name: str) -> None:
    counts, dropped = EXPECTED[name]
    data = dataset(name)
    assert dict(Counter(item.split for item in data.items)) == counts
    assert dict(data.dropped) == dropped
    assert len({item.id for item in data.items}) == len(data.items)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_labels_are_options_of_their_questions_and_no_state_is_in_two_splits(name: str) -> None:
    data = dataset(name)
    questions = data.task.questions
    for item in data.items:
        assert item.labels and set(item.labels) <= set(questions), item
        assert all(option in questions[q].options for q, option in item.labels.items()), item
    states = by_split(data)
    assert not states["train"] & states["validation"]
    assert not states["train"] & states["test"]
    assert not states["validation"] & states["test"]
    if data.task.kind == "route":
        assert list(questions) == [data.task.name]  # a route task's question is named after it


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_convert_writes_rows_meta_and_an_examples_policy_of_training_rows(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.jsonl"
    folder(name)  # skips where the data set is absent
    # --source may be the shared data folder itself: the converter finds its data set inside it.
    result = convert(name, SHARED_DATA, out, limit=40, examples_per_label=2)
    rows = read_rows(out, strict=True)  # every row a converter writes is a good row
    assert result.rows == len(rows.rows) and all(count <= 40 for count in result.counts.values())
    assert dict(Counter(row.split for row in rows.rows)) == {s: n for s, n in result.counts.items() if n}
    full = dataset(name)
    states = by_split(full)
    assert all(row.state in states[row.meta["split"]] for row in rows.rows)

    meta = json.loads(result.meta_path.read_text())
    source = CONVERTERS[name].source
    assert result.meta_path == tmp_path / f"{name}.jsonl.meta.json"
    assert meta["source"] | {"folder": None} == {
        "folder": None,
        "data_set": source.folder,
        "repository": source.repository,
        "commit": source.commit,
        "url": source.url,
        "licence": source.licence,
    } | ({"note": source.note} if source.note else {})
    assert Path(meta["source"]["folder"]) == folder(name).resolve()
    assert (meta["seed"], meta["limit"], meta["rows"]) == (0, 40, result.rows)
    assert meta["counts"] == result.counts and meta["available"] == EXPECTED[name][0]
    assert meta["task"]["name"] == full.task.name and meta["task"]["kind"] == full.task.kind
    for split, by_question in meta["labels"].items():
        for counts in by_question.values():
            assert sum(counts.values()) <= result.counts[split]

    assert result.examples_path == tmp_path / f"{name}.jsonl.examples.yaml"
    assert "tasks" in yaml.safe_load(result.examples_path.read_text())
    policy = load_policy(result.examples_path)
    assert list(policy.tasks) == [full.task.name] and policy.tasks[full.task.name].kind == full.task.kind
    texts = {text for by_option in policy.question_examples().values() for ts in by_option.values() for text in ts}
    assert texts and texts <= states["train"]  # verbatim training rows, so never validation or test ones
    assert all(row.split == "train" for row in rows.rows if row.meta.get("example"))
    wanted = {item.id for item in full.items if item.split == "train"}
    assert set(meta["examples"]["ids"]) <= wanted and meta["examples"]["per_label"] == 2


def test_the_examples_hold_n_training_rows_per_label(tmp_path: Path) -> None:
    result = convert("clinc150-domain", folder("clinc150-domain"), tmp_path / "d.jsonl", examples_per_label=3, limit=1)
    task = load_policy(result.examples_path or tmp_path).tasks["clinc150-domain"]
    assert isinstance(task, RouteTask) and task.none_option == "none_of_these"
    assert {route: len(r.examples) for route, r in task.routes.items()} == dict.fromkeys(task.routes, 3)
    oos = {item.state for item in dataset("clinc150-domain").items if item.meta["intent"] == "oos"}
    assert set(task.routes["none_of_these"].examples) <= oos


def test_out_of_scope_is_the_none_of_these_option_in_every_clinc_view() -> None:
    for name in ("clinc150-domain", "clinc150-intent", "clinc150-hier"):
        data = dataset(name)
        assert data.task.none_of_these == "none_of_these"
        oos = [item for item in data.items if item.meta["intent"] == "oos"]
        assert len(oos) == 1_200 and all(set(item.labels.values()) == {"none_of_these"} for item in oos)
    hier = dataset("clinc150-hier")
    assert list(hier.task.questions) == ["domain", "intent"]
    assert len(hier.task.questions["domain"].options) == 11 and len(hier.task.questions["intent"].options) == 151
    intent = hier.task.questions["intent"]
    assert isinstance(intent, Choice) and intent.criteria["pto_request"] == "PTO request"  # readable, from the name


def test_routellm_drops_contaminated_prompts_and_keeps_both_outcomes() -> None:
    rates = {"routellm-mmlu": (0.681, 0.806, 0.178), "routellm-gsm8k": (0.638, 0.857, 0.290)}
    for name, prefix in (("routellm-mmlu", "mmlu"), ("routellm-gsm8k", "gsm8k")):
        path = folder(name) / f"{prefix}__contaminated_prompts.jsonl"
        contaminated = {json.loads(line)["eval_prompt"] for line in path.read_text().splitlines()}
        items = dataset(name).items
        assert len(items) == {"routellm-mmlu": 14_037, "routellm-gsm8k": 1_307}[name]
        assert contaminated and not contaminated & {item.state for item in items}
        assert all(item.labels == {"weak_suffices": "yes" if item.meta["weak_correct"] else "no"} for item in items)
        weak = sum(item.meta["weak_correct"] for item in items) / len(items)
        strong = sum(item.meta["strong_correct"] for item in items) / len(items)
        only_strong = sum(item.meta["strong_correct"] and not item.meta["weak_correct"] for item in items) / len(items)
        # The README's rates; GSM8K's were measured before its 12 contaminated prompts were dropped.
        assert (weak, strong, only_strong) == pytest.approx(rates[name], abs=0.003)
    assert {item.meta["subject"] for item in dataset("routellm-mmlu").items} >= {"abstract_algebra", "virology"}


def test_moderation_asks_every_category_but_labels_only_those_the_data_knows() -> None:
    with gzip.open(folder("moderation") / "samples-1680.jsonl.gz", "rt", encoding="utf-8") as fh:
        samples = [json.loads(line) for line in fh]
    data = dataset("moderation")
    codes = {"sexual": "S", "hate": "H", "violence": "V", "harassment": "HR", "self_harm": "SH"}
    codes |= {"sexual_minors": "S3", "hate_threatening": "H2", "violence_graphic": "V2"}
    assert list(data.task.questions) == list(codes)
    for item, sample in zip(data.items, samples, strict=True):
        assert set(item.labels) == {q for q, code in codes.items() if code in sample}
        assert all(item.labels[q] == ("yes" if sample[codes[q]] else "no") for q in item.labels)
    known = Counter(q for item in data.items for q in item.labels)
    assert known["hate"] == 771 and known["violence"] == 1_450  # the rest of the 1,680 are unknown, not safe
    assert sum("yes" in item.labels.values() for item in data.items) == 522


def test_xstest_keeps_the_prompt_type_and_splits_within_each_type() -> None:
    data = dataset("xstest")
    assert Counter(item.labels["unsafe"] for item in data.items) == {"no": 250, "yes": 200}
    per_type = Counter((item.meta["type"], item.split) for item in data.items)
    types = {t for t, _ in per_type}
    assert len(types) == 18 and all(per_type[(t, "test")] == 5 and per_type[(t, "train")] == 15 for t in types)
    assert all(item.labels["unsafe"] == "yes" for item in data.items if item.meta["type"].startswith("contrast_"))


def test_hwu64_names_rows_by_position_because_answerid_repeats() -> None:
    data = dataset("hwu64")
    with (folder("hwu64") / "hwu64_10fold_testsets.csv").open(encoding="utf-8") as fh:
        answer_ids = [row["answerid"] for row in csv.DictReader(fh)]
    assert len(set(answer_ids)) < len(answer_ids)
    assert [item.id for item in data.items] == [f"row-{n}" for n in range(len(answer_ids))]
    assert len(data.task.questions["scenario"].options) == 18 and len(data.task.questions["intent"].options) == 64
    assert all(item.labels["intent"].startswith(item.labels["scenario"] + "_") for item in data.items)


def test_seeded_splits_follow_the_seed_and_own_splits_do_not() -> None:
    assert by_split(dataset("xstest", 0)) == by_split(CONVERTERS["xstest"].read(folder("xstest"), 0))
    assert by_split(dataset("xstest", 0))["test"] != by_split(dataset("xstest", 1))["test"]
    assert by_split(dataset("prompt-injection", 0)) == by_split(dataset("prompt-injection", 1))


def test_only_the_splits_asked_for_are_written_and_gz_is_gzipped(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl.gz"
    result = convert("xstest", folder("xstest"), out, splits=["test"])
    assert result.counts == {"test": 90} and result.examples_path is None
    rows = read_rows(out, strict=True).rows
    assert len(rows) == 90 and {row.split for row in rows} == {"test"}
    assert all(row.meta["type"] for row in rows)
    assert json.loads(result.meta_path.read_text())["examples"] is None


def test_bad_arguments_are_config_errors_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown data set 'bankin77'.*did you mean 'banking77'") as info:
        convert("bankin77", tmp_path, tmp_path / "x.jsonl")
    assert info.value.key == "name"
    with pytest.raises(ConfigError, match="train.csv not found in") as info:
        convert("banking77", tmp_path, tmp_path / "x.jsonl")
    assert info.value.key == "source"
    with pytest.raises(ConfigError, match="unknown split 'dev'") as info:
        convert("xstest", tmp_path, tmp_path / "x.jsonl", splits=["dev"])
    with pytest.raises(ConfigError, match="examples_per_label must be at least 1"):
        convert("xstest", tmp_path, tmp_path / "x.jsonl", examples_per_label=0)
