"""Platt and isotonic maps of the top probability: the router's arithmetic, the policy keys, the fits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastslow.api._tune import Collected, apply, calibrate_task
from fastslow.policies import parse_policy
from fastslow.policies.evaluation import Prediction, RunInfo
from fastslow.policies.tuning import (
    ISOTONIC_MIN_ROWS,
    PLATT_MIN_ROWS,
    Labelled,
    PolicyEditor,
    TooFewLabels,
    fit_calibration,
    reexpress,
)
from fastslow.router import Answer, Calibration, ClassifyTask, ConfigError, Isotonic, Platt, calibrate, decide_answer
from fastslow.router import Thresholds as T

ISO = Isotonic(x=(0.3, 0.5, 0.9), y=(0.2, 0.5, 0.8))


def _distributions(n: int, seed: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for size in rng.integers(2, 6, n):
        p = rng.dirichlet(np.full(size, 0.5))
        out.append({f"o{i}": float(v) for i, v in enumerate(p)})
    return out


# -- the router's arithmetic ------------------------------------------------------------------------


@pytest.mark.parametrize("g", [Platt(a=0.6, b=-0.4), Platt(a=2.5, b=1.0), ISO, Isotonic(x=(0.0, 1.0), y=(0.0, 0.1))])
def test_a_map_keeps_a_distribution_that_sums_to_one_and_its_top_option(g: Platt | Isotonic) -> None:
    for probs in _distributions(400, 0):
        out = calibrate(probs, Calibration(temperature=1.3, confidence_map=g))
        assert sum(out.values()) == pytest.approx(1.0, abs=1e-12)
        assert all(0.0 <= v <= 1.0 for v in out.values())
        assert max(out, key=out.__getitem__) == max(probs, key=probs.__getitem__)
        scaled = calibrate(probs, Calibration(temperature=1.3))
        top = max(scaled, key=scaled.__getitem__)
        rest = sorted((v for k, v in scaled.items() if k != top), reverse=True)
        # The top probability is g(c), unless g would have put it under the runner-up.
        floor = rest[0] / (sum(rest) + rest[0])
        assert out[top] == pytest.approx(max(g(scaled[top]), floor), rel=1e-9)
        # The others keep their proportions.
        others = [k for k in scaled if k != top]
        ratio = [out[k] / scaled[k] for k in others if scaled[k] > 1e-300]
        assert max(ratio) == pytest.approx(min(ratio), rel=1e-9)


def test_platt_and_isotonic_values() -> None:
    assert Platt()(0.7) == pytest.approx(0.7)
    assert Platt(a=1.0, b=np.log(2.0))(0.5) == pytest.approx(2 / 3)
    assert Platt(a=2.0, b=0.0)(0.75) == pytest.approx(0.9)  # odds 3 -> 9
    assert (ISO(0.1), ISO(0.3), ISO(0.4), ISO(0.7), ISO(0.95)) == pytest.approx((0.2, 0.2, 0.35, 0.65, 0.8))
    grid = np.linspace(0.0, 1.0, 201)
    for g in (Platt(a=0.7, b=0.3), ISO):
        values = [g(float(c)) for c in grid]
        assert all(b >= a for a, b in zip(values, values[1:], strict=False))  # monotone
    assert [ISO(float(c)) for c in grid] == pytest.approx(np.interp(grid, ISO.x, ISO.y).tolist())


def test_a_map_moves_the_decision_the_router_makes() -> None:
    answer = Answer(question="q", kind="choice", probabilities={"a": 0.7, "b": 0.2, "c": 0.1}, engine="t", model="t")
    strict = T(min_confidence=0.75)
    assert decide_answer("t", answer, thresholds=strict).escalate
    lifted = decide_answer("t", answer, thresholds=strict, calibration=Calibration(confidence_map=Platt(a=1, b=1)))
    assert not lifted.escalate and lifted.outcome == "a"
    assert lifted.probabilities["b"] / lifted.probabilities["c"] == pytest.approx(2.0)
    assert lifted.confidence == pytest.approx(Platt(a=1, b=1)(0.7))


def test_edge_cases_one_option_a_certain_answer_and_a_tie() -> None:
    down = Calibration(confidence_map=Isotonic(x=(0.5, 1.0), y=(0.3, 0.9)))
    assert calibrate({"only": 1.0}, down) == {"only": 1.0}
    # All the mass on one option: the map still lowers it, the others share the rest evenly.
    assert calibrate({"a": 1.0, "b": 0.0, "c": 0.0}, down) == pytest.approx({"a": 0.9, "b": 0.05, "c": 0.05})
    tie = calibrate({"a": 0.5, "b": 0.5}, down)
    assert tie["a"] >= tie["b"] and max(tie, key=tie.__getitem__) == "a"
    assert sum(tie.values()) == pytest.approx(1.0)


def test_bad_maps_are_refused() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        Isotonic(x=(0.5, 0.5), y=(0.1, 0.2))
    with pytest.raises(ValueError, match="must not decrease"):
        Isotonic(x=(0.2, 0.5), y=(0.3, 0.1))
    with pytest.raises(ValueError, match="a > 0"):
        Platt(a=0.0)
    with pytest.raises(ValueError, match="no questions of its own"):
        Calibration(questions={"q": Calibration(questions={"r": Calibration()})})


def test_a_question_is_decided_under_its_own_temperature_and_map() -> None:
    own = Calibration(temperature=0.9, confidence_map=ISO)
    task = Calibration(temperature=1.2, confidence_map=Platt(a=1.1, b=0.2), questions={"urgency": own})
    assert task.for_question("urgency") is own
    assert task.for_question("other") is task


def test_reexpress_undoes_a_map_and_moves_the_temperature() -> None:
    undone = 0
    for g in (Platt(a=1.7, b=-0.5), Isotonic(x=(0.2, 0.6, 1.0), y=(0.1, 0.5, 0.95))):
        for probs in _distributions(200, 1):
            scaled = sorted(calibrate(probs, Calibration(temperature=0.8)).values(), reverse=True)
            if g(scaled[0]) <= scaled[1] / (1.0 - scaled[0] + scaled[1]):
                continue  # held at the runner-up by the router: that confidence cannot be recovered
            used = Calibration(temperature=0.8, confidence_map=g)
            wanted = calibrate(probs, Calibration(temperature=1.6))
            assert reexpress(calibrate(probs, used), used, 1.6) == pytest.approx(wanted, abs=1e-6)
            undone += 1
    assert undone > 300


# -- the policy file --------------------------------------------------------------------------------

POLICY = """\
tasks:
  triage:
    kind: classify
    calibration:
      temperature: 1.3
      platt: {a: 1.05, b: 0.31}
      questions:
        urgency:
          temperature: 0.9
          isotonic: [[0.31, 0.2], [0.52, 0.48], [0.97, 0.99]]
    questions:
      urgency: {type: score, levels: [low, high]}
      route: {type: choice, criteria: {billing: money, tech: errors}}
