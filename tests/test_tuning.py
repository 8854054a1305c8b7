"""Thresholds that state an accuracy, bands, temperatures, and the YAML they are written into."""

from __future__ import annotations

import difflib
from pathlib import Path

import numpy as np
import pytest

from fastslow.policies import PolicyStore, load_policy, parse_policy
from fastslow.policies.tuning import (
    Labelled,
    PolicyEditor,
    TooFewLabels,
    fit_mismatches,
    fit_temperature,
    kept_answer,
    needed_for,
    tune_bands,
    tune_thresholds,
    wilson_lower,
)
from fastslow.router import Answer, Calibration, ConfigError, Thresholds, calibrate, decide_answer

EXAMPLE_POLICY = Path(__file__).resolve().parents[1] / "examples" / "policy.yaml"


def _decisions(n: int, seed: int, *, sharpness: float = 1.0) -> list[Labelled]:
    """Calibrated three-way decisions: the top option is right with probability equal to its confidence."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        top = float(rng.uniform(0.4, 1.0))
        rest = (1.0 - top) / 2
        right = bool(rng.random() < top)
        # A sharpness above 1 reports more confidence than the answers earn.
        shown = top**sharpness / (top**sharpness + 2 * rest**sharpness)
        other = (1 - shown) / 2
        rows.append(Labelled(probabilities={"a": shown, "b": other, "c": other}, label="a" if right else "b"))
    return rows


def test_kept_answer_agrees_with_the_router() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        p = rng.dirichlet([1, 1, 1])
        probs = {"a": float(p[0]), "b": float(p[1]), "none": float(p[2])}
        c, m = float(rng.uniform(0.3, 0.9)), float(rng.choice([0.0, 0.1, 0.3]))
        answer = Answer(question="q", kind="choice", probabilities=probs, engine="t", model="t")
        decision = decide_answer("t", answer, thresholds=Thresholds(min_confidence=c, min_margin=m), none_option="none")
        assert kept_answer(probs, c, m, "none") == decision.outcome


@pytest.mark.slow  # thousands of decisions: out of make test-fast
def test_tuned_thresholds_meet_the_target_on_fresh_decisions() -> None:
    choice = tune_thresholds(_decisions(3000, 0), _decisions(3000, 1), target=0.9, level=0.95)
    assert choice.held_out.lower >= 0.9
    assert choice.held_out.accuracy >= choice.held_out.lower
    # Coverage is the point: more than the strictest thresholds would keep.
    assert choice.held_out.kept > choice.curve[0].kept
    fresh = _decisions(20000, 2)
    kept = [(kept_answer(r.probabilities, choice.min_confidence, choice.min_margin), r.label) for r in fresh]
    right = [k == label for k, label in kept if k is not None]
    assert sum(right) / len(right) >= 0.9


def test_tune_refuses_too_few_decisions_and_says_how_many() -> None:
    needed = needed_for(0.97, 0.95)
    assert needed == 88
    assert wilson_lower(needed, needed, 0.95) >= 0.97 > wilson_lower(needed - 1, needed - 1, 0.95)
    with pytest.raises(TooFewLabels, match=f"at least {needed}"):
        tune_thresholds(_decisions(60, 0), _decisions(60, 1), target=0.97)


@pytest.mark.slow  # thousands of decisions: out of make test-fast
def test_bands_bound_false_denials_and_misses() -> None:
    rng = np.random.default_rng(0)
    benign = rng.beta(1, 6, 3000)
    bad = rng.beta(6, 1.5, 1000)
    p = np.concatenate([benign, bad])
    violated = np.concatenate([np.zeros(3000, bool), np.ones(1000, bool)])
    bands = tune_bands(p, violated, max_false_deny=0.02, max_miss=0.05)
    assert bands.allow_at <= bands.deny_at
    assert bands.false_deny_upper <= 0.02 and bands.miss_upper <= 0.05
    fresh_benign, fresh_bad = rng.beta(1, 6, 20000), rng.beta(6, 1.5, 20000)
    assert (fresh_benign >= bands.deny_at).mean() <= 0.02
    assert (fresh_bad <= bands.allow_at).mean() <= 0.05
    with pytest.raises(TooFewLabels, match="benign"):
        tune_bands(p[2990:], violated[2990:], max_false_deny=0.02, max_miss=0.05)


def test_a_fitted_temperature_lowers_held_out_ece_of_overconfident_answers() -> None:
    fit = fit_temperature(_decisions(2000, 0, sharpness=3.0), _decisions(2000, 1, sharpness=3.0))
    assert fit.factor > 1.5
    assert fit.after.ece < fit.before.ece / 2
    assert fit.after.log_loss < fit.before.log_loss


def test_per_question_temperatures_reach_the_router() -> None:
    calibration = Calibration(temperature=2.0, questions={"sharp": Calibration(temperature=0.5)})
    probs = {"yes": 0.8, "no": 0.2}
    assert calibrate(probs, calibration.for_question("other"))["yes"] < 0.8
    assert calibrate(probs, calibration.for_question("sharp"))["yes"] > 0.8


# -- the YAML editor ------------------------------------------------------------------------------------


def _changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    """Lines replaced or removed, and lines replaced or added, by a line diff; the rest is byte-equal."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    removed, added = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if op != "equal":
            removed += old[i1:i2]
            added += new[j1:j2]
    return removed, added


