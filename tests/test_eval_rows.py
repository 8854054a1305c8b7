"""Reading evaluation files: good rows come back typed, each bad line is one problem with its line number."""

from __future__ import annotations

import gzip
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastslow.policies import load_policy
from fastslow.policies.evaluation._rows import RowsRead, normalise_label, read_rows
from fastslow.router import Choice, ConfigError, Noul, PolicySet, RouteTask, Score

CHOICE = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "tech": None}}
NOUL = {"type": "noul", "instructions": "Is the customer angry?"}
SCORE = {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "today", "right now"]}


def row(**fields: Any) -> str:
    body: dict[str, Any] = {
        "state": "I was charged twice",
        "questions": {"team": CHOICE},
        "labels": {"team": "billing"},
    }
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not ...})


def read(tmp_path: Path, *lines: str, policy: PolicySet | None = None, strict: bool = False) -> RowsRead:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return read_rows(path, policy=policy, strict=strict)


def only_problem(result: RowsRead) -> tuple[int, str, str | None]:
    assert not result.rows
    (problem,) = result.problems
    return problem.line, problem.message, problem.key


# -- good rows -----------------------------------------------------------------------------------


def test_an_explicit_row_comes_back_with_parsed_questions_and_defaults(tmp_path: Path) -> None:
    result = read(tmp_path, row())
    assert result.ok and result.path == str(tmp_path / "rows.jsonl")
    (only,) = result.rows
    assert only.id == "line-1" and only.line == 1 and only.task is None
    assert only.state == "I was charged twice"
    assert only.questions["team"] == Choice(criteria={"billing": "money", "tech": None}, instructions="Which team?")
    assert only.labels == {"team": "billing"}
    assert (only.weight, only.meta, only.split) == (1.0, {}, None)


def test_ids_weights_meta_and_splits(tmp_path: Path) -> None:
    result = read(
        tmp_path,
        row(id="a", weight=2.5, meta={"split": "test", "source": "x"}),
        "",
        "   ",
        row(weight=0, meta={"split": "train"}),
        row(state={"item": "shell: ls", "conversation": []}),
    )
    assert result.ok
    assert [(r.id, r.line, r.weight, r.split) for r in result.rows] == [
        ("a", 1, 2.5, "test"),
        ("line-4", 4, 0.0, "train"),  # blank lines are skipped, but still counted
        ("line-5", 5, 1.0, None),
    ]
    assert result.rows[0].meta == {"split": "test", "source": "x"}
    assert result.rows[2].state == {"item": "shell: ls", "conversation": []}
    assert [r.id for r in result.in_split("train")] == ["line-4"]


def test_labels_may_cover_only_some_questions(tmp_path: Path) -> None:
    # OpenAI moderation's unknown categories: asked, not labelled, never scored.
    questions = {"angry": NOUL, "team": CHOICE}
    (only,) = read(tmp_path, row(questions=questions, labels={"angry": "no"})).rows
    assert set(only.questions) == {"angry", "team"} and only.labels == {"angry": "no"}


def test_yes_no_and_score_labels_are_normalised_to_option_names(tmp_path: Path) -> None:
    questions = {"angry": NOUL, "urgency": SCORE}
    result = read(
        tmp_path,
        row(questions=questions, labels={"angry": True, "urgency": 2}),
        row(questions=questions, labels={"angry": "false", "urgency": "today"}),
        row(questions=questions, labels={"angry": "Yes", "urgency": "0"}),
    )
    assert [dict(r.labels) for r in result.rows] == [
        {"angry": "yes", "urgency": "2"},
        {"angry": "no", "urgency": "1"},
        {"angry": "yes", "urgency": "0"},
    ]


def test_normalise_label_refuses_what_names_no_option() -> None:
    noul, score = Noul(instructions="?"), Score(levels=("low", "high"))
    assert normalise_label(noul, 1) is None  # 1 == True in Python, but 1 is not a yes/no label
    assert normalise_label(noul, "maybe") is None
    assert normalise_label(score, 2) is None and normalise_label(score, "1") == "1"
    assert normalise_label(Choice(criteria={"a": None, "b": None}), ["a"]) is None


def test_rows_sharing_questions_share_one_parsed_mapping(tmp_path: Path) -> None:
    first, second, third = read(tmp_path, row(), row(questions={"angry": NOUL}, labels={"angry": "no"}), row()).rows
    assert first.questions is third.questions and first.questions is not second.questions


