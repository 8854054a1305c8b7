"""`fastslow decide`: a Jev request body in, a Jev response body out; one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _body(**questions: object) -> str:
    return json.dumps({"state": "I was charged twice, refund me", "questions": questions})


@pytest.mark.parametrize(
    ("stdin", "expected"),
    [
        (_body(q={"type": "maybe"}), "questions.q.type: unknown question type 'maybe'"),
        (_body(q={"type": "choice", "criteria": {"one": None}}), "questions.q.criteria: a choice needs at least 2"),
        (_body(q={"type": "choice", "criteria": {}}), "questions.q.criteria"),
        (_body(), "questions: questions must be a non-empty object"),
        ('{"state": "x", "questions": ', "body: invalid JSON"),
        (json.dumps({"state": "x" * 1_000_001, "questions": {"q": {"type": "noul", "instructions": "y"}}}), "state:"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(stdin: str, expected: str) -> None:
    result = runner.invoke(app, ["decide", "--engine", "sparrow"], input=stdin)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.output


def test_unknown_engine_and_missing_files_are_reported() -> None:
    result = runner.invoke(app, ["decide", "--engine", "gpt"], input=_body())
    assert result.exit_code == 2
    assert "--engine: unknown engine 'gpt'" in result.stderr
    result = runner.invoke(app, ["decide", "/no/such/file.json", "--engine", "sparrow"])
    assert result.exit_code == 2
    assert "cannot read /no/such/file.json" in result.stderr
    result = runner.invoke(app, ["decide", "--examples", "/no/examples.yaml"], input=_body())
    assert result.exit_code == 2
    assert "--examples: no such file" in result.stderr


def test_an_unreachable_engine_fails_with_exit_3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTSLOW_JEV__BASE_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("FASTSLOW_JEV__TIMEOUT_S", "1")
    result = runner.invoke(app, ["decide", "--engine", "jev"], input=_body(q={"type": "noul", "instructions": "y"}))
    assert result.exit_code == 3
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.output


def test_decide_answers_offline_on_the_default_engine(tmp_path: Path) -> None:
    # A real process, as a newcomer runs it: stdin in, Jev response JSON out.
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTSLOW_")}
    env["FASTSLOW_DATA_DIR"] = str(tmp_path)
    body = (REPO / "examples" / "support_request.json").read_text()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastslow.api.cli",
            "decide",
            "-",
            "--examples",
            str(REPO / "examples" / "support_examples.yaml"),
        ],
        input=body,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert set(reply["answers"]) == {"route", "is_injection", "urgency"}
    route = reply["answers"]["route"]
    assert route["type"] == "choice"
    assert route["choice"] == "billing"
    assert sum(route["probabilities"].values()) == pytest.approx(1.0, abs=1e-6)
    assert 0.0 <= reply["answers"]["is_injection"]["noul"] <= 1.0
    assert reply["answers"]["urgency"]["legend"] == {"0": "Can wait", "1": "This week", "2": "Today"}
