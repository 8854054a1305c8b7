"""`fastslow eval`: every row answered by the real embedded engine, one prediction per row and question.

Hand-written evaluation files in tmp_path: explicit rows (choice and yes/no questions), task rows of
a small policy (a route task and a check, both with examples), bad rows, training rows, interrupted
and resumed runs, and the command line end to end.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

import fastslow.policies.evaluation._run as evaluate_module
from fastslow.api._evaluate import EvalOptions, evaluate, headline
from fastslow.api.cli import app
from fastslow.policies.evaluation import Prediction, read_predictions, read_run
from fastslow.policies.evaluation import write_prediction as real_write
from fastslow.router import ConfigError, Settings
from fastslow.router.settings import EmbeddedSettings

runner = CliRunner()

POLICY = """\
version: 1
defaults:
  thresholds:
    min_confidence: 0.6
tasks:
  support:
    kind: route
    instructions: Which team should handle the customer's message?
    routes:
      billing:
        description: Charges, invoices, refunds and payment methods.
        examples:
          - I was charged twice for my subscription this month
          - Can I get a refund for the annual plan I bought yesterday?
          - My card keeps getting declined when I try to pay
          - Where do I download last month's invoice?
      technical:
        description: The product does not work - errors, crashes, slowness.
        examples:
          - The app crashes every time I open the reports page
          - Your API returns a 502 error since this morning
          - Sync with Google Drive stopped working after the update
          - Exports are taking over ten minutes to finish
    none_of_these: other
  tools:
    kind: check
    on_failure: fail_closed
    rules:
      destructive:
        instructions: Would this tool call delete or irreversibly change data?
        deny_at: 0.7
        allow_at: 0.3
        examples:
          yes:
            - 'shell: rm -rf /var/lib/postgresql/data'
            - 'run_sql: DROP TABLE customers;'
            - 'kubectl: delete namespace production'
            - 'delete_file: /srv/data/ledger.db'
          no:
            - 'shell: ls -la /srv'
            - 'run_sql: SELECT count(*) FROM orders'
            - 'kubectl: get pods -n production'
            - 'read_file: /srv/data/report.csv'
"""

EXAMPLES = """\
questions:
  team:
    examples:
      billing:
        - My card was billed two times for the same month
        - Can you send me a receipt for my last payment?
        - Why did my bill go up this month?
      technical:
        - The dashboard shows a blank white page after I log in
        - Uploading a file fails with an unknown error
        - The mobile app freezes as soon as I open my messages
