"""The policy file's shape: what each key means once parsed into the router's dataclasses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fastslow.policies import PolicyFile, load_policy, parse_policy
from fastslow.router import (
    Calibration,
    CheckAction,
    CheckTask,
    Choice,
    ClassifyTask,
    Egress,
    Noul,
    OpenEnded,
    ReadOptions,
    Route,
    RouteTask,
    Score,
    Sticky,
    Thresholds,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "policy.yaml"

ROUTES = """
tasks:
  support:
    kind: route
    routes:
      billing: Charges and refunds
      technical: {description: Errors and crashes, examples: [the app crashes]}
"""


def route_task(text: str = ROUTES, name: str = "support") -> RouteTask:
    task = parse_policy(text).tasks[name]
    assert isinstance(task, RouteTask)
    return task


def validate(data: dict[str, Any]) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as info:
        PolicyFile.model_validate(data)
    return [dict(e) for e in info.value.errors()]


# -- the shipped example ------------------------------------------------------------------------


def test_example_file_loads_into_one_task_of_each_kind() -> None:
    policy = load_policy(
        EXAMPLE, needs_examples=lambda engine: frozenset({"noul"}) if engine == "embedded" else frozenset()
    )
    assert policy.version.startswith("sha256:") and len(policy.version) == len("sha256:") + 16
    assert policy.source == str(EXAMPLE)
    assert policy.egress_allow == ("http://llm.internal:8000/v1",)
    assert policy.default_escalate_to == "openai:gpt-5.5"
    assert {name: task.kind for name, task in policy.tasks.items()} == {
        "support": "route",
        "triage": "classify",
        "tool_safety": "check",
    }


def test_example_routing_task() -> None:
    task = load_policy(EXAMPLE).tasks["support"]
    assert isinstance(task, RouteTask)
    assert list(task.routes) == ["billing", "technical", "account", "other"]
    assert task.none_option == "other"
    # "other" is listed with examples of its own: what is not a support request (docs/benchmarks.md).
    other = task.routes["other"]
    assert other.description == "None of the other routes fits - not a request for the support teams."
    assert len(other.examples) == 60
    assert all(len(task.routes[r].examples) >= 30 for r in ("billing", "technical", "account"))
    assert task.question.options == ("billing", "technical", "account", "other")
    assert task.instructions == "Which team should handle the customer's latest message?"
    assert task.open_ended is not None and task.open_ended.threshold == 0.6
    assert {k: len(v) for k, v in task.open_ended.examples.items()} == {"yes": 4, "no": 10}
    assert task.sticky == Sticky(enabled=True, min_change_confidence=0.85)
    assert task.thresholds == Thresholds(min_confidence=0.7, min_margin=0.15)
    assert task.read == ReadOptions(timeout_s=2.0)
    assert task.on_failure == "escalate"


def test_example_classify_task() -> None:
    task = load_policy(EXAMPLE).tasks["triage"]
    assert isinstance(task, ClassifyTask)
    urgency, sentiment = task.questions["urgency"], task.questions["sentiment"]
    assert isinstance(urgency, Score) and len(urgency.levels) == 4
    assert isinstance(sentiment, Choice) and sentiment.options == ("positive", "neutral", "negative")
    # A level's text and its index name the same option: the answer is keyed by index.
    assert set(task.examples["urgency"]) == {"0", "3"}
    assert task.examples["sentiment"]["positive"] == ("Thanks so much, the new export is brilliant",)
    assert task.calibration == Calibration(temperature=1.5)
    # The task sets min_confidence; min_margin still comes from defaults.
    assert task.thresholds == Thresholds(min_confidence=0.6, min_margin=0.15)
    assert task.escalate_to == "anthropic:claude-sonnet-4-6"


def test_example_check_task() -> None:
    task = load_policy(EXAMPLE).tasks["tool_safety"]
    assert isinstance(task, CheckTask)
    assert task.on_failure == "fail_closed"
    assert task.egress == Egress(local_only=True)
    assert task.read == ReadOptions(samples=8, steps=4, think=0, timeout_s=2.0)
    assert set(task.rules) == {"destructive_action", "data_exfiltration"}
    for rule in task.rules.values():
        assert isinstance(rule.question, Noul)
        assert set(rule.examples) == {"yes", "no"}
        assert all(len(texts) >= 15 for texts in rule.examples.values())
    assert task.rules["destructive_action"].action == CheckAction(deny_at=0.5, allow_at=0.15, violation="yes")


# -- defaults -----------------------------------------------------------------------------------


def test_defaults_merge_under_every_task_and_task_values_win() -> None:
    policy = parse_policy(
        """