"""


def test_the_policy_keys_reach_the_router() -> None:
    task = parse_policy(POLICY).tasks["triage"]
    assert isinstance(task, ClassifyTask)
    assert task.calibration.confidence_map == Platt(a=1.05, b=0.31)
    urgency = task.calibration.for_question("urgency")
    assert urgency == Calibration(temperature=0.9, confidence_map=Isotonic(x=(0.31, 0.52, 0.97), y=(0.2, 0.48, 0.99)))
    assert task.calibration.for_question("route").temperature == 1.3


def test_a_task_map_replaces_the_defaults_map() -> None:
    text = "defaults:\n  calibration: {isotonic: [[0.2, 0.1], [0.9, 0.8]]}\n" + POLICY
    assert parse_policy(text).tasks["triage"].calibration.confidence_map == Platt(a=1.05, b=0.31)
    off = text.replace("      platt: {a: 1.05, b: 0.31}\n", "      isotonic: null\n")
    assert parse_policy(off).tasks["triage"].calibration.confidence_map is None


@pytest.mark.parametrize(
    ("old", "new", "line", "key", "words"),
    [
        ("[0.52, 0.48]", "[0.22, 0.48]", 10, "urgency.isotonic.1", "confidences must increase"),
        ("[0.52, 0.48]", "[0.52, 0.1]", 10, "urgency.isotonic.1", "must not decrease"),
        ("[0.97, 0.99]", "[0.97, 1.5]", 10, "urgency.isotonic.2", "must lie in [0, 1]"),
        ("[[0.31, 0.2], [0.52, 0.48], [0.97, 0.99]]", "[[0.31, 0.2]]", 10, "urgency.isotonic", "at least 2"),
        ("temperature: 0.9\n", "temperature: 0.9\n          platt: {a: 1.0}\n", 11, "urgency.isotonic", "not both"),
        ("{a: 1.05, b: 0.31}", "{a: -1.0, b: 0.31}", 6, "calibration.platt.a", "greater than 0"),
        ("{a: 1.05, b: 0.31}", "{a: 1.0, c: 2}", 6, "calibration.platt.c", "unknown key 'c'"),
    ],
)
def test_a_bad_map_names_its_line_and_key(old: str, new: str, line: int, key: str, words: str) -> None:
    assert POLICY.count(old) == 1
    with pytest.raises(ConfigError) as err:
        parse_policy(POLICY.replace(old, new), source="p.yaml")
    assert err.value.line == line, err.value
    assert err.value.key is not None and err.value.key.endswith(key), err.value
    assert words in str(err.value) and "p.yaml" in str(err.value)


# -- fitting --------------------------------------------------------------------------------------


def _decisions(n: int, seed: int) -> list[Labelled]:
    """Three-way decisions right with a probability far steeper in the confidence than any temperature makes it."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        top = float(rng.uniform(0.4, 1.0))
        right = bool(rng.random() < 1.0 / (1.0 + np.exp(-10.0 * (top - 0.75))))
        rest = (1.0 - top) / 2
        rows.append(Labelled(probabilities={"a": top, "b": rest, "c": rest}, label="a" if right else "b"))
    return rows


