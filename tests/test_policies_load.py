"""Loading policy files: errors name the file, line and key; versions are content hashes."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from fastslow.policies import load_policy, parse_policy, policy_version
from fastslow.router import CheckTask, ConfigError, RouteTask

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "policy.yaml"


def embedded_needs(engine: str | None) -> frozenset[str]:
    """Like the real registry: the embedded engine is near chance on yes/no questions without examples."""
    return frozenset({"noul"}) if engine == "embedded" else frozenset()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def error_for(tmp_path: Path, text: str) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_policy(path, needs_examples=embedded_needs)
    assert info.value.path == str(path)
    return info.value


# -- each bad file names file, line and key -----------------------------------------------------


def test_misspelt_key_with_suggestion(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          support:
            kind: route
            routes: {a: A, b: B}
            treshold: {min_confidence: 0.5}
        """,
    )
    assert (error.line, error.key) == (5, "tasks.support.treshold")
    assert error.message == "unknown key 'treshold'; did you mean 'thresholds'?"
    assert str(error) == (
        f"{tmp_path / 'policy.yaml'}:5: unknown key 'treshold'; did you mean 'thresholds'? "
        "(key 'tasks.support.treshold')"
    )


def test_misspelt_nested_key(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          support:
            kind: route
            routes: {a: A, b: B}
            thresholds:
              min_confidence: 0.5
              min_margn: 0.1
        """,
    )
    assert (error.line, error.key) == (7, "tasks.support.thresholds.min_margn")
    assert "did you mean 'min_margin'?" in error.message


def test_wrong_type(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          support:
            kind: route
            context_turns: many
            routes: {a: A, b: B}
        """,
    )
    assert (error.line, error.key) == (4, "tasks.support.context_turns")
    assert "context_turns should be a valid integer" in error.message and "'many'" in error.message


def test_out_of_range(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          tool_safety:
            kind: check
            engine: jev
            rules:
              delete:
                instructions: Does the call delete data?
                deny_at: 1.5
        """,
    )
    assert (error.line, error.key) == (8, "tasks.tool_safety.rules.delete.deny_at")
    assert error.message == "deny_at should be less than or equal to 1, got 1.5"


def test_allow_at_above_deny_at(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          tool_safety:
            kind: check
            engine: jev
            rules:
              delete:
                instructions: Does the call delete data?
                deny_at: 0.5
                allow_at: 0.7
        """,
    )
    assert (error.line, error.key) == (9, "tasks.tool_safety.rules.delete.allow_at")
    assert error.message == "allow_at (0.7) is above deny_at (0.5); need allow_at <= deny_at"


def test_unknown_kind(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          triage:
            kind: clasify
        """,
    )
    assert (error.line, error.key) == (3, "tasks.triage.kind")
    assert error.message == "unknown kind 'clasify'; expected one of route, classify, check; did you mean 'classify'?"


def test_unknown_question_type(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          triage:
            kind: classify
            questions:
              urgency:
                type: scor
                levels: [low, high]
        """,
    )
    assert (error.line, error.key) == (6, "tasks.triage.questions.urgency.type")
    assert "did you mean 'score'?" in error.message