def test_the_same_options_in_another_order_are_another_question(tmp_path: Path) -> None:
    swapped = {"team": CHOICE | {"criteria": {"tech": None, "billing": "money"}}}
    first, second = read(tmp_path, row(), row(questions=swapped)).rows
    assert first.questions["team"].options == ("billing", "tech")
    assert second.questions["team"].options == ("tech", "billing")


def test_a_gzipped_file_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(row(id="z") + "\n")
    assert [r.id for r in read_rows(path).rows] == ["z"]


# -- one problem per bad line, with its line number -------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message", "key"),
    [
        ('{"state": "x", ', "not JSON: Expecting property name enclosed in double quotes at column 16", None),
        ('{"state": "x", "weight": NaN}', "not JSON: NaN is not JSON", None),
        ('{"state": "x", "state": "y"}', "not JSON: duplicate key 'state'", None),
        ('["state"]', "a row must be a JSON object, not an array", None),
        (row(lables={"team": "billing"}), "unknown key 'lables'; did you mean 'labels'?", "lables"),
        (row(state=...), "missing required key 'state'", "state"),
        (row(state=17), "state must be a string, object or array, not int", "state"),
        (
            row(questions=...),
            "missing required key 'questions' (or 'task', to take a policy task's questions)",
            "questions",
        ),
        (row(task="support"), "a row gives either questions or a task, not both", "questions"),
        (row(labels=...), "missing required key 'labels'", "labels"),
        (row(labels={}), "labels must be a non-empty object {question: true option}", "labels"),
        (row(id=7), "id must be a non-empty string, not 7", "id"),
        (row(weight=-1), "weight must be a finite number >= 0, not -1", "weight"),
        (row(weight="2"), "weight must be a number, not a string", "weight"),
        (
            row(weight=10**400),  # beyond any float
            "weight must be a finite number >= 0, not 10000000000000000000... (401 characters)",
            "weight",
        ),
        (row(weight=True), "weight must be a number, not a boolean", "weight"),
        (row(meta=["test"]), "meta must be an object, not an array", "meta"),
        (row(meta={"split": "dev"}), "meta.split must be one of train, validation, test, not 'dev'", "meta.split"),
    ],
)
def test_each_kind_of_bad_row_is_one_problem(tmp_path: Path, line: str, message: str, key: str | None) -> None:
    result = read(tmp_path, row(id="good"), line)
    assert [r.id for r in result.rows] == ["good"]
    (problem,) = result.problems
    assert (problem.line, problem.message, problem.key) == (2, message, key)


def test_questions_the_wire_parser_refuses_are_a_problem_naming_the_field(tmp_path: Path) -> None:
    one_option = {"team": {"type": "choice", "criteria": {"billing": None}}}
    assert only_problem(read(tmp_path, row(questions=one_option))) == (
        1,
        "a choice needs at least 2 options",
        "questions.team.criteria",
    )
    unknown_type = {"team": {"type": "multi"}}
    assert only_problem(read(tmp_path, row(questions=unknown_type)))[1:] == (
        "unknown question type 'multi'; expected noul, choice or score",
        "questions.team.type",
    )


def test_a_label_outside_the_options_or_for_an_unknown_question(tmp_path: Path) -> None:
    assert only_problem(read(tmp_path, row(labels={"team": "biling"}))) == (
        1,
        "label 'biling' of question 'team' is not one of its options (billing, tech); did you mean 'billing'?",
        "labels.team",
    )
    assert only_problem(read(tmp_path, row(labels={"teem": "billing"}))) == (
        1,
        "label for unknown question 'teem'; the questions are team; did you mean 'team'?",
        "labels.teem",
    )


def test_a_long_option_list_is_shortened_in_the_message(tmp_path: Path) -> None:
    many = {"intent": {"type": "choice", "criteria": {f"i{n}": None for n in range(40)}}}
    _, message, _ = only_problem(read(tmp_path, row(questions=many, labels={"intent": "nope"})))
    assert message.endswith("(i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11, ... (40 in all))")


def test_duplicate_ids_are_problems_and_the_first_row_wins(tmp_path: Path) -> None:
    result = read(tmp_path, row(id="a"), row(id="a"), row(), row(id="line-3"), row(id="b", weight=-1), row(id="b"))
    assert [(r.id, r.line) for r in result.rows] == [("a", 1), ("line-3", 3), ("b", 6)]
    assert [str(p) for p in result.problems] == [
        "line 2: duplicate id 'a' (first on line 1) (key 'id')",
        "line 4: duplicate id 'line-3' (first on line 3) (key 'id')",
        "line 5: weight must be a finite number >= 0, not -1 (key 'weight')",  # a bad row claims no id
    ]


