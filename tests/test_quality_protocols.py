"""The quality loop's library runs against its protocols alone: no engine package, no store, no API."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fastslow.policies.evaluation import (
    EXPLICIT_THRESHOLDS,
    EvalOptions,
    TaskRouter,
    TrainingTexts,
    evaluate,
    headline,
    prediction,
    read_predictions,
)
from fastslow.policies.tuning import collect_from_log, drift, logged_prediction
from fastslow.router import Answer, ConfigError, Decision, EngineName, PolicySet, Question, Settings, State
from fastslow.router.engine_api import EngineReply


class _Engine:
    """Says ``billing`` at 0.9 to every question it is asked."""

    async def decide(self, _state: State, questions: Mapping[str, Question]) -> EngineReply:
        answers = {
            name: Answer(
                question=name,
                kind=q.kind,
                probabilities={o: (0.9 if o == "billing" else 0.1 / (len(q.options) - 1)) for o in q.options},
                engine="fake",
                model="fake-1",
            )
            for name, q in questions.items()
        }
        return EngineReply(answers=answers, engine="fake", model="fake-1", latency_ms=1.0)


class _Deciders:
    def __init__(self) -> None:
        self.closed = 0

    def load_policy(self, path: Path) -> PolicySet:
        raise AssertionError(f"explicit rows need no policy, not {path}")

    def learns(self, _engine: EngineName) -> bool:
        return False

    def training_texts(self, _policy: PolicySet | None) -> TrainingTexts:
        return {}

    async def router(self, policy_path: Path, _policy: PolicySet, *, system2: bool) -> TaskRouter:
        raise AssertionError(f"explicit rows need no router ({policy_path}, {system2})")

    async def engine(self) -> _Engine:
        return _Engine()

    async def aclose(self) -> None:
        self.closed += 1


async def test_an_evaluation_runs_on_the_deciders_it_is_given(tmp_path: Path) -> None:
    team = {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "money", "technical": "bugs"}}
    rows = [
        {"id": f"r{i}", "state": f"message {i}", "questions": {"team": team}, "labels": {"team": label}}
        for i, label in enumerate(["billing", "billing", "technical"])
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    deciders = _Deciders()
    options = EvalOptions(progress=False)
    info = await evaluate(
        data, tmp_path / "out", settings=Settings(engine="sparrow"), deciders=deciders, options=options
    )
    assert info.rows == 3 and info.model == "fake-1" and deciders.closed == 1
    predictions = list(read_predictions(tmp_path / "out"))
    assert {p.answer for p in predictions} == {"billing"} and all(p.kept for p in predictions)
    assert all(p.threshold == EXPLICIT_THRESHOLDS.min_confidence for p in predictions)
    summary = headline(tmp_path / "out")
    assert (summary.rows, summary.labelled, summary.accuracy) == (3, 3, pytest.approx(2 / 3))


def test_one_prediction_of_a_kept_an_escalated_and_a_failed_decision() -> None:
    common: dict[str, Any] = {"row": "r", "question": "q", "kind": "choice", "options": ("a", "b"), "label": "a"}
    kept = prediction(
        Decision(task="t", question="q", outcome="a", system=1, reason="confident", probabilities={"a": 0.8, "b": 0.2}),
        **common,
    )
    assert (kept.answer, kept.confidence, kept.kept, kept.correct, kept.error) == ("a", 0.8, True, True, None)
    escalated = prediction(
        Decision(
            task="t",
            question="q",
            outcome="b",
            system=2,
            reason="low_confidence",
            escalate=False,
            probabilities={"a": 0.4, "b": 0.6},
        ),
        **common,
    )
    assert (escalated.answer, escalated.kept, escalated.outcome, escalated.correct) == ("b", False, "b", False)
    failed = prediction(
        Decision(task="t", question="q", outcome=None, system=1, reason="engine_error", detail="down"), **common
    )
    assert (failed.answer, failed.confidence, failed.kept, failed.error) == (None, 0.0, False, "down")


class _Logged:
    """A decision as a log keeps it: what ``LoggedDecision`` asks, nothing more."""

    def __init__(self, i: int, probabilities: Mapping[str, float]) -> None:
        self.id, self.question, self.outcome, self.system, self.reason = f"d{i}", "support", None, 1, "low_confidence"
        self.escalate, self.threshold, self.probabilities, self.verdict = True, 0.7, probabilities, None
        self.latency_ms, self.detail, self.audit, self.audit_rate = 2.0, "", False, 0.0
        self.policy_version, self.model, self.cost_usd = "v1", "m", None


class _Outcome:
    def __init__(self, label: str) -> None:
        self.label, self.system2_correct = label, None


class _Log:
    def __init__(self, pairs: Sequence[tuple[_Logged, _Outcome]]) -> None:
        self.pairs, self.closed = list(pairs), False

    async def outcomes(
        self, *, tenant: str | None = None, task: str | None = None, since: datetime | None = None, limit: int = 0
    ) -> list[tuple[_Logged, _Outcome]]:
        return self.pairs

    async def kept_counts(
        self, *, task: str, tenant: str | None = None, since: datetime | None = None
    ) -> tuple[int, int]:
        return len(self.pairs), 0

    async def aclose(self) -> None:
        self.closed = True


POLICY = """\
tasks:
  support:
    kind: route
    instructions: Which team?
    routes:
      billing: Charges and invoices.
      technical: Errors and crashes.
"""


async def test_the_log_is_read_through_its_protocol_and_closed(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    probs = {"billing": 0.6, "technical": 0.4}
    log = _Log([(_Logged(i, probs), _Outcome("billing" if i % 2 else "technical")) for i in range(10)])

    async def open_log() -> _Log:
        return log

    collected = await collect_from_log(open_log, settings=Settings(), policy=policy, task="support")
    assert log.closed and collected.source == "log" and collected.sample == "all"
    rows = collected.fit + collected.held_out
    assert len(rows) == 10 and rows[0] == logged_prediction(
        log.pairs[int(rows[0].row[1:])][0], collected.task, label=str(rows[0].label), weight=1.0
    )
    with pytest.raises(Exception, match="no fitted: record"):
        await drift(open_log, settings=Settings(), policy=policy, task="support")


@pytest.mark.parametrize(
    ("given", "key"),
    [({"split": "dev"}, "split"), ({"concurrency": 0}, "concurrency"), ({"limit": 0}, "limit")],
)
def test_eval_options_are_checked_once_when_made_and_name_the_option(given: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        EvalOptions(**given)
    assert raised.value.key == key
    assert EvalOptions(split="test", concurrency=1, limit=1).limit == 1