def test_auto_uses_only_what_the_fit_split_allows() -> None:
    held = _decisions(1000, 9)
    small = fit_calibration(_decisions(PLATT_MIN_ROWS - 1, 0), held)
    assert small.method == "temperature" and small.calibration.confidence_map is None and not small.scores
    middle = fit_calibration(_decisions(ISOTONIC_MIN_ROWS - 1, 0), held)
    assert set(middle.scores) == {"temperature", "platt"} and "isotonic needs at least 1000" in middle.reason
    with pytest.raises(TooFewLabels, match="at least 1000"):
        fit_calibration(_decisions(ISOTONIC_MIN_ROWS - 1, 0), held, method="isotonic")
    large = fit_calibration(_decisions(3000, 0), held)
    assert set(large.scores) == {"temperature", "platt", "isotonic"}
    assert large.method == min(large.scores, key=large.scores.__getitem__) != "temperature"


def test_a_fitted_map_beats_temperature_alone_held_out_and_is_what_the_router_does() -> None:
    fit, held = _decisions(4000, 0), _decisions(3000, 1)
    alone = fit_calibration(fit, held, method="temperature")
    for method in ("platt", "isotonic"):
        got = fit_calibration(fit, held, method=method)
        assert got.method == method and got.after.ece < alone.after.ece < got.before.ece
        g = got.calibration.confidence_map
        assert g is not None
        if isinstance(g, Isotonic):
            assert 2 <= len(g.x) <= 64
        # The held-out figures are the router's own calibrate() under the calibration written.
        again = fit_calibration(fit, held, method=method)
        assert again.calibration == got.calibration and again.after == got.after


# -- writing a map into the file ------------------------------------------------------------------


def test_the_editor_writes_and_removes_a_list_of_points(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY.replace("tasks:\n", "# head\ntasks:\n"), encoding="utf-8")
    editor = PolicyEditor(path)
    base = ("tasks", "triage", "calibration")
    editor.set((*base, "questions", "urgency", "isotonic"), [[0.4, 0.3], [0.8, 0.9]])  # flow list -> block
    assert editor.remove((*base, "platt"))
    assert not editor.remove((*base, "platt"))
    editor.set((*base, "isotonic"), [[0.5, 0.4], [0.95, 0.97]])
    text = editor.text()
    assert "        urgency:\n          temperature: 0.9\n          isotonic:\n            - [0.4, 0.3]\n" in text
    assert "platt" not in text and text.startswith("# head\ntasks:\n")
    task = parse_policy(text).tasks["triage"]
    assert task.calibration.confidence_map == Isotonic(x=(0.5, 0.95), y=(0.4, 0.97))
    assert task.calibration.for_question("urgency").confidence_map == Isotonic(x=(0.4, 0.8), y=(0.3, 0.9))