"""

TEAM = {
    "type": "choice",
    "instructions": "Which team should handle it?",
    "criteria": {"billing": "money, invoices", "technical": "bugs, errors", "none_of_these": "nothing fits"},
}
ANGRY = {"type": "noul", "instructions": "Is the customer angry?"}
EXPLICIT = {"team": TEAM, "angry": ANGRY}


def explicit(row_id: str, state: str, **labels: str) -> dict[str, Any]:
    return {"id": row_id, "state": state, "questions": EXPLICIT, "labels": labels}


def write_rows(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def pairs(out: Path) -> Counter[tuple[str, str]]:
    return Counter((p.row, p.question) for p in read_predictions(out))


def by_pair(out: Path) -> dict[tuple[str, str], Prediction]:
    return {(p.row, p.question): p for p in read_predictions(out)}


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY, encoding="utf-8")
    return path


TASK_ROWS: list[dict[str, Any] | str] = [
    {"id": "b1", "task": "support", "state": "Why was my card billed two times?", "label": "billing"},
    {"id": "t1", "task": "support", "state": "The dashboard shows a blank page after login", "label": "technical"},
    {"id": "o1", "task": "support", "state": "What is the capital of France?", "label": "other"},
    {"id": "train", "task": "support", "state": "Where do I download last month's  invoice?", "label": "billing"},
    {"id": "c1", "task": "tools", "state": "shell: rm -rf /home/alice/projects", "labels": {"destructive": "yes"}},
    {
        "id": "c2",
        "task": "tools",
        "state": {"tool": "read_file", "arguments": {"path": "/tmp/notes.txt"}},
        "labels": {"destructive": "no"},
    },
]


async def test_explicit_rows_give_one_prediction_per_row_and_question(tmp_path: Path) -> None:
    examples = tmp_path / "examples.yaml"
    examples.write_text(EXAMPLES, encoding="utf-8")
    data = write_rows(
        tmp_path / "rows.jsonl",
        [
            explicit("r1", "I was charged twice, refund me now!", team="billing", angry="yes"),
            explicit("r2", "The export button throws an error", team="technical"),
            {
                **explicit("r3", "What time is it in Tokyo?", team="none_of_these"),
                "weight": 2,
                "meta": {"split": "test"},
            },
            # A training text of the examples file: the engine learned it, so it is not scored.
            explicit("seen", "Why did my bill go up this month?", team="billing"),
        ],
    )
    settings = Settings(embedded=EmbeddedSettings(examples=examples))
    out = tmp_path / "report"
    info = await evaluate(data, out, settings=settings, options=EvalOptions(progress=False))

    assert pairs(out) == Counter({(r, q): 1 for r in ("r1", "r2", "r3") for q in ("team", "angry")})
    got = by_pair(out)
    team = got[("r1", "team")]
    assert team.kind == "choice" and team.options == ("billing", "technical", "none_of_these")
    assert team.label == "billing" and team.answer == "billing" and team.correct is True
    assert sum(team.probabilities.values()) == pytest.approx(1.0)
    assert team.confidence == team.probabilities["billing"]
    # Explicit rows are held to the built-in policy's thresholds (0.7 / 0.15), fixed before the run.
    runner_up = sorted(team.probabilities.values())[-2]
    clears = team.confidence >= 0.7 and team.confidence - runner_up >= 0.15
    assert team.kept is clears and team.system == 1
    assert (team.reason, team.outcome) == (("confident", "billing") if clears else ("low_confidence", None))
    assert team.none_option == "none_of_these" and team.task is None and team.error is None
    assert team.latency_ms > 0
    # Labelled only where the row knows the answer; the question is still predicted.
    assert got[("r2", "angry")].label is None and got[("r2", "angry")].answer in ("yes", "no")
    assert got[("r1", "angry")].kind == "noul" and got[("r1", "angry")].label == "yes"
    assert (got[("r3", "team")].weight, got[("r3", "team")].split) == (2.0, "test")

    run = read_run(out)
    assert run == info
    assert run.data == str(data) and run.data_sha256 == hashlib.sha256(data.read_bytes()).hexdigest()
    assert run.engine == "embedded" and run.model and run.policy is None and run.task is None
    assert run.rows == 3 and run.problems == () and run.finished_at is not None and run.started_at
    assert run.dropped_training_rows == ("seen",)
    assert run.examples == {"team": 6}
    assert run.settings["thresholds"]["explicit rows"]["min_confidence"] == 0.7
    assert run.settings["examples_file"] == str(examples)
    assert headline(out).rows == 3 and headline(out).labelled == 4
    # The report, computed from the two files.
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["counts"]["predictions"] == 6 and metrics["run"]["complete"] is True
    assert (out / "summary.md").is_file()


async def test_task_rows_run_as_the_router_runs_them(tmp_path: Path, policy: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", TASK_ROWS)
    out = tmp_path / "report"
    info = await evaluate(data, out, settings=Settings(), options=EvalOptions(policy=policy, progress=False))

    # The training text differs only in spacing: it is still one the engine learned from.
    assert info.dropped_training_rows == ("train",)
    assert info.examples == {"support": 8, "tools.destructive": 8}
    assert info.policy == str(policy) and info.policy_version and info.policy_version.startswith("sha256:")
    assert info.settings["thresholds"]["support"]["thresholds"]["min_confidence"] == 0.6
    assert info.settings["thresholds"]["tools"]["rules"]["destructive"]["deny_at"] == 0.7
    assert pairs(out) == Counter(
        {(r, "support"): 1 for r in ("b1", "t1", "o1")} | {("c1", "destructive"): 1, ("c2", "destructive"): 1}
    )
    got = by_pair(out)
    billing = got[("b1", "support")]
    assert billing.task == "support" and billing.none_option == "other" and billing.answer == "billing"
    assert billing.options == ("billing", "technical", "other") and billing.threshold == 0.6
    assert billing.kept == (billing.reason == "confident") and billing.outcome == ("billing" if billing.kept else None)
    for p in got.values():
        if not p.kept:
            # Escalated with no System 2 configured: nobody settled it.
            assert p.system == 1 and p.outcome is None and p.reason != "confident"
    for row in ("c1", "c2"):
        check = got[(row, "destructive")]
        assert check.task == "tools" and check.violation == "yes" and check.verdict in ("allow", "review", "deny")
        assert check.kept and check.outcome == check.verdict and set(check.probabilities) == {"yes", "no"}
    assert got[("c1", "destructive")].label == "yes" and got[("c2", "destructive")].label == "no"

    with pytest.raises(ConfigError, match="training examples") as raised:
        await evaluate(
            data,
            tmp_path / "strict",
            settings=Settings(),
            options=EvalOptions(policy=policy, strict=True, progress=False),
        )
    assert raised.value.line == 4 and raised.value.path == str(data)


def _state_keys(cache: Path) -> set[bytes]:
    """The text digests in the embedding cache's shards (trained heads aside)."""
    keys: set[bytes] = set()
    for shard in cache.rglob("*.npz"):
        if shard.parent.name != "_heads":
            with np.load(shard) as z:
                keys.update(bytes(k) for k in z["keys"])
    return keys


