"""`fastslow tune --from-log`: thresholds fitted on outcomes recorded in the decision log (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from typer.testing import CliRunner

from fastslow.api.cli import app
from fastslow.api.store import DecisionStore
from fastslow.policies import load_policy, parse_policy
from fastslow.router import Decision, audited

from fakes.databases import database_url, postgres_schema_url  # noqa: F401  (fixtures)

runner = CliRunner()

POLICY = """\
# a hand-written policy: this comment and the order below must survive the fit
tasks:
  support:
    kind: route
    routes:
      billing: Charges and refunds.
      technical: Errors and crashes.
      account: Passwords and profiles.
    none_of_these: other   # escalates
"""


async def _log(url: str, n: int, *, bad_label: bool = False) -> None:
    """``n`` calibrated decisions with outcomes: the top route is right as often as its probability says."""
    rng = np.random.default_rng(0)
    store = await DecisionStore.open(url)
    try:
        for i in range(n):
            top = float(rng.uniform(0.4, 1.0))
            rest = (1.0 - top) / 3
            probs = {"billing": top, "technical": rest, "account": rest, "other": rest}
            decision = Decision(
                # Ids fixed, not random: the held-out split is drawn over rows sorted by id, so
                # random ids would make the tuned thresholds (asserted below) differ run to run.
                id=f"{i + 1:032x}",
                task="support",
                question="support",
                outcome="billing",
                system=1,
                reason="confident",
                confidence=top,
                probabilities=probs,
                policy_version="sha256:0123456789abcdef",
                engine="embedded",
                model="e5-small-q4+head",
            )
            await store.record(decision, tenant="acme" if i % 2 else "globex", state=f"message {i}")
            right = rng.random() < top
            label = "astrology" if bad_label and i == 7 else ("billing" if right else "technical")
            await store.record_outcome(decision.id, tenant="acme" if i % 2 else "globex", label=label)
    finally:
        await store.aclose()


def test_tune_from_the_log_writes_thresholds_that_hold_on_held_out_outcomes(
    database_url: str,  # noqa: F811
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathlib import Path

    folder = Path(str(tmp_path))
    policy = folder / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    asyncio.run(_log(database_url, 1200))
    result = runner.invoke(
        app, ["tune", "--policy", str(policy), "--task", "support", "--from-log", "--target-accuracy", "0.8"]
    )
    assert result.exit_code == 0, result.output
    assert "every recorded outcome, unweighted" in result.output
    task = load_policy(policy).tasks["support"]
    record = task.fitted["thresholds"]
    assert record["held_out"]["lower_bound"] >= 0.8
    assert "no audit sample" in record["sample"]
    # Calibrated answers right as often as their confidence: keeping the top above c gives (1 + c) / 2.
    assert 0.6 <= task.thresholds.min_confidence <= 0.9
    text = policy.read_text(encoding="utf-8")
    assert text.startswith(POLICY.rstrip("\n").rsplit("\n", 1)[0])  # everything before the last line kept
    assert "none_of_these: other   # escalates\n" in text
    # One tenant's outcomes only: half as many decisions.
    result = runner.invoke(
        app,
        ["tune", "--policy", str(policy), "--task", "support", "--from-log", "--tenant", "acme", "--dry-run"]
        + ["--target-accuracy", "0.75"],
    )
    assert result.exit_code == 0, result.output
    assert "600 fit rows" not in result.output and "300 fit rows" in result.output


def test_a_logged_label_the_task_does_not_have_is_named(
    database_url: str,  # noqa: F811
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathlib import Path

    policy = Path(str(tmp_path)) / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)
    asyncio.run(_log(database_url, 20, bad_label=True))
    result = runner.invoke(app, ["tune", "--policy", str(policy), "--task", "support", "--from-log"])
    assert result.exit_code == 2
    assert "astrology" in result.output and "decision " in result.output
    assert policy.read_text(encoding="utf-8") == POLICY
    result = runner.invoke(app, ["tune", "--policy", str(policy), "--task", "support"])
    assert result.exit_code == 2 and "--from-log" in result.output


def test_the_audit_sample_draws_kept_decisions_at_its_rate_and_nothing_else() -> None:
    kept = [Decision(task="t", question="t", outcome="a", system=1, reason="confident") for _ in range(4000)]
    drawn = [audited(d, 0.1) for d in kept]
    share = sum(d.audit for d in drawn) / len(drawn)
    assert 0.08 < share < 0.12
    assert all(d.audit_rate == 0.1 for d in drawn)
    # The draw is the id's: the same decision always draws the same way, on any replica.
    assert [audited(d, 0.1).audit for d in kept[:50]] == [d.audit for d in drawn[:50]]
    escalated = Decision(task="t", question="t", outcome=None, system=1, reason="low_confidence", escalate=True)
    review = Decision(task="t", question="r", outcome="review", system=1, reason="low_confidence", verdict="review")
    assert not any(audited(d, 1.0).audit for d in (escalated, review))
    assert audited(kept[0], 0.0) == kept[0]


def test_audit_rate_is_a_policy_key_and_reaches_the_log(
    database_url: str,  # noqa: F811
) -> None:
    policy = parse_policy(POLICY.replace("    kind: route\n", "    kind: route\n    audit_rate: 0.25\n"))
    assert policy.tasks["support"].audit_rate == 0.25
    assert parse_policy(POLICY).tasks["support"].audit_rate == 0.0

    async def roundtrip() -> tuple[bool, float]:
        store = await DecisionStore.open(database_url)
        try:
            decision = Decision(task="support", question="support", outcome="billing", system=1, reason="confident")
            decision = dataclasses.replace(decision, audit=True, audit_rate=0.25)
            await store.record(decision, tenant="acme", state="hello")
            stored = await store.get(decision.id, tenant="acme")
            assert stored is not None
            return stored.audit, stored.audit_rate
        finally:
            await store.aclose()

    assert asyncio.run(roundtrip()) == (True, 0.25)


def test_weighted_outcomes_count_the_audit_sample_by_its_inverse_rate(
    database_url: str,  # noqa: F811
    tmp_path: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pathlib import Path

    from fastslow.api._tune import collect_from_log
    from fastslow.router import get_settings

    policy = Path(str(tmp_path)) / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    monkeypatch.setenv("FASTSLOW_DATABASE_URL", database_url)

    async def fill() -> None:
        store = await DecisionStore.open(database_url)
        try:
            probs = {"billing": 0.9, "technical": 0.05, "account": 0.03, "other": 0.02}
            for i in range(60):
                kept = i % 3 != 0
                decision = Decision(
                    task="support",
                    question="support",
                    outcome="billing" if kept else None,
                    system=1,
                    reason="confident" if kept else "low_confidence",
                    escalate=not kept,
                    probabilities=probs,
                    audit=kept and i % 2 == 0,
                    audit_rate=0.2,
                )
                await store.record(decision, tenant="acme", state=f"m{i}")
                await store.record_outcome(decision.id, tenant="acme", label="billing")
        finally:
            await store.aclose()

    asyncio.run(fill())
    settings = get_settings()
    weighted = asyncio.run(collect_from_log(settings=settings, policy=policy, task="support"))
    rows = weighted.fit + weighted.held_out
    assert weighted.sample == "weighted"
    # 20 escalated (weight 1) and 20 audited kept decisions (weight 5); the 20 kept ones labelled
    # outside the audit are left out.
    assert sorted({p.weight for p in rows}) == [1.0, 5.0] and len(rows) == 40
    audit = asyncio.run(collect_from_log(settings=settings, policy=policy, task="support", sample="audit"))
    assert len(audit.fit + audit.held_out) == 20
    everything = asyncio.run(collect_from_log(settings=settings, policy=policy, task="support", sample="all"))
    assert len(everything.fit + everything.held_out) == 60
