"""Examples files: JSON or YAML, every scalar read as text, errors naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastslow.engines.embedded import examples_from_mapping, load_examples
from fastslow.router import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_the_shipped_demo_file_loads() -> None:
    examples = load_examples(REPO / "examples" / "support_examples.yaml")
    assert examples.questions["route"].options == ("billing", "technical", "account", "other")
    assert examples.questions["is_injection"].options == ("yes", "no")
    assert all(len(texts) >= 8 for q in examples.questions.values() for texts in q.examples.values())


def test_yes_no_and_numbers_stay_text(tmp_path: Path) -> None:
    path = _write(tmp_path, "ex.yaml", "questions:\n  q:\n    examples:\n      yes: [404, on]\n      no: [off]\n")
    q = load_examples(path).questions["q"]
    assert dict(q.examples) == {"yes": ("404", "on"), "no": ("off",)}


def test_true_false_options_mean_yes_no(tmp_path: Path) -> None:
    path = _write(tmp_path, "ex.json", '{"questions": {"q": {"examples": {"true": ["a"], "false": ["b"]}}}}')
    assert load_examples(path).questions["q"].options == ("yes", "no")


@pytest.mark.parametrize(
    ("name", "text", "line", "key", "message"),
    [
        (
            "empty_option.yaml",
            "questions:\n  route:\n    examples:\n      billing: [a]\n      travel: []\n",
            5, "questions.route.examples.travel", "no examples",
        ),
        (
            "typo.yaml",
            "questions:\n  route:\n    exemples:\n      billing: [a]\n",
            3, "questions.route.exemples", "Extra inputs",
        ),
        (
            "not_a_list.yaml",
            "questions:\n  route:\n    examples:\n      billing: [a]\n      travel: just one string\n",
            5, "questions.route.examples.travel", "valid list",
        ),
        (
            "nested.yaml",
            "questions:\n  route:\n    examples:\n      billing: [a]\n      travel:\n        - ok\n        - {x: y}\n",
            7, "questions.route.examples.travel.1", "valid string",
        ),
        (
            "one_option.yaml",
            "questions:\n  route:\n    examples:\n      billing: [a]\n",
            3, "questions.route.examples", "at least 2",
        ),
        (
            "duplicate.yaml",
            "questions:\n  route:\n    examples:\n      billing: [a]\n      billing: [b]\n",
            5, "questions.route.examples.billing", "duplicate key",
        ),
        (
            "blank.yaml",
            "questions:\n  route:\n    examples:\n      billing: [a, '  ']\n      travel: [b]\n",
            4, "questions.route.examples.billing.1", "non-empty",
        ),
        (
            "bad.json",
            '{"questions": {"route": {"examples": {"billing": ["a"],\n  "travel": "b"}}}}',
            2, "questions.route.examples.travel", "valid list",
        ),
    ],
)  # fmt: skip
def test_invalid_files_name_file_line_and_key(
    tmp_path: Path, name: str, text: str, line: int, key: str, message: str
) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(ConfigError) as err:
        load_examples(path)
    assert (err.value.path, err.value.line, err.value.key) == (str(path), line, key)
    assert message in err.value.message
    assert str(err.value).startswith(f"{path}:{line}: ")


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("syntax.yaml", "questions:\n  route:\n    examples:\n      billing: [a\n      travel: b\n", 5),
        ("syntax.json", '{"questions": {"route": {"examples": {"billing": ["a"],\n "travel": ["b"],}}}}', 2),
        ("empty.yaml", "", 1),
        ("list.yaml", "- a\n- b\n", 1),
    ],
)
def test_unparsable_files_name_file_and_line(tmp_path: Path, name: str, text: str, line: int) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(ConfigError) as err:
        load_examples(path)
    assert (err.value.path, err.value.line) == (str(path), line)


def test_a_missing_file_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_examples(tmp_path / "nope.yaml")
    assert err.value.path == str(tmp_path / "nope.yaml")


def test_in_memory_examples_are_validated_like_files() -> None:
    with pytest.raises(ConfigError) as err:
        examples_from_mapping({"questions": {"q": {"examples": {"a": ["x"], "b": "y"}}}}, source="inline")
    assert (err.value.path, err.value.key) == ("inline", "questions.q.examples.b")


def test_equal_examples_share_a_fingerprint() -> None:
    body = {"examples": {"a": ["x"], "b": ["y"]}}
    examples = examples_from_mapping({"questions": {"one": body, "two": body}})
    assert examples.questions["one"].fingerprint == examples.questions["two"].fingerprint