async def test_a_second_evaluation_of_the_same_rows_runs_no_model_on_them(tmp_path: Path, policy: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", TASK_ROWS)
    cache = tmp_path / "cache"
    settings = Settings(embedded=EmbeddedSettings(cache_dir=cache))
    await evaluate(data, tmp_path / "first", settings=settings, options=EvalOptions(policy=policy, progress=False))
    read = _state_keys(cache)
    # The rows were kept as examples are (their digests and vectors): the offline run asks for it.
    assert hashlib.sha256(b"Why was my card billed two times?").digest() in read
    await evaluate(data, tmp_path / "second", settings=settings, options=EvalOptions(policy=policy, progress=False))
    assert _state_keys(cache) == read  # nothing new embedded
    first, second = by_pair(tmp_path / "first"), by_pair(tmp_path / "second")
    assert first.keys() == second.keys()
    for pair, prediction in first.items():
        # The same up to the float32 rounding of heads read back from the store (the first run trained them).
        assert second[pair].probabilities == pytest.approx(prediction.probabilities, abs=1e-6), pair


async def test_every_row_runs_as_the_task_given(tmp_path: Path, policy: Path) -> None:
    route = {"type": "choice", "criteria": {"billing": None, "technical": None}}
    data = write_rows(
        tmp_path / "rows.jsonl",
        [
            {
                "id": "x1",
                "state": "I need a refund for my plan",
                "questions": {"support": route},
                "labels": {"support": "billing"},
            },
            {"id": "x2", "state": "Crash on start", "questions": {"team": route}, "labels": {"team": "technical"}},
            {"id": "x3", "task": "tools", "state": "shell: ls", "labels": {"destructive": "no"}},
        ],
    )
    out = tmp_path / "report"
    info = await evaluate(
        data, out, settings=Settings(), options=EvalOptions(policy=policy, task="support", progress=False)
    )
    assert [p.split(":")[0] for p in info.problems] == ["line 2", "line 3"]
    assert "task 'support' does not ask" in info.problems[0] and "every row runs as task 'support'" in info.problems[1]
    (only,) = read_predictions(out)
    assert (only.row, only.question, only.task, only.label) == ("x1", "support", "support", "billing")
    assert only.options == ("billing", "technical", "other")  # the task's question, not the row's
    assert info.task == "support" and info.rows == 1

    with pytest.raises(ConfigError, match="no task 'suport'"):
        await evaluate(
            data,
            tmp_path / "typo",
            settings=Settings(),
            options=EvalOptions(policy=policy, task="suport", progress=False),
        )


async def test_bad_rows_are_reported_with_their_lines_and_skipped(tmp_path: Path, policy: Path) -> None:
    data = write_rows(
        tmp_path / "rows.jsonl",
        [
            TASK_ROWS[0],
            "{not json",
            {"task": "suport", "state": "x", "label": "billing"},
            {"task": "support", "state": "x", "label": "biling"},
            {"task": "support", "state": "x", "labels": {"teem": "billing"}},
            TASK_ROWS[1],
        ],
    )
    out = tmp_path / "report"
    info = await evaluate(data, out, settings=Settings(), options=EvalOptions(policy=policy, progress=False))
    assert [p.split(":")[0] for p in info.problems] == ["line 2", "line 3", "line 4", "line 5"]
    assert "not JSON" in info.problems[0]
    assert "unknown task 'suport'" in info.problems[1]
    assert "'biling'" in info.problems[2] and "did you mean 'billing'" in info.problems[2]
    assert "unknown question 'teem'" in info.problems[3]
    assert set(pairs(out)) == {("b1", "support"), ("t1", "support")}
    assert read_run(out).problems == info.problems

    with pytest.raises(ConfigError, match="not JSON") as raised:
        await evaluate(
            data,
            tmp_path / "strict",
            settings=Settings(),
            options=EvalOptions(policy=policy, strict=True, progress=False),
        )
    assert raised.value.line == 2
    assert not (tmp_path / "strict" / "predictions.jsonl").exists()


async def test_a_limited_run_is_extended_by_the_next_one(tmp_path: Path) -> None:
    rows: list[dict[str, Any] | str] = [
        explicit(f"r{i}", f"My invoice number {i} is wrong", team="billing") for i in range(6)
    ]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "report"
    first = await evaluate(data, out, settings=Settings(engine="sparrow"), options=EvalOptions(limit=2, progress=False))
    assert first.rows == 2 and set(pairs(out)) == {(f"r{i}", q) for i in range(2) for q in EXPLICIT}
    second = await evaluate(
        data, out, settings=Settings(engine="sparrow"), options=EvalOptions(progress=True)
    )  # the bar, on stderr
    assert second.rows == 6 and second.started_at == first.started_at
    assert pairs(out) == Counter({(f"r{i}", q): 1 for i in range(6) for q in EXPLICIT})


async def test_an_interrupted_run_resumes_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows: list[dict[str, Any] | str] = [
        explicit(f"r{i}", f"Order {i} arrived broken", team="technical") for i in range(12)
    ]
    data = write_rows(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "report"
    settings = Settings(engine="sparrow")
    written = 0

    def write_then_interrupt(fh: Any, prediction: Prediction) -> None:
        nonlocal written
        real_write(fh, prediction)
        written += 1
        if written == 5:
            run.cancel()

    monkeypatch.setattr(evaluate_module, "write_prediction", write_then_interrupt)
    run = asyncio.create_task(
        evaluate(data, out, settings=settings, options=EvalOptions(concurrency=1, progress=False))
    )
    with pytest.raises(asyncio.CancelledError):
        await run
    monkeypatch.setattr(evaluate_module, "write_prediction", real_write)
    assert read_run(out).finished_at is None
    lines = (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    assert 5 <= len(lines) < 24
    # As if the interruption had come mid-row: its last question unwritten, a line cut short.
    (out / "predictions.jsonl").write_text("".join(lines[:-1]) + '{"row": "r9", "question": "te', encoding="utf-8")

    info = await evaluate(data, out, settings=settings, options=EvalOptions(concurrency=3, progress=False))
    assert info.finished_at is not None and info.rows == 12
    assert pairs(out) == Counter({(f"r{i}", q): 1 for i in range(12) for q in EXPLICIT})


async def test_a_changed_data_file_is_not_resumed(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", [explicit("r1", "I was charged twice", team="billing")])
    out = tmp_path / "report"
    await evaluate(data, out, settings=Settings(engine="sparrow"), options=EvalOptions(progress=False))
    write_rows(data, [explicit("r1", "I was charged twice", team="technical")])
    with pytest.raises(ConfigError, match="different data_sha256.*--fresh"):
        await evaluate(data, out, settings=Settings(engine="sparrow"), options=EvalOptions(progress=False))
    write_rows(data, [explicit("r1", "I was charged twice", team="billing")])
    with pytest.raises(ConfigError, match="different engine"):
        await evaluate(data, out, settings=Settings(engine="embedded"), options=EvalOptions(progress=False))
    info = await evaluate(
        data, out, settings=Settings(engine="embedded"), options=EvalOptions(progress=False, overwrite=True)
    )
    assert info.engine == "embedded" and sum(pairs(out).values()) == 2


async def test_an_engine_that_cannot_answer_gives_error_predictions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTSLOW_JEV__BASE_URL", "http://127.0.0.1:9")  # discard port: nothing listens
    monkeypatch.setenv("FASTSLOW_JEV__TIMEOUT_S", "1")
    monkeypatch.setenv("FASTSLOW_JEV__MAX_RETRIES", "0")
    data = write_rows(tmp_path / "rows.jsonl", [explicit("r1", "I was charged twice", team="billing")])
    out = tmp_path / "report"
    await evaluate(data, out, settings=Settings(engine="jev"), options=EvalOptions(progress=False))
    for p in read_predictions(out):
        assert p.answer is None and p.probabilities == {} and not p.kept and p.outcome is None
        assert p.reason in ("engine_error", "timeout") and p.error


def test_the_command_fails_with_exit_3_when_the_engine_answers_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FASTSLOW_JEV__BASE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("FASTSLOW_JEV__TIMEOUT_S", "1")
    monkeypatch.setenv("FASTSLOW_JEV__MAX_RETRIES", "0")
    data = write_rows(tmp_path / "rows.jsonl", [explicit("r1", "I was charged twice", team="billing")])
    result = runner.invoke(
        app, ["eval", "--data", str(data), "--out", str(tmp_path / "cli"), "--engine", "jev", "--no-progress"]
    )
    assert result.exit_code == 3, result.output
    assert result.stderr.strip().splitlines()[-1].startswith("error: System 1 answered no row")


def test_the_command_runs_reports_and_refuses_bad_options(tmp_path: Path, policy: Path) -> None:
    data = write_rows(tmp_path / "rows.jsonl", [*TASK_ROWS, "[1, 2]"])
    out = tmp_path / "report"
    args = ["eval", "--data", str(data), "--out", str(out), "--policy", str(policy), "--no-progress"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"report: {out}" in result.stdout
    assert "rows 5, labelled 5: accuracy" in result.stdout and "kept" in result.stdout
    assert "line 7: a row must be a JSON object, not an array" in result.stderr
    assert "left out 1 row(s)" in result.stderr
    assert "Traceback" not in result.output
    assert sum(pairs(out).values()) == 5

    strict = runner.invoke(app, [*args[:4], str(tmp_path / "strict"), *args[5:], "--strict"])
    assert strict.exit_code == 2
    (line,) = strict.stderr.strip().splitlines()
    assert line.startswith("error: ") and "rows.jsonl:7: a row must be a JSON object" in line

    for bad, expected in [
        (["--concurrency", "0"], "error: --concurrency: must be at least 1"),
        (["--split", "dev"], "error: --split: must be one of train, validation, test"),
        (["--engine", "gpt"], "error: --engine: unknown engine 'gpt'"),
        (["--policy", str(tmp_path / "nope.yaml")], "error: --policy: no such file"),
        (["--task", "suport"], "error: "),
    ]:
        result = runner.invoke(app, [*args[:4], str(tmp_path / "bad"), "--policy", str(policy), *bad])
        assert result.exit_code == 2, (bad, result.output)
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(expected), (bad, line)
    for bad, expected in [
        (["eval", "--out", str(out)], "error: --data: the evaluation file is required"),
        (["eval", "--data", str(data)], "error: --out: the report directory is required"),
        (["eval", "--data", str(tmp_path / "none.jsonl"), "--out", str(out)], "error: --data: no such file"),
    ]:
        result = runner.invoke(app, bad)
        assert result.exit_code == 2 and result.stderr.strip().startswith(expected), result.output

    # The same run again: nothing left to do, the same predictions.
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and sum(pairs(out).values()) == 5


def test_two_reports_are_compared(tmp_path: Path) -> None:
    data = write_rows(
        tmp_path / "rows.jsonl",
        [
            explicit(f"r{i}", text, team=team)
            for i, (text, team) in enumerate(
                [("I was charged twice", "billing"), ("The app crashes", "technical"), ("Refund please", "billing")]
            )
        ],
    )
    for name, engine in (("a", "sparrow"), ("b", "embedded")):
        result = runner.invoke(
            app, ["eval", "--data", str(data), "--out", str(tmp_path / name), "--engine", engine, "--no-progress"]
        )
        assert result.exit_code == 0, result.output
    result = runner.invoke(
        app, ["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "ab")]
    )
    assert result.exit_code == 0, result.output
    assert "# Comparison of two runs" in result.stdout and "accuracy" in result.stdout
    assert (tmp_path / "ab" / "comparison.md").is_file()

    other = write_rows(tmp_path / "other.jsonl", [explicit("z", "Something else entirely", team="billing")])
    assert (
        runner.invoke(
            app, ["eval", "--data", str(other), "--out", str(tmp_path / "c"), "--engine", "sparrow", "--no-progress"]
        ).exit_code
        == 0
    )
    result = runner.invoke(app, ["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "c")])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "cannot compare" in line
    result = runner.invoke(app, ["eval", "--compare", str(tmp_path / "a"), str(tmp_path / "missing")])
    assert result.exit_code == 2 and "--compare: no such report directory" in result.stderr