# -- calibrate_task: a task with two questions ------------------------------------------------------

TRIAGE = """\
tasks:
  triage:
    kind: classify
    calibration:
      temperature: 0.8
      platt: {a: 1.5, b: 0.5}   # fitted last month
      questions:
        angry: {temperature: 0.7}
    questions:
      angry: Is the customer angry?
      urgent: Is it urgent?
"""


def _collected(policy_text: str, n: int) -> Collected:
    policy = parse_policy(policy_text)
    task = policy.tasks["triage"]
    rng = np.random.default_rng(0)
    rows: list[Prediction] = []
    for i in range(n):
        for q in ("angry", "urgent"):
            raw = float(rng.uniform(0.02, 0.98))
            truth = "yes" if rng.random() < 1.0 / (1.0 + np.exp(-4.0 * (raw - 0.5))) else "no"
            probs = calibrate({"yes": raw, "no": 1.0 - raw}, task.calibration.for_question(q))
            top = max(probs, key=probs.__getitem__)
            rows.append(
                Prediction(
                    row=f"r{i}", question=q, kind="noul", options=("yes", "no"), label=truth, answer=top,
                    probabilities=probs, confidence=probs[top], kept=True, reason="confident", outcome=top,
                    system=1, latency_ms=1.0, threshold=0.0, task="triage",
                )
            )  # fmt: skip
    half = len(rows) // 2
    return Collected(
        info=RunInfo(data="rows.jsonl", data_sha256="0" * 64, engine="embedded", model="m"),
        task=task,
        policy=policy,
        fit=rows[:half],
        held_out=rows[half:],
        test_rows_left_out=0,
        unanswered=0,
        mean_state_chars=10.0,
        embedder="e5",
    )


def test_calibrate_task_fits_the_task_and_each_question_and_replaces_the_old_maps(tmp_path: Path) -> None:
    c = _collected(TRIAGE, 1200)  # 1,200 fit decisions in all, 600 a question
    fit = calibrate_task(c, "rows.jsonl", method="isotonic")
    assert fit.record["method"] == "isotonic" and fit.record["asked"] == "isotonic"
    assert {q["method"] for q in fit.record["questions"].values()} == {"temperature"}
    assert any("temperature alone: 600 fit decisions, isotonic needs 1000" in line for line in fit.lines)
    path = tmp_path / "p.yaml"
    path.write_text(TRIAGE, encoding="utf-8")
    editor = PolicyEditor(path)
    apply(editor, fit)
    text = editor.text()
    assert text.startswith("tasks:\n  triage:\n    kind: classify\n    calibration:\n      temperature: ")
    assert "platt" not in text and text.count("isotonic:") == 1
    assert "\n    questions:\n      angry: Is the customer angry?\n      urgent: Is it urgent?\n    fitted:\n" in text
    task = parse_policy(text).tasks["triage"]
    assert isinstance(task.calibration.confidence_map, Isotonic)
    for q in ("angry", "urgent"):
        own = task.calibration.for_question(q)
        assert own.confidence_map is None and own is not task.calibration
    # The old calibration was over-confident: undone and refitted, held-out ECE falls (0.122 -> 0.040).
    assert fit.record["held_out"]["after"]["ece"] < fit.record["held_out"]["before"]["ece"] / 2
    assert fit.record["held_out"]["decisions"] == len(c.held_out)
    with pytest.raises(TooFewLabels, match="at least 1000"):
        calibrate_task(_collected(TRIAGE, 400), "rows.jsonl", method="isotonic")


def test_a_task_whose_defaults_give_a_map_gets_null_when_its_fit_has_none(tmp_path: Path) -> None:
    text = "defaults:\n  calibration:\n    isotonic: [[0.5, 0.4], [0.99, 0.9]]\n" + TRIAGE.replace(
        "      platt: {a: 1.5, b: 0.5}   # fitted last month\n", ""
    )
    fit = calibrate_task(_collected(text, 150), "rows.jsonl")  # 150 fit decisions: a temperature alone
    path = tmp_path / "p.yaml"
    path.write_text(text, encoding="utf-8")
    editor = PolicyEditor(path)
    apply(editor, fit)
    assert "      isotonic: null\n" in editor.text()
    assert parse_policy(editor.text()).tasks["triage"].calibration.confidence_map is None