def test_edits_keep_every_other_byte_and_load(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    original = EXAMPLE_POLICY.read_text(encoding="utf-8")
    path.write_text(original, encoding="utf-8")
    editor = PolicyEditor(path)
    editor.set(("defaults", "thresholds", "min_confidence"), 0.83)  # exists: replaced in place
    editor.set(("tasks", "support", "thresholds", "min_margin"), 0.1)  # missing: added
    editor.set(("tasks", "support", "fitted", "thresholds"), {"by": "fastslow tune", "date": "2026-12-01", "n": 3})
    editor.set(("tasks", "tool_safety", "rules", "destructive_action", "deny_at"), 0.9)
    editor.write()
    after = path.read_text(encoding="utf-8")
    removed, added = _changed_lines(original, after)
    # One value changed in place, its comment and alignment kept; everything else only added.
    assert len(removed) == 2
    assert any("min_confidence: 0.7 " in line for line in removed)
    assert any(line.startswith("    min_confidence: 0.83") and "calibrated top probability" in line for line in added)
    assert len(added) == 2 + 2 + 5  # the two values in place, thresholds (2 lines), fitted (5 lines)
    policy = load_policy(path)
    assert policy.tasks["support"].thresholds.min_confidence == 0.83
    assert policy.tasks["support"].thresholds.min_margin == 0.1
    assert policy.tasks["support"].fitted["thresholds"]["by"] == "fastslow tune"
    # The section comment after the support task still heads the next task.
    assert after.index("fitted:") < after.index("# -- classification")


def test_the_service_reloads_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(EXAMPLE_POLICY.read_text(encoding="utf-8"), encoding="utf-8")
    store = PolicyStore(path)
    before = store.version
    editor = PolicyEditor(path)
    editor.set(("tasks", "support", "thresholds", "min_confidence"), 0.91)
    editor.write()
    result = store.reload()
    assert result.error is None
    assert store.version != before
    assert store.current.tasks["support"].thresholds.min_confidence == 0.91


def test_a_file_changed_since_it_was_read_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(EXAMPLE_POLICY.read_text(encoding="utf-8"), encoding="utf-8")
    editor = PolicyEditor(path)
    editor.set(("tasks", "support", "thresholds", "min_confidence"), 0.91)
    path.write_text(path.read_text(encoding="utf-8") + "\n# someone else's edit\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="changed"):
        editor.write()
    assert path.read_text(encoding="utf-8").endswith("# someone else's edit\n")


def test_a_shorthand_rule_becomes_a_mapping_for_its_bands(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "tasks:\n  gate:\n    kind: check\n    rules:\n      secrets: Does the text leak a secret?  # the rule\n",
        encoding="utf-8",
    )
    editor = PolicyEditor(path)
    editor.expand(("tasks", "gate", "rules", "secrets"), "instructions")
    editor.set(("tasks", "gate", "rules", "secrets", "deny_at"), 0.9)
    rule = parse_policy(editor.text()).tasks["gate"]
    assert rule.rules["secrets"].action.deny_at == 0.9  # type: ignore[union-attr]
    assert rule.rules["secrets"].question.instructions == "Does the text leak a secret?"  # type: ignore[union-attr]


def test_calibration_for_an_unknown_question_is_refused() -> None:
    text = (
        "tasks:\n  t:\n    kind: classify\n    calibration:\n      questions:\n        nope: {temperature: 2.0}\n"
        "    questions:\n      urgent: Is it urgent?\n"
    )
    with pytest.raises(ConfigError, match="nope") as err:
        parse_policy(text, source="p.yaml")
    assert err.value.line == 6


def test_a_fit_for_another_engine_or_embedder_is_named_at_load() -> None:
    text = (
        "tasks:\n  t:\n    kind: classify\n    questions:\n      urgent: Is it urgent?\n"
        "    fitted:\n      thresholds: {by: fastslow tune, date: '2026-12-01', engine: embedded, embedder: minilm}\n"
        "      calibration: {by: fastslow calibrate, date: '2026-12-01', engine: jev}\n"
    )
    policy = parse_policy(text)
    lines = fit_mismatches(policy, default_engine="embedded", embedder="e5")
    assert len(lines) == 2
    assert any("'minilm'" in line and "'e5'" in line for line in lines)
    assert any("'jev'" in line and "'embedded'" in line for line in lines)
    (only,) = fit_mismatches(policy, default_engine="embedded", embedder="minilm")
    assert "'jev'" in only