def test_a_line_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(row().encode() + b"\n" + b'{"state": "\xff"}\n')
    result = read_rows(path)
    assert len(result.rows) == 1 and [str(p) for p in result.problems] == ["line 2: not UTF-8 text"]


# -- strict mode and unreadable files ----------------------------------------------------------------


def test_strict_raises_the_first_problem_naming_file_line_and_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read(tmp_path, row(), row(labels={"team": "sales"}), row(weight=-1), strict=True)
    error = info.value
    assert (error.path, error.line, error.key) == (str(tmp_path / "rows.jsonl"), 2, "labels.team")
    assert str(error).startswith(f"{tmp_path / 'rows.jsonl'}:2: label 'sales' of question 'team'")


def test_strict_reads_a_good_file_like_the_default(tmp_path: Path) -> None:
    assert [r.id for r in read(tmp_path, row(id="a"), row(id="b"), strict=True).rows] == ["a", "b"]


def test_a_missing_file_is_a_config_error_either_way(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the evaluation file: No such file or directory") as info:
        read_rows(tmp_path / "absent.jsonl")
    assert info.value.path == str(tmp_path / "absent.jsonl")


# -- rows that name a policy task ---------------------------------------------------------------------

POLICY = """
tasks:
  support:
    kind: route
    routes: {billing: Charges and refunds, technical: Errors and crashes}
    none_of_these: other
  triage:
    kind: classify
    questions:
      refund: Does the customer ask for money back?
      urgency: {type: score, levels: [can wait, today, right now]}
  tool_safety:
    kind: check
    rules:
      destructive: Would this tool call delete data?
      tone:
        type: choice
        criteria: {polite: ~, rude: ~}
        violation: rude
"""


@pytest.fixture
def policy(tmp_path: Path) -> PolicySet:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(POLICY).lstrip("\n"))
    return load_policy(path)


def task_row(**fields: Any) -> str:
    return json.dumps({"state": "I was charged twice"} | fields)


def test_task_rows_take_their_questions_from_the_policy(tmp_path: Path, policy: PolicySet) -> None:
    result = read(
        tmp_path,
        task_row(task="support", label="billing"),
        task_row(task="support", labels={"support": "other"}),
        task_row(task="triage", labels={"refund": "yes", "urgency": "right now"}),
        task_row(task="tool_safety", labels={"destructive": False, "tone": "rude"}, weight=3),
        policy=policy,
    )
    assert result.ok, result.problems
    route, none, triage, check = result.rows
    assert route.task == "support" and route.labels == {"support": "billing"}
    support = policy.tasks["support"]
    assert isinstance(support, RouteTask) and route.questions == {"support": support.question}
    assert none.labels == {"support": "other"}  # the none_of_these route is an option like any other
    assert set(triage.questions) == {"refund", "urgency"} and triage.labels == {"refund": "yes", "urgency": "2"}
    assert check.labels == {"destructive": "no", "tone": "rude"} and check.weight == 3.0


@pytest.mark.parametrize(
    ("line", "message", "key"),
    [
        (task_row(task="suport", label="billing"), "unknown task 'suport'; the policy has support, tool_safety, "
         "triage; did you mean 'support'?", "task"),
        (task_row(task=["support"], label="billing"), "task must be a task name, not an array", "task"),
        (task_row(task="triage", label="yes"), "label (one option) is for route-task rows; use labels: "
         "{question: option}", "label"),
        (task_row(task="support", label="billing", labels={"support": "billing"}),
         "a row gives either label or labels, not both", "label"),
        (task_row(task="support", label="sales"), "label 'sales' of question 'support' is not one of its options "
         "(billing, technical, other)", "label"),
        (task_row(task="tool_safety", labels={"destructive": "violation"}), "label 'violation' of question "
         "'destructive' is not one of its options (yes, no)", "labels.destructive"),
    ],
)  # fmt: skip
def test_bad_task_rows(tmp_path: Path, policy: PolicySet, line: str, message: str, key: str) -> None:
    assert only_problem(read(tmp_path, line, policy=policy)) == (1, message, key)


def test_a_task_row_without_a_policy_is_a_problem(tmp_path: Path) -> None:
    assert only_problem(read(tmp_path, task_row(task="support", label="billing"))) == (
        1,
        "the row names task 'support', but no policy was given to read its questions from",
        "task",
    )
