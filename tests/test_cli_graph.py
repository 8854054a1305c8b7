"""`fastslow graph run` offline: the final state as JSON on stdout, what happened in words on stderr,
and an exit status that reads as the success an offline run is."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.cli._graph import summary

runner = CliRunner()


def test_an_offline_support_run_says_what_system_1_decided_and_what_comes_next() -> None:
    result = runner.invoke(
        app, ["graph", "run", "support-triage", "--input", "I was charged twice for my subscription this month"]
    )
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    assert state["outcome"] == "needs_system2"
    assert [(s["node"], s["status"]) for s in state["steps"]] == [("billing", "skipped")]
    said = result.stderr
    assert "System 1 routed the message to billing" in said
    assert "Done offline: System 1's part is done; the billing step needs a System-2 model" in said
    assert "FASTSLOW_SYSTEM2__DEFAULT" in said


def test_the_offline_tool_demo_reaches_the_policy_gate() -> None:
    result = runner.invoke(app, ["graph", "run", "guarded-tools", "--input", "delete every file in the sandbox"])
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    proposed = [c for m in state["messages"] for c in m.get("tool_calls", [])]
    assert proposed and {c["name"] for c in proposed} == {"delete_file"}
    judged = len(state.get("gate", [])) + len(state.get("interrupts", []))
    assert judged >= 1
    assert "Policy gate: " in result.stderr


def test_the_summary_names_reviews_and_failed_models() -> None:
    paused = {
        "interrupts": [
            {
                "id": "i",
                "value": {
                    "tool_call": {"id": "c", "name": "shell", "args": {"command": "rm -rf /srv"}},
                    "rule": "destructive_action",
                    "probability": 0.6,
                },
            }
        ]
    }
    [line] = summary(paused)
    assert "review shell(command=rm -rf /srv)" in line and "paused for a person" in line
    failed = {"outcome": "engine_error", "steps": [{"node": "agent", "status": "failed", "detail": "model x failed"}]}
    assert summary(failed) == ["A model failed: model x failed"]
