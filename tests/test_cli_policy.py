"""Every command that reads a policy finds it by one rule and reports a bad one the same way;
`fastslow policy check` validates a file as the service would; `fastslow eval` never reports
success on nothing; `fastslow tune` says what its thresholds cannot vouch for."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.policies import BUILTIN_POLICY, load_policy
from fastslow.policies.tuning import Labelled, threshold_warnings, tune_thresholds

runner = CliRunner()

# Line 5 is one space deeper than the other keys of its mapping: PyYAML says only "mapping values
# are not allowed here".
MISINDENTED = "version: 1\ntasks:\n  support:\n    kind: route\n     instructions: Which team?\n"


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(MISINDENTED)
    return path


def test_policy_check_summarises_a_good_file() -> None:
    result = runner.invoke(app, ["policy", "check", str(BUILTIN_POLICY)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "support: route on embedded" in out
    assert "thresholds: min_confidence" in out
    assert "rule destructive_action: deny at >=" in out
    assert out.rstrip().endswith("ok: 3 task(s)")


def test_policy_check_json_is_one_object_with_every_task() -> None:
    result = runner.invoke(app, ["policy", "check", str(BUILTIN_POLICY), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["ok"] is True
    assert set(summary["tasks"]) == {"support", "triage", "tool_safety"}
    support = summary["tasks"]["support"]
    assert support["kind"] == "route" and support["engine"] == "embedded"
    assert "other" in support["routes"] and support["none_of_these"] == "other"
    assert set(summary["tasks"]["tool_safety"]["rules"]) == {"destructive_action", "data_exfiltration"}
    assert summary["version"].startswith("sha256:")


def test_policy_check_shows_fitted_records(tmp_path: Path) -> None:
    policy = tmp_path / "fitted.yaml"
    policy.write_text(
        "version: 1\ntasks:\n  t:\n    kind: classify\n    engine: sparrow\n    questions:\n"
        "      q: {type: choice, instructions: How urgent?, criteria: {now: ~, later: ~}}\n"
        "    thresholds: {min_confidence: 0.8}\n"
        "    fitted:\n      thresholds: {by: fastslow tune, date: '2026-12-01', data: rows.jsonl, engine: embedded}\n"
    )
    result = runner.invoke(app, ["policy", "check", str(policy)])
    assert result.exit_code == 0, result.output
    assert "t: classify on sparrow" in result.stdout
    assert "fitted thresholds: by fastslow tune, date 2026-12-01, data rows.jsonl, engine embedded" in result.stdout
    summary = json.loads(runner.invoke(app, ["policy", "check", str(policy), "--json"]).stdout)
    assert summary["tasks"]["t"]["fitted"]["thresholds"]["by"] == "fastslow tune"
    # Fitted for another engine than the task runs on: named, as the service names it at load.
    assert any("fitted for engine 'embedded'" in w for w in summary["warnings"])


def test_policy_check_names_file_line_and_a_hint_for_a_bad_file(broken: Path) -> None:
    result = runner.invoke(app, ["policy", "check", str(broken)])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {broken}:5: invalid YAML")
    assert "indentation" in line and "line 5 is indented 5 spaces" in line
    result = runner.invoke(app, ["policy", "check", str(broken), "--json"])
    assert result.exit_code == 2
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["file"] == str(broken)
    assert report["error"]["line"] == 5


def test_policy_check_names_the_key_of_a_schema_error(tmp_path: Path) -> None:
    policy = tmp_path / "typo.yaml"
    policy.write_text(
        "version: 1\ntasks:\n  t:\n    kind: classify\n    engine: sparrow\n"
        "    questions:\n      q: Urgent?\n    thershold: 1\n"
    )
    result = runner.invoke(app, ["policy", "check", str(policy), "--json"])
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["line"] == 8 and "thershold" in (error["key"] or "")
    assert "did you mean 'thresholds'" in error["message"]


def test_policy_check_of_a_missing_file_fails(tmp_path: Path) -> None:
    result = runner.invoke(app, ["policy", "check", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such policy file" in result.stderr


def test_policy_check_without_a_file_checks_the_one_in_force(
    tmp_path: Path, broken: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(broken, tmp_path / "fastslow-policy.yaml")
    result = runner.invoke(app, ["policy", "check"])
    assert result.exit_code == 2
    assert "fastslow-policy.yaml:5: invalid YAML" in result.stderr


@pytest.mark.parametrize("command", [["graph", "list"], ["serve", "--port", "1"]])
def test_commands_that_read_the_policy_report_a_bad_one_alike(
    command: list[str], broken: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTSLOW_POLICY_FILE", str(broken))
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""  # graph list printed its graphs before it checked nothing
    assert result.stderr.startswith(f"error: {broken}:5: invalid YAML")


def test_a_tab_in_the_indentation_gets_its_own_hint(tmp_path: Path) -> None:
    policy = tmp_path / "tab.yaml"
    policy.write_text("version: 1\ntasks:\n\tsupport:\n    kind: route\n")
    result = runner.invoke(app, ["policy", "check", str(policy)])
    assert result.exit_code == 2
    assert ":3: invalid YAML" in result.stderr and "spaces only" in result.stderr


def test_no_flag_shows_a_value_type_in_help() -> None:
    for command in (["--help"], ["eval", "--help"], ["policy", "check", "--help"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 0
        assert "<bool>" not in result.stdout, command
    assert "<path>" in runner.invoke(app, ["eval", "--help"]).stdout  # options with values keep theirs


# -- eval: one rule for the policy, and no success on nothing -------------------------------------


def test_eval_with_no_answerable_row_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"task": "suport", "state": "I was charged twice", "label": "billing"}\n')
    result = runner.invoke(app, ["eval", "--data", str(rows), "--out", "report", "--no-progress"])
    assert result.exit_code == 3, result.output
    assert "unknown task 'suport'" in result.stderr and "did you mean 'support'" in result.stderr
    assert "error: no row was answered: every row was bad" in result.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = runner.invoke(app, ["eval", "--data", str(empty), "--out", "report2", "--no-progress"])
    assert result.exit_code == 3
    assert "no row was answered: the file has no row to run" in result.stderr


def test_eval_reads_task_rows_with_the_policy_every_command_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A policy of the working directory, with a task the built-in one lacks: without --task too.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fastslow-policy.yaml").write_text(
        "version: 1\ntasks:\n  mood:\n    kind: classify\n    engine: sparrow\n    questions:\n"
        "      feeling: {type: choice, instructions: How does the customer feel?, criteria: {happy: ~, upset: ~}}\n"
    )
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"task": "mood", "state": "Thanks, that fixed it!", "labels": {"feeling": "happy"}}\n')
    for extra in ([], ["--task", "mood"]):
        result = runner.invoke(app, ["eval", "--data", str(rows), "--out", f"r{len(extra)}", "--no-progress", *extra])
        assert result.exit_code == 0, result.output
        assert "policy: " in result.stderr and "fastslow-policy.yaml in the working directory" in result.stderr
        assert "rows 1, labelled 1" in result.stdout


def test_eval_of_explicit_rows_reads_no_policy(tmp_path: Path, broken: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(broken, tmp_path / "fastslow-policy.yaml")  # never read: no row names a task
    rows = tmp_path / "rows.jsonl"
    question = {"q": {"type": "noul", "instructions": "Is the customer happy?"}}
    rows.write_text(json.dumps({"state": "Thanks!", "questions": question, "labels": {"q": "yes"}}) + "\n")
    result = runner.invoke(app, ["eval", "--data", str(rows), "--out", "r", "--engine", "sparrow", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "policy:" not in result.stderr
    assert json.loads((tmp_path / "r" / "run.json").read_text())["policy"] is None


# -- tune: what its thresholds cannot vouch for ----------------------------------------------------


def _confident(n: int, label: str = "billing") -> list[Labelled]:
    return [Labelled(probabilities={label: 0.97, "technical": 0.02, "other": 0.01}, label=label) for _ in range(n)]


def _collected(labels: list[str]) -> Any:
    support = load_policy(BUILTIN_POLICY).tasks["support"]
    rows = [SimpleNamespace(label=label) for label in labels]
    return cast(Any, SimpleNamespace(task=support, fit=rows, held_out=[]))


def test_tune_warns_when_no_row_is_out_of_scope_and_the_point_is_the_loosest() -> None:
    choice = tune_thresholds(_confident(300), _confident(300), target=0.9)
    assert (choice.min_confidence, choice.min_margin) == (0.5, 0.0)
    warnings = threshold_warnings(_collected(["billing"] * 10), choice)
    assert len(warnings) == 2
    assert "no row is labelled 'other'" in warnings[0]
    assert "the loosest the search tries" in warnings[1]
    # Out-of-scope rows among them: only the edge is left to warn about.
    [edge] = threshold_warnings(_collected(["billing", "other"]), choice)
    assert "loosest" in edge