defaults:
  engine: jev
  escalate_to: anthropic:claude-sonnet-4-6
  engine_options: {samples: auto, timeout_s: 1.5}
  thresholds: {min_confidence: 0.8, min_label_mass: 0.5}
  calibration: {temperature: 2.0}
  egress: {local_only: true}
  store_state: true
  on_failure: review
tasks:
  a:
    kind: route
    routes: {x: X, y: Y}
  b:
    kind: route
    engine: logprob
    engine_options: {samples: 4}
    thresholds: {min_confidence: 0.6}
    store_state: false
    routes: {x: X, y: Y}
"""
    )
    a, b = policy.tasks["a"], policy.tasks["b"]
    assert a.engine == "jev" and b.engine == "logprob"
    assert a.escalate_to == b.escalate_to == "anthropic:claude-sonnet-4-6"
    assert a.read == ReadOptions(samples="auto", timeout_s=1.5)
    assert b.read == ReadOptions(samples=4, timeout_s=1.5)
    assert a.thresholds == Thresholds(min_confidence=0.8, min_label_mass=0.5)
    assert b.thresholds == Thresholds(min_confidence=0.6, min_label_mass=0.5)
    assert a.calibration == b.calibration == Calibration(temperature=2.0)
    assert a.egress.local_only and b.egress.local_only
    assert a.store_state and not b.store_state
    assert a.on_failure == b.on_failure == "review"
    assert policy.default_escalate_to == "anthropic:claude-sonnet-4-6"


def test_without_defaults_tasks_get_the_routers_defaults() -> None:
    task = route_task()
    assert task.engine is None and task.escalate_to is None
    assert task.read == ReadOptions()
    assert task.thresholds == Thresholds()
    assert task.calibration == Calibration()
    assert task.egress == Egress()
    assert task.on_failure == "escalate" and not task.store_state
    assert task.open_ended is None and task.none_option is None
    assert task.context_turns == 2 and task.sticky == Sticky()


def test_checks_fail_closed_unless_told_otherwise() -> None:
    text = """
tasks:
  guard:
    kind: check
    engine: jev
    rules:
      pii: Does the message contain personal data?
"""
    task = parse_policy(text).tasks["guard"]
    assert isinstance(task, CheckTask) and task.on_failure == "fail_closed"
    # A bare string is shorthand for a yes/no rule with those instructions and the default band.
    assert task.rules["pii"].question == Noul(instructions="Does the message contain personal data?")
    assert task.rules["pii"].action == CheckAction()


# -- route tasks --------------------------------------------------------------------------------


def test_routes_take_a_bare_description_or_a_mapping() -> None:
    task = route_task()
    assert task.routes["billing"] == Route(name="billing", description="Charges and refunds")
    assert task.routes["technical"].examples == ("the app crashes",)
    assert task.examples == {"technical": ("the app crashes",)}


def test_none_of_these_already_listed_keeps_its_description() -> None:
    task = route_task(ROUTES + "    none_of_these: billing\n")
    assert task.none_option == "billing" and len(task.routes) == 2
    assert task.routes["billing"].description == "Charges and refunds"


def test_open_ended_true_uses_the_routers_question() -> None:
    task = route_task(ROUTES + "    open_ended: true\n")
    assert task.open_ended == OpenEnded()
    assert route_task(ROUTES + "    open_ended: false\n").open_ended is None


def test_open_ended_with_own_instructions() -> None:
    task = route_task(ROUTES + "    open_ended: {instructions: 'Is this creative writing?', threshold: 0.4}\n")
    assert task.open_ended is not None
    assert task.open_ended.question == Noul(instructions="Is this creative writing?")
    assert task.open_ended.threshold == 0.4


def test_sticky_accepts_a_bare_boolean() -> None:
    assert route_task(ROUTES + "    sticky: false\n").sticky == Sticky(enabled=False)


# -- classify and check -------------------------------------------------------------------------


def test_questions_default_to_yes_no_and_accept_true_false_example_keys() -> None:
    task = parse_policy(
        """