def test_yaml_syntax_error(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          support:
            kind: route
            routes: {a: A, b: B
          other: 1
        """,
    )
    assert error.line == 5 and error.key is None
    assert error.message.startswith("invalid YAML:") and "(from line 4)" in error.message


def test_tab_indentation_is_a_syntax_error_with_a_line(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("tasks:\n  support:\n\tkind: route\n")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.line == 3 and "invalid YAML" in info.value.message


def test_missing_required_key_points_at_its_parent(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        version: 1
        tasks:
          tool_safety:
            kind: check
        """,
    )
    assert (error.line, error.key) == (3, "tasks.tool_safety.rules")
    assert error.message == "missing required key 'rules'"


def test_missing_kind(tmp_path: Path) -> None:
    error = error_for(tmp_path, "tasks:\n  support:\n    routes: {a: A, b: B}\n")
    assert (error.line, error.key) == (2, "tasks.support.kind")
    assert error.message == "missing key 'kind'; expected one of route, classify, check"


def test_unknown_example_option(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          guard:
            kind: check
            rules:
              delete:
                instructions: Does the call delete data?
                examples:
                  yes: [rm -rf /]
                  no: [ls]
                  mabye: [mv a b]
        """,
    )
    assert (error.line, error.key) == (10, "tasks.guard.rules.delete.examples.mabye")
    assert error.message == "unknown option 'mabye'; expected yes or no"


def test_further_problems_ride_along_as_notes(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          support:
            kind: route
            routes: {a: A, b: B}
            engine: jevv
            escalate_to: gpt
        """,
    )
    assert (error.line, error.key) == (5, "tasks.support.engine")
    assert "did you mean 'jev'?" in error.message
    assert len(error.__notes__) == 1 and ":6: escalate_to must be 'provider:model'" in error.__notes__[0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the policy file is empty"),
        ("- a\n- b\n", "a policy file is a mapping with a 'tasks' key, not a list"),
        ("version: 1\n", "missing required key 'tasks'"),
    ],
)
def test_whole_file_problems_point_at_line_one(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.line == 1 and info.value.message.startswith(message)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_policy(tmp_path / "missing.yaml")
    assert info.value.path == str(tmp_path / "missing.yaml") and "cannot read" in info.value.message


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"tasks: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_policy(path)


# -- YAML the way policy authors write it -------------------------------------------------------


def test_yes_and_no_stay_option_names(tmp_path: Path) -> None:
    # YAML 1.1 would read these keys as booleans; a policy file means the options.
    policy = load_policy(
        write(
            tmp_path,
            """
            tasks:
              guard:
                kind: check
                store_state: true
                rules:
                  delete:
                    yes: the call deletes data
                    no: the call only reads
                    violation: yes
                    examples: {yes: [rm -rf /], no: [ls]}
            """,
        ),
        needs_examples=embedded_needs,
    )
    task = policy.tasks["guard"]
    assert isinstance(task, CheckTask) and task.store_state is True
    rule = task.rules["delete"]
    assert rule.action.violation == "yes" and rule.examples == {"yes": ("rm -rf /",), "no": ("ls",)}


def test_numbers_times_and_dates_in_examples_stay_as_written() -> None:
    routes = "    routes:\n      a: {examples: [017, 1:30, 2024-01-01, 404, on]}\n      b: B\n"
    text = "tasks:\n  r:\n    kind: route\n" + routes
    task = parse_policy(text).tasks["r"]
    assert isinstance(task, RouteTask)
    assert task.routes["a"].examples == ("017", "1:30", "2024-01-01", "404", "on")


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    error = error_for(
        tmp_path,
        """
        tasks:
          support:
            kind: route
            routes: {a: A, b: B}
          support:
            kind: route
        """,
    )
    assert (error.line, error.key) == (5, "tasks.support")
    assert error.message == "duplicate key 'support'"


def test_x_keys_hold_anchors_and_are_otherwise_ignored(tmp_path: Path) -> None:
    policy = load_policy(
        write(
            tmp_path,
            """
            x-strict: &strict
              kind: route
              thresholds: {min_confidence: 0.9}
              routes: {x: X, y: Y}
            tasks:
              a: *strict
              b:
                <<: *strict
                thresholds: {min_confidence: 0.5}
            """,
        )
    )
    a, b = policy.tasks["a"], policy.tasks["b"]
    assert isinstance(b, RouteTask) and list(b.routes) == ["x", "y"]
    # A merge key fills in only what the mapping does not set itself.
    assert a.thresholds.min_confidence == 0.9 and b.thresholds.min_confidence == 0.5


# -- the example requirement --------------------------------------------------------------------

NO_EXAMPLES = """
tasks:
  tool_safety:
    kind: check
    {engine}
    rules:
      delete:
        instructions: Does the call delete data?
        {examples}
"""


def test_yes_no_rule_without_examples_is_refused_on_the_embedded_engine() -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(NO_EXAMPLES.format(engine="", examples=""), source="p.yaml", needs_examples=embedded_needs)
    error = info.value
    assert (error.path, error.line, error.key) == ("p.yaml", 7, "tasks.tool_safety.rules.delete")
    assert error.message == (
        "rule 'delete' of task 'tool_safety' is a yes/no question without examples, and the embedded engine is "
        "near chance on yes/no questions without examples; add examples: {yes: [...], no: [...]} "
        "or choose an engine such as jev"
    )


def test_one_sided_examples_are_not_enough() -> None:
    text = NO_EXAMPLES.format(engine="", examples="examples: {yes: [rm -rf /]}")
    with pytest.raises(ConfigError, match="without examples for 'no'"):
        parse_policy(text, needs_examples=embedded_needs)


def test_the_default_engine_decides_when_a_task_names_none() -> None:
    text = NO_EXAMPLES.format(engine="", examples="")
    assert parse_policy(text, needs_examples=embedded_needs, default_engine="jev").tasks["tool_safety"]
    with pytest.raises(ConfigError):
        parse_policy(text, needs_examples=embedded_needs, default_engine="embedded")


def test_accepted_on_jev_with_examples_or_without_the_check() -> None:
    jev = NO_EXAMPLES.format(engine="engine: jev", examples="")
    assert parse_policy(jev, needs_examples=embedded_needs).tasks["tool_safety"].engine == "jev"
    with_examples = NO_EXAMPLES.format(engine="", examples="examples: {yes: [rm -rf /], no: [ls -la]}")
    assert parse_policy(with_examples, needs_examples=embedded_needs).tasks["tool_safety"]
    assert parse_policy(NO_EXAMPLES.format(engine="", examples="")).tasks["tool_safety"]


def test_open_ended_and_classify_questions_need_examples_too() -> None:
    route = "tasks:\n  r:\n    kind: route\n    routes: {a: A, b: B}\n    open_ended: true\n"
    with pytest.raises(ConfigError) as info:
        parse_policy(route, needs_examples=embedded_needs)
    assert info.value.key == "tasks.r.open_ended" and info.value.line == 5
    classify = "tasks:\n  c:\n    kind: classify\n    questions:\n      refund: Does the user want a refund?\n"
    with pytest.raises(ConfigError, match="question 'refund' of task 'c'") as info:
        parse_policy(classify, needs_examples=embedded_needs)
    assert info.value.line == 5


def test_route_examples_required_when_the_engine_needs_them_for_choices() -> None:
    text = (
        "tasks:\n  r:\n    kind: route\n    none_of_these: other\n    routes:\n      a: {examples: [x]}\n      b: B\n"
    )
    with pytest.raises(ConfigError, match="without examples for 'b'") as info:
        parse_policy(text, needs_examples=lambda engine: frozenset({"choice"}))
    assert info.value.key == "tasks.r.routes"


def test_the_example_file_passes_the_requirement() -> None:
    assert load_policy(EXAMPLE, needs_examples=embedded_needs).tasks


# -- versions -----------------------------------------------------------------------------------


def test_version_is_the_content_hash(tmp_path: Path) -> None:
    text = "tasks:\n  r:\n    kind: route\n    routes: {a: A, b: B}\n"
    path = write(tmp_path, text)
    first = load_policy(path).version
    assert first == policy_version(text.encode()) == load_policy(path).version
    assert first.startswith("sha256:") and len(first) == 23
    path.write_text(text + "# a comment is a change\n")
    assert load_policy(path).version != first
    path.write_text(text)
    assert load_policy(path).version == first
    assert parse_policy(text).version == parse_policy(text.encode()).version == first


def test_libyaml_and_the_python_parser_read_a_policy_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastslow.policies._load as load

    if not load._FAST_LOADERS:
        pytest.skip("PyYAML is built without libyaml here: the pure-Python parser is the only one")
    text = EXAMPLE.read_text(encoding="utf-8") + "\nx-scalars: [yes, no, on, 017, 0x1F, 1e3, 2001-12-14, .inf, ~]\n"
    fast_loader, fast = load._compose(text)
    assert type(fast_loader) in load._FAST_LOADERS
    fast_builder = load._Builder(fast_loader, "policy.yaml")
    fast_policy = parse_policy(text, source="a")
    monkeypatch.setattr(load, "_FAST_LOADERS", ())
    slow_loader, slow = load._compose(text)
    assert type(slow_loader) is load._Loader
    slow_builder = load._Builder(slow_loader, "policy.yaml")
    # The same data, the same YAML 1.2 scalars (yes stays text, 017 stays text), the same key lines.
    assert fast_builder.build(fast) == slow_builder.build(slow)
    assert fast_builder.lines == slow_builder.lines
    assert parse_policy(text, source="a") == fast_policy


def test_malformed_yaml_reads_the_same_whichever_parser_is_tried_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastslow.policies._load as load

    text = "tasks:\n  support:\n    kind: route\n    routes: {a: A, b: B\n  other: 1\n"
    first = error_for(tmp_path, text)
    monkeypatch.setattr(load, "_FAST_LOADERS", ())
    python_only = error_for(tmp_path, text)
    assert (first.message, first.line, first.key) == (python_only.message, python_only.line, python_only.key)