tasks:
  c:
    kind: classify
    questions:
      refund:
        instructions: Does the user ask for a refund?
        yes: they want money back
        examples: {true: [refund me please], false: [thanks, all good]}
"""
    ).tasks["c"]
    assert isinstance(task, ClassifyTask)
    assert task.questions["refund"] == Noul(instructions="Does the user ask for a refund?", yes="they want money back")
    assert task.examples == {"refund": {"yes": ("refund me please",), "no": ("thanks", "all good")}}


def test_choice_rule_with_a_named_violation() -> None:
    task = parse_policy(
        """
tasks:
  guard:
    kind: check
    engine: jev
    rules:
      tone:
        type: choice
        instructions: What tone does the reply take?
        criteria: {polite: courteous, rude: insulting or hostile, neutral: ~}
        violation: rude
        deny_at: 0.9
        allow_at: 0.9
"""
    ).tasks["guard"]
    assert isinstance(task, CheckTask)
    rule = task.rules["tone"]
    assert rule.question == Choice(
        criteria={"polite": "courteous", "rude": "insulting or hostile", "neutral": None},
        instructions="What tone does the reply take?",
    )
    assert rule.action == CheckAction(deny_at=0.9, allow_at=0.9, violation="rude")


def test_numeric_examples_are_texts() -> None:
    task = route_task(ROUTES.replace("[the app crashes]", "[404, 3.5]"))
    assert task.routes["technical"].examples == ("404", "3.5")


# -- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "error_type", "loc_tail"),
    [
        ({"thresholds": {"min_confidence": 1.2}}, "less_than_equal", ("thresholds", "min_confidence")),
        ({"thresholds": {"min_margin": -0.1}}, "greater_than_equal", ("thresholds", "min_margin")),
        ({"calibration": {"temperature": 0}}, "greater_than", ("calibration", "temperature")),
        ({"engine_options": {"samples": 0}}, "samples", ("engine_options", "samples")),
        ({"engine_options": {"steps": 9}}, "less_than_equal", ("engine_options", "steps")),
        ({"engine": "jevv"}, "engine", ("engine",)),
        ({"escalate_to": "gpt-5.5"}, "model_ref", ("escalate_to",)),
        ({"on_failure": "explode"}, "literal_error", ("on_failure",)),
        ({"context_turns": -1}, "greater_than_equal", ("context_turns",)),
        ({"routes": {"a:b": "x", "c": "y"}}, "bad_name", ("routes",)),
        ({"routes": {"only": "x"}}, "few_routes", ()),
        ({"treshold": 1}, "unknown_key", ()),
    ],
)
def test_route_task_fields_are_checked(patch: dict[str, Any], error_type: str, loc_tail: tuple[str, ...]) -> None:
    task = {"kind": "route", "routes": {"a": "A", "b": "B"}} | patch
    errors = validate({"tasks": {"t": task}})
    assert [e["type"] for e in errors] == [error_type]
    assert errors[0]["loc"] == ("tasks", "t", "route", *loc_tail)


def test_unknown_keys_suggest_the_closest_allowed_key() -> None:
    (error,) = validate({"tasks": {"t": {"kind": "route", "routes": {"a": "A", "b": "B"}, "treshold": 1}}})
    assert error["msg"] == "unknown key 'treshold'; did you mean 'thresholds'?"
    assert error["ctx"]["at"] == ("treshold",)


def test_egress_keys_in_the_wrong_place_get_a_hint() -> None:
    route = {"kind": "route", "routes": {"a": "A", "b": "B"}}
    (error,) = validate({"tasks": {"t": route | {"egress": {"allowed_base_urls": []}}}})
    assert "top-level egress.allowed_base_urls" in error["msg"]
    (error,) = validate({"egress": {"local_only": True}, "tasks": {"t": route}})
    assert "per task" in error["msg"]


def test_a_key_of_another_question_type_gets_a_hint() -> None:
    (error,) = validate(
        {"tasks": {"t": {"kind": "classify", "questions": {"q": {"type": "score", "criteria": ["lo", "hi"]}}}}}
    )
    assert "levels" in error["msg"]


@pytest.mark.parametrize(
    ("rule", "error_type"),
    [
        ({"instructions": "x", "allow_at": 0.9, "deny_at": 0.5}, "band"),
        ({"instructions": "x", "deny_at": 1.5}, "less_than_equal"),
        ({"yes": "bad", "violation": "maybe"}, "literal_error"),
        ({}, "noul_text"),
        ({"type": "choice", "criteria": {"a": "A", "b": "B"}}, "violation"),
        ({"type": "choice", "criteria": {"a": "A"}, "violation": "a"}, "too_short"),
        ({"instructions": "x", "examples": {"yes": ["a"], "maybe": ["b"]}}, "literal_error"),
        (
            {"type": "choice", "criteria": {"a": "A", "b": "B"}, "violation": "a", "examples": {"c": ["x"]}},
            "unknown_option",
        ),
        ({"type": "choise", "instructions": "x"}, "union_tag_invalid"),
    ],
)
def test_rules_are_checked(rule: dict[str, Any], error_type: str) -> None:
    errors = validate({"tasks": {"t": {"kind": "check", "rules": {"r": rule}}}})
    assert error_type in [e["type"] for e in errors]


def test_unknown_task_kind_and_missing_kind() -> None:
    (bad,) = validate({"tasks": {"t": {"kind": "rout"}}})
    assert bad["type"] == "union_tag_invalid"
    (missing,) = validate({"tasks": {"t": {"routes": {}}}})
    assert missing["type"] == "union_tag_not_found"


def test_top_level_is_checked() -> None:
    assert [e["type"] for e in validate({})] == ["missing"]
    assert [e["type"] for e in validate({"tasks": {}})] == ["too_short"]
    assert [e["type"] for e in validate({"version": 2, "tasks": {"t": {"kind": "route"}}})][0] == "literal_error"
    errors = validate({"egress": {"allowed_base_urls": ["ftp://x"]}, "tasks": {"t": {"kind": "route", "routes": {}}}})
    assert "base_url" in [e["type"] for e in errors]


def test_egress_urls_lose_their_trailing_slash() -> None:
    policy = parse_policy(ROUTES + "egress: {allowed_base_urls: ['http://gpu-box:8000/v1/']}\n")
    assert policy.egress_allow == ("http://gpu-box:8000/v1",)


def test_json_schema_for_editors() -> None:
    schema = PolicyFile.model_json_schema()
    assert schema["required"] == ["tasks"] and schema["additionalProperties"] is False


def test_the_documented_examples_parse() -> None:
    docs = (EXAMPLE.parent.parent / "docs" / "policies.md").read_text()
    blocks = [b.split("```", 1)[0] for b in docs.split("```yaml\n")[1:]]
    assert len(blocks) >= 4
    for block in blocks:
        assert parse_policy(block).tasks
